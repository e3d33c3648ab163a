"""Whether the scheduler's choice for one container can be honoured on this node (SPEC §3).

The node plugin does not trust the annotations blindly: a device must be a GPU of this node, healthy,
big enough, allowed by the pod's own type, UUID and mode selectors, and booked with exactly what the
container's own limits ask (annotations can be edited by the pod's author; limits cannot). The first
problem found is returned as a sentence that, prefixed with the pod, tells a user why the pod failed.
Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import ContainerDevices
from kube_vgpu.contract.models import token_matches_model
from kube_vgpu.contract.names import (
    CHARGED_GPU_MEMORY,
    DEVICE_RECORD_TYPE,
    HAMI_CORE,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    NOUSE_GPUUUID_ALIAS,
    USE_GPUTYPE,
    USE_GPUUUID,
    USE_GPUUUID_ALIAS,
    VGPU_MODE,
    VGPU_MODE_ALIAS,
)
from kube_vgpu.contract.resources import ContainerRequest, RequestError, parse_container
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.publish.advertise import CORES_PER_GPU


def _items(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def type_item_matches(item: str, model: str) -> bool:
    """Whether one `use-gputype`/`nouse-gputype` item names the NVML model `model`.

    Items the webhook writes are `[<NVML name>]` (exact, case-insensitive); plain tokens follow the
    whole-segment rule of SPEC §1, so `A10` does not select an A100 even though Volcano's substring
    test would.
    """
    if "[" in item and "]" in item:
        inner = item[item.index("[") + 1 : item.rindex("]")]
        return inner.strip().lower() == model.strip().lower()
    return token_matches_model(item, model)


def selector_problem(annotations: Mapping[str, str], gpu: GpuInfo) -> str | None:
    """Why the pod's GPU type/UUID selectors forbid `gpu`, or None when they allow it."""
    use_types = _items(annotations.get(USE_GPUTYPE))
    if use_types and not any(type_item_matches(i, gpu.name) for i in use_types):
        return f"GPU {gpu.uuid} is a {gpu.name}, not allowed by {USE_GPUTYPE}={annotations[USE_GPUTYPE]!r}"
    banned = [i for i in _items(annotations.get(NOUSE_GPUTYPE)) if type_item_matches(i, gpu.name)]
    if banned:
        return f"GPU {gpu.uuid} is a {gpu.name}, excluded by {NOUSE_GPUTYPE}={annotations[NOUSE_GPUTYPE]!r}"
    for key in (NOUSE_GPUUUID, NOUSE_GPUUUID_ALIAS):
        if gpu.uuid in _items(annotations.get(key)):
            return f"GPU {gpu.uuid} is excluded by {key}"
    for key in (USE_GPUUUID, USE_GPUUUID_ALIAS):
        allowed = _items(annotations.get(key))
        if allowed and gpu.uuid not in allowed:
            return f"GPU {gpu.uuid} is not in {key}={annotations[key]!r}"
    return None


def booked_memory(ask: ContainerRequest, gpu: GpuInfo) -> int:
    """The MiB Volcano books on `gpu` for this container (protocol §3.2, §3.3): its vgpu-memory; else
    that percentage of the card, rounded down; else (neither given) the whole card."""
    if ask.memory_mib is not None:
        return ask.memory_mib
    if ask.memory_percent is not None:
        return gpu.memory_mib * ask.memory_percent // 100
    return gpu.memory_mib


def charged_gpu_mib(annotations: Mapping[str, Any]) -> int | str | None:
    """The MiB of the GPU the webhook charged the pod's share of a card on (`CHARGED_GPU_MEMORY`):
    None when it recorded none, the problem when the figure is unreadable."""
    value = annotations.get(CHARGED_GPU_MEMORY)
    if value is None:
        return None
    if not isinstance(value, str) or not value.isascii() or not value.isdigit():
        return f"annotation {CHARGED_GPU_MEMORY}={value!r} is not a whole number of MiB"
    return int(value)


