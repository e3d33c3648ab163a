"""Allocate through the kubelet stand-in (real gRPC) against the stand-in API server."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import (
    BIND_PHASE,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_IDS_NEW,
    VGPU_TIME,
    VGPU_TIME_DONE,
)
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.allocator import Allocator
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import (
    CORES,
    COUNT,
    EXAMPLE_IDS,
    GPUS,
    MEMORY,
    NODE,
    UUID_A,
    UUID_B,
    Harness,
    container,
    eventually,
    example_containers,
    make_pod,
    node_object,
    one_gpu_pod,
    running_plugin,
)


@pytest.fixture
async def h(apiserver: ApiServerStandin, kdir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    apiserver.put(node_object())
    async with running_plugin(apiserver, kdir, tmp_path) as harness:
        yield harness


def envs(response: object) -> dict[str, str]:
    return dict(response.container_responses[0].envs)  # type: ignore[attr-defined]


def mounts(response: object) -> dict[str, tuple[str, bool]]:
    return {
        m.container_path: (m.host_path, m.read_only)
        for m in response.container_responses[0].mounts  # type: ignore[attr-defined]
    }


async def refused(h: Harness, count: int) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as info:
        await h.allocate(count)
    return info.value


async def test_worked_example_two_containers_and_a_sidecar(h: Harness) -> None:
    h.api.put(make_pod("p", example_containers(), ids=EXAMPLE_IDS))

    first = await h.allocate(1)
    assert envs(first)["NVIDIA_VISIBLE_DEVICES"] == UUID_A
    assert envs(first)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert envs(first)["CUDA_DEVICE_SM_LIMIT"] == "30"
    uid = h.pod("p")["metadata"]["uid"]
    cache = h.hook / "vgpu" / "containers" / f"{uid}_c1"
    assert mounts(first)["/tmp/vgpu"] == (str(cache), False)
    assert cache.is_dir()
    # HAMi-core's cache and lock folders: any UID creates its file there, no other user lists them.
    assert stat.S_IMODE(cache.stat().st_mode) == 0o733
    assert stat.S_IMODE(os.stat(h.plugin.settings.lock_dir).st_mode) == 0o733
    assert mounts(first)["/usr/local/vgpu/libvgpu.so"] == (str(h.hook / "libvgpu.so"), True)
    assert mounts(first)["/etc/ld.so.preload"] == (str(h.hook / "ld.so.preload"), True)
    annotations = h.annotations("p")
    assert annotations[DEVICES_TO_ALLOCATE] == f";{UUID_A},NVIDIA,2048,0:{UUID_B},NVIDIA,2048,0:"
    assert annotations[BIND_PHASE] == "allocating"

    second = await h.allocate(2)
    assert envs(second)["NVIDIA_VISIBLE_DEVICES"] == f"{UUID_A},{UUID_B}"
    assert (envs(second)["CUDA_DEVICE_MEMORY_LIMIT_0"], envs(second)["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        "2048m",
        "2048m",
    )
    assert mounts(second)["/tmp/vgpu"][0].endswith(f"{uid}_c2")
    annotations = h.annotations("p")
    assert annotations[DEVICES_TO_ALLOCATE] == ";"
    assert annotations[BIND_PHASE] == "success"
    assert annotations[VGPU_TIME] == VGPU_TIME_DONE
    assert annotations[VGPU_IDS_NEW] == EXAMPLE_IDS  # never touched

    # The node's own ledger counts both containers on GPU A (Volcano books only the first).
    assert h.plugin.metrics is not None
    text = h.plugin.metrics.render().decode()
    assert f'kube_vgpu_gpu_memory_allocated_mib{{gpu="{UUID_A}"' in text
    assert 'container="c2",gpu="' + UUID_B in text
    assert "kube_vgpu_allocations_total 2.0" in text


async def test_concurrent_pods_each_get_their_own_entry(h: Harness) -> None:
    h.api.put(one_gpu_pod("a", UUID_A, mem=1111, vgpu_time="100"))
    h.api.put(one_gpu_pod("b", UUID_B, mem=2222, vgpu_time="101"))
    h.api.put(one_gpu_pod("c", UUID_A, mem=3333, vgpu_time="102"))
    responses = await asyncio.gather(h.allocate(1), h.allocate(1), h.allocate(1))
    limits = sorted(envs(r)["CUDA_DEVICE_MEMORY_LIMIT_0"] for r in responses)
    assert limits == ["1111m", "2222m", "3333m"]
    for name in ("a", "b", "c"):
        annotations = h.annotations(name)
        assert (annotations[DEVICES_TO_ALLOCATE], annotations[BIND_PHASE]) == ("", "success")


class RacingApi(NodeApi):
    """A NodeApi after whose first pod list another writer consumes the oldest pod's entry."""

    def __init__(self, kube: Kube, standin: ApiServerStandin) -> None:
        super().__init__(kube, NODE)
        self._standin = standin
        self._raced = False

    async def pods_on_node(self, budget: float) -> list[dict[str, Any]]:
        pods = await super().pods_on_node(budget)
        if not self._raced:
            self._raced = True
            # E.g. a second plugin during a rolling update, answering for the same pod first.
            done = {DEVICES_TO_ALLOCATE: "", BIND_PHASE: "success", VGPU_TIME: VGPU_TIME_DONE}
            self._standin.patch("Pod", "first", {"metadata": {"annotations": done}}, patch_type="merge")
        return pods


