"""LOCAL STAND-IN for the kubelet's pod admission, as far as device allocation goes.

What it does is what the real kubelet does (kubernetes pkg/kubelet/kubelet.go, `HandlePodAdditions`,
and pkg/kubelet/cm/devicemanager/manager.go):
- it watches the pods whose `spec.nodeName` is its node; every change the watch delivers is one
  update, so pods bound one at a time are admitted one at a time, in the order they were bound;
- the pods that arrive in one update (the kubelet starting, or busy: `pause()` ... `resume()`) are
  sorted by `creationTimestamp` with a sort that is not stable: ties come in no promised order (here:
  a seeded shuffle, so a test can meet every order);
- each pod is admitted in full before the next: init containers first, then `spec.containers`, one
  Allocate per container whose limits name the device plugin's resource, with as many device IDs.
An Allocate that fails rejects the pod: it ends `Failed` with reason `UnexpectedAdmissionError`; nothing is
retried. It reads the stand-in API server's change history directly, which serves every watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from kube_vgpu.standins.apiserver.quantity import value as quantity_value
from kube_vgpu.standins.apiserver.resources import PODS
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.apiserver.store import Bookmark, Change, Subscription
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin

log = logging.getLogger(__name__)
_TERMINAL = ("Succeeded", "Failed")


@dataclass
class ContainerAdmission:
    """One container's Allocate: what it asked, what the plugin answered."""

    container: str
    init: bool
    device_ids: list[str]
    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)
    error: str | None = None


@dataclass
class PodAdmission:
    """One pod's admission: its containers' Allocates in the order they were made."""

    namespace: str
    name: str
    uid: str
    containers: list[ContainerAdmission] = field(default_factory=list)
    rejected: str | None = None  # the kubelet's UnexpectedAdmissionError message

    @property
    def key(self) -> str:
        """`namespace/name`."""
        return f"{self.namespace}/{self.name}"


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


