"""The machinery under the simulated `pynvml` surface: one lock, init reference count, opaque
handles, ctypes marshalling, and the timed-event pump. The NVML functions build on it.

Handles are the real pynvml ctypes pointer types (`c_nvmlDevice_t`, `c_nvmlGpuInstance_t`, ...)
whose address is a key into this simulator's registry, never memory, so code written for pynvml
(arrays of `c_nvmlGpuInstance_t`, `info.device`, `byref(count)`) runs unchanged. A handle from
another simulator, a destroyed instance or anything else raises NVMLError_InvalidArgument.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import pynvml

from kube_vgpu.standins.nvml.config import WHOLE_GPU, SimulationSpec
from kube_vgpu.standins.nvml.events import Clock, Event, EventSet, Schedule, SystemClock
from kube_vgpu.standins.nvml.profiles import MODELS
from kube_vgpu.standins.nvml.state import ComputeInstance, SimGpu, SimProcess, nvml_error

log = logging.getLogger(__name__)

# Fake addresses, shared by every simulator in the process so handles never collide.
_ADDRESSES = itertools.count(0x5A1A0000, 0x10)

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S", bound="SimCore")
_T = TypeVar("_T")


class MigDeviceRef:
    """What a MIG device handle points at: the compute instance that is the MIG device."""

    def __init__(self, ci: ComputeInstance) -> None:
        self.ci = ci


def nvml_call(method: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Run an NVML function under the lock, after the init check and the timed-event pump."""

    def wrapper(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._cond:
            self._require_init()
            self._pump()
            return method(self, *args, **kwargs)

    functools.update_wrapper(wrapper, method)
    return wrapper


def uint_target(ref: object) -> ctypes.c_uint:
    """The `c_uint` behind `byref(c)`, `pointer(c)` or `c` itself; InvalidArgument otherwise."""
    target = getattr(ref, "_obj", None) if type(ref).__name__ == "CArgObject" else ref
    if isinstance(target, ctypes.POINTER(ctypes.c_uint)):
        target = target.contents
    if not isinstance(target, ctypes.c_uint):
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target


def struct_target(ref: object, kind: type[_T]) -> _T:
    """The `kind` structure behind `byref(s)`, `pointer(s)` or `s`; InvalidArgument otherwise."""
    target = getattr(ref, "_obj", None) if type(ref).__name__ == "CArgObject" else ref
    if hasattr(target, "contents"):  # a ctypes pointer
        target = target.contents
    if not isinstance(target, kind):
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target


def array_capacity(ref: object) -> int | None:
    """How many elements a caller's output array holds (None for a bare pointer: unknown)."""
    return len(ref) if isinstance(ref, ctypes.Array) else None


class SimCore:
    """State and helpers shared by the simulated NVML functions."""

    def __init__(self, spec: SimulationSpec, *, clock: Clock | None = None) -> None:
        self.spec = spec
        self.clock: Clock = clock or SystemClock()
        self._cond = threading.Condition(threading.RLock())
        self._refcount = 0
        self._start: float | None = None
        self._registry: dict[int, object] = {}
        self._event_sets: list[EventSet] = []
        self._schedule = Schedule(spec.events)
        self.gpus = [SimGpu(g, MODELS.get(g.model)) for g in spec.gpus]
        for gpu in self.gpus:
            gpu.handle = self._register(gpu)

    # -- lifecycle -----------------------------------------------------------------------------

    def _require_init(self) -> None:
        if self._refcount == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        """Initialise (reference-counted); timed events count from the first call."""
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        """As nvmlInit; the flags are accepted and ignored."""
        with self._cond:
            self._refcount += 1
            if self._start is None:
                self._start = self.clock.monotonic()
                log.info("event=simnvml.init node=%s gpus=%d", self.spec.node_name, len(self.gpus))

    def nvmlShutdown(self) -> None:
        """Drop one reference; the last one ends the session and wakes event waiters."""
        with self._cond:
            self._require_init()
            self._refcount -= 1
            self._cond.notify_all()

    # -- handles -------------------------------------------------------------------------------

    def _register(self, obj: object) -> int:
        address = next(_ADDRESSES)
        self._registry[address] = obj
        return address

    def _forget(self, address: int) -> None:
        self._registry.pop(address, None)

    @staticmethod
    def _pointer(address: int, pointer_type: Any) -> Any:
        # A fresh pointer object per call, like pynvml, so callers never share one.
        return ctypes.cast(ctypes.c_void_p(address), pointer_type)

    def _lookup(self, handle: object, kind: type[_T]) -> _T:
        if not hasattr(handle, "contents"):  # not a ctypes pointer
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        address = ctypes.cast(cast(Any, handle), ctypes.c_void_p).value
        obj = self._registry.get(address or 0)
        if obj is None or not isinstance(obj, kind):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return obj

    def _device(self, handle: object) -> SimGpu | MigDeviceRef:
        """A device handle's GPU or MIG device; GpuIsLost when the (parent) GPU is lost."""
        obj = self._lookup(handle, object)
        if isinstance(obj, SimGpu):
            gpu = obj
        elif isinstance(obj, MigDeviceRef) and obj.ci.alive:
            gpu = obj.ci.gi.gpu
        else:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return obj

    def _gpu(self, handle: object, *, mig_error: int = pynvml.NVML_ERROR_INVALID_ARGUMENT) -> SimGpu:
        """A physical GPU handle's GPU; `mig_error` for a MIG device handle."""
        obj = self._device(handle)
        if isinstance(obj, MigDeviceRef):
            raise nvml_error(mig_error)
        return obj

    def _mig(self, handle: object) -> ComputeInstance:
        """A MIG device handle's compute instance; NotSupported for a physical GPU's handle."""
        obj = self._device(handle)
        if isinstance(obj, SimGpu):
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return obj.ci

    def _gpu_handle(self, gpu: SimGpu) -> Any:
        return self._pointer(gpu.handle, pynvml.c_nvmlDevice_t)

    def _mig_handle(self, ci: ComputeInstance) -> Any:
        if not ci.device_handle:
            ci.device_handle = self._register(MigDeviceRef(ci))
        return self._pointer(ci.device_handle, pynvml.c_nvmlDevice_t)

    def _by_index(self, index: object) -> SimGpu:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    # -- test hooks (not part of pynvml) ---------------------------------------------------------

    def _hook_gpu(self, gpu_index: int) -> SimGpu:
        if (
            isinstance(gpu_index, bool)
            or not isinstance(gpu_index, int)
            or not 0 <= gpu_index < len(self.gpus)
        ):
            raise ValueError(f"GPU index {gpu_index!r} is not in 0..{len(self.gpus) - 1}")
        return self.gpus[gpu_index]

    def inject_event(
        self,
        gpu_index: int,
        event_type: int,
        data: int,
        *,
        gpu_instance_id: int = WHOLE_GPU,
        compute_instance_id: int = WHOLE_GPU,
    ) -> None:
        """Make NVML report an event on a GPU now."""
        with self._cond:
            self._hook_gpu(gpu_index)
            self._emit(
                Event(gpu_index, event_type, data, gpu_instance_id, compute_instance_id),
                self.clock.monotonic(),
            )

    def inject_xid(
        self,
        gpu_index: int,
        xid: int,
        *,
        gpu_instance_id: int = WHOLE_GPU,
        compute_instance_id: int = WHOLE_GPU,
    ) -> None:
        """Make NVML report XID `xid` on a GPU now (whole GPU unless instance IDs are given)."""
        self.inject_event(
            gpu_index,
            pynvml.nvmlEventTypeXidCriticalError,
            xid,
            gpu_instance_id=gpu_instance_id,
            compute_instance_id=compute_instance_id,
        )

    def set_lost(self, gpu_index: int, lost: bool) -> None:
        """Lose a GPU (calls on it raise NVMLError_GpuIsLost) or bring it back."""
        with self._cond:
            self._hook_gpu(gpu_index).lost = lost
            log.info("event=simnvml.lost gpu=%d lost=%s", gpu_index, str(lost).lower())

    def set_processes(self, gpu_index: int, processes: Sequence[SimProcess]) -> None:
        """The processes a GPU reports (their memory counts as used)."""
        with self._cond:
            self._hook_gpu(gpu_index).processes = list(processes)

    def set_utilization(self, gpu_index: int, gpu: int, memory: int) -> None:
        """The utilisation percentages a GPU reports."""
        with self._cond:
            self._hook_gpu(gpu_index).utilization = (gpu, memory)

    def reset_gpu(self, gpu_index: int) -> None:
        """A GPU reset: a pending MIG mode applies; instances and processes are gone."""
        with self._cond:
            self._hook_gpu(gpu_index).reset()

    # -- events --------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Fire the file's events that have come due."""
        if self._start is None:
            return
        for item in self._schedule.pop_due(self.clock.monotonic() - self._start):
            spec = item.spec
            at = self._start + item.due
            if spec.xid is not None:
                self._emit(
                    Event(
                        spec.gpu,
                        pynvml.nvmlEventTypeXidCriticalError,
                        spec.xid,
                        spec.gpu_instance_id,
                        spec.compute_instance_id,
                    ),
                    at,
                )
            if spec.lost is not None:
                self.gpus[spec.gpu].lost = spec.lost
                log.info("event=simnvml.lost gpu=%d lost=%s", spec.gpu, str(spec.lost).lower())

    def _emit(self, event: Event, at: float) -> None:
        log.info(
            "event=simnvml.event gpu=%d type=0x%x data=%d gi=%d ci=%d",
            event.gpu_index,
            event.event_type,
            event.data,
            event.gpu_instance_id,
            event.compute_instance_id,
        )
        for event_set in self._event_sets:
            event_set.offer(event, at)
        self._cond.notify_all()