async def test_an_entry_consumed_by_another_writer_is_not_taken_again(h: Harness) -> None:
    assert h.plugin.metrics is not None
    h.api.put(one_gpu_pod("first", mem=1001, vgpu_time="100"))
    h.api.put(one_gpu_pod("second", mem=1002, vgpu_time="101"))
    kube = Kube(h.api.api_client(), component="node")
    racing = RacingApi(kube, h.api)
    allocator = Allocator(
        racing,
        h.inventory,
        Ledger(GPUS, 10, ResourceNames(), NODE),
        h.plugin.metrics,
        mode="hami-core",
        names=ResourceNames(),
        config=h.plugin.settings.config.node,
        lock_dir=h.plugin.settings.lock_dir,
    )
    h.api.clear_requests()
    try:
        response = await allocator.allocate([f"{UUID_A}-0"])
    finally:
        await asyncio.to_thread(racing.close)
        kube.close()
    assert response.envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1002m"
    statuses = [r.status for r in h.api.requests("PATCH", "/api/v1/namespaces/default/pods/")]
    assert statuses == [422, 200]  # the test op refused the stale write; the retry took the next pod
    assert h.annotations("second")[BIND_PHASE] == "success"


@pytest.mark.parametrize(
    ("pod_args", "reason"),
    [
        ({"uuid": "GPU-00000000-0000-0000-0000-000000000000"}, "is not a GPU of this node"),
        ({"mem": 40000}, "40000 MiB asked on GPU"),
        ({"extra_annotations": {"nvidia.com/use-gputype": "A100"}}, "not allowed by nvidia.com/use-gputype"),
        ({"extra_annotations": {"volcano.sh/vgpu-nouse-gpuuuid": UUID_A}}, "excluded by"),
    ],
)
async def test_forged_or_mismatched_allocation_fails_the_pod(
    h: Harness, pod_args: dict[str, object], reason: str
) -> None:
    h.api.put(one_gpu_pod("forged", **pod_args))  # type: ignore[arg-type]
    error = await refused(h, 1)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "pod default/forged" in (error.details() or "") and reason in (error.details() or "")
    annotations = h.annotations("forged")
    assert annotations[BIND_PHASE] == "failed"
    assert annotations[VGPU_TIME] == VGPU_TIME_DONE
    assert annotations[VGPU_IDS_NEW] == annotations[DEVICES_TO_ALLOCATE]  # nothing consumed or rewritten


async def test_unhealthy_gpu_is_refused(h: Harness) -> None:
    h.nvml.inject_xid(0, 79)
    await eventually(lambda: bool(h.inventory.unhealthy))
    h.api.put(one_gpu_pod("p"))
    error = await refused(h, 1)
    assert "unhealthy" in (error.details() or "")
    assert h.annotations("p")[BIND_PHASE] == "failed"


async def test_broken_pod_is_failed_with_a_message(h: Harness) -> None:
    h.api.put(
        make_pod(
            "init",
            [container("main", {COUNT: "1", MEMORY: "10"})],
            ids=f"{UUID_A},NVIDIA,10,0:",
            init_containers=[container("setup", {COUNT: "1"})],
        )
    )
    error = await refused(h, 1)
    assert "pod default/init" in (error.details() or "")
    assert "init container 'setup'" in (error.details() or "")
    assert h.annotations("init")[BIND_PHASE] == "failed"


