"""Which pod and which container a kubelet Allocate call is for.

The kubelet's request carries only a number of device IDs, so the pod is found from the scheduler's
annotations: bound to this node and allocating, not terminating, its first entry still to be consumed
holds exactly that many devices, and among those the one the kubelet admits first
(`node.deviceplugin.bind_order`: the order of the bind events, with the oldest-first rule of
volcano-vgpu-device-plugin's pkg/util/util.go for pods bound before we watched). Entries map to containers as
the scheduler wrote them: the k-th entry belongs to the k-th container whose limits name the count or memory
resource, so a non-GPU container before a GPU one changes nothing. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import ContainerDevices, DeviceListError, decode_pod_devices
from kube_vgpu.contract.names import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    DEVICES_TO_ALLOCATE,
    VGPU_NODE,
)
from kube_vgpu.contract.quantity import QuantityError, parse_whole
from kube_vgpu.node.deviceplugin.bind_order import fallback_key

# Pod phases after which no container runs (and none will again).
TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PodRef:
    """A pod's identity, for messages, patches and the cache directory."""

    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def pod_ref(pod: Mapping[str, Any]) -> PodRef:
    """The identity of a pod dict."""
    metadata = pod.get("metadata") or {}
    return PodRef(
        str(metadata.get("namespace", "")), str(metadata.get("name", "")), str(metadata.get("uid", ""))
    )


def annotations_of(pod: Mapping[str, Any]) -> Mapping[str, str]:
    """A pod's annotations (empty when it has none)."""
    return (pod.get("metadata") or {}).get("annotations") or {}


