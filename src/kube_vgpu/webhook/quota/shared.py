"""The shared in-flight reservations of one quota namespace, and the decision made against them.

Every webhook replica books the pods it admits into one ConfigMap per quota namespace (in the
release namespace), written with resourceVersion preconditions, so replicas never over-admit
together. This module is the pure part: the object's name, its `data` codec, pruning, and the
decision for a batch of asks against one version of the object plus this replica's cache.
`kube_vgpu.webhook.quota.shared_store` does the I/O.

`data` holds one key per reservation: the pod uid, whose value is `number,memoryMiB,cores,expires`
(expires: Unix seconds on the writer's clock). About 60 bytes each, so 1,000 in flight is ~60 KB
(the API server's limit on an object is 1 MiB; `MAX_ENTRIES` keeps far below it).

A reservation whose pod never appears (a forged review, or a create refused after admission) goes
as soon as a replica can tell the pod was never created, not at `expires`: no create request runs
longer than the API server's request timeout, so once this replica's pod watch has confirmed it was
current more than `NEVER_CREATED_AFTER` seconds after the replica first saw the entry (which is
after the admission), a pod the cache does not show was never created. Each replica judges this on
its own monotonic clock and its own watch (`Sightings`), never from another replica's clock; the
fact it establishes is the same for every replica, so whichever replica first knows may prune.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kube_vgpu.webhook.quota.charge import Charge, Limits, Resource, exceeded

OBJECT_PREFIX = "kube-vgpu-quota-"
# The namespace an object belongs to, on the object: readable by operators, and checked on every
# read, so a (vanishingly unlikely) hash collision fails closed instead of mixing two namespaces.
NAMESPACE_LABEL = "kube-vgpu.io/quota-namespace"
COMPONENT_LABEL = "app.kubernetes.io/component"
OBJECT_COMPONENT = "quota-reservations"  # the COMPONENT_LABEL value of every reservation object
# Far below the 1 MiB object limit (~60 bytes per entry); past it new reservations are refused.
MAX_ENTRIES = 10_000
# kube-apiserver's --request-timeout (default 1m0s): a create request, admission and the storage
# write included, is over within this time of its start, so its pod exists by then or never will.
REQUEST_TIMEOUT_SECONDS = 60.0
# The pod watch hands on an event a moment after the write it reports (the watch cache's delivery,
# a busy event loop); a confirmation this much later than the bound still covers a slow delivery.
WATCH_DELIVERY_SLACK_SECONDS = 5.0
NEVER_CREATED_AFTER = REQUEST_TIMEOUT_SECONDS + WATCH_DELIVERY_SLACK_SECONDS


class Unrecorded(Exception):
    """A decision could not be recorded in the shared object; the message says why (refuse)."""


class SharedStateError(Exception):
    """The shared object cannot be read as reservations (written by something else): fail closed."""


def object_name(namespace: str) -> str:
    """The ConfigMap name for `namespace`: a fixed prefix and a hash, always a valid, short name
    (a namespace name plus a prefix could pass the 63-character label-value limit)."""
    return OBJECT_PREFIX + hashlib.sha256(namespace.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    """One pod's reservation in the shared object."""

    charge: Charge
    expires: int  # Unix seconds


def encode_entry(entry: Entry) -> str:
    """The `data` value of one reservation."""
    c = entry.charge
    return f"{c.number},{c.memory_mib},{c.cores},{entry.expires}"


def decode_entries(obj: Mapping[str, Any] | None, namespace: str) -> dict[str, Entry]:
    """The reservations in a stored object (None: no object yet, no reservations)."""
    if obj is None:
        return {}
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get(NAMESPACE_LABEL) != namespace:
        raise SharedStateError(
            f"{(obj.get('metadata') or {}).get('name')} is labelled {NAMESPACE_LABEL}="
            f"{labels.get(NAMESPACE_LABEL)!r}, not {namespace!r}"
        )
    data = obj.get("data") or {}
    if not isinstance(data, Mapping):
        raise SharedStateError("data is not a map")
    out: dict[str, Entry] = {}
    for uid, value in data.items():
        try:
            number, memory, cores, expires = (int(part) for part in str(value).split(","))
        except ValueError:
            raise SharedStateError(f"entry {uid!r} is not number,memory,cores,expires: {value!r}") from None
        out[str(uid)] = Entry(Charge(number, memory, cores), expires)
    return out


def encode_object(
    namespace: str, release_namespace: str, entries: Mapping[str, Entry], resource_version: str | None
) -> dict[str, Any]:
    """The whole ConfigMap to write; with a resourceVersion it is a precondition (409 when stale)."""
    metadata: dict[str, Any] = {
        "name": object_name(namespace),
        "namespace": release_namespace,
        "labels": {NAMESPACE_LABEL: namespace, COMPONENT_LABEL: OBJECT_COMPONENT},
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {uid: encode_entry(e) for uid, e in entries.items()},
    }


@dataclass(frozen=True)
class CacheState:
    """What this replica's cache says about one namespace at the moment of deciding."""

    # Non-terminal vGPU pods the cache shows (what Kubernetes' quota calls usage).
    pods: Charge
    # Whether the cache accounts for this uid: it shows the pod (counted or terminal) or saw it go.
    accounts_for: Callable[[str], bool]
    # Whether the pod is over for good (deleted or terminal): its reservation can go at once.
    released: Callable[[str], bool]
    # How long the cache has shown the pod, in seconds (None: it has not).
    shown_for: Callable[[str], float | None]
    # When the pod list/watch last confirmed it was current, on this replica's monotonic clock
    # (None: not yet): what `never_created` measures against.
    stream_current_at: float | None = None


