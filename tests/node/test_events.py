"""Kubernetes Events from the node plugin: a refused Allocate on the pod, a GPU out of service and
back on the node, in the shape `kubectl describe` finds, through the stand-in API server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from kube_vgpu.kubeapi.client import ApiError, Kube
from kube_vgpu.node.deviceplugin.selection import PodRef
from kube_vgpu.node.events import (
    ALLOCATE_FAILED,
    GPU_RECOVERED,
    GPU_UNHEALTHY,
    MAX_IN_FLIGHT,
    MAX_MESSAGE,
    EventRecorder,
    event_object,
    node_reference,
    pod_reference,
)
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import (
    NODE,
    UUID_A,
    Harness,
    eventually,
    node_object,
    one_gpu_pod,
    running_plugin,
)


@pytest.fixture
async def h(apiserver: ApiServerStandin, kdir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    apiserver.put(node_object())
    async with running_plugin(apiserver, kdir, tmp_path, recovery_quiet_seconds=0.3) as harness:
        yield harness


def describe_events(
    api: ApiServerStandin, kind: str, name: str, namespace: str, uid: str
) -> list[dict[str, Any]]:
    """What `kubectl describe` lists: events of every namespace whose involvedObject matches."""
    kube = Kube(api.api_client())
    try:
        selector = (
            f"involvedObject.kind={kind},involvedObject.name={name},"
            f"involvedObject.namespace={namespace},involvedObject.uid={uid}"
        )
        items: list[dict[str, Any]] = kube.list("event", field_selector=selector)["items"]
        return items
    finally:
        kube.close()


async def test_a_refused_allocate_is_an_event_on_the_pod(h: Harness) -> None:
    uid = h.api.put(one_gpu_pod("forged", uuid="GPU-00000000-0000-0000-0000-000000000000"))["metadata"]["uid"]
    with pytest.raises(aio.AioRpcError):
        await h.allocate(1)
    await eventually(lambda: bool(describe_events(h.api, "Pod", "forged", "default", uid)))
    (event,) = describe_events(h.api, "Pod", "forged", "default", uid)
    assert event["type"] == "Warning" and event["reason"] == ALLOCATE_FAILED
    assert event["metadata"]["namespace"] == "default"
    assert event["source"] == {"component": "kube-vgpu-node", "host": NODE}
    message = event["message"]
    assert "is not a GPU of this node" in message  # what was wrong
    assert "delete it" in message and "scheduler places it again" in message  # what to do


async def test_an_allocate_with_no_pod_to_blame_is_an_event_on_the_node(h: Harness) -> None:
    with pytest.raises(aio.AioRpcError):
        await h.allocate(1)
    await eventually(lambda: bool(describe_events(h.api, "Node", NODE, "", NODE)))
    (event,) = describe_events(h.api, "Node", NODE, "", NODE)
    assert event["reason"] == ALLOCATE_FAILED and "schedulerName volcano" in event["message"]


async def test_a_gpu_out_of_service_and_back_are_events_on_the_node(h: Harness) -> None:
    h.nvml.inject_xid(0, 79)

    def reasons() -> list[str]:
        events = describe_events(h.api, "Node", NODE, "", NODE)
        return [e["reason"] for e in sorted(events, key=lambda e: e["metadata"]["name"])]

    await eventually(lambda: reasons() == [GPU_UNHEALTHY, GPU_RECOVERED])
    unhealthy, recovered = sorted(
        describe_events(h.api, "Node", NODE, "", NODE), key=lambda e: e["metadata"]["name"]
    )
    assert unhealthy["type"] == "Warning" and recovered["type"] == "Normal"
    assert unhealthy["metadata"]["namespace"] == "default"  # a cluster-scoped object's events
    assert UUID_A in unhealthy["message"] and "XID 79" in unhealthy["message"]
    assert "drain the node" in unhealthy["message"]
    assert UUID_A in recovered["message"] and "back in service" in recovered["message"]


def test_event_objects_have_client_go_recorder_shape() -> None:
    pod = PodRef("team-a", "train", "5f0c3a1e-8b2d-4c6f-9a7e-1d2b3c4d5e6f")
    now = datetime(2026, 11, 24, 5, 0, 1, tzinfo=UTC)
    event = event_object(pod_reference(pod), "Warning", "R", "m", node_name=NODE, now=now, serial=0x1F)
    assert event["metadata"] == {"name": "train.1f", "namespace": "team-a"}
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "team-a",
        "name": "train",
        "uid": pod.uid,
    }
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2026-11-24T05:00:01Z"
    assert event["count"] == 1
    node_event = event_object(node_reference(NODE), "Normal", "R", "m", node_name=NODE, now=now, serial=1)
    assert node_event["metadata"]["namespace"] == "default"
    assert "namespace" not in node_event["involvedObject"]


def test_a_huge_message_is_cut_to_its_bound() -> None:
    now = datetime.now(UTC)
    event = event_object(
        node_reference(NODE), "Warning", "R", "x" * 100_000, node_name=NODE, now=now, serial=1
    )
    assert len(event["message"]) == MAX_MESSAGE and event["message"].endswith("...")
    # Both sides of the bound: a message of exactly MAX_MESSAGE is kept whole, one more is cut.
    whole = "y" * MAX_MESSAGE
    assert (
        event_object(node_reference(NODE), "Warning", "R", whole, node_name=NODE, now=now, serial=2)[
            "message"
        ]
        == whole
    )
    cut = event_object(node_reference(NODE), "Warning", "R", whole + "z", node_name=NODE, now=now, serial=3)
    assert len(cut["message"]) == MAX_MESSAGE and cut["message"].endswith("...")


async def test_events_in_one_clock_tick_get_different_names_and_failures_are_only_logged() -> None:
    posted: list[tuple[dict[str, Any], str]] = []

    async def create(event: dict[str, Any], namespace: str) -> object:
        posted.append((event, namespace))
        if len(posted) == 2:
            raise ApiError(403, "Forbidden", "events is forbidden")
        return event

    recorder = EventRecorder(create, NODE, clock=lambda: 1_700_000_000.0)
    for _ in range(3):
        recorder.gpu_health(UUID_A, "NVIDIA A100", False, "XID 79", 30)
    await recorder.drain()
    names = [event["metadata"]["name"] for event, _ in posted]
    assert len(set(names)) == 3
    assert recorder.recorded == 2  # the refused one is logged, never raised


async def test_a_storm_of_events_is_bounded() -> None:
    gate = asyncio.Event()

    async def create(event: dict[str, Any], namespace: str) -> object:
        await gate.wait()
        return event

    recorder = EventRecorder(create, NODE)
    for _ in range(1000):
        recorder.allocate_refused(None, "refused")
    gate.set()
    await recorder.drain()
    assert 0 < recorder.recorded < 1000


async def test_the_bound_on_events_in_flight_holds_exactly_max_in_flight() -> None:
    gate = asyncio.Event()

    async def create(event: dict[str, Any], namespace: str) -> object:
        await gate.wait()
        return event

    recorder = EventRecorder(create, NODE)
    for _ in range(MAX_IN_FLIGHT):  # the bound itself: every one is posted
        recorder.allocate_refused(None, "refused")
    recorder.allocate_refused(None, "one past the bound")  # dropped, and logged
    gate.set()
    await recorder.drain()
    assert recorder.recorded == MAX_IN_FLIGHT
    recorder.allocate_refused(None, "after the storm")  # room again once they are posted
    await recorder.drain()
    assert recorder.recorded == MAX_IN_FLIGHT + 1
