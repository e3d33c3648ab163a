"""The watch of this node's pods that teaches `BindOrder` the order of their binds.

It lists the pods bound to the node and watches from that list's resourceVersion on a thread of its
own (`kubeapi.listwatch.Reflector`), like the kubelet's own pod source, so it sees the binds in the
order the kubelet does. A 410 or a garbled stream means a relist: pods bound meanwhile are ranked by
the fallback rule.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kube_vgpu.kubeapi.listwatch import DEFAULT_PAGE_SIZE, Backoff, Handlers, Listed, Reflector, WatchEvent
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.bind_order import BindOrder

log = logging.getLogger(__name__)

_RETRY_SECONDS = 1.0
_MAX_RETRY_SECONDS = 30.0


class PodWatch:
    """Feeds a BindOrder from a list+watch; `wait_known` lets an Allocate wait for it to catch up."""

    def __init__(
        self,
        api: NodeApi,
        order: BindOrder,
        *,
        call_budget: float,
        watch_timeout: int,
        page_size: int = DEFAULT_PAGE_SIZE,
    ) -> None:
        self._api = api
        self.order = order
        self._budget = call_budget
        self._watch_timeout = watch_timeout
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reflector: Reflector[dict[str, Any]] = Reflector(
            api.pods_source(call_budget),
            Handlers(listed=self._post_list, event=self._post_event),
            transform=lambda pod: pod,
            name=f"node-pods/{api.node_name}",
            page_size=page_size,
            watch_timeout_seconds=watch_timeout,
            backoff=Backoff(initial=_RETRY_SECONDS, maximum=_MAX_RETRY_SECONDS),
            list_from_cache=True,
        )

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
                async with asyncio.timeout(left):
                    await changed.wait()
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

    # on the reflector's thread ---------------------------------------------------------------------

    def _post_list(self, listed: Listed[dict[str, Any]]) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_list, [pod for _, pod in listed.items])

    def _post_event(self, event: WatchEvent[dict[str, Any]]) -> None:
        if self._loop is not None and event.obj is not None:
            self._loop.call_soon_threadsafe(self._on_event, event.type, event.obj)

    def watch_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        """List, then watch; a watch that ends is resumed from the last version seen, and only an
        error (410 Gone, a garbled stream) costs a relist. Returns once `stop` is called."""
        self._loop = loop
        self._reflector.run()

    def stop(self) -> None:
        """End `watch_forever` (from any thread)."""
        self._reflector.stop()
