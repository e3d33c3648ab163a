"""What a pod costs against its namespace's GPU quota, and what the quota labels allow.

Pure arithmetic: no I/O, no clock, nothing from aiohttp or the Kubernetes client, so every rule
here is tested as plain function calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceListError, decode_pod_devices
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, QUOTA_NUMBER_LABEL, VGPU_IDS_NEW
from kube_vgpu.contract.resources import ContainerRequest, PodRequest, iter_containers
from kube_vgpu.webhook.records import PodRecord

Resource = Literal["vgpu-number", "vgpu-memory", "vgpu-cores"]
RESOURCES: Final[tuple[Resource, ...]] = ("vgpu-number", "vgpu-memory", "vgpu-cores")
LABELS: Final[dict[Resource, str]] = {
    "vgpu-number": QUOTA_NUMBER_LABEL,
    "vgpu-memory": QUOTA_MEMORY_LABEL,
    "vgpu-cores": QUOTA_CORES_LABEL,
}
_PLAIN_INT = re.compile(r"^[0-9]+$")
# What a vGPU with no SM limit can use: the whole GPU (HAMi-core reads an unset or 0 limit as none).
WHOLE_GPU_CORES: Final = 100
GpuMemory = Callable[[str], "int | None"]
# MiB per vGPU asked -> MiB charged: the MIG slot a `mig` pod will hold (`webhook.quota.mig_charge`).
SlotSize = Callable[[int], int]


@dataclass(frozen=True)
class Charge:
    """An amount of each quota resource: vGPUs, MiB of GPU memory, percent-of-a-GPU of SMs."""

    number: int = 0
    memory_mib: int = 0
    cores: int = 0

    def __add__(self, other: Charge) -> Charge:
        return Charge(
            self.number + other.number, self.memory_mib + other.memory_mib, self.cores + other.cores
        )

    def __sub__(self, other: Charge) -> Charge:
        return Charge(
            self.number - other.number, self.memory_mib - other.memory_mib, self.cores - other.cores
        )

    def get(self, resource: Resource) -> int:
        """The amount of one resource."""
        if resource == "vgpu-number":
            return self.number
        if resource == "vgpu-memory":
            return self.memory_mib
        return self.cores

    def max(self, other: Charge) -> Charge:
        """Per resource, the larger of the two (how Kubernetes folds init containers in)."""
        return Charge(
            max(self.number, other.number),
            max(self.memory_mib, other.memory_mib),
            max(self.cores, other.cores),
        )

    @property
    def empty(self) -> bool:
        """Whether every amount is zero."""
        return self.number == 0 and self.memory_mib == 0 and self.cores == 0


ZERO: Final = Charge()


class GpuSizeUnknown(ValueError):
    """A container's memory is a share of a GPU (a percentage, or the whole card) and no GPU size is known."""


def needs_gpu_size(container: ContainerRequest) -> bool:
    """Whether the container's memory depends on the card: a percentage, or neither memory key.

    Volcano books a container that names neither `vgpu-memory` nor a percentage at 100 % of the
    card (Volcano's `pkg/scheduler/api/devices/nvidia/vgpu/utils.go`: MemPercentagereq defaults to 100 when
    Memreq is 0), so it is charged a
    whole card per vGPU, which is what it holds.
    """
    return container.asks_vgpu and container.memory_mib is None


