"""Dynamic MIG for the node plugin (`--mode mig`): make the scheduler's slot exist, hand out its UUID,
and destroy layouts no live pod holds once a grace period has passed.

The scheduler writes `<GPU-UUID>[<group>-<position>]` (pkg/scheduler/api/devices/nvidia/vgpu/mig.go). For each
such record the manager checks the GPU (MIG on, a geometry for its model, the group and position), plans the
group on the GPU's real profiles (`node.mig.layout`), compares with NVML's instances and the slots live
pods hold (`node.mig.holders`), changes NVML only when no live pod is hurt (`node.mig.nvml`), and
answers with the MIG device UUID: `NVIDIA_VISIBLE_DEVICES` alone, no HAMi-core variables or mounts.
Nothing is remembered between calls that NVML and the pods do not already say, so a restarted
plugin adopts what exists. NVML work runs on worker threads under one lock, held by the thread
itself, so an Allocate cut short by its deadline never overlaps a reconcile.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.contract.mig.geometry import (
    DeviceConfig,
    MigGeometryError,
    find_group,
    is_mig_device_id,
    parse_mig_device_id,
)
from kube_vgpu.contract.models import register_type
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable
from kube_vgpu.node.deviceplugin.hamicore import ContainerResponse
from kube_vgpu.node.deviceplugin.selection import Claim, PodRef
from kube_vgpu.node.mig.config import geometry_problems, gpu_groups
from kube_vgpu.node.mig.holders import Holdings, node_holdings
from kube_vgpu.node.mig.layout import (
    LayoutError,
    LayoutPlan,
    Refusal,
    decide_layout,
    find_planned,
    matching_groups,
    plan_group,
    plan_groups,
    teardown_due,
)
from kube_vgpu.node.mig.nvml import GpuMigState, MigNvmlError, apply_actions, destroy_all, read_state
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.surface import Nvml

log = logging.getLogger("kube_vgpu.node.mig")

PodLister = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]


class MigRefused(Exception):
    """A MIG slot that cannot be honoured; the message names the GPU and the reason."""


@dataclass(frozen=True)
class Layout:
    """What a GPU holds now: the group its instances are (part of) and position -> MIG UUID."""

    gpu_uuid: str
    groups: tuple[str, ...]  # every group whose layout the instances fit (empty: none, or no instances)
    slots: dict[int, str]  # for the first of `groups`


class MigManager:
    """Dynamic MIG on one node's GPUs."""

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[GpuInfo],
        geometry: DeviceConfig,
        *,
        node_name: str,
        grace_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._gpus = {g.uuid: g for g in gpus}
        self._geometry = geometry
        self._node = node_name
        self._grace = grace_seconds
        self._clock = clock
        self._lock = threading.Lock()
        # Bumped on every slot handed out: a reconcile working from an older pod list skips the GPU.
        self._generation = dict.fromkeys(self._gpus, 0)
        self._idle_since: dict[str, float] = {}
        self._warned: set[tuple[str, str, int, str]] = set()

    # -- start -------------------------------------------------------------------------------------

    def check_node(self) -> list[str]:
        """Problems that will make Allocates fail on this node (logged as warnings; the GPUs are still
        registered, so the message reaches the user on the pod that hits them)."""
        problems: list[str] = []
        for gpu in self._gpus.values():
            groups = gpu_groups(self._geometry, gpu)
            if groups is None:
                problems.append(
                    f"GPU {gpu.uuid} ({gpu.name}): no knownMigGeometries entry matches TYPE "
                    f"{register_type(gpu.name)!r}; the scheduler treats it as hami-core"
                )
                continue
            try:
                state = read_state(self._nvml, gpu.uuid)
            except MigNvmlError as exc:
                problems.append(str(exc))
                continue
            mode_problem = _mode_problem(gpu, state)
            if mode_problem:
                problems.append(f"GPU {gpu.uuid}: {mode_problem}")
                continue
            problems.extend(
                f"GPU {gpu.uuid} ({gpu.name}): {p}" for p in geometry_problems(groups, state.profiles)
            )
        for problem in problems:
            log.warning("event=mig_node_problem node=%s problem=%r", self._node, problem)
        return problems

    def layouts(self, pods: Sequence[Mapping[str, Any]] = ()) -> dict[str, Layout]:
        """Each GPU's current layout as NVML shows it; with `pods`, the group their slots name wins
        when instances fit several groups. Read-only (the adoption after a restart)."""
        holdings = node_holdings(pods, self._node)
        result: dict[str, Layout] = {}
        with self._lock:
            for gpu in self._gpus.values():
                groups = gpu_groups(self._geometry, gpu)
                try:
                    state = read_state(self._nvml, gpu.uuid)
                except MigNvmlError as exc:
                    log.warning(
                        "event=mig_read_failed node=%s gpu=%s error=%r", self._node, gpu.uuid, str(exc)
                    )
                    continue
                if groups is None or not state.instances:
                    result[gpu.uuid] = Layout(gpu.uuid, (), {})
                    continue
                plans = plan_groups(groups, state.profiles)
                names = matching_groups(plans, state.instances)
                held = [h.group for h in holdings.on_gpu(gpu.uuid) if h.group in names]
                names.sort(key=lambda n: n not in held)
                slots: dict[int, str] = {}
                if names:
                    plan = plans[names[0]]
                    for planned in plan.instances:
                        found = find_planned(plan, planned.position, state.instances)
                        if found is not None and found.compute:
                            slots[planned.position] = found.compute[0].mig_uuid
                result[gpu.uuid] = Layout(gpu.uuid, tuple(names), slots)
        return result

    def adopt(self, pods: Sequence[Mapping[str, Any]]) -> dict[str, Layout]:
        """Log what exists at start: kept as it is, found again by placement on every Allocate."""
        layouts = self.layouts(pods)
        for layout in layouts.values():
            if layout.slots or layout.groups:
                log.info(
                    "event=mig_adopted node=%s gpu=%s group=%s slots=%s",
                    self._node,
                    layout.gpu_uuid,
                    layout.groups[0] if layout.groups else "-",
                    ",".join(f"{p}={u}" for p, u in sorted(layout.slots.items())) or "-",
                )
        return layouts

    # -- Allocate ------------------------------------------------------------------------------------

    async def respond(self, claim: Claim, pods: Sequence[Mapping[str, Any]]) -> ContainerResponse:
        """The response for one container's MIG records, creating instances as needed; MigRefused
        when a record cannot be honoured (the caller marks the bind phase failed)."""
        holdings = node_holdings(pods, self._node)
        uuids = await asyncio.to_thread(self._grant_all, claim, holdings)
        return ContainerResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})

    def _grant_all(self, claim: Claim, holdings: Holdings) -> list[str]:
        with self._lock:
            granted: list[str] = []
            for record in claim.records:
                try:
                    granted.append(self._grant(record, claim.pod, claim.index, holdings))
                except MigRefused as exc:
                    log.error(
                        "event=mig_refused node=%s pod=%s container=%s device=%s reason=%r",
                        self._node,
                        claim.pod,
                        claim.container_name,
                        record.id,
                        str(exc),
                    )
                    raise
            return granted

    def _grant(self, record: DeviceRecord, pod: PodRef, entry: int, holdings: Holdings) -> str:
        if not is_mig_device_id(record.id):
            raise MigRefused(
                f"GPU {record.id}: the scheduler gave a whole GPU but this node runs mig; Volcano does so "
                "when no knownMigGeometries entry matches the GPU's TYPE"
            )
        try:
            slot = parse_mig_device_id(record.id)
        except MigGeometryError as exc:
            raise MigRefused(f"GPU {record.gpu_uuid}: {exc}") from None
        uuid = slot.gpu_uuid
        gpu = self._gpus.get(uuid)
        if gpu is None:
            raise MigRefused(f"GPU {uuid} is not a GPU of this node")
        groups = gpu_groups(self._geometry, gpu)
        if groups is None:
            raise MigRefused(
                f"GPU {uuid} ({gpu.name}): no knownMigGeometries entry matches its TYPE "
                f"{register_type(gpu.name)!r}"
            )
        try:
            group = find_group(groups, slot.group)
            state = read_state(self._nvml, uuid)
            mode_problem = _mode_problem(gpu, state)
            if mode_problem:
                raise MigRefused(f"GPU {uuid}: {mode_problem}")
            plan = plan_group(group, state.profiles)
        except (MigGeometryError, LayoutError, MigNvmlError) as exc:
            raise MigRefused(f"GPU {uuid} ({gpu.name}): {exc}") from None
        decision = decide_layout(
            plan, slot.position, state.instances, holdings.held_by_others(uuid, pod, entry)
        )
        if isinstance(decision, Refusal):
            raise MigRefused(f"GPU {uuid}: {decision.reason}")
        if not decision.empty:
            try:
                apply_actions(self._nvml, state, decision, node_name=self._node, reason=f"pod {pod}")
                state = read_state(self._nvml, uuid)
            except MigNvmlError as exc:
                raise MigRefused(str(exc)) from None
        return self._hand_out(record, pod, plan, slot.position, state)

    def _hand_out(
        self, record: DeviceRecord, pod: PodRef, plan: LayoutPlan, position: int, state: GpuMigState
    ) -> str:
        uuid, group = state.gpu_uuid, plan.group
        planned = plan.at(position)
        found = find_planned(plan, position, state.instances)
        if found is None or len(found.compute) != 1:
            raise MigRefused(
                f"GPU {uuid}: no MIG device at [{group}-{position}] ({planned.type_name} at placement "
                f"{planned.start}:{planned.size}) after laying out the group"
            )
        device = found.compute[0]
        # The MIG device must be the slot's type: NVML's memory for it, whatever the geometry says.
        if device.memory_mib != planned.memory_mib:
            raise MigRefused(
                f"GPU {uuid}: MIG device {device.mig_uuid} at [{group}-{position}] has "
                f"{device.memory_mib} MiB, expected {planned.memory_mib} MiB of {planned.type_name}"
            )
        asked = record.used_mem * self._geometry.gpu_memory_factor
        if asked > device.memory_mib:
            raise MigRefused(
                f"GPU {uuid}: {asked} MiB asked but MIG slot [{group}-{position}] ({planned.type_name}) has "
                f"{device.memory_mib} MiB; the geometry promises more memory than NVML gives this profile"
            )
        self._generation[uuid] += 1
        self._idle_since.pop(uuid, None)
        log.info(
            "event=mig_slot_granted node=%s pod=%s gpu=%s slot=%s-%d profile=%s gi=%d mig=%s memory_mib=%d",
            self._node,
            pod,
            uuid,
            group,
            position,
            planned.type_name,
            found.gi_id,
            device.mig_uuid,
            device.memory_mib,
        )
        return device.mig_uuid

    # -- reconcile -----------------------------------------------------------------------------------

    async def reconcile_once(self, list_pods: PodLister) -> list[str]:
        """Destroy the layouts of GPUs no live pod has held for the grace period; returns their UUIDs."""
        before = dict(self._generation)
        pods = await list_pods()
        holdings = node_holdings(pods, self._node)
        return await asyncio.to_thread(self._reconcile, holdings, before)

    def _reconcile(self, holdings: Holdings, before: Mapping[str, int]) -> list[str]:
        with self._lock:
            busy = holdings.busy_gpus()
            states: dict[str, GpuMigState] = {}
            for uuid in self._gpus:
                try:
                    states[uuid] = read_state(self._nvml, uuid)
                except MigNvmlError as exc:
                    log.warning("event=mig_read_failed node=%s gpu=%s error=%r", self._node, uuid, str(exc))
            self._warn_missing(holdings, states)
            candidates = [
                uuid
                for uuid, state in states.items()
                if state.instances and uuid not in busy and self._generation[uuid] == before.get(uuid)
            ]
            due, self._idle_since = teardown_due(candidates, self._idle_since, self._clock(), self._grace)
            torn: list[str] = []
            for uuid in due:
                try:
                    destroy_all(self._nvml, states[uuid], node_name=self._node, reason="no live pod holds it")
                except MigNvmlError as exc:
                    log.warning(
                        "event=mig_teardown_failed node=%s gpu=%s error=%r", self._node, uuid, str(exc)
                    )
                    continue
                torn.append(uuid)
                log.info(
                    "event=mig_layout_destroyed node=%s gpu=%s instances=%d grace_seconds=%g",
                    self._node,
                    uuid,
                    len(states[uuid].instances),
                    self._grace,
                )
            return torn

    def _warn_missing(self, holdings: Holdings, states: Mapping[str, GpuMigState]) -> None:
        # A held slot whose instance is gone (a GPU reset, a manual change): nothing to repair, since
        # the container's device went with it; say so once.
        for holding in holdings.items:
            state = states.get(holding.gpu_uuid)
            gpu = self._gpus.get(holding.gpu_uuid)
            if not holding.held or state is None or gpu is None:
                continue
            key = (holding.pod.uid, holding.gpu_uuid, holding.position, holding.group)
            groups = gpu_groups(self._geometry, gpu) or []
            try:
                plan = plan_group(find_group(groups, holding.group), state.profiles)
                present = find_planned(plan, holding.position, state.instances) is not None
            except (MigGeometryError, LayoutError, IndexError):
                present = False
            if not present and key not in self._warned:
                self._warned.add(key)
                log.warning(
                    "event=mig_slot_missing node=%s pod=%s gpu=%s slot=%s-%d: the pod holds a MIG slot "
                    "whose instance no longer exists",
                    self._node,
                    holding.pod,
                    holding.gpu_uuid,
                    holding.group,
                    holding.position,
                )

    async def run(self, list_pods: PodLister, interval_seconds: float) -> None:
        """Reconcile every `interval_seconds` until cancelled."""
        while True:
            try:
                await self.reconcile_once(list_pods)
            except (ApiError, ApiUnavailable) as exc:
                log.warning("event=mig_reconcile_failed node=%s error=%r", self._node, str(exc))
            await asyncio.sleep(interval_seconds)


def _mode_problem(gpu: GpuInfo, state: GpuMigState) -> str | None:
    mode = state.mode
    if not mode.supported:
        return f"{gpu.name} does not support MIG"
    if mode.current != 1:
        pending = " (enabled, pending a GPU reset)" if mode.pending == 1 else ""
        return (
            f"MIG mode is off{pending}; enable it with `nvidia-smi -i {gpu.index} -mig 1` and reset the GPU"
        )
    if mode.pending != mode.current:
        return "MIG mode is being disabled (pending a GPU reset); no instance is created on it"
    return None
