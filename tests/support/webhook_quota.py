"""Builders the quota tests share: pods as admission and the cache see them, and the production quota
path (ledger and shared reservations over an in-memory store) on hand-moved clocks.

It holds no tests; it is named like a test module so it lives among the quota's test files.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.admission.gates import QuotaRequest
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.ledger import QuotaLedger
from kube_vgpu.webhook.quota.shared import MAX_ENTRIES, NamespaceSnapshot
from kube_vgpu.webhook.quota.shared_store import SharedReservations
from kube_vgpu.webhook.records import PodRecord
from tests.support.memory_store import MemoryStore

NAMES = ResourceNames()
PENDING = 60.0
RELEASE = "kube-vgpu"
_uids = itertools.count()


@dataclass
class Clocks:
    """Both clocks the gate reads, moved by hand."""

    mono: float = 1000.0
    wall: float = 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def make_pod(
    memory: int | None = 1024,
    *,
    number: int | None = None,
    percent: int | None = None,
    cores: int | None = None,
    name: str | None = None,
    generate_name: str | None = None,
    namespace: str = "team-a",
    uid: str | None = None,
    phase: str | None = None,
    annotations: Mapping[str, str] | None = None,
    deletion: tuple[str, int] | None = None,
) -> PodRecord:
    """A one-container pod as admission sees it: vGPU limits, and the metadata asked for."""
    limits = {
        key: str(value)
        for key, value in (
            (NAMES.count, number),
            (NAMES.memory, memory),
            (NAMES.memory_percentage, percent),
            (NAMES.cores, cores),
        )
        if value is not None
    }
    meta: dict[str, Any] = {"namespace": namespace, "annotations": dict(annotations or {})}
    if name is not None:
        meta["name"] = name
    if generate_name is not None:
        meta["generateName"] = generate_name
    if uid is not None:
        meta["uid"] = uid
    if deletion is not None:
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = deletion
    p: dict[str, Any] = {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    if phase is not None:
        p["status"] = {"phase": phase}
    return cast(PodRecord, p)


def in_cache(p: PodRecord, *, name: str | None = None) -> PodRecord:
    """The pod as the cache shows it once created: with a uid, and a name picked from generateName."""
    meta = dict(p["metadata"])
    meta["uid"] = meta.get("uid") or f"uid-{next(_uids)}"
    meta["name"] = name or meta.get("name") or f"{meta.get('generateName', 'p-')}{next(_uids):05d}"
    return cast(PodRecord, {**p, "metadata": meta})


def make_gate(
    clocks: Clocks | None = None,
    *,
    store: MemoryStore | None = None,
    pending_seconds: float = PENDING,
    max_entries: int = MAX_ENTRIES,
    **kwargs: Any,
) -> NamespaceQuota:
    """The production quota path (ledger and shared reservations) on `clocks` (fresh ones when not
    given) over an in-memory store; `kwargs` go to the ledger (sizers, `stream_current_at`)."""
    clocks = clocks or Clocks()
    ledger = QuotaLedger(
        names=NAMES,
        pending_seconds=pending_seconds,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
        **kwargs,
    )
    book = SharedReservations(
        store or MemoryStore(),
        RELEASE,
        lifetime_seconds=pending_seconds,
        cache_state=ledger.cache_state,
        wall_clock=lambda: clocks.wall,
        clock=lambda: clocks.mono,
        max_entries=max_entries,
    )
    return NamespaceQuota(ledger, book)


def memory_book(
    store: MemoryStore | None = None, lifetime_seconds: float = PENDING
) -> Callable[[Callable[[str], NamespaceSnapshot]], SharedReservations]:
    """A `build_quota` book: the shared reservations over an in-memory store (a fresh one when not given)."""

    def book(cache_state: Callable[[str], NamespaceSnapshot]) -> SharedReservations:
        return SharedReservations(
            store or MemoryStore(), RELEASE, lifetime_seconds=lifetime_seconds, cache_state=cache_state
        )

    return book


def request_for(
    p: PodRecord,
    labels: Mapping[str, str] | None,
    *,
    gpu: int | None = 81920,
    dry_run: bool = False,
    review: str | None = None,
) -> QuotaRequest:
    """The quota question the validating phase asks for `p` (`review`: its uid)."""
    return QuotaRequest(
        namespace=p["metadata"]["namespace"],
        namespace_labels=labels,
        pod=p,
        request=parse_pod(p, NAMES),
        largest_gpu_mib=gpu,
        pod_uid=review or p["metadata"].get("uid") or f"review-{next(_uids)}",
        dry_run=dry_run,
    )


async def close(gate: NamespaceQuota) -> None:
    """Stop the book's writers and sweep (what the webhook does at exit)."""
    book = gate.book
    assert isinstance(book, SharedReservations)
    await book.close()


def admit(
    gate: NamespaceQuota,
    p: PodRecord,
    labels: Mapping[str, str] | None,
    *,
    gpu: int | None = 81920,
    dry_run: bool = False,
    review: str | None = None,
) -> str | None:
    """One review of `p` through the gate, as the admission pipeline calls it, on a loop of its own."""

    async def once() -> str | None:
        try:
            return await gate.admit(request_for(p, labels, gpu=gpu, dry_run=dry_run, review=review))
        finally:
            await close(gate)

    return asyncio.run(once())


MEM_80G = {QUOTA_MEMORY_LABEL: "81920"}
