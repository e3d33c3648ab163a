"""The stand-in API server's storage: versioned objects, an etcd-like revision counter, watch history.

Every write bumps one global resourceVersion and is recorded as a `Change` in a bounded history, so a
watch can resume from any revision still in the window and is told 410 Expired for older ones; pages of
a paginated list are served from the revision the first page was read at. Stored objects are never
mutated once stored, so readers share them without copying. Thread-safe: the HTTP handlers run on the
server's loop while tests write directly from their own thread.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from kube_vgpu.standins.apiserver.errors import expired
from kube_vgpu.standins.apiserver.resources import ResourceType

ObjectKey = tuple[str, str]  # (namespace or "", name): the order etcd keys sort in
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


def encode(obj: Any) -> bytes:
    """Compact JSON, as the API server writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class Stored:
    """One version of one object (without kind/apiVersion), its JSON encoded once on first use.

    A compact one (`from_raw`) holds its JSON alone and decodes `obj` on each use: a pod held as
    Python objects costs about five times its JSON (docs/benchmarks.md), so benchmarks of 150,000
    pods store them this way.
    """

    __slots__ = ("_obj", "_raw", "key", "rv")

    def __init__(self, obj: dict[str, Any], rv: int, *, raw: tuple[bytes, ObjectKey] | None = None) -> None:
        self.rv = rv
        if raw is not None:  # compact: the JSON and the key alone
            self._obj: dict[str, Any] | None = None
            self._raw: bytes | None = raw[0]
            self.key: ObjectKey = raw[1]
            return
        self._obj, self._raw = obj, None
        metadata = obj.get("metadata") or {}
        self.key = (metadata.get("namespace") or "", metadata.get("name") or "")

    @classmethod
    def from_raw(cls, raw: bytes, key: ObjectKey, rv: int) -> Stored:
        """A compact stored object: its JSON (with `resourceVersion` already in it) and nothing else."""
        return cls({}, rv, raw=(raw, key))

    @property
    def obj(self) -> dict[str, Any]:
        """The object (read-only: shared by every reader; a compact one is decoded afresh)."""
        if self._obj is not None:
            return self._obj
        decoded: dict[str, Any] = json.loads(self._raw or b"{}")
        return decoded

    @property
    def raw(self) -> bytes:
        """The object as compact JSON (cached: the object never changes)."""
        if self._raw is None:
            self._raw = encode(self._obj)
        return self._raw

    def copy(self) -> dict[str, Any]:
        """A private deep copy of the object, free to modify."""
        copied: dict[str, Any] = json.loads(self.raw)
        return copied


@dataclass(frozen=True)
class Change:
    """One write, as a watch reports it; `old` is the state before (None when created)."""

    type: ChangeType
    rt: ResourceType
    rv: int
    new: Stored
    old: Stored | None


@dataclass(frozen=True)
class Bookmark:
    """A progress mark: the watcher has seen every change of its resource up to `rv`."""

    rv: int
    initial_events_end: bool = False


WatchItem = Change | Bookmark | None  # None: the server ends the watch


class Subscription:
    """A live watch: changes of one resource, queued on the loop the watch is served from."""

    def __init__(self, rt: ResourceType, loop: asyncio.AbstractEventLoop) -> None:
        self.rt = rt
        self.loop = loop
        self.queue: asyncio.Queue[WatchItem] = asyncio.Queue()

    def push(self, item: WatchItem) -> None:
        """Queue an item from any thread; items keep the order they were pushed in."""
        # A closed serving loop means the watch is gone already.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)


# kube-apiserver's message for a continue token whose revision has been compacted
# (staging/src/k8s.io/apiserver/pkg/storage/etcd3/errors.go, `inconsistentContinue`).
INCONSISTENT_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can start a "
    "new list without the continue parameter, or use the continue token in this response to retrieve "
    "the remainder of the results. Continuing with the provided token results in an inconsistent list - "
    "objects that were created, modified, or deleted between the time the first chunk was returned and "
    "now may show up in the list."
)


