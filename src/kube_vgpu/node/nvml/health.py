"""GPU health from NVML: XID events mark a GPU unhealthy, a quiet spell of normal answers brings it back.

`HealthTracker` is the pure rule (which XIDs count, when a GPU recovers). `HealthMonitor` runs it on a
thread of its own, since `nvmlEventSetWait_v2` blocks: it waits with a finite timeout so it can stop,
probes every GPU between waits (a lost GPU fails the probe), and reports changes through a callback.
NVIDIA's own plugin never lets a GPU recover; here one does after `recoveryQuietSeconds` without a
critical XID or a failed probe.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.config import NodeConfig
from kube_vgpu.node.nvml.gpus import GpuInfo, nvml_text
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger(__name__)

# (uuid, healthy, reason): called on the monitor's thread.
Report = Callable[[str, bool, str], None]


@dataclass
class _GpuHealth:
    healthy: bool = True
    last_bad: float = 0.0
    reason: str = ""


class HealthTracker:
    """Per-GPU health: which events count and when a GPU is well again. Pure: time is passed in."""

    def __init__(self, uuids: Collection[str], ignored_xids: Collection[int], quiet_seconds: float) -> None:
        self._gpus = {u: _GpuHealth() for u in uuids}
        self._ignored = frozenset(ignored_xids)
        self._quiet = quiet_seconds

    def healthy(self, uuid: str) -> bool:
        """Whether the GPU is in service."""
        return self._gpus[uuid].healthy

    def on_xid(self, uuid: str, xid: int, now: float) -> str | None:
        """An XID on a GPU; returns the reason when it (newly) takes the GPU out of service."""
        if xid in self._ignored or uuid not in self._gpus:
            return None
        return self._bad(uuid, f"XID {xid}", now)

    def on_probe(self, uuid: str, error: str | None, now: float) -> tuple[bool, str] | None:
        """The result of asking NVML about a GPU; returns (healthy, reason) when health changes."""
        state = self._gpus.get(uuid)
        if state is None:
            return None
        if error is not None:
            reason = self._bad(uuid, f"NVML: {error}", now)
            return (False, reason) if reason else None
        if not state.healthy and now - state.last_bad >= self._quiet:
            state.healthy = True
            return True, f"answered NVML normally for {self._quiet:g}s after {state.reason}"
        return None

    def _bad(self, uuid: str, reason: str, now: float) -> str | None:
        state = self._gpus[uuid]
        state.last_bad = now
        if not state.healthy:
            return None
        state.healthy = False
        state.reason = reason
        return reason


def _address(handle: Any) -> int | None:
    # NVML device handles are pointers; their address identifies the device without an NVML call,
    # which a lost GPU could not answer.
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class HealthMonitor:
    """The thread that waits for NVML events and probes the GPUs."""

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[GpuInfo],
        tracker: HealthTracker,
        report: Report,
        *,
        wait_ms: int = 5000,
        probe_interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._gpus = list(gpus)
        self._tracker = tracker
        self._report = report
        self._wait_ms = wait_ms
        self._probe_interval = probe_interval
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_address: dict[int, str] = {}

    def start(self) -> None:
        """Start the thread."""
        self._thread = threading.Thread(target=self._run, name="kube-vgpu-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one event wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        nvml = self._nvml
        event_set = self._create_event_set()
        next_probe = self._clock()
        try:
            while not self._stop.is_set():
                if self._clock() >= next_probe:
                    self.probe_all()
                    next_probe = self._clock() + self._probe_interval
                if event_set is None:
                    self._stop.wait(min(self._probe_interval, self._wait_ms / 1000))
                    continue
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, self._wait_ms)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as exc:
                    log.warning("event=nvml_event_wait_failed error=%r", str(exc))
                    self._stop.wait(1.0)
                    continue
                self._on_event(data)
        finally:
            if event_set is not None:
                try:
                    nvml.nvmlEventSetFree(event_set)
                except nvml.NVMLError as exc:
                    log.warning("event=nvml_event_set_free_failed error=%r", str(exc))

    def _create_event_set(self) -> Any:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("event=nvml_events_unavailable error=%r: health from probes only", str(exc))
            return None
        for gpu in self._gpus:
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                mask = supported & int(nvml.nvmlEventTypeXidCriticalError)
                if not mask:
                    log.warning("event=xid_events_not_supported gpu=%s", gpu.uuid)
                    continue
                nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                address = _address(handle)
                if address is not None:
                    self._by_address[address] = gpu.uuid
            except nvml.NVMLError_NotSupported:
                log.warning("event=xid_events_not_supported gpu=%s", gpu.uuid)
            except nvml.NVMLError as exc:
                # A GPU that cannot even register is reported by the probes.
                log.warning("event=xid_register_failed gpu=%s error=%r", gpu.uuid, str(exc))
        return event_set

    def _event_gpus(self, device: Any) -> list[str]:
        address = _address(device)
        if address is not None and address in self._by_address:
            return [self._by_address[address]]
        try:
            return [nvml_text(self._nvml.nvmlDeviceGetUUID(device))]
        except self._nvml.NVMLError:
            # As NVIDIA's plugin does: an XID that names no device we know affects them all.
            return [g.uuid for g in self._gpus]

    def _on_event(self, data: object) -> None:
        if int(getattr(data, "eventType", 0)) != int(self._nvml.nvmlEventTypeXidCriticalError):
            return
        xid = int(getattr(data, "eventData", 0))
        now = self._clock()
        for uuid in self._event_gpus(getattr(data, "device", None)):
            reason = self._tracker.on_xid(uuid, xid, now)
            log.info("event=xid gpu=%s xid=%d counted=%s", uuid, xid, str(reason is not None).lower())
            if reason:
                self._report(uuid, False, reason)

    def probe_all(self) -> None:
        """Ask NVML about every GPU once and report health changes."""
        nvml = self._nvml
        for gpu in self._gpus:
            error: str | None = None
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                error = str(exc)
            change = self._tracker.on_probe(gpu.uuid, error, self._clock())
            if change is not None:
                self._report(gpu.uuid, *change)


def monitor_health(
    nvml: Nvml,
    inventory: LiveGpus,
    node: NodeConfig,
    announce: Callable[[str, str, bool, str, float], None],
    *,
    wait_ms: int,
    probe_interval: float,
) -> HealthMonitor:
    """Start a monitor of the inventory's GPUs. Each change it reports from its thread is applied to
    `inventory` on the calling event loop, and `announce(uuid, model, healthy, reason, quiet_seconds)`
    (the node's Event) runs for each GPU whose health did change."""
    loop = asyncio.get_running_loop()

    def changed(uuid: str, healthy: bool, reason: str) -> None:
        if inventory.set_health(uuid, healthy, reason):
            announce(uuid, inventory.by_uuid[uuid].name, healthy, reason, node.recovery_quiet_seconds)

    def report(uuid: str, healthy: bool, reason: str) -> None:
        loop.call_soon_threadsafe(changed, uuid, healthy, reason)

    tracker = HealthTracker(list(inventory.by_uuid), node.ignored_xids, node.recovery_quiet_seconds)
    monitor = HealthMonitor(
        nvml, inventory.gpus, tracker, report, wait_ms=wait_ms, probe_interval=probe_interval
    )
    monitor.start()
    return monitor
