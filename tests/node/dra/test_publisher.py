"""The slice publisher against the stand-in API server, through the node plugin's own Kube client
(built for the `node` component, so every call it makes must be one its RBAC grants)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.publisher import NodeMissing, SlicePublisher
from kube_vgpu.node.dra.slices import DRIVER, UNHEALTHY_TAINT_KEY
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin

NODE = "gpu-node-1"
GPUS = [
    GpuInfo(i, f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", "NVIDIA A100-SXM4-80GB", i, 81920)
    for i in range(2)
]
FACTS = [
    GpuFacts(g.index, g.minor, g.uuid, g.name, g.memory_mib, "550.54.15", 12040, (8, 0), "ampere")
    for g in GPUS
]
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    return apiserver


@pytest.fixture
async def kube(api: ApiServerStandin) -> AsyncIterator[Kube]:
    k = Kube(api.api_client(), component="node")
    yield k
    k.close()


def publisher(kube: Kube, inventory: Inventory, clock: Callable[[], datetime] = lambda: T0) -> SlicePublisher:
    return SlicePublisher(kube, NODE, FACTS, inventory, clock=clock, retry_seconds=0.05)


def slices(api: ApiServerStandin) -> list[dict[str, Any]]:
    return [s for s in api.list("ResourceSlice") if s["spec"]["nodeName"] == NODE]


def devices(api: ApiServerStandin) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices(api) for d in s["spec"]["devices"]}


async def eventually(condition: Callable[[], bool], within: float = 20.0) -> None:
    # The stand-in's state changes on its own thread: poll it (the bound only a hang reaches).
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_publishes_shared_gpus_where_the_server_keeps_consumable_capacity(
    api: ApiServerStandin, kube: Kube
) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    state = await publisher(kube, Inventory(GPUS, 10, NODE)).publish()
    (only,) = slices(api)
    node_uid = api.get("Node", NODE)["metadata"]["uid"]  # type: ignore[index]
    assert only["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
    ]
    assert only["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert only["spec"]["driver"] == DRIVER
    assert all(d["allowMultipleAllocations"] for d in only["spec"]["devices"])
    assert (state.consumable_capacity, state.note, state.generation, state.devices) == (True, "", 1, 2)


async def test_falls_back_to_whole_gpus_where_the_server_drops_consumable_capacity(
    api: ApiServerStandin, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "kube_vgpu.node.dra.publisher")
    pub = publisher(kube, Inventory(GPUS, 10, NODE))
    state = await pub.publish()  # the stand-in imitates 1.34/1.35 by default: the gate is off
    assert not state.consumable_capacity
    assert "publishing whole GPUs" in state.note
    (only,) = slices(api)
    # What the server stored already is the whole-GPU pool: it stays, with no second write.
    assert only["spec"]["pool"]["generation"] == 1
    assert len(api.requests("POST", "/apis/resource.k8s.io")) == 1
    assert api.requests("PUT", "/apis/resource.k8s.io") == []
    for device in only["spec"]["devices"]:
        assert "allowMultipleAllocations" not in device
        assert device["capacity"] == {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}
    (line,) = [r.getMessage() for r in caplog.records if "event=dra_feature_dropped" in r.getMessage()]
    assert "dropped='consumable capacity'" in line
    assert f"node={NODE}" in line
    assert state.report() == {
        "driver": DRIVER,
        "published": True,
        "generation": 1,
        "devices": 2,
        "sharing": "whole GPUs",
        "unhealthyGpus": "tainted NoSchedule",
        "note": "the API server dropped consumable capacity (feature gate DRAConsumableCapacity off): "
        "publishing whole GPUs",
    }
    registry = CollectorRegistry()
    registry.register(pub.collector())
    text = generate_latest(registry).decode()
    assert f'kube_vgpu_dra_consumable_capacity{{node="{NODE}"}} 0.0' in text
    assert f'kube_vgpu_dra_pool_generation{{node="{NODE}"}} 1.0' in text


async def test_a_steady_pool_is_not_rewritten(api: ApiServerStandin, kube: Kube) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    pub = publisher(kube, Inventory(GPUS, 10, NODE))
    await pub.publish()
    api.clear_requests()
    await pub.publish()
    writes = [r for r in api.requests() if r.method in ("POST", "PUT", "DELETE")]
    assert writes == []
    # A restarted plugin reads the stored pool and keeps it as it is...
    restarted = publisher(kube, Inventory(GPUS, 10, NODE))
    assert (await restarted.publish()).generation == 1
    # ...and a change after the restart is a newer generation than any stored.
    fewer = SlicePublisher(kube, NODE, FACTS[:1], Inventory(GPUS[:1], 10, NODE))
    assert (await fewer.publish()).generation == 2
    assert list(devices(api)) == ["gpu-0"]


async def test_an_unhealthy_gpu_is_tainted_within_the_loop_and_recovers(
    api: ApiServerStandin, kube: Kube
) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    inventory = Inventory(GPUS, 10, NODE)
    task = asyncio.create_task(publisher(kube, inventory).run())
    try:
        await eventually(lambda: len(devices(api)) == 2)
        inventory.set_health(GPUS[1].uuid, False, "XID 79")
        await eventually(lambda: bool(devices(api)["gpu-1"].get("taints")))
        (taint,) = devices(api)["gpu-1"]["taints"]
        assert taint == {
            "key": UNHEALTHY_TAINT_KEY,
            "value": "XID-79",
            "effect": "NoSchedule",
            "timeAdded": "2026-01-02T03:04:05Z",
        }
        assert "taints" not in devices(api)["gpu-0"]
        generation = slices(api)[0]["spec"]["pool"]["generation"]
        inventory.set_health(GPUS[1].uuid, True)
        await eventually(lambda: "taints" not in devices(api)["gpu-1"])
        assert slices(api)[0]["spec"]["pool"]["generation"] == generation + 1
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_where_taints_are_dropped_an_unhealthy_gpu_leaves_the_pool_and_returns(
    api: ApiServerStandin, kube: Kube
) -> None:
    api.feature_gates = FeatureGates(consumable_capacity=True, device_taints=False)
    inventory = Inventory(GPUS, 10, NODE)
    pub = publisher(kube, inventory)
    assert (await pub.publish()).device_taints  # nothing tainted yet: nothing says taints are off
    inventory.set_health(GPUS[0].uuid, False, "XID 48")
    state = await pub.publish()
    assert not state.device_taints
    assert "unhealthy GPUs leave the pool" in state.note
    assert list(devices(api)) == ["gpu-1"]
    inventory.set_health(GPUS[0].uuid, True)
    await pub.publish()
    assert list(devices(api)) == ["gpu-0", "gpu-1"]
    assert state.consumable_capacity


async def test_the_taint_keeps_the_time_the_gpu_turned_unhealthy(api: ApiServerStandin, kube: Kube) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    now = [T0]
    inventory = Inventory(GPUS, 10, NODE)
    pub = publisher(kube, inventory, clock=lambda: now[0])
    inventory.set_health(GPUS[0].uuid, False, "XID 79")
    await pub.publish()
    now[0] = datetime(2026, 1, 2, 4, 0, 0, tzinfo=UTC)
    inventory.set_health(GPUS[1].uuid, False, "XID 79")
    await pub.publish()
    assert devices(api)["gpu-0"]["taints"][0]["timeAdded"] == "2026-01-02T03:04:05Z"
    assert devices(api)["gpu-1"]["taints"][0]["timeAdded"] == "2026-01-02T04:00:00Z"


async def test_remove_deletes_only_this_nodes_slices(api: ApiServerStandin, kube: Kube) -> None:
    other = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "other-node-vgpu-0"},
        "spec": {"driver": DRIVER, "nodeName": "other", "pool": {"name": "other", "resourceSliceCount": 1}},
    }
    api.put(other)
    pub = publisher(kube, Inventory(GPUS, 10, NODE))
    await pub.publish()
    assert await pub.remove() == 1
    assert slices(api) == []
    assert [s["metadata"]["name"] for s in api.list("ResourceSlice")] == ["other-node-vgpu-0"]
    assert not pub.state.published


async def test_no_node_no_slices(apiserver: ApiServerStandin) -> None:
    k = Kube(apiserver.api_client(), component="node")
    try:
        with pytest.raises(NodeMissing, match=f"node {NODE} does not exist"):
            await publisher(k, Inventory(GPUS, 10, NODE)).publish()
    finally:
        k.close()
    assert apiserver.list("ResourceSlice") == []


async def test_a_failed_publish_is_retried(api: ApiServerStandin, kube: Kube) -> None:
    api.deny("create", "resourceslices")
    task = asyncio.create_task(publisher(kube, Inventory(GPUS, 10, NODE)).run())
    try:
        await eventually(lambda: len(api.requests("POST", "/apis/resource.k8s.io")) >= 2)
        assert slices(api) == []
        api.allow_all()
        await eventually(lambda: len(devices(api)) == 2)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_plugin_builds_its_publisher_from_nvml(api: ApiServerStandin, kube: Kube) -> None:
    from kube_vgpu.node.dra.publisher import publisher_for
    from kube_vgpu.node.nvml.gpus import discover
    from kube_vgpu.standins.nvml.api import load_simulation

    api.feature_gates = FeatureGates.of_release(36)
    nvml = load_simulation(
        {"gpus": [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": 2}]}, NODE
    )
    nvml.nvmlInit()
    try:
        gpus = discover(nvml)
        pub = publisher_for(kube, NODE, nvml, gpus, Inventory(gpus, 10, NODE))
    finally:
        nvml.nvmlShutdown()
    state = await pub.publish()
    assert state.report()["sharing"] == "consumable capacity"
    gpu0 = devices(api)["gpu-0"]
    assert gpu0["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert gpu0["attributes"]["architecture"] == {"string": "hopper"}
    assert gpu0["capacity"]["memory"]["value"] == "81559Mi"


async def test_a_restarted_plugin_keeps_the_time_a_gpu_turned_unhealthy(
    api: ApiServerStandin, kube: Kube
) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    inventory = Inventory(GPUS, 10, NODE)
    inventory.set_health(GPUS[0].uuid, False, "XID 79")
    await publisher(kube, inventory).publish()
    later = datetime(2026, 1, 3, tzinfo=UTC)
    restarted_inventory = Inventory(GPUS, 10, NODE)
    restarted_inventory.set_health(GPUS[0].uuid, False, "XID 79")
    api.clear_requests()
    state = await publisher(kube, restarted_inventory, clock=lambda: later).publish()
    assert devices(api)["gpu-0"]["taints"][0]["timeAdded"] == "2026-01-02T03:04:05Z"
    assert state.generation == 1
    assert [r for r in api.requests() if r.method in ("POST", "PUT", "DELETE")] == []


async def test_a_deleted_or_edited_pool_is_published_again(api: ApiServerStandin, kube: Kube) -> None:
    api.feature_gates = FeatureGates.of_release(36)
    pub = SlicePublisher(
        kube, NODE, FACTS, Inventory(GPUS, 10, NODE), retry_seconds=0.05, watch_timeout_seconds=5
    )
    task = asyncio.create_task(pub.run())
    watcher = asyncio.create_task(asyncio.to_thread(pub.watch_forever))
    try:
        await eventually(lambda: len(devices(api)) == 2)
        (name,) = [s["metadata"]["name"] for s in slices(api)]
        # The kubelet deletes a driver's slices once its plugin has been gone a while.
        api.delete("ResourceSlice", name)
        await eventually(lambda: len(devices(api)) == 2)
        # Someone edits the pool: the device list comes back as published.
        api.patch("ResourceSlice", name, {"spec": {"devices": []}}, patch_type="merge")
        await eventually(lambda: len(devices(api)) == 2)
        assert slices(api)[0]["spec"]["pool"]["generation"] >= 2
    finally:
        pub.stop_watch()
        await watcher
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_run_ends_when_the_inventory_closes(api: ApiServerStandin, kube: Kube) -> None:
    inventory = Inventory(GPUS, 10, NODE)
    task = asyncio.create_task(publisher(kube, inventory).run())
    await eventually(lambda: len(devices(api)) == 2)
    inventory.close()
    async with asyncio.timeout(20):
        await task
