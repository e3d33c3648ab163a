"""The `--simulate FILE` document: which GPUs a simulated NVML has and what it will report.

```yaml
driverVersion: "550.54.15"          # optional
gpus:
  - model: NVIDIA A100-SXM4-80GB     # the NVML name
    memoryMiB: 81920                 # optional for a model the simulator knows; at most 2^31-1
    count: 2                         # optional, default 1; at most 64 GPUs on a node
    migCapable: true                 # optional, default false
    migEnabled: false                # optional: MIG mode currently on
    migPending: false                # optional: a MIG mode change waits for a GPU reset
    migInstances: [3g.40gb]          # optional: instances present at start (MIG enabled only)
    uuids: [GPU-..., GPU-...]        # optional; default: derived from the node name and index
events:                              # optional: seconds after the first nvmlInit
  - {after: 30, gpu: 0, xid: 79}     # gpu = index in the flattened list
  - {after: 31, gpu: 0, lost: true}  # NVML calls on GPU 0 raise GpuIsLost until `lost: false`
processes:                           # optional: compute processes NVML reports, and their cgroup
  - gpu: 0                           # index in the flattened list
    mig: 5                           # optional: on this GPU instance ID (its compute instance 0)
    pid: 4242
    usedMemoryMiB: 2048
    smUtilPercent: 35                # optional: what process utilisation reports for it
    cgroup: "0::/kubepods.slice/..." # optional: the text /proc/<pid>/cgroup would hold
```

Unknown keys and wrong types are refused with a message naming the key and the value.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from kube_vgpu.contract.yamltext import safe_load, yaml_problem
from kube_vgpu.standins.nvml.profiles import MODELS

DEFAULT_DRIVER_VERSION = "550.54.15"
# Fixed namespace so a node's default UUIDs are the same on every run and every machine.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simnvml.kube-vgpu.io")
# Volcano splits its annotations on these, and matches UUIDs by containment
# (pkg/scheduler/api/devices/nvidia/vgpu/utils.go).
_UUID_FORBIDDEN = ",:;[]"
# GPUs one simulated node may hold: four times the largest server, and a bound on the work a typo
# (`count: 80000`) can cause, since every pair of UUIDs is compared.
MAX_GPUS = 64
# Volcano (like HAMi) reads a GPU's memory as an int32 (its DeviceInfo.Devmem).
_MAX_MEMORY_MIB = (2**31 - 1, "Volcano reads GPU memory as a 32-bit number")
# The whole-GPU value of an event's GPU/compute instance ID.
WHOLE_GPU = 0xFFFFFFFF

_GPU_KEYS = {"model", "memoryMiB", "count", "migCapable", "migEnabled", "migPending", "migInstances", "uuids"}
_EVENT_KEYS = {"after", "gpu", "xid", "lost", "gpuInstanceId", "computeInstanceId"}
_PROCESS_KEYS = {"gpu", "mig", "pid", "usedMemoryMiB", "smUtilPercent", "cgroup"}
_TOP_KEYS = {"gpus", "events", "processes", "driverVersion"}


class SimulationError(ValueError):
    """The simulation document is invalid; the message names the key and the value."""


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU, after `count` has been flattened."""

    index: int
    model: str
    memory_mib: int
    uuid: str
    mig_capable: bool
    mig_enabled: bool
    mig_pending: bool
    mig_instances: tuple[str, ...]


@dataclass(frozen=True)
class EventSpec:
    """Something NVML will report `after` seconds past the first nvmlInit."""

    after: float
    gpu: int
    xid: int | None
    lost: bool | None
    gpu_instance_id: int = WHOLE_GPU
    compute_instance_id: int = WHOLE_GPU


@dataclass(frozen=True)
class ProcessSpec:
    """A compute process NVML reports on a GPU (or on one of its MIG GPU instances)."""

    gpu: int
    mig: int | None
    pid: int
    used_memory_mib: int
    sm_util_percent: int | None
    cgroup: str


