"""Prometheus metrics of the webhook, on a CollectorRegistry of its own (so tests and replicas never share).

Counters and the latency histogram are updated by the server; cache gauges are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sized
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.webhook.admission.pod_shape import is_unicode_text

# Reviews answer in well under a millisecond of pipeline time; the API server's timeout is seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class CacheHealth(Protocol):
    """What the cache gauges read (implemented by `webhook.cache.ClusterCache`)."""

    @property
    def synced(self) -> bool:
        """Every kind listed once."""
        ...

    def ready(self) -> bool:
        """Synced and fresh."""
        ...

    def lag_seconds(self) -> float | None:
        """Seconds since the API was last heard from."""
        ...

    def sizes(self) -> Mapping[str, int]:
        """Objects cached per kind, and GPU nodes in the inventory."""
        ...

    def api_failures(self) -> Mapping[str, int]:
        """Failed API calls per kind."""
        ...


class ConnectionState(Protocol):
    """What the connection gauges read (implemented by `httpedge.listener.Listener`)."""

    @property
    def connections(self) -> Sized:
        """The open connections."""
        ...

    @property
    def evicted(self) -> int:
        """Connections closed to admit a new one at the cap (the longest without progress)."""
        ...

    @property
    def expired(self) -> int:
        """Connections closed because a request did not arrive within its deadline."""
        ...


class _ConnectionCollector(Collector):
    def __init__(self, state: Callable[[], ConnectionState | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        if state is None:
            return
        yield GaugeMetricFamily(
            "kube_vgpu_webhook_connections_open", "Open HTTPS connections.", value=len(state.connections)
        )
        yield CounterMetricFamily(
            "kube_vgpu_webhook_connections_evicted",
            "Connections closed at the connection cap to admit a new one (the longest idle or longest "
            "without completing its request).",
            value=state.evicted,
        )
        yield CounterMetricFamily(
            "kube_vgpu_webhook_request_deadline_expired",
            "Connections closed because a request did not arrive and get its answer within the deadline.",
            value=state.expired,
        )


def _printable(value: str) -> str:
    # The exposition is UTF-8; a lone surrogate (from a JSON escape) would make every scrape fail.
    return value if is_unicode_text(value) else value.encode("utf-8", "backslashreplace").decode("ascii")


class _Printable:
    """A registry view whose label values are always UTF-8 encodable, so `/metrics` always renders."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            metric.samples = [
                sample._replace(labels={k: _printable(v) for k, v in sample.labels.items()})
                for sample in metric.samples
            ]
            yield metric


class _CacheCollector(Collector):
    def __init__(self, state: Callable[[], CacheHealth | None]) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state()
        if state is None:
            return
        objects = GaugeMetricFamily(
            "kube_vgpu_webhook_cache_objects", "Objects in the webhook's cluster cache.", labels=["kind"]
        )
        for kind, size in sorted(state.sizes().items()):
            objects.add_metric([kind], size)
        yield objects
        failures = CounterMetricFamily(
            "kube_vgpu_webhook_cache_api_errors",
            "Failed list/watch calls of the cluster cache (each is retried after a backoff).",
            labels=["kind"],
        )
        for kind, count in sorted(state.api_failures().items()):
            failures.add_metric([kind], count)
        yield failures
        lag = state.lag_seconds()
        yield GaugeMetricFamily(
            "kube_vgpu_webhook_cache_lag_seconds",
            "Seconds since the API server was last heard from (NaN before the first list).",
            value=float("nan") if lag is None else lag,
        )
        yield GaugeMetricFamily(
            "kube_vgpu_webhook_cache_ready",
            "1 when the cache is synced and fresh.",
            value=float(state.ready()),
        )


class WebhookMetrics:
    """The webhook's metrics and the registry they live on."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "kube_vgpu_webhook_reviews",
            "Admission reviews answered, by outcome (allowed, denied, malformed, too_large, busy, error).",
            ["outcome"],
            registry=self.registry,
        )
        # The two outcomes of every review, bound once (a labelled lookup per review costs a lock).
        self.allowed = self.reviews.labels("allowed")
        self.denied = self.reviews.labels("denied")
        self.latency = Histogram(
            "kube_vgpu_webhook_review_duration_seconds",
            "Time from a review's headers to its answer (reading and parsing the body included).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.denials = Counter(
            "kube_vgpu_webhook_denials",
            "Pods refused, by reason (malformed-object, malformed-value, invalid-annotation, "
            "forged-annotation, bypasses-scheduler, privileged, other-scheduler, no-matching-gpu, "
            "over-limit, isolation-escape, quota, stale-cache, missing-uid, not-ready, internal-error).",
            ["reason"],
            registry=self.registry,
        )
        self.caller_protection = Gauge(
            "kube_vgpu_webhook_caller_protection",
            "1 for each way callers are checked that is on: client-certificate (the TLS handshake "
            "requires one), network-policy (the install put a NetworkPolicy in front of the port). "
            "Both 0: any pod that reaches the port can send forged reviews.",
            ["mechanism"],
            registry=self.registry,
        )
        self._cache: CacheHealth | None = None
        self.registry.register(_CacheCollector(lambda: self._cache))
        self._connections: ConnectionState | None = None
        self.registry.register(_ConnectionCollector(lambda: self._connections))

    def report_caller_protection(self, *, client_certificate: bool, network_policy: bool) -> None:
        """Say which protections of the admission port are on."""
        self.caller_protection.labels("client-certificate").set(float(client_certificate))
        self.caller_protection.labels("network-policy").set(float(network_policy))

    def track_cache(self, cache: CacheHealth) -> None:
        """Report this cache's size, lag and readiness."""
        self._cache = cache

    def track_connections(self, state: ConnectionState) -> None:
        """Report this listener's open, refused and expired connections."""
        self._connections = state

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (label values escaped as the format requires)."""
        return generate_latest(_Printable(self.registry))
