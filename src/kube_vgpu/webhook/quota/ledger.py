"""Per-namespace GPU usage: the pods the cluster cache shows, plus reviews admitted and not yet seen.

The ledger is the one piece of quota state. The cluster cache feeds it pod events; the quota gate
asks it, in one synchronous call with no await inside, whether a charge fits and, if it does,
books it. Because asyncio runs one callback at a time, that call is atomic with respect to every
other review in the process, so concurrent creates cannot both take the last unit of quota.

What counts, per namespace:

* **Pods.** Every pod the cache shows that asks for a vGPU and is neither terminal (phase
  Succeeded/Failed) nor gone. A terminating pod (deletionTimestamp set) still holds its GPU and
  counts until the cache sees it deleted, or until deletionTimestamp + deletionGracePeriodSeconds
  has passed (Kubernetes' own quota rule, so a pod stuck on a lost node does not hold quota
  forever). A pod's charge is computed once, when the ledger first sees it (for a pod this process
  admitted, the larger of that and its charge at admission), and again only when
  its `volcano.sh/vgpu-ids-new` booking changes: pod resources are immutable, so nothing else can
  change it, and freezing it keeps usage from drifting as the GPU inventory changes.
* **Reservations** (only when no shared book is wired: tests and the pure benchmark; a running
  webhook keeps them in the API, shared by every replica, `webhook.quota_shared`, and asks the
  ledger for `cache_state` instead). Every pod this process admitted (not dryRun) that the cache
  has not shown yet.
  A reservation that no pod claims within `pending_seconds` (a later admission plugin refused the
  pod, or the create failed) stops counting. The service sets it to the cache's staleness bound:
  a reservation cannot lapse while the cache still counts as fresh, and a stale cache refuses
  quota decisions instead (`webhook.validation`). Sooner than that, a reservation goes once the
  pod watch has been confirmed current `NEVER_CREATED_AFTER` seconds past its admission with no
  pod claiming it: no create runs that long, so its pod was never created (a forged review, or a
  create refused later); a pod that was created has been seen, and has claimed it, by then.

Matching a reservation to its pod. Quota is decided in the validating phase, which sees the final
object (facts `apiserver-admission.md` §2), so reservations are keyed by pod uid: the pod the cache
shows claims the reservation of its uid, and a retried decision for one uid replaces the first.
Failing that, a pod claims the reservation made for its exact name, else the oldest made for its
`generateName` (an equal charge first). A reservation for a name replaces an earlier one for it.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import VGPU_IDS_NEW
from kube_vgpu.contract.resources import RequestError, parse_pod
from kube_vgpu.webhook.quota.charge import (
    ZERO,
    Charge,
    GpuMemory,
    Limits,
    Resource,
    SlotSize,
    booked_memory,
    exceeded,
    pod_charge,
    pod_needs_gpu_size,
    restartable_init_flags,
)
from kube_vgpu.webhook.quota.shared import NEVER_CREATED_AFTER, CacheState, never_created

log = logging.getLogger("kube_vgpu.webhook.quota")

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
GpuSizer = Callable[[Mapping[str, Any]], "int | None"]
# A pod -> how its per-vGPU MiB is charged (the MIG slot of a `mig` pod), or None: as asked.
SlotSizer = Callable[[Mapping[str, Any]], "SlotSize | None"]


@dataclass(frozen=True)
class Reservation:
    """A review admitted by this process whose pod the cache has not shown yet."""

    key: str  # the pod uid
    name: str | None
    generate_name: str | None
    charge: Charge
    expires_at: float  # on the ledger's monotonic clock
    admitted_at: float = 0.0  # likewise


@dataclass
class _Pod:
    """What the ledger remembers of one vGPU pod the cache shows."""

    charge: Charge
    booking: str | None  # the vgpu-ids-new value the charge was computed from
    counted: bool
    deadline: float | None = None  # wall-clock time a terminating pod stops counting
    seen_at: float = 0.0  # when the ledger first saw the pod, on its monotonic clock


@dataclass
class _Namespace:
    name: str
    pods: dict[str, _Pod] = field(default_factory=dict)  # by uid
    pods_total: Charge = ZERO
    # By pod uid, oldest first: one expiry period for all, so insertion order is expiry order.
    reservations: dict[str, Reservation] = field(default_factory=dict)
    # Indexes of `reservations`, so matching costs the same with 10 or 10,000 in flight.
    by_name: dict[str, str] = field(default_factory=dict)  # pod name -> reservation key
    by_prefix: dict[str, dict[str, None]] = field(default_factory=dict)  # generateName -> reservation keys
    reserved_total: Charge = ZERO
    deadlines: list[tuple[float, str]] = field(default_factory=list)  # heap of terminating pods


@dataclass(frozen=True)
class Verdict:
    """The ledger's answer to one review: the resources over quota (none = fits) and the usage it saw."""

    over: tuple[Resource, ...]
    usage: Charge

    @property
    def fits(self) -> bool:
        """Whether every limited resource has room for the request."""
        return not self.over


