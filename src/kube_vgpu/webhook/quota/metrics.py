"""Prometheus view of namespace GPU quotas: usage, in-flight reservations, limits, denials.

Registered on the CollectorRegistry the webhook owns. Values are read from the ledger at scrape
time, so collect on the event loop's thread (as the webhook's `/metrics` handler does): the ledger
is not shared across threads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.webhook.quota.charge import RESOURCES, Charge, QuotaLimits, Resource, parse_limits
from kube_vgpu.webhook.quota.gate import NamespaceQuota

NamespaceLabels = Callable[[], Iterable[tuple[str, Mapping[str, str]]]]


class QuotaMetrics(Collector):
    """`kube_vgpu_quota_{used,reserved,limit}{namespace,resource}` and `kube_vgpu_quota_denied_total`.

    `namespaces()` yields (name, labels) for every namespace the cluster cache holds, so limits
    show up before the first review; without it, the limits the last review of each namespace
    carried are reported.
    """

    def __init__(
        self, gate: NamespaceQuota, registry: CollectorRegistry, *, namespaces: NamespaceLabels | None = None
    ) -> None:
        self._gate = gate
        self._namespaces = namespaces
        self._denied = Counter(
            "kube_vgpu_quota_denied",
            "Pod creations refused by a namespace GPU quota, by the resource over quota "
            "(or invalid-label, unsized).",
            ["namespace", "reason"],
            registry=registry,
        )
        registry.register(self)
        gate.denials = self

    def denied(self, namespace: str, reason: str) -> None:
        """Count one denial."""
        self._denied.labels(namespace=namespace, reason=reason).inc()

    def forget(self, namespace: str) -> None:
        """Drop the deleted namespace's denial series, so series are bounded by the namespaces that exist."""
        for reason in (*RESOURCES, "invalid-label", "unsized"):
            with contextlib.suppress(KeyError):
                self._denied.remove(namespace, reason)

    def _limits(self) -> dict[str, QuotaLimits]:
        if self._namespaces is None:
            return dict(self._gate.last_limits)
        return {name: parse_limits(labels) for name, labels in self._namespaces()}

    def collect(self) -> Iterator[Metric]:
        """One sample per namespace and resource."""
        gate, ledger = self._gate, self._gate.ledger
        limits = {name: lim for name, lim in self._limits().items() if lim.any}
        used = GaugeMetricFamily(
            "kube_vgpu_quota_used",
            "GPU quota in use per namespace: live vGPU pods plus admissions not yet in the cache "
            "(vgpu-number: vGPUs, vgpu-memory: MiB, vgpu-cores: percent of a GPU).",
            labels=["namespace", "resource"],
        )
        reserved = GaugeMetricFamily(
            "kube_vgpu_quota_reserved",
            "Admissions (by any replica, in the shared reservations) whose pod the cache has not "
            "shown yet, per namespace.",
            labels=["namespace", "resource"],
        )
        limit = GaugeMetricFamily(
            "kube_vgpu_quota_limit",
            "GPU quota set by the namespace's quota.kube-vgpu.io labels (absent: unlimited).",
            labels=["namespace", "resource"],
        )
        for namespace in sorted(set(ledger.namespaces()) | set(limits)):
            usage: Charge = gate.usage(namespace)
            in_flight: Charge = gate.reserved(namespace)
            resource: Resource
            for resource in RESOURCES:
                used.add_metric([namespace, resource], usage.get(resource))
                reserved.add_metric([namespace, resource], in_flight.get(resource))
                value = limits[namespace].get(resource) if namespace in limits else None
                if value is not None:
                    limit.add_metric([namespace, resource], value)
        yield used
        yield reserved
        yield limit


class SharedBookMetrics(Collector):
    """`kube_vgpu_quota_shared_*_total`: the API traffic of the shared reservations (read at scrape)."""

    def __init__(self, stats: Callable[[], Mapping[str, int]], registry: CollectorRegistry) -> None:
        self._stats = stats
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """One counter per kind of call or outcome."""
        stats = self._stats()
        helps = {
            "writes": "Shared quota reservation objects written (PUT or POST accepted).",
            "conflicts": "Writes refused with 409 (another replica wrote first); each re-read and retried.",
            "reads": "Shared quota reservation objects read (GET).",
            "failures": "Batches of reviews refused because their reservations could not be recorded.",
            "sweeps": "Objects written only to drop reservations (pod gone, expired or never created).",
        }
        for key, text in helps.items():
            family = CounterMetricFamily(f"kube_vgpu_quota_shared_{key}", text)
            family.add_metric([], stats.get(key, 0))
            yield family
