"""The one list/watch loop of kube-vgpu (a reflector, after client-go's), shared by every part that watches.

It lists in pages (`limit`/`continue`) and reduces each object with the caller's transform as it
arrives, so a page is reduced before the next one is read; it then watches from the list's
resourceVersion with bookmarks. A watch that ends is resumed from the last version seen; 410 Gone (an
expired watch or continue token) costs a relist, which the caller reconciles against what it holds;
failures are retried after an exponential backoff with jitter. `stop()` ends it from any thread,
cutting a watch that is blocked on a silent stream.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

from kube_vgpu.kubeapi.client import (
    ApiError,
    ApiUnavailable,
    Kind,
    Kube,
    ResourceVersionMatch,
    WatchInterrupt,
)
from kube_vgpu.kubeapi.rawlist import Prefilter, read_page

log = logging.getLogger("kube_vgpu.kubeapi.listwatch")

T = TypeVar("T")
EventType = Literal["ADDED", "MODIFIED", "DELETED"]
ProgressReason = Literal["bookmark", "stream_end"]

# client-go's pager reads 500 objects a page.
DEFAULT_PAGE_SIZE = 500
# A watch stream shorter than this that carried nothing is retried after a wait (client-go's "very short
# watch"): a server that ends every watch at once must not turn the loop into a busy loop against it.
_HEALTHY_WATCH_SECONDS = 1.0


class Source(Protocol):
    """Where a reflector reads one kind of object: list pages and watch streams."""

    def list_page(self, limit: int, continue_token: str | None) -> Mapping[str, Any]:
        """One page of the list: the raw List object (`items`, `metadata.resourceVersion`/`continue`)."""
        ...

    def watch(
        self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """Watch events from `resource_version` until the stream ends (blocking)."""
        ...


class VersionedSource(Source, Protocol):
    """A source whose list can name the resourceVersion it wants (see `ListVersion`)."""

    def list_page_at(self, limit: int | None, resource_version: str) -> Mapping[str, Any]:
        """The first page of a list at `resource_version` (later pages follow the continue token)."""
        ...


class RawSource(Source, Protocol):
    """A source that can also hand over list pages undecoded, for a reflector with a prefilter."""

    @property
    def filtered(self) -> bool:
        """Whether the list is narrowed by selectors (then pages may hold fewer than `limit` items)."""
        ...

    def list_page_raw(self, limit: int, continue_token: str | None) -> bytes:
        """One page of the list as the API server sent it."""
        ...


@dataclass(frozen=True)
class KubeSource:
    """A `Source` over `kubeapi.Kube`: one kind, optionally one namespace and selectors."""

    kube: Kube
    kind: Kind
    namespace: str | None = None
    field_selector: str | None = None
    label_selector: str | None = None
    # Per page; None: the client's default.
    list_timeout: float | tuple[float, float] | None = None

    def _selection(self) -> dict[str, Any]:
        """What every list of this source names: the namespace, the selectors, the per-page timeout."""
        return {
            "namespace": self.namespace,
            "field_selector": self.field_selector,
            "label_selector": self.label_selector,
            "timeout": self.list_timeout,
        }

    def list_page(self, limit: int, continue_token: str | None) -> Mapping[str, Any]:
        """One page of the list."""
        return self.kube.list(self.kind, limit=limit, continue_token=continue_token, **self._selection())

    def list_page_at(self, limit: int | None, resource_version: str) -> Mapping[str, Any]:
        """The first page of the list at `resource_version` (`list_arguments` decides the paging)."""
        return self.kube.list(self.kind, **list_arguments(resource_version, limit), **self._selection())

    @property
    def filtered(self) -> bool:
        """Whether selectors narrow the list."""
        return bool(self.field_selector or self.label_selector)

    def list_page_raw(self, limit: int, continue_token: str | None) -> bytes:
        """One page of the list, undecoded."""
        return self.kube.list_raw(self.kind, limit=limit, continue_token=continue_token, **self._selection())

    def watch(
        self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int
    ) -> Iterator[dict[str, Any]]:
        """A watch stream with bookmarks."""
        return self.kube.watch(
            self.kind,
            resource_version,
            namespace=self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
            timeout_seconds=timeout_seconds,
            interrupt=interrupt,
        )


@dataclass
class ListVersion:
    """The resourceVersion the next list of one collection asks for, chosen as client-go's reflector
    chooses it (k8s.io/client-go/tools/cache/reflector.go, relistResourceVersion).

    A list without a resourceVersion is a consistent read: before Kubernetes 1.31 a quorum read from
    etcd, which for pods selected by `spec.nodeName` reads every pod of the cluster, and every node
    repeats it. So the first list asks for "0" (the API server's watch cache answers, at whatever
    version it holds) and later ones for the last version seen, which the watch cache answers when the
    list is unpaged, never older than that version (`resourceVersionMatch=NotOlderThan`). After a list
    at a version failed as unavailable (410 Expired, 504 too large), lists are consistent reads again
    until one succeeds, and that one's version is taken whatever it is (a server restored from an
    older etcd backup has gone back).

    The version only moves forward. A reflector sees versions in order, but lists made concurrently
    by different callers (a node's sweeps from the watch cache, an Allocate's consistent read) can
    answer out of order: a cached list sent before a consistent read may answer after it, at an older
    version, and must not lower the floor the consistent read raised. The floor is shared rather than
    kept per caller so that a list never reads a state older than one another caller already acted on.
    Versions are compared as integers when both are: kube-apiserver's are etcd revisions, which it
    parses as such itself (k8s.io/apiserver/pkg/storage/api_object_versioner.go,
    ParseResourceVersion); any other version is opaque, and the newest report is kept, as client-go
    keeps them.
    """

    last: str = ""
    unavailable: bool = False

    def next(self) -> str:
        """The version to list at: "" (a consistent read), "0", or the last version seen."""
        if self.unavailable:
            return ""
        return self.last or "0"

    def seen(self, version: str) -> None:
        """A list or watch event reached `version`: the floor moves to it unless it is older."""
        if version and not _older(version, self.last):
            self.last = version

    def listed(self, version: str) -> None:
        """A list succeeded at `version`."""
        if self.unavailable and version:
            self.last = version
        else:
            self.seen(version)
        self.unavailable = False

    def failed(self, asked: str, exc: ApiError) -> bool:
        """Whether a list at `asked` failed only because that version cannot be served (then the next
        list, which the caller makes at once, is a consistent read)."""
        if asked == "" or not exc.version_unavailable:
            return False
        self.unavailable = True
        return True


def _older(version: str, than: str) -> bool:
    """Whether `version` is older than `than`, known only when both are decimal integers."""
    if not (version.isascii() and version.isdigit() and than.isascii() and than.isdigit()):
        return False
    return int(version) < int(than)


def list_arguments(version: str, limit: int | None) -> dict[str, Any]:
    """`Kube.list`'s keyword arguments for a list at `version` (`ListVersion.next`) and `limit`.

    A version other than "0" goes unpaged: kube-apiserver serves a list with a limit from etcd unless
    its version is "0" (k8s.io/apiserver/pkg/storage/cacher, shouldDelegateList), and client-go's
    reflector drops its page size for such a list for that reason.
    """
    if version == "":
        return {"limit": limit}
    if version == "0":
        return {"limit": limit, "resource_version": "0"}
    match: ResourceVersionMatch = "NotOlderThan"
    return {"resource_version": version, "resource_version_match": match}


def object_key(obj: Mapping[str, Any]) -> str:
    """`namespace/name` for namespaced objects, `name` otherwise."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = str(metadata.get("name", ""))
    return f"{namespace}/{name}" if namespace else name