def container_charge(
    container: ContainerRequest,
    *,
    gpu_mib: int | None,
    booked_mib: int | None = None,
    slot: SlotSize | None = None,
) -> Charge:
    """One container's charge: number x per-vGPU memory, number x cores.

    `booked_mib` is what the scheduler actually booked for this container over all its GPUs
    (from `volcano.sh/vgpu-ids-new`); when given it replaces the memory arithmetic. `slot` maps
    the per-vGPU MiB of a `mig` pod to the slot it will hold.
    """
    number = container.vgpus
    if number == 0:
        return ZERO
    # No SM limit is the whole GPU's SMs: charging 0 would let a cores quota admit without bound.
    cores = number * (container.cores or WHOLE_GPU_CORES)
    if booked_mib is not None:
        if slot is None:
            return Charge(number, booked_mib, cores)
        # A mig booking records the MiB asked (Volcano's `nvidia/vgpu/utils.go` `encodeContainerDevices`), but
        # the card gives the whole slot:
        # charge at least the slot, or a 1 MiB ask would cost 1 MiB once booked.
        try:
            held = container_charge(container, gpu_mib=gpu_mib, slot=slot).memory_mib
        except GpuSizeUnknown:
            held = 0
        return Charge(number, max(booked_mib, held), cores)
    if container.memory_mib is not None:
        per_vgpu = slot(container.memory_mib) if slot is not None else container.memory_mib
        return Charge(number, number * per_vgpu, cores)
    if gpu_mib is None:
        raise GpuSizeUnknown(
            f"container {container.container!r} asks for a share of a GPU's memory "
            "and no GPU it could use is known"
        )
    percent = container.memory_percent if container.memory_percent is not None else 100
    # Volcano's own rounding (Volcano's `nvidia/vgpu/utils.go` `checkNodeGPUSharingPredicateAndScore`):
    # floor(card MEM x pct / 100) per card.
    per_vgpu = gpu_mib * percent // 100
    return Charge(number, number * (slot(per_vgpu) if slot is not None else per_vgpu), cores)


def restartable_init_flags(pod: PodRecord) -> tuple[bool, ...]:
    """For each init container (in `parse_pod` order), whether it is a sidecar (`restartPolicy: Always`)."""
    return tuple(c.get("restartPolicy") == "Always" for c, init in iter_containers(pod) if init)


def pod_charge(
    request: PodRequest,
    *,
    gpu_mib: int | None,
    sidecars: Sequence[bool] = (),
    booked_mib: Mapping[str, int] | None = None,
    slot: SlotSize | None = None,
) -> Charge:
    """A pod's charge, folding init containers in per resource the way Kubernetes sizes a pod.

    App containers (and sidecar init containers, `restartPolicy: Always`) run together, so they
    add up; a plain init container runs alone, next to the sidecars started before it. Per
    resource the pod holds the larger of the two (Kubernetes' `PodRequests`). `sidecars` gives
    that flag per init container, in order; `booked_mib` maps app container names to the memory
    the scheduler booked for them. Raises GpuSizeUnknown when a share of a card must be sized and
    `gpu_mib` is None.
    """
    booked = booked_mib or {}
    total = ZERO
    for container in request.app:
        total += container_charge(
            container, gpu_mib=gpu_mib, booked_mib=booked.get(container.container), slot=slot
        )
    running_sidecars = ZERO
    init_peak = ZERO
    for index, container in enumerate(request.init):
        charge = container_charge(container, gpu_mib=gpu_mib, slot=slot)
        if index < len(sidecars) and sidecars[index]:
            total += charge
            running_sidecars += charge
            init_peak = init_peak.max(running_sidecars)
        else:
            init_peak = init_peak.max(charge + running_sidecars)
    return total.max(init_peak)


def pod_needs_gpu_size(request: PodRequest, booked_mib: Mapping[str, int] | None = None) -> bool:
    """Whether sizing the pod's memory needs a GPU size (some container's memory is a share of a card)."""
    booked = booked_mib or {}
    return any(needs_gpu_size(c) and (c.init or c.container not in booked) for c in request.containers)


def states_no_cores(container: ContainerRequest) -> bool:
    """Whether a vGPU container runs with no SM limit (no `vgpu-cores`, or 0), so is charged a whole GPU's."""
    return container.vgpus > 0 and not container.cores


def _booking_agrees(container: ContainerRequest, entry: Sequence[Any], gpu_memory: GpuMemory | None) -> bool:
    """Whether one container's booked devices match its own limits (which nobody can change).

    Only a booking that charges at least what the limits say is believed: the annotation can be
    edited by whoever may update the pod (when admission does not stop it), and a smaller figure
    would free quota the container still holds. A percentage is checked against the booked GPU's
    real size; a GPU the cluster does not know makes the booking unverifiable, so it is not used.
    """
    if len(entry) != container.vgpus:
        return False
    for record in entry:
        if container.memory_mib is not None:
            expected = container.memory_mib
        else:
            size = gpu_memory(record.gpu_uuid) if gpu_memory is not None else None
            if size is None:
                return False
            percent = container.memory_percent if container.memory_percent is not None else 100
            expected = size * percent // 100
        if record.used_mem < expected:
            return False
    return True


