"""Custom resource names end to end (issue 10 item 5): HAMi-style names work through every part.

Volcano reads pod requests under the names in its device ConfigMap, but its node-readiness check
reads Volcano's default names in allocatable whatever the ConfigMap says (Volcano's
`pkg/scheduler/api/devices/nvidia/vgpu/device_info.go` `NewGPUDevices`).
So: the chart's ConfigMap names the program's resources, the Volcano stand-in takes its names from
that ConfigMap as Volcano does, the node plugin advertises Volcano's names beside the configured
ones, and `kube-vgpu demo --once` passes with a HAMi-names config.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube_vgpu.contract import names as n
from kube_vgpu.contract.config import ResourceNames, load_config, parse_config
from kube_vgpu.contract.mig.geometry import encode_device_config, parse_device_config
from kube_vgpu.contract.mig.shipped import default_device_config, device_config_for
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.demo.cli import DEFAULT_EXAMPLES, examples_config
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.publish.advertise import capacity
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.volcano.config import BUILTIN_DEVICE_CONFIG, read_device_config, request_names
from kube_vgpu.standins.volcano.scheduler import VolcanoBinding, place
from tests.support.helm_render import render

REPO = Path(__file__).resolve().parents[2]
HAMI_EXAMPLES = REPO / "examples" / "hami-names"
HAMI = ResourceNames(
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"
)
UUID_A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"


def test_the_hami_examples_config_names_the_hami_resources() -> None:
    assert load_config(HAMI_EXAMPLES / "config.yaml").resource_names == HAMI
    # Every example pod asks for its GPU under those names and under no Volcano default name.
    for path in sorted((HAMI_EXAMPLES / "pods").glob("*.yaml")):
        text = path.read_text()
        assert not any(name in text for name in ResourceNames().all()), path.name


# The HAMi examples are the default ones with the names swapped (longest first: one is a prefix).
RENAMES = [
    ("volcano.sh/vgpu-memory-percentage", HAMI.memory_percentage),
    ("volcano.sh/vgpu-number", HAMI.count),
    ("volcano.sh/vgpu-memory", HAMI.memory),
    ("volcano.sh/vgpu-cores", HAMI.cores),
    ("volcano.sh/vgpu-mode", "nvidia.com/vgpu-mode"),  # the alias, as HAMi users write it
    (
        "# A quarter of a GPU's memory, whatever its size. No vgpu-number",
        f"# A quarter of a GPU's memory, whatever its size. No {HAMI.count}",
    ),
    ("# vgpu-memory is a plain number", f"# {HAMI.memory} is a plain number"),
]


def test_the_hami_examples_are_the_default_examples_under_other_names() -> None:
    """So both runs show the same journeys; after editing examples/, re-create examples/hami-names."""
    for name in ("nodes.yaml", "namespaces.yaml"):
        assert (HAMI_EXAMPLES / name).read_text() == (DEFAULT_EXAMPLES / name).read_text(), name
    defaults = sorted(p.name for p in (DEFAULT_EXAMPLES / "pods").glob("*.yaml"))
    assert sorted(p.name for p in (HAMI_EXAMPLES / "pods").glob("*.yaml")) == defaults
    for name in defaults:
        text = (DEFAULT_EXAMPLES / "pods" / name).read_text()
        for old, new in RENAMES:
            text = text.replace(old, new)
        assert (HAMI_EXAMPLES / "pods" / name).read_text() == text, name


def test_demo_passes_with_hami_style_names() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE_VGPU_")}
    result = subprocess.run(
        [sys.executable, "-m", "kube_vgpu", "demo", "--once", "--examples", str(HAMI_EXAMPLES)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    pods = sorted((HAMI_EXAMPLES / "pods").glob("*.yaml"))
    assert f"{len(pods)} of {len(pods)} examples ended as expected." in result.stdout
    assert "resources nvidia.com/gpu, nvidia.com/gpumem" in result.stdout
    assert "env   CUDA_DEVICE_MEMORY_LIMIT_0=10000m" in result.stdout
    assert "env   NVIDIA_VISIBLE_DEVICES=MIG-" in result.stdout
    assert "nvidia.com/gpumem='3Gi'" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_the_examples_config_is_the_flag_else_the_file_beside_the_examples(tmp_path: Path) -> None:
    assert examples_config(tmp_path, None) is None
    (tmp_path / "config.yaml").write_text("resourceNames: {count: example.com/gpu}\n")
    assert examples_config(tmp_path, None) == tmp_path / "config.yaml"
    assert examples_config(tmp_path, "other.yaml") == Path("other.yaml")


# --- the chart's device ConfigMap ----------------------------------------------------------------


def test_the_charts_volcano_device_config_names_the_programs_hami_resources() -> None:
    values: dict[str, Any] = {
        "config": {
            "resourceNames": {
                "count": HAMI.count,
                "memory": HAMI.memory,
                "memoryPercentage": HAMI.memory_percentage,
                "cores": HAMI.cores,
            }
        },
        "volcanoDeviceConfig": {"create": True},
    }
    rendered = render(values, kube_version="v1.32.0")
    configmaps = {c["metadata"]["name"]: c for c in rendered.of_kind("ConfigMap")}
    program = next(
        parse_config(c["data"]["config.yaml"]) for c in configmaps.values() if "config.yaml" in c["data"]
    )
    device = parse_device_config(configmaps[program.node.device_config_name]["data"][n.DEVICE_CONFIG_KEY])
    # Read with each side's own parser: Volcano's view of the names equals the program's.
    assert program.resource_names == HAMI
    assert request_names(device) == program.resource_names
    assert device.device_split_count == program.node.device_split_count
    # The whole document is the one the program ships and the demo's Volcano reads, MIG layouts
    # included (H100 and H200 among them, with each profile's NVML memory size).
    assert device == device_config_for(program.resource_names)


# --- the Volcano stand-in reads the ConfigMap, as Volcano does -------------------------------------------


def gpu_node() -> dict[str, Any]:
    record = GpuRecord(UUID_A, 10, 32768, register_type("NVIDIA A10"), True, "hami-core")
    ready = {
        "volcano.sh/vgpu-number": "10",
        "volcano.sh/vgpu-memory": "32768",
        "volcano.sh/vgpu-cores": "100",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "n1", "annotations": {n.NODE_REGISTER: encode_register([record])}},
        "status": {"allocatable": ready, "capacity": ready},
    }


def hami_pod() -> dict[str, Any]:
    limits = {HAMI.count: "1", HAMI.memory: "4096", HAMI.cores: "20"}
    return {
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]},
    }


def put_device_config(apiserver: ApiServerStandin, text: str) -> None:
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": n.DEVICE_CONFIG_MAP, "namespace": "kube-system"},
            "data": {n.DEVICE_CONFIG_KEY: text},
        }
    )


@pytest.mark.parametrize("names", [HAMI, ResourceNames()])
def test_the_volcano_stand_in_reads_request_names_from_the_configmap(
    apiserver: ApiServerStandin, names: ResourceNames
) -> None:
    put_device_config(apiserver, encode_device_config(device_config_for(names)))
    kube = Kube(apiserver.api_client())
    try:
        config = read_device_config(kube)
    finally:
        kube.close()
    assert request_names(config) == names
    placed = place(hami_pod(), [gpu_node()], [], request_names(config))
    # Volcano books the HAMi-named request only when its ConfigMap names those resources
    # (`nvidia/vgpu/utils.go` `getConfig`).
    assert isinstance(placed, VolcanoBinding)
    assert (placed.devices == f"{UUID_A},NVIDIA,4096,20:") == (names == HAMI)


def test_without_the_configmap_volcano_uses_its_builtin_names(apiserver: ApiServerStandin) -> None:
    kube = Kube(apiserver.api_client())
    try:
        config = read_device_config(kube)
    finally:
        kube.close()
    # Volcano's `nvidia/vgpu/utils.go` and `config/vgpu.go`: no percentage name and no MIG geometry
    # without the ConfigMap.
    assert config == BUILTIN_DEVICE_CONFIG
    assert request_names(config).memory_percentage == "" and not config.known_mig_geometries


def test_the_device_config_document_round_trips() -> None:
    for config in (default_device_config(), device_config_for(HAMI), BUILTIN_DEVICE_CONFIG):
        assert parse_device_config(encode_device_config(config)) == config
    doc = yaml.safe_load(encode_device_config(device_config_for(HAMI)))["nvidia"]
    assert (
        doc["resourceCountName"] == HAMI.count
        and doc["resourceMemoryPercentageName"] == HAMI.memory_percentage
    )


# --- the node advertises Volcano's readiness names too -------------------------------------------


GPUS = [
    GpuInfo(index=0, uuid=UUID_A, name="NVIDIA A10", minor=0, memory_mib=24576),
    GpuInfo(
        index=1, uuid="GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0", name="NVIDIA A10", minor=1, memory_mib=24576
    ),
]


def test_with_custom_names_the_node_also_advertises_volcanos_readiness_names() -> None:
    advertised = capacity(GPUS, set(), HAMI, split_count=10)
    assert advertised[HAMI.memory] == advertised["volcano.sh/vgpu-memory"] == "49152"
    assert advertised[HAMI.cores] == advertised["volcano.sh/vgpu-cores"] == "200"
    assert advertised["volcano.sh/vgpu-number"] == "20"  # the slots the count plugin lists
    assert HAMI.count not in advertised  # the device plugin's own resource: the kubelet's to write
    # An unhealthy GPU leaves both views; all unhealthy zeroes the readiness gate.
    one = capacity(GPUS, {UUID_A}, HAMI, split_count=10)
    assert one["volcano.sh/vgpu-number"] == "10" and one["volcano.sh/vgpu-memory"] == "24576"
    none = capacity(GPUS, {g.uuid for g in GPUS}, HAMI, split_count=10)
    assert {
        none[k] for k in ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores")
    } == {"0"}


def test_with_volcanos_names_nothing_extra_is_advertised() -> None:
    assert set(capacity(GPUS, set(), ResourceNames(), split_count=10)) == {
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-cores",
    }
    # Only the count renamed: Volcano's vgpu-number is then advertised for its readiness check.
    mixed = ResourceNames(count="example.com/vgpu")
    assert set(capacity(GPUS, set(), mixed, split_count=10)) == {
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-cores",
    }
