"""The node plugin as a DRA driver, assembled: NVML discovery and health, HAMi-core's presence, the
ResourceSlice publisher, the kubelet plugin (registration and DRA sockets) and the metrics.

Start order: the GPUs are discovered, HAMi-core's folder is checked (while it is missing every GPU
is held out of service, so the first pool already carries the taint, or leaves the GPUs out where
taints are off), the pool is published once, and only then are the sockets served, so the kubelet
never learns of the driver before its devices are described.

Stopping (SIGTERM: a pod restart, a rolling update or an uninstall alike) removes the two sockets
and keeps the ResourceSlices: a plugin back within 30 s finds its pool as it left it and writes
nothing. Once the driver has been gone for 30 s, the kubelet deletes the driver's slices for the
node itself (pkg/kubelet/cm/dra/manager.go, defaultWipingDelay), which is what an uninstall relies
on; a plugin that returns later publishes its pool afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.contract.config import Config
from kube_vgpu.httpedge.metrics_server import MetricsServer
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube, KubeError
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.hamicore import DEFAULT_LOCK_DIR
from kube_vgpu.node.dra.cdi import CLAIM_KIND, DEFAULT_GPU_KIND
from kube_vgpu.node.dra.publisher import SlicePublisher, publisher_for
from kube_vgpu.node.dra.server import (
    DEFAULT_CDI_DIR,
    DEFAULT_GPU_CDI_DIRS,
    DEFAULT_KUBELET_ROOT_DIR,
    DraServer,
    inventory_cards,
    serve_dra,
)
from kube_vgpu.node.dra.volcano import (
    DEVICE_PLUGIN_ON_DRA_NODE,
    NVIDIA_GPU_RESOURCE,
    conflict_message,
    device_plugin_resources,
)
from kube_vgpu.node.events import node_reference
from kube_vgpu.node.hookpath import HookPathState, HookPathWatch, hold_while_missing
from kube_vgpu.node.nvml.gpus import GpuInfo, check_inventory, discover
from kube_vgpu.node.nvml.health import HealthMonitor, monitor_health
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.nvml.surface import Nvml
from kube_vgpu.node.usage.metrics import UsageCollector, UsageSampler

log = logging.getLogger("kube_vgpu.node.dra.driver")

# How long stop waits for its own asyncio loops to end once cancelled.
TASK_STOP_SECONDS: Final = 5.0


@dataclass(frozen=True)
class DraSettings:
    """How one DRA node plugin runs; the defaults are production's, tests shorten the waits."""

    node_name: str
    config: Config
    kubelet_root_dir: Path = Path(DEFAULT_KUBELET_ROOT_DIR)
    cdi_dir: Path = Path(DEFAULT_CDI_DIR)
    gpu_cdi_dirs: tuple[Path, ...] = tuple(Path(p) for p in DEFAULT_GPU_CDI_DIRS)
    gpu_cdi_kind: str = DEFAULT_GPU_KIND
    claim_cdi_kind: str = CLAIM_KIND
    lock_dir: str = DEFAULT_LOCK_DIR
    xid_wait_ms: int = 5000
    probe_interval_seconds: float = 5.0
    # None: the configured metricsPort; 0 picks a free port (tests).
    metrics_port: int | None = None
    hook_path_poll_seconds: float = 10.0
    hook_path_remind_seconds: float = 1800.0
    # How often the node's pods are listed for the usage metrics, and the published pool is read
    # back and rewritten if it differs (None: registerIntervalSeconds).
    pods_interval_seconds: float | None = None
    resync_seconds: float | None = None


