"""The node plugin, assembled: NVML discovery, node publishing, the kubelet link, health, metrics.

Start order matters: the GPUs are discovered, the Node is published (register annotation, labels,
capacity) and only then is the device plugin registered with the kubelet, so the scheduler never sees
resources without the annotation that says what they are (Volcano's
`pkg/scheduler/api/devices/nvidia/vgpu/device_info.go` `NewGPUDevices` counts such a node's
resources as GPUs it cannot decode). The kubelet's socket
is watched by identity (inode and change times: a recreated socket may reuse the inode) and our own
socket's presence; either changing means a kubelet restart, and the plugin serves and registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from kube_vgpu.contract.config import Config
from kube_vgpu.contract.names import HAMI_CORE, MIG
from kube_vgpu.httpedge.metrics_server import MetricsServer
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.allocator import Allocator
from kube_vgpu.node.deviceplugin.bind_order import BindOrder
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.deviceplugin.cache_folders import DEFAULT_GRACE_SECONDS, CacheFolders
from kube_vgpu.node.deviceplugin.hamicore import DEFAULT_LOCK_DIR
from kube_vgpu.node.deviceplugin.pod_watch import PodWatch
from kube_vgpu.node.deviceplugin.selection import is_allocating_here
from kube_vgpu.node.deviceplugin.server import (
    KUBELET_SOCKET,
    DevicePluginService,
    PluginServer,
    register,
    socket_identity,
    socket_name,
)
from kube_vgpu.node.hookpath import HookPathState, HookPathWatch, hold_while_missing
from kube_vgpu.node.metrics import Metrics
from kube_vgpu.node.mig.start import reconcile_interval, start_mig
from kube_vgpu.node.nvml.gpus import GpuInfo, check_inventory, discover
from kube_vgpu.node.nvml.health import HealthMonitor, monitor_health
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.nvml.surface import Nvml
from kube_vgpu.node.publish.publisher import NodePublisher
from kube_vgpu.node.usage.metrics import UsageSampler

log = logging.getLogger("kube_vgpu.node.plugin")
# How long stopping waits for a watch thread to end once its stream was cut.
WATCH_STOP_SECONDS = 5.0
# How long stop waits for its own asyncio loops to end once cancelled.
TASK_STOP_SECONDS = 5.0


@dataclass(frozen=True)
class PluginSettings:
    """How one node plugin runs; the defaults are production's, tests shorten the waits."""

    node_name: str
    mode: str
    kubelet_dir: Path
    config: Config
    lock_dir: str = DEFAULT_LOCK_DIR
    # How often the kubelet's socket is checked: a restart is noticed within this (5 s).
    kubelet_poll_seconds: float = 0.5
    register_deadline_seconds: float = 5.0
    xid_wait_ms: int = 5000
    probe_interval_seconds: float = 5.0
    watch_timeout_seconds: int = 300
    # None: the configured metricsPort; 0 picks a free port (tests).
    metrics_port: int | None = None
    # How often a hami-core node looks for HAMi-core in hookPath, and how often the Warning Event
    # is recorded again while it is missing (under the API server's default one-hour event TTL).
    hook_path_poll_seconds: float = 10.0
    hook_path_remind_seconds: float = 1800.0
    # How long a hami-core container's host folder outlives its pod's last sighting on the node.
    cache_folder_grace_seconds: float = DEFAULT_GRACE_SECONDS


