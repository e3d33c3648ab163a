"""Which container each GPU process belongs to: cgroup (pod UID, container ID) to the pod's status.

Pure: NVML samples, the node's pods and a cgroup reader in; per-container figures out. A process
whose cgroup names no pod container, or a pod or container this node does not know (a host process,
another runtime, a container whose status has not been written yet), counts in its GPU's totals only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kube_vgpu.node.usage.cgroups import CgroupIds, CgroupReader, parse_cgroup
from kube_vgpu.node.usage.sample import UsageSample

_STATUS_LISTS = ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses")


@dataclass(frozen=True, order=True)
class ContainerKey:
    """One container's use of one GPU: the labels of the per-container metrics."""

    namespace: str
    pod: str
    container: str
    gpu: str


@dataclass(frozen=True)
class ContainerFigures:
    """What a container's processes on one GPU add up to."""

    memory_used_mib: int
    sm_util_percent: int | None  # None: NVML reports no process utilisation on this GPU (MIG)


def container_directory(pods: Iterable[Mapping[str, Any]]) -> dict[CgroupIds, tuple[str, str, str]]:
    """(pod UID, container ID) to (namespace, pod, container), from the pods' container statuses.

    A status's `containerID` is `<runtime>://<id>` (`containerd://`, `docker://`, `cri-o://`).
    """
    directory: dict[CgroupIds, tuple[str, str, str]] = {}
    for pod in pods:
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            continue
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str)):
            continue
        status = pod.get("status")
        if not isinstance(status, Mapping):
            continue
        for key in _STATUS_LISTS:
            entries = status.get(key)
            for entry in entries if isinstance(entries, list) else []:
                if not isinstance(entry, Mapping):
                    continue
                container_id, container = entry.get("containerID"), entry.get("name")
                if isinstance(container_id, str) and isinstance(container, str) and "://" in container_id:
                    ids = CgroupIds(uid.lower(), container_id.split("://", 1)[1].lower())
                    directory[ids] = (namespace, name, container)
    return directory


def attribute(
    sample: UsageSample, pods: Iterable[Mapping[str, Any]], read_cgroup: CgroupReader
) -> dict[ContainerKey, ContainerFigures]:
    """Per container and GPU: the memory and SM percent of the processes that are its own."""
    directory = container_directory(pods)
    owners: dict[int, tuple[str, str, str] | None] = {}
    memory: dict[ContainerKey, int] = {}
    utilisation: dict[ContainerKey, int | None] = {}
    for gpu in sample.gpus:
        for process in gpu.processes:
            if process.pid not in owners:
                text = read_cgroup(process.pid)
                ids = parse_cgroup(text) if text else None
                owners[process.pid] = directory.get(ids) if ids is not None else None
            owner = owners[process.pid]
            if owner is None:
                continue
            key = ContainerKey(*owner, gpu.uuid)
            memory[key] = memory.get(key, 0) + process.used_mib
            if process.sm_util_percent is None:
                utilisation.setdefault(key, None)
            else:
                utilisation[key] = (utilisation.get(key) or 0) + process.sm_util_percent
    return {key: ContainerFigures(memory[key], utilisation[key]) for key in sorted(memory)}
