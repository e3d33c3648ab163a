"""`kube-vgpu top`: the cluster's GPUs, what is booked on them and each namespace's quota, read
through the Kubernetes API (nodes, pods, namespaces and, where the cluster serves them, ResourceClaims:
list; Volcano's device ConfigMap: get, for the MIG geometry the webhook charges `mig` pods by), like
`kubectl top`."""

from __future__ import annotations

import argparse
import json
import sys

from kube_vgpu.cli.top_view import ClusterView, cluster_view, render_text
from kube_vgpu.contract.config import Config, ConfigError, NodeConfig, load_config
from kube_vgpu.contract.dra import DEVICE_CLASS
from kube_vgpu.contract.mig.geometry import DeviceConfig, MigGeometryError, parse_device_config
from kube_vgpu.contract.names import DEVICE_CONFIG_KEY
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube, KubeConfigError, load_api_client
from kube_vgpu.kubeapi.flags import add_cluster_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`top`'s flags."""
    parser.add_argument(
        "-o",
        "--output",
        default="text",
        choices=["text", "json"],
        help="output format",
    )
    add_cluster_arguments(parser)
    parser.add_argument(
        "--config",
        default=None,
        help="kube-vgpu configuration file, for renamed resources, the default mode and Volcano's device "
        "ConfigMap, as the webhook reads them (default: every default)",
    )


def read_view(kube: Kube, config: Config) -> ClusterView:
    """List nodes, pods and namespaces and build the view (blocking); raises ApiError/ApiUnavailable."""
    nodes = kube.list("node")["items"]
    pods = kube.list("pod")["items"]
    namespaces = kube.list("namespace")["items"]
    # The webhook's classes, or kube-vgpu's own: where no claim of them exists nothing is added.
    classes = frozenset(config.webhook.dra_device_classes or (DEVICE_CLASS,))
    try:
        claims = kube.list("resourceclaim")["items"]
    except ApiError:
        claims = []  # a cluster without resource.k8s.io/v1 (before Kubernetes 1.34)
    return cluster_view(
        nodes,
        pods,
        namespaces,
        config.resource_names,
        geometry=read_geometry(kube, config.node),
        default_mode=config.webhook.default_mode,
        claims=claims,
        claim_classes=classes,
    )


def read_geometry(kube: Kube, node: NodeConfig) -> DeviceConfig | None:
    """Volcano's device ConfigMap, which the webhook sizes `mig` pods with; None (the shipped
    geometry, as the webhook falls back to) when it is absent or cannot be read or parsed."""
    try:
        found = kube.get("configmap", node.device_config_name, namespace=node.device_config_namespace)
        text = ((found or {}).get("data") or {}).get(DEVICE_CONFIG_KEY)
        return parse_device_config(text) if isinstance(text, str) else None
    except (ApiError, MigGeometryError):
        return None


def run(args: argparse.Namespace) -> int:
    """Print the view: 0, or 1 when the API cannot be read, 2 on bad input."""
    try:
        config = load_config(args.config)
        kube = Kube(load_api_client(args.kubeconfig, args.context))
    except (ConfigError, KubeConfigError) as exc:
        print(f"kube-vgpu top: {exc}", file=sys.stderr)
        return 2
    try:
        view = read_view(kube, config)
    except (ApiError, ApiUnavailable) as exc:
        print(f"kube-vgpu top: cannot read the cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        kube.close()
    if args.output == "json":
        sys.stdout.write(json.dumps(view.as_json(), indent=2) + "\n")
    else:
        sys.stdout.write(render_text(view))
    return 0
