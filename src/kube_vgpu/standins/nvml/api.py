"""A simulated NVML with the surface of the `pynvml` module (nvidia-ml-py), for machines with no GPU.

The node plugin takes its NVML as a parameter (`node.nvml.surface.Nvml`): the driver's through
`pynvml`, or a `SimulatedNvml` from `load_simulation(file, node_name)`. Same function names and
signatures, the same ctypes structures and handle types in return, the real `pynvml.NVMLError`
subclasses raised; every other name (constants, structures, error classes) is the real module's. An
nvml* function the simulator does not implement raises NVMLError_FunctionNotFound, as pynvml does
when the driver's library lacks a symbol.

What the simulation holds and its conventions:
- GPUs from a YAML file (see `standins.nvml.config`); minor number and index are the position in
  the file, default UUIDs derive from the node name and index.
- MIG with the real profile tables (`standins.nvml.profiles`) and NVML's rules
  (`standins.nvml.state`); MIG devices are indexed by GPU instance ID, then compute instance ID.
- Processes: the file's `processes:` (`standins.nvml.processes`), or `set_processes`.
- Events: the file's XIDs fire `after` seconds past the first nvmlInit on the injected clock, and
  reach an event set only if the GPU registered for them before they happened; `inject_xid`
  fires one now. `set_lost(i, True)` makes every call on GPU i (and its MIG devices) raise
  NVMLError_GpuIsLost until `set_lost(i, False)`; event waits are not affected.
- Thread-safe: one lock; `nvmlEventSetWait_v2` releases it while it blocks.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pynvml

from kube_vgpu.contract.yamltext import utf8_problem
from kube_vgpu.standins.nvml.config import SimulationError, SimulationSpec, parse_simulation
from kube_vgpu.standins.nvml.core import nvml_call
from kube_vgpu.standins.nvml.events import Clock, Event, EventSet
from kube_vgpu.standins.nvml.mig import MigApi
from kube_vgpu.standins.nvml.processes import ProcessApi, processes_of_spec
from kube_vgpu.standins.nvml.profiles import compute_profiles
from kube_vgpu.standins.nvml.state import SimGpu, SimProcess, nvml_error

__all__ = ["SimProcess", "SimulatedNvml", "SimulationError", "load_simulation"]

log = logging.getLogger(__name__)

SUPPORTED_EVENT_TYPES: int = int(
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
)
_CUDA_DRIVER_VERSION = 12040
_MIB = 1 << 20
# pynvml helpers that are not NVML calls, served as they are.
_HELPERS = {"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlExceptionClass"}


def _unsimulated(name: str) -> Callable[..., NoReturn]:
    def call(*args: object, **kwargs: object) -> NoReturn:
        raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    call.__name__ = name
    return call


class SimulatedNvml(MigApi, ProcessApi):
    """The simulated `pynvml` module of one node (see the module docstring)."""

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not defined here: the real module's constants and types.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            value = getattr(pynvml, name)
        except AttributeError:
            raise AttributeError(f"pynvml has no attribute {name!r}") from None
        if name.startswith("nvml") and inspect.isfunction(value) and name not in _HELPERS:
            return _unsimulated(name)
        return value

    # -- system --------------------------------------------------------------------------------

    @nvml_call
    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver version of the file (default 550.54.15)."""
        return self.spec.driver_version

    @nvml_call
    def nvmlSystemGetNVMLVersion(self) -> str:
        """NVML's version, "12." + the driver version."""
        return f"12.{self.spec.driver_version}"

    @nvml_call
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """The CUDA version the driver supports, as 1000 * major + 10 * minor."""
        return _CUDA_DRIVER_VERSION

    # -- devices -------------------------------------------------------------------------------

    @nvml_call
    def nvmlDeviceGetCount(self) -> int:
        """The number of GPUs (lost ones included)."""
        return len(self.gpus)

    @nvml_call
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        """The GPU's handle; InvalidArgument out of range, GpuIsLost for a lost GPU."""
        gpu = self._by_index(index)
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._gpu_handle(gpu)

    @nvml_call
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        """A GPU's or MIG device's handle by UUID; NotFound when nothing has it."""
        wanted = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == wanted:
                return self._gpu_handle(self._gpu(self._gpu_handle(gpu)))
            for ci in gpu.mig_devices():
                if ci.uuid == wanted:
                    self._gpu(self._gpu_handle(gpu))
                    return self._mig_handle(ci)
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    @nvml_call
    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        """A GPU's handle by PCI bus ID; NotFound when no GPU sits there."""
        wanted = (pciBusId.decode() if isinstance(pciBusId, bytes) else pciBusId).upper()
        for gpu in self.gpus:
            if gpu.pci_bus_id.upper() == wanted:
                return self._gpu_handle(self._gpu(self._gpu_handle(gpu)))
        raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)

    @nvml_call
    def nvmlDeviceGetUUID(self, handle: object) -> str:
        """`GPU-...` for a GPU, `MIG-...` for a MIG device."""
        obj = self._device(handle)
        return obj.uuid if isinstance(obj, SimGpu) else obj.ci.uuid

    @nvml_call
    def nvmlDeviceGetName(self, handle: object) -> str:
        """The NVML name; a MIG device's is the parent's plus its profile."""
        obj = self._device(handle)
        if isinstance(obj, SimGpu):
            return obj.name
        ci, gi = obj.ci, obj.ci.gi
        shape = (
            gi.profile.name
            if ci.profile.slice_count == gi.profile.slice_count
            else (f"{ci.profile.slice_count}c.{gi.profile.name}")
        )
        return f"{gi.gpu.name} MIG {shape}"

    @nvml_call
    def nvmlDeviceGetMinorNumber(self, handle: object) -> int:
        """The GPU's position in the file; NotSupported for a MIG device."""
        return self._gpu(handle, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED).index

    @nvml_call
    def nvmlDeviceGetIndex(self, handle: object) -> int:
        """The GPU's index; NotSupported for a MIG device."""
        return self._gpu(handle, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED).index

    @nvml_call
    def nvmlDeviceGetPciInfo_v3(self, handle: object) -> Any:
        """`nvmlPciInfo_t` with `.busId`; a MIG device reports its parent's."""
        obj = self._device(handle)
        gpu = obj if isinstance(obj, SimGpu) else obj.ci.gi.gpu
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id
        info.busIdLegacy = pynvml.NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT % (0, gpu.pci_bus, 0)
        info.domain, info.bus, info.device = 0, gpu.pci_bus, 0
        info.pciDeviceId = gpu.pci_device_id
        info.pciSubSystemId = 0x10DE if gpu.pci_device_id else 0
        return info

    def nvmlDeviceGetPciInfo(self, handle: object) -> Any:
        """As nvmlDeviceGetPciInfo_v3."""
        return self.nvmlDeviceGetPciInfo_v3(handle)

    @nvml_call
    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> Any:
        """`.total/.free/.used` in bytes; a MIG device has its GPU instance's memory."""
        obj = self._device(handle)
        if isinstance(obj, SimGpu):
            total, used = obj.memory_mib * _MIB, obj.used_bytes()
        else:
            total, used = obj.ci.gi.profile.memory_size_mb * _MIB, obj.ci.gi.gpu.used_bytes(obj.ci)
        info = pynvml.c_nvmlMemory_v2_t() if version else pynvml.c_nvmlMemory_t()
        if version:
            info.version = version
        info.total, info.used, info.free = total, min(used, total), max(total - used, 0)
        return info

    @nvml_call
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
        """`.gpu/.memory` percent (set by `set_utilization`); NotSupported on MIG, as on real GPUs."""
        gpu = self._gpu(handle, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.mig_capable and gpu.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = gpu.utilization
        return rates

    @nvml_call
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object) -> list[Any]:
        """Friendly objects with `.pid/.usedGpuMemory/.gpuInstanceId/.computeInstanceId`."""
        obj = self._device(handle)
        gpu = obj if isinstance(obj, SimGpu) else obj.ci.gi.gpu
        ci = None if isinstance(obj, SimGpu) else obj.ci
        return [
            pynvml.nvmlFriendlyObject(
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.used_bytes,
                    "gpuInstanceId": p.gpu_instance_id,
                    "computeInstanceId": p.compute_instance_id,
                }
            )
            for p in gpu.processes
            if ci is None or (p.gpu_instance_id == ci.gi.id and p.compute_instance_id == ci.id)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Any]:
        """As nvmlDeviceGetComputeRunningProcesses_v3."""
        return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)

    # -- events --------------------------------------------------------------------------------

    @nvml_call
    def nvmlEventSetCreate(self) -> Any:
        """A new, empty event set."""
        event_set = EventSet()
        event_set.handle = self._register(event_set)
        self._event_sets.append(event_set)
        return self._pointer(event_set.handle, pynvml.c_nvmlEventSet_t)

    def _event_set(self, handle: object) -> EventSet:
        event_set = self._lookup(handle, EventSet)
        if event_set.freed:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    @nvml_call
    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        """ECC, P-state, clock and XID events, for a physical GPU."""
        self._gpu(handle, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
        return SUPPORTED_EVENT_TYPES

    @nvml_call
    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        """Register a GPU's events; NotSupported if the mask holds a type the GPU lacks."""
        gpu = self._gpu(handle, mig_error=pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set = self._event_set(eventSet)
        if eventTypes & ~SUPPORTED_EVENT_TYPES:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        event_set.register(gpu.index, eventTypes, self.clock.monotonic())

    @nvml_call
    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> Any:
        """The next event of the set, waiting up to `timeoutms`; NVMLError_Timeout when none came.

        Releases the lock while it waits. A waiter also wakes when the set is freed
        (InvalidArgument) or the last nvmlShutdown ends the session (Uninitialized).
        """
        event_set = self._event_set(eventSet)
        deadline = self.clock.monotonic() + (timeoutms & 0xFFFFFFFF) / 1000.0
        while True:
            self._require_init()
            if event_set.freed:
                raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            self._pump()
            if event_set.queue:
                return self._event_data(event_set.queue.popleft())
            now = self.clock.monotonic()
            if now >= deadline:
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            step = deadline - now
            next_due = self._schedule.next_due()
            if next_due is not None and self._start is not None:
                step = min(step, max(self._start + next_due - now, 0.0))
            self.clock.wait(self._cond, step)

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> Any:
        """As nvmlEventSetWait_v2."""
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    @nvml_call
    def nvmlEventSetFree(self, eventSet: object) -> None:
        """Free an event set; a thread waiting on it wakes with InvalidArgument."""
        event_set = self._event_set(eventSet)
        event_set.freed = True
        self._event_sets.remove(event_set)
        self._forget(event_set.handle)
        self._cond.notify_all()

    def _event_data(self, event: Event) -> Any:
        data = pynvml.c_nvmlEventData_t()
        data.device = self._gpu_handle(self.gpus[event.gpu_index])
        data.eventType = event.event_type
        data.eventData = event.data
        data.gpuInstanceId = event.gpu_instance_id
        data.computeInstanceId = event.compute_instance_id
        return data


def _create_initial_instances(nvml: SimulatedNvml) -> None:
    """Create the file's `migInstances`: each a GPU instance with its full-size compute instance."""
    for spec, gpu in zip(nvml.spec.gpus, nvml.gpus, strict=True):
        for name in spec.mig_instances:
            profile = gpu.require_mig_model().profile_by_name(name)
            assert profile is not None  # checked when the file was parsed
            try:
                gi = gpu.create_gpu_instance(profile, None)
            except pynvml.NVMLError:
                raise SimulationError(
                    f"gpus: GPU {gpu.index} ({gpu.name}): migInstances do not fit together ({name} does not)"
                ) from None
            full = next(c for c in compute_profiles(profile).values() if c.slice_count == profile.slice_count)
            gpu.create_compute_instance(gi, full)


def load_simulation(
    source: str | os.PathLike[str] | Mapping[str, Any], node_name: str, *, clock: Clock | None = None
) -> SimulatedNvml:
    """A simulated NVML for `node_name` from a file path, YAML text or a parsed mapping.

    A string with no newline and no ':' is a path. Raises SimulationError naming what is wrong.
    """
    if isinstance(source, os.PathLike) or (
        isinstance(source, str) and "\n" not in source and ":" not in source
    ):
        path = Path(source)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise SimulationError(f"cannot read simulation file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise SimulationError(f"{path}: {utf8_problem(exc)}") from None
        try:
            spec = parse_simulation(text, node_name)
        except SimulationError as exc:
            raise SimulationError(f"{path}: {exc}") from None
    else:
        spec = parse_simulation(source, node_name)
    return simulated_nvml(spec, clock=clock)


def simulated_nvml(spec: SimulationSpec, *, clock: Clock | None = None) -> SimulatedNvml:
    """A simulated NVML from an already validated spec, with its initial MIG instances."""
    nvml = SimulatedNvml(spec, clock=clock)
    _create_initial_instances(nvml)
    processes_of_spec(nvml)
    log.info(
        "event=simnvml.loaded node=%s gpus=%d mig_enabled=%d",
        spec.node_name,
        len(spec.gpus),
        sum(1 for g in nvml.gpus if g.mig_enabled),
    )
    return nvml
