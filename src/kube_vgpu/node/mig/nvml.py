"""MIG through NVML: read a GPU's mode, profiles and instances; create and destroy instances.

Every function takes the plugin's `Nvml` (`node.nvml.surface`) and a GPU UUID. NVML errors surface
as `MigNvmlError` with the GPU and the call in the message. Callers serialise mutations (one MIG
change at a time per node).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kube_vgpu.node.mig.layout import (
    LayoutActions,
    ObservedCompute,
    ObservedInstance,
    PlannedInstance,
    ProfileSpec,
)
from kube_vgpu.node.nvml.gpus import nvml_text
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger("kube_vgpu.node.mig")

_NVML_MIG_ENABLE = 1


class MigNvmlError(RuntimeError):
    """An NVML MIG call failed; the message names the GPU, the call and NVML's error."""


@dataclass(frozen=True)
class MigMode:
    """`nvmlDeviceGetMigMode`: None for a GPU that does not support MIG."""

    current: int | None
    pending: int | None

    @property
    def supported(self) -> bool:
        """The GPU can do MIG at all."""
        return self.current is not None

    @property
    def enabled(self) -> bool:
        """MIG is on and no mode change waits for a GPU reset."""
        return self.current == _NVML_MIG_ENABLE and self.pending == self.current


def gpu_handle(nvml: Nvml, gpu_uuid: str) -> Any:
    """The physical GPU's handle by UUID."""
    try:
        return nvml.nvmlDeviceGetHandleByUUID(gpu_uuid)
    except nvml.NVMLError as exc:
        raise MigNvmlError(f"GPU {gpu_uuid}: nvmlDeviceGetHandleByUUID failed: {exc}") from None


def mig_mode(nvml: Nvml, handle: Any) -> MigMode:
    """Current and pending MIG mode; NotSupported means the GPU has no MIG."""
    try:
        current, pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError_NotSupported:
        return MigMode(None, None)
    return MigMode(int(current), int(pending))


def _placements(nvml: Nvml, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, None, ctypes.byref(count))
    array = (nvml.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(p.start), int(p.size)) for p in array[: count.value]]


def read_profiles(nvml: Nvml, handle: Any) -> dict[str, ProfileSpec]:
    """The GPU instance profiles the GPU offers, by name without NVML's `MIG ` prefix."""
    profiles: dict[str, ProfileSpec] = {}
    for index in range(int(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT)):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue  # a profile this GPU does not have
        name = nvml_text(info.name).removeprefix("MIG ").strip()
        if name in profiles:
            continue  # the plain profile (lowest index) is the one a geometry name means
        places = _placements(nvml, handle, int(info.id))
        profiles[name] = ProfileSpec(
            name=name,
            profile_id=int(info.id),
            slice_count=int(info.sliceCount),
            memory_mib=int(info.memorySizeMB),
            instance_count=int(info.instanceCount),
            starts=tuple(start for start, _ in places),
            placement_size=places[0][1] if places else 0,
        )
    return profiles


def mig_device_handles(nvml: Nvml, handle: Any) -> Iterator[Any | None]:
    """The GPU's MIG device handles in index order, None at the holes NVML leaves in the index range
    (so every index up to the maximum is tried)."""
    for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError_NotFound:
            mig = None
        yield mig


def _mig_devices(nvml: Nvml, handle: Any) -> dict[int, list[ObservedCompute]]:
    """MIG devices by GPU instance ID."""
    found: dict[int, list[ObservedCompute]] = {}
    for mig in mig_device_handles(nvml, handle):
        if mig is None:
            continue
        attributes = nvml.nvmlDeviceGetAttributes(mig)
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        found.setdefault(gi_id, []).append(
            ObservedCompute(
                ci_id=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
                mig_uuid=nvml_text(nvml.nvmlDeviceGetUUID(mig)),
                memory_mib=int(attributes.memorySizeMB),
                full=int(attributes.computeInstanceSliceCount) == int(attributes.gpuInstanceSliceCount),
            )
        )
    return found


def read_instances(nvml: Nvml, handle: Any, profiles: Sequence[ProfileSpec]) -> list[ObservedInstance]:
    """Every GPU instance with its compute instances (MIG mode must be on), by GPU instance ID."""
    computes = _mig_devices(nvml, handle)
    instances: list[ObservedInstance] = []
    for profile in profiles:
        count = ctypes.c_uint(0)
        array = (nvml.c_nvmlGpuInstance_t * max(profile.instance_count, 1))()
        nvml.nvmlDeviceGetGpuInstances(handle, profile.profile_id, array, ctypes.byref(count))
        for gi in array[: count.value]:
            info = nvml.nvmlGpuInstanceGetInfo(gi)
            gi_id = int(info.id)
            instances.append(
                ObservedInstance(
                    gi_id=gi_id,
                    profile_id=int(info.profileId),
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    compute=tuple(sorted(computes.get(gi_id, []), key=lambda c: c.ci_id)),
                )
            )
    return sorted(instances, key=lambda o: o.gi_id)


@dataclass(frozen=True)
class GpuMigState:
    """One GPU's MIG facts: mode, profiles (empty without MIG) and instances (empty unless enabled)."""

    gpu_uuid: str
    mode: MigMode
    profiles: dict[str, ProfileSpec]
    instances: tuple[ObservedInstance, ...]