def never_created(
    first_seen: float, stream_current_at: float | None, after: float = NEVER_CREATED_AFTER
) -> bool:
    """Whether a reservation known since `first_seen` (monotonic; at or after its admission) is for a
    pod that was never created, provided the cache does not show that pod: the pod watch has been
    confirmed current at least `after` seconds later, past the end of any create it could come from."""
    return stream_current_at is not None and stream_current_at - first_seen >= after


class Sightings:
    """When this replica first saw each shared entry, on its own monotonic clock, per namespace.

    The first sight is at or after the admission (the entry was written during it), so it is a safe
    start for `never_created` without trusting the writer's clock. Only entries still in the object
    are remembered, so memory is bounded by the object.
    """

    def __init__(self) -> None:
        self._first: dict[str, dict[str, float]] = {}

    def note(self, namespace: str, uids: Iterable[str], now: float) -> Mapping[str, float]:
        """Record the uids not seen before as first seen `now`; forget the ones not listed."""
        known = self._first.get(namespace, {})
        first = {uid: known.get(uid, now) for uid in uids}
        self._first[namespace] = first
        return first

    def of(self, namespace: str) -> Mapping[str, float]:
        """The first sightings in `namespace` as last noted."""
        return self._first.get(namespace, {})

    def forget(self, namespace: str) -> None:
        """The namespace was deleted: remember nothing for it."""
        self._first.pop(namespace, None)


@dataclass(frozen=True)
class Ask:
    """One validating review's quota question."""

    uid: str
    charge: Charge
    limits: Limits
    reserve: bool  # False for dry runs: decide, book nothing


@dataclass(frozen=True)
class Answer:
    """The decision for one ask: the resources over quota (none = fits) and the usage it saw."""

    over: tuple[Resource, ...]
    usage: Charge
    full: bool = False  # refused because the shared object holds MAX_ENTRIES already

    @property
    def fits(self) -> bool:
        """Whether the ask fits (and, if it reserves, is now booked)."""
        return not self.over and not self.full


def prune(
    entries: Mapping[str, Entry],
    cache: CacheState,
    now: float,
    lifetime: float,
    first_seen: Mapping[str, float] | None = None,
) -> dict[str, Entry]:
    """The entries still needed: a pod that is gone or terminal frees its entry at once (no replica
    may count it any more), and so does a pod that was never created (`never_created`, from when
    this replica first saw the entry, `first_seen`); any other entry stays until it has expired and
    this replica's cache has shown the pod for longer than `lifetime` (or never)."""
    kept: dict[str, Entry] = {}
    seen = first_seen or {}
    for uid, entry in entries.items():
        if cache.released(uid):
            continue
        first = seen.get(uid)
        if (
            first is not None
            and not cache.accounts_for(uid)
            and never_created(first, cache.stream_current_at)
        ):
            continue
        if now >= entry.expires:
            shown = cache.shown_for(uid)
            if shown is None or shown >= lifetime:
                continue
        kept[uid] = entry
    return kept


def in_flight(
    entries: Mapping[str, Entry],
    cache: CacheState,
    now: float,
    lifetime: float,
    first_seen: Mapping[str, float] | None = None,
) -> Charge:
    """What the entries add to the cache's usage: live ones the cache does not account for."""
    total = Charge()
    for uid, entry in prune(entries, cache, now, lifetime, first_seen).items():
        if not cache.accounts_for(uid):
            total += entry.charge
    return total


def decide(
    entries: Mapping[str, Entry],
    asks: Iterable[Ask],
    cache: CacheState,
    *,
    now: float,
    lifetime: float,
    max_entries: int = MAX_ENTRIES,
    first_seen: Mapping[str, float] | None = None,
) -> tuple[dict[str, Entry], list[Answer]]:
    """The object's next entries and one answer per ask, in order.

    Usage = the cache's pods + every entry the cache does not account for (by uid) + what earlier
    asks of the batch booked. An ask whose uid already has an entry replaces it (one pod counts
    once, however often it is decided).
    """
    kept = prune(entries, cache, now, lifetime, first_seen)
    pending = in_flight(kept, cache, now, lifetime)
    expires = math.ceil(now + lifetime)
    answers: list[Answer] = []
    for ask in asks:
        previous = kept.get(ask.uid)
        counted = previous is not None and not cache.accounts_for(ask.uid)
        usage = cache.pods + pending - (previous.charge if counted and previous else Charge())
        over = tuple(exceeded(ask.charge, usage, ask.limits))
        if over:
            answers.append(Answer(over, usage))
            continue
        if ask.reserve and previous is None and len(kept) >= max_entries:
            answers.append(Answer((), usage, full=True))
            continue
        answers.append(Answer((), usage))
        if ask.reserve:
            kept[ask.uid] = Entry(ask.charge, expires)
            if not cache.accounts_for(ask.uid):
                pending = usage + ask.charge - cache.pods
    return kept, answers


class SharedBook(Protocol):
    """Where asks are decided against the shared reservations (`kube_vgpu.webhook.quota.shared_store`)."""

    async def decide(self, namespace: str, ask: Ask) -> Answer:
        """The answer for `ask`, booked when it fits and reserves; `Unrecorded` when that failed."""
        ...

    def in_flight(self, namespace: str) -> Charge:
        """The shared reservations the cache does not account for yet, as this replica last saw them."""
        ...

    def namespaces(self) -> list[str]:
        """The namespaces this replica remembers a version of the shared object for."""
        ...

    def forget(self, namespace: str) -> None:
        """The namespace was deleted: remember nothing for it, and delete its object."""
        ...

    def namespaces_listed(self, exists: Callable[[str], bool]) -> None:
        """The namespaces were listed: delete the objects of those `exists` does not know."""
        ...
