"""The simulated NVML's process queries beyond the compute-process list: per-process utilisation,
and the cgroup text of each simulated process (what `/proc/<pid>/cgroup` would hold on the node).

NVML keeps a buffer of recent utilisation samples and `nvmlDeviceGetProcessUtilization(handle,
timeStamp)` returns those newer than `timeStamp`, NotFound when there are none. The simulation
holds one sample per process that has `smUtilPercent`, stamped with the moment of the query (so a
query with an older timestamp always sees it). Process utilisation is not reported in MIG mode, on
the GPU or a MIG device: NotSupported, as for `nvmlDeviceGetUtilizationRates`.
"""

from __future__ import annotations

from typing import Any

import pynvml

from kube_vgpu.standins.nvml.config import WHOLE_GPU
from kube_vgpu.standins.nvml.core import SimCore, nvml_call
from kube_vgpu.standins.nvml.state import SimGpu, SimProcess, nvml_error

_MICROSECONDS = 1_000_000


def processes_of_spec(core: SimCore) -> None:
    """Put the file's `processes:` on their GPUs; a `mig` process runs in compute instance 0 of it."""
    for spec in core.spec.processes:
        core.gpus[spec.gpu].processes.append(
            SimProcess(
                pid=spec.pid,
                used_bytes=spec.used_memory_mib * (1 << 20),
                gpu_instance_id=WHOLE_GPU if spec.mig is None else spec.mig,
                compute_instance_id=WHOLE_GPU if spec.mig is None else 0,
                sm_util_percent=spec.sm_util_percent,
                cgroup=spec.cgroup,
            )
        )


class ProcessApi(SimCore):
    """`nvmlDeviceGetProcessUtilization` and the cgroup hook."""

    @nvml_call
    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list[Any]:
        """`c_nvmlProcessUtilizationSample_t` per process with samples newer than `timeStamp` (µs)."""
        obj = self._device(handle)
        if not isinstance(obj, SimGpu) or obj.mig_current == pynvml.NVML_DEVICE_MIG_ENABLE:
            raise nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        now = int(self.clock.monotonic() * _MICROSECONDS)
        samples = []
        for process in obj.processes:
            if process.sm_util_percent is None or now <= int(timeStamp):
                continue
            sample = pynvml.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp = process.pid, now
            sample.smUtil, sample.memUtil, sample.encUtil, sample.decUtil = process.sm_util_percent, 0, 0, 0
            samples.append(sample)
        if not samples:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    def process_cgroup(self, pid: int) -> str | None:
        """The cgroup text of a simulated process (not part of pynvml); None for an unknown PID."""
        with self._cond:
            for gpu in self.gpus:
                for process in gpu.processes:
                    if process.pid == pid:
                        return process.cgroup
        return None

    def add_process(self, gpu_index: int, process: SimProcess) -> None:
        """Start one more process on a GPU (not part of pynvml; the demo's workloads use it)."""
        with self._cond:
            self._hook_gpu(gpu_index).processes.append(process)
