"""Volcano's dynamic-MIG contract: the `volcano-vgpu-device-config` document, slot arithmetic, the
scheduler's slot choice, and the `<GPU-UUID>[<group>-<position>]` device ID (Volcano's
pkg/scheduler/api/devices/nvidia/vgpu/mig.go and pkg/scheduler/api/devices/config/).

Pure: text in, frozen values out, no I/O. One parser and one encoder for the ConfigMap's
`device-config.yaml`, one parser and one encoder for the device ID. Every error is a
`MigGeometryError` naming the key or value that was wrong. The document this project ships is in
`contract.mig.shipped`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import yaml

from kube_vgpu.contract.yamltext import safe_load, yaml_problem


class MigGeometryError(ValueError):
    """A geometry document, slot or device ID that Volcano's rules do not allow."""


# Volcano's decoder splits `[group-position]` on "-" and the register/device-list codecs split on
# the others, so a group name holding any of them cannot round-trip.
_GROUP_FORBIDDEN = "-[],:;"


@dataclass(frozen=True)
class MigInstanceType:
    """One entry of a group's `geometries`: `count` instances of profile `name` with `memory_mib`."""

    name: str
    memory_mib: int
    count: int


@dataclass(frozen=True)
class MigGroup:
    """One alternative layout of a GPU (`allowedGeometries[]`); its slots are numbered in order."""

    name: str
    instance_types: tuple[MigInstanceType, ...]


@dataclass(frozen=True)
class KnownMigGeometry:
    """One `knownMigGeometries[]` item: the layouts allowed on GPUs whose TYPE holds a model."""

    models: tuple[str, ...]
    groups: tuple[MigGroup, ...]


@dataclass(frozen=True)
class DeviceConfig:
    """The `nvidia:` section of `device-config.yaml`, as the scheduler and the plugin must share it.

    A resource name the document omits is empty, as in Volcano, where that disables the request
    kind (pkg/scheduler/api/devices/config/config.go). `gpu_memory_factor` defaults to 1, `device_split_count`
    to 10 and the two scalings to 1.0 when absent.
    """

    resource_count_name: str
    resource_memory_name: str
    resource_memory_percentage_name: str
    resource_core_name: str
    gpu_memory_factor: int
    device_split_count: int
    device_core_scaling: float
    device_memory_scaling: float
    known_mig_geometries: tuple[KnownMigGeometry, ...]


class MigSlot(NamedTuple):
    """What a position of a group stands for: the instance type, its memory and its index in type."""

    instance_type: str
    memory_mib: int
    index_within_type: int


class MigDeviceId(NamedTuple):
    """A decoded `<GPU-UUID>[<group>-<position>]` device ID."""

    gpu_uuid: str
    group: str
    position: int


# ---------------------------------------------------------------------------------------------
# Parsing the ConfigMap document


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise MigGeometryError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise MigGeometryError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
    return value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise MigGeometryError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _int(value: object, where: str, minimum: int) -> int:
    # bool is an int in Python but a YAML `true` is never a count or a size.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise MigGeometryError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise MigGeometryError(f"{where}: expected a number >= 0, got {value!r}")
    return float(value)


def check_group_name(name: str, where: str = "group") -> str:
    """Return `name` if it can travel inside a device ID; raise naming it otherwise."""
    if not name or any(c in _GROUP_FORBIDDEN for c in name):
        raise MigGeometryError(
            f"{where}: group name {name!r} is empty or holds one of {' '.join(_GROUP_FORBIDDEN)}; "
            "Volcano splits the device ID's [group-position] on '-'"
        )
    return name


def _parse_group(raw: object, where: str) -> MigGroup:
    item = _mapping(raw, where)
    name = check_group_name(_text(item.get("group"), f"{where}.group"), f"{where}.group")
    types: list[MigInstanceType] = []
    for j, raw_type in enumerate(_list(item.get("geometries"), f"{where}.geometries")):
        at = f"{where}.geometries[{j}]"
        entry = _mapping(raw_type, at)
        instance = MigInstanceType(
            name=_text(entry.get("name"), f"{at}.name"),
            memory_mib=_int(entry.get("memory"), f"{at}.memory", 1),
            count=_int(entry.get("count"), f"{at}.count", 1),
        )
        # Volcano books usage by instance name, so a name listed twice would share one ledger.
        if any(t.name == instance.name for t in types):
            raise MigGeometryError(f"{at}.name: {instance.name!r} appears twice in group {name!r}")
        types.append(instance)
    if not types:
        raise MigGeometryError(f"{where}.geometries: group {name!r} lists no instance type")
    return MigGroup(name=name, instance_types=tuple(types))


