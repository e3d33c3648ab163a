"""The whole node plugin against the kubelet and API server stand-ins: publish, register, health, restart."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.names import NODE_HANDSHAKE, NODE_REGISTER
from kube_vgpu.contract.register import GpuRecord, decode_register
from kube_vgpu.httpedge.metrics_server import METRICS_LIMITS
from kube_vgpu.node.deviceplugin.server import socket_name
from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import (
    NODE,
    RESOURCE,
    UUID_A,
    UUID_B,
    V100,
    eventually,
    node_object,
    running_plugin,
    simulation,
)
from tests.support.timeouts import HANG_S

NODE_PATH = f"/api/v1/nodes/{NODE}"


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.put(node_object())
    return apiserver


def node_annotations(api: ApiServerStandin) -> dict[str, str]:
    node = api.get("Node", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


def node_labels(api: ApiServerStandin) -> dict[str, str]:
    node = api.get("Node", NODE)
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


def node_capacity(api: ApiServerStandin) -> dict[str, Any]:
    node = api.get("Node", NODE)
    assert node is not None
    return dict(node["status"].get("capacity") or {})


def metadata_patches(api: ApiServerStandin) -> int:
    return len([r for r in api.requests("PATCH", NODE_PATH) if r.path == NODE_PATH])


async def test_publishes_before_registering_then_serves_the_device_list(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    register_at_registration: list[str | None] = []

    def check(_request: pb.RegisterRequest) -> None:
        register_at_registration.append(node_annotations(api).get(NODE_REGISTER))

    async with running_plugin(api, kdir, tmp_path, on_register=check) as h:
        registration = h.kubelet.registrations[0]
        assert (registration.version, registration.resource_name) == ("v1beta1", RESOURCE)
        assert registration.endpoint == socket_name(RESOURCE)
        assert register_at_registration == [node_annotations(api)[NODE_REGISTER]]
        plugin = h.kubelet.plugins[RESOURCE]
        assert plugin.options == pb.DevicePluginOptions()
        assert [d.id for d in plugin.devices] == [f"{u}-{k}" for u in (UUID_A, UUID_B) for k in range(10)]
        assert plugin.healthy == 20


async def test_published_node_state_for_the_worked_example(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path):
        assert decode_register(node_annotations(api)[NODE_REGISTER]) == [
            GpuRecord(UUID_A, 10, 32768, register_type(V100), True, "hami-core"),
            GpuRecord(UUID_B, 10, 32768, register_type(V100), True, "hami-core"),
        ]
        labels = node_labels(api)
        assert labels["kube-vgpu.io/vgpu-mode"] == "hami-core"
        assert labels["gpu-model.kube-vgpu.io/Tesla-V100-PCIE-32GB"] == "true"
        assert (
            labels[f"gpu-uuid.kube-vgpu.io/{UUID_A}"] == labels[f"gpu-uuid.kube-vgpu.io/{UUID_B}"] == "true"
        )
        capacity = node_capacity(api)
        assert (capacity["volcano.sh/vgpu-memory"], capacity["volcano.sh/vgpu-cores"]) == ("65536", "200")
        assert capacity["cpu"] == "8"


async def test_labels_of_a_vanished_gpu_are_removed(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    gone = "GPU-00000000-1111-2222-3333-444444444444"
    api.put(
        node_object(
            labels={
                f"gpu-uuid.kube-vgpu.io/{gone}": "true",
                "gpu-model.kube-vgpu.io/NVIDIA-A100-SXM4-80GB": "true",
            }
        )
    )
    async with running_plugin(api, kdir, tmp_path, sim=simulation(1)):
        labels = node_labels(api)
        assert f"gpu-uuid.kube-vgpu.io/{gone}" not in labels
        assert "gpu-model.kube-vgpu.io/NVIDIA-A100-SXM4-80GB" not in labels
        assert f"gpu-uuid.kube-vgpu.io/{UUID_A}" in labels and f"gpu-uuid.kube-vgpu.io/{UUID_B}" not in labels
        assert labels["kubernetes.io/hostname"] == NODE


async def test_register_is_patched_only_on_change(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path) as h:
        assert h.plugin.publisher is not None
        before = metadata_patches(api)
        assert before == 1
        assert not await h.plugin.publisher.reconcile()
        assert metadata_patches(api) == before
        h.nvml.inject_xid(1, 79)
        await eventually(lambda: metadata_patches(api) == before + 1)
        records = decode_register(node_annotations(api)[NODE_REGISTER])
        assert [(r.count, r.healthy) for r in records] == [(10, True), (0, False)]


async def test_kubelet_restart_means_serving_and_registering_again(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path) as h:
        await h.kubelet.restart()
        async with asyncio.timeout(HANG_S):
            plugin = await h.kubelet.wait_registered(RESOURCE, count=2)
        assert len(plugin.devices) == 20 and plugin.healthy == 20
        # The kubelet records a registration before the plugin's Register call returns to it.
        await eventually(lambda: h.plugin.registrations == 2)


async def test_a_recreated_kubelet_socket_alone_is_noticed(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    # Our socket survives; only kubelet.sock is replaced (possibly on the same inode).
    async with running_plugin(api, kdir, tmp_path) as h:
        await h.kubelet.stop()
        await asyncio.sleep(0.05)  # past a coarse file-system clock tick, so the change time moves
        await h.kubelet.start()
        async with asyncio.timeout(HANG_S):
            await h.kubelet.wait_registered(RESOURCE, count=2)


async def test_waits_for_the_kubelet_and_removes_a_stale_socket(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(kdir / socket_name(RESOURCE)))
    stale.close()  # a dead plugin's socket file stays behind
    async with running_plugin(api, kdir, tmp_path, start_kubelet=False) as h:
        await asyncio.sleep(0.3)
        assert h.plugin.registrations == 0
        await h.kubelet.start()
        async with asyncio.timeout(HANG_S):
            plugin = await h.kubelet.wait_registered(RESOURCE)
        assert plugin.healthy == 20


async def test_xid_takes_a_gpu_out(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    # A quiet spell past the test's waits: the GPU stays out while they look (apart from the next test).
    async with running_plugin(api, kdir, tmp_path, recovery_quiet_seconds=3600.0) as h:
        h.nvml.inject_xid(0, 13)  # an application error: ignored by default
        h.nvml.inject_xid(0, 79)  # fallen off the bus
        devices = await h.kubelet.wait_devices(RESOURCE, lambda ds: any(d.health == "Unhealthy" for d in ds))
        assert {d.id.rsplit("-", 1)[0] for d in devices if d.health == "Unhealthy"} == {UUID_A}
        await eventually(lambda: node_capacity(api)["volcano.sh/vgpu-memory"] == "32768")
        assert node_capacity(api)["volcano.sh/vgpu-cores"] == "100"
        assert decode_register(node_annotations(api)[NODE_REGISTER])[0].count == 0
        assert "XID 79" in (h.inventory.reason(UUID_A) or "")


async def test_quiet_after_an_xid_brings_the_gpu_back(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path, recovery_quiet_seconds=0.5) as h:
        plugin = h.kubelet.plugins[RESOURCE]
        h.nvml.inject_xid(0, 79)

        def out_then_back() -> bool:
            # Every list the kubelet got is kept: the one taking GPU A out, and a later one, all healthy.
            out = [i for i, ds in enumerate(plugin.lists) if any(d.health == "Unhealthy" for d in ds)]
            back = all(d.health == "Healthy" for d in plugin.lists[-1])
            return bool(out) and back and out[0] < len(plugin.lists) - 1

        await h.kubelet.wait_for(out_then_back, within=HANG_S)
        await eventually(lambda: node_capacity(api)["volcano.sh/vgpu-memory"] == "65536")
        assert decode_register(node_annotations(api)[NODE_REGISTER])[0].count == 10
        assert h.inventory.reason(UUID_A) is None


async def test_ignored_xids_are_configurable(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path, ignored_xids=(79,), recovery_quiet_seconds=60.0) as h:
        h.nvml.inject_xid(1, 79)
        h.nvml.inject_xid(1, 13)
        devices = await h.kubelet.wait_devices(RESOURCE, lambda ds: any(d.health == "Unhealthy" for d in ds))
        assert "XID 13" in (h.inventory.reason(UUID_B) or "")
        assert all(d.health == "Healthy" for d in devices if d.id.startswith(UUID_A))


async def test_lost_gpu_is_unhealthy_until_it_answers_again(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path, recovery_quiet_seconds=0.3) as h:
        h.nvml.set_lost(1, True)
        await h.kubelet.wait_devices(RESOURCE, lambda ds: sum(d.health == "Unhealthy" for d in ds) == 10)
        assert "NVML" in (h.inventory.reason(UUID_B) or "")
        h.nvml.set_lost(1, False)
        await h.kubelet.wait_devices(RESOURCE, lambda ds: all(d.health == "Healthy" for d in ds))


async def test_zeroed_capacity_is_advertised_again(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path):
        # What a kubelet does to extended resources when its device-plugin checkpoint is gone.
        api.patch(
            "Node",
            NODE,
            {"status": {"capacity": {"volcano.sh/vgpu-memory": "0", "volcano.sh/vgpu-cores": "0"}}},
            patch_type="merge",
        )
        await eventually(lambda: node_capacity(api)["volcano.sh/vgpu-memory"] == "65536")
        assert node_capacity(api)["volcano.sh/vgpu-cores"] == "200"


async def test_metrics_endpoint(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path) as h:
        assert h.plugin.metrics_server is not None
        url = f"http://127.0.0.1:{h.plugin.metrics_server.port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.status == 200
            text = await response.text()
    assert f'kube_vgpu_gpu_memory_total_mib{{gpu="{UUID_A}",model="{V100}",node="{NODE}"}} 32768.0' in text
    assert f'kube_vgpu_gpu_healthy{{gpu="{UUID_B}",model="{V100}",node="{NODE}"}} 1.0' in text
    assert 'kube_vgpu_allocation_failures_total{reason="no_pod"} 0.0' in text


async def test_a_flood_of_half_sent_requests_on_the_metrics_port_leaves_scrapes_answered(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    # Any pod may reach the port: a flood past the cap must neither keep Prometheus out nor hold
    # more connections (file descriptors, which the kubelet socket needs too) than the cap.
    async with running_plugin(api, kdir, tmp_path) as h:
        assert h.plugin.metrics_server is not None
        port = h.plugin.metrics_server.port
        flood = []
        try:
            for _ in range(METRICS_LIMITS.max_connections + 20):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 1000)
                flood.append((reader, writer))
            await asyncio.sleep(0.2)
            url = f"http://127.0.0.1:{port}/metrics"
            async with (
                asyncio.timeout(HANG_S),
                aiohttp.ClientSession() as session,
                session.get(url) as response,
            ):
                assert response.status == 200
                assert "kube_vgpu_gpu_healthy" in await response.text()
            listener = h.plugin.metrics_server.listener
            assert listener is not None and len(listener.connections) <= METRICS_LIMITS.max_connections
        finally:
            for _, writer in flood:
                writer.close()


async def test_stop_ends_the_stream_and_removes_the_socket(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    async with running_plugin(api, kdir, tmp_path) as h:
        plugin = h.kubelet.plugins[RESOURCE]
        await h.plugin.stop()
        async with asyncio.timeout(HANG_S):
            await h.kubelet.wait_for(lambda: plugin.ended is not None)
        assert not (kdir / socket_name(RESOURCE)).exists()
        assert plugin.healthy == 0


async def test_stop_as_the_publisher_wakes_still_ends_it(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    # The publisher's wake-up completing in the same loop turn as its cancellation: Python 3.11's
    # asyncio.wait_for returned the wake-up and lost the cancellation, and stop waited for ever.
    async with running_plugin(api, kdir, tmp_path) as h:
        assert h.plugin.publisher is not None
        h.plugin.publisher.trigger()
        async with asyncio.timeout(HANG_S):
            await h.plugin.stop()
        assert all(task.done() for task in asyncio.all_tasks() if task.get_name().startswith("kube-vgpu-"))


async def test_stop_names_a_loop_that_does_not_end_and_finishes_anyway(
    api: ApiServerStandin, kdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    swallowed = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.set()  # the first cancellation is lost, as a buggy loop would lose it
        await asyncio.sleep(3600)

    async with running_plugin(api, kdir, tmp_path) as h:
        h.plugin._spawn(stubborn(), "stubborn")  # noqa: SLF001 (our own plugin's task spawner)
        await asyncio.sleep(0)
        async with asyncio.timeout(30):
            await h.plugin.stop()
        assert swallowed.is_set()
        assert "event=task_stop_slow node=gpu-node-1 tasks=kube-vgpu-stubborn" in caplog.text
        assert not (kdir / socket_name(RESOURCE)).exists()  # the rest of stop ran


async def test_a_stop_whose_caller_is_cancelled_still_finishes(
    api: ApiServerStandin, kdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kube_vgpu")
    async with running_plugin(api, kdir, tmp_path) as h:
        caller = asyncio.create_task(h.plugin.stop())
        await asyncio.sleep(0)
        caller.cancel()
        async with asyncio.timeout(30):
            await h.plugin.stop()  # waits for the first stop, which went on
        assert not (kdir / socket_name(RESOURCE)).exists()
        assert "event=stopped node=gpu-node-1" in caplog.text


async def test_legacy_handshake_when_configured(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path, write_handshake=True) as h:
        assert h.plugin.publisher is not None
        assert node_annotations(api)[NODE_HANDSHAKE].startswith("Reported ")
        # What Volcano 1.12-1.14.2 writes back; the periodic reconcile answers it, a watch event does not.
        requesting = {"metadata": {"annotations": {NODE_HANDSHAKE: "Requesting_2026.08.20 10:07:21"}}}
        node = api.patch("Node", NODE, requesting, patch_type="merge")
        assert not h.plugin.publisher.drifted(node)
        assert await h.plugin.publisher.reconcile()
        assert node_annotations(api)[NODE_HANDSHAKE].startswith("Reported ")


async def test_no_handshake_by_default(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    async with running_plugin(api, kdir, tmp_path):
        assert NODE_HANDSHAKE not in node_annotations(api)
