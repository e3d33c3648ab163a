"""What a `mig` pod's memory costs against quota: the MIG slot it will hold, not the MiB it asked.

Pure: the geometry (Volcano's device ConfigMap) and the register TYPEs of the GPUs the
pod may land on in, MiB per vGPU out. A MIG instance is a hardware slice: a pod asking 1 MiB holds a
whole 1g slot, which no other pod can use, so that is what it is charged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kube_vgpu.contract.mig.geometry import (
    DeviceConfig,
    MigSlot,
    choose_slot,
    find_group,
    geometry_for_type,
    slot_for_position,
)

SlotSize = Callable[[int], int]


def largest_slot(geometry: DeviceConfig, types: Iterable[str], request_mib: int) -> MigSlot | None:
    """The slot the scheduler would give `request_mib` on a free GPU, the largest over `types`, the
    first of `types` among equals (None: no TYPE has a geometry with a slot that fits)."""
    slots: list[MigSlot] = []
    for register_type in types:
        groups = geometry_for_type(geometry, register_type) or []
        chosen = choose_slot(groups, {}, request_mib)
        if chosen is not None:
            slots.append(slot_for_position(find_group(groups, chosen[0]), chosen[1]))
    return max(slots, key=lambda slot: slot.memory_mib, default=None)


def slot_mib(geometry: DeviceConfig, types: Iterable[str], request_mib: int) -> int:
    """MiB of the slot the scheduler would give `request_mib` on a free GPU, the largest over `types`.

    The largest, because any of those GPUs may be chosen, and quota must never admit more than
    fits. A TYPE without a known geometry, or a request no slot fits, is charged as asked: the
    scheduler then cannot place the pod in MIG mode at all.
    """
    slot = largest_slot(geometry, types, request_mib)
    return request_mib if slot is None else max(request_mib, slot.memory_mib)


class MigSlots:
    """`slot_mib` bound to one geometry and one set of candidate GPU TYPEs (a `SlotSize`)."""

    def __init__(self, geometry: DeviceConfig, types: Iterable[str]) -> None:
        self.geometry = geometry
        self.types = tuple(sorted(set(types)))

    def __call__(self, request_mib: int) -> int:
        """MiB charged per vGPU for `request_mib` asked."""
        return slot_mib(self.geometry, self.types, request_mib)

    def describe(self, request_mib: int) -> str | None:
        """The slot `request_mib` rounds up to, as a refusal names it (None: charged as asked)."""
        slot = largest_slot(self.geometry, self.types, request_mib)
        if slot is None or slot.memory_mib <= request_mib:
            return None
        return f"{slot.instance_type} slot of {slot.memory_mib} MiB"


def slot_sizer(geometry: DeviceConfig, types: Iterable[str]) -> MigSlots:
    """The `SlotSize` of a `mig` pod that may land on GPUs of `types`."""
    return MigSlots(geometry, types)
