"""The driver's NVML as the node plugin's `Nvml`: pynvml's own names, and a process's cgroup from /proc."""

from __future__ import annotations

import os
from pathlib import Path

import pynvml

from kube_vgpu.node.nvml.real import real_nvml


def test_calls_constants_and_errors_are_pynvmls_own() -> None:
    nvml = real_nvml()
    assert nvml.NVMLError is pynvml.NVMLError
    assert nvml.NVMLError_NotFound is pynvml.NVMLError_NotFound
    assert nvml.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE
    assert nvml.nvmlDeviceGetCount is pynvml.nvmlDeviceGetCount


def test_process_cgroup_reads_proc() -> None:
    nvml = real_nvml()
    assert nvml.process_cgroup(os.getpid()) == Path(f"/proc/{os.getpid()}/cgroup").read_text()
    # A PID that cannot exist (above the kernel's pid_max bound): gone, not an error.
    assert nvml.process_cgroup(2**22 + 1) is None
