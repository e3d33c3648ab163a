"""`kube-vgpu top`: the cluster's GPUs, what is booked on them and each namespace's quota, read
through the Kubernetes API (nodes, pods, namespaces: list only), like `kubectl top`."""

from __future__ import annotations

import argparse
import json
import sys

from kube_vgpu.cli.top_view import ClusterView, cluster_view, render_text
from kube_vgpu.contract.config import ConfigError, ResourceNames, load_config
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
        help="kube-vgpu configuration file, for renamed resources (default: every default)",
    )


def read_view(kube: Kube, names: ResourceNames) -> ClusterView:
    """List nodes, pods and namespaces and build the view (blocking); raises ApiError/ApiUnavailable."""
    nodes = kube.list("node")["items"]
    pods = kube.list("pod")["items"]
    namespaces = kube.list("namespace")["items"]
    return cluster_view(nodes, pods, namespaces, names)


def run(args: argparse.Namespace) -> int:
    """Print the view: 0, or 1 when the API cannot be read, 2 on bad input."""
    try:
        config = load_config(args.config)
        kube = Kube(load_api_client(args.kubeconfig, args.context))
    except (ConfigError, KubeConfigError) as exc:
        print(f"kube-vgpu top: {exc}", file=sys.stderr)
        return 2
    try:
        view = read_view(kube, config.resource_names)
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
