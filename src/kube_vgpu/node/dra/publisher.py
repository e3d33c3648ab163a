"""Keeps the node's ResourceSlice pool saying what `node.dra.slices` computes from the GPUs' health.

Publishes on start and after every health change of the inventory, each change as a new pool
generation (consumers use only the highest one); writes nothing while the stored pool already says
it. After each write it reads what the API server stored, as the resourceslice controller of
k8s.io/dynamic-resource-allocation does (its DroppedFieldsError): a server whose
DRAConsumableCapacity gate is off drops `allowMultipleAllocations` and the request policies (its
`dropDisabledFields`), which would leave devices that look whole but are meant to be shared, so the
publisher then publishes whole GPUs, and says so in a log line, a metric and `state` (for
`node check`); likewise for device taints, after which unhealthy GPUs leave the pool instead. The
choice holds until the plugin restarts. `remove()` deletes the node's slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kube_vgpu.kubeapi.client import ApiError, Kube, KubeError
from kube_vgpu.kubeapi.listwatch import Backoff, Handlers, KubeSource, Reflector
from kube_vgpu.node.dra.attributes import GpuFacts, read_facts
from kube_vgpu.node.dra.slices import (
    DRIVER,
    PoolSpec,
    SliceOptions,
    Unhealthy,
    build_devices,
    build_slices,
    dropped_features,
)
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger("kube_vgpu.node.dra.publisher")

_RETRY_SECONDS = 2.0
_ALL_ON = SliceOptions()


class NodeMissing(KubeError):
    """The Node object does not exist (yet): slices are owned by it, so there is nothing to publish on."""


@dataclass(frozen=True)
class PublishState:
    """What the node's pool says now, for logs, metrics and `node check`."""

    generation: int = 0
    devices: int = 0
    consumable_capacity: bool = True
    device_taints: bool = True
    # Why a feature is off, in words an operator can act on ("" when both are on).
    note: str = ""
    published: bool = False

    def report(self) -> dict[str, Any]:
        """The pool as `node check` prints it (JSON-ready)."""
        return {
            "driver": DRIVER,
            "published": self.published,
            "generation": self.generation,
            "devices": self.devices,
            "sharing": "consumable capacity" if self.consumable_capacity else "whole GPUs",
            "unhealthyGpus": "tainted NoSchedule" if self.device_taints else "left out of the pool",
            "note": self.note,
        }


def _now() -> datetime:
    return datetime.now(UTC)


