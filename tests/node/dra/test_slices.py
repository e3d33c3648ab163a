"""The slice builder: attributes, capacities and policies, taints, the pool's slices, and the limits
of the API on both sides; every published object checked against the stand-in's validation."""

from __future__ import annotations

from typing import Any, cast

import pytest

from kube_vgpu.node.dra.attributes import GpuFacts, cuda_version, device_attributes, model_name, semver
from kube_vgpu.node.dra.slices import (
    DRIVER,
    UNHEALTHY_TAINT_KEY,
    CounterSet,
    PoolSpec,
    SliceOptions,
    Unhealthy,
    build_device,
    build_devices,
    build_slices,
    dropped_features,
    quantity_mib,
    slice_name,
    taint_value,
)

A100 = GpuFacts(
    index=0,
    minor=0,
    uuid="GPU-6e8c2f0a-1111-2222-3333-444455556666",
    product_name="NVIDIA A100-SXM4-80GB",
    memory_mib=81920,
    driver_version="550.54.15",
    cuda_driver_version=12040,
    compute_capability=(8, 0),
    architecture="ampere",
    mig_capable=True,
)
SHARED = SliceOptions(consumable_capacity=True, device_taints=True)
WHOLE = SliceOptions(consumable_capacity=False, device_taints=False)
SICK = Unhealthy("XID 79: GPU has fallen off the bus", "2026-01-02T03:04:05Z")


def gpu(minor: int, **changes: Any) -> GpuFacts:
    fields = {**A100.__dict__, "index": minor, "minor": minor, "uuid": f"GPU-{minor:08d}", **changes}
    return GpuFacts(**fields)


def test_attributes_users_select_on() -> None:
    assert device_attributes(A100) == {
        "type": {"string": "gpu"},
        "uuid": {"string": A100.uuid},
        "index": {"int": 0},
        "minor": {"int": 0},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"},
        "model": {"string": "a100-sxm4-80gb"},
        "memoryMiB": {"int": 81920},
        "migCapable": {"bool": True},
        "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"},
        "cudaComputeCapability": {"version": "8.0.0"},
        "architecture": {"string": "ampere"},
    }


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3"),
        ("Tesla_T4", "tesla-t4"),
        ("NVIDIA", "nvidia"),
    ],
)
def test_model_is_normalised_by_segments(nvml_name: str, model: str) -> None:
    assert model_name(nvml_name) == model


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("550.54.15", "550.54.15"),
        ("550.54", "550.54.0"),
        ("535", "535.0.0"),
        ("r550", None),
        ("1.2.3.4", None),
    ],
)
def test_versions_are_semver_or_left_out(text: str, expected: str | None) -> None:
    assert semver(text) == expected
    attributes = device_attributes(gpu(0, driver_version=text))
    assert attributes.get("driverVersion") == ({"version": expected} if expected else None)


def test_cuda_version_decoding() -> None:
    assert cuda_version(12040) == "12.4.0"
    assert cuda_version(11080) == "11.8.0"


def test_long_product_names_are_cut_to_the_attribute_limit() -> None:
    name = "NVIDIA " + "X" * 80
    attributes = device_attributes(gpu(0, product_name=name))
    assert attributes["productName"] == {"string": name[:64]}
    assert len(attributes["model"]["string"]) == 64


def test_a_shared_device_has_capacities_with_request_policies() -> None:
    device = build_device(A100, None, SHARED)
    assert device is not None
    assert device["name"] == "gpu-0"
    assert device["allowMultipleAllocations"] is True
    assert device["capacity"] == {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "80Gi", "validRange": {"min": "256Mi", "step": "1Mi"}},
        },
        "cores": {
            "value": "100",
            "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
        },
    }
    assert "taints" not in device


def test_a_card_smaller_than_the_minimum_share_offers_itself_whole() -> None:
    device = build_device(gpu(0, memory_mib=200), None, SHARED)
    assert device is not None
    assert device["capacity"]["memory"]["requestPolicy"]["validRange"]["min"] == "200Mi"


