"""The node's own ledger of live vGPU allocations, per GPU and per container.

Volcano rebuilds its ledger counting only the first record per (pod, GPU), so a pod whose containers
share a GPU is under-counted and a GPU can be over-committed. The node plugin adds up every record of
every live pod bound here (`vgpu-ids-new`, which the scheduler never changes) and reports what it
finds. Pure: pods in, figures out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceListError
from kube_vgpu.contract.names import BIND_PHASE, BIND_PHASE_FAILED, VGPU_IDS_NEW
from kube_vgpu.node.deviceplugin.selection import (
    TERMINAL_PHASES,
    PodRef,
    annotations_of,
    container_entries,
    pod_ref,
)
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.publish.advertise import CORES_PER_GPU

Resource = Literal["memory", "cores", "vgpus"]


@dataclass(frozen=True)
class ContainerUse:
    """One container's share of one GPU."""

    pod: PodRef
    container: str
    gpu_uuid: str
    memory_mib: int
    cores: int


@dataclass(frozen=True)
class GpuUse:
    """What the live allocations add up to on one GPU."""

    memory_mib: int = 0
    cores: int = 0
    vgpus: int = 0


@dataclass(frozen=True)
class Overcommit:
    """A GPU booked beyond what it has."""

    gpu_uuid: str
    resource: Resource
    used: int
    capacity: int


def holds_devices(pod: Mapping[str, Any], node_name: str) -> bool:
    """Whether a pod's `vgpu-ids-new` books GPUs of this node right now."""
    annotations = annotations_of(pod)
    return (
        (pod.get("spec") or {}).get("nodeName") == node_name
        and bool(annotations.get(VGPU_IDS_NEW))
        and annotations.get(BIND_PHASE) != BIND_PHASE_FAILED
        and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


def pod_uses(pod: Mapping[str, Any], names: ResourceNames) -> list[ContainerUse]:
    """Every record of a pod's `vgpu-ids-new`, with its container; raises DeviceListError if malformed."""
    ref = pod_ref(pod)
    return [
        ContainerUse(ref, str(container.get("name", "")), record.gpu_uuid, record.used_mem, record.used_cores)
        for container, records in container_entries(pod, annotations_of(pod).get(VGPU_IDS_NEW, ""), names)
        for record in records
    ]


class Ledger:
    """Live allocations by pod UID; replaced wholesale from a pod list, updated after each Allocate."""

    def __init__(
        self, gpus: Sequence[GpuInfo], split_count: int, names: ResourceNames, node_name: str
    ) -> None:
        self._gpus = {g.uuid: g for g in gpus}
        self._split = split_count
        self._names = names
        self._node = node_name
        self._by_pod: dict[str, list[ContainerUse]] = {}

    def rebuild(self, pods: Iterable[Mapping[str, Any]]) -> list[str]:
        """Replace the ledger with the pods listed on this node; returns one line per unreadable pod."""
        by_pod: dict[str, list[ContainerUse]] = {}
        problems: list[str] = []
        for pod in pods:
            if not holds_devices(pod, self._node):
                continue
            try:
                by_pod[pod_ref(pod).uid] = pod_uses(pod, self._names)
            except DeviceListError as exc:
                problems.append(f"pod {pod_ref(pod)}: {VGPU_IDS_NEW} not counted: {exc}")
        self._by_pod = by_pod
        return problems

    def observe(self, pod: Mapping[str, Any]) -> None:
        """Record (or forget) one pod as it is now, e.g. right after its Allocate."""
        uid = pod_ref(pod).uid
        try:
            uses = pod_uses(pod, self._names) if holds_devices(pod, self._node) else []
        except DeviceListError:
            uses = []
        if uses:
            self._by_pod[uid] = uses
        else:
            self._by_pod.pop(uid, None)

    def containers(self) -> list[ContainerUse]:
        """Every live container share, in pod then container order."""
        return [use for uses in self._by_pod.values() for use in uses]

    def usage(self) -> dict[str, GpuUse]:
        """Per GPU of this node: booked memory, cores and vGPU slots (unknown UUIDs are left out)."""
        totals = {uuid: [0, 0, 0] for uuid in self._gpus}
        for use in self.containers():
            if use.gpu_uuid in totals:
                total = totals[use.gpu_uuid]
                total[0] += use.memory_mib or self._gpus[use.gpu_uuid].memory_mib
                total[1] += use.cores
                total[2] += 1
        return {uuid: GpuUse(*t) for uuid, t in totals.items()}

    def overcommits(self) -> list[Overcommit]:
        """Every GPU booked beyond its memory, its 100% of cores or its vGPU slots."""
        found: list[Overcommit] = []
        for uuid, use in self.usage().items():
            gpu = self._gpus[uuid]
            for resource, used, capacity in (
                ("memory", use.memory_mib, gpu.memory_mib),
                ("cores", use.cores, CORES_PER_GPU),
                ("vgpus", use.vgpus, self._split),
            ):
                if used > capacity:
                    found.append(Overcommit(uuid, resource, used, capacity))  # type: ignore[arg-type]
        return found