class KubeletAdmission:
    """Admits the pods bound to `node_name`, calling Allocate on `kubelet`'s plugin for `resource`."""

    def __init__(
        self,
        kubelet: KubeletStandin,
        apiserver: ApiServerStandin,
        node_name: str,
        resource: str,
        *,
        seed: int = 0,
    ) -> None:
        self.kubelet = kubelet
        self.apiserver = apiserver
        self.node_name = node_name
        self.resource = resource
        self.admitted: list[PodAdmission] = []  # in admission order
        self._random = random.Random(seed)
        self._devices: dict[str, list[str]] = {}  # pod uid -> device IDs it holds
        self._updates: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
        self._held: list[dict[str, Any]] | None = None  # while paused: the update being gathered
        self._subscription: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._changed = asyncio.Event()
        self._seen_rv = 0  # the last change taken in from the watch

    # lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching: the pods already bound here arrive as one update, as at a kubelet start."""
        loop = asyncio.get_running_loop()
        subscription, backlog = self.apiserver.store.subscribe(PODS, None, loop)
        self._subscription = subscription
        self._seen_rv = self.apiserver.store.rv
        first = [c.new.copy() for c in backlog if self._arrives(c)]
        if first:
            self._updates.put_nowait(first)
        self._tasks = [
            asyncio.create_task(self._watch(subscription), name="kubelet-watch"),
            asyncio.create_task(self._admit_loop(), name="kubelet-admit"),
        ]

    async def stop(self) -> None:
        """Stop watching and admitting."""
        if self._subscription is not None:
            self.apiserver.store.unsubscribe(self._subscription)
            self._subscription = None
        for task in self._tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def pause(self) -> None:
        """A busy kubelet: the pods bound from now on reach it together, at `resume()`."""
        if self._held is None:
            self._held = []

    async def resume(self) -> None:
        """Deliver what arrived while paused as one update (sorted by creation time): every change
        committed before this call is taken in first."""
        target = self.apiserver.store.rv
        async with asyncio.timeout(30):
            while self._seen_rv < target:
                await self._changed.wait()
        held, self._held = self._held, None
        if held:
            self._updates.put_nowait(held)

    # watching ------------------------------------------------------------------------------------

    def _arrives(self, change: Change) -> bool:
        """Whether this change brings a pod to this node (its bind, or its first sight here)."""
        new = change.new.obj
        was_here = change.old is not None and (change.old.obj.get("spec") or {}).get("nodeName") == (
            self.node_name
        )
        return (
            change.type != "DELETED"
            and (new.get("spec") or {}).get("nodeName") == self.node_name
            and not was_here
        )

    async def _watch(self, subscription: Subscription) -> None:
        while True:
            item = await subscription.queue.get()
            if item is None or isinstance(item, Bookmark):
                continue
            self._seen_rv = max(self._seen_rv, item.rv)
            self._notify()
            if item.type == "DELETED" or (item.new.obj.get("status") or {}).get("phase") in _TERMINAL:
                self._devices.pop(str(_meta(item.new.obj).get("uid", "")), None)
            if not self._arrives(item):
                continue
            pod = item.new.copy()
            if self._held is not None:
                self._held.append(pod)
            else:
                self._updates.put_nowait([pod])

    # admitting -----------------------------------------------------------------------------------

    async def _admit_loop(self) -> None:
        while True:
            update = await self._updates.get()
            # HandlePodAdditions: sort.Sort(PodsByCreationTime), not stable: ties in no promised order.
            self._random.shuffle(update)
            update.sort(key=lambda p: str(_meta(p).get("creationTimestamp") or ""))
            for pod in update:
                admission = await self._admit(pod)
                if admission.rejected is not None:
                    self._fail(admission)
                self.admitted.append(admission)
                self._notify()

    def _fail(self, admission: PodAdmission) -> None:
        """A rejected pod ends Failed, as the kubelet's admission failure leaves it."""
        status = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": admission.rejected}
        with contextlib.suppress(Exception):  # deleted meanwhile: nothing to record
            self.apiserver.patch("Pod", admission.name, {"status": status}, admission.namespace, "merge")

    def _count(self, container: Mapping[str, Any]) -> int:
        limits = (container.get("resources") or {}).get("limits") or {}
        raw = limits.get(self.resource)
        return 0 if raw is None else quantity_value(str(raw))

    def _free_devices(self) -> list[str]:
        plugin = self.kubelet.plugins.get(self.resource)
        held = {d for ids in self._devices.values() for d in ids}
        devices = plugin.devices if plugin is not None else []
        return [d.id for d in devices if d.health == "Healthy" and d.id not in held]

    async def _admit(self, pod: Mapping[str, Any]) -> PodAdmission:
        meta = _meta(pod)
        result = PodAdmission(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid")))
        spec = pod.get("spec") or {}
        groups = ((spec.get("initContainers") or [], True), (spec.get("containers") or [], False))
        for containers, init in groups:
            for container in containers:
                count = self._count(container)
                if count <= 0:
                    continue
                free = self._free_devices()
                if len(free) < count:
                    result.rejected = f"Allocate failed: requested {count} {self.resource}, {len(free)} free"
                    return result
                ids = free[:count]
                admission = ContainerAdmission(str(container.get("name", "")), init, ids)
                result.containers.append(admission)
                try:
                    response = await self.kubelet.allocate(self.resource, ids, deadline=60)
                except grpc.aio.AioRpcError as exc:
                    admission.error = exc.details() or exc.code().name
                    result.rejected = f"Allocate failed due to {admission.error}, which is unexpected"
                    log.info("event=pod_rejected pod=%s reason=%r", result.key, result.rejected)
                    return result
                self._devices.setdefault(result.uid, []).extend(ids)
                answer = response.container_responses[0]
                admission.envs = dict(sorted(answer.envs.items()))
                admission.mounts = [(m.container_path, m.host_path, m.read_only) for m in answer.mounts]
        return result

    # queries -------------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def result(self, namespace: str, name: str) -> PodAdmission | None:
        """The admission of a pod, once it happened."""
        return next((a for a in self.admitted if (a.namespace, a.name) == (namespace, name)), None)

    async def wait_admitted(self, namespace: str, name: str, *, within: float = 30.0) -> PodAdmission:
        """Wait until the pod has been admitted (or rejected); TimeoutError after `within` seconds."""
        async with asyncio.timeout(within):
            while (found := self.result(namespace, name)) is None:
                await self._changed.wait()
        return found