def _resource_version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


@dataclass(frozen=True)
class Listed(Generic[T]):
    """A complete list: every object the transform kept, by key, at one resourceVersion."""

    items: list[tuple[str, T]]
    resource_version: str
    pages: int
    read: int  # objects read, those the transform dropped included
    at: float  # the reflector's clock when the last page arrived


@dataclass(frozen=True)
class WatchEvent(Generic[T]):
    """One change; `obj` is the transformed object, None when the transform does not keep it."""

    type: EventType
    key: str
    obj: T | None
    resource_version: str
    at: float


@dataclass
class Handlers(Generic[T]):
    """What a reflector tells its user, on the reflector's thread (hand work to your loop from here)."""

    listed: Callable[[Listed[T]], None]
    event: Callable[[WatchEvent[T]], None]
    # A bookmark arrived (the watch is current up to it), or the server ended a stream normally.
    progress: Callable[[ProgressReason, float], None] = lambda reason, at: None
    # A call failed; the reflector retries after a backoff.
    failed: Callable[[BaseException], None] = lambda exc: None


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter, as client-go's reflector retries: each delay is the base
    times a random factor in [1, 1 + jitter], and the base doubles up to `maximum`. The count starts
    again once the loop has gone `reset_after` seconds (by `clock`) without a wait, as client-go's
    backoff manager does after 2 minutes: a watch that lasts a second or two before it dies again is
    no sign of a healthy server."""

    initial: float = 0.8
    maximum: float = 30.0
    factor: float = 2.0
    jitter: float = 1.0
    reset_after: float = 120.0
    rng: random.Random = field(default_factory=random.Random, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {self.initial} and {self.maximum}")
        if self.factor < 1 or self.jitter < 0:
            raise ValueError(f"backoff needs factor >= 1 and jitter >= 0, got {self.factor}, {self.jitter}")
        if not self.reset_after > 0:
            raise ValueError(f"backoff needs reset_after > 0, got {self.reset_after}")

    def delay(self, attempt: int) -> float:
        """The wait before retry number `attempt` (0 = the first retry after a success)."""
        base = min(self.maximum, self.initial * self.factor ** min(attempt, 64))
        return base * (1 + self.jitter * self.rng.random())


class Reflector(Generic[T]):
    """List, then watch, forever: `run()` on a thread of its own, `stop()` from anywhere."""

    def __init__(
        self,
        source: Source,
        handlers: Handlers[T],
        *,
        transform: Callable[[dict[str, Any]], T | None],
        name: str,
        prefilter: Prefilter | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        watch_timeout_seconds: int = 300,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        list_from_cache: bool = False,
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        if watch_timeout_seconds < 1:
            raise ValueError(f"watch_timeout_seconds must be at least 1, got {watch_timeout_seconds}")
        if prefilter is not None and not hasattr(source, "list_page_raw"):
            raise ValueError("a reflector with a prefilter needs a source that serves raw pages")
        if list_from_cache and not hasattr(source, "list_page_at"):
            raise ValueError("a reflector that lists from the watch cache needs a source that names versions")
        if list_from_cache and prefilter is not None:
            # A watch cache before Kubernetes 1.33 ignores `limit` at version "0" and answers in one
            # piece, which is what a prefilter, there to bound memory per page, must not be handed.
            raise ValueError("a reflector with a prefilter lists consistently, in pages")
        self._source = source
        # A necessary condition on an object's raw JSON for the transform to keep it: list items that
        # fail it are dropped without being decoded (`kubeapi.rawlist`).
        self._prefilter = prefilter
        self._handlers = handlers
        self._transform = transform
        self.name = name
        self.page_size = page_size
        self.watch_timeout_seconds = watch_timeout_seconds
        self.backoff = backoff or Backoff()
        self._clock = clock
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._interrupt: WatchInterrupt | None = None
        # The backoff's state: waits since the last calm spell, and when the last retry was made.
        self._attempt = 0
        self._retried_at: float | None = None
        self.resource_version: str | None = None
        # With `list_from_cache`, the version each list asks for, as client-go's reflector does.
        self._versions = ListVersion() if list_from_cache else None
        # Counters for logs, metrics and tests (written by the reflector's thread only).
        self.lists = 0
        self.relists_gone = 0
        self.expired_continues = 0
        self.failures = 0
        self.pages_split = 0  # list pages read item by item under the prefilter

    def stop(self) -> None:
        """End `run` (from any thread): the watch in progress is cut, a backoff wait ends at once."""
        self._stopping.set()
        with self._lock:
            if self._interrupt is not None:
                self._interrupt.interrupt()

    def run(self) -> None:
        """List and watch until `stop` is called; never raises."""
        version: str | None = None
        while not self._stopping.is_set():
            try:
                if version is None:
                    listed = self._list()
                    if listed is None:
                        return
                    version = listed.resource_version
                    self._handlers.listed(listed)
                started = time.monotonic()
                version, events, gone = self._watch(version)
                self.resource_version = version
                if self._versions is not None:
                    self._versions.seen(version)
                if gone:
                    # History is gone: relist and reconcile, at once after a calm spell, else after a
                    # wait that grows (a server that ends every watch with 410 must not be hammered).
                    version = None
                    if self._relist_gone():
                        return
                    continue
                if events or time.monotonic() - started >= _HEALTHY_WATCH_SECONDS:
                    continue  # a stream that carried something or lasted: resume it at once
            except ApiError as exc:
                if exc.status == 410:
                    # The watch call itself refused (or a list without a continue token): as above.
                    version = None
                    if self._relist_gone():
                        return
                    continue
                self._failed(exc)
            except ApiUnavailable as exc:
                if self._stopping.is_set():
                    return
                # The watch resumes from the last version seen (a list failure has none: it relists).
                self._failed(exc)
            except Exception as exc:  # a garbled answer: a loop that dies would leave its user stale
                self._failed(exc)
                version = None
            if self._pause():
                return

    # -- internals -------------------------------------------------------------------------------

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        log.warning("event=listwatch_error reflector=%s error=%r", self.name, f"{type(exc).__name__}: {exc}")
        self._handlers.failed(exc)

    def _relist_gone(self) -> bool:
        self.relists_gone += 1
        log.info("event=relist reflector=%s reason=gone", self.name)
        return self._pause(at_once_when_calm=True)

    def _pause(self, *, at_once_when_calm: bool = False) -> bool:
        """Wait out the backoff before the next retry; whether the reflector was stopped meanwhile.

        The count of waits starts again after `backoff.reset_after` seconds without a retry (client-go
        resets its backoff manager after 2 minutes without a backoff). `at_once_when_calm`: after such a
        calm spell, retry at once (a 410 after a long healthy watch relists without delay); that retry
        still counts, so the next one soon after waits, and the one after that longer.
        """
        now = self.backoff.clock()
        calm = self._retried_at is None or now - self._retried_at > self.backoff.reset_after
        if calm:
            self._attempt = 0
        if calm and at_once_when_calm:
            self._retried_at = now
            return self._stopping.is_set()
        delay = self.backoff.delay(self._attempt)
        self._attempt += 1
        stopped = self._stopping.wait(delay)
        self._retried_at = self.backoff.clock()  # calm is counted from the end of the wait
        return stopped

    def _list(self) -> Listed[T] | None:
        """Every page, each reduced before the next is read; None when stopped midway.

        A continue token that expires between pages (410) restarts the list from its first page, as
        a fresh consistent list, never as one unpaged read: that would hold the whole cluster at once.
        """
        while True:
            kept: list[tuple[str, T]] = []
            token: str | None = None
            pages = read = 0
            remaining: int | None = None  # the previous page's remainingItemCount
            asked = "" if self._versions is None else self._versions.next()
            try:
                while True:
                    metadata, objects, count = self._read_page(token, remaining, asked)
                    pages += 1
                    read += count
                    for obj in objects:
                        reduced = self._transform(obj)
                        if reduced is not None:
                            kept.append((object_key(obj), reduced))
                    del objects  # the page's objects go now, before the next page is read
                    sent, token = token, metadata.get("continue") or None
                    if token is not None and token == sent:
                        # kube-apiserver's next token always lies past the last key read: this list
                        # would never end, and would hold more with every page.
                        raise ValueError(
                            f"the API server sent back the continue token it was given ({str(token)[:64]!r})"
                        )
                    left = metadata.get("remainingItemCount")
                    remaining = left if isinstance(left, int) and not isinstance(left, bool) else None
                    if token is None:
                        self.lists += 1
                        version = str(metadata.get("resourceVersion") or "")
                        if self._versions is not None:
                            self._versions.listed(version)
                        return Listed(kept, version, pages, read, self._clock())
                    if self._stopping.is_set():
                        return None
            except ApiError as exc:
                if token is None and self._versions is not None and self._versions.failed(asked, exc):
                    # client-go lists again at once, as a consistent read.
                    log.info(
                        "event=relist reflector=%s reason=version_unavailable version=%s", self.name, asked
                    )
                    continue
                if exc.status != 410 or token is None:
                    raise
                self.expired_continues += 1
                log.info("event=relist reflector=%s reason=continue_expired pages_read=%d", self.name, pages)
                # At once the first time (client-go's pager re-reads at once), then after growing
                # waits: tokens that keep expiring must not turn into a loop of first-page reads.
                if self._pause(at_once_when_calm=True):
                    return None

    def _read_page(
        self, token: str | None, remaining: int | None, asked: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
        """(List metadata, the items to transform, how many items the page held); `asked`: the
        version the list asks for ("" for a consistent read), named on its first page only."""
        if self._prefilter is None:
            if token is None and asked:
                versioned: VersionedSource = self._source  # type: ignore[assignment]  # checked in __init__
                page = versioned.list_page_at(self.page_size if asked == "0" else None, asked)
            else:
                page = self._source.list_page(self.page_size, token)
            metadata = page.get("metadata")
            items = list(page.get("items") or ())
            return (metadata if isinstance(metadata, dict) else {}), items, len(items)
        source: RawSource = self._source  # type: ignore[assignment]  # checked in __init__
        filtered = source.filtered
        limit = self.page_size

        def expected(metadata: dict[str, Any]) -> int | None:
            # Unfiltered pages are full but for the last, which holds what the one before said remained.
            if filtered:
                return None
            return limit if metadata.get("continue") else remaining

        read = read_page(source.list_page_raw(limit, token), self._prefilter, expected)
        self.pages_split += read.split
        return read.metadata, read.items, read.count

    def _next_interrupt(self) -> WatchInterrupt | None:
        interrupt = WatchInterrupt()
        with self._lock:
            if self._stopping.is_set():
                return None
            self._interrupt = interrupt
        return interrupt

    def _watch(self, version: str) -> tuple[str, int, bool]:
        """Follow one stream: (version to resume from, events seen, whether history is gone)."""
        interrupt = self._next_interrupt()
        if interrupt is None:
            return version, 0, False
        stream = self._source.watch(version, interrupt, self.watch_timeout_seconds)
        events = 0
        try:
            for event in stream:
                if self._stopping.is_set():
                    return version, events, False
                event_type = event.get("type")
                obj = event.get("object")
                obj = obj if isinstance(obj, dict) else {}
                if event_type == "ERROR":
                    # 410 Gone, or another error the server ends the watch with: list again.
                    log.info(
                        "event=watch_error reflector=%s code=%s message=%r",
                        self.name,
                        obj.get("code"),
                        obj.get("message"),
                    )
                    return version, events, True
                events += 1
                seen = _resource_version(obj) or version
                if event_type == "BOOKMARK":
                    version = seen
                    self._handlers.progress("bookmark", self._clock())
                    continue
                if event_type in ("ADDED", "MODIFIED", "DELETED"):
                    kind: EventType = event_type
                    reduced = self._transform(obj)
                    self._handlers.event(WatchEvent(kind, object_key(obj), reduced, seen, self._clock()))
                version = seen
        finally:
            close = getattr(stream, "close", None)  # a generator: closing it releases the connection
            if close is not None:
                close()
        if not self._stopping.is_set():
            self._handlers.progress("stream_end", self._clock())
        return version, events, False