class NodePlugin:
    """One node's vGPU plugin; `start()`, then `stop()` (or `run(stop_event)`)."""

    def __init__(self, settings: PluginSettings, nvml: Nvml, kube: Kube) -> None:
        self.settings = settings
        self._nvml = nvml
        self._config = settings.config
        self.api = NodeApi(kube, settings.node_name)
        self._stop = asyncio.Event()
        self._stopping: asyncio.Future[None] | None = None
        self._external_stop: asyncio.Event | None = None
        self.failed = False  # a background loop died: the process should exit non-zero
        self._tasks: list[asyncio.Task[None]] = []
        self._watch_thread: asyncio.Future[None] | None = None
        self._pod_watch_thread: asyncio.Future[None] | None = None
        self.pod_watch: PodWatch | None = None
        self.inventory: LiveGpus | None = None
        self.publisher: NodePublisher | None = None
        self.allocator: Allocator | None = None
        self.metrics: Metrics | None = None
        self.usage: UsageSampler | None = None
        self.metrics_server: MetricsServer | None = None
        self.health: HealthMonitor | None = None
        self.hook_path: HookPathWatch | None = None
        self.cache_folders: CacheFolders | None = None
        self.server: PluginServer | None = None
        self.registrations = 0

    @property
    def resource_name(self) -> str:
        """The device plugin's resource, `vgpu-number` as configured."""
        return self._config.resource_names.count

    async def start(self) -> None:
        """Discover, publish, and start serving the kubelet; raises on a node that cannot be served."""
        s, node = self.settings, self._config.node
        gpus: list[GpuInfo] = await asyncio.to_thread(discover, self._nvml)
        check_inventory(gpus, node.device_split_count)
        log.info(
            "event=gpus_discovered node=%s count=%d gpus=%s",
            s.node_name,
            len(gpus),
            ",".join(f"{g.uuid}:{g.name}:{g.memory_mib}MiB" for g in gpus),
        )
        inventory = self.inventory = LiveGpus(gpus, node.device_split_count, s.node_name)
        ledger = Ledger(gpus, node.device_split_count, self._config.resource_names, s.node_name)
        usage = self.usage = UsageSampler(self._nvml, gpus, s.node_name, self._nvml.process_cgroup)
        metrics = self.metrics = Metrics(inventory, ledger, usage)
        self._ledger = ledger
        self.pod_watch = PodWatch(
            self.api,
            BindOrder(),
            call_budget=node.allocate_timeout_seconds,
            watch_timeout=s.watch_timeout_seconds,
        )
        mig = None
        if s.mode == MIG:
            mig = await start_mig(self._nvml, gpus, self.api, node, stop=self._stop)
            if mig is None:
                return
        self.allocator = Allocator(
            self.api,
            inventory,
            ledger,
            metrics,
            mode=s.mode,
            names=self._config.resource_names,
            config=node,
            lock_dir=s.lock_dir,
            mig=mig,
            pod_watch=self.pod_watch,
        )
        publisher = self.publisher = NodePublisher(
            self.api,
            inventory,
            mode=s.mode,
            names=self._config.resource_names,
            interval=node.register_interval_seconds,
            call_budget=node.allocate_timeout_seconds,
            watch_timeout_seconds=s.watch_timeout_seconds,
            handshake=node.write_handshake,
        )
        inventory.on_change(publisher.trigger)
        self.metrics_server = metrics.server(node.metrics_port if s.metrics_port is None else s.metrics_port)
        await self.metrics_server.start()

        self.health = monitor_health(
            self._nvml,
            inventory,
            node,
            self.api.events.gpu_health,
            wait_ms=s.xid_wait_ms,
            probe_interval=s.probe_interval_seconds,
        )
        if s.mode == HAMI_CORE:
            # Checked before the first publish, so a node without HAMi-core never offers capacity.
            self.hook_path = HookPathWatch(
                node.hook_path,
                self._hook_path_changed,
                interval=s.hook_path_poll_seconds,
                remind_seconds=s.hook_path_remind_seconds,
            )
            metrics.watch_hook_path(s.node_name, self.hook_path)
            await self.hook_path.check()
            self.cache_folders = CacheFolders(
                node.hook_path,
                s.node_name,
                grace_seconds=s.cache_folder_grace_seconds,
                on_removed=metrics.cache_folders_removed.inc,
            )

        # The annotation must be on the node before the kubelet learns of the resource.
        if not await publisher.publish_first(self._stop):
            return
        self.server = PluginServer(
            s.kubelet_dir / socket_name(self.resource_name),
            DevicePluginService(inventory, self.allocator.allocate),
        )
        self._spawn(publisher.run(), "publisher")
        self._spawn(self._kubelet_link(), "kubelet")
        self._spawn(self._ledger_loop(), "ledger")
        if self.hook_path is not None:
            self._spawn(self.hook_path.run(), "hook-path")
        if mig is not None:
            self._spawn(
                mig.run(
                    lambda: self.api.pods_on_node_cached(node.allocate_timeout_seconds),
                    reconcile_interval(node),
                ),
                "mig",
            )
        loop = asyncio.get_running_loop()
        self._watch_thread = loop.run_in_executor(None, publisher.watch_forever, loop)
        self._pod_watch_thread = loop.run_in_executor(None, self.pod_watch.watch_forever, loop)

    def _hook_path_changed(self, state: HookPathState) -> None:
        """HAMi-core became (un)usable, or is still missing: hold or release the node's offer, say so."""
        assert self.inventory is not None
        hold_while_missing(
            state,
            self.settings.node_name,
            set_hold=self.inventory.set_hold,
            announce=self.api.events.hami_core,
            while_missing="no hami-core capacity offered",
        )

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=f"kube-vgpu-{name}")
        task.add_done_callback(self._task_ended)
        self._tasks.append(task)

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # These loops run until cancelled; ending any other way is a bug, and the plugin cannot go on
        # half-working: stop, so the DaemonSet restarts it.
        if task.cancelled():
            return
        log.error(
            "event=task_died node=%s task=%s",
            self.settings.node_name,
            task.get_name(),
            exc_info=task.exception(),
        )
        self.failed = True
        self._stop.set()
        if self._external_stop is not None:
            self._external_stop.set()

    async def _kubelet_link(self) -> None:
        """Serve and register; again after every kubelet restart."""
        s = self.settings
        assert self.server is not None
        kubelet_socket = s.kubelet_dir / KUBELET_SOCKET
        waiting_logged = False
        while True:
            identity = socket_identity(kubelet_socket)
            if identity is None:
                if not waiting_logged:
                    log.info("event=waiting_for_kubelet node=%s socket=%s", s.node_name, kubelet_socket)
                    waiting_logged = True
                await asyncio.sleep(s.kubelet_poll_seconds)
                continue
            waiting_logged = False
            try:
                await self.server.start()
            except (OSError, RuntimeError) as exc:
                log.error(
                    "event=serve_failed node=%s socket=%s error=%r", s.node_name, self.server.path, str(exc)
                )
                await asyncio.sleep(max(s.kubelet_poll_seconds, 1.0))
                continue
            await self._register(kubelet_socket, identity)
            # Polling the file system: a kubelet restart sends no event to wait on.
            while socket_identity(kubelet_socket) == identity and self.server.intact:  # noqa: ASYNC110
                await asyncio.sleep(s.kubelet_poll_seconds)
            log.warning("event=kubelet_restarted node=%s: serving and registering again", s.node_name)
            await self._kubelet_restarted()
            await self.server.stop(grace=0)

    async def _kubelet_restarted(self) -> None:
        """The pods waiting now reach the restarted kubelet in one update: rank them as it will."""
        if self.pod_watch is None:
            return
        try:
            pods = await self.api.pods_on_node(self._config.node.allocate_timeout_seconds)
        except (ApiError, ApiUnavailable) as exc:
            log.warning("event=bind_order_batch_unknown node=%s error=%r", self.settings.node_name, str(exc))
            return
        self.pod_watch.order.kubelet_restarted(
            p for p in pods if is_allocating_here(p, self.settings.node_name)
        )

    async def _register(self, kubelet_socket: Path, identity: object) -> None:
        s = self.settings
        assert self.server is not None
        delay = s.kubelet_poll_seconds
        while socket_identity(kubelet_socket) == identity and self.server.intact:
            try:
                await register(
                    kubelet_socket,
                    self.server.path.name,
                    self.resource_name,
                    deadline=s.register_deadline_seconds,
                )
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "event=register_failed node=%s code=%s details=%r retry_in=%g",
                    s.node_name,
                    exc.code().name,
                    exc.details(),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.registrations += 1
            log.info(
                "event=registered node=%s resource=%s endpoint=%s",
                s.node_name,
                self.resource_name,
                self.server.path.name,
            )
            return

    async def _ledger_loop(self) -> None:
        """Rebuild the ledger from the node's pods every interval, reporting new over-commit."""
        node = self._config.node
        reported: set[tuple[str, str]] = set()
        while True:
            try:
                pods = await self.api.pods_on_node_cached(node.allocate_timeout_seconds)
                if self.usage is not None:
                    self.usage.pods_seen(pods)
                if self.cache_folders is not None:
                    live = {str((p.get("metadata") or {}).get("uid", "")) for p in pods}
                    await asyncio.to_thread(self.cache_folders.sweep, live)
                for problem in self._ledger.rebuild(pods):
                    log.warning("event=ledger_skipped node=%s %s", self.settings.node_name, problem)
                current = {(o.gpu_uuid, o.resource): o for o in self._ledger.overcommits()}
                for key in current.keys() - reported:
                    o = current[key]
                    log.warning(
                        "event=gpu_overcommitted node=%s gpu=%s resource=%s used=%d capacity=%d",
                        self.settings.node_name,
                        o.gpu_uuid,
                        o.resource,
                        o.used,
                        o.capacity,
                    )
                reported = set(current)
            except (ApiError, ApiUnavailable) as exc:
                log.warning("event=ledger_refresh_failed node=%s error=%r", self.settings.node_name, str(exc))
            await asyncio.sleep(node.register_interval_seconds)

    async def run(self, stop: asyncio.Event) -> None:
        """Start, serve until `stop` is set, then stop cleanly."""
        self._external_stop = stop
        try:
            stop_waiter = asyncio.create_task(stop.wait())
            start = asyncio.create_task(self.start())
            done, _ = await asyncio.wait({stop_waiter, start}, return_when=asyncio.FIRST_COMPLETED)
            if start in done:
                start.result()
                await stop_waiter
            else:
                self._stop.set()
                await start
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Stop everything started, end the kubelet's stream, remove our socket.

        Runs once: a second call waits for the first, and a caller cancelled while it waits leaves
        the stopping to finish (a half-done stop would leave the watch threads running).
        """
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop_all())
        await asyncio.shield(self._stopping)

    async def _stop_all(self) -> None:
        self._stop.set()
        if self.inventory is not None:
            self.inventory.close()  # ends ListAndWatch streams cleanly
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Each loop ends at its next await; one that does not is named, and stop goes on.
            _, stuck = await asyncio.wait(self._tasks, timeout=TASK_STOP_SECONDS)
            if stuck:
                log.error(
                    "event=task_stop_slow node=%s tasks=%s",
                    self.settings.node_name,
                    ",".join(sorted(task.get_name() for task in stuck)),
                )
        self._tasks.clear()
        if self.server is not None:
            await self.server.stop(grace=1.0)
        if self.publisher is not None:
            self.publisher.stop_watch()
        if self.pod_watch is not None:
            self.pod_watch.stop()
        # A watch whose stream does not wake when it is cut ends at its read timeout on its own;
        # stopping waits a bounded time for it rather than for ever (the thread holds no state).
        watches = {thread for thread in (self._watch_thread, self._pod_watch_thread) if thread is not None}
        if watches:
            _, pending = await asyncio.wait(watches, timeout=WATCH_STOP_SECONDS)
            for thread in watches - pending:
                with contextlib.suppress(Exception):
                    thread.result()
            if pending:
                log.warning("event=watch_stop_slow node=%s watches=%d", self.settings.node_name, len(pending))
        self._watch_thread = self._pod_watch_thread = None
        if self.allocator is not None:
            await self.allocator.drain()
        if self.health is not None:
            await asyncio.to_thread(self.health.stop)
        if self.metrics_server is not None:
            await self.metrics_server.stop()
        if self.usage is not None:
            await self.usage.drain()
        await self.api.events.drain()
        await asyncio.to_thread(self.api.close)
        log.info("event=stopped node=%s", self.settings.node_name)
