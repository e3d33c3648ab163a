"""Quota usage, reservations, limits and denials exported on the webhook's Prometheus registry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, QUOTA_NUMBER_LABEL
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.metrics import QuotaMetrics

NAMES = ResourceNames()


def gpu_pod(name: str, memory: int, *, uid: str | None = None, namespace: str = "team-a") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": name}
    if uid:
        meta["uid"] = uid
    limits = {NAMES.count: "1", NAMES.memory: str(memory), NAMES.cores: "25"}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def admit(gate: NamespaceQuota, pod: Mapping[str, Any], labels: Mapping[str, str], review: str) -> str | None:
    return asyncio.run(
        gate.admit(
            namespace=pod["metadata"]["namespace"],
            namespace_labels=labels,
            pod=pod,
            request=parse_pod(pod, NAMES),
            largest_gpu_mib=81920,
            pod_uid=review,
            dry_run=False,
        )
    )


def sample(registry: CollectorRegistry, metric: str, namespace: str, resource: str) -> float | None:
    return registry.get_sample_value(metric, {"namespace": namespace, "resource": resource})


def test_used_reserved_and_limit_per_namespace_and_resource() -> None:
    registry = CollectorRegistry()
    gate = NamespaceQuota(names=NAMES, pending_seconds=60)
    QuotaMetrics(gate, registry)
    labels = {QUOTA_MEMORY_LABEL: "10000", QUOTA_NUMBER_LABEL: "4"}
    gate.ledger.pod_seen(gpu_pod("old", 3000, uid="u1"))
    assert admit(gate, gpu_pod("new", 2000), labels, "r1") is None
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-memory") == 5000
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-number") == 2
    assert sample(registry, "kube_vgpu_quota_used", "team-a", "vgpu-cores") == 50
    assert sample(registry, "kube_vgpu_quota_reserved", "team-a", "vgpu-memory") == 2000
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-memory") == 10000
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-number") == 4
    assert sample(registry, "kube_vgpu_quota_limit", "team-a", "vgpu-cores") is None  # unlimited


def test_denials_are_counted_by_reason() -> None:
    registry = CollectorRegistry()
    gate = NamespaceQuota(names=NAMES, pending_seconds=60)
    QuotaMetrics(gate, registry)
    assert admit(gate, gpu_pod("a", 2000), {QUOTA_MEMORY_LABEL: "1000"}, "r1") is not None
    assert admit(gate, gpu_pod("b", 2000), {QUOTA_MEMORY_LABEL: "1000"}, "r2") is not None
    assert admit(gate, gpu_pod("c", 1), {QUOTA_CORES_LABEL: "many"}, "r3") is not None
    counted = {"namespace": "team-a", "reason": "vgpu-memory"}
    assert registry.get_sample_value("kube_vgpu_quota_denied_total", counted) == 2
    invalid = {"namespace": "team-a", "reason": "invalid-label"}
    assert registry.get_sample_value("kube_vgpu_quota_denied_total", invalid) == 1


def test_limits_come_from_the_cache_namespaces_when_given_and_follow_relabels() -> None:
    registry = CollectorRegistry()
    gate = NamespaceQuota(names=NAMES, pending_seconds=60)
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
