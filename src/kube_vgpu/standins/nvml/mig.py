"""The MIG part of the simulated `pynvml` surface: mode, MIG devices, GPU and compute instances.

Signatures and return shapes are pynvml's (nvidia-ml-py 13.x): the placement and instance list
calls fill a caller's ctypes array and set a `byref(c_uint)` count, returning NVML_SUCCESS;
`nvmlDeviceIsMigDeviceHandle` returns the `c_uint` itself, as pynvml does (test it with bool(),
not `== 1`).
"""

from __future__ import annotations

import logging
from typing import Any

import pynvml

from kube_vgpu.standins.nvml.core import SimCore, array_capacity, nvml_call, struct_target, uint_target
from kube_vgpu.standins.nvml.profiles import COMPUTE_SLICES, MigProfile, compute_profiles
from kube_vgpu.standins.nvml.state import ComputeInstance, GpuInstance, SimGpu, nvml_error

log = logging.getLogger(__name__)


def _fill(ref: object, element_type: Any, count_ref: object, values: list[Any], setter: Any) -> int:
    """Write `values` into a caller's array (checking its element type and size) and the count."""
    count = uint_target(count_ref)
    if ref is None or getattr(ref, "_type_", None) is not element_type:
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    capacity = array_capacity(ref)
    if capacity is not None and capacity < len(values):
        count.value = len(values)
        raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for i, value in enumerate(values):
        setter(ref, i, value)
    count.value = len(values)
    return int(pynvml.NVML_SUCCESS)


