"""The hami-core Allocate response: the environment and mounts HAMi-core needs (as
volcano-vgpu-device-plugin's pkg/plugin/server.go, `getAllocateResponse`, builds it).

Pure: builds plain data; the gRPC edge turns it into a ContainerAllocateResponse and the allocator
creates the cache directory. MIG mode will build its own response in a module of its own.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kube_vgpu.contract.container_paths import (
    CACHE_IN_CONTAINER,
    DEFAULT_LOCK_HOST_DIR,
    LIBRARY_IN_CONTAINER,
    LOCK_IN_CONTAINER,
    PRELOAD_IN_CONTAINER,
)
from kube_vgpu.contract.devices import ContainerDevices
from kube_vgpu.node.nvml.gpus import GpuInfo

# The in-container paths are the contract's (the webhook protects the same ones); the host lock
# folder is the node plugin's to change.
DEFAULT_LOCK_DIR = DEFAULT_LOCK_HOST_DIR


@dataclass(frozen=True)
class Mount:
    """A host path bind-mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerResponse:
    """What one container gets: environment and mounts."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()


def cache_dir(hook_path: str, pod_uid: str, container: str) -> str:
    """The host directory of one container's shared cache, `<hookPath>/vgpu/containers/<uid>_<name>`.

    The vgpu-monitor sidecar reads this layout, so it stays as the reference plugin wrote it.
    """
    return posixpath.join(hook_path, "vgpu", "containers", f"{pod_uid}_{container}")


def build_response(
    records: ContainerDevices,
    gpus: Mapping[str, GpuInfo],
    container: Mapping[str, Any],
    *,
    pod_uid: str,
    hook_path: str,
    cache_file: str,
    lock_dir: str = DEFAULT_LOCK_DIR,
) -> ContainerResponse:
    """Environment and mounts for a container given `records` (already checked against `gpus`).

    `cache_file` names the shared-cache file inside the container's cache dir (a fresh random name
    per Allocate, as HAMi-core expects).
    """
    uuids = list(dict.fromkeys(r.gpu_uuid for r in records))
    envs = {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    for i, record in enumerate(records):
        # 0 MiB would mean "no limit" to HAMi-core; the whole card is what the scheduler booked.
        mib = record.used_mem or gpus[record.gpu_uuid].memory_mib
        envs[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{mib}m"
    envs["CUDA_DEVICE_SM_LIMIT"] = str(records[0].used_cores if records else 0)
    envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = posixpath.join(CACHE_IN_CONTAINER, cache_file)
    mounts = [
        Mount(LIBRARY_IN_CONTAINER, posixpath.join(hook_path, "libvgpu.so"), True),
        Mount(CACHE_IN_CONTAINER, cache_dir(hook_path, pod_uid, str(container.get("name", ""))), False),
        Mount(LOCK_IN_CONTAINER, lock_dir, False),
        # Always: the reference plugin skipped it when the pod set CUDA_DISABLE_CONTROL, which let any
        # pod author switch HAMi-core's limits off (a pod's env never changes the mounts).
        Mount(PRELOAD_IN_CONTAINER, posixpath.join(hook_path, "ld.so.preload"), True),
    ]
    return ContainerResponse(envs, tuple(mounts))
