"""What each container of a pod asks for in vGPU resources, parsed and validated (SPEC §1, §2).

Quantities arrive in the apiserver's canonical form (`3000` as `3k`) and are read as Volcano reads
them (`contract.quantity`): whole numbers within int32, MiB and percent. Anything else is refused here
with a message naming container, key and value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from contract.config import ResourceNames
from contract.quantity import QuantityError, has_binary_suffix, mib_from_binary, parse_whole


class RequestError(ValueError):
    """A container's vGPU request is malformed; `str()` is the message a user sees."""

    def __init__(self, container: str, key: str, value: object, reason: str) -> None:
        self.container = container
        self.key = key
        self.value = value
        super().__init__(f"container {container!r}: {key}={value!r}: {reason}")


@dataclass(frozen=True)
class ContainerRequest:
    """The vGPU resources of one container, as written (None = not written)."""

    container: str
    init: bool
    number: int | None = None
    memory_mib: int | None = None
    memory_percent: int | None = None
    cores: int | None = None

    @property
    def asks_vgpu(self) -> bool:
        """Whether the container names any vGPU resource."""
        return any(v is not None for v in (self.number, self.memory_mib, self.memory_percent, self.cores))

    @property
    def vgpus(self) -> int:
        """vGPUs the container gets: the count, or 1 when only memory/percentage/cores are given."""
        if self.number is not None:
            return self.number
        return 1 if self.asks_vgpu else 0


@dataclass(frozen=True)
class PodRequest:
    """Every container's request, init containers first as the kubelet admits them."""

    containers: tuple[ContainerRequest, ...]

    @property
    def asks_vgpu(self) -> bool:
        """Whether any container names a vGPU resource."""
        return any(c.asks_vgpu for c in self.containers)

    @property
    def app(self) -> tuple[ContainerRequest, ...]:
        """The `spec.containers` requests, in order."""
        return tuple(c for c in self.containers if not c.init)

    @property
    def init(self) -> tuple[ContainerRequest, ...]:
        """The `spec.initContainers` requests, in order."""
        return tuple(c for c in self.containers if c.init)


def _quantity(container: str, key: str, raw: object, names: ResourceNames) -> int:
    if key == names.memory and has_binary_suffix(raw):
        mib = mib_from_binary(str(raw))
        hint = f"write {mib}, not {raw}" if mib is not None else "for 3 GiB write 3072"
        raise RequestError(container, key, raw, f"{key} is a number of MiB without a binary suffix: {hint}")
    try:
        return parse_whole(raw).value
    except QuantityError as exc:
        raise RequestError(container, key, raw, str(exc)) from None


def _amounts(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        return {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    merged: dict[str, Any] = {}
    if isinstance(requests, Mapping):
        merged.update(requests)
    if isinstance(limits, Mapping):
        merged.update(limits)  # Volcano reads the limit first
    return merged


def parse_container(container: Mapping[str, Any], names: ResourceNames, *, init: bool) -> ContainerRequest:
    """Parse and validate one container's vGPU request."""
    name = str(container.get("name", "?"))
    amounts = _amounts(container)
    values: dict[str, int | None] = {}
    for field_name, key in (
        ("number", names.count),
        ("memory_mib", names.memory),
        ("memory_percent", names.memory_percentage),
        ("cores", names.cores),
    ):
        values[field_name] = _quantity(name, key, amounts[key], names) if key in amounts else None
    number, memory, percent, cores = (
        values["number"],
        values["memory_mib"],
        values["memory_percent"],
        values["cores"],
    )
    if number is not None and number < 1:
        raise RequestError(name, names.count, amounts[names.count], "must be at least 1")
    if memory is not None and memory < 1:
        raise RequestError(name, names.memory, amounts[names.memory], "must be at least 1 MiB")
    if percent is not None and not 1 <= percent <= 100:
        raise RequestError(
            name, names.memory_percentage, amounts[names.memory_percentage], "must be 1 to 100"
        )
    if cores is not None and not 0 <= cores <= 100:
        raise RequestError(name, names.cores, amounts[names.cores], "must be 0 to 100 (percent of one GPU)")
    if memory is not None and percent is not None:
        raise RequestError(
            name,
            names.memory_percentage,
            amounts[names.memory_percentage],
            f"set either {names.memory} or {names.memory_percentage}, not both",
        )
    return ContainerRequest(name, init, number, memory, percent, cores)


def iter_containers(pod: Mapping[str, Any]) -> Iterator[tuple[Mapping[str, Any], bool]]:
    """(container, is_init) for every init container then every app container of a pod dict."""
    spec = pod.get("spec") or {}
    for key, init in (("initContainers", True), ("containers", False)):
        for container in spec.get(key) or []:
            if isinstance(container, Mapping):
                yield container, init


def parse_pod(pod: Mapping[str, Any], names: ResourceNames) -> PodRequest:
    """Parse every container of a pod; the first malformed value raises RequestError."""
    return PodRequest(tuple(parse_container(c, names, init=init) for c, init in iter_containers(pod)))