def _limits(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    return limits if isinstance(limits, Mapping) else {}


def count_limit(container: Mapping[str, Any], names: ResourceNames) -> int | None:
    """The container's `vgpu-number` limit as Volcano reads it; None when absent; -1 when unreadable."""
    raw = _limits(container).get(names.count)
    if raw is None:
        return None
    try:
        return parse_whole(raw).value
    except QuantityError:
        return -1


def vgpu_containers(pod: Mapping[str, Any], names: ResourceNames) -> list[Mapping[str, Any]]:
    """The containers that get an entry from Volcano: limits naming the count or memory (Volcano's
    pkg/scheduler/api/devices/util.go)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    return [
        c
        for c in containers
        if isinstance(c, Mapping) and (names.count in _limits(c) or names.memory in _limits(c))
    ]


@dataclass(frozen=True)
class Claim:
    """One entry of `devices-to-allocate`, matched to the container the kubelet is admitting."""

    pod: PodRef
    value: str  # devices-to-allocate as read: the JSON patch tests it is unchanged
    index: int
    container: Mapping[str, Any]
    records: ContainerDevices
    remaining: int  # entries the kubelet will still ask for once this one is consumed
    annotations: Mapping[str, str]  # the pod's, as read: its selectors are checked against the records

    @property
    def container_name(self) -> str:
        """The container's name."""
        return str(self.container.get("name", ""))

    @property
    def consumed_value(self) -> str:
        """`devices-to-allocate` with this entry emptied, every separator and other entry kept."""
        pieces = self.value.split(";")
        pieces[self.index] = ""
        return ";".join(pieces)

    @property
    def last(self) -> bool:
        """Whether consuming this entry finishes the pod (bind phase `success`)."""
        return self.remaining == 0


@dataclass(frozen=True)
class Broken:
    """A pod allocating on this node whose annotations no Allocate can ever honour."""

    pod: PodRef
    reason: str


@dataclass(frozen=True)
class Selection:
    """The outcome of matching one Allocate against the node's pods."""

    claim: Claim | None
    broken: tuple[Broken, ...]
    # Pods bound here and allocating (whether or not they matched): for the no-match message.
    allocating: int


def is_allocating_here(pod: Mapping[str, Any], node_name: str) -> bool:
    """Bound to this node by the scheduler, waiting for its devices, and not on its way out."""
    annotations = annotations_of(pod)
    metadata = pod.get("metadata") or {}
    return (
        (pod.get("spec") or {}).get("nodeName") == node_name
        and annotations.get(VGPU_NODE) == node_name
        and annotations.get(BIND_PHASE) == BIND_PHASE_ALLOCATING
        and not metadata.get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") not in TERMINAL_PHASES
    )


def _pending_entry(
    pod: Mapping[str, Any], names: ResourceNames
) -> tuple[int, Mapping[str, Any], ContainerDevices, int, str] | Broken | None:
    """The next entry the kubelet will ask for: (index, container, records, remaining after, value).

    None when nothing is left to consume; Broken when the annotations cannot be honoured.
    """
    ref = pod_ref(pod)
    value = annotations_of(pod).get(DEVICES_TO_ALLOCATE, "")
    try:
        entries = decode_pod_devices(value)
    except DeviceListError as exc:
        return Broken(ref, f"{DEVICES_TO_ALLOCATE} is malformed: {exc}")
    containers = vgpu_containers(pod, names)
    if len(entries) != len(containers):
        return Broken(
            ref,
            f"{DEVICES_TO_ALLOCATE} has {len(entries)} entries but the pod has {len(containers)} "
            f"containers requesting {names.count} or {names.memory}",
        )
    for init in (pod.get("spec") or {}).get("initContainers") or []:
        if isinstance(init, Mapping) and count_limit(init, names) is not None:
            return Broken(
                ref,
                f"init container {init.get('name')!r} requests {names.count}: Volcano allocates no "
                "GPU to init containers",
            )
    # Only containers with a count limit reach Allocate; a memory-only container's entry is never
    # asked for, so it neither blocks the next container nor keeps the pod from finishing.
    served = [i for i, c in enumerate(containers) if count_limit(c, names) is not None]
    pending = [i for i in served if entries[i]]
    if not pending:
        return None
    index = pending[0]
    container = containers[index]
    limit = count_limit(container, names)
    if limit != len(entries[index]):
        return Broken(
            ref,
            f"entry {index} holds {len(entries[index])} devices but container "
            f"{container.get('name')!r} requests {names.count}={_limits(container).get(names.count)}",
        )
    return index, container, entries[index], len(pending) - 1, value


def select(
    pods: Iterable[Mapping[str, Any]],
    node_name: str,
    device_count: int,
    names: ResourceNames,
    rank: Callable[[Mapping[str, Any]], Any] = fallback_key,
) -> Selection:
    """Find the pod and entry an Allocate of `device_count` devices is for: among the pods whose next
    entry holds that many devices, the one the kubelet admits first by `rank` (by default the
    oldest-first order, for pods whose bind nobody watched)."""
    broken: list[Broken] = []
    allocating = 0
    best: tuple[Any, Claim] | None = None
    for pod in pods:
        if not is_allocating_here(pod, node_name):
            continue
        allocating += 1
        pending = _pending_entry(pod, names)
        if pending is None:
            continue
        if isinstance(pending, Broken):
            broken.append(pending)
            continue
        index, container, records, remaining, value = pending
        if len(records) != device_count:
            continue
        key = rank(pod)
        if best is None or key < best[0]:
            best = (
                key,
                Claim(pod_ref(pod), value, index, container, records, remaining, annotations_of(pod)),
            )
    return Selection(best[1] if best else None, tuple(broken), allocating)


def container_entries(
    pod: Mapping[str, Any], value: str, names: ResourceNames
) -> Sequence[tuple[Mapping[str, Any], ContainerDevices]]:
    """(container, devices) for every entry of a device list (`vgpu-ids-new`), for the node ledger.

    Raises DeviceListError when the list is malformed or does not match the pod's containers.
    """
    entries = decode_pod_devices(value)
    containers = vgpu_containers(pod, names)
    if len(entries) != len(containers):
        raise DeviceListError(f"{len(entries)} entries for {len(containers)} vGPU containers")
    return list(zip(containers, entries, strict=True))
