"""The Volcano pod device list (`volcano.sh/vgpu-ids-new`, `volcano.sh/devices-to-allocate`).

pod-list = container-entry *( ";" container-entry ); container-entry = *( ID,NVIDIA,USEDMEM,USEDCORES ":" )
One entry per vGPU-requesting container, in `spec.containers` order (Volcano's
pkg/scheduler/api/devices/nvidia/vgpu/utils.go, `encodePodDevices`). One parser,
one encoder; the decoder is strict, since the node plugin must refuse what it cannot honour.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kube_vgpu.contract.names import DEVICE_RECORD_TYPE

_UINT64_MAX = 2**64 - 1


class DeviceListError(ValueError):
    """A device list that is not in Volcano's format; the message names the entry and record."""


@dataclass(frozen=True)
class DeviceRecord:
    """One GPU (or MIG slot) handed to one container."""

    id: str
    used_mem: int
    used_cores: int
    type: str = DEVICE_RECORD_TYPE

    def __post_init__(self) -> None:
        if not self.id or any(c in self.id for c in ",:;"):
            raise ValueError(f"device id {self.id!r} is empty or holds , : or ;")
        if not 0 <= self.used_mem <= _UINT64_MAX or not 0 <= self.used_cores <= _UINT64_MAX:
            raise ValueError(f"device {self.id}: memory and cores must be unsigned integers")

    @property
    def gpu_uuid(self) -> str:
        """The physical GPU's UUID: the id without a MIG `[group-position]` suffix."""
        return self.id.split("[", 1)[0]


ContainerDevices = tuple[DeviceRecord, ...]


def encode_pod_devices(entries: Sequence[Sequence[DeviceRecord]]) -> str:
    """Encode per-container entries; an empty entry stays an empty string between separators."""
    return ";".join(
        "".join(f"{r.id},{r.type},{r.used_mem},{r.used_cores}:" for r in entry) for entry in entries
    )


def _uint(text: str, what: str, where: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise DeviceListError(f"{where}: {what} {text!r} is not an unsigned integer")
    value = int(text)
    if value > _UINT64_MAX:
        raise DeviceListError(f"{where}: {what} {text} does not fit in 64 bits")
    return value


def decode_pod_devices(value: str) -> list[ContainerDevices]:
    """Decode a device list; an empty string means no containers."""
    if value == "":
        return []
    entries: list[ContainerDevices] = []
    for index, entry in enumerate(value.split(";")):
        records: list[DeviceRecord] = []
        pieces = entry.split(":")
        if pieces[-1] != "":
            raise DeviceListError(f"entry {index} ({entry!r}) does not end with ':'")
        for piece in pieces[:-1]:
            where = f"entry {index} record {piece!r}"
            fields = piece.split(",")
            if len(fields) != 4:
                raise DeviceListError(f"{where}: expected ID,TYPE,MEM,CORES")
            device_id, type_, mem, cores = fields
            try:
                records.append(
                    DeviceRecord(
                        id=device_id,
                        type=type_,
                        used_mem=_uint(mem, "memory", where),
                        used_cores=_uint(cores, "cores", where),
                    )
                )
            except ValueError as exc:
                raise DeviceListError(f"{where}: {exc}") from None
        entries.append(tuple(records))
    return entries
