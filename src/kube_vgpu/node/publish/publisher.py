"""Keeps the Node object saying what `node.publish` computes: register annotation, labels, capacity.

Reconciles on start (before the kubelet registration), after every health change, every
`registerIntervalSeconds`, and whenever a watch of the node shows it drifted (the kubelet zeroes
extended resources after its checkpoint is lost; someone may remove a label). Each reconcile reads the
node and patches only what differs, so a steady node costs one GET per interval and no writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import NODE_HANDSHAKE
from kube_vgpu.kubeapi.client import KubeError
from kube_vgpu.kubeapi.listwatch import Backoff, Handlers, Listed, Reflector, WatchEvent
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.publish.advertise import (
    capacity,
    capacity_patch,
    desired_labels,
    handshake_due,
    handshake_value,
    metadata_patch,
    register_value,
)

log = logging.getLogger(__name__)

_RETRY_SECONDS = 2.0
_MAX_WATCH_RETRY_SECONDS = 30.0


class NodeMissing(Exception):
    """The Node object does not exist (yet): nothing to publish on."""


class NodePublisher:
    """Publishes the inventory onto the Node object and keeps it there."""

    def __init__(
        self,
        api: NodeApi,
        inventory: LiveGpus,
        *,
        mode: str,
        names: ResourceNames,
        interval: float,
        call_budget: float = 10.0,
        watch_timeout_seconds: int = 300,
        handshake: bool = False,
    ) -> None:
        self._api = api
        self._handshake = handshake
        self._inventory = inventory
        self._mode = mode
        self._names = names
        self._interval = interval
        self._budget = call_budget
        self._watch_timeout = watch_timeout_seconds
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reflector: Reflector[dict[str, Any]] = Reflector(
            api.node_source(call_budget),
            # The list is the "list" of list-then-watch: a drift that happened before the watch
            # starts shows only there, never as an event.
            Handlers(listed=self._post_list, event=self._post_event),
            transform=lambda node: node,
            name=f"node/{api.node_name}",
            watch_timeout_seconds=watch_timeout_seconds,
            backoff=Backoff(initial=_RETRY_SECONDS, maximum=_MAX_WATCH_RETRY_SECONDS),
            list_from_cache=True,
        )
        self.published = 0  # reconciles that wrote something (for tests and logs)

    def _wanted(self) -> tuple[str, dict[str, str], dict[str, str]]:
        inv = self._inventory
        return (
            register_value(inv.gpus, inv.unhealthy, inv.split_count, self._mode),
            desired_labels(inv.gpus, self._mode),
            capacity(inv.gpus, inv.unhealthy, self._names, split_count=inv.split_count),
        )

    def drifted(self, node: Mapping[str, Any]) -> bool:
        """Whether a Node object differs from what should be published."""
        register, labels, wanted = self._wanted()
        return metadata_patch(node, register, labels) is not None or capacity_patch(node, wanted) is not None

    async def reconcile(self) -> bool:
        """Bring the Node up to date; returns whether anything was written. Raises KubeError, NodeMissing."""
        node = await self._api.node(self._budget)
        if node is None:
            raise NodeMissing(f"node {self._inventory.node_name} does not exist")
        register, labels, wanted = self._wanted()
        wrote = False
        meta = metadata_patch(node, register, labels)
        if self._handshake and handshake_due(node):
            # Only here, never on a watch event: the old scheduler rewrites it after every change.
            meta = meta or {"metadata": {}}
            meta["metadata"].setdefault("annotations", {})[NODE_HANDSHAKE] = handshake_value(
                datetime.now(UTC)
            )
        if meta is not None:
            await self._api.patch_node(meta, self._budget)
            log.info(
                "event=node_published node=%s annotations=%s labels=%s",
                self._inventory.node_name,
                meta["metadata"].get("annotations") or {},
                sorted((meta["metadata"].get("labels") or {}).items()),
            )
            wrote = True
        status = capacity_patch(node, wanted)
        if status is not None:
            await self._api.patch_node(status, self._budget, subresource="status")
            log.info(
                "event=capacity_advertised node=%s capacity=%s",
                self._inventory.node_name,
                status["status"]["capacity"],
            )
            wrote = True
        self.published += wrote
        return wrote

    async def publish_first(self, stop: asyncio.Event) -> bool:
        """Reconcile until it succeeds once (or `stop` is set): the kubelet registration waits on it."""
        while not stop.is_set():
            try:
                await self.reconcile()
                return True
            except (KubeError, NodeMissing) as exc:
                log.warning(
                    "event=publish_failed node=%s error=%r retry_in=%g",
                    self._inventory.node_name,
                    str(exc),
                    _RETRY_SECONDS,
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_RETRY_SECONDS):
                    await stop.wait()
        return False

    def trigger(self) -> None:
        """Reconcile soon (from the loop)."""
        self._wake.set()

    async def run(self) -> None:
        """Reconcile on every trigger and every interval, forever (cancel to stop)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.reconcile()
            except (KubeError, NodeMissing) as exc:
                log.warning("event=publish_failed node=%s error=%r", self._inventory.node_name, str(exc))
                await asyncio.sleep(_RETRY_SECONDS)
                self._wake.set()

    # the watch, on a thread of its own ------------------------------------------------------------

    def watch_forever(self, loop: asyncio.AbstractEventLoop) -> None:
        """Watch this node and trigger a reconcile when it drifts; returns once `stop_watch` is called."""
        self._loop = loop
        self._reflector.run()

    def _post_list(self, listed: Listed[dict[str, Any]]) -> None:
        if self._loop is not None:
            for _, node in listed.items:
                self._loop.call_soon_threadsafe(self._on_node, node)

    def _post_event(self, event: WatchEvent[dict[str, Any]]) -> None:
        if self._loop is not None and event.obj is not None and event.type in ("ADDED", "MODIFIED"):
            self._loop.call_soon_threadsafe(self._on_node, event.obj)

    def _on_node(self, node: Mapping[str, Any]) -> None:
        if self.drifted(node):
            log.info("event=node_drift node=%s", self._inventory.node_name)
            self.trigger()

    def stop_watch(self) -> None:
        """End `watch_forever` (from any thread)."""
        self._reflector.stop()
