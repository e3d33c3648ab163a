"""Round trips of the node register annotation against a worked example: a node of two
V100 32 GB as Volcano's pkg/scheduler/api/devices/nvidia/vgpu/utils.go decodes it."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.register import GpuRecord, RegisterFormatError, decode_register, encode_register

WORKED = (
    "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5,10,32768,NVIDIA-Tesla V100-PCIE-32GB,true,hami-core:"
    "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0,10,32768,NVIDIA-Tesla V100-PCIE-32GB,true,hami-core:"
)


def test_worked_example_decodes_to_two_v100s_in_order() -> None:
    records = decode_register(WORKED)
    assert [r.uuid[:12] for r in records] == ["GPU-1c2d3e4f", "GPU-9f8e7d6c"]
    assert all(r.count == 10 and r.memory_mib == 32768 and r.healthy for r in records)
    assert {r.type for r in records} == {"NVIDIA-Tesla V100-PCIE-32GB"}
    assert {r.mode for r in records} == {"hami-core"}


def test_worked_example_round_trips_byte_for_byte() -> None:
    assert encode_register(decode_register(WORKED)) == WORKED


def test_single_gpu_keeps_trailing_colon() -> None:
    value = encode_register([GpuRecord("GPU-a", 10, 40960, "NVIDIA-[NVIDIA A100-SXM4-40GB]", True, "mig")])
    assert value == "GPU-a,10,40960,NVIDIA-[NVIDIA A100-SXM4-40GB],true,mig:"


def test_unhealthy_and_go_bool_spellings() -> None:
    records = decode_register("GPU-a,0,100,NVIDIA-x,F,hami-core:GPU-b,1,100,NVIDIA-x,T,hami-core:")
    assert [r.healthy for r in records] == [False, True]
    assert decode_register("GPU-a,1,100,NVIDIA-x,yes,hami-core:")[0].healthy is False


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("GPU-a,10,100,NVIDIA-x,true,hami-core", "no ':'"),
        ("GPU-a,10,100,NVIDIA-x,true:", "5 fields"),
        (":GPU-a,10,100,NVIDIA-x,true,hami-core:", "gap"),
        ("GPU-a,10,100,NVIDIA-x,true,hami-core::GPU-b,10,100,NVIDIA-x,true,hami-core:", "gap"),
    ],
)
def test_values_volcano_would_drop_are_refused(value: str, fragment: str) -> None:
    with pytest.raises(RegisterFormatError, match=fragment):
        decode_register(value)


def test_unparseable_numbers_read_as_zero_like_volcano() -> None:
    record = decode_register("GPU-a,ten,1e3,NVIDIA-x,true,hami-core:")[0]
    assert (record.count, record.memory_mib) == (0, 0)


@pytest.mark.parametrize("uuid", ["GPU-a,b", "GPU-a:b", "GPU-a[0]", ""])
def test_encoder_refuses_uuids_that_would_break_decoding(uuid: str) -> None:
    with pytest.raises(ValueError, match="UUID"):
        GpuRecord(uuid, 10, 1, "NVIDIA-x", True, "hami-core")


def test_encoder_refuses_mixed_modes() -> None:
    with pytest.raises(ValueError, match="one mode"):
        encode_register(
            [
                GpuRecord("GPU-a", 1, 1, "NVIDIA-x", True, "mig"),
                GpuRecord("GPU-b", 1, 1, "NVIDIA-x", True, "hami-core"),
            ]
        )
