"""What the node plugin tells the kubelet and the Node object, computed from the GPUs and their health.

Pure functions: the ListAndWatch device list, the Volcano register annotation, the node
labels and the extended-resource capacity, each with the patch that brings a Node up to date (None
when it already is, so nothing is written needlessly: every Node update makes Volcano rebuild its
ledger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.models import model_label_name, register_type
from kube_vgpu.contract.names import (
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NODE_HANDSHAKE,
    NODE_REGISTER,
    UUID_LABEL_PREFIX,
)
from kube_vgpu.contract.quantity import QuantityError, parse_whole
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.node.nvml.gpus import GpuInfo

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
CORES_PER_GPU = 100
# The names Volcano's node-readiness check reads (pkg/scheduler/api/devices/nvidia/vgpu/device_info.go): the
# defaults, always.
VOLCANO_NAMES = ResourceNames()


@dataclass(frozen=True)
class Device:
    """One virtual device in a ListAndWatch message."""

    id: str
    health: str


def device_list(gpus: Sequence[GpuInfo], unhealthy: Collection[str], split_count: int) -> list[Device]:
    """The full device list: `split_count` devices per GPU, Unhealthy for every device of a sick GPU."""
    return [
        Device(gpu.device_id(k), UNHEALTHY if gpu.uuid in unhealthy else HEALTHY)
        for gpu in gpus
        for k in range(split_count)
    ]


def register_records(
    gpus: Sequence[GpuInfo], unhealthy: Collection[str], split_count: int, mode: str
) -> list[GpuRecord]:
    """One record per GPU in minor-number order; a sick GPU registers count 0 (Volcano ignores health)."""
    return [
        GpuRecord(
            uuid=gpu.uuid,
            count=0 if gpu.uuid in unhealthy else split_count,
            memory_mib=gpu.memory_mib,
            type=register_type(gpu.name),
            healthy=gpu.uuid not in unhealthy,
            mode=mode,
        )
        for gpu in sorted(gpus, key=lambda g: (g.minor, g.index))
    ]


def register_value(gpus: Sequence[GpuInfo], unhealthy: Collection[str], split_count: int, mode: str) -> str:
    """The `volcano.sh/node-vgpu-register` value."""
    return encode_register(register_records(gpus, unhealthy, split_count, mode))


def desired_labels(gpus: Sequence[GpuInfo], mode: str) -> dict[str, str]:
    """The node labels: the mode, one per model, one per GPU (present GPUs, healthy or not)."""
    labels = {MODE_LABEL: mode}
    for gpu in gpus:
        labels[MODEL_LABEL_PREFIX + model_label_name(gpu.name)] = "true"
        labels[UUID_LABEL_PREFIX + gpu.uuid] = "true"
    return labels


def label_changes(current: Mapping[str, str], desired: Mapping[str, str]) -> dict[str, str | None]:
    """Labels to set, and our labels (model/UUID prefixes) to remove with a merge-patch null."""
    changes: dict[str, str | None] = {k: v for k, v in desired.items() if current.get(k) != v}
    for key in current:
        if key.startswith((MODEL_LABEL_PREFIX, UUID_LABEL_PREFIX)) and key not in desired:
            changes[key] = None
    return changes


def metadata_patch(
    node: Mapping[str, Any], register: str, labels: Mapping[str, str]
) -> dict[str, Any] | None:
    """The merge patch of the Node's metadata that publishes `register` and `labels`, or None."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    patch: dict[str, Any] = {}
    if annotations.get(NODE_REGISTER) != register:
        patch["annotations"] = {NODE_REGISTER: register}
    changes = label_changes(metadata.get("labels") or {}, labels)
    if changes:
        patch["labels"] = changes
    return {"metadata": patch} if patch else None


def capacity(
    gpus: Sequence[GpuInfo], unhealthy: Collection[str], names: ResourceNames, *, split_count: int = 10
) -> dict[str, str]:
    """The node-level extended resources: the healthy GPUs' MiB and 100 cores each.

    With resource names other than Volcano's, the same amounts are also advertised under Volcano's
    names (and `vgpu-number` as the slot count): its node-readiness check looks for those exact
    names in allocatable whatever its ConfigMap says
    (pkg/scheduler/api/devices/nvidia/vgpu/device_info.go), while pods, the kubelet and Volcano's
    fit count the configured ones.
    """
    healthy = [g for g in gpus if g.uuid not in unhealthy]
    memory, cores = str(sum(g.memory_mib for g in healthy)), str(CORES_PER_GPU * len(healthy))
    out = {names.memory: memory, names.cores: cores}
    readiness = (
        (VOLCANO_NAMES.count, str(split_count * len(healthy))),
        (VOLCANO_NAMES.memory, memory),
        (VOLCANO_NAMES.cores, cores),
    )
    for name, amount in readiness:
        if name not in names.all():
            out[name] = amount
    return out


def capacity_patch(node: Mapping[str, Any], wanted: Mapping[str, str]) -> dict[str, Any] | None:
    """The merge patch of `status` that advertises `wanted`, or None when the node already says so.

    Quantities are compared by value as the API server may normalise their text.
    """
    current = (node.get("status") or {}).get("capacity") or {}
    stale = {k: v for k, v in wanted.items() if _quantity(current.get(k)) != int(v)}
    return {"status": {"capacity": stale}} if stale else None


def _quantity(text: object) -> int | None:
    # The API server stores `160000` as `160k`: compare values, or every reconcile would rewrite it.
    # Anything unreadable (absent, zeroed to something odd) is simply rewritten.
    try:
        return parse_whole(text).value
    except QuantityError:
        return None


def handshake_due(node: Mapping[str, Any]) -> bool:
    """Whether the legacy handshake annotation must be written again (`volcano.sh/node-vgpu-handshake`).

    Volcano v1.12-v1.14.2 and v1.15.0 answer any other value with `Requesting_<time>` and drop the
    node once that is 60 s old, so the plugin rewrites it whenever it says Requesting (or Deleted, or
    is missing), on its periodic reconcile.
    """
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(NODE_HANDSHAKE)
    return value is None or "Requesting" in value or "Deleted" in value


def handshake_value(now: datetime) -> str:
    """A handshake value the old scheduler accepts (neither `Requesting` nor `Deleted`)."""
    return f"Reported {now.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S')} +0000 UTC"