async def test_no_pod_waiting_and_the_node_lock_is_released(h: Harness) -> None:
    h.api.patch(
        "Node", NODE, {"metadata": {"annotations": {NODE_LOCK: "2026-08-20T10:07:21Z"}}}, patch_type="merge"
    )
    error = await refused(h, 1)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert f"no pod on node {NODE} is waiting for 1 vGPU" in (error.details() or "")
    node = h.api.get("Node", NODE)
    assert node is not None and NODE_LOCK not in node["metadata"]["annotations"]


async def test_success_releases_the_node_lock(h: Harness) -> None:
    h.api.patch(
        "Node", NODE, {"metadata": {"annotations": {NODE_LOCK: "2026-08-20T10:07:21Z"}}}, patch_type="merge"
    )
    h.api.put(one_gpu_pod("p"))
    await h.allocate(1)
    node = h.api.get("Node", NODE)
    assert node is not None and NODE_LOCK not in node["metadata"]["annotations"]


async def test_disable_control_keeps_the_preload_and_memory_only_sidecar(h: Harness) -> None:
    containers = [
        container("mem-only", {MEMORY: "100"}),
        container(
            "main",
            {COUNT: "1", MEMORY: "200", CORES: "50"},
            env=[{"name": "CUDA_DISABLE_CONTROL", "value": "1"}],
        ),
    ]
    h.api.put(make_pod("p", containers, ids=f"{UUID_B},NVIDIA,100,0:;{UUID_A},NVIDIA,200,50:"))
    response = await h.allocate(1)
    assert envs(response)["NVIDIA_VISIBLE_DEVICES"] == UUID_A
    assert "/etc/ld.so.preload" in mounts(response)  # a pod's env cannot switch HAMi-core off
    assert h.annotations("p")[BIND_PHASE] == "success"


async def test_api_server_down_answers_at_once_with_a_clear_error(h: Harness) -> None:
    h.api.put(one_gpu_pod("p"))
    h.api.set_outage(True)
    try:
        error = await refused(h, 1)
    finally:
        h.api.set_outage(False)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"cannot list the pods of node {NODE}" in (error.details() or "")
    assert h.annotations("p")[BIND_PHASE] == "allocating"  # nothing happened to it
    await h.allocate(1)  # and the next try works


async def test_api_server_hanging_is_cut_short(
    apiserver: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    apiserver.put(node_object())
    async with running_plugin(apiserver, kdir, tmp_path, allocate_timeout_seconds=2.0) as h:
        h.api.put(one_gpu_pod("p"))
        # Listing works, writing to the pod hangs: the Allocate must still answer within its bound.
        h.api.set_hang(True, paths=["/api/v1/namespaces/default/pods/p"])
        try:
            error = await refused(h, 1)
        finally:
            h.api.set_hang(False)
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "pod default/p" in (error.details() or "") and "within 2s" in (error.details() or "")
        assert h.plugin.allocator is not None
        await h.plugin.allocator.drain()
    assert h.annotations("p")[BIND_PHASE] == "failed"


async def test_a_gone_pods_cache_folder_is_removed_and_counted(
    apiserver: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    apiserver.put(node_object())
    async with running_plugin(
        apiserver,
        kdir,
        tmp_path,
        register_interval_seconds=0.1,
        plugin={"cache_folder_grace_seconds": 0.0},
    ) as h:
        # Pod UIDs as the API server makes them (UUIDs): the folder names the plugin sweeps.
        gone_uid, live_uid = "3f2b9c1e-8d4a-4e6f-9b0c-1a2d3e4f5a6b", "7c8d9e0f-1a2b-4c3d-8e5f-6a7b8c9d0e1f"
        h.api.put(one_gpu_pod("gone", UUID_A, mem=1111, vgpu_time="100", uid=gone_uid))
        h.api.put(one_gpu_pod("live", UUID_B, mem=2222, vgpu_time="101", uid=live_uid))
        await asyncio.gather(h.allocate(1), h.allocate(1))
        root = h.hook / "vgpu" / "containers"
        gone, live = root / f"{gone_uid}_main", root / f"{live_uid}_main"
        assert gone.is_dir() and live.is_dir()
        h.api.delete("Pod", "gone", "default")
        await eventually(lambda: not gone.exists())
        assert live.is_dir()
        assert h.plugin.metrics is not None
        assert "kube_vgpu_cache_folders_removed_total 1.0" in h.plugin.metrics.render().decode()