def booking_problem(
    records: ContainerDevices,
    container: Mapping[str, Any],
    names: ResourceNames,
    gpus: Mapping[str, GpuInfo],
    charged_on: int | None = None,
) -> str | None:
    """Why the booking disagrees with the container's own limits, which nobody can change after the
    pod is created (SPEC §3): an edited or forged annotation cannot hand out more than was asked.
    With `charged_on` (the MiB of the GPU the webhook sized a share of a card on), a share booked on
    a larger GPU, which would hold more memory than the namespace's quota was charged, is refused."""
    name = str(container.get("name", ""))
    try:
        ask = parse_container(container, names, init=False)
    except RequestError as exc:
        return f"the container's own request is unreadable: {exc}"
    if ask.vgpus != len(records):
        return f"the booking holds {len(records)} device(s) but container {name!r} asks {ask.vgpus}"
    cores = ask.cores or 0
    for record in records:
        gpu = gpus[record.gpu_uuid]
        memory = booked_memory(ask, gpu)
        if record.used_mem not in (memory, 0 if memory == gpu.memory_mib else memory):
            return (
                f"device {record.id} is booked with {record.used_mem} MiB but container {name!r} "
                f"asks {memory} MiB"
            )
        if record.used_cores != cores:
            return (
                f"device {record.id} is booked with {record.used_cores}% cores but container {name!r} "
                f"asks {cores}%"
            )
        if charged_on is not None and ask.memory_mib is None:
            charged = booked_memory(ask, dataclasses.replace(gpu, memory_mib=charged_on))
            if memory > charged:
                return (
                    f"device {record.id} would give container {name!r} {memory} MiB of GPU {gpu.uuid} "
                    f"({gpu.memory_mib} MiB) but the pod was charged {charged} MiB for it at admission "
                    f"(a GPU of {charged_on} MiB, {CHARGED_GPU_MEMORY})"
                )
    return None


def claim_problem(
    records: ContainerDevices,
    annotations: Mapping[str, Any],
    gpus: Mapping[str, GpuInfo],
    unhealthy: Collection[str] | Mapping[str, str],
    node_mode: str,
    *,
    container: Mapping[str, Any] | None = None,
    names: ResourceNames | None = None,
) -> str | None:
    """The first reason the container's device records cannot be honoured, or None. With `container`
    and `names`, the booking is also checked against the container's own limits. `unhealthy` may map
    each GPU out of service to why (named in the refusal)."""
    for key in (VGPU_MODE, VGPU_MODE_ALIAS):
        wanted = annotations.get(key)
        if wanted is not None and wanted != node_mode:
            return f"the pod asks for {key}={wanted!r} but this node runs {node_mode}"
    seen: set[str] = set()
    for record in records:
        if record.type != DEVICE_RECORD_TYPE:
            return f"device {record.id} has type {record.type!r}, expected {DEVICE_RECORD_TYPE!r}"
        if node_mode == HAMI_CORE and record.id != record.gpu_uuid:
            return f"device {record.id} names a MIG slot but this node runs {HAMI_CORE}"
        gpu = gpus.get(record.gpu_uuid)
        if gpu is None:
            return f"GPU {record.gpu_uuid} is not a GPU of this node"
        if record.gpu_uuid in seen:
            return f"GPU {record.gpu_uuid} is given twice to one container"
        seen.add(record.gpu_uuid)
        if gpu.uuid in unhealthy:
            why = unhealthy.get(gpu.uuid) if isinstance(unhealthy, Mapping) else None
            return f"GPU {gpu.uuid} is unhealthy" + (f" ({why})" if why else "")
        if record.used_mem > gpu.memory_mib:
            return f"{record.used_mem} MiB asked on GPU {gpu.uuid}, which has {gpu.memory_mib} MiB"
        if record.used_cores > CORES_PER_GPU:
            return f"{record.used_cores}% cores asked on GPU {gpu.uuid}; at most {CORES_PER_GPU}"
        problem = selector_problem(annotations, gpu)
        if problem:
            return problem
    if container is not None and names is not None:
        charged_on = charged_gpu_mib(annotations)
        if isinstance(charged_on, str):
            return charged_on
        return booking_problem(records, container, names, gpus, charged_on)
    return None
