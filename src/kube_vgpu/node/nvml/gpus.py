"""The node's physical GPUs as NVML reports them, read through the `Nvml` the plugin is given."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kube_vgpu.contract.models import model_registrable
from kube_vgpu.contract.register import uuid_registrable
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# The kubelet refuses device IDs longer than this (deviceplugin v1beta1).
DEVICE_ID_MAX = 63


class DiscoveryError(RuntimeError):
    """NVML could not describe the node's GPUs; the message names the GPU and the call."""


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU, as discovered once at start."""

    index: int
    uuid: str
    name: str
    minor: int
    memory_mib: int
    bus_id: str = ""

    def device_id(self, k: int) -> str:
        """The k-th virtual device's ID, `<GPU-UUID>-<k>`, as the reference plugin names them."""
        return f"{self.uuid}-{k}"


def nvml_text(value: object) -> str:
    """An NVML string as str: older pynvml releases return bytes, the current one returns str."""
    return value.decode() if isinstance(value, bytes) else str(value)


def discover(nvml: Nvml) -> list[GpuInfo]:
    """Every GPU NVML reports, ordered by minor number (the register annotation's stable order).

    `nvmlInit()` must have been called. A GPU whose identity cannot be read raises DiscoveryError:
    advertising a partial or guessed inventory would let the scheduler place pods on the wrong card.
    """
    count = int(nvml.nvmlDeviceGetCount())
    gpus: list[GpuInfo] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml_text(nvml.nvmlDeviceGetUUID(handle))
            name = nvml_text(nvml.nvmlDeviceGetName(handle))
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            memory_mib = int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB
        except nvml.NVMLError as exc:
            raise DiscoveryError(f"GPU index {index}: NVML failed: {exc}") from None
        try:
            bus_id = nvml_text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except (nvml.NVMLError, AttributeError):
            bus_id = ""  # informational only
        gpus.append(GpuInfo(index, uuid, name, minor, memory_mib, bus_id))
    gpus.sort(key=lambda g: (g.minor, g.index))
    return gpus


def check_inventory(gpus: list[GpuInfo], split_count: int) -> None:
    """Refuse an inventory Volcano or the kubelet would misread (Volcano splits the register annotation on `,`
    and `:` and matches UUIDs by containment: pkg/scheduler/api/devices/nvidia/vgpu/utils.go)."""
    seen: set[str] = set()
    for gpu in gpus:
        if not uuid_registrable(gpu.uuid):
            raise DiscoveryError(f"GPU index {gpu.index}: UUID {gpu.uuid!r} cannot be registered")
        if len(gpu.device_id(max(split_count - 1, 0))) > DEVICE_ID_MAX:
            raise DiscoveryError(
                f"GPU {gpu.uuid}: device IDs would exceed the kubelet's {DEVICE_ID_MAX} characters"
            )
        if not model_registrable(gpu.name):
            raise DiscoveryError(f"GPU {gpu.uuid}: model name {gpu.name!r} cannot be registered")
        if gpu.uuid in seen:
            raise DiscoveryError(f"GPU UUID {gpu.uuid} reported twice")
        seen.add(gpu.uuid)
    # Volcano matches ledger records to GPUs by substring: no UUID may contain another.
    for a in gpus:
        for b in gpus:
            if a is not b and a.uuid in b.uuid:
                raise DiscoveryError(f"GPU UUID {a.uuid} is a substring of {b.uuid}")
