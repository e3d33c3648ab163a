"""Prometheus metrics of the webhook, on a CollectorRegistry of its own (tests and replicas never share).

Counters and the latency histogram are updated by the server; cache and connection figures are read
at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.httpedge.listener import Listener
from kube_vgpu.webhook.admission.pod_shape import is_unicode_text

if TYPE_CHECKING:
    from kube_vgpu.webhook.cache import ClusterCache

# Reviews answer in well under a millisecond of pipeline time; the API server's timeout is seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _printable(value: str) -> str:
    return value if is_unicode_text(value) else value.encode("utf-8", "backslashreplace").decode("ascii")


class WebhookMetrics(Collector):
    """The webhook's metrics and the registry they live on."""

    def __init__(self) -> None:
        self.registry = PrintableRegistry(auto_describe=True)
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
        self.cache: ClusterCache | None = None
        self.connections: Listener | None = None
        self.registry.register(self)

    def report_caller_protection(self, *, client_certificate: bool, network_policy: bool) -> None:
        """Say which protections of the admission port are on."""
        self.caller_protection.labels("client-certificate").set(float(client_certificate))
        self.caller_protection.labels("network-policy").set(float(network_policy))

    def track_cache(self, cache: ClusterCache) -> None:
        self.cache = cache

    def track_connections(self, listener: Listener) -> None:
        self.connections = listener

    def collect(self) -> Iterator[Metric]:
        """The figures read at scrape time: the cache's and the admission port's."""
        if (cache := self.cache) is not None:
            objects = GaugeMetricFamily(
                "kube_vgpu_webhook_cache_objects", "Objects in the webhook's cluster cache.", labels=["kind"]
            )
            for kind, size in sorted(cache.sizes().items()):
                objects.add_metric([kind], size)
            failures = CounterMetricFamily(
                "kube_vgpu_webhook_cache_api_errors",
                "Failed list/watch calls of the cluster cache (each is retried after a backoff).",
                labels=["kind"],
            )
            for kind, count in sorted(cache.api_failures().items()):
                failures.add_metric([kind], count)
            lag = cache.lag_seconds()
            yield from (objects, failures)
            yield GaugeMetricFamily(
                "kube_vgpu_webhook_cache_lag_seconds",
                "Seconds since the API server was last heard from (NaN before the first list).",
                value=float("nan") if lag is None else lag,
            )
            yield GaugeMetricFamily(
                "kube_vgpu_webhook_cache_ready",
                "1 when the cache is synced and fresh.",
                value=float(cache.ready()),
            )
        if (listener := self.connections) is not None:
            yield GaugeMetricFamily(
                "kube_vgpu_webhook_connections_open",
                "Open HTTPS connections.",
                value=len(listener.connections),
            )
            yield CounterMetricFamily(
                "kube_vgpu_webhook_connections_evicted",
                "Connections closed at the connection cap to admit a new one (the one longest without "
                "progress).",
                value=listener.evicted,
            )
            yield CounterMetricFamily(
                "kube_vgpu_webhook_request_deadline_expired",
                "Connections closed because a request did not arrive whole within the deadline.",
                value=listener.expired,
            )

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


class PrintableRegistry(CollectorRegistry):
    """A registry whose label values are always UTF-8 encodable, so that `/metrics` always renders: a
    lone surrogate (from a JSON escape) is shown as its backslash escape."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            metric.samples = [
                sample._replace(labels={k: _printable(v) for k, v in sample.labels.items()})
                for sample in metric.samples
            ]
            yield metric
