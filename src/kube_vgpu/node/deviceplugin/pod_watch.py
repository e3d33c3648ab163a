"""The watch of this node's pods that teaches `BindOrder` the order of their binds (SPEC §3).

It lists the pods bound to the node and watches from that list's resourceVersion on a thread of its
own, like the kubelet's own pod source, so it sees the binds in the order the kubelet does. A 410 or
a broken stream means a relist: pods bound meanwhile are ranked by the fallback rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.bind_order import BindOrder
from kube_vgpu.node.watch_thread import WatchSwitch

log = logging.getLogger("kube_vgpu.node.pod_watch")

_RETRY_SECONDS = 1.0


class PodWatch:
    """Feeds a BindOrder from a list+watch; `wait_known` lets an Allocate wait for it to catch up."""

    def __init__(self, api: NodeApi, order: BindOrder, *, call_budget: float, watch_timeout: int) -> None:
        self._api = api
        self.order = order
        self._budget = call_budget
        self._watch_timeout = watch_timeout
        self._switch = WatchSwitch()
        self._changed = asyncio.Event()

    async def wait_known(self, pods: Iterable[Mapping[str, Any]], within: float) -> bool:
        """Wait (at most `within` seconds) until every pod's bind has been taken in; whether it was.

        The kubelet and this watch hear of a bind from the same API server, but either may hear first:
        a pod the Allocate lists and the watch has not delivered yet was bound after every pod known.
        """
        waiting = list(pods)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not all(self.order.knows(p) for p in waiting):
            left = deadline - loop.time()
            if left <= 0:
                return False
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return False
        return True

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _on_list(self, pods: list[dict[str, Any]]) -> None:
        self.order.listed(pods)
        self._notify()

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        self.order.event(kind, pod)
        self._notify()

    def watch_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        """List, then watch; a watch that ends is resumed from the last version seen, and only an
        error (410 Gone, a broken stream) costs a relist. Returns once `stop` is called."""
        api = self._api
        version: str | None = None
        while (interrupt := self._switch.next_round()) is not None:
            try:
                if version is None:
                    pods, version = api.read_pods(timeout=self._budget)
                    loop.call_soon_threadsafe(self._on_list, pods)
                for event in api.watch_pods(version, interrupt, self._watch_timeout):
                    kind = str(event.get("type"))
                    if kind == "ERROR":
                        version = None  # 410 Gone or another error: list again
                        break
                    pod = event.get("object")
                    if not isinstance(pod, dict):
                        continue
                    seen = (pod.get("metadata") or {}).get("resourceVersion")
                    version = str(seen) if seen else version
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        loop.call_soon_threadsafe(self._on_event, kind, pod)
            except (ApiError, ApiUnavailable) as exc:
                if interrupt.interrupted:
                    return
                version = None
                log.info("event=pod_watch_interrupted node=%s error=%r", api.node_name, str(exc))
                self._switch.pause(_RETRY_SECONDS)
            except Exception as exc:  # a garbled stream must not end the watch for good
                version = None
                log.error("event=pod_watch_failed node=%s error=%r", api.node_name, repr(exc))
                self._switch.pause(_RETRY_SECONDS)

    def stop(self) -> None:
        """End `watch_forever` (from any thread)."""
        self._switch.stop()
