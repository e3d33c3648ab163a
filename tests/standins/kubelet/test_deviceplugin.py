"""The kubelet stand-in, driven by the node plugin's gRPC service over real unix sockets."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc import aio

from kube_vgpu.node.deviceplugin.hamicore import ContainerResponse, Mount
from kube_vgpu.node.deviceplugin.server import (
    AllocateFailed,
    DevicePluginService,
    PluginServer,
    register,
    socket_identity,
)
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from tests.support.node import GPUS, NODE, UUID_A
from tests.support.timeouts import HANG_S

RESOURCE = "volcano.sh/vgpu-number"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="kv-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def echo_allocate(ids: Sequence[str]) -> ContainerResponse:
    if not ids:
        raise AllocateFailed("no devices", grpc.StatusCode.INVALID_ARGUMENT)
    return ContainerResponse({"IDS": ",".join(ids)}, (Mount("/c", "/h", True),))


@pytest.fixture
async def kubelet(short_dir: Path) -> AsyncIterator[KubeletStandin]:
    async with KubeletStandin(short_dir) as k:
        yield k


async def serve(short_dir: Path, inventory: LiveGpus, name: str = "p.sock") -> PluginServer:
    server = PluginServer(short_dir / name, DevicePluginService(inventory, echo_allocate))
    await server.start()
    return server


async def test_registration_options_and_device_lists(kubelet: KubeletStandin, short_dir: Path) -> None:
    inventory = LiveGpus(GPUS, 2, NODE)
    server = await serve(short_dir, inventory)
    try:
        await register(kubelet.socket_path, "p.sock", RESOURCE, deadline=HANG_S)
        plugin = await kubelet.wait_registered(RESOURCE)
        assert kubelet.registrations[0].version == "v1beta1"
        assert kubelet.registrations[0].endpoint == "p.sock"
        assert plugin.options == pb.DevicePluginOptions()
        assert [d.id for d in plugin.devices] == [f"{g.uuid}-{k}" for g in GPUS for k in range(2)]
        assert plugin.healthy == 4

        inventory.set_health(UUID_A, False, "xid 79")
        devices = await kubelet.wait_devices(RESOURCE, lambda ds: any(d.health == "Unhealthy" for d in ds))
        assert [d.health for d in devices] == ["Unhealthy"] * 2 + ["Healthy"] * 2
        assert plugin.healthy == 2 and len(plugin.lists) == 2

        response = await kubelet.allocate(RESOURCE, ["a", "b"])
        assert dict(response.container_responses[0].envs) == {"IDS": "a,b"}
        assert response.container_responses[0].mounts[0].read_only
        with pytest.raises(aio.AioRpcError) as refused:
            await kubelet.allocate(RESOURCE, [])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == "no devices"
    finally:
        inventory.close()
        await server.stop()


async def test_list_over_the_limit_is_refused(short_dir: Path) -> None:
    many = [GpuInfo(i, f"GPU-{i:08d}-0000-0000-0000-000000000000", "X", i, 1) for i in range(4)]
    inventory = LiveGpus(many, 10, NODE)
    async with KubeletStandin(short_dir, max_message_bytes=1000) as kubelet:
        server = await serve(short_dir, inventory)
        try:
            await register(kubelet.socket_path, "p.sock", RESOURCE, deadline=HANG_S)
            plugin = await kubelet.wait_registered(RESOURCE)
            await kubelet.wait_for(lambda: plugin.ended is not None)
            assert plugin.lists == [] and plugin.healthy == 0
            assert plugin.ended is not None and "refused" in plugin.ended
        finally:
            inventory.close()
            await server.stop()


async def test_bad_version_is_refused(kubelet: KubeletStandin) -> None:
    async with aio.insecure_channel(f"unix:{kubelet.socket_path}") as channel:
        with pytest.raises(aio.AioRpcError) as refused:
            await pb_grpc.RegistrationStub(channel).Register(
                pb.RegisterRequest(version="v1alpha", endpoint="p.sock", resource_name=RESOURCE)
            )
    assert "Unsupported version" in (refused.value.details() or "")
    assert kubelet.registrations == []


async def test_restart_removes_every_socket_and_recreates_kubelet_sock(
    kubelet: KubeletStandin, short_dir: Path
) -> None:
    inventory = LiveGpus(GPUS, 1, NODE)
    server = await serve(short_dir, inventory)
    try:
        await register(kubelet.socket_path, "p.sock", RESOURCE, deadline=HANG_S)
        plugin = await kubelet.wait_registered(RESOURCE)
        (short_dir / "kubelet_internal_checkpoint").write_text("{}")
        await kubelet.restart()
        assert not (short_dir / "p.sock").exists()
        assert socket_identity(kubelet.socket_path) is not None
        assert (short_dir / "kubelet_internal_checkpoint").exists()
        assert plugin.ended is not None and not server.intact
        assert kubelet.plugins == {} and kubelet.restarts == 1
        with pytest.raises(LookupError):
            await kubelet.allocate(RESOURCE, ["a"])
    finally:
        inventory.close()
        await server.stop()