class SlicePublisher:
    """Publishes one node's GPUs as its ResourceSlice pool, through the product's Kube client."""

    def __init__(
        self,
        kube: Kube,
        node_name: str,
        gpus: Sequence[GpuFacts],
        inventory: Inventory,
        *,
        options: SliceOptions = _ALL_ON,
        clock: Callable[[], datetime] = _now,
        retry_seconds: float = _RETRY_SECONDS,
        watch_timeout_seconds: int = 300,
    ) -> None:
        self._kube = kube
        self._node = node_name
        self._gpus = tuple(gpus)
        self._inventory = inventory
        self._options = options
        self._clock = clock
        self._retry = retry_seconds
        self._since: dict[str, str] = {}  # uuid -> when it was first seen unhealthy
        self._node_uid: str | None = None
        self._state = PublishState(
            consumable_capacity=options.consumable_capacity, device_taints=options.device_taints
        )
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reflector: Reflector[dict[str, Any]] = Reflector(
            KubeSource(
                kube, "resourceslice", field_selector=f"spec.nodeName={node_name},spec.driver={DRIVER}"
            ),
            Handlers(listed=self._poke, event=self._poke),
            transform=lambda obj: obj,
            name=f"resourceslices/{node_name}",
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=Backoff(initial=retry_seconds, maximum=30.0),
        )

    @property
    def node_name(self) -> str:
        """The node whose pool this is."""
        return self._node

    @property
    def state(self) -> PublishState:
        """The pool as last published."""
        return self._state

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Publish now, after every inventory change and whenever the watch (`watch_forever`) shows
        the stored pool touched by someone else, until cancelled or the inventory closes; a failed
        publish is retried after `retry_seconds` (the pool then says the latest health)."""
        self._loop = asyncio.get_running_loop()
        follower = asyncio.create_task(self._follow_inventory())
        try:
            while not self._closed:
                self._wake.clear()
                try:
                    await self.publish()
                except KubeError as exc:
                    log.warning("event=dra_slices_failed node=%s error=%r", self._node, str(exc))
                    await asyncio.sleep(self._retry)
                    continue
                await self._wake.wait()
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def _follow_inventory(self) -> None:
        seen = self._inventory.version
        while (newer := await self._inventory.wait_newer(seen)) is not None:
            seen = newer
            self._wake.set()
        self._closed = True
        self._wake.set()

    def watch_forever(self) -> None:
        """Watch this node's slices of this driver (on a thread of its own, while `run` runs) and
        publish again when they change: the kubelet deletes a driver's slices once its plugin has
        been gone a while, and anyone may edit or delete them. Returns once `stop_watch` is called."""
        self._reflector.run()

    def stop_watch(self) -> None:
        """End `watch_forever` (from any thread)."""
        self._reflector.stop()

    def _poke(self, *_: object) -> None:
        # On the reflector's thread: a publish that finds the pool as wanted writes nothing.
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def publish(self) -> PublishState:
        """Bring the pool in line with the inventory now; returns what it says."""
        async with self._lock:
            unhealthy = self._unhealthy()
            return await asyncio.to_thread(self._publish, unhealthy)

    async def remove(self) -> int:
        """Delete this node's slices of this driver (the plugin is uninstalled); returns how many."""
        async with self._lock:
            return await asyncio.to_thread(self._remove)

    # -- one reconcile (in a worker thread) -------------------------------------------------------

    def _unhealthy(self) -> dict[str, Unhealthy]:
        current = self._inventory.unhealthy
        for uuid in list(self._since):
            if uuid not in current:
                del self._since[uuid]
        stamp = self._clock().astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        found: dict[str, Unhealthy] = {}
        for uuid in current:
            since = self._since.setdefault(uuid, stamp)
            found[uuid] = Unhealthy(self._inventory.reason(uuid) or "unhealthy", since)
        return found

    def _publish(self, unhealthy: dict[str, Unhealthy]) -> PublishState:
        uid = self._uid()
        existing = self._existing()
        options = SliceOptions(self._state.consumable_capacity, self._state.device_taints)
        stored = self._write(uid, existing, unhealthy, options)
        kept = dropped_features(stored[0], stored[1])
        if kept != options:
            dropped = [
                name
                for name, before, after in (
                    ("consumable capacity", options.consumable_capacity, kept.consumable_capacity),
                    ("device taints", options.device_taints, kept.device_taints),
                )
                if before and not after
            ]
            note = self._note(kept)
            log.warning(
                "event=dra_feature_dropped node=%s dropped=%r consumable_capacity=%s device_taints=%s "
                "note=%r",
                self._node,
                ", ".join(dropped),
                str(kept.consumable_capacity).lower(),
                str(kept.device_taints).lower(),
                note,
            )
            self._state = replace(
                self._state,
                consumable_capacity=kept.consumable_capacity,
                device_taints=kept.device_taints,
                note=note,
            )
            stored = self._write(uid, stored[1], unhealthy, kept)
        return self._state

    def _note(self, options: SliceOptions) -> str:
        notes = []
        if not options.consumable_capacity:
            notes.append(
                "the API server dropped consumable capacity (feature gate DRAConsumableCapacity off): "
                "publishing whole GPUs"
            )
        if not options.device_taints:
            notes.append(
                "the API server dropped device taints (feature gate DRADeviceTaints off): "
                "unhealthy GPUs leave the pool"
            )
        return "; ".join(notes)

    def _write(
        self,
        uid: str,
        existing: list[dict[str, Any]],
        unhealthy: dict[str, Unhealthy],
        options: SliceOptions,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Write the pool if it differs from `existing`; returns (what was meant, what is stored)."""
        devices = _keep_taint_times(build_devices(self._gpus, unhealthy, options), existing)
        current = max((_generation(s) for s in existing), default=0)
        same = build_slices(PoolSpec(self._node, uid, current, devices))
        if current and _specs(same) == _specs(existing):
            self._state = replace(self._state, generation=current, devices=len(devices), published=True)
            return same, existing
        generation = max(current, self._state.generation) + 1
        desired = build_slices(PoolSpec(self._node, uid, generation, devices))
        by_name = {s["metadata"]["name"]: s for s in existing}
        stored: list[dict[str, Any]] = []
        for body in desired:
            old = by_name.pop(body["metadata"]["name"], None)
            if old is None:
                stored.append(self._kube.create("resourceslice", body))
            else:
                body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                stored.append(self._kube.replace("resourceslice", body["metadata"]["name"], body))
        for leftover, stale in by_name.items():
            # Only the version read: a slice written since is someone else's news (a 409, retried).
            self._kube.delete(
                "resourceslice", leftover, resource_version=stale["metadata"]["resourceVersion"]
            )
        self._state = replace(self._state, generation=generation, devices=len(devices), published=True)
        log.info(
            "event=dra_slices_published node=%s generation=%d slices=%d devices=%d unhealthy=%d "
            "consumable_capacity=%s device_taints=%s",
            self._node,
            generation,
            len(desired),
            len(devices),
            len(unhealthy),
            str(options.consumable_capacity).lower(),
            str(options.device_taints).lower(),
        )
        return desired, stored

    def _uid(self) -> str:
        if self._node_uid is None:
            items = self._kube.list("node", field_selector=f"metadata.name={self._node}").get("items") or []
            if not items:
                raise NodeMissing(f"node {self._node} does not exist: its ResourceSlices would have no owner")
            self._node_uid = str(items[0]["metadata"]["uid"])
        return self._node_uid

    def _existing(self) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={self._node},spec.driver={DRIVER}"
        items: list[dict[str, Any]] = (
            self._kube.list("resourceslice", field_selector=selector).get("items") or []
        )
        return sorted(items, key=lambda s: str(s["metadata"]["name"]))

    def _remove(self) -> int:
        removed = 0
        for item in self._existing():
            try:
                removed += self._kube.delete("resourceslice", item["metadata"]["name"])
            except ApiError as exc:
                log.warning(
                    "event=dra_slice_remove_failed node=%s slice=%s error=%r", self._node, item, str(exc)
                )
        self._state = replace(self._state, published=False)
        log.info("event=dra_slices_removed node=%s slices=%d", self._node, removed)
        return removed

    # -- metrics -----------------------------------------------------------------------------------

    def collector(self) -> Collector:
        """Prometheus gauges of the pool: its generation, devices, and which features are on."""
        return _PoolCollector(self)


def publisher_for(
    kube: Kube,
    node_name: str,
    nvml: Nvml,
    gpus: Sequence[GpuInfo],
    inventory: Inventory,
    *,
    options: SliceOptions = _ALL_ON,
) -> SlicePublisher:
    """The node plugin's publisher for its discovered GPUs (NVML initialised): reads each GPU's
    facts once, then publishes from the inventory. The caller runs `run()` as a task, and on
    uninstall awaits `remove()`."""
    return SlicePublisher(kube, node_name, read_facts(nvml, gpus), inventory, options=options)


class _PoolCollector(Collector):
    def __init__(self, publisher: SlicePublisher) -> None:
        self._publisher = publisher

    def collect(self) -> Iterator[Metric]:
        state, node = self._publisher.state, self._publisher.node_name
        for name, help_text, value in (
            (
                "kube_vgpu_dra_pool_generation",
                "Generation of the node's ResourceSlice pool",
                state.generation,
            ),
            ("kube_vgpu_dra_devices", "Devices in the node's ResourceSlice pool", state.devices),
            (
                "kube_vgpu_dra_consumable_capacity",
                "1 while GPUs are published as shared (consumable capacity), 0 while whole",
                int(state.consumable_capacity),
            ),
            (
                "kube_vgpu_dra_device_taints",
                "1 while unhealthy GPUs are published tainted, 0 while they leave the pool",
                int(state.device_taints),
            ),
        ):
            family = GaugeMetricFamily(name, help_text, labels=["node"])
            family.add_metric([node], value)
            yield family


def _keep_taint_times(devices: list[dict[str, Any]], stored: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Give each taint the timeAdded its stored twin (same device, key, value, effect) already has, so
    a restarted plugin does not move the time a GPU turned unhealthy (copyTaintTimeAdded in
    k8s.io/dynamic-resource-allocation/resourceslice/resourceslicecontroller.go)."""
    taints = {
        (d.get("name"), t.get("key"), t.get("value"), t.get("effect")): t.get("timeAdded")
        for s in stored
        for d in (s.get("spec") or {}).get("devices") or []
        for t in d.get("taints") or []
    }
    for device in devices:
        for taint in device.get("taints") or []:
            kept = taints.get((device.get("name"), taint.get("key"), taint.get("value"), taint.get("effect")))
            if kept:
                taint["timeAdded"] = kept
    return devices


def _generation(slice_: dict[str, Any]) -> int:
    return int(((slice_.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _specs(slices: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [
        (s["metadata"]["name"], s.get("spec"))
        for s in sorted(slices, key=lambda s: str(s["metadata"]["name"]))
    ]
