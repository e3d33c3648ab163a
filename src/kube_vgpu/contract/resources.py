"""What each container of a pod asks for in vGPU resources, parsed and validated.

Quantities arrive in the apiserver's canonical form (`3000` as `3k`) and are read as Volcano reads
them (`contract.quantity`): whole numbers within int32, MiB and percent. Anything else is refused here
with a message naming container, key and value.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.quantity import (
    QuantityError,
    has_binary_suffix,
    mib_from_binary,
    mib_from_decimal,
    parse_whole,
)


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
        return (
            self.number is not None
            or self.memory_mib is not None
            or self.memory_percent is not None
            or self.cores is not None
        )

    @property
    def vgpus(self) -> int:
        """vGPUs the container gets: the count, or 1 when only memory/percentage/cores are given."""
        if self.number is not None:
            return self.number
        return 1 if self.asks_vgpu else 0


_ASKS_VGPU = attrgetter("asks_vgpu")


@dataclass(frozen=True)
class PodRequest:
    """Every container's request, init containers first as the kubelet admits them."""

    containers: tuple[ContainerRequest, ...]

    @property
    def asks_vgpu(self) -> bool:
        """Whether any container names a vGPU resource."""
        return any(map(_ASKS_VGPU, self.containers))  # in C: no generator for one or two containers

    @property
    def app(self) -> tuple[ContainerRequest, ...]:
        """The `spec.containers` requests, in order."""
        return tuple(c for c in self.containers if not c.init)

    @property
    def init(self) -> tuple[ContainerRequest, ...]:
        """The `spec.initContainers` requests, in order."""
        return tuple(c for c in self.containers if c.init)


def _quantity(container: str, key: str, raw: object, names: ResourceNames) -> int:
    try:
        quantity = parse_whole(raw)
    except QuantityError as exc:
        if key == names.memory and has_binary_suffix(raw):
            raise _binary_memory(container, key, raw) from None
        mib = mib_from_decimal(raw) if key == names.memory and isinstance(raw, str) else None
        if mib is not None:
            # `3G` is 3 billion MiB here; whoever wrote it meant 3 GB.
            raise RequestError(
                container, key, raw, f"{exc}; {key} is a number of MiB: write {mib}, not {raw}"
            ) from None
        raise RequestError(container, key, raw, str(exc)) from None
    # A parsed quantity says whether it was written with a binary suffix, so the common case (a
    # plain number) reads the text once, not again through the grammar.
    if quantity.binary and key == names.memory:
        raise _binary_memory(container, key, raw)
    return quantity.value


def _binary_memory(container: str, key: str, raw: object) -> RequestError:
    mib = mib_from_binary(str(raw))
    hint = f"write {mib}, not {raw}" if mib is not None else "for 3 GiB write 3072"
    return RequestError(container, key, raw, f"{key} is a number of MiB without a binary suffix: {hint}")


# Values come from JSON, so a mapping is a `dict`: `isinstance(x, dict)` is several times cheaper
# than the `Mapping` ABC check, and every review makes a few dozen of them.
def _amounts(container: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        return {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    merged: dict[str, Any] = {}
    if isinstance(requests, dict):
        merged.update(requests)
    if isinstance(limits, dict):
        merged.update(limits)  # Volcano reads the limit first
    return merged


def parse_container(container: Mapping[str, Any], names: ResourceNames, *, init: bool) -> ContainerRequest:
    """Parse and validate one container's vGPU request."""
    name = str(container.get("name", "?"))
    amounts = _amounts(container)
    count_key, memory_key, percent_key, cores_key = (
        names.count,
        names.memory,
        names.memory_percentage,
        names.cores,
    )
    if not (count_key in amounts or memory_key in amounts or percent_key in amounts or cores_key in amounts):
        return ContainerRequest(name, init)  # no vGPU resource: nothing to read
    number = _quantity(name, count_key, amounts[count_key], names) if count_key in amounts else None
    memory = _quantity(name, memory_key, amounts[memory_key], names) if memory_key in amounts else None
    percent = _quantity(name, percent_key, amounts[percent_key], names) if percent_key in amounts else None
    cores = _quantity(name, cores_key, amounts[cores_key], names) if cores_key in amounts else None
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
            if isinstance(container, dict):
                yield container, init


def parse_pod(pod: Mapping[str, Any], names: ResourceNames) -> PodRequest:
    """Parse every container of a pod; the first malformed value raises RequestError."""
    spec = pod.get("spec") or {}
    # `iter_containers` unrolled: this runs for every review, and a generator costs more than the work.
    parsed = [
        parse_container(c, names, init=True) for c in spec.get("initContainers") or () if isinstance(c, dict)
    ]
    parsed += [
        parse_container(c, names, init=False) for c in spec.get("containers") or () if isinstance(c, dict)
    ]
    return PodRequest(tuple(parsed))
