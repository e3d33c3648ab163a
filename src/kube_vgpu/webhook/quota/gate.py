"""The quota step of admission (SPEC §2.2 step 1): does this pod fit its namespace's GPU quota?

`NamespaceQuota.admit` is the one call the validating phase makes after every other rule has
passed, once per pod, with the final object (its uid keys the reservation). It reads the limits
from the namespace labels handed in with each review (so a relabel takes effect on the next
review, no restart), sizes the pod (`webhook.quota_charge`) and decides it: with a shared book
(every running webhook), against the cache's pods plus the reservations every replica shares
through the API (`webhook.quota_shared`); without one (tests, the pure benchmark), against the
ledger's own in-process reservations, in one synchronous step. The cluster cache keeps the ledger
current through `NamespaceQuota.ledger`'s pod callbacks.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.geometry import DeviceConfig
from kube_vgpu.contract.names import HAMI_CORE, MIG, VGPU_MODE, Mode
from kube_vgpu.contract.resources import PodRequest, RequestError, parse_pod
from kube_vgpu.webhook.admission.mutation import resolve_placement
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors
from kube_vgpu.webhook.quota.charge import (
    Charge,
    GpuMemory,
    Limits,
    Resource,
    SlotSize,
    exceeded_message,
    invalid_label_message,
    parse_limits,
    pod_charge,
    pod_needs_gpu_size,
    restartable_init_flags,
    unsized_message,
)
from kube_vgpu.webhook.quota.ledger import GpuSizer, QuotaLedger, SlotSizer, Verdict, pod_metadata
from kube_vgpu.webhook.quota.mig_charge import slot_sizer
from kube_vgpu.webhook.quota.shared import Ask, SharedBook, Unrecorded

__all__ = ["Charge", "DenialCounter", "NamespaceQuota", "QuotaLedger", "Verdict", "placement_sizer"]

log = logging.getLogger("kube_vgpu.webhook.quota")


class DenialCounter(Protocol):
    """Told of every quota denial (the metrics module implements it)."""

    def denied(self, namespace: str, reason: Resource | str) -> None:
        """One review in `namespace` was refused for `reason` (a resource, `invalid-label` or `unsized`)."""

    def forget(self, namespace: str) -> None:
        """Drop what is counted for a deleted namespace."""


class NamespaceQuota:
    """Namespace GPU quotas at admission: no over-admission, no refusal of a pod that fits."""

    def __init__(
        self,
        *,
        names: ResourceNames,
        pending_seconds: float,
        gpu_size: GpuSizer | None = None,
        gpu_memory: GpuMemory | None = None,
        slot_size: SlotSizer | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stream_current_at: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.ledger = QuotaLedger(
            names=names,
            pending_seconds=pending_seconds,
            gpu_size=gpu_size,
            gpu_memory=gpu_memory,
            slot_size=slot_size,
            clock=clock,
            wall_clock=wall_clock,
            stream_current_at=stream_current_at,
        )
        self.denials: DenialCounter | None = None
        # The reservations shared by every replica; None: this process's own ledger decides alone.
        self.shared: SharedBook | None = None
        # The last labels each namespace's reviews carried; the metrics module reports limits from it
        # when it is not given the cache's namespaces.
        self.last_limits: dict[str, Limits] = {}

    def reserved(self, namespace: str) -> Charge:
        """Admissions not in the cache yet: every replica's (shared), else this process's own."""
        if self.shared is not None:
            return self.shared.in_flight(namespace)
        return self.ledger.reserved(namespace)

    def usage(self, namespace: str) -> Charge:
        """The cache's pods plus `reserved`, as the next review would see them."""
        if self.shared is not None:
            return self.ledger.usage(namespace) + self.shared.in_flight(namespace)
        return self.ledger.usage(namespace)

    def forget_namespace(self, namespace: str) -> None:
        """The namespace was deleted: keep nothing for it (memory is bounded by the namespaces that exist)."""
        self.ledger.forget(namespace)
        if self.shared is not None:
            self.shared.forget(namespace)
        self.last_limits.pop(namespace, None)
        if self.denials is not None:
            self.denials.forget(namespace)

    async def admit(
        self,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str],
        pod: Mapping[str, Any],
        request: PodRequest,
        largest_gpu_mib: int | None,
        pod_uid: str,
        dry_run: bool,
    ) -> str | None:
        """None when the pod fits (and, unless `dry_run`, its charge is now reserved); else the denial."""
        if not request.asks_vgpu:
            return None
        limits = parse_limits(namespace_labels)
        self.last_limits[namespace] = limits
        meta = pod_metadata(pod)
        name = meta.get("name") if isinstance(meta.get("name"), str) else None
        generate_name = meta.get("generateName") if isinstance(meta.get("generateName"), str) else None
        if limits.invalid:
            return self._deny(
                namespace, "invalid-label", invalid_label_message(namespace, limits.invalid), name
            )
        if self.shared is not None and not limits.any:
            return None  # nothing to enforce: no API call, no cost for namespaces without quota
        gpu_mib = largest_gpu_mib
        if gpu_mib is None and pod_needs_gpu_size(request):
            if limits.memory_mib is not None:
                return self._deny(namespace, "unsized", unsized_message(namespace), name)
            gpu_mib = 0  # memory is not limited here; the pod is re-sized once the cache shows it
        charge = pod_charge(
            request, gpu_mib=gpu_mib, sidecars=restartable_init_flags(pod), slot=self.ledger.slot_size(pod)
        )
        shown = name or f"{generate_name or ''}*"
        if self.shared is not None:
            try:
                answer = await self.shared.decide(namespace, Ask(pod_uid, charge, limits, not dry_run))
            except Unrecorded as exc:  # never admitted unbooked
                return self._deny(namespace, "unrecorded", unrecorded_message(namespace, exc), shown)
            if answer.full:
                return self._deny(namespace, "unrecorded", full_message(namespace), shown)
            verdict = Verdict(answer.over, answer.usage)
        else:
            verdict = self.ledger.try_reserve(
                namespace,
                charge,
                limits,
                key=pod_uid,
                name=name,
                generate_name=generate_name,
                dry_run=dry_run,
            )
        if verdict.fits:
            log.debug(
                "event=quota_admitted namespace=%s pod=%s uid=%s number=%d memory_mib=%d cores=%d dry_run=%s",
                namespace,
                shown,
                pod_uid,
                charge.number,
                charge.memory_mib,
                charge.cores,
                dry_run,
            )
            return None
        message = exceeded_message(namespace, verdict.over, charge, verdict.usage, limits)
        return self._deny(namespace, verdict.over[0], message, shown)

    def _deny(self, namespace: str, reason: Resource | str, message: str, pod: str | None) -> str:
        log.info(
            "event=quota_denied namespace=%s pod=%s reason=%s message=%r", namespace, pod, reason, message
        )
        if self.denials is not None:
            self.denials.denied(namespace, reason)
        return message


def unrecorded_message(namespace: str, exc: BaseException) -> str:
    """The denial when the shared reservation could not be written (API slow, down, or contended)."""
    return (
        f"namespace {namespace}: GPU quota cannot be checked right now: the webhook could not record "
        f"the pod's reservation with the API server ({exc}); it refuses rather than risk exceeding "
        "the quota; retry in a few seconds"
    )


def full_message(namespace: str) -> str:
    """The denial when the namespace has the most admissions in flight one shared object holds."""
    return (
        f"namespace {namespace}: too many GPU pods are being admitted at once (the shared quota "
        "reservations are full); retry in a few seconds"
    )


def placement_sizer(inventory: Callable[[], Inventory], names: ResourceNames, default_mode: Mode) -> GpuSizer:
    """The ledger's `gpu_size` for pods from the cache: the largest GPU the pod could land on.

    Resolved exactly as admission resolves `largest_gpu_mib` (its selectors and mode against the
    current inventory), so a pod the cache shows is sized as its review was.
    """

    def size(pod: Mapping[str, Any]) -> int | None:
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

    def size(pod: Mapping[str, Any]) -> SlotSize | None:
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