def test_without_consumable_capacity_a_device_is_a_whole_gpu() -> None:
    device = build_device(A100, None, WHOLE)
    assert device is not None
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}


def test_an_unhealthy_gpu_is_tainted_or_left_out() -> None:
    tainted = build_device(A100, SICK, SHARED)
    assert tainted is not None
    assert tainted["taints"] == [
        {
            "key": UNHEALTHY_TAINT_KEY,
            "value": "XID-79-GPU-has-fallen-off-the-bus",
            "effect": "NoSchedule",
            "timeAdded": "2026-01-02T03:04:05Z",
        }
    ]
    assert build_device(A100, SICK, SliceOptions(consumable_capacity=True, device_taints=False)) is None
    devices = build_devices([gpu(1), gpu(0)], {"GPU-00000001": SICK}, WHOLE)
    assert [d["name"] for d in devices] == ["gpu-0"]


@pytest.mark.parametrize(
    ("reason", "value"),
    [("xid 79", "xid-79"), ("-", "unhealthy"), ("a" * 80, "a" * 63), ("ok.", "ok")],
)
def test_taint_values_are_label_values(reason: str, value: str) -> None:
    assert taint_value(reason) == value


@pytest.mark.parametrize(
    ("mib", "text"), [(81920, "80Gi"), (1024, "1Gi"), (1023, "1023Mi"), (1048576, "1Ti")]
)
def test_quantities_are_written_canonical(mib: int, text: str) -> None:
    assert quantity_mib(mib) == text


def test_a_pool_of_one_slice_is_bound_to_and_owned_by_its_node() -> None:
    devices = build_devices([gpu(0), gpu(1)], {}, SHARED)
    (only,) = build_slices(PoolSpec("node-a", "uid-a", 7, devices))
    assert only["metadata"] == {
        "name": "node-a-vgpu-0",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-a", "controller": True}
        ],
    }
    assert only["spec"]["driver"] == DRIVER
    assert only["spec"]["nodeName"] == "node-a"
    assert only["spec"]["pool"] == {"name": "node-a", "generation": 7, "resourceSliceCount": 1}
    assert [d["name"] for d in only["spec"]["devices"]] == ["gpu-0", "gpu-1"]


def test_devices_split_at_the_per_slice_limits() -> None:
    plain = [{"name": f"gpu-{i}"} for i in range(129)]
    slices = build_slices(PoolSpec("n", "u", 1, plain))
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 1]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert len(build_slices(PoolSpec("n", "u", 1, plain[:128]))) == 1
    tainted = [{"name": f"gpu-{i}", "taints": [{"key": "k", "effect": "NoSchedule"}]} for i in range(65)]
    assert [len(s["spec"]["devices"]) for s in build_slices(PoolSpec("n", "u", 1, tainted))] == [64, 1]
    assert len(build_slices(PoolSpec("n", "u", 1, tainted[:64]))) == 1


