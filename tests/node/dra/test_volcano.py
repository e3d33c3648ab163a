"""A Volcano device plugin on a DRA node, as the Node object shows it (`node.dra.volcano`)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.node.dra.volcano import NVIDIA_GPU_RESOURCE, conflict_message, device_plugin_resources

NAMES = ResourceNames().all()


def node(capacity: dict[str, Any] | None = None, allocatable: dict[str, Any] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if capacity is not None:
        status["capacity"] = capacity
    if allocatable is not None:
        status["allocatable"] = allocatable
    return {"metadata": {"name": "n"}, "status": status}


@pytest.mark.parametrize(
    ("obj", "found"),
    [
        (node({"cpu": "8"}), {}),
        (node({"volcano.sh/vgpu-number": "0"}), {}),  # a plugin gone: the kubelet keeps the name at 0
        (node({"volcano.sh/vgpu-number": "10"}), {"volcano.sh/vgpu-number": "10"}),
        (node(None, {"volcano.sh/vgpu-cores": "200"}), {"volcano.sh/vgpu-cores": "200"}),
        (
            node({"volcano.sh/vgpu-number": "0"}, {"volcano.sh/vgpu-number": "1"}),
            {"volcano.sh/vgpu-number": "1"},
        ),
        (node({"volcano.sh/vgpu-memory": "1k"}), {"volcano.sh/vgpu-memory": "1k"}),
        (
            node({"volcano.sh/vgpu-memory": "lots"}),
            {"volcano.sh/vgpu-memory": "lots"},
        ),  # no quantity: present
        (node({"nvidia.com/gpu": "8"}), {}),  # not looked for here: the driver adds it (below)
        ({"status": "broken"}, {}),
        ({}, {}),
        (node({"volcano.sh/vgpu-number": ["x"] * 1000}), {"volcano.sh/vgpu-number": str(["x"] * 1000)[:64]}),
    ],
)
def test_only_a_non_zero_volcano_resource_counts(obj: dict[str, Any], found: dict[str, str]) -> None:
    assert device_plugin_resources(obj, NAMES) == found


def test_configured_resource_names_are_the_ones_looked_for() -> None:
    names = ResourceNames(count="example.com/vgpu").all()
    assert device_plugin_resources(node({"example.com/vgpu": "4"}), names) == {"example.com/vgpu": "4"}
    assert device_plugin_resources(node({"volcano.sh/vgpu-number": "4"}), names) == {}


def test_the_message_names_the_node_the_amounts_and_the_way_out() -> None:
    text = conflict_message("gpu-7", {"volcano.sh/vgpu-number": "20", "volcano.sh/vgpu-cores": "200"})
    assert text.startswith("node gpu-7 serves its GPUs through kube-vgpu's DRA driver")
    assert "volcano.sh/vgpu-cores=200, volcano.sh/vgpu-number=20" in text
    assert "One node serves one of the two" in text


def test_nvidias_device_plugin_counts_when_looked_for_and_at_zero_does_not() -> None:
    names = [*NAMES, NVIDIA_GPU_RESOURCE]
    assert device_plugin_resources(node({"nvidia.com/gpu": "8"}), names) == {"nvidia.com/gpu": "8"}
    assert device_plugin_resources(node({"nvidia.com/gpu": "0"}), names) == {}
    # Other NVIDIA resources (MIG strategies, GPU feature discovery labels) are not whole GPUs.
    assert device_plugin_resources(node({"nvidia.com/mig-1g.10gb": "7"}), names) == {}


def test_the_message_names_nvidias_plugin_and_the_gpu_operators_label() -> None:
    text = conflict_message("gpu-7", {"nvidia.com/gpu": "8"}, NAMES)
    assert "nvidia.com/gpu=8: NVIDIA's k8s-device-plugin" in text
    assert "nvidia.com/gpu.deploy.device-plugin=false" in text and "Volcano" not in text
    both = conflict_message("gpu-7", {"nvidia.com/gpu": "8", "volcano.sh/vgpu-number": "80"}, NAMES)
    assert "a Volcano device plugin" in both and "and NVIDIA's k8s-device-plugin" in both
    # HAMi-style names make nvidia.com/gpu the configured count name: then it is Volcano's.
    hami = conflict_message("gpu-7", {"nvidia.com/gpu": "8"}, ResourceNames(count="nvidia.com/gpu").all())
    assert "a Volcano device plugin" in hami and "k8s-device-plugin" not in hami
