"""What a `mig` pod's memory costs against quota: the MIG slot it will hold, not the MiB it asked (SPEC §2.2).

Pure: the geometry (Volcano's device ConfigMap, protocol §6.1) and the register TYPEs of the GPUs the
pod may land on in, MiB per vGPU out. A MIG instance is a hardware slice: a pod asking 1 MiB holds a
whole 1g slot, which no other pod can use, so that is what it is charged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kube_vgpu.contract.mig.geometry import (
    DeviceConfig,
    choose_slot,
    find_group,
    geometry_for_type,
    slot_for_position,
)

SlotSize = Callable[[int], int]


def slot_mib(geometry: DeviceConfig, types: Iterable[str], request_mib: int) -> int:
    """MiB of the slot the scheduler would give `request_mib` on a free GPU, the largest over `types`.

    The largest, because any of those GPUs may be chosen, and quota must never admit more than
    fits. A TYPE without a known geometry, or a request no slot fits, is charged as asked: the
    scheduler then cannot place the pod in MIG mode at all.
    """
    charged = request_mib
    for register_type in types:
        groups = geometry_for_type(geometry, register_type)
        if not groups:
            continue
        chosen = choose_slot(groups, {}, request_mib)
        if chosen is None:
            continue
        group, position = chosen
        charged = max(charged, slot_for_position(find_group(groups, group), position).memory_mib)
    return charged


def slot_sizer(geometry: DeviceConfig, types: Iterable[str]) -> SlotSize:
    """`slot_mib` bound to one geometry and one set of candidate GPU TYPEs."""
    frozen = tuple(sorted(set(types)))
    return lambda request_mib: slot_mib(geometry, frozen, request_mib)