def booked_memory(pod: PodRecord, request: PodRequest, gpu_memory: GpuMemory | None = None) -> dict[str, int]:
    """Per app container, the MiB the scheduler booked for it, read from `volcano.sh/vgpu-ids-new`.

    The scheduler writes one entry per vGPU app container in `spec.containers` order (Volcano's
    `nvidia/vgpu/utils.go` `encodeContainerDevices`); an entry count that does not match, a list that does not
    decode, or an entry that
    disagrees with its container's limits (`_booking_agrees`) yields nothing for that pod, and the
    caller falls back to the spec. `gpu_memory(uuid)` gives a GPU's MiB, to check percentages.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(VGPU_IDS_NEW)
    if not isinstance(value, str) or not value:
        return {}
    try:
        entries = decode_pod_devices(value)
    except DeviceListError:
        return {}
    gpu_containers = [c for c in request.app if c.asks_vgpu]
    if len(entries) != len(gpu_containers):
        return {}
    if not all(_booking_agrees(c, e, gpu_memory) for c, e in zip(gpu_containers, entries, strict=True)):
        return {}
    return {
        c.container: sum(r.used_mem for r in entry) for c, entry in zip(gpu_containers, entries, strict=True)
    }


@dataclass(frozen=True)
class QuotaLimits:
    """A namespace's quota: None = unlimited for that resource; `invalid` names labels that do not parse."""

    number: int | None = None
    memory_mib: int | None = None
    cores: int | None = None
    invalid: tuple[tuple[str, str], ...] = ()

    def get(self, resource: Resource) -> int | None:
        """The limit of one resource (None = unlimited)."""
        if resource == "vgpu-number":
            return self.number
        if resource == "vgpu-memory":
            return self.memory_mib
        return self.cores

    @property
    def any(self) -> bool:
        """Whether any resource is limited."""
        return self.number is not None or self.memory_mib is not None or self.cores is not None


UNLIMITED: Final = QuotaLimits()


_LABEL_SET: Final = frozenset(LABELS.values())


def parse_limits(labels: Mapping[str, str]) -> QuotaLimits:
    """The quota a namespace's labels set. Values must be plain non-negative integers."""
    if not labels.keys() & _LABEL_SET:
        return UNLIMITED  # the namespace of nearly every review sets no quota (read up to 3 times a review)
    values: dict[Resource, int | None] = {}
    invalid: list[tuple[str, str]] = []
    for resource in RESOURCES:
        label = LABELS[resource]
        raw = labels.get(label)
        if raw is None:
            values[resource] = None
        elif isinstance(raw, str) and _PLAIN_INT.match(raw):
            values[resource] = int(raw)
        else:
            values[resource] = None
            invalid.append((label, str(raw)))
    return QuotaLimits(values["vgpu-number"], values["vgpu-memory"], values["vgpu-cores"], tuple(invalid))


_UNITS: Final[dict[Resource, tuple[str, str]]] = {
    "vgpu-number": (" vGPU", " vGPUs"),
    "vgpu-memory": (" MiB", " MiB"),
    "vgpu-cores": ("%", "%"),
}


def amount_text(resource: Resource, amount: int) -> str:
    """An amount with its unit, as denial messages write it: `2 vGPUs`, `24576 MiB`, `150%`."""
    singular, plural = _UNITS[resource]
    return f"{amount}{singular if amount == 1 else plural}"


def exceeded(request: Charge, usage: Charge, limits: QuotaLimits) -> list[Resource]:
    """The resources whose limit `usage + request` passes, in label order."""
    out: list[Resource] = []
    for resource in RESOURCES:
        limit = limits.get(resource)
        if (
            limit is not None
            and request.get(resource) > 0
            and usage.get(resource) + request.get(resource) > limit
        ):
            out.append(resource)
    return out


