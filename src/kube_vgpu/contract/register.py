"""The Volcano node registration annotation `volcano.sh/node-vgpu-register`: one parser, one encoder.

Value = one `UUID,COUNT,MEM,TYPE,HEALTH,MODE:` record per physical GPU, every record ending with
`:` (Volcano's pkg/scheduler/api/devices/nvidia/vgpu/utils.go,
`decodeNodeDevices`). The decoder accepts what Volcano (v1.12+) accepts and refuses what it refuses,
so the webhook sees a node exactly as the scheduler does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
_FIELDS = 6


def uuid_registrable(uuid: str) -> bool:
    """Whether a GPU UUID can stand in the register annotation and in device IDs (no , : ; [ ])."""
    return bool(uuid) and not any(c in uuid for c in ",:;[]")


class RegisterFormatError(ValueError):
    """The annotation is one Volcano would ignore; the message says why."""


@dataclass(frozen=True)
class GpuRecord:
    """One physical GPU as the scheduler sees it."""

    uuid: str
    count: int
    memory_mib: int
    type: str
    healthy: bool
    mode: str

    def __post_init__(self) -> None:
        if not uuid_registrable(self.uuid):
            raise ValueError(f"GPU UUID {self.uuid!r} is empty or holds one of , : ; [ ]")
        if any(c in self.type for c in ",:"):
            raise ValueError(f"GPU type {self.type!r} holds , or :")
        if any(c in self.mode for c in ",:"):
            raise ValueError(f"mode {self.mode!r} holds , or :")
        if self.count < 0 or self.memory_mib < 0:
            raise ValueError(f"GPU {self.uuid}: count and memory must not be negative")


def encode_register(records: Sequence[GpuRecord]) -> str:
    """Encode records in the given order (callers keep it stable: by NVML minor number)."""
    modes = {r.mode for r in records}
    if len(modes) > 1:
        raise ValueError(f"all GPUs of a node must register one mode, got {sorted(modes)}")
    return "".join(
        f"{r.uuid},{r.count},{r.memory_mib},{r.type},{'true' if r.healthy else 'false'},{r.mode}:"
        for r in records
    )


def _go_int(text: str) -> int:
    # Volcano parses with strconv and treats a failure as 0.
    try:
        return int(text, 10) if text.strip() == text else 0
    except ValueError:
        return 0


def decode_register(value: str) -> list[GpuRecord]:
    """Decode the annotation as Volcano does; raise RegisterFormatError where Volcano drops the node."""
    if ":" not in value:
        raise RegisterFormatError("no ':' in the value: Volcano treats the node as having no vGPU")
    records: list[GpuRecord] = []
    pieces = value.split(":")
    for position, piece in enumerate(pieces):
        if "," not in piece:
            if position == len(pieces) - 1:
                continue  # what follows the final ':'
            # A hole before the last record shifts Volcano's device IDs and can panic it.
            raise RegisterFormatError(
                f"record {position} ({piece!r}) has no ',': Volcano's GPU IDs would have a gap"
            )
        fields = piece.split(",")
        if len(fields) < _FIELDS:
            raise RegisterFormatError(
                f"record {position} ({piece!r}) has {len(fields)} fields; Volcano needs {_FIELDS}"
            )
        uuid, count, mem, type_, health, mode = fields[:_FIELDS]
        try:
            records.append(
                GpuRecord(
                    uuid=uuid,
                    count=max(_go_int(count), 0),
                    memory_mib=max(_go_int(mem), 0),
                    type=type_,
                    healthy=health in _GO_TRUE and health not in _GO_FALSE,
                    mode=mode,
                )
            )
        except ValueError as exc:
            raise RegisterFormatError(f"record {position}: {exc}") from None
    return records
