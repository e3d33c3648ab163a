"""The registration socket the kubelet's plugin watcher finds, and the DRA socket it names."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc import aio

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.limits import Card
from kube_vgpu.node.dra.server import (
    DEFAULT_CDI_DIR,
    DEFAULT_GPU_CDI_DIRS,
    DEFAULT_KUBELET_ROOT_DIR,
    DraServer,
    dra_socket,
    inventory_cards,
    registration_socket,
    serve_dra,
)
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.proto import pluginregistration_v1_pb2 as reg
from kube_vgpu.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.kubelet.dra import DraKubelet
from tests.support.node import short_tempdir

DRIVER = "vgpu.kube-vgpu.io"


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tempdir() as path:
        yield path


async def start(apiserver: ApiServerStandin, root: Path, kube: Kube) -> DraServer:
    cards = {"gpu-0": Card("gpu-0", "GPU-a", 0, 1024)}
    return await serve_dra(
        node_name="n1",
        kube=kube,
        cards=lambda: cards,
        hook_path=str(root / "hook"),
        lock_dir=str(root / "lock"),
        kubelet_root_dir=root,
        cdi_dir=root / "cdi",
        gpu_cdi_dirs=[root / "cdi"],
    )


def test_default_paths_are_the_kubelets() -> None:
    assert (DEFAULT_KUBELET_ROOT_DIR, DEFAULT_CDI_DIR) == ("/var/lib/kubelet", "/var/run/cdi")
    assert DEFAULT_GPU_CDI_DIRS == ("/etc/cdi", "/var/run/cdi")
    assert str(registration_socket(DEFAULT_KUBELET_ROOT_DIR)) == (
        "/var/lib/kubelet/plugins_registry/vgpu.kube-vgpu.io-reg.sock"
    )
    assert str(dra_socket(DEFAULT_KUBELET_ROOT_DIR)) == "/var/lib/kubelet/plugins/vgpu.kube-vgpu.io/dra.sock"


async def test_get_info_names_the_driver_its_socket_and_both_versions(
    apiserver: ApiServerStandin, root: Path
) -> None:
    kube = Kube(apiserver.api_client(), component="node")
    server = await start(apiserver, root, kube)
    try:
        async with aio.insecure_channel(f"unix:{registration_socket(root)}") as channel:
            info = await reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(dra_socket(root))
        assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    finally:
        await server.stop()
        kube.close()


async def test_the_kubelet_registers_it_and_says_so(apiserver: ApiServerStandin, root: Path) -> None:
    kube = Kube(apiserver.api_client(), component="node")
    server = await start(apiserver, root, kube)
    kubelet = DraKubelet(root)
    try:
        (plugin,) = await kubelet.register_all()
        assert (plugin.driver, plugin.service) == (DRIVER, "v1.DRAPlugin")
        status = server.registration.status
        assert status is not None and status.registered and status.error == ""
        # The same endpoint again is refused, and the plugin is told why.
        assert await kubelet.register(registration_socket(root)) is None
        status = server.registration.status
        assert status is not None and not status.registered
        assert f"endpoint {dra_socket(root)} already registered" in status.error
    finally:
        await kubelet.close()
        await server.stop()
        kube.close()


async def test_stale_sockets_are_replaced_and_ours_removed_at_stop(
    apiserver: ApiServerStandin, root: Path
) -> None:
    for path in (registration_socket(root), dra_socket(root)):
        path.parent.mkdir(parents=True, exist_ok=True)
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(path))
        stale.close()  # a crashed plugin leaves the file behind
    kube = Kube(apiserver.api_client(), component="node")
    server = await start(apiserver, root, kube)
    try:
        (plugin,) = await DraKubelet(root).register_all()
        await plugin.channel.close(None)
    finally:
        await server.stop()
        kube.close()
    assert not registration_socket(root).exists() and not dra_socket(root).exists()


async def test_a_file_that_is_no_socket_is_not_removed(apiserver: ApiServerStandin, root: Path) -> None:
    path = registration_socket(root)
    path.parent.mkdir(parents=True)
    path.write_text("someone's file")
    kube = Kube(apiserver.api_client(), component="node")
    try:
        with pytest.raises(RuntimeError, match="exists and is not a socket; refusing to remove it"):
            await start(apiserver, root, kube)
    finally:
        kube.close()
    assert path.read_text() == "someone's file"


def test_the_inventory_gives_cards_named_as_the_slice_names_them_with_health() -> None:
    gpus = [GpuInfo(0, "GPU-a", "A100", 3, 81920), GpuInfo(1, "GPU-b", "A100", 1, 40960)]
    inventory = Inventory(gpus, 10, "n1")
    cards = inventory_cards(inventory)
    assert cards() == {
        "gpu-3": Card("gpu-3", "GPU-a", 0, 81920),
        "gpu-1": Card("gpu-1", "GPU-b", 1, 40960),
    }
    assert [GpuFacts(g.index, g.minor, g.uuid, g.name, g.memory_mib).device_name for g in gpus] == list(
        cards()
    )
    inventory.set_health("GPU-b", False, "XID 79")
    assert cards()["gpu-1"].unhealthy == "XID 79" and cards()["gpu-3"].unhealthy is None
    inventory.set_hold("HAMi-core missing in /usr/local/vgpu")
    assert {c.unhealthy for c in cards().values()} == {"HAMi-core missing in /usr/local/vgpu"}
