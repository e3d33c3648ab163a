"""The webhook's copy of the cluster: GPU nodes, namespaces and vGPU pods, kept by list+watch.

One thread per kind runs `kubeapi.listwatch.Reflector` (paged lists, bookmarks, resume, 410 relist,
backoff) and reduces each object as it arrives (`webhook.reduced`: pods that ask for no vGPU are
dropped there); what is kept is handed to the event loop, where the stores, the GPU inventory and the
subscribers are updated, so everything a review reads is touched on one thread, without locks, and
the request path never calls the API. When the API goes away the last state keeps serving, and
`ready()` turns false once nothing has been heard for `staleness_seconds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, overload

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.kubeapi.listwatch import (
    DEFAULT_PAGE_SIZE,
    Backoff,
    Handlers,
    KubeSource,
    Listed,
    ProgressReason,
    RawSource,
    Reflector,
    WatchEvent,
    object_key,
)
from kube_vgpu.kubeapi.rawlist import Prefilter
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.records import (
    ClaimRecord,
    NamespaceRecord,
    NodeRecord,
    PodRecord,
    Record,
    SliceRecord,
    TemplateRecord,
)
from kube_vgpu.webhook.reduced import (
    NODE_PREFILTER,
    SLICE_PREFILTER,
    Reducer,
    claim_reducer,
    pod_prefilter,
    pod_reducer,
    reduce_namespace,
    reduce_node,
    reduce_slice,
    slice_memory_mib,
    template_reducer,
)

log = logging.getLogger("kube_vgpu.webhook.cache")

CachedKind = Literal["node", "namespace", "pod", "resourceclaim", "resourceclaimtemplate", "resourceslice"]
KINDS: tuple[CachedKind, ...] = ("node", "namespace", "pod")
# Watched besides KINDS when DRA device classes are configured (`claim_classes`).
CLAIM_KIND: CachedKind = "resourceclaim"
TEMPLATE_KIND: CachedKind = "resourceclaimtemplate"
SLICE_KIND: CachedKind = "resourceslice"
EventType = Literal["added", "modified", "deleted"]
_R = TypeVar("_R", bound=Mapping[str, object])  # one of the records


@dataclass(frozen=True)
class CacheEvent(Generic[_R]):
    """One change of a cached object: `obj` is the new state (the last known state when deleted)."""

    kind: CachedKind
    type: EventType
    obj: _R
    old: _R | None = None


Listener = Callable[[CacheEvent[_R]], None]
RelistListener = Callable[[CachedKind], None]


def _rv(obj: Record) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _uid(obj: Record) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


class ClusterCache:
    """GPU nodes, namespaces and vGPU pods as their records (`kube_vgpu.webhook.records`, reduced by
    `kube_vgpu.webhook.reduced`), with the GPU inventory and change subscriptions.

    Methods are for the event loop's thread only (subscribers are called there too); `start()` and
    `stop()` run the background list/watch threads.
    """

    def __init__(
        self,
        kube: Kube,
        *,
        names: ResourceNames | None = None,
        staleness_seconds: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
        watch_timeout_seconds: int | None = None,
        retry_seconds: float = 0.5,
        max_retry_seconds: float = 10.0,
        page_size: int = DEFAULT_PAGE_SIZE,
        source: Callable[[CachedKind], RawSource] | None = None,
        claim_classes: frozenset[str] = frozenset(),
    ) -> None:
        # ResourceClaims are watched only where DRA classes are configured: elsewhere the cluster may
        # not serve resource.k8s.io, and RBAC grants nothing there.
        self.kinds: tuple[CachedKind, ...] = (
            (*KINDS, CLAIM_KIND, TEMPLATE_KIND, SLICE_KIND) if claim_classes else KINDS
        )
        self._kube = kube
        # Where each kind is read (tests wrap it to act between the pages of a list).
        self._source: Callable[[CachedKind], RawSource] = source or (lambda kind: KubeSource(kube, kind))
        self.staleness_seconds = staleness_seconds
        self._clock = clock
        # A quiet watch is heard from by its bookmarks and when it ends; end it well inside the
        # staleness window all the same, for API servers that send no bookmarks.
        self._watch_timeout = watch_timeout_seconds or int(min(300.0, max(1.0, staleness_seconds / 3)))
        self._backoff = Backoff(initial=retry_seconds, maximum=max(retry_seconds, max_retry_seconds))
        self._page_size = page_size
        names = names or ResourceNames()
        self._reducers: dict[CachedKind, Reducer[Record]] = {
            "node": reduce_node,
            "namespace": reduce_namespace,
            "pod": pod_reducer(names),
            CLAIM_KIND: claim_reducer(claim_classes),
            TEMPLATE_KIND: template_reducer(claim_classes),
            SLICE_KIND: reduce_slice,
        }
        # Listed pods and nodes whose JSON cannot be kept are dropped undecoded (most of a list).
        self._prefilters: dict[CachedKind, Prefilter | None] = {
            "node": NODE_PREFILTER,
            "namespace": None,
            "pod": pod_prefilter(names),
            # Every claim is kept (as a stub when it names no kube-vgpu class): a pod naming a claim the
            # cache lacks is then one the webhook has not seen yet, not one of another driver.
            CLAIM_KIND: None,
            TEMPLATE_KIND: None,
            SLICE_KIND: SLICE_PREFILTER,
        }
        self._stores: dict[CachedKind, dict[str, Record]] = {k: {} for k in self.kinds}
        self._pod_uids: dict[str, str] = {}  # uid -> key of every cached pod
        self._synced: dict[CachedKind, bool] = dict.fromkeys(self.kinds, False)
        self._contact: dict[CachedKind, float | None] = dict.fromkeys(self.kinds, None)
        self._pods_current_at: float | None = None
        self._claims_current_at: float | None = None
        self._listeners: dict[CachedKind, list[Listener[Any]]] = {k: [] for k in self.kinds}
        self._relist_listeners: list[RelistListener] = []
        self.inventory = Inventory()
        self.relists: dict[CachedKind, int] = dict.fromkeys(self.kinds, 0)
        # Failed list/watch calls per kind (each followed by a retry after a backoff).
        self.failures: dict[CachedKind, int] = dict.fromkeys(self.kinds, 0)
        # Objects read by the last full list per kind, those dropped at the edge included.
        self.listed_read: dict[CachedKind, int] = dict.fromkeys(self.kinds, 0)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._reflectors: dict[CachedKind, Reflector[Record]] = {}
        self._threads: list[threading.Thread] = []
        self._exited: dict[CachedKind, asyncio.Event] = {}
        self._all_synced = asyncio.Event()
        # First of the node subscribers: those after it read the inventory as of this change.
        self.subscribe("node", self._on_node)

    # -- what reviews read ---------------------------------------------------------------------

    def namespace_labels(self, namespace: str) -> Mapping[str, str] | None:
        """The labels of a namespace, or None when it is not in the cache."""
        obj = self.objects("namespace").get(namespace)
        if obj is None:
            return None
        labels: Mapping[str, str] = (obj.get("metadata") or {}).get("labels") or {}
        return labels

    @overload
    def objects(self, kind: Literal["pod"]) -> Mapping[str, PodRecord]: ...
    @overload
    def objects(self, kind: Literal["node"]) -> Mapping[str, NodeRecord]: ...
    @overload
    def objects(self, kind: Literal["namespace"]) -> Mapping[str, NamespaceRecord]: ...
    @overload
    def objects(self, kind: Literal["resourceclaim"]) -> Mapping[str, ClaimRecord]: ...
    @overload
    def objects(self, kind: Literal["resourceclaimtemplate"]) -> Mapping[str, TemplateRecord]: ...
    @overload
    def objects(self, kind: Literal["resourceslice"]) -> Mapping[str, SliceRecord]: ...
    @overload
    def objects(self, kind: CachedKind) -> Mapping[str, Record]: ...
    def objects(self, kind: CachedKind) -> Mapping[str, Record]:
        """The cached records of a kind by key (read-only view; do not mutate the dicts): every
        namespace, the nodes with kube-vgpu GPU labels, the pods that ask for a vGPU. Each kind's
        store holds what its reducer returns, so the record type follows from the kind."""
        return self._stores.get(kind, {})

    def has_pod_uid(self, uid: str) -> bool:
        """Whether a pod of this uid is in the cache (only vGPU pods are cached)."""
        return uid in self._pod_uids

    def pod_stream_current_at(self) -> float | None:
        """When (on the cache's clock, `time.monotonic` by default) the pod list/watch last confirmed
        it was current: a list completed, an event or a bookmark arrived; None before the first list.

        Bookmarks make it advance on a quiet cluster. The time is taken on the watch thread as the
        answer arrives, so it never runs ahead of the pod events applied before it."""
        return self._pods_current_at

    def quota_streams_current_at(self) -> float | None:
        """`pod_stream_current_at`, or, where ResourceClaims are watched too, the earlier of the
        pod and claim streams: a reservation (of a pod or a claim) is judged never created only once
        both watches have moved past it."""
        if CLAIM_KIND not in self.kinds:
            return self._pods_current_at
        if self._pods_current_at is None or self._claims_current_at is None:
            return None
        return min(self._pods_current_at, self._claims_current_at)

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

    def ready(self) -> bool:
        """Synced, and heard from within the staleness window."""
        lag = self.lag_seconds()
        return self.synced and lag is not None and lag <= self.staleness_seconds

    # -- subscriptions ---------------------------------------------------------------------------

    @overload
    def subscribe(self, kind: Literal["pod"], listener: Listener[PodRecord]) -> None: ...
    @overload
    def subscribe(self, kind: Literal["node"], listener: Listener[NodeRecord]) -> None: ...
    @overload
    def subscribe(self, kind: Literal["namespace"], listener: Listener[NamespaceRecord]) -> None: ...
    @overload
    def subscribe(self, kind: Literal["resourceclaim"], listener: Listener[ClaimRecord]) -> None: ...
    @overload
    def subscribe(
        self, kind: Literal["resourceclaimtemplate"], listener: Listener[TemplateRecord]
    ) -> None: ...
    @overload
    def subscribe(self, kind: Literal["resourceslice"], listener: Listener[SliceRecord]) -> None: ...
    @overload
    def subscribe(self, kind: CachedKind, listener: Listener[Record]) -> None: ...
    def subscribe(self, kind: CachedKind, listener: Listener[Any]) -> None:
        """Call `listener` on every add, modify and delete of `kind` (also those a re-list reveals),
        with events carrying that kind's records; a kind this cache does not watch has no events."""
        self._listeners.setdefault(kind, []).append(listener)

    def claim(self, namespace: str, name: str) -> ClaimRecord | None:
        """The cached ResourceClaim `namespace/name` (None: not cached, or claims not watched)."""
        return self.objects("resourceclaim").get(f"{namespace}/{name}")

    def largest_dra_gpu_mib(self) -> int | None:
        """MiB of the largest GPU kube-vgpu's DRA driver publishes (None: none, or not watched): what
        a claim request naming no memory gets, on a DRA node group."""
        sizes = [m for s in self.objects("resourceslice").values() for m in slice_memory_mib(s)]
        return max(sizes, default=None)

    def largest_claim_gpu_mib(self) -> int | None:
        """The largest GPU a claim could get: on a DRA node or on a node the inventory knows."""
        sizes = [
            m for m in (self.largest_dra_gpu_mib(), self.inventory.largest_memory_any()) if m is not None
        ]
        return max(sizes, default=None)

    def claim_template(self, namespace: str, name: str) -> TemplateRecord | None:
        """The cached ResourceClaimTemplate `namespace/name` (None: not cached, or not watched)."""
        return self.objects("resourceclaimtemplate").get(f"{namespace}/{name}")

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
        for kind in self.kinds:
            reflector: Reflector[Record] = Reflector(
                self._source(kind),
                self._handlers(kind),
                transform=self._reducers[kind],
                prefilter=self._prefilters[kind],
                name=f"webhook-{kind}",
                page_size=self._page_size,
                watch_timeout_seconds=self._watch_timeout,
                backoff=self._backoff,
                clock=self._clock,
            )
            self._reflectors[kind] = reflector
            self._exited[kind] = asyncio.Event()
            thread = threading.Thread(
                target=self._reflect, args=(kind, reflector), name=f"kube-vgpu-watch-{kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    async def wait_synced(self) -> None:
        """Wait until every kind has been listed once (bound it with `asyncio.timeout`)."""
        await self._all_synced.wait()

    async def stop(self, *, grace_seconds: float = 10.0) -> None:
        """Stop the threads (open watches are cut) and wait for them to end."""
        self._stopping.set()
        for reflector in self._reflectors.values():
            reflector.stop()
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
        self._reflectors = {}

    # -- the background threads ------------------------------------------------------------------

    def _post(self, handler: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or self._stopping.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
            loop.call_soon_threadsafe(handler, *args)

    def _handlers(self, kind: CachedKind) -> Handlers[Record]:
        def listed(result: Listed[Record]) -> None:
            self._post(self._on_list, kind, result)

        def event(change: WatchEvent[Record]) -> None:
            self._post(self._on_event, kind, change)

        def progress(reason: ProgressReason, at: float) -> None:
            self._post(self._on_progress, kind, reason, at)

        def failed(exc: BaseException) -> None:
            self._post(self._on_failure, kind)

        return Handlers(listed=listed, event=event, progress=progress, failed=failed)

    def _reflect(self, kind: CachedKind, reflector: Reflector[Record]) -> None:
        """Run the list/watch loop, then tell the event loop this thread is done."""
        try:
            reflector.run()
        finally:
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    loop.call_soon_threadsafe(self._exited[kind].set)

    # -- applied on the event loop ---------------------------------------------------------------

    def _on_progress(self, kind: CachedKind, reason: ProgressReason, at: float) -> None:
        self._contact[kind] = at
        if kind == "pod" and reason == "bookmark":
            self._pods_current_at = at
        elif kind == CLAIM_KIND and reason == "bookmark":
            self._claims_current_at = at

    def _on_failure(self, kind: CachedKind) -> None:
        self.failures[kind] += 1

    def _on_node(self, event: CacheEvent[NodeRecord]) -> None:
        if event.type == "deleted":
            self.inventory.remove(str((event.obj.get("metadata") or {}).get("name", "")))
        else:
            self.inventory.upsert(event.obj)

    def _emit(self, event: CacheEvent[Record]) -> None:
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

    def _put(self, kind: CachedKind, key: str, obj: Record) -> Record | None:
        old = self._stores[kind].get(key)
        self._stores[kind][key] = obj
        if kind == "pod":
            if old is not None:
                self._pod_uids.pop(_uid(old), None)
            self._pod_uids[_uid(obj)] = key
        return old

    def _drop(self, kind: CachedKind, key: str) -> Record | None:
        old = self._stores[kind].pop(key, None)
        if old is not None and kind == "pod":
            self._pod_uids.pop(_uid(old), None)
        return old

    def _on_event(self, kind: CachedKind, change: WatchEvent[Record]) -> None:
        self._contact[kind] = change.at
        if kind == "pod":
            self._pods_current_at = change.at
        elif kind == CLAIM_KIND:
            self._claims_current_at = change.at
        if change.type == "DELETED" or change.obj is None:
            # Deleted, or no longer kept (a node that lost its GPU labels).
            old = self._drop(kind, change.key)
            if old is not None:
                self._emit(CacheEvent(kind, "deleted", change.obj or old, old))
            return
        old = self._put(kind, change.key, change.obj)
        if old is not None and _uid(old) != _uid(change.obj):
            # Deleted and re-created under the same name while this watch was not looking.
            self._emit(CacheEvent(kind, "deleted", old))
            old = None
        self._emit(CacheEvent(kind, "added" if old is None else "modified", change.obj, old))

    def _on_list(self, kind: CachedKind, result: Listed[Record]) -> None:
        """Replace a kind's store with a full list, announcing exactly what changed."""
        self._contact[kind] = result.at
        if kind == "pod":
            self._pods_current_at = result.at
        elif kind == CLAIM_KIND:
            self._claims_current_at = result.at
        store = self._stores[kind]
        fresh = dict(result.items)
        for key in [k for k in store if k not in fresh]:
            old = self._drop(kind, key)
            if old is not None:
                self._emit(CacheEvent(kind, "deleted", old))
        for key, obj in fresh.items():
            old = store.get(key)
            if old is not None and _rv(old) == _rv(obj):
                continue
            self._put(kind, key, obj)
            if old is not None and _uid(old) != _uid(obj):
                # Deleted and re-created under the same name during the gap.
                self._emit(CacheEvent(kind, "deleted", old))
                old = None
            self._emit(CacheEvent(kind, "added" if old is None else "modified", obj, old))
        self.relists[kind] += 1
        self.listed_read[kind] = result.read
        first = not self._synced[kind]
        self._synced[kind] = True
        log.info(
            "event=cache_listed kind=%s objects=%d read=%d pages=%d first=%s",
            kind,
            len(store),
            result.read,
            result.pages,
            first,
        )
        for listener in self._relist_listeners:
            try:
                listener(kind)
            except Exception as exc:
                log.error("event=cache_listener_error kind=%s error=%r", kind, f"{type(exc).__name__}: {exc}")
        if self.synced:
            self._all_synced.set()