@dataclass(frozen=True)
class SimulationSpec:
    """A validated simulation document for one node."""

    node_name: str
    gpus: tuple[GpuSpec, ...]
    events: tuple[EventSpec, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    processes: tuple[ProcessSpec, ...] = ()


def default_gpu_uuid(node_name: str, index: int) -> str:
    """The full-length, stable UUID of GPU `index` on `node_name` when the file gives none."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def _mapping(value: object, where: str, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SimulationError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise SimulationError(f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")
    return value


def _int(value: object, where: str, minimum: int, maximum: tuple[int, str] | None = None) -> int:
    """`value` as an integer >= `minimum` and, when given, <= `maximum` (the bound and why)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimulationError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum[0]:
        raise SimulationError(f"{where}: expected an integer <= {maximum[0]} ({maximum[1]}), got {value!r}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise SimulationError(f"{where}: expected true or false, got {value!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise SimulationError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
    return value


def _none_as_empty(value: object) -> object:
    # `events:` with nothing after it is YAML null; read it as no events.
    return [] if value is None else value


def _text(value: object, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SimulationError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _gpu_entry(raw: object, where: str, first_index: int, node_name: str) -> list[GpuSpec]:
    entry = _mapping(raw, where, _GPU_KEYS)
    if "model" not in entry:
        raise SimulationError(f"{where}: missing key 'model' (the NVML name, e.g. NVIDIA A100-SXM4-80GB)")
    model = _text(entry["model"], f"{where}.model")
    known = MODELS.get(model)
    if "memoryMiB" in entry:
        memory = _int(entry["memoryMiB"], f"{where}.memoryMiB", 1, _MAX_MEMORY_MIB)
    elif known is not None:
        memory = known.memory_mib
    else:
        raise SimulationError(f"{where}: missing key 'memoryMiB' (the simulator does not know {model!r})")
    count = _int(entry.get("count", 1), f"{where}.count", 1)
    if first_index + count > MAX_GPUS:
        raise SimulationError(
            f"{where}.count: {count} more GPUs make {first_index + count} on the node; "
            f"a node holds at most {MAX_GPUS}"
        )
    capable = _bool(entry.get("migCapable", False), f"{where}.migCapable")
    enabled = _bool(entry.get("migEnabled", False), f"{where}.migEnabled")
    pending = _bool(entry.get("migPending", False), f"{where}.migPending")
    if capable and (known is None or not known.mig_profiles):
        names = ", ".join(m.name for m in MODELS.values() if m.mig_profiles)
        raise SimulationError(
            f"{where}.model: no MIG profiles for {model!r} (migCapable needs one of: {names})"
        )
    if (enabled or pending) and not capable:
        raise SimulationError(f"{where}: migEnabled and migPending need migCapable: true")
    instances = tuple(
        _text(n, f"{where}.migInstances[{i}]")
        for i, n in enumerate(_list(_none_as_empty(entry.get("migInstances")), f"{where}.migInstances"))
    )
    if instances and (not enabled or pending):
        raise SimulationError(f"{where}.migInstances: instances need migEnabled: true and no pending change")
    for i, name in enumerate(instances):
        if known is None or known.profile_by_name(name) is None:
            raise SimulationError(f"{where}.migInstances[{i}]: {model} has no MIG profile {name!r}")
    if "uuids" in entry:
        uuids = [
            _text(u, f"{where}.uuids[{i}]") for i, u in enumerate(_list(entry["uuids"], f"{where}.uuids"))
        ]
        if len(uuids) != count:
            raise SimulationError(f"{where}.uuids: {len(uuids)} UUIDs for count {count}")
        for i, value in enumerate(uuids):
            if not value.startswith("GPU-") or any(c in _UUID_FORBIDDEN for c in value) or " " in value:
                raise SimulationError(
                    f"{where}.uuids[{i}]: {value!r} must start with GPU- and hold no space or , : ; [ ]"
                )
    else:
        uuids = [default_gpu_uuid(node_name, first_index + k) for k in range(count)]
    return [
        GpuSpec(
            index=first_index + k,
            model=model,
            memory_mib=memory,
            uuid=uuids[k],
            mig_capable=capable,
            mig_enabled=enabled,
            mig_pending=pending,
            mig_instances=instances,
        )
        for k in range(count)
    ]


def _check_uuids(gpus: list[GpuSpec]) -> None:
    for a in gpus:
        for b in gpus:
            if a.index >= b.index:
                continue
            if a.uuid == b.uuid:
                raise SimulationError(f"duplicate GPU UUID {a.uuid!r} (GPUs {a.index} and {b.index})")
            # Volcano matches allocations to GPUs by containment
            # (pkg/scheduler/api/devices/nvidia/vgpu/utils.go).
            if a.uuid in b.uuid or b.uuid in a.uuid:
                raise SimulationError(
                    f"GPU UUIDs {a.uuid!r} and {b.uuid!r} contain one another; Volcano would confuse them"
                )


def _event(raw: object, where: str, gpu_count: int) -> EventSpec:
    entry = _mapping(raw, where, _EVENT_KEYS)
    after = entry.get("after")
    if isinstance(after, bool) or not isinstance(after, int | float) or after < 0:
        raise SimulationError(f"{where}.after: expected seconds >= 0, got {after!r}")
    gpu = entry.get("gpu")
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpu_count:
        raise SimulationError(
            f"{where}.gpu: {gpu!r} is not a GPU index "
            f"(the file describes {gpu_count} GPUs: 0..{gpu_count - 1})"
        )
    xid = _int(entry["xid"], f"{where}.xid", 0) if "xid" in entry else None
    lost = _bool(entry["lost"], f"{where}.lost") if "lost" in entry else None
    if xid is None and lost is None:
        raise SimulationError(f"{where}: an event needs 'xid' or 'lost'")
    return EventSpec(
        after=float(after),
        gpu=gpu,
        xid=xid,
        lost=lost,
        gpu_instance_id=_int(entry.get("gpuInstanceId", WHOLE_GPU), f"{where}.gpuInstanceId", 0),
        compute_instance_id=_int(entry.get("computeInstanceId", WHOLE_GPU), f"{where}.computeInstanceId", 0),
    )


def _process(raw: object, where: str, gpus: list[GpuSpec]) -> ProcessSpec:
    entry = _mapping(raw, where, _PROCESS_KEYS)
    for key in ("gpu", "pid", "usedMemoryMiB"):
        if key not in entry:
            raise SimulationError(f"{where}: missing key {key!r}")
    gpu = entry["gpu"]
    if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < len(gpus):
        raise SimulationError(
            f"{where}.gpu: {gpu!r} is not a GPU index (the file describes {len(gpus)} GPUs)"
        )
    mig = _int(entry["mig"], f"{where}.mig", 0) if entry.get("mig") is not None else None
    if mig is not None and not gpus[gpu].mig_capable:
        raise SimulationError(f"{where}.mig: GPU {gpu} is not migCapable, so it has no GPU instance {mig}")
    util = entry.get("smUtilPercent")
    if util is not None and (isinstance(util, bool) or not isinstance(util, int) or not 0 <= util <= 100):
        raise SimulationError(f"{where}.smUtilPercent: expected a percent 0..100, got {util!r}")
    cgroup = entry.get("cgroup", "")
    if not isinstance(cgroup, str):
        raise SimulationError(f"{where}.cgroup: expected the text of /proc/<pid>/cgroup, got {cgroup!r}")
    return ProcessSpec(
        gpu=gpu,
        mig=mig,
        pid=_int(entry["pid"], f"{where}.pid", 1),
        used_memory_mib=_int(entry["usedMemoryMiB"], f"{where}.usedMemoryMiB", 0),
        sm_util_percent=util,
        cgroup=cgroup,
    )


def _processes(raw: object, gpus: list[GpuSpec]) -> tuple[ProcessSpec, ...]:
    items = _list(_none_as_empty(raw), "processes")
    processes = tuple(_process(item, f"processes[{i}]", gpus) for i, item in enumerate(items))
    cgroups: dict[int, str] = {}
    for i, process in enumerate(processes):
        # One process, one cgroup: a PID on two GPUs is one process using both.
        if cgroups.setdefault(process.pid, process.cgroup) != process.cgroup:
            raise SimulationError(f"processes[{i}].cgroup: PID {process.pid} is listed with two cgroups")
    return processes


def parse_simulation(document: str | Mapping[str, Any], node_name: str) -> SimulationSpec:
    """Validate a simulation document (YAML text or an already-parsed mapping) for `node_name`."""
    node_name = _text(node_name, "node name")
    if isinstance(document, str):
        try:
            document = safe_load(document)
        except yaml.YAMLError as exc:
            raise SimulationError(f"simulation file: {yaml_problem(exc)}") from None
    top = _mapping(document, "simulation file", _TOP_KEYS)
    if "gpus" not in top:
        raise SimulationError("simulation file: missing key 'gpus'")
    gpus: list[GpuSpec] = []
    for i, raw in enumerate(_list(top["gpus"], "gpus")):
        gpus.extend(_gpu_entry(raw, f"gpus[{i}]", len(gpus), node_name))
    _check_uuids(gpus)
    events = tuple(
        _event(raw, f"events[{i}]", len(gpus))
        for i, raw in enumerate(_list(_none_as_empty(top.get("events")), "events"))
    )
    driver = _text(top.get("driverVersion", DEFAULT_DRIVER_VERSION), "driverVersion")
    return SimulationSpec(
        node_name=node_name,
        gpus=tuple(gpus),
        events=events,
        driver_version=driver,
        processes=_processes(top.get("processes"), gpus),
    )
