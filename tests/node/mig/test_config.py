"""The MIG geometry the plugin reads: the ConfigMap through the API (stand-in), the default, errors."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kube_vgpu.contract.config import NodeConfig
from kube_vgpu.contract.mig.shipped import DEFAULT_DEVICE_CONFIG_YAML, default_device_config
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.mig.config import MigConfigError, geometry_from_configmap, gpu_groups, load_geometry
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node_mig import A100_40
from tests.support.timeouts import HANG_S

ONE_GROUP = """\
nvidia:
  knownMigGeometries:
  - models: ["A100-SXM4-40GB"]
    allowedGeometries:
    - group: only
      geometries: [{name: 3g.20gb, memory: 19968, count: 2}]
"""


def configmap(namespace: str, name: str, data: dict[str, str]) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def test_absent_configmap_or_key_means_the_default_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "kube_vgpu.node.mig"):
        loaded = geometry_from_configmap(None, "kube-system", "volcano-vgpu-device-config")
    assert loaded.config == default_device_config() and loaded.source == "built-in default"
    assert "event=mig_geometry_default" in caplog.text and "does not exist" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kube_vgpu.node.mig"):
        no_key = geometry_from_configmap(configmap("ns", "cm", {"other": "x"}), "ns", "cm")
    assert no_key.config == default_device_config() and "has no key device-config.yaml" in caplog.text


def test_an_invalid_document_is_an_error_naming_the_configmap_and_key() -> None:
    bad = configmap("ns", "cm", {"device-config.yaml": "nvidia:\n  knownMigGeometries: [{models: []}]\n"})
    with pytest.raises(MigConfigError, match=r"configmap ns/cm key device-config\.yaml: .*models"):
        geometry_from_configmap(bad, "ns", "cm")


def test_the_first_matching_entry_by_substring_of_the_registered_type() -> None:
    a100 = GpuInfo(index=0, uuid="GPU-x", name=A100_40, minor=0, memory_mib=40960)
    groups = gpu_groups(default_device_config(), a100)
    assert groups is not None and [g.name for g in groups] == ["group1", "group2", "group3", "group4"]
    assert groups[1].instance_types[0].name == "2g.10gb"
    gh200 = GpuInfo(index=0, uuid="GPU-y", name="NVIDIA GH200 480GB", minor=0, memory_mib=97871)
    assert gpu_groups(default_device_config(), gh200) is None  # "NVIDIA H200" is not inside it


async def test_load_reads_the_configured_configmap_through_the_api(apiserver: ApiServerStandin) -> None:
    apiserver.put(configmap("gpu-system", "my-geometry", {"device-config.yaml": ONE_GROUP}))
    apiserver.put(
        configmap(
            "kube-system", "volcano-vgpu-device-config", {"device-config.yaml": DEFAULT_DEVICE_CONFIG_YAML}
        )
    )
    kube = Kube(apiserver.api_client(), component="node")
    try:
        node = NodeConfig(device_config_namespace="gpu-system", device_config_name="my-geometry")
        loaded = await load_geometry(kube, node, stop=asyncio.Event())
        assert loaded is not None and loaded.source == "configmap gpu-system/my-geometry"
        assert [g.name for g in loaded.config.known_mig_geometries[0].groups] == ["only"]
        default_place = await load_geometry(kube, NodeConfig(), stop=asyncio.Event())
        assert (
            default_place is not None
            and default_place.source == "configmap kube-system/volcano-vgpu-device-config"
        )
    finally:
        kube.close()


async def test_load_falls_back_when_the_configmap_is_absent(apiserver: ApiServerStandin) -> None:
    kube = Kube(apiserver.api_client(), component="node")
    try:
        loaded = await load_geometry(kube, NodeConfig(), stop=asyncio.Event())
    finally:
        kube.close()
    assert loaded is not None and loaded.source == "built-in default"


async def test_load_retries_while_the_api_is_down_until_it_answers_or_stop(
    apiserver: ApiServerStandin,
) -> None:
    apiserver.set_outage(True)
    kube = Kube(apiserver.api_client(), component="node")
    try:
        stop = asyncio.Event()
        waiting = asyncio.create_task(load_geometry(kube, NodeConfig(), stop=stop, retry_seconds=0.05))
        given_up = asyncio.create_task(
            load_geometry(kube, NodeConfig(), stop=asyncio.Event(), retry_seconds=0.05)
        )
        await asyncio.sleep(0.3)  # tries refused meanwhile (none can succeed while the API is down)
        assert not waiting.done() and not given_up.done()
        stop.set()
        async with asyncio.timeout(HANG_S):
            assert await waiting is None
        await asyncio.to_thread(apiserver.set_outage, False)
        async with asyncio.timeout(HANG_S):
            loaded = await given_up
        assert loaded is not None and loaded.source == "built-in default"
    finally:
        kube.close()


async def test_no_permission_to_read_the_configmap_stops_the_plugin(apiserver: ApiServerStandin) -> None:
    apiserver.deny("get", "configmaps")
    kube = Kube(apiserver.api_client(), component="node")
    try:
        with pytest.raises(MigConfigError, match="may not read it"):
            await load_geometry(kube, NodeConfig(), stop=asyncio.Event())
    finally:
        kube.close()


def test_a_configmap_document_giving_a_key_twice_is_an_error_naming_the_configmap_and_both_lines() -> None:
    # Volcano's YAML decoder would keep one of the two geometries: which one the scheduler fits
    # with must not be left to chance.
    twice = ONE_GROUP + "  knownMigGeometries: []\n"
    with pytest.raises(MigConfigError) as info:
        geometry_from_configmap(configmap("ns", "cm", {"device-config.yaml": twice}), "ns", "cm")
    assert str(info.value) == (
        "configmap ns/cm key device-config.yaml: device-config.yaml: not valid YAML: "
        "key 'knownMigGeometries' given twice (lines 2 and 7): keep one of them"
    )
    once = geometry_from_configmap(configmap("ns", "cm", {"device-config.yaml": ONE_GROUP}), "ns", "cm")
    assert once.source == "configmap ns/cm"