def test_counter_sets_go_in_slices_of_their_own() -> None:
    pool = PoolSpec("n", "u", 3, [{"name": "gpu-0"}], [CounterSet("gpu-0-counters", {"memory": "80Gi"})])
    devices, counters = build_slices(pool)
    assert "sharedCounters" not in devices["spec"]
    assert "devices" not in counters["spec"]
    assert counters["spec"]["sharedCounters"] == [
        {"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}
    ]
    assert counters["spec"]["pool"]["resourceSliceCount"] == 2
    assert counters["metadata"]["name"] == "n-vgpu-1"


def test_an_empty_pool_is_still_published() -> None:
    (only,) = build_slices(PoolSpec("n", "u", 1, []))
    assert only["spec"]["devices"] == []


def test_slice_names_fit_253_characters_on_both_sides() -> None:
    fits = "n" * (253 - len("-vgpu-0"))
    assert slice_name(fits, 0) == fits + "-vgpu-0"
    longer = fits + "x"
    name = slice_name(longer, 0)
    assert len(name) <= 253
    assert name.endswith("-vgpu-0")
    assert name != slice_name(fits + "y", 0)


def test_dropped_features_are_read_from_what_was_stored() -> None:
    sent = build_slices(
        PoolSpec("n", "u", 1, build_devices([gpu(0), gpu(1)], {"GPU-00000001": SICK}, SHARED))
    )
    assert dropped_features(sent, sent) == SHARED
    stored: list[dict[str, Any]] = [
        {
            "spec": {
                "devices": [
                    {k: v for k, v in d.items() if k not in ("allowMultipleAllocations", "taints")}
                    for d in sent[0]["spec"]["devices"]
                ]
            }
        }
    ]
    assert dropped_features(sent, stored) == SliceOptions(consumable_capacity=False, device_taints=False)
    # Nothing tainted was sent: nothing says taints were dropped.
    healthy = build_slices(PoolSpec("n", "u", 1, build_devices([gpu(0)], {}, SHARED)))
    assert dropped_features(healthy, [{"spec": {"devices": [{"name": "gpu-0"}]}}]) == SliceOptions(
        consumable_capacity=False, device_taints=True
    )


def test_facts_are_read_through_nvml() -> None:
    from kube_vgpu.node.dra.attributes import read_facts
    from kube_vgpu.node.nvml.gpus import discover
    from kube_vgpu.standins.nvml.api import load_simulation

    nvml = load_simulation(
        {
            "gpus": [
                {"model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "count": 1, "migCapable": True},
                {"model": "Tesla V100-SXM2-32GB", "memoryMiB": 32768, "count": 1},
            ]
        },
        "node-a",
    )
    nvml.nvmlInit()
    try:
        a100, v100 = read_facts(nvml, discover(nvml))
    finally:
        nvml.nvmlShutdown()
    assert (a100.product_name, a100.memory_mib, a100.mig_capable) == ("NVIDIA A100-SXM4-80GB", 81920, True)
    assert (v100.product_name, v100.mig_capable) == ("Tesla V100-SXM2-32GB", False)
    assert semver(a100.driver_version) is not None
    assert a100.cuda_driver_version is not None
    # The simulator answers no architecture call: the model's published values stand in.
    assert (a100.architecture, a100.compute_capability) == ("ampere", (8, 0))
    assert (v100.architecture, v100.compute_capability) == ("volta", (7, 0))


class _FakeNvml:
    """A driver that answers every call read_facts makes, as pynvml returns them."""

    class NVMLError(Exception):
        pass

    def __init__(self, mig: bool) -> None:
        self.mig = mig

    def nvmlSystemGetDriverVersion(self) -> bytes:  # older pynvml releases return bytes
        return b"570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetArchitecture(self, handle: int) -> int:
        return 9  # NVML_DEVICE_ARCH_HOPPER

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        if not self.mig:
            raise self.NVMLError("Not Supported")
        return [0, 0]


@pytest.mark.parametrize("mig", [True, False])
def test_facts_come_from_nvml_where_the_driver_answers(mig: bool) -> None:
    from kube_vgpu.node.dra.attributes import read_facts
    from kube_vgpu.node.nvml.gpus import GpuInfo

    # A model no table knows: every fact must come from the driver.
    from kube_vgpu.node.nvml.surface import Nvml

    # The fake answers only the calls read_facts makes.
    nvml = cast(Nvml, _FakeNvml(mig))
    (facts,) = read_facts(nvml, [GpuInfo(0, "GPU-x", "NVIDIA Future GPU", 3, 97871)])
    assert (facts.driver_version, facts.cuda_driver_version) == ("570.86.15", 12080)
    assert (facts.compute_capability, facts.architecture, facts.mig_capable) == ((9, 0), "hopper", mig)
    assert device_attributes(facts)["cudaDriverVersion"] == {"version": "12.8.0"}
    assert facts.device_name == "gpu-3"
