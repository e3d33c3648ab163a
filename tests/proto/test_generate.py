"""The committed generated modules are exactly what compiling kube_vgpu/proto/ produces, and match the
wire facts."""

from __future__ import annotations

from pathlib import Path

from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto.generate import SRC_ROOT, generate


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert len(written) == 4
    for fresh in written:
        committed = SRC_ROOT / "kube_vgpu" / "proto" / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{fresh.name} is stale: run python -m kube_vgpu.proto.generate"
        )


def test_services_and_fields_match_the_kubelet_contract() -> None:
    file = pb.DESCRIPTOR
    assert file.package == "v1beta1"
    plugin = file.services_by_name["DevicePlugin"]
    assert [m.name for m in plugin.methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]
    assert plugin.methods_by_name["ListAndWatch"].server_streaming
    assert (
        file.services_by_name["Registration"].methods_by_name["Register"].input_type.name == "RegisterRequest"
    )
    fields = {f.name: (f.number, f.type) for f in pb.ContainerAllocateResponse.DESCRIPTOR.fields}
    assert {name: number for name, (number, _) in fields.items()} == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert [(f.name, f.number) for f in pb.Device.DESCRIPTOR.fields] == [
        ("ID", 1),
        ("health", 2),
        ("topology", 3),
    ]
    assert [(f.name, f.number) for f in pb.ContainerPreferredAllocationRequest.DESCRIPTOR.fields] == [
        ("available_deviceIDs", 1),
        ("must_include_deviceIDs", 2),
        ("allocation_size", 3),
    ]


def test_a_response_encodes_to_the_expected_bytes() -> None:
    # Field 1 (envs, length-delimited map entry {1: key, 2: value}) of ContainerAllocateResponse.
    msg = pb.ContainerAllocateResponse(envs={"A": "b"})
    assert msg.SerializeToString() == b"\x0a\x06\x0a\x01A\x12\x01b"
    device = pb.Device(ID="x", health="Healthy")
    assert device.SerializeToString() == b"\x0a\x01x\x12\x07Healthy"
