"""Which MIG slots the live pods on this node hold, read from the scheduler's annotations.

A slot is *held* once the plugin handed it to a container: the pod's `vgpu-ids-new` names it and
the matching entry of `devices-to-allocate` has been consumed. It is *pending* while the entry
still waits for its Allocate (a memory-only container's entry never gets one, so it stays pending
and never holds an instance). Live pods are those the node ledger counts: bound here, not failed,
not terminal (a terminating pod still runs, so it still holds). Pure: pods in, holdings out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.devices import ContainerDevices, DeviceListError, decode_pod_devices
from kube_vgpu.contract.mig.geometry import MigGeometryError, is_mig_device_id, parse_mig_device_id
from kube_vgpu.contract.names import DEVICES_TO_ALLOCATE, VGPU_IDS_NEW
from kube_vgpu.node.deviceplugin.bookings import holds_devices
from kube_vgpu.node.deviceplugin.selection import PodRef, annotations_of, pod_ref
from kube_vgpu.node.mig.layout import SlotHolder


@dataclass(frozen=True)
class Holding:
    """One MIG slot a live pod's container holds (or is about to) on one GPU."""

    pod: PodRef
    entry: int  # index of the container entry in `vgpu-ids-new`
    gpu_uuid: str
    group: str
    position: int
    held: bool  # handed out already (entry consumed), not just scheduled

    def as_holder(self) -> SlotHolder:
        """The form the layout decision takes."""
        return SlotHolder(owner=f"pod {self.pod}", group=self.group, position=self.position)


@dataclass(frozen=True)
class Holdings:
    """Every MIG slot of the node's live pods, plus records that could not be read."""

    items: tuple[Holding, ...]
    problems: tuple[str, ...] = ()

    def on_gpu(self, gpu_uuid: str) -> list[Holding]:
        """The holdings on one GPU."""
        return [h for h in self.items if h.gpu_uuid == gpu_uuid]

    def held_by_others(self, gpu_uuid: str, pod: PodRef, entry: int) -> list[SlotHolder]:
        """Slots handed out on `gpu_uuid` to anyone but entry `entry` of `pod`."""
        return [
            h.as_holder()
            for h in self.items
            if h.gpu_uuid == gpu_uuid and h.held and not (h.pod.uid == pod.uid and h.entry == entry)
        ]

    def busy_gpus(self) -> set[str]:
        """GPUs whose layout a live pod holds or is about to be given: never torn down."""
        return {h.gpu_uuid for h in self.items}


def _entries(value: str | None) -> list[ContainerDevices] | None:
    if value is None:
        return None
    try:
        return decode_pod_devices(value)
    except DeviceListError:
        return None


def pod_holdings(pod: Mapping[str, Any]) -> tuple[list[Holding], list[str]]:
    """The MIG slots of one live pod, and why records were skipped (malformed IDs or lists)."""
    ref = pod_ref(pod)
    annotations = annotations_of(pod)
    try:
        assigned = decode_pod_devices(annotations.get(VGPU_IDS_NEW, ""))
    except DeviceListError as exc:
        return [], [f"pod {ref}: {VGPU_IDS_NEW} is malformed: {exc}"]
    pending = _entries(annotations.get(DEVICES_TO_ALLOCATE))
    holdings: list[Holding] = []
    problems: list[str] = []
    for index, records in enumerate(assigned):
        # Unreadable or absent devices-to-allocate: count the slot as held, the safe side (it
        # keeps the instance alive and blocks a layout change).
        held = pending is None or index >= len(pending) or not pending[index]
        for record in records:
            if not is_mig_device_id(record.id):
                continue
            try:
                slot = parse_mig_device_id(record.id)
            except MigGeometryError as exc:
                problems.append(f"pod {ref}: {exc}")
                continue
            holdings.append(Holding(ref, index, slot.gpu_uuid, slot.group, slot.position, held))
    return holdings, problems


def node_holdings(pods: Iterable[Mapping[str, Any]], node_name: str) -> Holdings:
    """The MIG slots of every live pod bound to `node_name`."""
    items: list[Holding] = []
    problems: list[str] = []
    for pod in pods:
        if not holds_devices(pod, node_name):
            continue
        found, skipped = pod_holdings(pod)
        items.extend(found)
        problems.extend(skipped)
    return Holdings(tuple(items), tuple(problems))
