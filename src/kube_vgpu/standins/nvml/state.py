"""State of one simulated GPU: MIG mode, GPU and compute instances, processes; MIG rules enforced.

Errors are the real `pynvml.NVMLError` subclasses, chosen as NVML documents them:
NotSupported when MIG is not (or not yet) enabled, InvalidArgument for a profile or placement the
GPU does not offer, InsufficientResources when the request does not fit what is left, InUse when
an instance still holds compute instances or processes. Callers hold the simulator's lock.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pynvml

from kube_vgpu.standins.nvml.config import WHOLE_GPU, GpuSpec
from kube_vgpu.standins.nvml.profiles import (
    COMPUTE_SLICES,
    ComputeProfile,
    GpuModel,
    MigProfile,
    compute_profiles,
    gpu_instance_id,
)

_MIG_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "mig.simnvml.kube-vgpu.io")


def nvml_error(code: int) -> pynvml.NVMLError:
    """The real pynvml exception for an NVML return code (NVMLError maps it to its subclass)."""
    return pynvml.NVMLError(code)


@dataclass(eq=False)
class SimProcess:
    """A process the simulated GPU reports as running (test hook input)."""

    pid: int
    used_bytes: int | None = None
    gpu_instance_id: int = WHOLE_GPU
    compute_instance_id: int = WHOLE_GPU
    sm_util_percent: int | None = None  # None: no process-utilisation sample for it
    cgroup: str = ""  # the text /proc/<pid>/cgroup holds on the node


@dataclass(eq=False)
class ComputeInstance:
    """A compute instance; each one is a MIG device with its own UUID."""

    gi: GpuInstance
    id: int
    profile: ComputeProfile
    start: int
    uuid: str
    handle: int = 0  # registry address of its compute-instance handle (set by the facade)
    device_handle: int = 0  # registry address of its MIG device handle

    @property
    def alive(self) -> bool:
        """Not destroyed, directly or by its GPU instance going or a GPU reset."""
        return self.gi.alive and self.gi.compute_instances.get(self.id) is self

    @property
    def multiprocessor_count(self) -> int:
        """SMs of this compute instance: all of the GPU instance's, or its share per slice."""
        gi_profile = self.gi.profile
        if self.profile.slice_count == gi_profile.slice_count:
            return gi_profile.multiprocessor_count
        one_slice = self.gi.gpu.one_slice_sms()
        return one_slice * self.profile.slice_count


@dataclass(eq=False)
class GpuInstance:
    """A GPU instance at a placement, holding compute instances by ID."""

    gpu: SimGpu
    id: int
    profile: MigProfile
    start: int
    compute_instances: dict[int, ComputeInstance] = field(default_factory=dict)
    handle: int = 0

    @property
    def alive(self) -> bool:
        """Not destroyed, directly or by a GPU reset."""
        return self.gpu.gpu_instances.get(self.id) is self

    @property
    def memory_slices(self) -> range:
        """The memory slices this instance occupies."""
        return range(self.start, self.start + self.profile.placement_size)