def pod_metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pod's `metadata`, or an empty mapping when it has none (or not an object)."""
    meta = pod.get("metadata")
    # JSON gives a `dict`: a far cheaper check than the Mapping ABC, made for every review and pod event.
    return meta if isinstance(meta, dict) else {}


def _deletion_deadline(meta: Mapping[str, Any]) -> float | None:
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
    """Usage and in-flight reservations per namespace; see the module docstring for the rules.

    `gpu_size(pod)` gives the memory of the largest GPU a pod from the cache could land on (for
    percentages, before the scheduler has booked one); it is consulted once per pod.
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
    ) -> None:
        self._names = names
        # When the cache's pod list/watch last confirmed it was current, on `clock` (None: never).
        self._stream_current_at = stream_current_at
        self._gpu_memory = gpu_memory
        self.slot_size: SlotSizer = slot_size or (lambda pod: None)
        self._pending = pending_seconds
        self._gpu_size = gpu_size or (lambda pod: None)
        self._clock = clock
        self._wall = wall_clock
        self._namespaces: dict[str, _Namespace] = {}
        # Pods the cache saw deleted, by uid (oldest first), kept for two reservation lifetimes so
        # that a shared reservation of a deleted pod is never counted (`cache_state`).
        self._gone: dict[str, float] = {}

    # -- the review side -------------------------------------------------------------------------

    def try_reserve(
        self,
        namespace: str,
        charge: Charge,
        limits: Limits,
        *,
        key: str,
        name: str | None,
        generate_name: str | None,
        dry_run: bool,
    ) -> Verdict:
        """Check `charge` against `limits` and, when it fits and this is not a dry run, book it.

        Synchronous on purpose: check and book happen with no await between them.
        """
        ns = self._namespace(namespace)
        self._expire(ns)
        replaced = ns.reservations.get(key)
        if replaced is None and name and name in ns.by_name:
            replaced = ns.reservations[ns.by_name[name]]
        usage = ns.pods_total + ns.reserved_total
        if replaced is not None:
            usage -= replaced.charge
        verdict = Verdict(tuple(exceeded(charge, usage, limits)), usage)
        if verdict.fits and not dry_run:
            now = self._clock()
            if replaced is not None:
                self._drop_reservation(ns, replaced)
            self._add_reservation(
                ns,
                Reservation(
                    key, name or None, generate_name or None, charge, now + self._pending, admitted_at=now
                ),
            )
        self._forget_if_empty(ns)
        return verdict

    def usage(self, namespace: str) -> Charge:
        """Pods plus live reservations, as the next review would see them."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return ZERO
        self._expire(ns)
        return ns.pods_total + ns.reserved_total

    def reserved(self, namespace: str) -> Charge:
        """The live reservations alone (reviews admitted here and not yet in the cache)."""
        ns = self._namespaces.get(namespace)
        if ns is None:
            return ZERO
        self._expire(ns)
        return ns.reserved_total

    def namespaces(self) -> list[str]:
        """Every namespace the ledger holds anything for."""
        return list(self._namespaces)

    def forget(self, namespace: str) -> None:
        """Drop all a deleted namespace's state (its pods are gone with it)."""
        self._namespaces.pop(namespace, None)

    # -- the cache side --------------------------------------------------------------------------

    def pod_seen(self, pod: Mapping[str, Any]) -> None:
        """A pod was added or modified in the cache."""
        meta = pod_metadata(pod)
        namespace, uid = meta.get("namespace"), meta.get("uid")
        if not isinstance(namespace, str) or not isinstance(uid, str):
            return
        ns = self._namespaces.get(namespace)
        previous = ns.pods.get(uid) if ns is not None else None
        entry = self._entry(pod, previous)
        if entry is None:
            return
        ns = self._namespace(namespace)
        entry.seen_at = previous.seen_at if previous is not None else self._clock()
        if previous is None:
            claimed = self._claim(ns, meta, entry.charge)
            if claimed is not None and entry.booking is None:
                # Sized at admission against the inventory of that moment: keep that figure when
                # it is the larger, so retiring the reservation never lowers usage by itself
                # (the scheduler's booking settles it); a pod that could not be sized at
                # admission (no GPU known) takes today's size.
                entry.charge = entry.charge.max(claimed.charge)
        else:
            self._uncount(ns, uid)
        ns.pods[uid] = entry
        if entry.counted:
            ns.pods_total += entry.charge
            if entry.deadline is not None and (previous is None or previous.deadline != entry.deadline):
                heapq.heappush(ns.deadlines, (entry.deadline, uid))

    def pod_gone(self, pod: Mapping[str, Any]) -> None:
        """A pod was deleted from the cache: its share is free at once."""
        meta = pod_metadata(pod)
        namespace, uid = meta.get("namespace"), meta.get("uid")
        ns = self._namespaces.get(namespace) if isinstance(namespace, str) else None
        if ns is None or not isinstance(uid, str) or uid not in ns.pods:
            return
        self._uncount(ns, uid)
        del ns.pods[uid]
        self._gone[uid] = self._clock()
        self._forget_if_empty(ns)

    def resync(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """The cache re-listed: `pods` is now every pod. Known pods keep their charge."""
        listed: dict[str, set[str]] = {}
        for pod in pods:
            meta = pod_metadata(pod)
            namespace, uid = meta.get("namespace"), meta.get("uid")
            if isinstance(namespace, str) and isinstance(uid, str):
                listed.setdefault(namespace, set()).add(uid)
                self.pod_seen(pod)
        for ns in list(self._namespaces.values()):
            present = listed.get(ns.name, set())
            for uid in [u for u in ns.pods if u not in present]:
                self._uncount(ns, uid)
                del ns.pods[uid]
                self._gone[uid] = self._clock()
            self._forget_if_empty(ns)

    def cache_state(self, namespace: str) -> CacheState:
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

        return CacheState(
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
        if not ns.pods and not ns.reservations:
            self._namespaces.pop(ns.name, None)

    def _entry(self, pod: Mapping[str, Any], previous: _Pod | None) -> _Pod | None:
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
        if previous is not None and previous.booking == booking:
            return _Pod(previous.charge, booking, counted, deadline)
        try:
            request = parse_pod(pod, self._names)
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
        # A mig booking records the MiB asked, not the slot the card gives: a share of a card
        # needs the card's size to find its slot even once booked (`container_charge`).
        if unsized or (slot is not None and pod_needs_gpu_size(request)):
            gpu_mib = self._gpu_size(pod)
            if gpu_mib is None:
                if unsized:
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
        return _Pod(charge, booking, counted, deadline)

    def _uncount(self, ns: _Namespace, uid: str) -> None:
        entry = ns.pods.get(uid)
        if entry is not None and entry.counted:
            ns.pods_total -= entry.charge
            entry.counted = False

    def _claim(self, ns: _Namespace, meta: Mapping[str, Any], charge: Charge) -> Reservation | None:
        """Retire the reservation this newly seen pod was admitted under, if this process holds it."""
        if not ns.reservations:
            return None
        self._expire(ns)
        name = meta.get("name")
        generate_name = meta.get("generateName")
        match = ns.reservations.get(str(meta.get("uid")))
        if match is None and isinstance(name, str) and name in ns.by_name:
            match = ns.reservations[ns.by_name[name]]
        if (
            match is None
            and isinstance(generate_name, str)
            and generate_name
            and isinstance(name, str)
            and name.startswith(generate_name)
        ):
            candidates = [ns.reservations[uid] for uid in ns.by_prefix.get(generate_name, ())]
            match = next((r for r in candidates if r.charge == charge), None) or next(iter(candidates), None)
        if match is not None:
            self._drop_reservation(ns, match)
        return match

    def _add_reservation(self, ns: _Namespace, reservation: Reservation) -> None:
        ns.reservations[reservation.key] = reservation
        ns.reserved_total += reservation.charge
        if reservation.name is not None:
            ns.by_name[reservation.name] = reservation.key
        elif reservation.generate_name is not None:
            ns.by_prefix.setdefault(reservation.generate_name, {})[reservation.key] = None

    def _drop_reservation(self, ns: _Namespace, reservation: Reservation) -> None:
        del ns.reservations[reservation.key]
        ns.reserved_total -= reservation.charge
        if reservation.name is not None:
            ns.by_name.pop(reservation.name, None)
        elif reservation.generate_name is not None:
            uids = ns.by_prefix.get(reservation.generate_name)
            if uids is not None:
                uids.pop(reservation.key, None)
                if not uids:
                    del ns.by_prefix[reservation.generate_name]

    def _expire(self, ns: _Namespace) -> None:
        """Drop reservations past their time or whose pod was never created, and terminating pods
        past their grace period. Reservations are in admission order, so both are a prefix."""
        now = self._clock()
        current = self._stream_current_at() if ns.reservations else None
        while ns.reservations:
            oldest = next(iter(ns.reservations.values()))
            if never_created(oldest.admitted_at, current, NEVER_CREATED_AFTER):
                detail = "the pod watch has passed the admission by more than a create can take"
            elif oldest.expires_at <= now:
                detail = "admitted pod never appeared in the cache"
            else:
                break
            self._drop_reservation(ns, oldest)
            log.info(
                "event=quota_reservation_expired namespace=%s pod_uid=%s pod=%s detail=%s",
                ns.name,
                oldest.key,
                oldest.name or f"{oldest.generate_name or ''}*",
                detail,
            )
        if ns.deadlines:
            wall = self._wall()
            while ns.deadlines and ns.deadlines[0][0] <= wall:
                deadline, uid = heapq.heappop(ns.deadlines)
                entry = ns.pods.get(uid)
                if entry is not None and entry.deadline == deadline:
                    self._uncount(ns, uid)
