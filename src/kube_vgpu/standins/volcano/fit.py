"""LOCAL STAND-IN for Volcano's vGPU device allocation (deviceshare plugin, binpack policy).

Volcano cannot run here, so the demo and end-to-end tests use this restatement of its per-GPU fit
rules (pkg/scheduler/api/devices/nvidia/vgpu/utils.go, device_info.go, mig.go). It is not kube-vgpu's product
code and makes no claim to reproduce Volcano beyond those rules. Pure: node and pod dicts in, a plan out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kube_vgpu.contract import names as n
from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord, decode_pod_devices
from kube_vgpu.contract.register import RegisterFormatError, decode_register
from kube_vgpu.standins.apiserver.quantity import value as parse_value

# (MIG geometry list of the GPU, slots already used as (group, position), request MiB) -> (group, position)
MigChooser = Callable[[str, Sequence[tuple[str, int]], int], tuple[str, int] | None]


@dataclass
class GpuLedger:
    """One registered GPU and what live pods hold on it."""

    index: int
    uuid: str
    count: int
    memory_mib: int
    type: str
    mode: str
    used_num: int = 0
    used_mem: int = 0
    used_cores: int = 0
    mig_slots: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True)
class ContainerAsk:
    """One vGPU container's request as Volcano reads it
    (pkg/scheduler/api/devices/util.go)."""

    nums: int
    memory_mib: int
    percent: int | None
    cores: int


class NoFit(Exception):
    """The pod does not fit the node; the message says why."""


def quantity_value(raw: object) -> int:
    """A limit as Volcano reads it: `Quantity.Value()`, so `3k` is 3000."""
    return parse_value(str(raw))


def container_asks(pod: Mapping[str, Any], names: ResourceNames) -> list[ContainerAsk]:
    """The vGPU containers of `spec.containers`, in order; init containers are ignored as Volcano does."""
    asks: list[ContainerAsk] = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        requests = (container.get("resources") or {}).get("requests") or {}
        if names.count not in limits and names.memory not in limits:
            continue

        def amount(
            key: str, default: int, limits: Mapping[str, Any] = limits, requests: Mapping[str, Any] = requests
        ) -> int:
            raw = limits.get(key, requests.get(key))
            return default if raw is None else quantity_value(raw)

        percent_raw = limits.get(names.memory_percentage, requests.get(names.memory_percentage))
        asks.append(
            ContainerAsk(
                nums=amount(names.count, 1),
                memory_mib=amount(names.memory, 0),
                percent=None if percent_raw is None else quantity_value(percent_raw),
                cores=amount(names.cores, 0),
            )
        )
    return asks


def node_ledger(node: Mapping[str, Any], pods_on_node: Sequence[Mapping[str, Any]]) -> list[GpuLedger]:
    """The node's GPUs from its register annotation, charged with every live pod's `vgpu-ids-new`."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    try:
        records = decode_register(annotations.get(n.NODE_REGISTER, ""))
    except RegisterFormatError as exc:
        raise NoFit(f"register annotation unusable: {exc}") from None
    gpus = [GpuLedger(i, r.uuid, r.count, r.memory_mib, r.type, r.mode) for i, r in enumerate(records)]
    for pod in pods_on_node:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ids = ((pod.get("metadata") or {}).get("annotations") or {}).get(n.VGPU_IDS_NEW)
        if not ids:
            continue
        for entry in decode_pod_devices(ids):
            for record in entry:
                _charge(gpus, record)
    return gpus


def mig_device_id(gpu_uuid: str, group: str, position: int) -> str:
    """The device ID Volcano writes for a MIG slot, `<GPU-UUID>[<group>-<position>]`
    (pkg/scheduler/api/devices/nvidia/vgpu/mig.go); like Volcano, it checks nothing."""
    return f"{gpu_uuid}[{group}-{position}]"


def _charge(gpus: Sequence[GpuLedger], record: DeviceRecord) -> None:
    for gpu in gpus:
        if gpu.uuid in record.gpu_uuid:  # Volcano matches by containment (its vgpu/utils.go)
            gpu.used_num += 1
            gpu.used_mem += record.used_mem
            gpu.used_cores += record.used_cores
            if "[" in record.id:
                group, _, position = record.id.split("[", 1)[1].rstrip("]").partition("-")
                gpu.mig_slots.append((group, int(position)))
            return


def _split(value: str | None, *, trim: bool) -> list[str] | None:
    if value is None:
        return None
    items = value.split(",")
    return [i.strip() for i in items if i.strip()] if trim else items