class _DraCollector(Collector):
    """Per GPU: memory, health and what prepared claims hold of it; HAMi-core's readiness."""

    def __init__(self, driver: DraNodePlugin) -> None:
        self._driver = driver

    def collect(self) -> Iterator[Metric]:
        d = self._driver
        inventory, server = d.inventory, d.server
        if inventory is None:
            return
        node = d.settings.node_name
        gpu_labels = ["node", "gpu", "model"]
        total = GaugeMetricFamily("kube_vgpu_gpu_memory_total_mib", "GPU memory in MiB", labels=gpu_labels)
        healthy = GaugeMetricFamily(
            "kube_vgpu_gpu_healthy", "1 when the GPU is in service", labels=gpu_labels
        )
        memory = GaugeMetricFamily(
            "kube_vgpu_dra_gpu_memory_prepared_mib",
            "MiB of the GPU held by ResourceClaims prepared on this node",
            labels=gpu_labels,
        )
        cores = GaugeMetricFamily(
            "kube_vgpu_dra_gpu_cores_prepared_percent",
            "SM percent of the GPU held by ResourceClaims prepared on this node",
            labels=gpu_labels,
        )
        claims = GaugeMetricFamily(
            "kube_vgpu_dra_claims_prepared", "ResourceClaims prepared on this node", labels=["node"]
        )
        held_memory: dict[str, int] = {}
        held_cores: dict[str, int] = {}
        prepared = server.preparer.prepared if server is not None else {}
        for claim in prepared.values():
            for share in claim.shares:
                held_memory[share.gpu_uuid] = held_memory.get(share.gpu_uuid, 0) + share.memory_mib
                held_cores[share.gpu_uuid] = held_cores.get(share.gpu_uuid, 0) + share.cores
        unhealthy = inventory.unhealthy
        for gpu in inventory.gpus:
            labels = [node, gpu.uuid, gpu.name]
            total.add_metric(labels, gpu.memory_mib)
            healthy.add_metric(labels, 0 if gpu.uuid in unhealthy else 1)
            memory.add_metric(labels, held_memory.get(gpu.uuid, 0))
            cores.add_metric(labels, held_cores.get(gpu.uuid, 0))
        claims.add_metric([node], len(prepared))
        volcano = GaugeMetricFamily(
            "kube_vgpu_dra_device_plugin_resources",
            "Device plugin resource names (Volcano's vGPU names, NVIDIA's nvidia.com/gpu) this DRA node "
            "also advertises with a non-zero amount (a device plugin serves it too: should be 0)",
            labels=["node"],
        )
        volcano.add_metric([node], len(d.device_plugin_resources))
        yield from (total, healthy, memory, cores, claims, volcano)
        if d.hook_path is not None:
            ready = GaugeMetricFamily(
                "kube_vgpu_hami_core_ready",
                "1 when HAMi-core (libvgpu.so, ld.so.preload) in hookPath can serve containers; while 0 "
                "the node's GPUs are tainted (or left out of its ResourceSlices)",
                labels=["node", "folder"],
            )
            state = d.hook_path.state
            ready.add_metric([node, d.hook_path.folder], 1 if state is not None and state.ready else 0)
            yield ready


