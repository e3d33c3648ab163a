"""The order in which the kubelet will admit this node's pods, learned from the pods' bind events.

The kubelet sends Allocate with no pod identity and admits pods in the order their bindings reach
it; pods that arrive in one update (a kubelet starting or restarting) go in creation order (kubernetes
pkg/kubelet/kubelet.go, `HandlePodAdditions` sorts by creation time). Creation time, `vgpu-time` and
`bind-time` all have one-second resolution, so pods a scheduler binds within one second tie on all three, and
only the order of the bind events tells them apart. The plugin watches its node's pods, as the kubelet
does, from the same API server and so in the same order: a pod's first event there is its bind.

Pods bound before the plugin started (or while its watch was away) have no observed event; they rank
first, oldest `vgpu-time`, then `bind-time`, then creation time. After a kubelet
restart, the pods then waiting reach it in one update, so they rank by creation time, bind order
breaking ties. Pure: events in, a sort key out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kube_vgpu.contract.names import BIND_TIME, VGPU_TIME

_UINT64_MAX = 2**64 - 1
Fallback = tuple[int, int, str, str, str]
# (tier, creation time, fallback, sequence). Tiers: 0 the batch after a kubelet restart (creation
# order); 1 bound before we watched (fallback order); 2 binds we saw (their order); 3 not seen yet.
SortKey = tuple[int, str, Fallback, int]
_NO_FALLBACK: Fallback = (0, 0, "", "", "")


def _uint(text: object) -> int:
    # Missing, over-long or unparseable times sort last, as in the reference plugin.
    if isinstance(text, str) and text.isdigit() and text.isascii():
        return min(int(text), _UINT64_MAX)
    return _UINT64_MAX


def _metadata(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = pod.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _uid(pod: Mapping[str, Any]) -> str:
    return str(_metadata(pod).get("uid") or "")


def _created(pod: Mapping[str, Any]) -> str:
    return str(_metadata(pod).get("creationTimestamp") or "~")  # RFC 3339 in UTC sorts as text


def fallback_key(pod: Mapping[str, Any]) -> Fallback:
    """The order for pods whose bind we did not see: vgpu-time, bind-time, creation."""
    metadata = _metadata(pod)
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    return (
        _uint(annotations.get(VGPU_TIME)),
        _uint(annotations.get(BIND_TIME)),
        _created(pod),
        str(metadata.get("namespace") or ""),
        str(metadata.get("name") or ""),
    )


class BindOrder:
    """Ranks of this node's pods by uid, fed by a list+watch of the pods bound to the node."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}  # uid -> sequence of its bind event
        self._listed: set[str] = set()  # uids first known from a list (bind not observed)
        self._batch: set[str] = set()  # uids waiting when the kubelet last restarted
        self._next = 0
        self.synced = False  # a first list has been taken in

    def listed(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Take in a (re)list; gone pods are forgotten. At the first list, unknown pods were bound
        before the plugin watched: they rank first, by the fallback. At a relist, unknown pods were
        bound while the watch was away, after every bind already seen: they rank after those, by the
        fallback among themselves."""
        pods = [p for p in pods if _uid(p)]
        current = {_uid(p) for p in pods}
        for uid in list(self._seen):
            if uid not in current:
                self._forget(uid)
        for pod in sorted((p for p in pods if _uid(p) not in self._seen), key=fallback_key):
            self._seen[_uid(pod)] = self._next
            self._next += 1
            if not self.synced:
                self._listed.add(_uid(pod))
        self.synced = True

    def event(self, kind: str, pod: Mapping[str, Any]) -> None:
        """Take in one watch event of a pod bound to this node."""
        uid = _uid(pod)
        if not uid:
            return
        if kind == "DELETED":
            self._forget(uid)
        elif kind in ("ADDED", "MODIFIED") and uid not in self._seen:
            self._seen[uid] = self._next  # its first event: the bind
            self._next += 1

    def kubelet_restarted(self, waiting: Iterable[Mapping[str, Any]]) -> None:
        """The kubelet restarted: the pods still waiting reach it in one update, in creation order."""
        self._batch = {_uid(p) for p in waiting if _uid(p) in self._seen}

    def knows(self, pod: Mapping[str, Any]) -> bool:
        """Whether this pod's bind (or its presence in a list) has been taken in."""
        return _uid(pod) in self._seen

    def key(self, pod: Mapping[str, Any]) -> SortKey:
        """Sort key: the pod the kubelet admits first sorts first. Unknown pods were bound after
        everything known (the watch delivers in order), so they sort last, by the fallback."""
        uid = _uid(pod)
        if uid in self._batch:
            return (0, _created(pod), _NO_FALLBACK, self._seen[uid])
        if uid in self._listed:
            return (1, "", fallback_key(pod), self._seen[uid])
        if uid in self._seen:
            return (2, "", _NO_FALLBACK, self._seen[uid])
        return (3, "", fallback_key(pod), 0)

    def _forget(self, uid: str) -> None:
        self._seen.pop(uid, None)
        self._listed.discard(uid)
        self._batch.discard(uid)
