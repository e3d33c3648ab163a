"""Allocate for `vgpu-number`: find the pod, honour the scheduler's choice, consume its entry.

The decisions are pure (`node.deviceplugin.selection`, `node.deviceplugin.verify`,
`node.deviceplugin.hamicore`); this module does the I/O
around them within `allocateTimeoutSeconds`: list the node's pods, consume the entry with a JSON patch
that first tests the value it read (so two writers never take the same entry; the loser re-reads and
retries), write the bind phase, release the node lock. It never touches
`volcano.sh/vgpu-ids-new`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from kube_vgpu.contract.config import NodeConfig, ResourceNames
from kube_vgpu.contract.names import (
    BIND_PHASE,
    BIND_PHASE_ALLOCATING,
    BIND_PHASE_FAILED,
    BIND_PHASE_SUCCESS,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_TIME,
    VGPU_TIME_DONE,
)
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable
from kube_vgpu.node.api import NodeApi, annotation_path, is_conflict
from kube_vgpu.node.deviceplugin.bind_order import fallback_key
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.deviceplugin.cache_folders import make_folder
from kube_vgpu.node.deviceplugin.hamicore import (
    DEFAULT_LOCK_DIR,
    ContainerResponse,
    build_response,
    cache_dir,
)
from kube_vgpu.node.deviceplugin.pod_watch import PodWatch
from kube_vgpu.node.deviceplugin.selection import (
    Claim,
    PodRef,
    annotations_of,
    is_allocating_here,
    pod_ref,
    select,
)
from kube_vgpu.node.deviceplugin.server import AllocateFailed
from kube_vgpu.node.deviceplugin.verify import claim_problem
from kube_vgpu.node.metrics import Metrics
from kube_vgpu.node.mig.manager import MigManager, MigRefused
from kube_vgpu.node.nvml.inventory import LiveGpus

log = logging.getLogger(__name__)

# Rounds of list + consume before a pod that keeps losing races is given up on.
MAX_ROUNDS = 5
# How long an Allocate waits for the pod watch to deliver binds the list already shows.
CATCH_UP_SECONDS = 2.0


@dataclass
class _Attempt:
    """What one Allocate got to before a deadline cut it short."""

    pod: PodRef | None = None
    settled: bool = False  # the pod's annotations already say how this ended


class _Refused(Exception):
    def __init__(self, message: str, reason: str, code: grpc.StatusCode) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code


def consume_ops(claim: Claim) -> list[dict[str, Any]]:
    """The JSON patch that consumes `claim`'s entry, only if nobody did since it was read."""
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": annotation_path(DEVICES_TO_ALLOCATE), "value": claim.value},
        {"op": "test", "path": annotation_path(BIND_PHASE), "value": BIND_PHASE_ALLOCATING},
        {"op": "replace", "path": annotation_path(DEVICES_TO_ALLOCATE), "value": claim.consumed_value},
    ]
    if claim.last:
        ops += [
            {"op": "replace", "path": annotation_path(BIND_PHASE), "value": BIND_PHASE_SUCCESS},
            {"op": "replace", "path": annotation_path(VGPU_TIME), "value": VGPU_TIME_DONE},
        ]
    return ops


def failed_patch() -> dict[str, Any]:
    """The merge patch that marks a pod's allocation failed (volcano-vgpu-device-plugin's pkg/util/util.go,
    `PodAllocationFailed`)."""
    return {"metadata": {"annotations": {BIND_PHASE: BIND_PHASE_FAILED, VGPU_TIME: VGPU_TIME_DONE}}}


