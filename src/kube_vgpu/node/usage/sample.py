"""What the GPUs are really doing, read from NVML: memory used, utilisation, and each compute process.

Read through a `pynvml`-shaped module (real or simulated), on a worker thread: these calls block.
A MIG GPU reports its processes per MIG device handle and has no utilisation figures (NVML answers
NotSupported in MIG mode), so its processes carry memory only. A GPU that fails a call is left out
of the sample and named in `errors`; the rest of the node is still reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kube_vgpu.node.nvml.gpus import MIB, GpuInfo
from kube_vgpu.node.nvml.surface import Nvml

# Every sample NVML still buffers is asked for; the newest one per process wins.
_ALL_BUFFERED_SAMPLES = 0


@dataclass(frozen=True)
class ProcessSample:
    """One compute process on one GPU."""

    pid: int
    gpu_uuid: str
    used_mib: int  # 0 when NVML cannot say (usedGpuMemory None)
    sm_util_percent: int | None  # None: NVML reports no process utilisation here (MIG)


@dataclass(frozen=True)
class GpuSample:
    """One GPU's figures at one moment."""

    uuid: str
    memory_used_mib: int
    utilization_percent: int | None  # None: not reported (MIG mode)
    processes: tuple[ProcessSample, ...]


@dataclass(frozen=True)
class UsageSample:
    """Every GPU read, and one line per GPU that could not be."""

    gpus: tuple[GpuSample, ...] = ()
    errors: tuple[str, ...] = field(default_factory=tuple)


def _mig_enabled(nvml: Nvml, handle: object) -> bool:
    try:
        current = nvml.nvmlDeviceGetMigMode(handle)[0]
    except nvml.NVMLError_NotSupported:
        return False
    return bool(current == nvml.NVML_DEVICE_MIG_ENABLE)


def _mig_device_handles(nvml: Nvml, handle: object) -> list[object]:
    handles = []
    for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            handles.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index))
        except nvml.NVMLError_NotFound:
            continue  # an empty slot
    return handles


def _sm_utilisation(nvml: Nvml, handle: object) -> dict[int, int] | None:
    """Latest SM percent per PID; {} when NVML has no samples, None when it does not report them."""
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(handle, _ALL_BUFFERED_SAMPLES)
    except nvml.NVMLError_NotFound:
        return {}
    except nvml.NVMLError_NotSupported:
        return None
    latest: dict[int, tuple[int, int]] = {}
    for sample in samples:
        pid, stamp = int(sample.pid), int(sample.timeStamp)
        if pid not in latest or stamp >= latest[pid][0]:
            latest[pid] = (stamp, int(sample.smUtil))
    return {pid: util for pid, (_, util) in latest.items()}


def _gpu_utilisation(nvml: Nvml, handle: object) -> int | None:
    try:
        return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError_NotSupported:
        return None


def read_gpu(nvml: Nvml, gpu: GpuInfo) -> GpuSample:
    """One GPU's sample; raises the NVMLError of the call that failed."""
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    memory_used = int(nvml.nvmlDeviceGetMemoryInfo(handle).used) // MIB
    if _mig_enabled(nvml, handle):
        sources, utilisation, per_pid = _mig_device_handles(nvml, handle), None, None
    else:
        sources = [handle]
        utilisation, per_pid = _gpu_utilisation(nvml, handle), _sm_utilisation(nvml, handle)
    used: dict[int, int] = {}
    for source in sources:
        for process in nvml.nvmlDeviceGetComputeRunningProcesses(source):
            pid = int(process.pid)
            used[pid] = used.get(pid, 0) + int(process.usedGpuMemory or 0) // MIB
    processes = tuple(
        ProcessSample(pid, gpu.uuid, mib, None if per_pid is None else per_pid.get(pid, 0))
        for pid, mib in sorted(used.items())
    )
    return GpuSample(gpu.uuid, memory_used, utilisation, processes)


def read_usage(nvml: Nvml, gpus: Sequence[GpuInfo]) -> UsageSample:
    """Every GPU's sample; a GPU whose NVML calls fail is reported in `errors` instead."""
    samples: list[GpuSample] = []
    errors: list[str] = []
    for gpu in gpus:
        try:
            samples.append(read_gpu(nvml, gpu))
        except nvml.NVMLError as exc:
            errors.append(f"gpu={gpu.uuid} error={str(exc)!r}")
    return UsageSample(tuple(samples), tuple(errors))