def exceeded_message(
    namespace: str,
    resources: Iterable[Resource],
    request: Charge,
    usage: Charge,
    limits: QuotaLimits,
    *,
    reasons: Mapping[Resource, Sequence[str]] | None = None,
) -> str:
    """`namespace team-a: vgpu-memory quota exceeded: requested 24576 MiB, in use 65536 MiB of 81920 MiB`,
    followed, per resource, by why the request is charged what it is (`charge_reasons`), if anything
    other than the figure the pod states."""
    parts = []
    for resource in resources:
        limit = limits.get(resource)
        assert limit is not None
        why = (reasons or {}).get(resource)
        parts.append(
            f"namespace {namespace}: {resource} quota exceeded: "
            f"requested {amount_text(resource, request.get(resource))}, "
            f"in use {amount_text(resource, usage.get(resource))} of {amount_text(resource, limit)}"
            + (f" ({'; '.join(why)})" if why else "")
        )
    return "; ".join(parts)


def charge_reasons(
    request: PodRequest,
    *,
    names: ResourceNames,
    gpu_mib: int | None,
    slot: SlotSize | None = None,
    describe_slot: Callable[[int], str | None] | None = None,
) -> dict[Resource, list[str]]:
    """Per resource, why the pod's containers are charged more than the figures they state: no SM
    limit counts as the whole GPU; a share of a card counts against the largest GPU the pod may land
    on (`gpu_mib`); a `mig` pod counts the slot its MiB rounds up to (`describe_slot` names it)."""
    cores: list[str] = []
    memory: list[str] = []
    for c in request.containers:
        if c.vgpus <= 0:
            continue
        if states_no_cores(c):
            cores.append(
                f"container {c.container!r} sets no {names.cores} limit: no SM limit counts as the "
                f"whole GPU, {WHOLE_GPU_CORES}% per vGPU"
            )
        if c.memory_mib is not None:
            per_vgpu, stated = c.memory_mib, f"asks {c.memory_mib} MiB per vGPU"
        elif gpu_mib:
            percent = c.memory_percent if c.memory_percent is not None else 100
            per_vgpu = gpu_mib * percent // 100
            share = (
                f"asks {percent}% of a GPU's memory"
                if c.memory_percent is not None
                else f"sets neither {names.memory} nor {names.memory_percentage}, so it holds a whole GPU"
            )
            stated = f"{share}: {per_vgpu} MiB per vGPU on the largest GPU it may land on ({gpu_mib} MiB)"
        else:
            continue
        held = describe_slot(per_vgpu) if describe_slot is not None else None
        if held is None and slot is not None and slot(per_vgpu) > per_vgpu:
            held = f"MIG slot of {slot(per_vgpu)} MiB"
        if held is not None:
            memory.append(f"container {c.container!r} {stated}, held as a {held}")
        elif c.memory_mib is None:
            memory.append(f"container {c.container!r} {stated}")
    out: dict[Resource, list[str]] = {}
    if cores:
        out["vgpu-cores"] = cores
    if memory:
        out["vgpu-memory"] = memory
    return out


def invalid_label_message(namespace: str, invalid: Sequence[tuple[str, str]]) -> str:
    """Names each label whose value is not a non-negative integer; vGPU pods are refused until it is fixed."""
    labels = ", ".join(f"{label}={value!r}" for label, value in invalid)
    return (
        f"namespace {namespace}: GPU quota label {labels} is not a non-negative integer; "
        "vGPU pods in this namespace are refused until the label is fixed or removed"
    )


def unsized_message(namespace: str) -> str:
    """The pod's memory is a share of a GPU, and no GPU it could land on is known to size it."""
    return (
        f"namespace {namespace}: vgpu-memory quota: the pod asks for a share of a GPU's memory "
        "(a percentage, or no vgpu-memory) and no GPU it could land on is known, so its charge "
        "cannot be computed; write vgpu-memory in MiB or wait for a matching GPU node"
    )
