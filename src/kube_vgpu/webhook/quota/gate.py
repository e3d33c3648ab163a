"""The quota step of admission: does this pod fit its namespace's GPU quota?

`NamespaceQuota.admit` is the one call the validating phase makes after every other rule has
passed, once per pod, with the final object (its uid keys the reservation). It refuses a pod of a
namespace the cache does not know, reads the limits from the namespace labels handed in with each
review (so a relabel takes effect on the next review, no restart), sizes the pod
(`kube_vgpu.webhook.quota.charge`) and decides it against the cache's pods (`QuotaLedger`) plus the
reservations every replica shares through the API (`SharedBook`). The cluster cache keeps the
ledger current through its pod callbacks.
"""

from __future__ import annotations

import logging
from typing import Protocol

from kube_vgpu.webhook.admission.gates import ClaimQuotaRequest, QuotaRequest
from kube_vgpu.webhook.quota.charge import (
    Charge,
    QuotaLimits,
    Resource,
    charge_reasons,
    exceeded_message,
    invalid_label_message,
    parse_limits,
    pod_charge,
    pod_needs_gpu_size,
    restartable_init_flags,
    unsized_message,
)
from kube_vgpu.webhook.quota.claims import all_devices_message, claim_charge, claim_reasons
from kube_vgpu.webhook.quota.ledger import QuotaLedger, pod_metadata
from kube_vgpu.webhook.quota.mig_charge import MigSlots
from kube_vgpu.webhook.quota.shared import Ask, SharedBook, Unrecorded

log = logging.getLogger("kube_vgpu.webhook.quota")


class DenialCounter(Protocol):
    """Told of every quota denial (the metrics module implements it)."""

    def denied(self, namespace: str, reason: Resource | str) -> None:
        """One review in `namespace` was refused for `reason` (a resource, `invalid-label` or `unsized`)."""

    def forget(self, namespace: str) -> None:
        """Drop what is counted for a deleted namespace."""


