"""Per-namespace GPU usage: the vGPU pods the cluster cache shows, as the quota counts them.

The cluster cache feeds the ledger pod events; the quota gate reads a namespace's usage from it and
decides against that plus the reservations every replica shares (`kube_vgpu.webhook.quota.shared`,
through `cache_state`). `kube-vgpu top` counts a namespace's pods with the same ledger, so what it
shows is what the next review is decided against.

What counts, per namespace: every pod the cache shows that asks for a vGPU and is neither terminal
(phase Succeeded/Failed) nor gone. A terminating pod (deletionTimestamp set) still holds its GPU and
counts until the cache sees it deleted, or until deletionTimestamp + deletionGracePeriodSeconds has
passed (Kubernetes' own quota rule, pkg/quota/v1/evaluator/core/pods.go `QuotaV1Pod`, so a pod
stuck on a lost node does not hold quota forever). A pod's charge is computed once, when the ledger
first sees it, and again only when its `volcano.sh/vgpu-ids-new` booking changes: pod resources are
immutable, so nothing else can change it, and freezing it keeps usage from drifting as the GPU
inventory changes.

ResourceClaims of kube-vgpu's DRA classes count the same way, keyed by their uid beside the pods
(`claim_seen`, `claim_gone`, `resync_claims`): from the moment the cache shows one until it is
deleted, charged once by `kube_vgpu.webhook.quota.claims` (a claim's spec is immutable). A pod that
uses such a claim asks for no vGPU in its limits, so it is not charged again.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import VGPU_IDS_NEW
from kube_vgpu.contract.resources import RequestError, parse_pod
from kube_vgpu.webhook.quota.charge import (
    ZERO,
    Charge,
    GpuMemory,
    SlotSize,
    booked_memory,
    pod_charge,
    pod_needs_gpu_size,
    restartable_init_flags,
)
from kube_vgpu.webhook.quota.claims import ClaimError, ClaimRequest, claim_charge, names_class, parse_claim
from kube_vgpu.webhook.quota.shared import NamespaceSnapshot
from kube_vgpu.webhook.records import ClaimMetadata, ClaimRecord, PodMetadata, PodRecord

log = logging.getLogger("kube_vgpu.webhook.quota")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GpuSizer = Callable[[PodRecord], "int | None"]
# A pod -> how its per-vGPU MiB is charged (the MIG slot of a `mig` pod), or None: as asked.
SlotSizer = Callable[[PodRecord], "SlotSize | None"]
_Counted = TypeVar("_Counted", PodRecord, ClaimRecord)


@dataclass
class _Pod:
    """What the ledger remembers of one vGPU pod the cache shows."""

    charge: Charge
    booking: str | None  # the vgpu-ids-new value the charge was computed from
    counted: bool
    deadline: float | None = None  # wall-clock time a terminating pod stops counting
    seen_at: float = 0.0  # when the ledger first saw the pod, on its monotonic clock
    name: str = ""
    unsized: bool = False  # a share of a card no known GPU could size: counted without its memory
    claim: bool = False  # a ResourceClaim, not a pod
    # A claim with a request naming no memory: what it asks (re-sized when a larger GPU appears).
    claim_request: ClaimRequest | None = None
    sized_with: int | None = None  # the GPU size such a claim was charged by


@dataclass
class _Namespace:
    name: str
    pods: dict[str, _Pod] = field(default_factory=dict)  # by uid
    pods_total: Charge = ZERO
    deadlines: list[tuple[float, str]] = field(default_factory=list)  # heap of terminating pods


def pod_metadata(pod: PodRecord) -> PodMetadata:
    """A pod's `metadata`, or an empty mapping when it has none (or not an object)."""
    meta = pod.get("metadata")
    # JSON gives a `dict`: a far cheaper check than the Mapping ABC, made for every review and pod event.
    return meta if isinstance(meta, dict) else {}


