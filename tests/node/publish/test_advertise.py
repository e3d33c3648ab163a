"""The node plugin's published state: device list, register annotation, labels, capacity."""

from __future__ import annotations

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.names import NODE_REGISTER
from kube_vgpu.contract.register import GpuRecord, decode_register
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.publish.advertise import (
    HEALTHY,
    UNHEALTHY,
    capacity,
    capacity_patch,
    desired_labels,
    device_list,
    label_changes,
    metadata_patch,
    register_value,
)
from tests.support.node import GPUS, UUID_A, UUID_B, V100

NAMES = ResourceNames()


def test_register_for_the_worked_example_node_decodes_back_to_it() -> None:
    value = register_value(GPUS, set(), 10, "hami-core")
    assert value.endswith(":") and value.count(":") == 2
    assert decode_register(value) == [
        GpuRecord(UUID_A, 10, 32768, register_type(V100), True, "hami-core"),
        GpuRecord(UUID_B, 10, 32768, register_type(V100), True, "hami-core"),
    ]


def test_register_orders_by_minor_number_not_discovery_order() -> None:
    swapped = (GPUS[1], GPUS[0].__class__(**{**GPUS[0].__dict__, "minor": 5}))
    records = decode_register(register_value(swapped, set(), 10, "hami-core"))
    assert [r.uuid for r in records] == [UUID_B, UUID_A]


def test_unhealthy_gpu_registers_count_zero_and_leaves_capacity() -> None:
    records = decode_register(register_value(GPUS, {UUID_B}, 10, "hami-core"))
    assert (records[1].count, records[1].healthy) == (0, False)
    assert records[0].count == 10
    assert capacity(GPUS, {UUID_B}, NAMES) == {NAMES.memory: "32768", NAMES.cores: "100"}
    assert capacity(GPUS, set(), NAMES) == {NAMES.memory: "65536", NAMES.cores: "200"}


def test_device_list_has_split_devices_per_gpu_with_health() -> None:
    devices = device_list(GPUS, {UUID_A}, 3)
    assert [d.id for d in devices] == [f"{UUID_A}-0", f"{UUID_A}-1", f"{UUID_A}-2"] + [
        f"{UUID_B}-{k}" for k in range(3)
    ]
    assert [d.health for d in devices] == [UNHEALTHY] * 3 + [HEALTHY] * 3
    assert all(len(d.id) <= 63 for d in device_list(GPUS, set(), 10))


def test_labels_and_removal_of_vanished_gpus() -> None:
    labels = desired_labels(GPUS[:1], "hami-core")
    assert labels == {
        "kube-vgpu.io/vgpu-mode": "hami-core",
        "gpu-model.kube-vgpu.io/Tesla-V100-PCIE-32GB": "true",
        f"gpu-uuid.kube-vgpu.io/{UUID_A}": "true",
    }
    current = {
        **desired_labels(GPUS, "hami-core"),
        "gpu-model.kube-vgpu.io/NVIDIA-A100-SXM4-80GB": "true",
        "kubernetes.io/hostname": "gpu-node-1",
    }
    assert label_changes(current, labels) == {
        f"gpu-uuid.kube-vgpu.io/{UUID_B}": None,
        "gpu-model.kube-vgpu.io/NVIDIA-A100-SXM4-80GB": None,
    }


def test_metadata_patch_is_none_when_the_node_is_current() -> None:
    register = register_value(GPUS, set(), 10, "hami-core")
    labels = desired_labels(GPUS, "hami-core")
    node = {"metadata": {"name": "n", "annotations": {NODE_REGISTER: register}, "labels": dict(labels)}}
    assert metadata_patch(node, register, labels) is None
    changed = register_value(GPUS, {UUID_A}, 10, "hami-core")
    assert metadata_patch(node, changed, labels) == {"metadata": {"annotations": {NODE_REGISTER: changed}}}
    assert metadata_patch({"metadata": {}}, register, labels) == {
        "metadata": {"annotations": {NODE_REGISTER: register}, "labels": labels}
    }


def test_capacity_patch_rewrites_zeroed_or_missing_values_only() -> None:
    wanted = capacity(GPUS, set(), NAMES)
    assert capacity_patch({"status": {"capacity": dict(wanted)}}, wanted) is None
    zeroed = {"status": {"capacity": {NAMES.memory: "0", NAMES.cores: "200", "cpu": "8"}}}
    assert capacity_patch(zeroed, wanted) == {"status": {"capacity": {NAMES.memory: "65536"}}}
    assert capacity_patch({}, wanted) == {"status": {"capacity": wanted}}


def test_h200_device_ids_fit_the_kubelet_limit() -> None:
    gpu = GpuInfo(0, "GPU-" + "f" * 8 + "-ffff-ffff-ffff-" + "f" * 12, "NVIDIA H200", 0, 143771)
    assert len(gpu.device_id(99)) <= 63


def test_handshake_is_due_unless_the_plugin_value_stands() -> None:
    from datetime import UTC, datetime

    from kube_vgpu.contract.names import NODE_HANDSHAKE
    from kube_vgpu.node.publish.advertise import handshake_due, handshake_value

    value = handshake_value(datetime(2026, 8, 20, 10, 7, 21, tzinfo=UTC))
    assert value == "Reported 2026-08-20 10:07:21 +0000 UTC"
    assert "Requesting" not in value and "Deleted" not in value
    assert handshake_due({"metadata": {}})
    assert handshake_due({"metadata": {"annotations": {NODE_HANDSHAKE: "Requesting_2026.08.20 10:07:21"}}})
    assert handshake_due({"metadata": {"annotations": {NODE_HANDSHAKE: "Deleted_2026.08.20 10:07:21"}}})
    assert not handshake_due({"metadata": {"annotations": {NODE_HANDSHAKE: value}}})