def _type_ok(annotations: Mapping[str, str], gpu_type: str) -> bool:
    use = _split(annotations.get(n.USE_GPUTYPE), trim=False)
    if use is not None:  # when present, nouse-gputype is ignored (Volcano's utils.go)
        return any(item.lower() in gpu_type.lower() for item in use)
    nouse = _split(annotations.get(n.NOUSE_GPUTYPE), trim=False)
    return nouse is None or not any(item.lower() in gpu_type.lower() for item in nouse)


def _uuid_ok(annotations: Mapping[str, str], uuid: str) -> bool:
    use = _split(annotations.get(n.USE_GPUUUID), trim=True)
    nouse = _split(annotations.get(n.NOUSE_GPUUUID), trim=True) or []
    return uuid not in nouse and (use is None or uuid in use)


def _misfit(
    annotations: Mapping[str, str], gpu: GpuLedger, ask: ContainerAsk, memory: int, chosen: list[DeviceRecord]
) -> str | None:
    """Which of Volcano's per-GPU fit rules (`checkNodeGPUSharingPredicateAndScore`) this GPU fails, in
    words; None when it fits."""
    if not _uuid_ok(annotations, gpu.uuid):
        return "excluded by the UUID selectors"
    if gpu.count <= gpu.used_num:
        return f"all {gpu.count} vGPU slots used"
    if gpu.memory_mib - gpu.used_mem < memory:
        return f"memory: {gpu.memory_mib - gpu.used_mem} MiB free, {memory} MiB asked"
    if gpu.used_cores + ask.cores > 100:
        return f"cores: {gpu.used_cores}% used, {ask.cores}% asked"
    if ask.cores == 100 and gpu.used_num > 0:
        return "cores: a whole GPU (100%) asked, the GPU is shared"
    if gpu.used_cores == 100 and ask.cores == 0:
        return "cores: held whole by another pod"
    if not _type_ok(annotations, gpu.type):
        return f"type {gpu.type!r} excluded by the type selectors"
    if any(r.gpu_uuid == gpu.uuid for r in chosen):
        return "already given to this container"
    return None


def fit_pod(
    pod: Mapping[str, Any],
    gpus: list[GpuLedger],
    names: ResourceNames,
    mig_chooser: MigChooser | None = None,
) -> list[list[DeviceRecord]]:
    """Per-container device records for `pod` on a node with `gpus` (binpack order), or NoFit."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    wanted_mode = annotations.get(n.VGPU_MODE)
    node_mode = gpus[-1].mode if gpus else ""
    node_mode = n.MIG if node_mode == n.MIG else n.HAMI_CORE
    if wanted_mode is not None and wanted_mode != node_mode:
        raise NoFit(f"pod wants mode {wanted_mode}, node runs {node_mode}")
    plan: list[list[DeviceRecord]] = []
    for ask in container_asks(pod, names):
        if ask.nums > len(gpus):
            raise NoFit("no enough gpu cards")
        chosen: list[DeviceRecord] = []
        misfits: list[str] = []
        # binpack: most used memory first, then the lower ID (deviceshare.go)
        for gpu in sorted(gpus, key=lambda g: (-g.used_mem, g.index)):
            if len(chosen) == ask.nums:
                break
            memory = gpu.memory_mib * ask.percent // 100 if ask.percent is not None else ask.memory_mib
            if ask.percent is None and ask.memory_mib == 0:
                memory = gpu.memory_mib
            why = _misfit(annotations, gpu, ask, memory, chosen)
            if why is not None:
                misfits.append(f"{gpu.uuid}: {why}")
                continue
            device_id = gpu.uuid
            charged = memory
            if node_mode == n.MIG:
                slot = mig_chooser(gpu.type, gpu.mig_slots, memory) if mig_chooser else None
                if slot is None:
                    misfits.append(f"{gpu.uuid}: no free MIG slot of {memory} MiB")
                    continue
                device_id = mig_device_id(gpu.uuid, *slot)
                gpu.mig_slots.append(slot)
            gpu.used_num += 1
            gpu.used_mem += charged
            gpu.used_cores += ask.cores
            chosen.append(DeviceRecord(device_id, memory, ask.cores))
        if len(chosen) < ask.nums:
            raise NoFit(f"container needs {ask.nums} GPU(s), {len(chosen)} fit ({'; '.join(misfits)})")
        plan.append(chosen)
    return plan
