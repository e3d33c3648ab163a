"""The I/O edge of shared quota reservations: read, decide, write with a precondition, retry.

One writer per quota namespace in each replica: reviews that arrive while a write is in flight wait
and are decided together in the next write (group commit), so a burst costs a few writes, not one
per pod, and a replica never races itself. A write carries the resourceVersion it was decided
against; a 409 Conflict (another replica wrote first) re-reads and decides again, a bounded number
of times within `budget_seconds`. Anything else (API slow, unreachable, refusing) refuses the
reviews with a message saying why: the API server retries (failurePolicy Fail); nothing is ever
admitted that was not booked.

Entries this replica can drop (their pod never created, gone, or expired) leave the object at the
next write; so that they leave it even when this replica decides nothing more for the namespace,
a sweep every `sweep_seconds` writes the pruned object for each namespace where pruning changes
it. The replica that admitted a review saw its entry first, so that entry's release never waits
for another replica to have watched it for long enough.

A namespace's object is deleted with the namespace (each replica tries; the first wins), and at
each list of namespaces (start, relist) the objects of namespaces deleted meanwhile are deleted
too, so the release namespace does not collect one ConfigMap for every namespace that ever had a
quota. A deletion carries the resourceVersion it read: an object written since, by a namespace
created again under the same name, stays.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube_vgpu.kubeapi.client import ApiError, Kind, KubeError
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.shared import (
    COMPONENT_LABEL,
    MAX_ENTRIES,
    NAMESPACE_LABEL,
    OBJECT_COMPONENT,
    Answer,
    Ask,
    CacheState,
    SharedStateError,
    Sightings,
    Unrecorded,
    decide,
    decode_entries,
    encode_object,
    in_flight,
    object_name,
    prune,
)

log = logging.getLogger("kube_vgpu.webhook.quota")

# Within the API server's default webhook timeout (5 s), with room for the rest of the review.
BUDGET_SECONDS = 3.5
# Conflicts one batch may meet before it is refused; the budget above bounds the time anyway.
MAX_CONFLICTS = 64
# After a conflict, wait a random time up to this (doubling per conflict, capped), so that writers
# that keep meeting stop retrying in lockstep and the one that just won does not always win again.
BACKOFF_SECONDS = 0.002
BACKOFF_CAP_SECONDS = 0.05
CALL_TIMEOUT = (1.0, 2.5)  # (connect, read) seconds per API call
# How often each namespace's last-seen object is checked for entries that can go (see the docstring).
SWEEP_SECONDS = 5.0
# Objects read per page when looking for those of deleted namespaces.
ORPHAN_PAGE = 500


Timeout = float | tuple[float, float] | None


class ObjectApi(Protocol):
    """The API calls the shared reservations make, with `kube_vgpu.kubeapi.client.Kube`'s contract:
    `get` answers None for a missing object; `create` of an existing name raises ApiError 409;
    `replace` with a stale `metadata.resourceVersion` raises 409 and of a missing object 404;
    `delete` with a stale `resource_version` raises 409 and answers whether the object existed."""

    def get(
        self, kind: Kind, name: str, *, namespace: str | None = None, timeout: Timeout = None
    ) -> dict[str, Any] | None:
        """The object, or None."""
        ...

    def create(
        self, kind: Kind, body: Mapping[str, Any], *, namespace: str | None = None, timeout: Timeout = None
    ) -> dict[str, Any]:
        """The object as stored."""
        ...

    def replace(
        self,
        kind: Kind,
        name: str,
        body: Mapping[str, Any],
        *,
        namespace: str | None = None,
        timeout: Timeout = None,
    ) -> dict[str, Any]:
        """The object as stored."""
        ...

    def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        timeout: Timeout = None,
    ) -> bool:
        """Whether the object existed."""
        ...

    def list(
        self,
        kind: Kind,
        *,
        namespace: str | None,
        label_selector: str,
        limit: int,
        continue_token: str | None,
        timeout: Timeout,
    ) -> dict[str, Any]:
        """One page of the List object (`metadata.continue` names the next)."""
        ...


@dataclass
class SharedStats:
    """Counters the benchmark and metrics read."""

    reads: int = 0
    writes: int = 0
    conflicts: int = 0
    failures: int = 0
    batches: int = 0
    asks: int = 0
    sweeps: int = 0  # writes made only to drop entries (no review asked)


@dataclass
class _Waiting:
    ask: Ask
    answer: asyncio.Future[Answer] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    abandoned: bool = False  # its review gave up waiting: a batch not yet started leaves it out


class SharedReservations:
    """The shared reservations of every quota namespace, as one replica reads and writes them."""

    def __init__(
        self,
        kube: ObjectApi,
        release_namespace: str,
        *,
        lifetime_seconds: float,
        cache_state: Callable[[str], CacheState],
        budget_seconds: float = BUDGET_SECONDS,
        max_conflicts: int = MAX_CONFLICTS,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        sweep_seconds: float = SWEEP_SECONDS,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.kube = kube
        self.release_namespace = release_namespace
        self.lifetime = lifetime_seconds
        self.cache_state = cache_state
        self.budget = budget_seconds
        self.max_conflicts = max_conflicts
        self.wall = wall_clock
        # The clock of the cache's `stream_current_at` (monotonic): first sightings are on it.
        self.clock = clock
        self.sweep_seconds = sweep_seconds
        self.max_entries = max_entries
        self.sightings = Sightings()
        self._sweeper: asyncio.Task[None] | None = None
        self.stats = SharedStats()
        self._rng = random.Random()
        # The last version of each namespace's object this replica read or wrote: the next write
        # is tried against it first, so an uncontended replica writes without reading.
        self._latest: dict[str, dict[str, Any] | None] = {}
        self._queues: dict[str, list[_Waiting]] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}
        # Deletions of objects whose namespace is gone, under way.
        self._removals: set[asyncio.Task[Any]] = set()

    async def decide(self, namespace: str, ask: Ask) -> Answer:
        """The answer for one ask, booked in the shared object when it fits and reserves.

        Raises `Unrecorded` when that could not be done within the budget.
        """
        if self._sweeper is None:
            # Started by the first decision: before it this replica holds no object to prune.
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="quota-sweep")
        waiting = _Waiting(ask)
        self._queues.setdefault(namespace, []).append(waiting)
        if namespace not in self._writers:
            self._writers[namespace] = asyncio.create_task(self._drain(namespace), name=f"quota-{namespace}")
        try:
            # Bounded from arrival, queueing behind a write in flight included.
            async with asyncio.timeout(self.budget):
                return await asyncio.shield(waiting.answer)
        except TimeoutError:
            waiting.abandoned = True
            if waiting.answer.done():
                return waiting.answer.result()  # decided just in time (raises what it was refused with)
            raise Unrecorded(f"the API server did not answer within {self.budget:.1f} s") from None

    def in_flight(self, namespace: str) -> Charge:
        """The shared reservations the cache does not account for yet, in the last version seen."""
        try:
            entries = decode_entries(self._latest.get(namespace), namespace)
        except SharedStateError:
            return Charge()
        return in_flight(
            entries, self.cache_state(namespace), self.wall(), self.lifetime, self.sightings.of(namespace)
        )

    def namespaces(self) -> list[str]:
        """The namespaces this replica remembers a version of the shared object for."""
        return list(self._latest)

    def forget(self, namespace: str) -> None:
        """The namespace was deleted: drop the version remembered (a write in flight re-adds nothing
        once it is done; the next decision, if any, reads afresh) and delete its object."""
        self._latest.pop(namespace, None)
        self.sightings.forget(namespace)
        self._in_background(self.remove(namespace), f"quota-remove-{namespace}")

    def namespaces_listed(self, exists: Callable[[str], bool]) -> None:
        """The namespaces were listed (start, relist): delete the objects of those that are gone."""
        self._in_background(self.remove_orphans(exists), "quota-orphans")

    async def remove(self, namespace: str) -> bool:
        """Delete the object of a deleted namespace, in the version read now; whether it was deleted.

        An object written after that read (a namespace created again under the same name) stays:
        the deletion's precondition fails (409). A failure is logged; the next list of namespaces
        finds the object again.
        """
        name = object_name(namespace)
        try:
            current = await self._read(name)
            if current is None:
                return False
            return await self._delete(name, current)
        except KubeError as exc:
            log.warning("event=quota_object_not_removed namespace=%s reason=%r", namespace, str(exc))
            return False

    async def remove_orphans(self, exists: Callable[[str], bool]) -> list[str]:
        """Delete the objects of namespaces that `exists` no longer knows; returns those namespaces."""
        removed: list[str] = []
        token: str | None = None
        try:
            while True:
                page = await asyncio.to_thread(
                    self.kube.list,
                    "configmap",
                    namespace=self.release_namespace,
                    label_selector=f"{COMPONENT_LABEL}={OBJECT_COMPONENT}",
                    limit=ORPHAN_PAGE,
                    continue_token=token,
                    timeout=CALL_TIMEOUT,
                )
                for obj in page.get("items") or ():
                    metadata = obj.get("metadata") or {}
                    namespace = (metadata.get("labels") or {}).get(NAMESPACE_LABEL)
                    # Only an object this code wrote for that namespace (name and label agree).
                    if not isinstance(namespace, str) or metadata.get("name") != object_name(namespace):
                        continue
                    if not exists(namespace) and await self._delete(str(metadata["name"]), obj):
                        removed.append(namespace)
                token = (page.get("metadata") or {}).get("continue") or None
                if token is None:
                    break
        except KubeError as exc:
            log.warning("event=quota_orphans_not_removed reason=%r", str(exc))
        if removed:
            log.info("event=quota_objects_removed namespaces=%d", len(removed))
        return removed

    async def _delete(self, name: str, current: dict[str, Any]) -> bool:
        version = str((current.get("metadata") or {}).get("resourceVersion") or "") or None
        try:
            return await asyncio.to_thread(
                self.kube.delete,
                "configmap",
                name,
                namespace=self.release_namespace,
                resource_version=version,
                timeout=CALL_TIMEOUT,
            )
        except ApiError as exc:
            if exc.status == 409:
                return False  # written since it was read: a namespace of that name is back
            raise

    def _in_background(self, work: Coroutine[Any, Any, Any], name: str) -> None:
        try:
            task = asyncio.get_running_loop().create_task(work, name=name)
        except RuntimeError:  # no loop (a caller outside the server): nothing runs the deletion
            work.close()
            return
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)

    async def sweep(self) -> list[str]:
        """Write the pruned object of every namespace whose last-seen object holds entries this
        replica can drop now, where no write is under way already; returns those namespaces once
        their writes are done (a failed one is logged and read afresh next time)."""
        started: dict[str, asyncio.Task[None]] = {}
        for namespace, obj in list(self._latest.items()):
            if namespace in self._writers:
                continue  # the write under way prunes too
            try:
                entries = decode_entries(obj, namespace)
            except SharedStateError:
                continue
            state = self.cache_state(namespace)
            seen = self.sightings.of(namespace)
            if prune(entries, state, self.wall(), self.lifetime, seen).keys() != entries.keys():
                task = asyncio.create_task(self._drain(namespace, sweep=True), name=f"quota-{namespace}")
                self._writers[namespace] = started[namespace] = task
        await asyncio.gather(*started.values(), return_exceptions=True)
        return list(started)

    async def close(self) -> None:
        """Stop the sweep and the writers (reviews still waiting are refused)."""
        tasks = [*self._writers.values(), *self._removals]
        if self._sweeper is not None:
            tasks.append(self._sweeper)
            self._sweeper = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_seconds)
            try:
                await self.sweep()
            except Exception as exc:  # a sweep that dies would leave forged entries to expiry alone
                log.error("event=quota_sweep_failed error=%r", f"{type(exc).__name__}: {exc}")

    async def _drain(self, namespace: str, *, sweep: bool = False) -> None:
        batch: list[_Waiting] = []
        try:
            if sweep:
                try:
                    async with asyncio.timeout(self.budget):
                        await self._settle(namespace, [])
                    self.stats.sweeps += 1
                except Exception as exc:
                    self._latest.pop(namespace, None)  # an unknown outcome: read before the next write
                    log.warning(
                        "event=quota_sweep_failed namespace=%s reason=%r",
                        namespace,
                        _reason(exc, self.budget),
                    )
            while self._queues.get(namespace):
                batch = [w for w in self._queues.pop(namespace) if not w.abandoned]
                if not batch:
                    continue
                self.stats.batches += 1
                self.stats.asks += len(batch)
                try:
                    async with asyncio.timeout(self.budget):
                        answers = await self._settle(namespace, [w.ask for w in batch])
                except Exception as exc:
                    if not isinstance(exc, TimeoutError | Unrecorded | KubeError | SharedStateError):
                        log.error("event=quota_shared_failed namespace=%s error=%r", namespace, repr(exc))
                    self.stats.failures += 1
                    self._latest.pop(namespace, None)  # an unknown outcome: read before the next write
                    error = Unrecorded(_reason(exc, self.budget))
                    log.warning(
                        "event=quota_unrecorded namespace=%s reviews=%d reason=%r",
                        namespace,
                        len(batch),
                        str(error),
                    )
                    for w in batch:
                        if not w.answer.done() and not w.abandoned:
                            w.answer.set_exception(error)
                    continue
                for w, answer in zip(batch, answers, strict=True):
                    if not w.answer.done():
                        w.answer.set_result(answer)
        finally:
            self._writers.pop(namespace, None)
            for w in [*batch, *self._queues.pop(namespace, [])]:
                if not w.answer.done() and not w.abandoned:
                    w.answer.set_exception(Unrecorded("the webhook is shutting down"))

    async def _settle(self, namespace: str, asks: list[Ask]) -> list[Answer]:
        name = object_name(namespace)
        fresh = namespace not in self._latest
        current = await self._read(name) if fresh else self._latest[namespace]
        conflicts = 0
        while True:
            entries = decode_entries(current, namespace)
            state = self.cache_state(namespace)
            seen = self.sightings.note(namespace, entries, self.clock())
            kept, answers = decide(
                entries,
                asks,
                state,
                now=self.wall(),
                lifetime=self.lifetime,
                max_entries=self.max_entries,
                first_seen=seen,
            )
            # The entries booked now are first seen now, during their admission (those pruned are
            # kept in mind until the object no longer holds them: this write may yet fail).
            self.sightings.note(namespace, [*entries, *kept], self.clock())
            if kept == entries:
                if fresh:
                    # Nothing to write, and the version decided on was current when read.
                    self._latest[namespace] = current
                    return answers
                current, fresh = await self._read(name), True
                continue
            rv = None if current is None else str(current["metadata"]["resourceVersion"])
            body = encode_object(namespace, self.release_namespace, kept, rv)
            try:
                if current is None:
                    written = await asyncio.to_thread(
                        self.kube.create,
                        "configmap",
                        body,
                        namespace=self.release_namespace,
                        timeout=CALL_TIMEOUT,
                    )
                else:
                    written = await asyncio.to_thread(
                        self.kube.replace,
                        "configmap",
                        name,
                        body,
                        namespace=self.release_namespace,
                        timeout=CALL_TIMEOUT,
                    )
            except ApiError as exc:
                # 404 on a PUT: someone deleted the object since it was read; read (none) and create.
                if exc.status != 409 and not (exc.status == 404 and current is not None):
                    raise
                # Conflict (PUT with a stale resourceVersion) or AlreadyExists (a create raced).
                conflicts += 1
                self.stats.conflicts += 1
                if conflicts > self.max_conflicts:
                    raise Unrecorded(f"{conflicts} write conflicts in a row on {name}") from None
                await asyncio.sleep(
                    self._rng.uniform(0, min(BACKOFF_CAP_SECONDS, BACKOFF_SECONDS * 2**conflicts))
                )
                current, fresh = await self._read(name), True
                continue
            self.stats.writes += 1
            self._latest[namespace] = written
            return answers

    async def _read(self, name: str) -> dict[str, Any] | None:
        self.stats.reads += 1
        return await asyncio.to_thread(
            self.kube.get, "configmap", name, namespace=self.release_namespace, timeout=CALL_TIMEOUT
        )


def _reason(exc: BaseException, budget: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"the API server did not answer within {budget:.1f} s"
    if isinstance(exc, SharedStateError):
        return f"the shared reservations object is unreadable: {exc}"
    if isinstance(exc, KubeError | Unrecorded):
        return str(exc)
    return f"internal error: {type(exc).__name__}"
