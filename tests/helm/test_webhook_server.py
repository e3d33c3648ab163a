"""The chart's webhook server settings: connection bounds and shutdown passed as flags the program
parses, a grace period above the shutdown timeout, optional client certificates and NetworkPolicy;
rendered by the real Helm engine and validated against Kubernetes' schemas.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest

from kube_vgpu.cli.main import build_parser
from kube_vgpu.httpedge.listener import ConnectionLimits
from tests.support.helm_render import Obj, Rendered, lint, render

KUBE = "v1.31.0"
KONNECTIVITY = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}},
}


def _render(values: Mapping[str, Any]) -> Rendered:
    rendered = render(values, kube_version=KUBE)
    for obj in rendered.objects:
        if obj["apiVersion"].startswith("cert-manager"):
            continue
        kubernetes_validate.validate(obj, KUBE, strict=True)
    report = lint(values, kube_version=KUBE)
    assert report["errors"] == [] and not [m for m in report["messages"] if m["severity"] >= 2], report
    return rendered


def _webhook_pod(rendered: Rendered) -> Obj:
    deployment = next(d for d in rendered.of_kind("Deployment") if "webhook" in d["metadata"]["name"])
    pod: Obj = deployment["spec"]["template"]
    return pod


def _args(rendered: Rendered) -> argparse.Namespace:
    """The webhook container's arguments, parsed by the program's own parser."""
    container = _webhook_pod(rendered)["spec"]["containers"][0]
    return build_parser().parse_args(container["args"])


def test_defaults_pass_the_programs_own_bounds_and_a_longer_grace_period() -> None:
    rendered = _render({})
    args = _args(rendered)
    limits = ConnectionLimits()
    assert args.max_connections == limits.max_connections
    assert args.request_timeout == limits.request_timeout_seconds
    assert args.idle_timeout == limits.idle_timeout_seconds > 90  # the API server keeps idle ones 90 s
    assert args.client_ca_file is None
    assert _webhook_pod(rendered)["spec"]["terminationGracePeriodSeconds"] > args.shutdown_timeout
    # `helm template` cannot look up the API server's addresses: no NetworkPolicy, and the webhook
    # is told so (for its start-up log and metric).
    assert not rendered.of_kind("NetworkPolicy")
    assert args.network_policy == "off"


@pytest.mark.parametrize("shutdown", [5, 29, 45, 120])
def test_the_grace_period_stays_above_the_shutdown_timeout(shutdown: int) -> None:
    rendered = _render({"webhook": {"server": {"shutdownTimeoutSeconds": shutdown}}})
    args = _args(rendered)
    assert args.shutdown_timeout == shutdown
    assert _webhook_pod(rendered)["spec"]["terminationGracePeriodSeconds"] > shutdown


def test_server_bounds_reach_the_flags() -> None:
    server = {"maxConnections": 300, "requestTimeoutSeconds": 4, "idleTimeoutSeconds": 120}
    args = _args(_render({"webhook": {"server": server}}))
    assert (args.max_connections, args.request_timeout, args.idle_timeout) == (300, 4, 120)


def test_client_auth_mounts_the_ca_and_passes_the_flag() -> None:
    values = {"webhook": {"clientAuth": {"enabled": True, "caConfigMap": "apiserver-client-ca"}}}
    rendered = _render(values)
    pod = _webhook_pod(rendered)
    args = _args(rendered)
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "client-ca")
    assert volume["configMap"]["name"] == "apiserver-client-ca"
    assert args.client_ca_file == f"{mounts['client-ca']}/{volume['configMap']['items'][0]['path']}"


def test_client_auth_without_a_ca_is_refused_naming_the_value() -> None:
    with pytest.raises(helm_python.HelmError, match=r"webhook\.clientAuth\.caConfigMap"):
        render({"webhook": {"clientAuth": {"enabled": True}}}, kube_version=KUBE)


def test_the_network_policy_admits_only_the_listed_sources_to_the_webhook_port() -> None:
    sources = [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}]
    rendered = _render({"webhook": {"networkPolicy": {"enabled": True, "from": sources}}})
    (policy,) = rendered.of_kind("NetworkPolicy")
    pod = _webhook_pod(rendered)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    for deployment in rendered.of_kind("Deployment"):  # and no other workload of the chart
        if deployment["spec"]["template"] is not pod:
            assert not selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    # The listed sources, and the konnectivity agents of kube-system (by label) unless left out.
    assert rule["from"] == [*sources, KONNECTIVITY]
    port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
    assert _args(rendered).network_policy == "on"
    alone = _render({"webhook": {"networkPolicy": {"from": sources, "konnectivityAgents": ""}}})
    assert alone.one("NetworkPolicy")["spec"]["ingress"][0]["from"] == sources


def _policy_sources(rendered: Rendered) -> list[Obj]:
    sources: list[Obj] = rendered.one("NetworkPolicy")["spec"]["ingress"][0]["from"]
    return sources


def test_control_plane_cidrs_render_the_policy_under_helm_template() -> None:
    # `helm template` cannot look the API server up: given the control plane's CIDRs, what is
    # reviewed is what is installed, and nothing of kube-system but its konnectivity agents is let in.
    values = {"webhook": {"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/24", "fd00::/64"]}}}
    rendered = _render(values)
    sources = _policy_sources(rendered)
    assert sources == [{"ipBlock": {"cidr": "10.0.0.0/24"}}, {"ipBlock": {"cidr": "fd00::/64"}}, KONNECTIVITY]
    for source in sources:  # no source admits a whole namespace
        assert "namespaceSelector" not in source or source.get("podSelector", {}).get("matchLabels")
    assert _args(rendered).network_policy == "on"
    policy = {"controlPlaneCIDRs": ["10.0.0.5/32"], "konnectivityAgents": "app=konnectivity,tier=control"}
    agents = _policy_sources(_render({"webhook": {"networkPolicy": policy}}))[-1]
    assert agents["podSelector"] == {"matchLabels": {"app": "konnectivity", "tier": "control"}}
    # Without a source there is no policy, and no konnectivity rule alone.
    assert not _render({"webhook": {"networkPolicy": {"controlPlaneCIDRs": []}}}).of_kind("NetworkPolicy")


def test_scripts_chart_template_renders_the_policy_given_its_sources() -> None:
    root = Path(__file__).resolve().parents[2]
    argv = ["template", "--set", "webhook.networkPolicy.controlPlaneCIDRs={10.0.0.5/32}"]
    done = subprocess.run(
        [sys.executable, str(root / "scripts" / "chart.py"), *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "kind: NetworkPolicy" in done.stdout and "cidr: 10.0.0.5/32" in done.stdout
    assert "kubernetes.io/metadata.name: kube-system" in done.stdout  # only beside the agents' labels
    assert "k8s-app: konnectivity-agent" in done.stdout


def test_the_network_policy_opens_the_metrics_port_only_to_the_listed_scrapers() -> None:
    sources = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    policy = {"enabled": True, "from": sources, "metricsFrom": scrapers, "konnectivityAgents": ""}
    rendered = _render({"webhook": {"networkPolicy": policy}})
    (rendered_policy,) = rendered.of_kind("NetworkPolicy")
    ports = {p["name"]: p["containerPort"] for p in _webhook_pod(rendered)["spec"]["containers"][0]["ports"]}
    admission, metrics = rendered_policy["spec"]["ingress"]
    # Scrapers reach the metrics port and not the admission port; callers the other way round.
    assert admission["from"] == sources and admission["ports"] == [
        {"port": ports["https"], "protocol": "TCP"}
    ]
    assert metrics["from"] == scrapers and metrics["ports"] == [{"port": ports["metrics"], "protocol": "TCP"}]
    args = _webhook_pod(rendered)["spec"]["containers"][0]["args"]
    assert f"--metrics-port={ports['metrics']}" in args and ports["metrics"] != ports["https"]


def test_a_network_policy_with_no_sources_is_refused() -> None:
    with pytest.raises(helm_python.HelmError, match=r"webhook\.networkPolicy\.from"):
        render({"webhook": {"networkPolicy": {"enabled": True}}}, kube_version=KUBE)


def test_the_notes_say_which_protection_of_the_port_is_on_and_what_an_open_one_allows() -> None:
    # Defaults under `helm template`: nothing closes the port; the notes say so and what to set.
    notes = _render({}).notes
    assert "NetworkPolicy:       off" in notes and "client certificates: off" in notes
    assert "reachable from the API server only" in notes
    assert "WARNING: neither a NetworkPolicy nor client certificates" in notes and "forged reviews" in notes
    assert "could not be looked up" in notes and "webhook.networkPolicy.controlPlaneCIDRs" in notes
    assert "kubectl get endpointslice -n default kubernetes" in notes
    # Switched off by hand: the notes say how to switch it on.
    notes = _render({"webhook": {"networkPolicy": {"enabled": False}}}).notes
    assert "WARNING" in notes and "webhook.networkPolicy.enabled=auto" in notes
    # A NetworkPolicy from the listed sources.
    notes = _render({"webhook": {"networkPolicy": {"from": [{"ipBlock": {"cidr": "10.0.0.5/32"}}]}}}).notes
    assert "NetworkPolicy:       on: port 8443 admits only 10.0.0.5/32, pods of kube-system labelled" in notes
    assert "konnectivity-agent" in notes and "WARNING" not in notes
    notes = _render({"webhook": {"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/24"]}}}).notes
    assert "admits only 10.0.0.0/24, pods of kube-system labelled" in notes and "WARNING" not in notes
    # Client certificates alone close it too.
    values = {"webhook": {"clientAuth": {"enabled": True, "caConfigMap": "apiserver-client-ca"}}}
    notes = _render(values).notes
    assert "client certificates: on" in notes and "apiserver-client-ca" in notes and "WARNING" not in notes


@pytest.mark.parametrize(
    "values",
    [
        {"server": {"maxConnections": 0}},
        {"server": {"shutdownTimeoutSeconds": "20"}},
        {"server": {"unknown": 1}},
        {"networkPolicy": {"from": "10.0.0.0/8"}},
        {"networkPolicy": {"enabled": "yes"}},
        {"networkPolicy": {"allowKubeSystem": True}},
        {"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0"]}},
        {"networkPolicy": {"konnectivityAgents": "k8s-app"}},
        {"networkPolicy": {"konnectivityAgents": {"k8s-app": "konnectivity-agent"}}},
    ],
)
def test_bad_server_values_are_refused_by_the_schema(values: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        render({"webhook": values}, kube_version=KUBE)
