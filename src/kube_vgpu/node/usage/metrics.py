"""The usage metrics: per GPU memory used and utilisation, per container memory used and
SM utilisation, sampled from NVML on a worker thread before each scrape and served from that sample.

The pods are the ones the plugin's ledger loop last listed on this node, so no scrape calls the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.surface import Nvml
from kube_vgpu.node.usage.attribution import ContainerFigures, ContainerKey, attribute
from kube_vgpu.node.usage.cgroups import CgroupReader
from kube_vgpu.node.usage.sample import UsageSample, read_usage

log = logging.getLogger("kube_vgpu.node.usage")

GPU_LABELS = ["node", "gpu"]
CONTAINER_LABELS = ["node", "namespace", "pod", "container", "gpu"]


class UsageSampler:
    """The latest NVML sample of this node's GPUs and its attribution to containers."""

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[GpuInfo],
        node_name: str,
        read_cgroup: CgroupReader,
        *,
        refresh_timeout: float = 5.0,
    ) -> None:
        self._nvml = nvml
        self._gpus = tuple(gpus)
        self.node_name = node_name
        self._read_cgroup = read_cgroup
        self._pods: tuple[Mapping[str, Any], ...] = ()
        self._lock = threading.Lock()
        self._failing: frozenset[str] = frozenset()
        self.sample = UsageSample()
        self.containers: dict[ContainerKey, ContainerFigures] = {}
        self._refresh_timeout = refresh_timeout
        self._running: asyncio.Future[None] | None = None

    def pods_seen(self, pods: Sequence[Mapping[str, Any]]) -> None:
        """The pods bound to this node as last listed (their container statuses name their IDs)."""
        self._pods = tuple(pods)

    def refresh(self) -> None:
        """Read NVML and the processes' cgroups (blocking: run it on a worker thread)."""
        with self._lock:
            sample = read_usage(self._nvml, self._gpus)
            containers = attribute(sample, self._pods, self._read_cgroup)
            self.sample, self.containers = sample, containers
            failing = frozenset(sample.errors)
            for error in sorted(failing - self._failing):
                log.warning("event=usage_read_failed node=%s %s", self.node_name, error)
            self._failing = failing

    async def refresh_async(self) -> None:
        """`refresh` on a worker thread, waited on for at most `refresh_timeout` seconds.

        Scrapes that arrive while one refresh runs share it, so a hung NVML call holds one thread,
        not one per scrape; past the timeout the scrape is served the previous sample.
        """
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(asyncio.to_thread(self.refresh))
            self._running.add_done_callback(self._refresh_ended)
        try:
            async with asyncio.timeout(self._refresh_timeout):
                await asyncio.shield(self._running)
        except TimeoutError:
            log.warning(
                "event=usage_read_slow node=%s timeout=%gs: serving the previous sample",
                self.node_name,
                self._refresh_timeout,
            )
        except Exception:
            return

    async def drain(self) -> None:
        """Wait (at most `refresh_timeout`) for a refresh still running, before NVML shuts down."""
        if self._running is not None and not self._running.done():
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self._refresh_timeout):
                    await asyncio.shield(self._running)

    def _refresh_ended(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            log.error("event=usage_read_failed node=%s error=%r", self.node_name, str(future.exception()))


class UsageCollector(Collector):
    """Serves the sampler's latest figures; a GPU or container absent from it has no series."""

    def __init__(self, sampler: UsageSampler) -> None:
        self._sampler = sampler

    def collect(self) -> Iterator[Metric]:
        node = self._sampler.node_name
        memory = GaugeMetricFamily(
            "kube_vgpu_gpu_memory_used_mib",
            "GPU memory in use, every process counted (NVML)",
            labels=GPU_LABELS,
        )
        utilisation = GaugeMetricFamily(
            "kube_vgpu_gpu_utilization_percent",
            "Percent of time a kernel ran on the GPU (NVML; absent in MIG mode)",
            labels=GPU_LABELS,
        )
        for gpu in self._sampler.sample.gpus:
            memory.add_metric([node, gpu.uuid], gpu.memory_used_mib)
            if gpu.utilization_percent is not None:
                utilisation.add_metric([node, gpu.uuid], gpu.utilization_percent)
        container_memory = GaugeMetricFamily(
            "kube_vgpu_container_memory_used_mib",
            "GPU memory the container's processes use on a GPU (NVML)",
            labels=CONTAINER_LABELS,
        )
        container_sm = GaugeMetricFamily(
            "kube_vgpu_container_sm_utilization_percent",
            "SM percent of the container's processes on a GPU (NVML; absent in MIG mode)",
            labels=CONTAINER_LABELS,
        )
        for key, figures in self._sampler.containers.items():
            labels = [node, key.namespace, key.pod, key.container, key.gpu]
            container_memory.add_metric(labels, figures.memory_used_mib)
            if figures.sm_util_percent is not None:
                container_sm.add_metric(labels, figures.sm_util_percent)
        yield from (memory, utilisation, container_memory, container_sm)