class Allocator:
    """Answers the kubelet's Allocate calls for `vgpu-number` in hami-core mode."""

    def __init__(
        self,
        api: NodeApi,
        inventory: LiveGpus,
        ledger: Ledger,
        metrics: Metrics,
        *,
        mode: str,
        names: ResourceNames,
        config: NodeConfig,
        lock_dir: str = DEFAULT_LOCK_DIR,
        new_cache_file: Callable[[], str] = lambda: f"{uuid.uuid4()}.cache",
        mig: MigManager | None = None,
        pod_watch: PodWatch | None = None,
    ) -> None:
        self._api = api
        self._inventory = inventory
        self._ledger = ledger
        self._metrics = metrics
        self._node = inventory.node_name
        self._mode = mode
        self._names = names
        self._config = config
        self._lock_dir = lock_dir
        self._new_cache_file = new_cache_file
        self._mig = mig  # mig mode: MIG slots instead of the hami-core response
        self._pod_watch = pod_watch  # the bind order; without it, the reference plugin's oldest-first rule
        self._background: set[asyncio.Task[None]] = set()
        # Allocates of this process run one at a time: concurrent ones would all pick the same oldest
        # pod and all but one lose the JSON-patch test, round after round. The test still guards
        # against other writers (a second plugin during a rolling update). The wait counts against
        # each call's own deadline.
        self._one_at_a_time = asyncio.Lock()

    async def allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        """Answer one Allocate of `len(device_ids)` vGPUs, or raise AllocateFailed with the reason."""
        timeout = self._config.allocate_timeout_seconds
        deadline = asyncio.get_running_loop().time() + timeout
        attempt = _Attempt()
        try:
            async with asyncio.timeout_at(deadline), self._one_at_a_time:
                response = await self._allocate(len(device_ids), attempt, deadline)
        except TimeoutError:
            message = (
                f"Allocate of {len(device_ids)} vGPU(s) on node {self._node} found no answer within "
                f"{timeout:g}s: the API server is slow or unreachable"
            )
            if attempt.pod is not None:
                message = f"pod {attempt.pod}: {message}"
                if not attempt.settled:
                    self._spawn(
                        self._settle_failed(attempt.pod, "allocation timed out", self._deadline(timeout))
                    )
            self._spawn(self._release_lock(self._deadline(timeout)))
            self._metrics.failed("timeout")
            self._api.events.allocate_refused(attempt.pod, message)
            log.error("event=allocate_failed node=%s pod=%s reason=timeout", self._node, attempt.pod or "-")
            raise AllocateFailed(message, grpc.StatusCode.DEADLINE_EXCEEDED) from None
        except _Refused as exc:
            # Every refusal frees the node for Volcano's next pod (as volcano-vgpu-device-plugin's
            # pkg/util/nodelock/nodelock.go: the plugin deletes the lock on any per-pod failure and when no
            # pending pod is found).
            await self._release_lock(deadline)
            self._metrics.failed(exc.reason)
            self._api.events.allocate_refused(attempt.pod, str(exc))
            log.error(
                "event=allocate_failed node=%s pod=%s reason=%s message=%r",
                self._node,
                attempt.pod or "-",
                exc.reason,
                str(exc),
            )
            raise AllocateFailed(str(exc), exc.code) from None
        self._metrics.allocations.inc()
        return response

    async def _rank(self, pods: Sequence[dict[str, Any]], deadline: float) -> Callable[[Any], Any]:
        """The kubelet's admission order over `pods`, once the pod watch has seen their binds."""
        if self._pod_watch is None:
            return fallback_key
        waiting = [p for p in pods if is_allocating_here(p, self._node)]
        within = min(CATCH_UP_SECONDS, self._left(deadline) / 2)
        if not await self._pod_watch.wait_known(waiting, within):
            log.info(
                "event=bind_order_unknown node=%s pods=%s: the pod watch is behind; ranking them last",
                self._node,
                ",".join(str(pod_ref(p)) for p in waiting if not self._pod_watch.order.knows(p)),
            )
        return self._pod_watch.order.key

    def _left(self, deadline: float) -> float:
        return deadline - asyncio.get_running_loop().time()

    def _deadline(self, seconds: float) -> float:
        return asyncio.get_running_loop().time() + seconds

    async def _allocate(self, count: int, attempt: _Attempt, deadline: float) -> ContainerResponse:
        for _round in range(MAX_ROUNDS):
            try:
                pods = await self._api.pods_on_node(self._left(deadline))
            except (ApiError, ApiUnavailable) as exc:
                raise _Refused(
                    f"cannot list the pods of node {self._node}: {exc}",
                    "api_unavailable",
                    grpc.StatusCode.UNAVAILABLE,
                ) from None
            selection = select(pods, self._node, count, self._names, await self._rank(pods, deadline))
            for broken in selection.broken:
                await self._settle_failed(broken.pod, broken.reason, deadline)
            claim = selection.claim
            if claim is None:
                if selection.broken:
                    reasons = "; ".join(f"pod {b.pod}: {b.reason}" for b in selection.broken)
                    raise _Refused(reasons, "broken_pod", grpc.StatusCode.FAILED_PRECONDITION)
                raise _Refused(
                    f"no pod on node {self._node} is waiting for {count} vGPU(s) "
                    f"({selection.allocating} pod(s) allocating here)",
                    "no_pod",
                    grpc.StatusCode.NOT_FOUND,
                )
            attempt.pod = claim.pod
            response = await self._honour(claim, pods, deadline, attempt)
            if response is not None:
                return response
        assert attempt.pod is not None  # every round that did not return or raise found a claim
        await self._settle_failed(attempt.pod, "lost the race for its entry too often", deadline)
        attempt.settled = True
        raise _Refused(
            f"pod {attempt.pod}: devices-to-allocate kept changing under {MAX_ROUNDS} attempts",
            "conflict",
            grpc.StatusCode.ABORTED,
        )

    async def _honour(
        self,
        claim: Claim,
        pods: Sequence[dict[str, Any]],
        deadline: float,
        attempt: _Attempt,
    ) -> ContainerResponse | None:
        """Check, build and consume one claim; None when another Allocate consumed it first."""
        inventory = self._inventory
        problem = claim_problem(
            claim.records,
            claim.annotations,
            inventory.by_uuid,
            {uuid: inventory.reason(uuid) or "" for uuid in inventory.unhealthy},
            self._mode,
            container=claim.container,
            names=self._names,
        )
        response: ContainerResponse | None = None
        if problem is None and self._mig is not None:
            try:
                response = await self._mig.respond(claim, pods)
            except MigRefused as exc:
                problem = str(exc)
        elif problem is None:
            try:
                self._make_dirs(claim)
            except OSError as exc:
                problem = f"cannot create the cache directory: {exc.strerror or exc}"
        if problem is not None:
            await self._settle_failed(claim.pod, problem, deadline)
            attempt.settled = True
            raise _Refused(f"pod {claim.pod}: {problem}", "rejected", grpc.StatusCode.FAILED_PRECONDITION)
        response = response or build_response(
            claim.records,
            inventory.by_uuid,
            claim.container,
            pod_uid=claim.pod.uid,
            hook_path=self._config.hook_path,
            cache_file=self._new_cache_file(),
            lock_dir=self._lock_dir,
        )
        try:
            updated = await self._api.patch_pod(claim.pod, consume_ops(claim), "json", self._left(deadline))
        except (ApiError, ApiUnavailable) as exc:
            if is_conflict(exc):
                log.info(
                    "event=allocate_conflict node=%s pod=%s entry=%d", self._node, claim.pod, claim.index
                )
                return None
            budget = self._deadline(self._config.allocate_timeout_seconds)
            self._spawn(self._settle_failed(claim.pod, f"cannot record the allocation: {exc}", budget))
            attempt.settled = True
            raise _Refused(
                f"pod {claim.pod}: cannot record the allocation: {exc}",
                "api_unavailable",
                grpc.StatusCode.UNAVAILABLE,
            ) from None
        attempt.settled = True
        self._ledger.observe(updated)
        if claim.last:
            await self._release_lock(deadline)
        log.info(
            "event=allocated node=%s pod=%s container=%s gpus=%s memory_mib=%s cores=%d done=%s",
            self._node,
            claim.pod,
            claim.container_name,
            ",".join(r.gpu_uuid for r in claim.records),
            ",".join(str(r.used_mem) for r in claim.records),
            claim.records[0].used_cores,
            str(claim.last).lower(),
        )
        for over in self._ledger.overcommits():
            if over.gpu_uuid in {r.gpu_uuid for r in claim.records}:
                log.warning(
                    "event=gpu_overcommitted node=%s gpu=%s resource=%s used=%d capacity=%d pod=%s",
                    self._node,
                    over.gpu_uuid,
                    over.resource,
                    over.used,
                    over.capacity,
                    claim.pod,
                )
        return response

    def _make_dirs(self, claim: Claim) -> None:
        # An existing folder is kept as it is (a restarted container may already map its cache);
        # `CacheFolders` removes it once the pod has left the node. The lock folder is the node's.
        for path in (cache_dir(self._config.hook_path, claim.pod.uid, claim.container_name), self._lock_dir):
            make_folder(path)

    async def _settle_failed(self, pod: PodRef, reason: str, deadline: float) -> None:
        """Mark a pod's allocation failed (best effort: the Allocate fails either way)."""
        log.warning("event=bind_failed node=%s pod=%s reason=%r", self._node, pod, reason)
        try:
            await self._api.patch_pod(pod, failed_patch(), "merge", self._left(deadline))
        except (ApiError, ApiUnavailable) as exc:
            log.error("event=bind_failed_unrecorded node=%s pod=%s error=%r", self._node, pod, str(exc))

    async def _release_lock(self, deadline: float) -> None:
        """Remove the scheduler's node lock if set, and only the value seen (best effort)."""
        try:
            node = await self._api.node(self._left(deadline))
            value = annotations_of(node or {}).get(NODE_LOCK)
            if value is None:
                return
            ops = [
                {"op": "test", "path": annotation_path(NODE_LOCK), "value": value},
                {"op": "remove", "path": annotation_path(NODE_LOCK)},
            ]
            await self._api.patch_node(ops, self._left(deadline), patch_type="json")
            log.info("event=node_lock_released node=%s", self._node)
        except (ApiError, ApiUnavailable) as exc:
            if not is_conflict(exc):
                log.warning("event=node_lock_release_failed node=%s error=%r", self._node, str(exc))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background writes (failure marks after a timeout) to finish."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
