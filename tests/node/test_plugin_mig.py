"""The node plugin in mig mode against the kubelet and API server stand-ins (real gRPC, real HTTP)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml
from grpc import aio

from kube_vgpu.cli import node as node_cli
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.names import BIND_PHASE, NODE_REGISTER
from kube_vgpu.contract.register import GpuRecord, decode_register
from kube_vgpu.node.mig.nvml import MigNvmlError, read_state
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.nvml.api import SimulatedNvml
from tests.support.node import NODE, Harness, eventually, free_port, node_object
from tests.support.node_mig import A100_40, GPU_0, GPU_1, mig_pod, mig_sim, running_mig_plugin


def node_main(argv: list[str]) -> int:
    """`kube-vgpu node ARGV`, in this process."""
    parser = argparse.ArgumentParser(prog="kube-vgpu node")
    node_cli.add_arguments(parser)
    return node_cli.run(parser.parse_args(argv))


@pytest.fixture
def api(apiserver: ApiServerStandin) -> ApiServerStandin:
    apiserver.put(node_object())
    return apiserver


async def allocate_one(h: Harness) -> dict[str, str]:
    response = await h.allocate(1)
    (container,) = response.container_responses
    assert list(container.mounts) == [] and list(container.devices) == []
    return dict(container.envs)


def profile_of(nvml: SimulatedNvml, mig_uuid: str) -> str:
    return str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByUUID(mig_uuid))).rsplit(" ", 1)[1]


def uuids(nvml: SimulatedNvml, gpu: str = GPU_0) -> list[str]:
    return [c.mig_uuid for o in read_state(nvml, gpu).instances for c in o.compute]


def uuids_while_changing(nvml: SimulatedNvml, gpu: str = GPU_0) -> list[str] | None:
    """The GPU's MIG devices, or None when a read races the plugin's own changes.

    The plugin destroys instances from a worker thread; a read that lists an
    instance and then queries it after it was destroyed fails as real NVML does.
    """
    try:
        return uuids(nvml, gpu)
    except MigNvmlError:
        return None


async def test_worked_example_through_the_kubelet(api: ApiServerStandin, kdir: Path, tmp_path: Path) -> None:
    nvml = mig_sim(count=2)
    async with running_mig_plugin(api, kdir, tmp_path, nvml) as h:
        node = api.get("Node", "gpu-node-1")
        assert node is not None
        assert decode_register(node["metadata"]["annotations"][NODE_REGISTER]) == [
            GpuRecord(GPU_0, 10, 40960, register_type(A100_40), True, "mig"),
            GpuRecord(GPU_1, 10, 40960, register_type(A100_40), True, "mig"),
        ]
        assert node["metadata"]["labels"]["kube-vgpu.io/vgpu-mode"] == "mig"

        api.put(mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000))
        first = await allocate_one(h)
        api.put(mig_pod("p2", [f"{GPU_0}[group2-1]"], 4000, vgpu_time="1786255700"))
        second = await allocate_one(h)

        assert set(first) == set(second) == {"NVIDIA_VISIBLE_DEVICES"}
        mig_1, mig_2 = first["NVIDIA_VISIBLE_DEVICES"], second["NVIDIA_VISIBLE_DEVICES"]
        assert mig_1 != mig_2 and mig_1.startswith("MIG-") and mig_2.startswith("MIG-")
        assert profile_of(nvml, mig_1) == profile_of(nvml, mig_2) == "2g.10gb"
        assert h.annotations("p1")[BIND_PHASE] == h.annotations("p2")[BIND_PHASE] == "success"
        assert read_state(nvml, GPU_1).instances == ()  # the other GPU untouched


async def test_a_layout_change_under_a_live_pod_fails_the_allocate_and_the_bind(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    nvml = mig_sim()
    async with running_mig_plugin(api, kdir, tmp_path, nvml) as h:
        api.put(mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000))
        await allocate_one(h)
        before = uuids(nvml)
        api.put(mig_pod("p2", [f"{GPU_0}[group1-0]"], 4000, vgpu_time="1786255700"))
        with pytest.raises(aio.AioRpcError) as refused:
            await h.allocate(1)
        details = refused.value.details() or ""
        assert "pod default/p2" in details and f"GPU {GPU_0}" in details
        assert "partitioned as group2 for live pod default/p1" in details
        assert h.annotations("p2")[BIND_PHASE] == "failed"
        assert uuids(nvml) == before


async def test_a_gpu_not_in_mig_mode_fails_the_allocate_with_the_fix(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    nvml = mig_sim(mig_enabled=False)
    async with running_mig_plugin(api, kdir, tmp_path, nvml) as h:
        api.put(mig_pod("p", [f"{GPU_0}[group2-0]"], 8000))
        with pytest.raises(aio.AioRpcError) as refused:
            await h.allocate(1)
        assert "nvidia-smi -i 0 -mig 1" in (refused.value.details() or "")
        assert h.annotations("p")[BIND_PHASE] == "failed"


async def test_instances_of_a_deleted_pod_go_after_the_grace_period(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    nvml = mig_sim()
    async with running_mig_plugin(api, kdir, tmp_path, nvml, mig_grace_seconds=0.4) as h:
        api.put(mig_pod("p", [f"{GPU_0}[group2-0]"], 8000))
        await allocate_one(h)
        assert len(uuids(nvml)) == 4
        api.delete("Pod", "p", "default")
        await eventually(lambda: uuids_while_changing(nvml) == [])


async def test_a_restarted_plugin_adopts_the_instances(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    nvml = mig_sim()
    async with running_mig_plugin(api, kdir, tmp_path, nvml) as h:
        api.put(mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000))
        mig_1 = (await allocate_one(h))["NVIDIA_VISIBLE_DEVICES"]
    layout = uuids(nvml)
    async with running_mig_plugin(api, kdir, tmp_path, nvml) as h:
        assert uuids(nvml) == layout  # nothing recreated at start
        api.put(mig_pod("p2", [f"{GPU_0}[group2-1]"], 4000, vgpu_time="1786255700"))
        mig_2 = (await allocate_one(h))["NVIDIA_VISIBLE_DEVICES"]
    assert uuids(nvml) == layout and layout[:2] == [mig_1, mig_2]


async def test_the_geometry_comes_from_the_configured_configmap(
    api: ApiServerStandin, kdir: Path, tmp_path: Path
) -> None:
    document = (
        "nvidia:\n  knownMigGeometries:\n  - models: [A100-SXM4-40GB]\n    allowedGeometries:\n"
        "    - group: halves\n      geometries: [{name: 3g.20gb, memory: 19968, count: 2}]\n"
    )
    configmap: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "geometry", "namespace": "gpu"},
        "data": {"device-config.yaml": document},
    }
    api.put(configmap)
    nvml = mig_sim()
    async with running_mig_plugin(
        api, kdir, tmp_path, nvml, device_config_namespace="gpu", device_config_name="geometry"
    ) as h:
        api.put(mig_pod("p", [f"{GPU_0}[halves-1]"], 15000))
        mig_uuid = (await allocate_one(h))["NVIDIA_VISIBLE_DEVICES"]
    state = read_state(nvml, GPU_0)
    assert [(o.start, o.size) for o in state.instances] == [(0, 4), (4, 4)]
    assert state.instances[1].compute[0].mig_uuid == mig_uuid


def test_a_geometry_configmap_that_does_not_parse_stops_the_node_command(
    apiserver: ApiServerStandin, kdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.put(node_object())
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "volcano-vgpu-device-config", "namespace": "kube-system"},
            "data": {
                "device-config.yaml": "nvidia:\n"
                "  knownMigGeometries: [{models: [A100], allowedGeometries: 3}]\n"
            },
        }
    )
    sim = tmp_path / "sim.yaml"
    sim.write_text(yaml.safe_dump({"gpus": [{"model": A100_40, "migCapable": True, "migEnabled": True}]}))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"node": {"metricsPort": free_port()}}))
    argv = [
        f"--node-name={NODE}",
        "--mode=mig",
        f"--kubelet-dir={kdir}",
        f"--simulate={sim}",
        f"--config={config}",
        f"--kubeconfig={apiserver.write_kubeconfig(tmp_path / 'kubeconfig')}",
    ]
    assert node_main(argv) == 1
    assert "configmap kube-system/volcano-vgpu-device-config key device-config.yaml" in caplog.text
    assert "allowedGeometries" in caplog.text and "Traceback" not in caplog.text