class Store:
    """Objects of every resource, the revision counter, the change history and live watches."""

    def __init__(self, history_limit: int = 20_000) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit must be at least 1, got {history_limit}")
        self.lock = threading.RLock()
        self._rv = 0
        self._objects: dict[str, dict[ObjectKey, Stored]] = {}
        self._sorted_keys: dict[str, list[ObjectKey]] = {}
        self._history: deque[Change] = deque(maxlen=history_limit)
        # Changes at or below this revision are no longer in the history.
        self._compacted_rv = 0
        self._subscriptions: dict[str, set[Subscription]] = {}

    @property
    def rv(self) -> int:
        """The latest revision (the resourceVersion a list made now reports)."""
        return self._rv

    def get(self, rt: ResourceType, namespace: str, name: str) -> Stored | None:
        """The current version of an object, or None."""
        return self._objects.get(rt.key, {}).get((namespace, name))

    def _keys(self, rt: ResourceType) -> list[ObjectKey]:
        keys = self._sorted_keys.get(rt.key)
        if keys is None:
            keys = sorted(self._objects.get(rt.key, {}))
            self._sorted_keys[rt.key] = keys
        return keys

    def items(
        self, rt: ResourceType, namespace: str | None = None, after: ObjectKey | None = None
    ) -> list[Stored]:
        """Current objects in key order, optionally of one namespace and after a key."""
        with self.lock:
            objects = self._objects.get(rt.key, {})
            return [objects[key] for key in _key_range(self._keys(rt), namespace, after)]

    def items_at(
        self, rt: ResourceType, at_rv: int, namespace: str | None = None, after: ObjectKey | None = None
    ) -> list[Stored]:
        """Objects as they were at revision `at_rv` (for the later pages of a list); 410 if compacted."""
        with self.lock:
            if at_rv < self._compacted_rv:
                # kube-apiserver's storage (etcd3 `handleCompactedErrorForPaging`): 410 Expired with
                # this message, and a continue token (resourceVersion -1) for an inconsistent rest.
                if after is None:  # an exact-revision list, no token: the plain expiry
                    raise expired("The resourceVersion for the provided list is too old.")
                raise expired(INCONSISTENT_CONTINUE, continue_after=after)
            later = [c for c in self._history if c.rv > at_rv and c.rt.key == rt.key]
            if not later:
                return self.items(rt, namespace, after)
            objects = dict(self._objects.get(rt.key, {}))
        # Undo the later changes, newest first, to get back to the state at `at_rv`.
        for change in reversed(later):
            if change.old is None:
                objects.pop(change.new.key, None)
            else:
                objects[change.old.key] = change.old
        keys = _key_range(sorted(objects), namespace, after)
        return [objects[key] for key in keys]

    def load_compact(self, rt: ResourceType, objects: Iterable[dict[str, Any]]) -> int:
        """Store objects as compact JSON, each at a revision of its own, as a restored etcd would hold
        them: no history and no watch event (benchmarks fill the store this way before any client
        connects). The objects must carry their final metadata; returns how many were stored."""
        count = 0
        with self.lock:
            stored = self._objects.setdefault(rt.key, {})
            for obj in objects:
                self._rv += 1
                obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
                metadata = obj["metadata"]
                key: ObjectKey = (metadata.get("namespace") or "", metadata.get("name") or "")
                stored[key] = Stored.from_raw(encode(obj), key, self._rv)
                count += 1
            self._sorted_keys.pop(rt.key, None)
            self._history.clear()
            self._compacted_rv = self._rv
        return count

    def commit(
        self, rt: ResourceType, change_type: ChangeType, obj: dict[str, Any], old: Stored | None
    ) -> Stored:
        """Record a write: stamp the next resourceVersion into `obj` (now owned by the store), store or
        remove it, append it to the history and tell the watches. Callers hold `lock` while they read
        `old` and compute `obj`, so concurrent writers cannot interleave."""
        with self.lock:
            self._rv += 1
            obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)
            new = Stored(obj, self._rv)
            objects = self._objects.setdefault(rt.key, {})
            if change_type == "DELETED":
                del objects[new.key]
                self._sorted_keys.pop(rt.key, None)
            else:
                if new.key not in objects:
                    self._sorted_keys.pop(rt.key, None)
                objects[new.key] = new
            if len(self._history) == self._history.maxlen:
                self._compacted_rv = self._history[0].rv
            change = Change(change_type, rt, self._rv, new, old)
            self._history.append(change)
            for subscription in self._subscriptions.get(rt.key, ()):
                subscription.push(change)
            return new

    def subscribe(
        self, rt: ResourceType, from_rv: int | None, loop: asyncio.AbstractEventLoop
    ) -> tuple[Subscription, list[Change]]:
        """Start a watch. From a revision: the retained changes after it (410 when it is older than the
        history); from None: synthetic ADDED changes for every current object. Later changes arrive on
        the subscription's queue, with no gap and no repeat."""
        with self.lock:
            if from_rv is None:
                backlog = [Change("ADDED", rt, s.rv, s, None) for s in self.items(rt)]
            elif from_rv < self._compacted_rv:
                raise expired(f"too old resource version: {from_rv} ({self._compacted_rv})")
            else:
                backlog = [c for c in self._history if c.rv > from_rv and c.rt.key == rt.key]
            subscription = Subscription(rt, loop)
            self._subscriptions.setdefault(rt.key, set()).add(subscription)
            return subscription, backlog

    def unsubscribe(self, subscription: Subscription) -> None:
        """End a watch's delivery."""
        with self.lock:
            self._subscriptions.get(subscription.rt.key, set()).discard(subscription)

    def bookmark(self, subscription: Subscription, initial_events_end: bool = False) -> None:
        """Queue a bookmark at the current revision, behind every change already queued."""
        with self.lock:
            subscription.push(Bookmark(self._rv, initial_events_end))

    def subscriptions(self) -> list[Subscription]:
        """Every live watch."""
        with self.lock:
            return [s for subs in self._subscriptions.values() for s in subs]

    def expire_history(self) -> None:
        """Forget every change so far: watches and continued lists from older revisions get 410."""
        with self.lock:
            self._history.clear()
            self._compacted_rv = self._rv

    def kinds(self) -> Iterable[str]:
        """Keys of the resources that have ever held an object."""
        with self.lock:
            return list(self._objects)


def _key_range(keys: list[ObjectKey], namespace: str | None, after: ObjectKey | None) -> list[ObjectKey]:
    start, stop = 0, len(keys)
    if namespace is not None:
        start = bisect.bisect_left(keys, (namespace, ""))
        # "\x00" sorts right after the namespace and before any longer namespace with the same prefix.
        stop = bisect.bisect_left(keys, (namespace + "\x00", ""))
    if after is not None:
        start = max(start, bisect.bisect_right(keys, after))
    return keys[start:stop]