@dataclass
class DraNodePlugin:
    """One node's DRA driver; `start()`, then `stop()` (or `run(stop_event)`)."""

    settings: DraSettings
    nvml: Nvml
    kube: Kube
    failed: bool = False  # a background loop died: the process should exit non-zero
    inventory: LiveGpus | None = None
    publisher: SlicePublisher | None = None
    server: DraServer | None = None
    health: HealthMonitor | None = None
    hook_path: HookPathWatch | None = None
    usage: UsageSampler | None = None
    metrics_server: MetricsServer | None = None
    # Volcano vGPU resources the Node advertises too (a device plugin on a DRA node): name -> amount.
    device_plugin_resources: dict[str, str] = field(default_factory=dict)
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=False))
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopping: asyncio.Future[None] | None = None
    _stop: asyncio.Event | None = None
    _watch_thread: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self.api = NodeApi(self.kube, self.settings.node_name)

    async def start(self) -> None:
        """Discover, check HAMi-core, publish, serve; raises on a node that cannot be served
        (DiscoveryError, CheckpointError, OSError)."""
        s, node = self.settings, self.settings.config.node
        gpus: list[GpuInfo] = await asyncio.to_thread(discover, self.nvml)
        check_inventory(gpus, node.device_split_count)
        log.info(
            "event=gpus_discovered node=%s api=dra count=%d gpus=%s",
            s.node_name,
            len(gpus),
            ",".join(f"{g.uuid}:{g.name}:{g.memory_mib}MiB" for g in gpus),
        )
        inventory = self.inventory = LiveGpus(gpus, node.device_split_count, s.node_name)
        self.usage = UsageSampler(self.nvml, gpus, s.node_name, self.nvml.process_cgroup)
        publisher = self.publisher = publisher_for(self.kube, s.node_name, self.nvml, gpus, inventory)
        self.registry.register(_DraCollector(self))
        self.registry.register(publisher.collector())
        self.registry.register(UsageCollector(self.usage))

        self.health = monitor_health(
            self.nvml,
            inventory,
            node,
            self.api.events.gpu_health,
            wait_ms=s.xid_wait_ms,
            probe_interval=s.probe_interval_seconds,
        )
        # Checked before the first publish, so a node without HAMi-core never offers a usable GPU.
        self.hook_path = HookPathWatch(
            node.hook_path,
            self._hook_path_changed,
            interval=s.hook_path_poll_seconds,
            remind_seconds=s.hook_path_remind_seconds,
        )
        await self.hook_path.check()

        port = node.metrics_port if s.metrics_port is None else s.metrics_port
        self.metrics_server = MetricsServer(
            self._scrape, host="0.0.0.0", port=port, content_type=CONTENT_TYPE_LATEST
        )
        await self.metrics_server.start()

        try:
            await publisher.publish()
        except KubeError as exc:
            # The publisher's loop retries; the kubelet may prepare claims allocated before.
            log.warning("event=dra_slices_failed node=%s error=%r", s.node_name, str(exc))
        try:
            self.server = await serve_dra(
                node_name=s.node_name,
                kube=self.kube,
                cards=inventory_cards(inventory),
                hook_path=node.hook_path,
                lock_dir=s.lock_dir,
                kubelet_root_dir=s.kubelet_root_dir,
                cdi_dir=s.cdi_dir,
                gpu_cdi_kind=s.gpu_cdi_kind,
                gpu_cdi_dirs=s.gpu_cdi_dirs,
                claim_cdi_kind=s.claim_cdi_kind,
            )
        except RuntimeError as exc:
            # grpc's refusal to bind a unix socket (a folder it cannot create a socket in).
            raise OSError(f"cannot serve the DRA sockets under {s.kubelet_root_dir}: {exc}") from None
        log.info(
            "event=dra_started node=%s registration=%s endpoint=%s",
            s.node_name,
            self.server.registration_path,
            self.server.dra_path,
        )
        await self._check_device_plugin()
        self._spawn(publisher.run(), "dra-publisher")
        # The pool's slices watched: one the kubelet deletes or anyone edits is published again.
        self._watch_thread = asyncio.get_running_loop().run_in_executor(None, publisher.watch_forever)
        self._spawn(self.hook_path.run(), "hook-path")
        self._spawn(self._pods_loop(), "pods")
        self._spawn(self._resync_loop(), "dra-resync")

    async def _scrape(self) -> bytes:
        from prometheus_client import generate_latest

        if self.usage is not None:
            await self.usage.refresh_async()
        return generate_latest(self.registry)

    def _hook_path_changed(self, state: HookPathState) -> None:
        """HAMi-core became (un)usable, or is still missing: hold or release the GPUs, say so."""
        assert self.inventory is not None
        hold_while_missing(
            state,
            self.settings.node_name,
            set_hold=self.inventory.set_hold,
            announce=self.api.events.hami_core,
            while_missing="every GPU tainted, no share prepared",
        )

    async def _pods_loop(self) -> None:
        """Tell the usage sampler which pods are on the node (their container IDs), every interval."""
        node = self.settings.config.node
        interval = self.settings.pods_interval_seconds or node.register_interval_seconds
        while True:
            try:
                pods = await self.api.pods_on_node_cached(node.allocate_timeout_seconds)
                if self.usage is not None:
                    self.usage.pods_seen(pods)
            except (ApiError, ApiUnavailable) as exc:
                log.warning("event=pods_refresh_failed node=%s error=%r", self.settings.node_name, str(exc))
            await asyncio.sleep(interval)

    async def _resync_loop(self) -> None:
        """Read the pool back every interval and write it again where it differs. The kubelet deletes
        a driver's slices on its own (at its start, and 30 s after the driver's plugin went away:
        pkg/kubelet/cm/dra/manager.go), and no health change would tell the publisher: the slice
        watch hears it at once, and this read catches what a watch that is down or catching up
        misses."""
        assert self.publisher is not None
        interval = self.settings.resync_seconds or self.settings.config.node.register_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                await self.publisher.publish()
            except KubeError as exc:
                log.warning("event=dra_slices_failed node=%s error=%r", self.settings.node_name, str(exc))
            await self._check_device_plugin()

    async def _check_device_plugin(self) -> None:
        """Read the Node: a Volcano vGPU resource (the configured names) or NVIDIA's `nvidia.com/gpu`
        advertised with a non-zero amount means a device plugin serves this node too
        (`node.dra.volcano`). Said once when it appears (a Warning log line and a Node Event) and
        once when it goes; the metric holds it meanwhile."""
        s = self.settings
        try:
            found = await self.api.node(s.config.node.allocate_timeout_seconds)
        except KubeError as exc:
            log.warning("event=node_read_failed node=%s error=%r", s.node_name, str(exc))
            return
        if found is None:
            return
        volcano_names = s.config.resource_names.all()
        names = device_plugin_resources(found, dict.fromkeys([*volcano_names, NVIDIA_GPU_RESOURCE]))
        if names and not self.device_plugin_resources:
            message = conflict_message(s.node_name, names, volcano_names)
            log.warning("event=device_plugin_on_dra_node node=%s message=%r", s.node_name, message)
            self.api.events.record(node_reference(s.node_name), "Warning", DEVICE_PLUGIN_ON_DRA_NODE, message)
        elif self.device_plugin_resources and not names:
            log.info("event=device_plugin_gone node=%s", s.node_name)
        self.device_plugin_resources = names

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=f"kube-vgpu-{name}")
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # These loops run until cancelled (the publisher's also ends when the inventory closes at
        # stop); ending any other way is a bug: stop, so the DaemonSet restarts the plugin.
        if task.cancelled() or (self._stopping is not None and task.exception() is None):
            return
        log.error(
            "event=task_died node=%s task=%s",
            self.settings.node_name,
            task.get_name(),
            exc_info=task.exception(),
        )
        self.failed = True
        if self._stop is not None:
            self._stop.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until `stop` is set, then stop cleanly."""
        self._stop = stop
        try:
            stop_waiter = asyncio.create_task(stop.wait())
            start = asyncio.create_task(self.start())
            done, _ = await asyncio.wait({stop_waiter, start}, return_when=asyncio.FIRST_COMPLETED)
            if start in done:
                start.result()
                await stop_waiter
            else:
                start.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await start
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop serving, remove both sockets, stop the loops; the ResourceSlices stay (module doc)."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_all())
        await asyncio.shield(self._stopping)

    async def _stop_all(self) -> None:
        if self.server is not None:
            # Sockets first: the kubelet stops sending prepares to a plugin that is going.
            await self.server.stop(grace=1.0)
        if self.inventory is not None:
            self.inventory.close()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=TASK_STOP_SECONDS)
            if stuck:
                log.error(
                    "event=task_stop_slow node=%s tasks=%s",
                    self.settings.node_name,
                    ",".join(sorted(task.get_name() for task in stuck)),
                )
        self._tasks.clear()
        if self.publisher is not None:
            self.publisher.stop_watch()
        if self._watch_thread is not None:
            # A watch whose stream does not wake when cut ends at its read timeout; wait a bounded time.
            done, _ = await asyncio.wait({self._watch_thread}, timeout=TASK_STOP_SECONDS)
            for thread in done:
                with contextlib.suppress(Exception):
                    thread.result()
            if not done:
                log.warning("event=watch_stop_slow node=%s watches=1", self.settings.node_name)
            self._watch_thread = None
        if self.health is not None:
            await asyncio.to_thread(self.health.stop)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.usage is not None:
            await self.usage.drain()
        await self.api.events.drain()
        await asyncio.to_thread(self.api.close)
        log.info("event=stopped node=%s api=dra", self.settings.node_name)


def gpu_cdi_dirs(text: str) -> tuple[Path, ...]:
    """`--gpu-cdi-dirs`: a comma list of folders (ValueError naming the flag when empty)."""
    folders = tuple(Path(p.strip()) for p in text.split(",") if p.strip())
    if not folders:
        raise ValueError(f"--gpu-cdi-dirs: expected a comma list of folders, got {text!r}")
    return folders


__all__: Sequence[str] = ["DraNodePlugin", "DraSettings", "gpu_cdi_dirs"]
