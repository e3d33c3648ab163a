"""Checks of the scheduler's choice against the node's GPUs and the pod's selectors."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.node.deviceplugin.verify import claim_problem, type_item_matches
from kube_vgpu.node.nvml.gpus import GpuInfo
from tests.support.node import GPUS, UUID_A, UUID_B

NAMES = ResourceNames()

BY_UUID = {g.uuid: g for g in GPUS}


def problem(
    records: list[DeviceRecord], annotations: dict[str, str] | None = None, **kw: object
) -> str | None:
    unhealthy = kw.get("unhealthy", set())
    mode = kw.get("mode", "hami-core")
    return claim_problem(tuple(records), annotations or {}, BY_UUID, unhealthy, mode)  # type: ignore[arg-type]


def rec(uuid: str = UUID_A, mem: int = 1000, cores: int = 0, type_: str = "NVIDIA") -> DeviceRecord:
    return DeviceRecord(uuid, mem, cores, type_)


def test_valid_claim_passes() -> None:
    assert problem([rec(UUID_A), rec(UUID_B, 32768, 100)]) is None


@pytest.mark.parametrize(
    ("records", "expected"),
    [
        ([rec("GPU-00000000-0000-0000-0000-000000000000")], "is not a GPU of this node"),
        ([rec(mem=40000)], "40000 MiB asked on GPU"),
        ([rec(cores=101)], "101% cores"),
        ([rec(), rec()], "given twice"),
        ([rec(type_="AMD")], "expected 'NVIDIA'"),
        ([rec(UUID_A + "[group1-0]")], "MIG slot"),
    ],
)
def test_forged_records_are_refused(records: list[DeviceRecord], expected: str) -> None:
    found = problem(records)
    assert found is not None and expected in found


def test_unhealthy_gpu_is_refused() -> None:
    assert "unhealthy" in (problem([rec()], unhealthy={UUID_A}) or "")


def test_mode_annotation_must_match_the_node() -> None:
    assert "runs hami-core" in (problem([rec()], {"volcano.sh/vgpu-mode": "mig"}) or "")
    assert problem([rec()], {"nvidia.com/vgpu-mode": "hami-core"}) is None


@pytest.mark.parametrize(
    ("annotations", "allowed"),
    [
        ({"nvidia.com/use-gputype": "[Tesla V100-PCIE-32GB]"}, True),
        ({"nvidia.com/use-gputype": "[tesla v100-pcie-32gb]"}, True),
        ({"nvidia.com/use-gputype": "[Tesla V100-PCIE-16GB]"}, False),
        ({"nvidia.com/use-gputype": "V100"}, True),
        ({"nvidia.com/use-gputype": "A100,V100-PCIE"}, True),
        ({"nvidia.com/use-gputype": "V10"}, False),  # Volcano's substring rule would say yes
        ({"nvidia.com/nouse-gputype": "V100"}, False),
        ({"nvidia.com/nouse-gputype": "A100"}, True),
        ({"volcano.sh/vgpu-use-gpuuuid": f" {UUID_A} ,"}, True),
        ({"volcano.sh/vgpu-use-gpuuuid": UUID_B}, False),
        ({"nvidia.com/use-gpuuuid": UUID_B}, False),
        ({"volcano.sh/vgpu-nouse-gpuuuid": UUID_A}, False),
        ({"nvidia.com/nouse-gpuuuid": UUID_A}, False),
        ({"volcano.sh/vgpu-use-gpuuuid": UUID_A, "volcano.sh/vgpu-nouse-gpuuuid": UUID_A}, False),
    ],
)
def test_selectors(annotations: dict[str, str], allowed: bool) -> None:
    found = problem([rec()], annotations)
    assert (found is None) == allowed, found


def test_type_items() -> None:
    a100 = "NVIDIA A100-SXM4-80GB"
    assert type_item_matches("A100", a100)
    assert not type_item_matches("A10", a100)
    assert type_item_matches("NVIDIA-[NVIDIA A100-SXM4-80GB]", a100)
    assert type_item_matches("H100-80GB", "NVIDIA H100 80GB HBM3")
    # A bracketed item is the text between its first "[" and its last "]", compared whole.
    assert not type_item_matches("[x[NVIDIA A100-SXM4-80GB]", a100)
    assert not type_item_matches("[NVIDIA A100-SXM4-80GB]]", a100)
    # Half a bracket is no bracketed item: the whole-segment rule reads it (and finds no model).
    assert not type_item_matches("[NVIDIA A100-SXM4-80GB", a100)
    assert not type_item_matches("NVIDIA A100-SXM4-80GB]", a100)
    assert GpuInfo(0, UUID_A, a100, 0, 81920).name == a100


def test_the_booking_is_checked_against_the_limits_only_when_container_and_names_are_given() -> None:
    asks_100 = {"name": "c", "resources": {"limits": {NAMES.count: "1", NAMES.memory: "100"}}}
    records = (rec(UUID_A, 0),)
    # Without the resource names the container's limits cannot be read: the claim alone is checked.
    assert claim_problem(records, {}, BY_UUID, set(), "hami-core", container=asks_100) is None
    found = claim_problem(records, {}, BY_UUID, set(), "hami-core", container=asks_100, names=NAMES)
    assert found is not None and "booked with 0 MiB" in found


def test_an_unhealthy_gpu_is_refused_with_why_when_known() -> None:
    records = (rec(UUID_A),)
    assert claim_problem(records, {}, BY_UUID, {UUID_A: "XID 79"}, "hami-core") == (
        f"GPU {UUID_A} is unhealthy (XID 79)"
    )
    # Without a reason (an empty one, or a plain set of UUIDs) the sentence ends at "unhealthy".
    assert claim_problem(records, {}, BY_UUID, {UUID_A: ""}, "hami-core") == f"GPU {UUID_A} is unhealthy"
    assert claim_problem(records, {}, BY_UUID, {UUID_A}, "hami-core") == f"GPU {UUID_A} is unhealthy"
    # Another GPU's reason is not this one's.
    assert claim_problem(records, {}, BY_UUID, {UUID_A: "", UUID_B: "XID 48"}, "hami-core") == (
        f"GPU {UUID_A} is unhealthy"
    )
