"""The chart's optional monitoring: the Grafana dashboard ConfigMap, the ServiceMonitor and the
PodMonitor, and every dashboard query naming metrics the program really exports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
from prometheus_client import CollectorRegistry

from kube_vgpu.contract.config import Config, ResourceNames
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.metrics import Metrics
from kube_vgpu.node.nvml.gpus import discover
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.usage.metrics import UsageSampler
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.nvml.api import load_simulation
from kube_vgpu.webhook.cache import ClusterCache
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.service import build_quota, build_services
from tests.support.helm_render import CHART_DIR, Rendered, lint, render
from tests.support.webhook_quota import memory_book

KUBE = "v1.31.0"
ALL_ON = {
    "monitoring": {
        "grafanaDashboard": {"enabled": True},
        "serviceMonitor": {"enabled": True},
        "podMonitor": {"enabled": True},
    }
}
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor")


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render(ALL_ON, kube_version=KUBE)


def dashboard_configmap(rendered: Rendered) -> dict[str, Any]:
    (found,) = [cm for cm in rendered.of_kind("ConfigMap") if cm["metadata"]["name"].endswith("-dashboard")]
    return found


def test_lint_is_clean_with_everything_on() -> None:
    report = lint(ALL_ON, kube_version=KUBE)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


def test_nothing_of_it_is_rendered_by_default() -> None:
    plain = render(None, kube_version=KUBE)
    assert not [o for o in plain.objects if o["kind"] in MONITORING_KINDS]
    assert not [cm for cm in plain.of_kind("ConfigMap") if cm["metadata"]["name"].endswith("-dashboard")]


def test_the_dashboard_configmap_is_labelled_for_grafana_and_valid(rendered: Rendered) -> None:
    cm = dashboard_configmap(rendered)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == rendered.namespace
    kubernetes_validate.validate(cm, KUBE.lstrip("v"), strict=True)
    dashboard = json.loads(cm["data"]["kube-vgpu.json"])
    assert dashboard["uid"] == "kube-vgpu" and dashboard["panels"]
    elsewhere = render(
        {"monitoring": {"grafanaDashboard": {"enabled": True, "namespace": "grafana"}}}, kube_version=KUBE
    )
    assert dashboard_configmap(elsewhere)["metadata"]["namespace"] == "grafana"


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_service_monitor_scrapes_the_webhook_metrics_port(rendered: Rendered) -> None:
    (monitor,) = rendered.of_kind("ServiceMonitor")
    (service,) = rendered.of_kind("Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert selects(monitor["spec"]["selector"], service["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["endpoints"]
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert endpoint["scheme"] == "http" and endpoint["path"] == "/metrics"
    # The metrics port, not the admission port: the container port the webhook's --metrics-port names.
    deployment = rendered.of_kind("Deployment")[0]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["targetPort"] == "metrics" and f"--metrics-port={named['metrics']}" in container["args"]


def test_the_pod_monitor_scrapes_every_node_plugin_pod(rendered: Rendered) -> None:
    (monitor,) = rendered.of_kind("PodMonitor")
    daemonsets = rendered.of_kind("DaemonSet")
    assert daemonsets
    for ds in daemonsets:
        template = ds["spec"]["template"]
        assert selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports


@pytest.mark.parametrize(
    "monitoring",
    [
        {"serviceMonitor": {"enabled": True, "interval": "soon"}},
        {"grafanaDashboard": {"enabled": True, "labels": {"grafana_dashboard": 1}}},
        {"podMonitor": {"enable": True}},
    ],
)
def test_monitoring_values_of_the_wrong_shape_are_refused(monitoring: dict[str, Any]) -> None:
    with pytest.raises(Exception, match="monitoring"):
        render({"monitoring": monitoring}, kube_version=KUBE)


# --- every query names exported metrics ---------------------------------------------------------

_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset",
    "le", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions, keywords,
    grouping labels, label matchers, strings, durations or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b[0-9][0-9.]*(?:[eE][-+]?[0-9]+|[a-z]+)?\b", " ", text)  # numbers, durations
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end() :].lstrip()
        if following.startswith("("):
            continue  # a function
        word = match.group(0)
        if word.lower() not in _PROMQL_WORDS:
            names.add(word)
    return names


def test_the_query_parser_finds_metrics_and_nothing_else() -> None:
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_b_bucket{x="y z",n=~"$node"}[5m]))) / on(x) c'
    assert metric_names(expr) == {"a_b_bucket", "c"}
    assert metric_names("sum(x) + 2 * y offset 5m and bool z > 1e3") == {"x", "y", "z"}


def dashboard_queries() -> Iterator[tuple[str, str]]:
    dashboard = json.loads((CHART_DIR / "dashboards" / "kube-vgpu.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            # label_values(metric, label): the first argument is the metric
            inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", variable["query"]["query"])
            assert inner is not None, variable
            yield f"variable {variable['name']}", inner.group(1)


def exported_labels(registry: CollectorRegistry) -> dict[str, set[str] | None]:
    """Per sample name, the labels it carries; None when the registry cannot say (a labelled
    family with no series yet)."""
    labels: dict[str, set[str] | None] = {}
    for family in registry.collect():
        declared = set(getattr(family, "_labelnames", ()))
        names = {family.name, *(s.name for s in family.samples)}
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        for name in names:
            seen = {k for s in family.samples if s.name == name for k in s.labels}
            known = bool(declared) or any(s.name == name for s in family.samples)
            labels[name] = (declared | seen) if known else None
    return labels


def exported(registry: CollectorRegistry) -> set[str]:
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
    return names


@pytest.fixture
def program_metrics(apiserver: ApiServerStandin) -> Iterator[tuple[set[str], dict[str, set[str] | None]]]:
    """Every metric name of the node plugin's and the webhook's registries, as production wires them."""
    nvml = load_simulation({"gpus": [{"model": "NVIDIA A100-SXM4-80GB"}]}, "n1")
    nvml.nvmlInit()
    gpus = discover(nvml)
    sampler = UsageSampler(nvml, gpus, "n1", nvml.process_cgroup)
    node = Metrics(LiveGpus(gpus, 10, "n1"), Ledger(gpus, 10, ResourceNames(), "n1"), sampler)
    kube = Kube(apiserver.api_client())
    webhook = WebhookMetrics()
    cache = ClusterCache(kube, staleness_seconds=30)
    build_services(cache, Config(), webhook, build_quota(cache, Config(), webhook, memory_book()))
    try:
        names = exported(node.registry) | exported(webhook.registry)
        yield names, exported_labels(node.registry) | exported_labels(webhook.registry)
    finally:
        kube.close()
        nvml.nvmlShutdown()


def test_every_dashboard_query_names_metrics_the_program_exports(
    program_metrics: tuple[set[str], dict[str, set[str] | None]],
) -> None:
    exported_names = program_metrics[0]
    seen: set[str] = set()
    for where, expr in dashboard_queries():
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        missing = names - exported_names
        assert not missing, f"{where}: {sorted(missing)} not exported (query {expr!r})"
        seen |= names
    # the usage metrics (docs/monitoring.md) are on the dashboard
    assert {
        "kube_vgpu_gpu_memory_used_mib",
        "kube_vgpu_container_memory_used_mib",
        "kube_vgpu_quota_limit",
    } <= seen


def test_every_label_a_query_filters_or_groups_on_is_one_its_metrics_carry(
    program_metrics: tuple[set[str], dict[str, set[str] | None]],
) -> None:
    program_labels = program_metrics[1]
    for where, expr in dashboard_queries():
        names = metric_names(expr)
        carried: set[str] = set()
        unknown = False
        for name in names:
            labels = program_labels.get(name)
            unknown |= labels is None
            carried |= labels or set()
        # matchers: metric{label=...}
        for metric, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
            labels = program_labels.get(metric)
            if labels is None:
                continue
            keys = {m.split("=")[0].rstrip("!~").strip() for m in matchers.split(",") if m.strip()}
            assert keys <= labels, f"{where}: {metric} has no label(s) {sorted(keys - labels)}"
        if unknown:
            continue
        for grouping in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            keys = {k.strip() for k in grouping.split(",") if k.strip()} - {"le"}
            assert keys <= carried, (
                f"{where}: grouped by {sorted(keys - carried)}, which {sorted(names)} lack"
            )