def _parse_known(raw: object, where: str) -> KnownMigGeometry:
    item = _mapping(raw, where)
    models = tuple(
        _text(m, f"{where}.models[{k}]") for k, m in enumerate(_list(item.get("models"), f"{where}.models"))
    )
    if not models:
        raise MigGeometryError(f"{where}.models: lists no model")
    groups: list[MigGroup] = []
    for i, raw_group in enumerate(_list(item.get("allowedGeometries"), f"{where}.allowedGeometries")):
        group = _parse_group(raw_group, f"{where}.allowedGeometries[{i}]")
        if any(g.name == group.name for g in groups):
            raise MigGeometryError(f"{where}.allowedGeometries[{i}].group: {group.name!r} appears twice")
        groups.append(group)
    return KnownMigGeometry(models=models, groups=tuple(groups))


def parse_device_config(text: str) -> DeviceConfig:
    """Parse the `device-config.yaml` text of ConfigMap `volcano-vgpu-device-config`.

    Keys outside the ones read here are ignored, as Volcano's YAML decoder ignores them; wrong
    types and values are refused with the key's path in the message.
    """
    try:
        document = safe_load(text)
    except yaml.YAMLError as exc:
        raise MigGeometryError(f"device-config.yaml: {yaml_problem(exc)}") from None
    nvidia = _mapping(_mapping(document, "device-config.yaml").get("nvidia"), "nvidia")

    def name(key: str) -> str:
        value = nvidia.get(key, "")
        if not isinstance(value, str):
            raise MigGeometryError(f"nvidia.{key}: expected a string, got {value!r}")
        return value

    known = tuple(
        _parse_known(raw, f"nvidia.knownMigGeometries[{i}]")
        for i, raw in enumerate(_list(nvidia.get("knownMigGeometries", []), "nvidia.knownMigGeometries"))
    )
    return DeviceConfig(
        resource_count_name=name("resourceCountName"),
        resource_memory_name=name("resourceMemoryName"),
        resource_memory_percentage_name=name("resourceMemoryPercentageName"),
        resource_core_name=name("resourceCoreName"),
        # The reference plugin divides by the factor; 0 would crash it, so it is refused here.
        gpu_memory_factor=_int(nvidia.get("gpuMemoryFactor", 1), "nvidia.gpuMemoryFactor", 1),
        device_split_count=_int(nvidia.get("deviceSplitCount", 10), "nvidia.deviceSplitCount", 1),
        device_core_scaling=_number(nvidia.get("deviceCoreScaling", 1), "nvidia.deviceCoreScaling"),
        device_memory_scaling=_number(nvidia.get("deviceMemoryScaling", 1), "nvidia.deviceMemoryScaling"),
        known_mig_geometries=known,
    )


