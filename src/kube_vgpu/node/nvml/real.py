"""The NVIDIA driver's NVML, as the node plugin's `Nvml`: `pynvml` (nvidia-ml-py) itself, and each
process's cgroup read from the host's /proc."""

from __future__ import annotations

from typing import Any

import pynvml

from kube_vgpu.node.nvml.surface import Nvml
from kube_vgpu.node.usage.cgroups import read_proc_cgroup


class PynvmlNvml:
    """The NVIDIA driver's NVML through `pynvml`; a process's cgroup is read from the host's /proc
    (the DaemonSet runs with hostPID, so NVML's PIDs are the host's)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(pynvml, name)

    def process_cgroup(self, pid: int, /) -> str | None:
        """`/proc/<pid>/cgroup`'s text."""
        return read_proc_cgroup(pid)


def real_nvml() -> Nvml:
    """The real NVML (nvidia-ml-py); `nvmlInit()` is the caller's, and fails without a driver."""
    return PynvmlNvml()
