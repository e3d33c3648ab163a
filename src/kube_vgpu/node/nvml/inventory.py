"""The node's GPUs and their health as the running plugin knows them, with change notification.

Everything published (ListAndWatch, the register annotation, capacity, metrics) is derived from this
one object, so a health change reaches all of them. It lives on the event loop: other threads report
through `loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.publish.advertise import Device, device_list

log = logging.getLogger(__name__)


class LiveGpus:
    """GPUs (fixed at start) plus the set of unhealthy ones, versioned.

    Besides each GPU's own health there is one node-wide hold: while it is set (HAMi-core missing
    on a hami-core node), every GPU counts as unhealthy, with the hold's reason, so the device
    list, the register annotation, capacity and metrics all drop the node's offer by the one path
    an XID takes; lifting it restores exactly the GPUs that are healthy on their own.
    """

    def __init__(self, gpus: Sequence[GpuInfo], split_count: int, node_name: str) -> None:
        self.gpus: tuple[GpuInfo, ...] = tuple(gpus)
        self.by_uuid = {g.uuid: g for g in self.gpus}
        self.split_count = split_count
        self.node_name = node_name
        self.version = 0
        self._unhealthy: dict[str, str] = {}
        self._hold: str | None = None
        self._changed: asyncio.Event | None = None
        self._closed = False
        self._listeners: list[Callable[[], None]] = []

    @property
    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs currently out of service."""
        if self._hold is not None:
            return frozenset(self.by_uuid)
        return frozenset(self._unhealthy)

    def reason(self, uuid: str) -> str | None:
        """Why a GPU is unhealthy, or None when it is healthy."""
        if self._hold is not None and uuid in self.by_uuid:
            return self._hold
        return self._unhealthy.get(uuid)

    @property
    def hold(self) -> str | None:
        """Why the whole node is out of service, or None."""
        return self._hold

    def set_hold(self, reason: str | None) -> bool:
        """Take every GPU out of service for `reason`, or (None) lift the hold; returns whether the
        offer changed."""
        if (reason is None) == (self._hold is None):
            self._hold = reason  # a new reason for a hold already in place changes no offer
            return False
        self._hold = reason
        log.warning(
            "event=node_hold node=%s held=%s reason=%r",
            self.node_name,
            str(reason is not None).lower(),
            reason or "",
        )
        self._bump()
        for listener in list(self._listeners):
            listener()
        return True

    def devices(self) -> list[Device]:
        """The current full ListAndWatch device list."""
        return device_list(self.gpus, self.unhealthy, self.split_count)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (on the loop) after every health change."""
        self._listeners.append(listener)

    def set_health(self, uuid: str, healthy: bool, reason: str = "") -> bool:
        """Mark a GPU healthy or not; returns whether anything changed."""
        if uuid not in self.by_uuid or (uuid not in self._unhealthy) == healthy:
            return False
        if healthy:
            del self._unhealthy[uuid]
        else:
            self._unhealthy[uuid] = reason or "unhealthy"
        log.warning(
            "event=gpu_health node=%s gpu=%s healthy=%s reason=%r",
            self.node_name,
            uuid,
            str(healthy).lower(),
            reason,
        )
        self._bump()
        for listener in list(self._listeners):
            listener()
        return True

    def _bump(self) -> None:
        self.version += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def close(self) -> None:
        """Wake every waiter for good: the plugin is stopping and streams should end."""
        self._closed = True
        self._bump()

    async def wait_newer(self, seen: int) -> int | None:
        """Wait until the version differs from `seen`; returns it, or None once closed."""
        while self.version == seen and not self._closed:
            if self._changed is None:
                self._changed = asyncio.Event()
            await self._changed.wait()
        return None if self._closed else self.version
