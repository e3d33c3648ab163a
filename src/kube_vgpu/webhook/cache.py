"""The webhook's copy of the cluster: nodes, namespaces and pods, kept by list+watch (SPEC §2).

One thread per kind runs the blocking list/watch loop of `kubeapi.Kube` and hands what it reads to
the event loop, where the stores, the GPU inventory and the subscribers are updated; so everything
a review reads is touched on one thread, without locks, and the request path never calls the API.

Watch streams end (server timeouts), history expires (410 Gone: re-list and reconcile, so deletions
made during the gap are noticed) and the API goes away (the last state keeps serving, and `ready()`
turns false once nothing has been heard for `staleness_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube, WatchInterrupt
from kube_vgpu.webhook.placement.inventory import Inventory

log = logging.getLogger("kube_vgpu.webhook.cache")

CachedKind = Literal["node", "namespace", "pod"]
KINDS: tuple[CachedKind, ...] = ("node", "namespace", "pod")
EventType = Literal["added", "modified", "deleted"]


@dataclass(frozen=True)
class CacheEvent:
    """One change of a cached object: `obj` is the new state (the last known state when deleted)."""

    kind: CachedKind
    type: EventType
    obj: Mapping[str, Any]
    old: Mapping[str, Any] | None = None


Listener = Callable[[CacheEvent], None]
RelistListener = Callable[[CachedKind], None]


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` for namespaced objects, `name` otherwise."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


class ClusterCache:
    """Nodes, namespaces and pods as plain dicts, with the GPU inventory and change subscriptions.

    Methods are for the event loop's thread only (subscribers are called there too); `start()` and
    `stop()` run the background list/watch threads.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        staleness_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout_seconds: int | None = None,
        retry_seconds: float = 0.5,
        max_retry_seconds: float = 10.0,
    ) -> None:
        self._kube = kube
        self.staleness_seconds = staleness_seconds
        self._clock = clock
        # A quiet watch is heard from only when it ends; end it well inside the staleness window.
        self._watch_timeout = watch_timeout_seconds or int(min(300.0, max(1.0, staleness_seconds / 3)))
        self._retry = retry_seconds
        self._max_retry = max_retry_seconds
        self._stores: dict[CachedKind, dict[str, dict[str, Any]]] = {k: {} for k in KINDS}
        self._synced: dict[CachedKind, bool] = dict.fromkeys(KINDS, False)
        self._contact: dict[CachedKind, float | None] = dict.fromkeys(KINDS, None)
        # When the pod list/watch last showed it was current (a list completed, an event arrived).
        self._pods_current_at: float | None = None
        self._listeners: dict[CachedKind, list[Listener]] = {k: [] for k in KINDS}
        self._relist_listeners: list[RelistListener] = []
        self.inventory = Inventory()
        self.relists: dict[CachedKind, int] = dict.fromkeys(KINDS, 0)
        # Failed list/watch calls per kind (each followed by a retry after a backoff).
        self.failures: dict[CachedKind, int] = dict.fromkeys(KINDS, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._interrupts: dict[CachedKind, WatchInterrupt] = {}
        self._threads: list[threading.Thread] = []
        self._exited: dict[CachedKind, asyncio.Event] = {}
        self._all_synced = asyncio.Event()

    # -- what reviews read ---------------------------------------------------------------------

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of a namespace, or None when it is not in the cache."""
        obj = self._stores["namespace"].get(namespace)
        if obj is None:
            return None
        labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
        return labels

    def objects(self, kind: CachedKind) -> Mapping[str, Mapping[str, Any]]:
        """The cached objects of a kind by key (read-only view; do not mutate the dicts)."""
        return self._stores[kind]

    def sizes(self) -> Mapping[str, int]:
        """Objects cached per kind, and `gpu-node` for the nodes in the GPU inventory."""
        return {**{kind: len(store) for kind, store in self._stores.items()}, "gpu-node": len(self.inventory)}

    def api_failures(self) -> Mapping[str, int]:
        """Failed list/watch calls per kind so far."""
        return {str(kind): count for kind, count in self.failures.items()}

    @property
    def synced(self) -> bool:
        """Whether every kind has been listed at least once."""
        return all(self._synced.values())

    def lag_seconds(self) -> float | None:
        """Seconds since the API was last heard from, for the kind heard from longest ago (None: never)."""
        contacts = list(self._contact.values())
        if any(c is None for c in contacts):
            return None
        return max(0.0, self._clock() - min(c for c in contacts if c is not None))

    def pod_stream_current_at(self) -> float | None:
        """The clock's time (time.monotonic) at which the pod list/watch last confirmed it was
        current: a list completed, or an event (bookmarks included) arrived; None before the first
        list. A pod created before that moment, by more than the watch's delivery delay, is cached."""
        return self._pods_current_at

    def ready(self) -> bool:
        """Synced, and heard from within the staleness window."""
        lag = self.lag_seconds()
        return self.synced and lag is not None and lag <= self.staleness_seconds

    # -- subscriptions ---------------------------------------------------------------------------

    def subscribe(self, kind: CachedKind, listener: Listener) -> None:
        """Call `listener` on every add, modify and delete of `kind` (also those a re-list reveals)."""
        self._listeners[kind].append(listener)

    def subscribe_relist(self, listener: RelistListener) -> None:
        """Call `listener(kind)` after each full list of a kind has been reconciled into the cache."""
        self._relist_listeners.append(listener)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start one list/watch thread per kind."""
        if self._threads:
            raise RuntimeError("the cluster cache is already started")
        self._loop = asyncio.get_running_loop()
        self._stopping.clear()
        for kind in KINDS:
            self._interrupts[kind] = WatchInterrupt()
            self._exited[kind] = asyncio.Event()
            thread = threading.Thread(
                target=self._reflect, args=(kind,), name=f"kube-vgpu-watch-{kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    async def wait_synced(self) -> None:
        """Wait until every kind has been listed once (bound it with `asyncio.timeout`)."""
        await self._all_synced.wait()

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Stop the threads (open watches are cut) and wait for them to end."""
        self._stopping.set()
        for interrupt in self._interrupts.values():
            interrupt.interrupt()
        try:
            async with asyncio.timeout(grace_seconds):
                for exited in self._exited.values():
                    await exited.wait()
        except TimeoutError:
            log.warning(
                "event=cache_thread_linger threads=%s", [t.name for t in self._threads if t.is_alive()]
            )
        for thread in self._threads:
            thread.join(timeout=1.0)  # it has signalled its exit; this only waits for the last bytecodes
        self._threads = []

    # -- the background threads ------------------------------------------------------------------

    def _post(self, handler: Callable[..., None], *args: Any) -> bool:
        loop = self._loop
        if loop is None or self._stopping.is_set():
            return False
        try:
            loop.call_soon_threadsafe(handler, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            return False
        return True

    def _reflect(self, kind: CachedKind) -> None:
        """Run the list/watch loop, then tell the event loop this thread is done."""
        try:
            self._list_and_watch(kind)
        finally:
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(self._exited[kind].set)

    def _list_and_watch(self, kind: CachedKind) -> None:
        """List, then watch from the list's resourceVersion; forever, until stopped."""
        resource_version: str | None = None
        delay = self._retry
        while not self._stopping.is_set():
            try:
                if resource_version is None:
                    listed = self._kube.list(kind)
                    resource_version = str((listed.get("metadata") or {}).get("resourceVersion", ""))
                    if not self._post(self._on_list, kind, listed.get("items") or []):
                        return
                started = time.monotonic()
                resource_version, events = self._watch(kind, resource_version)
                if events or time.monotonic() - started >= 1.0:
                    delay = self._retry
                    continue
                # A stream that ends at once with nothing in it, again and again, must not become a
                # busy loop against the API server: back off as after an error.
            except ApiError as exc:
                if exc.status == 410:
                    log.info("event=cache_relist kind=%s reason=gone", kind)
                    resource_version = None
                    continue
                self._post(self._on_failure, kind)
                log.warning("event=cache_api_error kind=%s status=%d error=%r", kind, exc.status, exc.message)
            except ApiUnavailable as exc:
                if self._stopping.is_set():
                    return
                self._post(self._on_failure, kind)
                log.warning(
                    "event=cache_api_unavailable kind=%s error=%r retry_s=%.1f", kind, str(exc), delay
                )
            except Exception as exc:  # a thread that dies would leave the cache silently stale
                self._post(self._on_failure, kind)
                log.error("event=cache_error kind=%s error=%r", kind, f"{type(exc).__name__}: {exc}")
                resource_version = None
            self._stopping.wait(delay)
            delay = min(delay * 2, self._max_retry)

    def _watch(self, kind: CachedKind, resource_version: str) -> tuple[str | None, int]:
        """Follow one watch stream: (resourceVersion to resume from or None to re-list, events seen)."""
        stream = self._kube.watch(
            kind, resource_version, timeout_seconds=self._watch_timeout, interrupt=self._interrupts[kind]
        )
        events = 0
        try:
            for event in stream:
                if self._stopping.is_set():
                    return resource_version, events
                events += 1
                event_type = event.get("type")
                obj = event.get("object") or {}
                if event_type == "ERROR":
                    code = obj.get("code")
                    log.info("event=cache_relist kind=%s reason=watch_error code=%s", kind, code)
                    return None, events
                resource_version = _rv(obj) or resource_version
                if event_type == "BOOKMARK":
                    self._post(self._on_bookmark, kind)
                elif event_type in ("ADDED", "MODIFIED", "DELETED") and not self._post(
                    self._on_event, kind, event_type, obj
                ):
                    return resource_version, events
        finally:
            close = getattr(stream, "close", None)  # a generator: closing it releases the connection
            if close is not None:
                close()
        # The server ended the stream (its timeout): the API is alive, resume where we were.
        self._post(self._on_contact, kind)
        return resource_version, events

    # -- applied on the event loop ---------------------------------------------------------------

    def _on_contact(self, kind: CachedKind) -> None:
        self._contact[kind] = self._clock()

    def _on_bookmark(self, kind: CachedKind) -> None:
        self._on_contact(kind)
        if kind == "pod":
            self._pods_current_at = self._contact[kind]

    def _on_failure(self, kind: CachedKind) -> None:
        self.failures[kind] += 1

    def _emit(self, event: CacheEvent) -> None:
        if event.kind == "node":
            if event.type == "deleted":
                self.inventory.remove(str((event.obj.get("metadata") or {}).get("name", "")))
            else:
                self.inventory.upsert(event.obj)
        for listener in self._listeners[event.kind]:
            try:
                listener(event)
            except Exception as exc:  # one broken subscriber must not stop the cache
                log.error(
                    "event=cache_listener_error kind=%s object=%s error=%r",
                    event.kind,
                    object_key(event.obj),
                    f"{type(exc).__name__}: {exc}",
                )

    def _on_event(self, kind: CachedKind, event_type: str, obj: dict[str, Any]) -> None:
        self._contact[kind] = self._clock()
        if kind == "pod":
            self._pods_current_at = self._contact[kind]
        store = self._stores[kind]
        key = object_key(obj)
        old = store.get(key)
        if event_type == "DELETED":
            if old is not None:
                del store[key]
                self._emit(CacheEvent(kind, "deleted", obj, old))
            return
        store[key] = obj
        self._emit(CacheEvent(kind, "added" if old is None else "modified", obj, old))

    def _on_list(self, kind: CachedKind, items: Iterable[dict[str, Any]]) -> None:
        """Replace a kind's store with a full list, announcing exactly what changed."""
        self._contact[kind] = self._clock()
        if kind == "pod":
            self._pods_current_at = self._contact[kind]
        store = self._stores[kind]
        fresh = {object_key(obj): obj for obj in items}
        for key in [k for k in store if k not in fresh]:
            self._emit(CacheEvent(kind, "deleted", store.pop(key)))
        for key, obj in fresh.items():
            old = store.get(key)
            if old is not None and _rv(old) == _rv(obj):
                continue
            store[key] = obj
            if old is not None and _uid(old) != _uid(obj):
                # Deleted and re-created under the same name during the gap.
                self._emit(CacheEvent(kind, "deleted", old))
                old = None
            self._emit(CacheEvent(kind, "added" if old is None else "modified", obj, old))
        self.relists[kind] += 1
        first = not self._synced[kind]
        self._synced[kind] = True
        log.info("event=cache_listed kind=%s objects=%d first=%s", kind, len(store), first)
        for listener in self._relist_listeners:
            try:
                listener(kind)
            except Exception as exc:
                log.error("event=cache_listener_error kind=%s error=%r", kind, f"{type(exc).__name__}: {exc}")
        if self.synced:
            self._all_synced.set()
