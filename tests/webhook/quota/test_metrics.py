"""Quota usage, reservations, limits and denials exported on the webhook's Prometheus registry, read
from the production quota path (ledger and shared reservations)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, QUOTA_NUMBER_LABEL
from kube_vgpu.webhook.quota.metrics import QuotaMetrics
from kube_vgpu.webhook.records import PodRecord
from tests.support.records import as_pod
from tests.support.webhook_quota import admit, make_gate

NAMES = ResourceNames()


def gpu_pod(name: str, memory: int, *, uid: str | None = None, namespace: str = "team-a") -> PodRecord:
    meta: dict[str, Any] = {"namespace": namespace, "name": name}
    if uid:
        meta["uid"] = uid
    limits = {NAMES.count: "1", NAMES.memory: str(memory), NAMES.cores: "25"}
    return as_pod(
        {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}
    )


def sample(registry: CollectorRegistry, metric: str, namespace: str, resource: str) -> float | None:
    return registry.get_sample_value(metric, {"namespace": namespace, "resource": resource})


def test_used_reserved_and_limit_per_namespace_and_resource() -> None:
    registry = CollectorRegistry()
    gate = make_gate()
    QuotaMetrics(gate, registry)
    labels = {QUOTA_MEMORY_LABEL: "10000", QUOTA_NUMBER_LABEL: "4"}
    gate.ledger.pod_seen(gpu_pod("old", 3000, uid="u1"))
    assert admit(gate, gpu_pod("new", 2000), labels, review="r1") is None
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-memory") == 5000
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-number") == 2
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-cores") == 50
    assert sample(registry, "kube_vgpu_quota_reserved", "team-a", "vgpu-memory") == 2000
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-memory") == 10000
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-number") == 4
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-cores") is None  # unlimited


def test_denials_are_counted_by_reason() -> None:
    registry = CollectorRegistry()
    gate = make_gate()
    QuotaMetrics(gate, registry)
    assert admit(gate, gpu_pod("a", 2000), {QUOTA_MEMORY_LABEL: "1000"}) is not None
    assert admit(gate, gpu_pod("b", 2000), {QUOTA_MEMORY_LABEL: "1000"}) is not None
    assert admit(gate, gpu_pod("c", 1), {QUOTA_CORES_LABEL: "many"}) is not None
    assert admit(gate, gpu_pod("d", 1), None) is not None  # an unknown namespace: not counted
    counted = {"namespace": "team-a", "reason": "vgpu-memory"}
    assert registry.get_sample_value("kube_vgpu_quota_denied_total", counted) == 2
    invalid = {"namespace": "team-a", "reason": "invalid-label"}
    assert registry.get_sample_value("kube_vgpu_quota_denied_total", invalid) == 1
    reasons = {
        s.labels["reason"]
        for metric in registry.collect()
        if metric.name == "kube_vgpu_quota_denied"
        for s in metric.samples
        if s.name == "kube_vgpu_quota_denied_total"
    }
    assert reasons == {"vgpu-memory", "invalid-label"}
    gate.forget_namespace("team-a")  # the series of a deleted namespace go with it
    assert registry.get_sample_value("kube_vgpu_quota_denied_total", counted) is None


def test_limits_come_from_the_cache_namespaces_when_given_and_follow_relabels() -> None:
    registry = CollectorRegistry()
    gate = make_gate()
    namespaces: dict[str, dict[str, str]] = {"quiet": {QUOTA_NUMBER_LABEL: "8"}, "free": {}}

    def listing() -> Iterable[tuple[str, Mapping[str, str]]]:
        return namespaces.items()

    QuotaMetrics(gate, registry, namespaces=listing)
    assert sample(registry, "kube_vgpu_quota_limit", "quiet", "vgpu-number") == 8
    assert sample(registry, "kube_vgpu_quota_used", "quiet", "vgpu-number") == 0
    assert sample(registry, "kube_vgpu_quota_used", "free", "vgpu-number") is None
    namespaces["quiet"] = {QUOTA_NUMBER_LABEL: "2"}
    assert sample(registry, "kube_vgpu_quota_limit", "quiet", "vgpu-number") == 2
    assert b"kube_vgpu_quota_used" in generate_latest(registry)
