"""The DRA node plugin assembled (`node.dra.driver`), in process against the API-server and kubelet
stand-ins: HAMi-core's presence rules (every GPU tainted while it is missing, said in a log line, a
metric and a node Event; back when it is installed), an XID tainting one GPU, a prepared claim in
the metrics, and stop removing both sockets while the pool stays."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.demo.dra import device_class, nvidia_cdi_spec
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.driver import DraNodePlugin, DraSettings
from kube_vgpu.node.dra.server import DRIVER_NAME, dra_socket, registration_socket
from kube_vgpu.node.dra.slices import UNHEALTHY_TAINT_KEY
from kube_vgpu.node.dra.volcano import DEVICE_PLUGIN_ON_DRA_NODE
from kube_vgpu.node.events import HAMI_CORE_FOUND, HAMI_CORE_MISSING
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.scheduler import DraScheduler
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.dra import ClaimId, DraKubelet
from kube_vgpu.standins.nvml.api import load_simulation
from tests.node.test_events import describe_events
from tests.support.dra import slice_claim
from tests.support.node import NODE, UUID_A, UUID_B, eventually, node_object, short_tempdir, simulation


def taints(api: ApiServerStandin) -> dict[str, list[str]]:
    return {
        d["name"]: [f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in d.get("taints") or []]
        for s in api.list("ResourceSlice")
        for d in s["spec"]["devices"]
    }


def node_events(api: ApiServerStandin, reason: str) -> list[dict[str, Any]]:
    return [e for e in describe_events(api, "Node", NODE, "", NODE) if e["reason"] == reason]


async def metrics_text(port: int) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        return await response.text()


@asynccontextmanager
async def running(
    api: ApiServerStandin, tmp: Path, *, hami_core: bool = True, resync_seconds: float = 0.1
) -> AsyncIterator[DraNodePlugin]:
    if hami_core:
        install_placeholder(tmp / "hook")
    cdi = tmp / "cdi"
    cdi.mkdir(exist_ok=True)
    (cdi / "nvidia.json").write_text(json.dumps(nvidia_cdi_spec([(0, UUID_A), (1, UUID_B)])))
    nvml = load_simulation(simulation(), NODE)
    nvml.nvmlInit()
    kube = Kube(api.api_client(), component="node")
    config = Config(
        node=NodeConfig(hook_path=str(tmp / "hook"), recovery_quiet_seconds=0.5, allocate_timeout_seconds=2.0)
    )
    with short_tempdir() as root:
        plugin = DraNodePlugin(
            DraSettings(
                node_name=NODE,
                config=config,
                kubelet_root_dir=root,
                cdi_dir=cdi,
                gpu_cdi_dirs=(cdi,),
                lock_dir=str(tmp / "vgpulock"),
                xid_wait_ms=50,
                probe_interval_seconds=0.1,
                metrics_port=0,
                hook_path_poll_seconds=0.05,
                resync_seconds=resync_seconds,
            ),
            nvml,
            kube,
        )
        try:
            await plugin.start()
            yield plugin
        finally:
            await plugin.stop()
            kube.close()
            nvml.nvmlShutdown()


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.feature_gates = FeatureGates.of_release(36)
    apiserver.put(node_object())
    apiserver.put(device_class())
    return apiserver


async def test_without_hami_core_every_gpu_is_tainted_until_it_is_installed(
    api: ApiServerStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    async with running(api, tmp_path, hami_core=False) as plugin:
        # The first pool already says it: published before the sockets were served.
        held = taints(api)
        assert sorted(held) == ["gpu-0", "gpu-1"]
        assert all(len(t) == 1 and t[0].startswith(f"{UNHEALTHY_TAINT_KEY}=") for t in held.values())
        assert all(t[0].endswith(":NoSchedule") for t in held.values())
        assert "event=hami_core_missing" in caplog.text
        await eventually(lambda: bool(node_events(api, HAMI_CORE_MISSING)))
        assert plugin.metrics_server is not None
        text = await metrics_text(plugin.metrics_server.port)
        assert f'kube_vgpu_hami_core_ready{{folder="{tmp_path / "hook"}",node="{NODE}"}} 0.0' in text
        assert f'kube_vgpu_dra_consumable_capacity{{node="{NODE}"}} 1.0' in text

        install_placeholder(tmp_path / "hook")
        await eventually(lambda: taints(api) == {"gpu-0": [], "gpu-1": []})
        await eventually(lambda: bool(node_events(api, HAMI_CORE_FOUND)))
        text = await metrics_text(plugin.metrics_server.port)
        assert f'kube_vgpu_hami_core_ready{{folder="{tmp_path / "hook"}",node="{NODE}"}} 1.0' in text


async def test_an_xid_taints_its_gpu_and_a_prepared_claim_shows_in_the_metrics(
    api: ApiServerStandin, tmp_path: Path
) -> None:
    async with running(api, tmp_path) as plugin:
        assert taints(api) == {"gpu-0": [], "gpu-1": []}
        kubelet = DraKubelet(plugin.settings.kubelet_root_dir)
        try:
            assert [p.driver for p in await kubelet.register_all()] == [DRIVER_NAME]
            api.put(slice_claim("train", "default", "20Gi", 30))
            uid = DraScheduler(api).allocate("default", "train", NODE)["metadata"]["uid"]
            await kubelet.prepare(DRIVER_NAME, [ClaimId("default", "train", uid)])
        finally:
            await kubelet.close()
        assert plugin.metrics_server is not None
        text = await metrics_text(plugin.metrics_server.port)
        assert f'kube_vgpu_dra_claims_prepared{{node="{NODE}"}} 1.0' in text
        prepared = [
            line for line in text.splitlines() if line.startswith("kube_vgpu_dra_gpu_memory_prepared_mib{")
        ]
        assert sorted(line.rsplit(" ", 1)[1] for line in prepared) == ["0.0", "20480.0"]

        nvml: Any = plugin.nvml
        nvml.inject_xid(1, 79)
        await eventually(lambda: bool(taints(api)["gpu-1"]) and not taints(api)["gpu-0"])
        root = plugin.settings.kubelet_root_dir
    assert not registration_socket(root).exists()
    assert not dra_socket(root).exists()
    assert sorted(taints(api)) == ["gpu-0", "gpu-1"]  # the pool stays after stop


async def test_slices_the_kubelet_wipes_are_published_again(api: ApiServerStandin, tmp_path: Path) -> None:
    # The kubelet deletes a driver's slices at its own start and 30 s after the driver went away,
    # while the plugin serves on unchanged: the pool comes back without any health change.
    async with running(api, tmp_path) as plugin:
        assert plugin.publisher is not None
        generation = plugin.publisher.state.generation
        for s in api.list("ResourceSlice"):
            api.delete("ResourceSlice", s["metadata"]["name"])
        await eventually(lambda: taints(api) == {"gpu-0": [], "gpu-1": []})
        assert plugin.publisher.state.generation == generation + 1
        # An intact pool is read back and left alone.
        stored = [s["metadata"]["resourceVersion"] for s in api.list("ResourceSlice")]
        path = "/apis/resource.k8s.io/v1/resourceslices"

        def writes() -> int:
            return len([r for r in api.requests(None, path) if r.method != "GET"])

        reads, written = len(api.requests("GET", path)), writes()
        await eventually(lambda: len(api.requests("GET", path)) >= reads + 3)  # three resyncs
        assert writes() == written
        assert [s["metadata"]["resourceVersion"] for s in api.list("ResourceSlice")] == stored


async def test_sockets_that_cannot_be_bound_are_an_os_error_naming_the_folder(
    api: ApiServerStandin, tmp_path: Path
) -> None:
    # Past the unix socket path limit (the CLI refuses such a folder before starting: test_cli.py).
    install_placeholder(tmp_path / "hook")
    root = tmp_path / ("k" * 120)
    nvml = load_simulation(simulation(), NODE)
    nvml.nvmlInit()
    kube = Kube(api.api_client(), component="node")
    config = Config(node=NodeConfig(hook_path=str(tmp_path / "hook")))
    settings = DraSettings(
        node_name=NODE, config=config, kubelet_root_dir=root, cdi_dir=tmp_path / "cdi", metrics_port=0
    )
    plugin = DraNodePlugin(settings, nvml, kube)
    try:
        with pytest.raises(OSError, match=f"cannot serve the DRA sockets under {root}: Failed to bind"):
            await plugin.start()
    finally:
        await plugin.stop()
        kube.close()
        nvml.nvmlShutdown()
    assert not registration_socket(root).exists()


async def test_the_slice_watch_alone_brings_a_wiped_pool_back(api: ApiServerStandin, tmp_path: Path) -> None:
    # No resync within the test: the watch of the pool's slices hears the deletion.
    async with running(api, tmp_path, resync_seconds=3600) as plugin:
        assert plugin.publisher is not None
        generation = plugin.publisher.state.generation
        for s in api.list("ResourceSlice"):
            api.delete("ResourceSlice", s["metadata"]["name"])
        await eventually(lambda: taints(api) == {"gpu-0": [], "gpu-1": []})
        assert plugin.publisher.state.generation == generation + 1


async def test_a_volcano_device_plugin_on_the_same_node_is_said_once_and_its_leaving_too(
    api: ApiServerStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubelet shows a device plugin's resource in the Node's capacity; while a Volcano vGPU
    resource has a non-zero amount there the DRA plugin says so (log line, metric, one Warning
    Event), and when the kubelet reports it at 0 (the device plugin gone) the metric drops."""
    caplog.set_level(logging.INFO)
    async with running(api, tmp_path) as plugin:
        assert plugin.metrics_server is not None
        port = plugin.metrics_server.port
        metric = f'kube_vgpu_dra_device_plugin_resources{{node="{NODE}"}}'
        assert f"{metric} 0.0" in await metrics_text(port)
        both = node_object()
        both["status"]["capacity"].update({"volcano.sh/vgpu-number": "20", "volcano.sh/vgpu-memory": "65536"})
        api.put(both)
        await eventually(lambda: "event=device_plugin_on_dra_node" in caplog.text)
        assert f"{metric} 2.0" in await metrics_text(port)
        await eventually(lambda: bool(node_events(api, DEVICE_PLUGIN_ON_DRA_NODE)))
        (event,) = node_events(api, DEVICE_PLUGIN_ON_DRA_NODE)
        assert event["type"] == "Warning"
        assert "volcano.sh/vgpu-memory=65536, volcano.sh/vgpu-number=20" in event["message"]
        assert caplog.text.count("event=device_plugin_on_dra_node") == 1  # said once, not every resync
        gone = node_object()
        gone["status"]["capacity"].update({"volcano.sh/vgpu-number": "0", "volcano.sh/vgpu-memory": "0"})
        api.put(gone)
        await eventually(lambda: "event=device_plugin_gone" in caplog.text)
        assert f"{metric} 0.0" in await metrics_text(port)
        assert len(node_events(api, DEVICE_PLUGIN_ON_DRA_NODE)) == 1


