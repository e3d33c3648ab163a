"""Prometheus metrics of the node plugin, on a registry of its own, served at `/metrics` by aiohttp.

GPU and container figures are read from the inventory and the ledger at scrape time, so a container
that is gone leaves no stale series behind; Allocate outcomes are counters.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.httpedge.metrics_server import MetricsServer
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.hookpath import HookPathWatch
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.usage.metrics import UsageCollector, UsageSampler

# Allocate failure reasons: a closed set, so the counter's cardinality stays bounded.
FAILURE_REASONS = ("no_pod", "broken_pod", "rejected", "api_unavailable", "timeout", "conflict", "internal")


class _StateCollector(Collector):
    def __init__(self, inventory: LiveGpus, ledger: Ledger) -> None:
        self._inventory = inventory
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        node = self._inventory.node_name
        gpu_labels = ["node", "gpu", "model"]
        total = GaugeMetricFamily("kube_vgpu_gpu_memory_total_mib", "GPU memory in MiB", labels=gpu_labels)
        memory = GaugeMetricFamily(
            "kube_vgpu_gpu_memory_allocated_mib", "MiB booked by live containers", labels=gpu_labels
        )
        cores = GaugeMetricFamily(
            "kube_vgpu_gpu_cores_allocated_percent", "SM percent booked by live containers", labels=gpu_labels
        )
        vgpus = GaugeMetricFamily("kube_vgpu_gpu_vgpus_in_use", "vGPU slots in use", labels=gpu_labels)
        healthy = GaugeMetricFamily(
            "kube_vgpu_gpu_healthy", "1 when the GPU is in service", labels=gpu_labels
        )
        over = GaugeMetricFamily(
            "kube_vgpu_gpu_overcommitted",
            "1 when live allocations exceed the GPU's capacity of a resource",
            labels=["node", "gpu", "resource"],
        )
        usage = self._ledger.usage()
        overcommitted = {(o.gpu_uuid, o.resource) for o in self._ledger.overcommits()}
        unhealthy = self._inventory.unhealthy
        for gpu in self._inventory.gpus:
            labels = [node, gpu.uuid, gpu.name]
            use = usage[gpu.uuid]
            total.add_metric(labels, gpu.memory_mib)
            memory.add_metric(labels, use.memory_mib)
            cores.add_metric(labels, use.cores)
            vgpus.add_metric(labels, use.vgpus)
            healthy.add_metric(labels, 0 if gpu.uuid in unhealthy else 1)
            for resource in ("memory", "cores", "vgpus"):
                over.add_metric([node, gpu.uuid, resource], 1 if (gpu.uuid, resource) in overcommitted else 0)
        container_labels = ["node", "namespace", "pod", "container", "gpu"]
        limit = GaugeMetricFamily(
            "kube_vgpu_container_memory_limit_mib",
            "A container's memory limit on a GPU",
            labels=container_labels,
        )
        share = GaugeMetricFamily(
            "kube_vgpu_container_cores_percent", "A container's SM percent on a GPU", labels=container_labels
        )
        for share_of in self._ledger.containers():
            pod = share_of.pod
            labels = [node, pod.namespace, pod.name, share_of.container, share_of.gpu_uuid]
            limit.add_metric(labels, share_of.memory_mib)
            share.add_metric(labels, share_of.cores)
        yield from (total, memory, cores, vgpus, healthy, over, limit, share)


class _HookPathCollector(Collector):
    def __init__(self, node_name: str, watch: HookPathWatch) -> None:
        self._node = node_name
        self._watch = watch

    def collect(self) -> Iterator[Metric]:
        ready = GaugeMetricFamily(
            "kube_vgpu_hami_core_ready",
            "1 when HAMi-core (libvgpu.so, ld.so.preload) in hookPath can serve containers; while 0 "
            "the node offers no hami-core capacity",
            labels=["node", "folder"],
        )
        state = self._watch.state
        ready.add_metric([self._node, self._watch.folder], 1 if state is not None and state.ready else 0)
        yield ready


class Metrics:
    """The plugin's registry: live state plus Allocate counters."""

    def __init__(self, inventory: LiveGpus, ledger: Ledger, usage: UsageSampler | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StateCollector(inventory, ledger))
        self.usage = usage
        if usage is not None:
            self.registry.register(UsageCollector(usage))
        self.allocations = Counter(
            "kube_vgpu_allocations", "Allocate calls answered successfully", registry=self.registry
        )
        self.failures = Counter(
            "kube_vgpu_allocation_failures",
            "Allocate calls failed, by reason",
            ["reason"],
            registry=self.registry,
        )
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)  # every reason shows from the start, at 0
        self.cache_folders_removed = Counter(
            "kube_vgpu_cache_folders_removed",
            "HAMi-core per-container host folders removed after their pod left the node",
            registry=self.registry,
        )

    def watch_hook_path(self, node_name: str, watch: HookPathWatch) -> None:
        """Serve `kube_vgpu_hami_core_ready` from `watch` (hami-core nodes only)."""
        self.registry.register(_HookPathCollector(node_name, watch))

    def failed(self, reason: str) -> None:
        """Count one failed Allocate."""
        self.failures.labels(reason if reason in FAILURE_REASONS else "internal").inc()

    def render(self) -> bytes:
        """The text exposition of every metric."""
        return generate_latest(self.registry)

    async def scrape(self) -> bytes:
        """What a scrape answers: GPU usage sampled afresh (bounded), then every metric."""
        if self.usage is not None:
            await self.usage.refresh_async()
        return self.render()

    def server(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """`GET /metrics` on `port` (0 picks a free one), on all interfaces by default since Prometheus
        scrapes the pod's IP; bounded like the webhook's metrics port (`httpedge.metrics_server`)."""
        return MetricsServer(self.scrape, host=host, port=port, content_type=CONTENT_TYPE_LATEST)