def claim_metadata(claim: ClaimRecord) -> ClaimMetadata:
    """A claim's `metadata`, or an empty mapping when it has none (or not an object)."""
    meta = claim.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _deletion_deadline(meta: PodMetadata) -> float | None:
    stamp = meta.get("deletionTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        deleted_at = datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None
    grace = meta.get("deletionGracePeriodSeconds")
    return deleted_at + (grace if isinstance(grace, int) and not isinstance(grace, bool) else 0)


class QuotaLedger:
    """Usage per namespace from the cache's pods; see the module docstring for the rules.

    `gpu_size(pod)` gives the memory of the largest GPU a pod from the cache could land on (for
    percentages, before the scheduler has booked one); it is consulted once per pod.
    `pending_seconds` is the lifetime of a shared reservation: a deleted pod is remembered for two
    of them, so that a reservation of a deleted pod is never counted (`cache_state`).
    """

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
        claim_classes: frozenset[str] = frozenset(),
        largest_gpu: Callable[[], int | None] = lambda: None,
    ) -> None:
        # The DeviceClasses whose ResourceClaims count, and the largest GPU a claim could get.
        self.claim_classes = claim_classes
        self.largest_gpu = largest_gpu
        self.names = names
        # When the cache's pod list/watch last confirmed it was current, on `clock` (None: never).
        self._stream_current_at = stream_current_at
        self._gpu_memory = gpu_memory
        self.slot_size: SlotSizer = slot_size or (lambda pod: None)
        self._pending = pending_seconds
        self._gpu_size = gpu_size or (lambda pod: None)
        self._clock = clock
        self._wall = wall_clock
        self._namespaces: dict[str, _Namespace] = {}
        # Pods the cache saw deleted, by uid (oldest first).
        self._gone: dict[str, float] = {}

    def usage(self, namespace: str) -> Charge:
        """The namespace's counted pods."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return ZERO
        self._expire(ns)
        return ns.pods_total

    def pods(self, namespace: str) -> list[str]:
        """The names of the namespace's counted pods."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return []
        self._expire(ns)
        return sorted(p.name for p in ns.pods.values() if p.counted)

    def unsized(self, namespace: str) -> list[str]:
        """The names of the counted pods no known GPU could size (counted without their memory)."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return []
        self._expire(ns)
        return sorted(p.name for p in ns.pods.values() if p.counted and p.unsized)

    def namespaces(self) -> list[str]:
        """Every namespace the ledger holds a pod for."""
        return list(self._namespaces)

    def forget(self, namespace: str) -> None:
        """Drop all a deleted namespace's state (its pods are gone with it)."""
        self._namespaces.pop(namespace, None)

    # -- the cache side --------------------------------------------------------------------------

    def pod_seen(self, pod: PodRecord, *, size_again: bool = False) -> None:
        """A pod was added or modified in the cache. A pod keeps the charge it was first given until
        the scheduler books it; with `size_again` it is sized anew against today's GPUs."""
        meta = pod_metadata(pod)
        namespace, uid = meta.get("namespace"), meta.get("uid")
        if not isinstance(namespace, str) or not isinstance(uid, str):
            return
        ns = self._namespaces.get(namespace)
        previous = ns.pods.get(uid) if ns is not None else None
        entry = self._entry(pod, None if size_again else previous)
        if entry is None:
            return
        ns = self._namespace(namespace)
        entry.seen_at = previous.seen_at if previous is not None else self._clock()
        if previous is not None:
            self._uncount(ns, uid)
        ns.pods[uid] = entry
        if entry.counted:
            ns.pods_total += entry.charge
            if entry.deadline is not None and (previous is None or previous.deadline != entry.deadline):
                heapq.heappush(ns.deadlines, (entry.deadline, uid))

    def pod_gone(self, pod: PodRecord) -> None:
        """A pod was deleted from the cache: its share is free at once."""
        meta = pod_metadata(pod)
        self._gone_from_cache(meta.get("namespace"), meta.get("uid"))

    def _gone_from_cache(self, namespace: str | None, uid: str | None) -> None:
        ns = self._namespaces.get(namespace) if isinstance(namespace, str) else None
        if ns is None or not isinstance(uid, str) or uid not in ns.pods:
            return
        self._uncount(ns, uid)
        del ns.pods[uid]
        self._gone[uid] = self._clock()
        self._forget_if_empty(ns)

    def resync(self, pods: Iterable[PodRecord]) -> None:
        """The cache re-listed: `pods` is now every pod. Known pods keep their charge."""
        self._resync(pods, self.pod_seen, claims=False)

    def _resync(self, objects: Iterable[_Counted], seen: Callable[[_Counted], None], *, claims: bool) -> None:
        listed: dict[str, set[str]] = {}
        for obj in objects:
            meta = obj.get("metadata")
            meta = meta if isinstance(meta, dict) else {}
            namespace, uid = meta.get("namespace"), meta.get("uid")
            if isinstance(namespace, str) and isinstance(uid, str):
                listed.setdefault(namespace, set()).add(uid)
                seen(obj)
        self._drop_unlisted(listed, claims=claims)

    def _drop_unlisted(self, listed: Mapping[str, set[str]], *, claims: bool) -> None:
        for ns in list(self._namespaces.values()):
            present = listed.get(ns.name, set())
            for uid in [u for u, p in ns.pods.items() if p.claim == claims and u not in present]:
                self._uncount(ns, uid)
                del ns.pods[uid]
                self._gone[uid] = self._clock()
            self._forget_if_empty(ns)

    def size_again(self, pods: Iterable[PodRecord]) -> None:
        """The GPUs the ledger sizes shares and MIG slots against became known (the cache's first
        node list may land after its pods): size every pod again, as if first seen. Without this a
        pod listed before the nodes would count without its share's memory, or its MIG request
        without its slot, until the scheduler booked it."""
        for pod in pods:
            self.pod_seen(pod, size_again=True)

    def claim_seen(self, claim: ClaimRecord) -> None:
        """A ResourceClaim was added or modified in the cache: counted until it is deleted."""
        meta = claim_metadata(claim)
        namespace, uid = meta.get("namespace"), meta.get("uid")
        if not isinstance(namespace, str) or not isinstance(uid, str):
            return
        ns = self._namespaces.get(namespace)
        previous = ns.pods.get(uid) if ns is not None else None
        if previous is not None or not names_class(claim, self.claim_classes):
            return  # a claim's spec is immutable: its charge never changes
        try:
            # Stored: the API server admitted its admin requests, if any, only in a namespace
            # labelled for them (the webhook charged them at CREATE where its cache lacked the label).
            request = parse_claim(claim, self.claim_classes, admin_free=True)
        except ClaimError as exc:
            # Only claims that bypassed admission can be malformed; the scheduler allocates none.
            log.warning(
                "event=quota_claim_unreadable namespace=%s claim=%s reason=%r",
                namespace,
                meta.get("name"),
                str(exc),
            )
            return
        if not request.asks_vgpu:
            return
        gpu_mib = self.largest_gpu() if request.needs_gpu_size else None
        ns = self._namespace(namespace)
        entry = _Pod(
            claim_charge(request, gpu_mib),
            None,
            True,
            name=f"resourceclaim/{meta.get('name') or ''}",
            unsized=request.needs_gpu_size and gpu_mib is None,
            claim=True,
            seen_at=self._clock(),
            claim_request=request if request.needs_gpu_size else None,
            sized_with=gpu_mib,
        )
        ns.pods[uid] = entry
        ns.pods_total += entry.charge

    def resize_claims(self) -> None:
        """A GPU may have joined: a claim charged a whole card is charged the largest GPU now known
        when that is larger (never less: it may get that card). The cache calls it on slice and node
        changes, so the order in which kinds are first listed does not matter."""
        largest = self.largest_gpu()
        if largest is None:
            return
        for ns in self._namespaces.values():
            for entry in ns.pods.values():
                request = entry.claim_request
                if request is None or (entry.sized_with is not None and entry.sized_with >= largest):
                    continue
                charge = claim_charge(request, largest)
                if entry.counted:
                    ns.pods_total += charge - entry.charge
                entry.charge, entry.sized_with, entry.unsized = charge, largest, False

    def claim_gone(self, claim: ClaimRecord) -> None:
        """A ResourceClaim was deleted from the cache: its share is free at once."""
        meta = claim_metadata(claim)
        self._gone_from_cache(meta.get("namespace"), meta.get("uid"))

    def resync_claims(self, claims: Iterable[ClaimRecord]) -> None:
        """The cache re-listed ResourceClaims: `claims` is now every claim. Known claims keep their charge."""
        self._resync(claims, self.claim_seen, claims=True)

    def cache_state(self, namespace: str) -> NamespaceSnapshot:
        """What the cache says about `namespace` for a decision against shared reservations."""
        now = self._clock()
        while self._gone:
            uid, at = next(iter(self._gone.items()))
            if now - at < 2 * self._pending:
                break
            del self._gone[uid]
        ns = self._namespaces.get(namespace)
        if ns is not None:
            self._expire(ns)
        pods = ns.pods if ns is not None else {}
        gone = self._gone

        def accounts_for(uid: str) -> bool:
            return uid in pods or uid in gone

        def released(uid: str) -> bool:
            pod = pods.get(uid)
            return uid in gone or (pod is not None and not pod.counted)

        def shown_for(uid: str) -> float | None:
            pod = pods.get(uid)
            return None if pod is None else now - pod.seen_at

        return NamespaceSnapshot(
            pods=ns.pods_total if ns is not None else ZERO,
            accounts_for=accounts_for,
            released=released,
            shown_for=shown_for,
            stream_current_at=self._stream_current_at(),
        )

    # -- internals -------------------------------------------------------------------------------

    def _namespace(self, namespace: str) -> _Namespace:
        ns = self._namespaces.get(namespace)
        if ns is None:
            ns = self._namespaces[namespace] = _Namespace(namespace)
        return ns

    def _forget_if_empty(self, ns: _Namespace) -> None:
        if not ns.pods:
            self._namespaces.pop(ns.name, None)

    def _entry(self, pod: PodRecord, previous: _Pod | None) -> _Pod | None:
        """The ledger's record of a pod, or None when it asks for no vGPU (or cannot be read)."""
        meta = pod_metadata(pod)
        annotations = meta.get("annotations")
        booking = annotations.get(VGPU_IDS_NEW) if isinstance(annotations, Mapping) else None
        booking = booking if isinstance(booking, str) and booking else None
        status = pod.get("status")
        phase = status.get("phase") if isinstance(status, Mapping) else None
        counted = phase not in TERMINAL_PHASES
        deadline = _deletion_deadline(meta)
        if deadline is not None and deadline <= self._wall():
            counted = False
        name = str(meta.get("name") or "")
        if previous is not None and previous.booking == booking:
            return _Pod(previous.charge, booking, counted, deadline, name=name, unsized=previous.unsized)
        try:
            request = parse_pod(pod, self.names)
        except RequestError as exc:
            # Only pods that bypassed admission can be malformed; they get no GPU either.
            log.warning(
                "event=quota_pod_unreadable namespace=%s pod=%s reason=%r",
                meta.get("namespace"),
                meta.get("name"),
                str(exc),
            )
            return None
        if not request.asks_vgpu:
            return None
        booked = booked_memory(pod, request, self._gpu_memory)
        slot = self.slot_size(pod)
        unsized = pod_needs_gpu_size(request, booked)
        gpu_mib = None
        sized = True
        # A mig booking records the MiB asked, not the slot the card gives: a share of a card
        # needs the card's size to find its slot even once booked (`container_charge`).
        if unsized or (slot is not None and pod_needs_gpu_size(request)):
            gpu_mib = self._gpu_size(pod)
            if gpu_mib is None:
                if unsized:
                    sized = False
                    log.info(
                        "event=quota_pod_unsized namespace=%s pod=%s detail=%s",
                        meta.get("namespace"),
                        meta.get("name"),
                        "no GPU known to size its memory share; counted without that memory",
                    )
                gpu_mib = 0
        charge = pod_charge(
            request,
            gpu_mib=gpu_mib,
            sidecars=restartable_init_flags(pod),
            booked_mib=booked,
            slot=slot,
        )
        return _Pod(charge, booking, counted, deadline, name=name, unsized=not sized)

    def _uncount(self, ns: _Namespace, uid: str) -> None:
        entry = ns.pods.get(uid)
        if entry is not None and entry.counted:
            ns.pods_total -= entry.charge
            entry.counted = False

    def _expire(self, ns: _Namespace) -> None:
        """Stop counting terminating pods past their grace period (a heap, soonest first)."""
        if ns.deadlines:
            wall = self._wall()
            while ns.deadlines and ns.deadlines[0][0] <= wall:
                deadline, uid = heapq.heappop(ns.deadlines)
                entry = ns.pods.get(uid)
                if entry is not None and entry.deadline == deadline:
                    self._uncount(ns, uid)
