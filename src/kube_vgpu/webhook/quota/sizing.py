"""How the quota sizes a pod the cache shows, exactly as its review was sized: the largest GPU it may
land on (for a share of a card) and, for a `mig` pod, the slot it will hold. Both resolve the pod's
selectors and mode against the current inventory, as admission does. `pod_ledger` wires them into
the ledger both the webhook and `kube-vgpu top` count a namespace's pods with."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.geometry import DeviceConfig
from kube_vgpu.contract.names import HAMI_CORE, MIG, VGPU_MODE, Mode
from kube_vgpu.contract.resources import RequestError, parse_pod
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.resolve import resolve_placement
from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors
from kube_vgpu.webhook.quota.charge import SlotSize
from kube_vgpu.webhook.quota.ledger import GpuSizer, QuotaLedger, SlotSizer, pod_metadata
from kube_vgpu.webhook.quota.mig_charge import slot_sizer
from kube_vgpu.webhook.records import PodRecord


def placement_sizer(inventory: Callable[[], Inventory], names: ResourceNames, default_mode: Mode) -> GpuSizer:
    """The ledger's `gpu_size` for pods from the cache: the largest GPU the pod could land on.

    Resolved exactly as admission resolves `largest_gpu_mib` (its selectors and mode against the
    current inventory), so a pod the cache shows is sized as its review was.
    """

    def size(pod: PodRecord) -> int | None:
        annotations = pod_metadata(pod).get("annotations")
        try:
            selectors = parse_selectors(annotations if isinstance(annotations, dict) else {})
            request = parse_pod(pod, names)
        except (SelectorError, RequestError):
            return None
        return resolve_placement(selectors, request, inventory(), default_mode).largest_gpu_mib

    return size


def mig_slot_sizer(
    inventory: Callable[[], Inventory],
    geometry: Callable[[], DeviceConfig],
    names: ResourceNames,
    default_mode: Mode,
) -> SlotSizer:
    """The quota's `slot_size`: for a `mig` pod, the slot it will hold on the GPUs it may land on.

    Resolved as admission resolves placement (selectors and mode against the current inventory);
    None for a hami-core pod, whose memory is charged as asked.
    """

    def size(pod: PodRecord) -> SlotSize | None:
        annotations = pod_metadata(pod).get("annotations")
        if isinstance(annotations, dict) and annotations.get(VGPU_MODE) == HAMI_CORE:
            # The mode annotation is the placement's mode whenever the selectors parse (an alias
            # that disagrees with it fails them, which answers None too): a hami-core pod, every
            # pod the mutating phase has admitted in that mode, holds no slot. This skips parsing
            # the pod and its selectors again for each review.
            return None
        try:
            selectors = parse_selectors(annotations if isinstance(annotations, dict) else {})
            request = parse_pod(pod, names)
        except (SelectorError, RequestError):
            return None
        inv = inventory()
        placement = resolve_placement(selectors, request, inv, default_mode)
        if placement.mode != MIG:
            return None
        # Without the memory floor: the slot depends on the GPU's geometry, not its whole size.
        candidates = dataclasses.replace(placement.filter, min_memory_mib=0)
        return slot_sizer(geometry(), inv.types_matching(candidates, MIG))

    return size


def pod_ledger(
    inventory: Callable[[], Inventory],
    geometry: Callable[[], DeviceConfig],
    names: ResourceNames,
    default_mode: Mode,
    *,
    pending_seconds: float,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    stream_current_at: Callable[[], float | None] = lambda: None,
    claim_classes: frozenset[str] = frozenset(),
    largest_claim_gpu: Callable[[], int | None] | None = None,
) -> QuotaLedger:
    """The ledger of the pods a cache shows, each sized against `inventory` and the MIG `geometry`,
    and of the ResourceClaims of `claim_classes` (a request naming no memory sized as the largest GPU)."""

    def gpu_memory(uuid: str) -> int | None:
        gpu = inventory().gpu(uuid)
        return None if gpu is None else gpu.memory_mib

    return QuotaLedger(
        names=names,
        pending_seconds=pending_seconds,
        gpu_size=placement_sizer(inventory, names, default_mode),
        gpu_memory=gpu_memory,
        slot_size=mig_slot_sizer(inventory, geometry, names, default_mode),
        clock=clock,
        wall_clock=wall_clock,
        stream_current_at=stream_current_at,
        claim_classes=claim_classes,
        largest_gpu=largest_claim_gpu or (lambda: inventory().largest_memory_any()),
    )
