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

log = logging.getLogger("kube_vgpu.node.inventory")


class Inventory:
    """GPUs (fixed at start) plus the set of unhealthy ones, versioned."""

    def __init__(self, gpus: Sequence[GpuInfo], split_count: int, node_name: str) -> None:
        self.gpus: tuple[GpuInfo, ...] = tuple(gpus)
        self.by_uuid = {g.uuid: g for g in self.gpus}
        self.split_count = split_count
        self.node_name = node_name
        self.version = 0
        self._unhealthy: dict[str, str] = {}
        self._changed: asyncio.Event | None = None
        self._closed = False
        self._listeners: list[Callable[[], None]] = []

    @property
    def unhealthy(self) -> frozenset[str]:
        """UUIDs of the GPUs currently out of service."""
        return frozenset(self._unhealthy)

    def reason(self, uuid: str) -> str | None:
        """Why a GPU is unhealthy, or None when it is healthy."""
        return self._unhealthy.get(uuid)

    def devices(self) -> list[Device]:
        """The current full ListAndWatch device list."""
        return device_list(self.gpus, self._unhealthy, self.split_count)

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