class NamespaceQuota:
    """Namespace GPU quotas at admission: no over-admission, no refusal of a pod that fits."""

    def __init__(self, ledger: QuotaLedger, book: SharedBook) -> None:
        self.ledger = ledger
        # The reservations shared by every replica: every admission is decided and booked there.
        self.book = book
        self.denials: DenialCounter | None = None
        # The last labels each namespace's reviews carried; the metrics module reports limits from it
        # when it is not given the cache's namespaces.
        self.last_limits: dict[str, QuotaLimits] = {}

    def reserved(self, namespace: str) -> Charge:
        """Admissions (by any replica) whose pod the cache does not show yet."""
        return self.book.in_flight(namespace)

    def usage(self, namespace: str) -> Charge:
        """The cache's pods plus `reserved`, as the next review would see them."""
        return self.ledger.usage(namespace) + self.book.in_flight(namespace)

    def forget_namespace(self, namespace: str) -> None:
        """The namespace was deleted: keep nothing for it (memory is bounded by the namespaces that exist)."""
        self.ledger.forget(namespace)
        self.book.forget(namespace)
        self.last_limits.pop(namespace, None)
        if self.denials is not None:
            self.denials.forget(namespace)

    async def admit(self, ask: QuotaRequest) -> str | None:
        """None when the pod fits (and, unless `ask.dry_run`, its charge is now booked); else the denial."""
        request, namespace = ask.request, ask.namespace
        if not request.asks_vgpu:
            return None
        if ask.namespace_labels is None:
            # The API server refuses creates in a namespace that does not exist before any webhook
            # is called, so this is a forgery or a namespace created a moment ago; either way nothing
            # is booked or remembered for it, which bounds the quota's memory by the namespaces that
            # exist.
            log.info("event=quota_unknown_namespace namespace=%r pod_uid=%s", namespace, ask.pod_uid)
            return unknown_namespace_message(namespace)
        limits = parse_limits(ask.namespace_labels)
        self.last_limits[namespace] = limits
        meta = pod_metadata(ask.pod)
        name = meta.get("name") if isinstance(meta.get("name"), str) else None
        generate_name = meta.get("generateName") if isinstance(meta.get("generateName"), str) else None
        shown = name or f"{generate_name or ''}*"
        if limits.invalid:
            return self._deny(
                namespace, "invalid-label", invalid_label_message(namespace, limits.invalid), shown
            )
        if not limits.any:
            return None  # nothing to enforce: no API call, no cost for namespaces without quota
        gpu_mib = ask.largest_gpu_mib
        if gpu_mib is None and pod_needs_gpu_size(request):
            if limits.memory_mib is not None:
                return self._deny(namespace, "unsized", unsized_message(namespace), shown)
            gpu_mib = 0  # memory is not limited here; the pod is re-sized once the cache shows it
        slot = self.ledger.slot_size(ask.pod)
        charge = pod_charge(request, gpu_mib=gpu_mib, sidecars=restartable_init_flags(ask.pod), slot=slot)
        try:
            answer = await self.book.decide(namespace, Ask(ask.pod_uid, charge, limits, not ask.dry_run))
        except Unrecorded as exc:  # never admitted unbooked
            return self._deny(namespace, "unrecorded", unrecorded_message(namespace, exc), shown)
        if answer.full:
            return self._deny(namespace, "unrecorded", full_message(namespace), shown)
        if answer.fits:
            log.debug(
                "event=quota_admitted namespace=%s pod=%s uid=%s number=%d memory_mib=%d cores=%d dry_run=%s",
                namespace,
                shown,
                ask.pod_uid,
                charge.number,
                charge.memory_mib,
                charge.cores,
                ask.dry_run,
            )
            return None
        reasons = charge_reasons(
            request,
            names=self.ledger.names,
            gpu_mib=gpu_mib,
            slot=slot,
            describe_slot=slot.describe if isinstance(slot, MigSlots) else None,
        )
        message = exceeded_message(namespace, answer.over, charge, answer.usage, limits, reasons=reasons)
        return self._deny(namespace, answer.over[0], message, shown)

    async def admit_claim(self, ask: ClaimQuotaRequest) -> str | None:
        """`admit` for a ResourceClaim of kube-vgpu's classes (`kube_vgpu.webhook.quota.claims`):
        decided and booked through the same shared reservations as pods, keyed by the claim's uid."""
        request, namespace, shown = ask.request, ask.namespace, f"resourceclaim/{ask.claim_name}"
        if not request.asks_vgpu:
            return None
        if ask.namespace_labels is None:
            log.info("event=quota_unknown_namespace namespace=%r claim_uid=%s", namespace, ask.claim_uid)
            return unknown_namespace_message(namespace)
        limits = parse_limits(ask.namespace_labels)
        self.last_limits[namespace] = limits
        if limits.invalid:
            return self._deny(
                namespace, "invalid-label", invalid_label_message(namespace, limits.invalid), shown
            )
        if not limits.any:
            return None
        if request.all_devices:
            message = all_devices_message(namespace, request.all_devices)
            return self._deny(namespace, "all-devices", message, shown)
        gpu_mib = ask.largest_gpu_mib
        if gpu_mib is None and request.needs_gpu_size:
            if limits.memory_mib is not None:
                return self._deny(namespace, "unsized", unsized_claim_message(namespace), shown)
            gpu_mib = 0
        charge = claim_charge(request, gpu_mib)
        try:
            answer = await self.book.decide(namespace, Ask(ask.claim_uid, charge, limits, not ask.dry_run))
        except Unrecorded as exc:
            return self._deny(namespace, "unrecorded", unrecorded_message(namespace, exc), shown)
        if answer.full:
            return self._deny(namespace, "unrecorded", full_message(namespace), shown)
        if answer.fits:
            log.debug(
                "event=quota_admitted namespace=%s claim=%s uid=%s number=%d memory_mib=%d cores=%d "
                "dry_run=%s",
                namespace,
                shown,
                ask.claim_uid,
                charge.number,
                charge.memory_mib,
                charge.cores,
                ask.dry_run,
            )
            return None
        message = exceeded_message(
            namespace, answer.over, charge, answer.usage, limits, reasons=claim_reasons(request, gpu_mib)
        )
        return self._deny(namespace, answer.over[0], f"ResourceClaim {ask.claim_name}: {message}", shown)

    def _deny(self, namespace: str, reason: Resource | str, message: str, pod: str) -> str:
        log.info(
            "event=quota_denied namespace=%s pod=%s reason=%s message=%r", namespace, pod, reason, message
        )
        if self.denials is not None:
            self.denials.denied(namespace, reason)
        return message


def unknown_namespace_message(namespace: str) -> str:
    """The denial for a namespace the webhook's cache does not hold."""
    return (
        f"namespace {namespace!r} is unknown to the webhook: it does not exist, or it was "
        "created in the last few seconds and the webhook has not seen it yet (then retry)"
    )


def unsized_claim_message(namespace: str) -> str:
    """A claim request names no memory, and no GPU is known to size the whole card it gets."""
    return (
        f"namespace {namespace}: vgpu-memory quota: a request of the ResourceClaim names no memory "
        "(it gets a whole GPU) and no GPU is known to size it, so its charge cannot be computed; "
        "write capacity.requests.memory or wait for a GPU node"
    )


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
