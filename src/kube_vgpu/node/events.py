"""Kubernetes Events the node plugin records: a GPU out of service or back, HAMi-core missing or
found, an Allocate refused.

They are core v1 Events in the shape client-go's recorder writes (`involvedObject`, `source`,
`firstTimestamp`, `count`), the shape `kubectl describe pod|node` lists: an operator who runs
`kubectl describe` on a pending pod or a node sees why, without the plugin's logs. A Node's event
lives in `default` with the node's name as `involvedObject.uid`, as the kubelet writes them and as
`kubectl describe node` searches for them. Each message says what happened and what to do.

Recording never blocks or fails the work it reports: the create runs in the background with a
bounded budget, and a failure is logged. Building the objects is pure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from kube_vgpu.node.deviceplugin.selection import PodRef

log = logging.getLogger("kube_vgpu.node.events")

COMPONENT = "kube-vgpu-node"
EventType = Literal["Normal", "Warning"]
# Reasons (CamelCase, as Kubernetes' own): what `kubectl get events --field-selector reason=` takes.
GPU_UNHEALTHY = "GPUUnhealthy"
GPU_RECOVERED = "GPURecovered"
ALLOCATE_FAILED = "VGPUAllocateFailed"
HAMI_CORE_MISSING = "HAMiCoreMissing"
HAMI_CORE_FOUND = "HAMiCoreFound"
# A message long enough to name the pod, the figures and the fix; anything past it is cut.
MAX_MESSAGE = 1024
# At most this many events in flight: a storm of refusals must not pile up tasks without bound.
MAX_IN_FLIGHT = 64

# Creates one Event in a namespace; raises on failure.
CreateEvent = Callable[[dict[str, Any], str], Awaitable[object]]


def pod_reference(pod: PodRef) -> dict[str, str]:
    """The `involvedObject` of a pod."""
    return {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name, "uid": pod.uid}


def node_reference(node_name: str) -> dict[str, str]:
    """The `involvedObject` of a node: its name as UID, which is what `kubectl describe node` asks."""
    return {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_name}


def event_object(
    involved: Mapping[str, str],
    event_type: EventType,
    reason: str,
    message: str,
    *,
    node_name: str,
    now: datetime,
    serial: int,
) -> dict[str, Any]:
    """A core v1 Event as client-go's recorder builds it (name `<object>.<hex nanoseconds>`)."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{involved['name']}.{serial:x}",
            "namespace": involved.get("namespace") or "default",
        },
        "involvedObject": dict(involved),
        "type": event_type,
        "reason": reason,
        "message": message,
        "source": {"component": COMPONENT, "host": node_name},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def gpu_health_message(uuid: str, model: str, healthy: bool, why: str, quiet_seconds: float) -> str:
    """What an operator reads on the node when a GPU leaves or rejoins service."""
    if healthy:
        return (
            f"GPU {uuid} ({model}) is back in service: NVML answers it normally again. Its memory and "
            "cores are advertised again and new vGPU pods can be placed on it."
        )
    return (
        f"GPU {uuid} ({model}) is out of service: {why}. Its memory and cores left the node's "
        "capacity and no new vGPU pod is placed on it; pods running on it may have failed. It comes "
        f"back by itself once NVML answers it normally for {quiet_seconds:g}s. If it does not, drain "
        f"the node and check the GPU (nvidia-smi -q -i {uuid}); reset or replace it."
    )


def allocate_failed_message(refusal: str, node_name: str, *, on_pod: bool) -> str:
    """What an operator reads on a pod (or, with no pod identified, its node) after a refused Allocate."""
    if on_pod:
        return (
            f"{refusal}. The node plugin on {node_name} refused this pod's GPUs and marked its "
            "allocation failed, so it will not start there: delete it (its controller recreates it) "
            "and the scheduler places it again. If it keeps failing, read the node plugin's log on "
            f"{node_name} (event=allocate_failed) and check that the pod's GPU limits have not "
            "been edited since Volcano placed it."
        )
    return (
        f"{refusal}. The kubelet asked for GPUs that no pod bound to {node_name} was placed on by "
        "Volcano: check that GPU pods use schedulerName volcano with deviceshare.VGPUEnable on."
    )


class EventRecorder:
    """Posts Events in the background on the running loop; `drain()` waits for those in flight."""

    def __init__(
        self, create: CreateEvent, node_name: str, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._create = create
        self._node = node_name
        self._clock = clock
        self._last_serial = 0
        self._in_flight: set[asyncio.Task[None]] = set()
        self.recorded = 0  # events the API server accepted (for tests and logs)

    def _serial(self) -> int:
        # Nanoseconds, as client-go names events; strictly rising, so two events in one tick differ.
        self._last_serial = max(self._last_serial + 1, int(self._clock() * 1e9))
        return self._last_serial

    def record(self, involved: Mapping[str, str], event_type: EventType, reason: str, message: str) -> None:
        """Post one Event in the background (call on the event loop)."""
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            log.warning(
                "event=k8s_event_dropped node=%s reason=%s in_flight=%d", self._node, reason, MAX_IN_FLIGHT
            )
            return
        event = event_object(
            involved,
            event_type,
            reason,
            message,
            node_name=self._node,
            now=datetime.fromtimestamp(self._clock(), UTC),
            serial=self._serial(),
        )
        task = asyncio.get_running_loop().create_task(self._post(event))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _post(self, event: dict[str, Any]) -> None:
        namespace = event["metadata"]["namespace"]
        try:
            await self._create(event, namespace)
        except Exception as exc:
            log.warning(
                "event=k8s_event_failed node=%s reason=%s object=%s error=%r",
                self._node,
                event["reason"],
                event["involvedObject"].get("name"),
                str(exc),
            )
            return
        self.recorded += 1

    def gpu_health(self, uuid: str, model: str, healthy: bool, why: str, quiet_seconds: float) -> None:
        """A GPU of this node left (Warning) or rejoined (Normal) service."""
        self.record(
            node_reference(self._node),
            "Normal" if healthy else "Warning",
            GPU_RECOVERED if healthy else GPU_UNHEALTHY,
            gpu_health_message(uuid, model, healthy, why, quiet_seconds),
        )

    def hami_core(self, ready: bool, message: str) -> None:
        """HAMi-core in hookPath became unusable (Warning, repeated while it lasts) or usable (Normal)."""
        self.record(
            node_reference(self._node),
            "Normal" if ready else "Warning",
            HAMI_CORE_FOUND if ready else HAMI_CORE_MISSING,
            message,
        )

    def allocate_refused(self, pod: PodRef | None, refusal: str) -> None:
        """An Allocate the plugin refused: on the pod when it was identified, else on the node."""
        involved = pod_reference(pod) if pod is not None else node_reference(self._node)
        message = allocate_failed_message(refusal, self._node, on_pod=pod is not None)
        self.record(involved, "Warning", ALLOCATE_FAILED, message)

    async def drain(self) -> None:
        """Wait for the events still being posted (each bounded by its own budget)."""
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)