def read_state(nvml: Nvml, gpu_uuid: str) -> GpuMigState:
    """Read one GPU's MIG state; MigNvmlError when NVML fails."""
    handle = gpu_handle(nvml, gpu_uuid)
    try:
        mode = mig_mode(nvml, handle)
        if not mode.supported:
            return GpuMigState(gpu_uuid, mode, {}, ())
        profiles = read_profiles(nvml, handle)
        instances = read_instances(nvml, handle, list(profiles.values())) if mode.enabled else []
    except nvml.NVMLError as exc:
        raise MigNvmlError(f"GPU {gpu_uuid}: reading MIG state failed: {exc}") from None
    return GpuMigState(gpu_uuid, mode, profiles, tuple(instances))


# ---------------------------------------------------------------------------------------------
# Changes


def running_processes(nvml: Nvml, handle: Any, gi_ids: Sequence[int]) -> list[tuple[int, int]]:
    """(GPU instance ID, pid) of processes NVML sees on the given instances' MIG devices."""
    wanted = set(gi_ids)
    found: list[tuple[int, int]] = []
    for mig in mig_device_handles(nvml, handle):
        if mig is None:
            continue
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
        if gi_id in wanted:
            found.extend((gi_id, int(p.pid)) for p in nvml.nvmlDeviceGetComputeRunningProcesses(mig))
    return found


def _destroy(nvml: Nvml, handle: Any, instance: ObservedInstance) -> None:
    gi = nvml.nvmlDeviceGetGpuInstanceById(handle, instance.gi_id)
    for compute in instance.compute:
        nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute.ci_id))
    nvml.nvmlGpuInstanceDestroy(gi)


def _full_compute_profile(nvml: Nvml, gi: Any, slice_count: int) -> int:
    """The compute instance profile ID that spans the whole GPU instance (`nvidia-smi mig -cci`)."""
    shared = nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
    for index in range(int(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, index, shared)
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue
        if int(info.sliceCount) == slice_count:
            return int(info.id)
    raise MigNvmlError(f"no compute instance profile spans a {slice_count}-slice GPU instance")


def _create(nvml: Nvml, handle: Any, planned: PlannedInstance, slice_count: int) -> None:
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = planned.start, planned.size
    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, planned.profile_id, ctypes.byref(placement))
    try:
        nvml.nvmlGpuInstanceCreateComputeInstance(gi, _full_compute_profile(nvml, gi, slice_count))
    except (nvml.NVMLError, MigNvmlError):
        # A GPU instance without a compute instance is no MIG device: take it back.
        nvml.nvmlGpuInstanceDestroy(gi)
        raise


def apply_actions(
    nvml: Nvml,
    state: GpuMigState,
    actions: LayoutActions,
    *,
    node_name: str,
    reason: str,
) -> None:
    """Carry out `actions` on the GPU of `state` (read just before, under the caller's lock).

    Destroys only after checking no process runs on what goes; a failure stops at the call that
    failed (the next read shows what is left) and raises MigNvmlError naming it.
    """
    uuid = state.gpu_uuid
    handle = gpu_handle(nvml, uuid)
    by_id = {o.gi_id: o for o in state.instances}
    slices = {p.profile_id: p.slice_count for p in state.profiles.values()}
    step = "checking processes"
    try:
        busy = running_processes(nvml, handle, actions.destroy)
        if busy:
            gi_id, pid = busy[0]
            raise MigNvmlError(
                f"GPU {uuid}: process {pid} still runs on GPU instance {gi_id}, which no live pod holds; "
                "not destroying it"
            )
        for gi_id in actions.destroy:
            step = f"destroying GPU instance {gi_id}"
            _destroy(nvml, handle, by_id[gi_id])
            log.info(
                "event=mig_instance_destroyed node=%s gpu=%s gi=%d reason=%s", node_name, uuid, gi_id, reason
            )
        for planned in actions.create:
            step = f"creating {planned.type_name} at placement {planned.start}:{planned.size}"
            _create(nvml, handle, planned, slices[planned.profile_id])
            log.info(
                "event=mig_instance_created node=%s gpu=%s position=%d profile=%s placement=%d:%d reason=%s",
                node_name,
                uuid,
                planned.position,
                planned.type_name,
                planned.start,
                planned.size,
                reason,
            )
        for gi_id in actions.add_compute:
            step = f"creating the compute instance of GPU instance {gi_id}"
            gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            profile_id = by_id[gi_id].profile_id
            nvml.nvmlGpuInstanceCreateComputeInstance(gi, _full_compute_profile(nvml, gi, slices[profile_id]))
            log.info(
                "event=mig_compute_created node=%s gpu=%s gi=%d reason=%s", node_name, uuid, gi_id, reason
            )
    except nvml.NVMLError as exc:
        raise MigNvmlError(f"GPU {uuid}: {step} failed: {exc}") from None


def destroy_all(nvml: Nvml, state: GpuMigState, *, node_name: str, reason: str) -> None:
    """Destroy every instance of the GPU (after the same process check as `apply_actions`)."""
    apply_actions(
        nvml,
        state,
        LayoutActions(destroy=tuple(o.gi_id for o in state.instances)),
        node_name=node_name,
        reason=reason,
    )