def encode_device_config(config: DeviceConfig) -> str:
    """The `device-config.yaml` text `parse_device_config` reads back to an equal DeviceConfig."""

    def number(value: float) -> float | int:
        return int(value) if float(value).is_integer() else value

    nvidia = {
        "resourceCountName": config.resource_count_name,
        "resourceMemoryName": config.resource_memory_name,
        "resourceMemoryPercentageName": config.resource_memory_percentage_name,
        "resourceCoreName": config.resource_core_name,
        "gpuMemoryFactor": config.gpu_memory_factor,
        "deviceSplitCount": config.device_split_count,
        "deviceCoreScaling": number(config.device_core_scaling),
        "deviceMemoryScaling": number(config.device_memory_scaling),
        "knownMigGeometries": [
            {
                "models": list(known.models),
                "allowedGeometries": [
                    {
                        "group": group.name,
                        "geometries": [
                            {"name": t.name, "memory": t.memory_mib, "count": t.count}
                            for t in group.instance_types
                        ],
                    }
                    for group in known.groups
                ],
            }
            for known in config.known_mig_geometries
        ],
    }
    return yaml.safe_dump({"nvidia": nvidia}, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Geometry lookups and slot arithmetic


def geometry_for_type(config: DeviceConfig, register_type: str) -> list[MigGroup] | None:
    """The groups of the first `knownMigGeometries` item one of whose models is a (case-sensitive)
    substring of the registered TYPE; None when no item matches (Volcano then falls back to
    hami-core for that GPU)."""
    for entry in config.known_mig_geometries:
        if any(model in register_type for model in entry.models):
            return list(entry.groups)
    return None


def find_group(groups: Sequence[MigGroup], name: str) -> MigGroup:
    """The group called `name`; raise naming it and the groups that exist otherwise."""
    for group in groups:
        if group.name == name:
            return group
    raise MigGeometryError(f"no MIG group {name!r} (groups: {', '.join(g.name for g in groups) or 'none'})")


def slot_for_position(group: MigGroup, position: int) -> MigSlot:
    """What `position` of `group` is: counts of the earlier instance types come first."""
    if not isinstance(position, int) or isinstance(position, bool) or position < 0:
        raise MigGeometryError(f"position {position!r} of group {group.name!r} is not an integer >= 0")
    offset = 0
    for instance in group.instance_types:
        if position < offset + instance.count:
            return MigSlot(instance.name, instance.memory_mib, position - offset)
        offset += instance.count
    raise MigGeometryError(
        f"position {position} is outside group {group.name!r}, whose positions are 0..{offset - 1}"
    )


def position_of(group: MigGroup, type_name: str, index: int) -> int:
    """The position of the `index`-th instance (from 0) of `type_name` in `group`."""
    offset = 0
    for instance in group.instance_types:
        if instance.name == type_name:
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < instance.count:
                last = instance.count - 1
                raise MigGeometryError(
                    f"index {index!r} of {type_name} in group {group.name!r} is not in 0..{last}"
                )
            return offset + index
        offset += instance.count
    names = ", ".join(t.name for t in group.instance_types)
    raise MigGeometryError(f"group {group.name!r} has no instance type {type_name!r} (it has {names})")


def _by_memory(group: MigGroup) -> list[MigInstanceType]:
    # Volcano sorts with sort.Slice, which is an insertion sort (stable) for the handful of
    # instance types a group holds; Python's stable sort gives the same order.
    return sorted(group.instance_types, key=lambda t: t.memory_mib)


def choose_slot(
    groups: Sequence[MigGroup], used: Mapping[str, Collection[int]], request_mib: int
) -> tuple[str, int] | None:
    """The scheduler's slot choice for one GPU (Volcano's pkg/scheduler/api/devices/nvidia/vgpu/mig.go), or
    None when nothing fits.

    `used` maps a group name to the positions pods hold on this GPU; a group with no position is
    not in use. `request_mib` is already multiplied by `gpuMemoryFactor`. On a GPU that uses a
    group, only that group is considered and only instance types already in use there are
    eligible (so a group's other instance types are never offered), smallest memory first; on an
    unused GPU, groups are tried in order and the smallest instance type that fits wins.
    """
    if isinstance(request_mib, bool) or not isinstance(request_mib, int) or request_mib < 0:
        raise MigGeometryError(f"requested memory {request_mib!r} MiB is not an integer >= 0")
    in_use = {name: set(positions) for name, positions in used.items() if positions}
    if len(in_use) > 1:
        raise MigGeometryError(f"a GPU uses one MIG group at a time, got positions in {sorted(in_use)}")
    if in_use:
        ((name, positions),) = in_use.items()
        group = find_group(groups, name)
        taken: dict[str, set[int]] = {}
        for position in positions:
            slot = slot_for_position(group, position)
            taken.setdefault(slot.instance_type, set()).add(slot.index_within_type)
        for instance in _by_memory(group):
            indexes = taken.get(instance.name)
            if indexes is None or len(indexes) >= instance.count or instance.memory_mib < request_mib:
                continue
            free = min(i for i in range(instance.count) if i not in indexes)
            return group.name, position_of(group, instance.name, free)
        return None
    for group in groups:
        for instance in _by_memory(group):
            if instance.memory_mib >= request_mib:
                return group.name, position_of(group, instance.name, 0)
    return None


# ---------------------------------------------------------------------------------------------
# The device ID `<GPU-UUID>[<group>-<position>]`

_DEVICE_ID = re.compile(r"(?P<uuid>[^\[\]]+)\[(?P<slot>[^\[\]]*)\]")


def is_mig_device_id(device_id: str) -> bool:
    """Whether a device-list ID carries a `[group-position]` suffix."""
    return "[" in device_id


def parse_mig_device_id(device_id: str) -> MigDeviceId:
    """Decode `<GPU-UUID>[<group>-<position>]`: exactly two `-` parts, an integer position."""
    match = _DEVICE_ID.fullmatch(device_id)
    if match is None:
        raise MigGeometryError(f"device id {device_id!r} is not <GPU-UUID>[<group>-<position>]")
    parts = match["slot"].split("-")
    if len(parts) != 2:
        raise MigGeometryError(
            f"device id {device_id!r}: [{match['slot']}] must be <group>-<position> with exactly one '-'"
        )
    group, position = parts
    if not group:
        raise MigGeometryError(f"device id {device_id!r}: the group name is empty")
    if not (position.isascii() and position.isdigit()):
        raise MigGeometryError(f"device id {device_id!r}: position {position!r} is not an integer")
    return MigDeviceId(match["uuid"], group, int(position))