class MigApi(SimCore):
    """nvmlDevice*Mig*, nvmlDevice*GpuInstance*, nvmlGpuInstance*, nvmlComputeInstance*."""

    # -- helpers -------------------------------------------------------------------------------

    def _gi(self, handle: object) -> GpuInstance:
        gi = self._lookup(handle, GpuInstance)
        if not gi.alive:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gi.gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gi

    def _ci(self, handle: object) -> ComputeInstance:
        ci = self._lookup(handle, ComputeInstance)
        if not ci.alive:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if ci.gi.gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ci

    def _gi_handle(self, gi: GpuInstance) -> Any:
        if not gi.handle:
            gi.handle = self._register(gi)
        return self._pointer(gi.handle, pynvml.c_nvmlGpuInstance_t)

    def _ci_handle(self, ci: ComputeInstance) -> Any:
        if not ci.handle:
            ci.handle = self._register(ci)
        return self._pointer(ci.handle, pynvml.c_nvmlComputeInstance_t)

    def _mig_gpu(self, device: object) -> SimGpu:
        return self._gpu(device, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED)

    # -- mode and MIG devices ------------------------------------------------------------------

    @nvml_call
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        """[current, pending]; NotSupported on a GPU that is not MIG-capable."""
        gpu = self._mig_gpu(device)
        gpu.require_mig_model()
        return [gpu.mig_current, gpu.mig_pending]

    @nvml_call
    def nvmlDeviceSetMigMode(self, device: object, mode: int) -> int:
        """Request a MIG mode; the activation status is SUCCESS, or IN_USE while processes run."""
        status = self._mig_gpu(device).set_mig_mode(mode)
        log.info("event=simnvml.set_mig_mode mode=%d status=%d", mode, status)
        return status

    @nvml_call
    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        """7 while MIG mode is on, 0 otherwise (NVML: zero if MIG is not supported or enabled)."""
        gpu = self._mig_gpu(device)
        on = gpu.mig_capable and gpu.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE
        return COMPUTE_SLICES if on else 0

    @nvml_call
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int) -> Any:
        """The index-th existing MIG device (by GPU instance ID, then compute instance ID);
        NotFound past the last one, InvalidArgument outside 0..6."""
        gpu = self._gpu(device)
        gpu.require_mig_model()
        if gpu.mig_current != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < COMPUTE_SLICES:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        devices = gpu.mig_devices()
        if index >= len(devices):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._mig_handle(devices[index])

    @nvml_call
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: object) -> Any:
        """The parent GPU's handle; InvalidArgument for a handle that is not a MIG device's."""
        obj = self._device(migDevice)
        if isinstance(obj, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu_handle(obj.ci.gi.gpu)

    @nvml_call
    def nvmlDeviceIsMigDeviceHandle(self, device: object) -> Any:
        """A `c_uint`, 1 for a MIG device handle (pynvml returns the ctypes object, not .value)."""
        return pynvml.c_uint(0 if isinstance(self._device(device), SimGpu) else 1)

    @nvml_call
    def nvmlDeviceGetGpuInstanceId(self, device: object) -> int:
        """The MIG device's GPU instance ID; NotSupported for a physical GPU."""
        return self._mig(device).gi.id

    @nvml_call
    def nvmlDeviceGetComputeInstanceId(self, device: object) -> int:
        """The MIG device's compute instance ID; NotSupported for a physical GPU."""
        return self._mig(device).id

    @nvml_call
    def nvmlDeviceGetAttributes_v2(self, device: object) -> Any:
        """MIG device attributes (NVML supports only MIG device handles here)."""
        ci = self._mig(device)
        gi = ci.gi.profile
        attrs = pynvml.c_nvmlDeviceAttributes()
        attrs.multiprocessorCount = ci.multiprocessor_count
        attrs.sharedCopyEngineCount = gi.copy_engine_count
        attrs.sharedDecoderCount = gi.decoder_count
        attrs.sharedEncoderCount = 0
        attrs.sharedJpegCount = gi.jpeg_count
        attrs.sharedOfaCount = gi.ofa_count
        attrs.gpuInstanceSliceCount = gi.slice_count
        attrs.computeInstanceSliceCount = ci.profile.slice_count
        attrs.memorySizeMB = gi.memory_size_mb
        return attrs

    def nvmlDeviceGetAttributes(self, device: object) -> Any:
        """As nvmlDeviceGetAttributes_v2."""
        return self.nvmlDeviceGetAttributes_v2(device)

    # -- GPU instance profiles -----------------------------------------------------------------

    @nvml_call
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: object, profile: int, version: int = 2) -> Any:
        """Info for an NVML_GPU_INSTANCE_PROFILE_* index: InvalidArgument outside the enum,
        NotSupported for a profile the GPU lacks or a GPU that is not MIG-capable."""
        gpu = self._mig_gpu(device)
        if isinstance(profile, bool) or not isinstance(profile, int):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if version not in (1, 2):
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        found = gpu.require_mig_model().profile_by_index(profile)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return _profile_info(found, version)

    @nvml_call
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: object, profileId: int, placementsRef: object, countRef: object
    ) -> int:
        """All placements of a profile, whether MIG is on or not (as NVML documents); with
        `placementsRef` None only the count is set."""
        gpu = self._mig_gpu(device)
        found = gpu.require_mig_model().profile_by_id(profileId)
        if found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if placementsRef is None:
            uint_target(countRef).value = len(found.starts)
            return int(pynvml.NVML_SUCCESS)

        def put(ref: Any, i: int, start: int) -> None:
            ref[i].start, ref[i].size = start, found.placement_size

        return _fill(placementsRef, pynvml.c_nvmlGpuInstancePlacement_t, countRef, list(found.starts), put)

    @nvml_call
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: object, profileId: int) -> int:
        """How many more instances of the profile fit now."""
        gpu = self._mig_gpu(device)
        gpu.require_mig_enabled()
        return gpu.remaining_capacity(gpu.profile_by_id(profileId))

    # -- GPU instances -------------------------------------------------------------------------

    def _create_gi(self, device: object, profile_id: int, start: int | None, size: int | None) -> Any:
        gpu = self._mig_gpu(device)
        gpu.require_mig_enabled()
        profile = gpu.profile_by_id(profile_id)
        if size is not None and size != profile.placement_size:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gi = gpu.create_gpu_instance(profile, start)
        log.info(
            "event=simnvml.gi_created gpu=%d gi=%d profile=%s placement=%d:%d",
            gpu.index,
            gi.id,
            profile.name,
            gi.start,
            profile.placement_size,
        )
        return self._gi_handle(gi)

    @nvml_call
    def nvmlDeviceCreateGpuInstance(self, device: object, profileId: int) -> Any:
        """Create a GPU instance where NVML chooses; NotSupported unless MIG is on with nothing
        pending, InvalidArgument for an unknown profile ID, InsufficientResources when full."""
        return self._create_gi(device, profileId, None, None)

    @nvml_call
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: object, profileId: int, placement: object
    ) -> Any:
        """Create a GPU instance at a placement (a struct, `byref` or pointer); InvalidArgument
        for a placement the profile does not offer, InsufficientResources when it overlaps."""
        where = struct_target(placement, pynvml.c_nvmlGpuInstancePlacement_t)
        return self._create_gi(device, profileId, int(where.start), int(where.size))

    @nvml_call
    def nvmlGpuInstanceDestroy(self, gpuInstance: object) -> int:
        """Destroy a GPU instance; InUse while compute instances (or processes) remain."""
        gi = self._gi(gpuInstance)
        gi.gpu.destroy_gpu_instance(gi)
        self._forget(gi.handle)
        log.info("event=simnvml.gi_destroyed gpu=%d gi=%d", gi.gpu.index, gi.id)
        return int(pynvml.NVML_SUCCESS)

    @nvml_call
    def nvmlDeviceGetGpuInstances(
        self, device: object, profileId: int, gpuInstancesRef: object, countRef: object
    ) -> int:
        """Fill a `c_nvmlGpuInstance_t` array with the profile's instances (by ID) and the count.
        A None array is InvalidArgument: NVML takes no NULL here (size it by the placements)."""
        gpu = self._mig_gpu(device)
        gpu.require_mig_enabled()
        gpu.profile_by_id(profileId)
        found = sorted(
            (g for g in gpu.gpu_instances.values() if g.profile.id == profileId), key=lambda g: g.id
        )

        def put(ref: Any, i: int, gi: GpuInstance) -> None:
            ref[i] = self._gi_handle(gi)

        return _fill(gpuInstancesRef, pynvml.c_nvmlGpuInstance_t, countRef, found, put)

    @nvml_call
    def nvmlDeviceGetGpuInstanceById(self, device: object, gpuInstanceId: int) -> Any:
        """The GPU instance with this ID; NotFound when there is none."""
        gpu = self._mig_gpu(device)
        gpu.require_mig_enabled()
        gi = gpu.gpu_instances.get(gpuInstanceId)
        if gi is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._gi_handle(gi)

    @nvml_call
    def nvmlGpuInstanceGetInfo(self, gpuInstance: object) -> Any:
        """`.device`, `.id`, `.profileId`, `.placement.start/.size`."""
        gi = self._gi(gpuInstance)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.device = self._gpu_handle(gi.gpu)
        info.id = gi.id
        info.profileId = gi.profile.id
        info.placement.start = gi.start
        info.placement.size = gi.profile.placement_size
        return info

    # -- compute instances ---------------------------------------------------------------------

    @nvml_call
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: object, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        """Info for an NVML_COMPUTE_INSTANCE_PROFILE_* index inside a GPU instance (pynvml names
        the GPU instance handle `device`)."""
        gi = self._gi(device)
        if isinstance(profile, bool) or not isinstance(profile, int):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not 0 <= profile < pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if version not in (1, 2):
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        found = compute_profiles(gi.profile).get(profile)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED or found is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = (
            pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
            if version == 2
            else pynvml.c_nvmlComputeInstanceProfileInfo_t()
        )
        if version == 2:
            info.version = pynvml.nvmlComputeInstanceProfileInfo_v2
            full = found.slice_count == gi.profile.slice_count
            info.name = f"MIG {gi.profile.name}" if full else f"MIG {found.slice_count}c.{gi.profile.name}"
        info.id = found.id
        info.sliceCount = found.slice_count
        info.instanceCount = found.instance_count
        info.multiprocessorCount = (
            gi.profile.multiprocessor_count
            if found.slice_count == gi.profile.slice_count
            else gi.gpu.one_slice_sms() * found.slice_count
        )
        info.sharedCopyEngineCount = gi.profile.copy_engine_count
        info.sharedDecoderCount = gi.profile.decoder_count
        info.sharedJpegCount = gi.profile.jpeg_count
        info.sharedOfaCount = gi.profile.ofa_count
        return info

    @nvml_call
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, gpuInstance: object, profileId: int) -> int:
        """How many more compute instances of the profile fit in the GPU instance."""
        gi = self._gi(gpuInstance)
        return len(gi.gpu.free_compute_starts(gi, gi.gpu.compute_profile(gi, profileId)))

    @nvml_call
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: object, profileId: int) -> Any:
        """Create a compute instance (a MIG device); InsufficientResources when it does not fit."""
        gi = self._gi(gpuInstance)
        ci = gi.gpu.create_compute_instance(gi, gi.gpu.compute_profile(gi, profileId))
        log.info("event=simnvml.ci_created gpu=%d gi=%d ci=%d uuid=%s", gi.gpu.index, gi.id, ci.id, ci.uuid)
        return self._ci_handle(ci)

    @nvml_call
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: object, profileId: int, computeInstancesRef: object, countRef: object
    ) -> int:
        """Fill a `c_nvmlComputeInstance_t` array with the profile's compute instances."""
        gi = self._gi(gpuInstance)
        gi.gpu.compute_profile(gi, profileId)
        found = sorted(
            (c for c in gi.compute_instances.values() if c.profile.id == profileId), key=lambda c: c.id
        )

        def put(ref: Any, i: int, ci: ComputeInstance) -> None:
            ref[i] = self._ci_handle(ci)

        return _fill(computeInstancesRef, pynvml.c_nvmlComputeInstance_t, countRef, found, put)

    @nvml_call
    def nvmlGpuInstanceGetComputeInstanceById(self, gpuInstance: object, computeInstanceId: int) -> Any:
        """The compute instance with this ID; NotFound when there is none."""
        ci = self._gi(gpuInstance).compute_instances.get(computeInstanceId)
        if ci is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return self._ci_handle(ci)

    @nvml_call
    def nvmlComputeInstanceGetInfo_v2(self, computeInstance: object) -> Any:
        """`.device` (the parent GPU), `.gpuInstance`, `.id`, `.profileId`, `.placement`."""
        ci = self._ci(computeInstance)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.device = self._gpu_handle(ci.gi.gpu)
        info.gpuInstance = self._gi_handle(ci.gi)
        info.id = ci.id
        info.profileId = ci.profile.id
        info.placement.start = ci.start
        info.placement.size = ci.profile.slice_count
        return info

    def nvmlComputeInstanceGetInfo(self, computeInstance: object) -> Any:
        """As nvmlComputeInstanceGetInfo_v2."""
        return self.nvmlComputeInstanceGetInfo_v2(computeInstance)

    @nvml_call
    def nvmlComputeInstanceDestroy(self, computeInstance: object) -> int:
        """Destroy a compute instance (its MIG device goes with it); InUse while a process runs."""
        ci = self._ci(computeInstance)
        ci.gi.gpu.destroy_compute_instance(ci)
        self._forget(ci.handle)
        self._forget(ci.device_handle)
        log.info("event=simnvml.ci_destroyed gpu=%d gi=%d ci=%d", ci.gi.gpu.index, ci.gi.id, ci.id)
        return int(pynvml.NVML_SUCCESS)


def _profile_info(profile: MigProfile, version: int) -> Any:
    info = (
        pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        if version == 2
        else pynvml.c_nvmlGpuInstanceProfileInfo_t()
    )
    if version == 2:
        info.version = pynvml.nvmlGpuInstanceProfileInfo_v2
        info.name = f"MIG {profile.name}"
    info.id = profile.id
    info.isP2pSupported = 0
    info.sliceCount = profile.slice_count
    info.instanceCount = profile.instance_count
    info.multiprocessorCount = profile.multiprocessor_count
    info.copyEngineCount = profile.copy_engine_count
    info.decoderCount = profile.decoder_count
    info.encoderCount = 0
    info.jpegCount = profile.jpeg_count
    info.ofaCount = profile.ofa_count
    info.memorySizeMB = profile.memory_size_mb
    return info