class SimGpu:
    """One physical GPU of the simulation."""

    def __init__(self, spec: GpuSpec, model: GpuModel | None) -> None:
        self.index = spec.index
        self.uuid = spec.uuid
        self.name = spec.model
        self.memory_mib = spec.memory_mib
        self.model = model
        self.mig_capable = spec.mig_capable
        self.mig_current = (
            pynvml.NVML_DEVICE_MIG_ENABLE if spec.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        )
        self.mig_pending = self.mig_current if not spec.mig_pending else 1 - self.mig_current
        self.lost = False
        self.gpu_instances: dict[int, GpuInstance] = {}
        self.processes: list[SimProcess] = []
        self.utilization = (0, 0)
        self.handle = 0
        self._serial = 0

    # -- identity ------------------------------------------------------------------------------

    @property
    def pci_bus(self) -> int:
        """The PCI bus number: spread out like a real 8-GPU board, stable per index."""
        return (0x07 + 0x10 * self.index) % 0x100

    @property
    def pci_bus_id(self) -> str:
        """The bus ID as NVML formats it (domain 0, device 0)."""
        return str(pynvml.NVML_DEVICE_PCI_BUS_ID_FMT % (0, self.pci_bus, 0))

    @property
    def pci_device_id(self) -> int:
        """The PCI device ID of the model (0 for a model the simulator has no table for)."""
        return self.model.pci_device_id if self.model else 0

    def one_slice_sms(self) -> int:
        """SMs of one compute slice (the 1g profile's)."""
        model = self.require_mig_model()
        return model.mig_profiles[0].multiprocessor_count

    # -- MIG mode ------------------------------------------------------------------------------

    @property
    def mig_enabled(self) -> bool:
        """MIG mode is on and no change to it waits for a reset."""
        return bool(
            self.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE and self.mig_pending == self.mig_current
        )

    def require_mig_model(self) -> GpuModel:
        """The MIG profile table; NotSupported on a GPU that is not MIG-capable."""
        if not self.mig_capable or self.model is None:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.model

    def require_mig_enabled(self) -> GpuModel:
        """As `require_mig_model`, and NotSupported unless MIG mode is on with nothing pending.

        NVML documents NOT_SUPPORTED for instance calls on a device without MIG mode enabled; a
        GPU whose mode change waits for a reset is treated the same (an assumption: nothing
        should be carved out of a GPU about to change mode).
        """
        model = self.require_mig_model()
        if not self.mig_enabled:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return model

    def set_mig_mode(self, mode: int) -> int:
        """Request a MIG mode; return the activation status as nvmlDeviceSetMigMode does.

        It takes effect at once on an idle GPU; with processes running it stays pending
        (activation status IN_USE) until `reset()`, as NVML documents for a busy device.
        """
        self.require_mig_model()
        if mode not in (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_ENABLE):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if mode == pynvml.NVML_DEVICE_MIG_DISABLE and self.gpu_instances:
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        self.mig_pending = mode
        if mode != self.mig_current and self.processes:
            return int(pynvml.NVML_ERROR_IN_USE)
        self.mig_current = mode
        return int(pynvml.NVML_SUCCESS)

    def reset(self) -> None:
        """A GPU reset: the pending MIG mode applies and every instance and process is gone."""
        self.mig_current = self.mig_pending
        self.gpu_instances.clear()
        self.processes.clear()

    # -- GPU instances -------------------------------------------------------------------------

    def profile_by_id(self, profile_id: int) -> MigProfile:
        """The GPU instance profile with this ID; InvalidArgument when the GPU has none."""
        profile = self.require_mig_model().profile_by_id(profile_id)
        if profile is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    def _used_memory_slices(self) -> set[int]:
        return {s for gi in self.gpu_instances.values() for s in gi.memory_slices}

    def _used_compute_slices(self) -> int:
        return sum(gi.profile.slice_count for gi in self.gpu_instances.values())

    def free_starts(self, profile: MigProfile) -> list[int]:
        """Placement starts of `profile` whose memory slices are all free."""
        used = self._used_memory_slices()
        return [s for s in profile.starts if used.isdisjoint(range(s, s + profile.placement_size))]

    def _same_profile(self, profile: MigProfile) -> int:
        return sum(1 for gi in self.gpu_instances.values() if gi.profile.id == profile.id)

    def remaining_capacity(self, profile: MigProfile) -> int:
        """How many more instances of `profile` fit (its placements never overlap each other)."""
        by_compute = (COMPUTE_SLICES - self._used_compute_slices()) // profile.slice_count
        by_count = profile.instance_count - self._same_profile(profile)
        return max(0, min(len(self.free_starts(profile)), by_compute, by_count))

    def create_gpu_instance(self, profile: MigProfile, start: int | None) -> GpuInstance:
        """Create a GPU instance; without a placement, the highest free start is taken (NVML
        chooses; observed drivers fill from the top, e.g. the first 1g.5gb lands at 6:1)."""
        self.require_mig_enabled()
        free = self.free_starts(profile)
        if start is not None and (start not in profile.starts):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.remaining_capacity(profile) == 0 or (start is not None and start not in free):
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        chosen = max(free) if start is None else start
        gi = GpuInstance(
            gpu=self, id=gpu_instance_id(chosen, profile.placement_size), profile=profile, start=chosen
        )
        self.gpu_instances[gi.id] = gi
        return gi

    def destroy_gpu_instance(self, gi: GpuInstance) -> None:
        """Destroy a GPU instance; InUse while it holds compute instances or processes."""
        if gi.compute_instances or any(p.gpu_instance_id == gi.id for p in self.processes):
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        del self.gpu_instances[gi.id]

    # -- compute instances ---------------------------------------------------------------------

    def compute_profile(self, gi: GpuInstance, profile_id: int) -> ComputeProfile:
        """The compute profile `profile_id` of `gi`; InvalidArgument when the instance lacks it."""
        profile = compute_profiles(gi.profile).get(profile_id)
        if profile is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    def free_compute_starts(self, gi: GpuInstance, profile: ComputeProfile) -> list[int]:
        """Starts of `profile` inside `gi` whose compute slices are all free."""
        used = {
            s
            for ci in gi.compute_instances.values()
            for s in range(ci.start, ci.start + ci.profile.slice_count)
        }
        return [s for s in profile.starts if used.isdisjoint(range(s, s + profile.slice_count))]

    def create_compute_instance(self, gi: GpuInstance, profile: ComputeProfile) -> ComputeInstance:
        """Create a compute instance at the lowest free start, with the lowest free ID."""
        self.require_mig_enabled()
        free = self.free_compute_starts(gi, profile)
        if not free:
            raise nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        ci_id = next(i for i in range(len(gi.compute_instances) + 1) if i not in gi.compute_instances)
        self._serial += 1
        # A new UUID per creation, as the driver gives: a recreated slice is a different device.
        name = f"{self.uuid}/{gi.id}/{ci_id}/{self._serial}"
        ci = ComputeInstance(
            gi=gi,
            id=ci_id,
            profile=profile,
            start=min(free),
            uuid=f"MIG-{uuid.uuid5(_MIG_UUID_NAMESPACE, name)}",
        )
        gi.compute_instances[ci_id] = ci
        return ci

    def destroy_compute_instance(self, ci: ComputeInstance) -> None:
        """Destroy a compute instance; InUse while a process runs on it."""
        if any(p.gpu_instance_id == ci.gi.id and p.compute_instance_id == ci.id for p in self.processes):
            raise nvml_error(pynvml.NVML_ERROR_IN_USE)
        del ci.gi.compute_instances[ci.id]

    def mig_devices(self) -> list[ComputeInstance]:
        """Existing MIG devices in NVML index order.

        Assumption: NVML lists MIG devices by GPU instance ID, then compute instance ID (as
        nvidia-smi shows them). With IDs following memory placement this is also the order of
        Volcano's positions for its usual layouts, e.g. group2's 2g,2g,2g,1g at 0,2,4,6.
        """
        return [
            ci
            for gi in sorted(self.gpu_instances.values(), key=lambda g: g.id)
            for ci in sorted(gi.compute_instances.values(), key=lambda c: c.id)
        ]

    # -- memory --------------------------------------------------------------------------------

    def used_bytes(self, ci: ComputeInstance | None = None) -> int:
        """Memory the processes use on the whole GPU, or on one MIG device."""
        return sum(
            p.used_bytes or 0
            for p in self.processes
            if ci is None or (p.gpu_instance_id == ci.gi.id and p.compute_instance_id == ci.id)
        )
