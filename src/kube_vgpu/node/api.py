"""The node plugin's Kubernetes API calls, awaited from the event loop and always bounded in time.

`kubeapi.Kube` is synchronous, so each call runs on a small thread pool of its own; the HTTP read
timeout and an asyncio deadline both equal the caller's budget, so a hung API server costs that
budget and nothing more (the kubelet's Allocate has no deadline of its own).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kube, PatchType
from kube_vgpu.kubeapi.listwatch import KubeSource, ListVersion, list_arguments
from kube_vgpu.node.deviceplugin.selection import PodRef
from kube_vgpu.node.events import EventRecorder

_T = TypeVar("_T")
# Never wait less than this on a connect, however little budget is left: it is the floor of a try.
_MIN_CALL_SECONDS = 0.05
# The socket's read timeout runs this much past a call's budget: the budget (an asyncio deadline) is
# what decides, with one message, and the socket timeout only frees the worker thread soon after.
# Were they equal, whichever fired first would pick the error (a flaky answer for the same hang).
_SOCKET_GRACE_SECONDS = 1.0
# An Event is best effort and posted in the background: it may take this long, never more.
EVENT_BUDGET_SECONDS = 5.0


def json_pointer(*parts: str) -> str:
    """An RFC 6901 pointer from raw path segments (annotation keys hold `/`)."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def annotation_path(key: str) -> str:
    """The JSON pointer of one annotation."""
    return json_pointer("metadata", "annotations", key)


class NodeApi:
    """Pods on this node, this node's object, and the patches the plugin writes."""

    def __init__(self, kube: Kube, node_name: str, *, workers: int = 4) -> None:
        self.kube = kube
        self.node_name = node_name
        self._node_selector = f"metadata.name={node_name}"
        self._pod_selector = f"spec.nodeName={node_name}"
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kube-vgpu-api")
        self._pods_version = ListVersion()
        self.events = EventRecorder(self.create_event, node_name)

    async def _run(self, budget: float, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        budget = max(budget, _MIN_CALL_SECONDS)
        kwargs["timeout"] = (min(budget, 5.0) + _SOCKET_GRACE_SECONDS, budget + _SOCKET_GRACE_SECONDS)
        future = asyncio.get_running_loop().run_in_executor(
            self._pool, functools.partial(fn, *args, **kwargs)
        )
        try:
            async with asyncio.timeout(budget):
                return await future
        except TimeoutError:
            raise ApiUnavailable(f"no answer from the API server within {budget:.1f}s") from None

    async def pods_on_node(self, budget: float) -> list[dict[str, Any]]:
        """Every pod bound to this node (field selector `spec.nodeName`), as a consistent read: for
        the calls that must see a bind or a booking made a moment ago (an Allocate, the kubelet's
        restart, the MIG layouts adopted at start)."""
        result = await self._run(budget, self.kube.list, "pod", field_selector=self._pod_selector)
        self._pods_version.listed(_list_version(result))
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def pods_on_node_cached(self, budget: float) -> list[dict[str, Any]]:
        """Every pod bound to this node, as the API server's watch cache holds them, never older than
        the last list of them (`ListVersion`): for the periodic sweeps, which every node repeats and
        which wait out a grace period before acting on a pod's absence."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            asked = self._pods_version.next()
            try:
                result = await self._run(
                    deadline - loop.time(),
                    self.kube.list,
                    "pod",
                    field_selector=self._pod_selector,
                    **list_arguments(asked, None),
                )
            except ApiError as exc:
                if self._pods_version.failed(asked, exc):
                    continue  # at once, as a consistent read, as client-go's reflector does
                raise
            self._pods_version.listed(_list_version(result))
            items: list[dict[str, Any]] = result.get("items") or []
            return items

    def pods_source(self, list_timeout: float) -> KubeSource:
        """The pods bound to this node as the pod watch's reflector lists (in pages) and watches them."""
        return KubeSource(self.kube, "pod", field_selector=self._pod_selector, list_timeout=list_timeout)

    async def node(self, budget: float) -> dict[str, Any] | None:
        """This node's object (None when it does not exist)."""
        node, _ = await self._run(budget, self.read_node)
        return node

    def read_node(self, *, timeout: Any) -> tuple[dict[str, Any] | None, str]:
        """This node's object (None when it does not exist) and the list's resourceVersion, blocking."""
        result = self.kube.list("node", field_selector=self._node_selector, timeout=timeout)
        items = result.get("items") or []
        return (items[0] if items else None), _list_version(result)

    def node_source(self, list_timeout: float) -> KubeSource:
        """This node alone (by `metadata.name`) as the publisher's reflector lists and watches it."""
        return KubeSource(self.kube, "node", field_selector=self._node_selector, list_timeout=list_timeout)

    async def patch_pod(
        self,
        pod: PodRef,
        body: Mapping[str, Any] | list[dict[str, Any]],
        patch_type: PatchType,
        budget: float,
    ) -> dict[str, Any]:
        """Patch a pod; returns it as stored."""
        return await self._run(
            budget, self.kube.patch, "pod", pod.name, body, namespace=pod.namespace, patch_type=patch_type
        )

    async def patch_node(
        self,
        body: Mapping[str, Any] | list[dict[str, Any]],
        budget: float,
        *,
        patch_type: PatchType = "merge",
        subresource: str = "",
    ) -> dict[str, Any]:
        """Patch this node (or its `status`); returns it as stored."""
        return await self._run(
            budget,
            self.kube.patch,
            "node",
            self.node_name,
            body,
            patch_type=patch_type,
            subresource=subresource,
        )

    async def create_event(self, event: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        """Create one core v1 Event (see src/kube_vgpu/node/events.py)."""
        return await self._run(EVENT_BUDGET_SECONDS, self.kube.create, "event", event, namespace=namespace)

    def close(self) -> None:
        """Wait for calls still on their threads (each bounded by its own timeout) and release them."""
        self._pool.shutdown(wait=True, cancel_futures=True)


def _list_version(result: Mapping[str, Any]) -> str:
    return str((result.get("metadata") or {}).get("resourceVersion") or "")


def is_conflict(exc: BaseException) -> bool:
    """A write lost to a concurrent one: 409 Conflict, or 422 from a failed JSON-patch `test`."""
    return isinstance(exc, ApiError) and exc.status in (409, 422)
