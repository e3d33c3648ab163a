"""The shared in-flight reservations of one quota namespace, and the decision made against them.

Every webhook replica books the pods it admits into one ConfigMap per quota namespace (in the
release namespace), written with resourceVersion preconditions, so replicas never over-admit
together (SPEC §2.2 step 1; facts `apiserver-admission.md` §2). This module is the pure part: the
object's name, its `data` codec, pruning, and the decision for a batch of asks against one version
of the object plus this replica's cache. `webhook.quota_shared_store` does the I/O.

`data` holds one key per reservation: the pod uid, whose value is `number,memoryMiB,cores,expires`
(expires: Unix seconds on the writer's clock). About 60 bytes each, so 1,000 in flight is ~60 KB
(the API server's limit on an object is 1 MiB; `MAX_ENTRIES` keeps far below it).
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
# Far below the 1 MiB object limit (~60 bytes per entry); past it new reservations are refused.
MAX_ENTRIES = 10_000


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
        "labels": {NAMESPACE_LABEL: namespace, COMPONENT_LABEL: "quota-reservations"},
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


@dataclass(frozen=True)
class Ask:
    """One validating review's quota question."""

    uid: str
    charge: Charge
    limits: Limits
    reserve: bool  # False for dry runs and for a name that already exists: decide, book nothing


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


def prune(entries: Mapping[str, Entry], cache: CacheState, now: float, lifetime: float) -> dict[str, Entry]:
    """The entries still needed: a pod that is gone or terminal frees its entry at once (no replica
    may count it any more); any other entry stays until it has expired and this replica's cache has
    shown the pod for longer than `lifetime` (or never: the pod was never created)."""
    kept: dict[str, Entry] = {}
    for uid, entry in entries.items():
        if cache.released(uid):
            continue
        if now >= entry.expires:
            shown = cache.shown_for(uid)
            if shown is None or shown >= lifetime:
                continue
        kept[uid] = entry
    return kept


def in_flight(entries: Mapping[str, Entry], cache: CacheState, now: float, lifetime: float) -> Charge:
    """What the entries add to the cache's usage: live ones the cache does not account for."""
    total = Charge()
    for uid, entry in prune(entries, cache, now, lifetime).items():
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
) -> tuple[dict[str, Entry], list[Answer]]:
    """The object's next entries and one answer per ask, in order.

    Usage = the cache's pods + every entry the cache does not account for (by uid) + what earlier
    asks of the batch booked. An ask whose uid already has an entry replaces it (one pod counts
    once, however often it is decided).
    """
    kept = prune(entries, cache, now, lifetime)
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
    """Where asks are decided against the shared reservations (`webhook.quota_shared_store`)."""

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
        """The namespace was deleted: remember nothing for it."""
        ...