async def test_nvidias_device_plugin_on_the_same_node_is_said_too(
    api: ApiServerStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """NVIDIA's k8s-device-plugin (the GPU Operator's default) advertises nvidia.com/gpu: the same
    GPUs handed out a second time, noticed like a Volcano device plugin and named as NVIDIA's."""
    caplog.set_level(logging.INFO)
    async with running(api, tmp_path) as plugin:
        assert plugin.metrics_server is not None
        port = plugin.metrics_server.port
        metric = f'kube_vgpu_dra_device_plugin_resources{{node="{NODE}"}}'
        idle = node_object()
        idle["status"]["capacity"]["nvidia.com/gpu"] = "0"  # its plugin gone: the kubelet keeps 0
        served = node_object()
        served["status"]["capacity"]["nvidia.com/gpu"] = "2"
        served["status"]["allocatable"] = {"nvidia.com/gpu": "2"}
        api.put(served)
        await eventually(lambda: "event=device_plugin_on_dra_node" in caplog.text)
        assert f"{metric} 1.0" in await metrics_text(port)
        await eventually(lambda: bool(node_events(api, DEVICE_PLUGIN_ON_DRA_NODE)))
        (event,) = node_events(api, DEVICE_PLUGIN_ON_DRA_NODE)
        assert event["reason"] == "DevicePluginOnDRANode" and event["type"] == "Warning"
        assert "nvidia.com/gpu=2: NVIDIA's k8s-device-plugin" in event["message"]
        assert "nvidia.com/gpu.deploy.device-plugin=false" in event["message"]
        api.put(idle)
        await eventually(lambda: "event=device_plugin_gone" in caplog.text)
        assert f"{metric} 0.0" in await metrics_text(port)
