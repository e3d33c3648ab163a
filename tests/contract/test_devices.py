"""Round trips of the pod device list against a worked example: the two-container
pod Volcano's binpack places on two V100 32 GB."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.devices import DeviceListError, DeviceRecord, decode_pod_devices, encode_pod_devices

A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"
BINPACK = f"{A},NVIDIA,3000,30:;{A},NVIDIA,2048,0:{B},NVIDIA,2048,0:"


def test_worked_binpack_example_decodes_per_container() -> None:
    entries = decode_pod_devices(BINPACK)
    assert [[r.gpu_uuid for r in e] for e in entries] == [[A], [A, B]]
    assert entries[0][0].used_mem == 3000 and entries[0][0].used_cores == 30
    assert {r.type for e in entries for r in e} == {"NVIDIA"}


def test_round_trip_and_consumption_keeps_separators() -> None:
    entries = decode_pod_devices(BINPACK)
    assert encode_pod_devices(entries) == BINPACK
    after_c1 = encode_pod_devices([(), entries[1]])
    assert after_c1 == f";{A},NVIDIA,2048,0:{B},NVIDIA,2048,0:"
    assert encode_pod_devices([(), ()]) == ";"
    assert decode_pod_devices(";") == [(), ()]
    assert decode_pod_devices("") == []


def test_mig_ids_keep_their_slot_and_expose_the_parent() -> None:
    record = decode_pod_devices(f"{A}[group2-0],NVIDIA,8000,0:")[0][0]
    assert record.id == f"{A}[group2-0]" and record.gpu_uuid == A


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (f"{A},NVIDIA,3000,30", "does not end"),
        (f"{A},NVIDIA,3000:", "ID,TYPE,MEM,CORES"),
        (f"{A},NVIDIA,-1,0:", "not an unsigned"),
        (f"{A},NVIDIA,3Gi,0:", "not an unsigned"),
        (f"{A},NVIDIA,{2**64},0:", "64 bits"),
        (",NVIDIA,1,0:", "empty"),
    ],
)
def test_malformed_lists_are_refused_with_the_record_named(value: str, fragment: str) -> None:
    with pytest.raises(DeviceListError, match=fragment):
        decode_pod_devices(value)


def test_encoder_refuses_ids_with_separators() -> None:
    with pytest.raises(ValueError, match="device id"):
        DeviceRecord("GPU-a;b", 1, 0)
