"""The committed generated modules are exactly what compiling kube_vgpu/proto/ produces, and match the
wire facts."""

from __future__ import annotations

from pathlib import Path

from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto import dra_v1_pb2 as dra_v1
from kube_vgpu.proto import dra_v1beta1_pb2 as dra_v1beta1
from kube_vgpu.proto import pluginregistration_v1_pb2 as reg
from kube_vgpu.proto.generate import SRC_ROOT, generate


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    written = generate(tmp_path)
    assert len(written) == 16  # four files (module, grpc, two stubs) per proto
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


def test_dra_services_and_fields_match_the_kubelet_contract() -> None:
    # k8s.io/kubelet/pkg/apis/dra/{v1,v1beta1}/api.proto: the gRPC method paths the kubelet calls are
    # /<package>.DRAPlugin/<method>, so the package must be the kubelet's, not ours.
    for module, version in ((dra_v1, "v1"), (dra_v1beta1, "v1beta1")):
        file = module.DESCRIPTOR
        assert file.package == f"k8s.io.kubelet.pkg.apis.dra.{version}"
        service = file.services_by_name["DRAPlugin"]
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
        assert [m.name for m in service.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
        fields = [(f.name, f.number) for f in module.Device.DESCRIPTOR.fields]
        assert fields[:4] == [
            ("request_names", 1),
            ("pool_name", 2),
            ("device_name", 3),
            ("cdi_device_ids", 4),
        ]
        assert [(f.name, f.number) for f in module.Claim.DESCRIPTOR.fields] == [
            ("namespace", 1),
            ("uid", 2),
            ("name", 3),
        ]
        assert [(f.name, f.number) for f in module.NodePrepareResourceResponse.DESCRIPTOR.fields] == [
            ("devices", 1),
            ("error", 2),
        ]
        assert [(f.name, f.number) for f in module.NodeUnprepareResourceResponse.DESCRIPTOR.fields] == [
            ("error", 1)
        ]
    assert [(f.name, f.number) for f in dra_v1.Device.DESCRIPTOR.fields][4:] == [("share_id", 5)]


def test_registration_matches_the_plugin_watcher_contract() -> None:
    file = reg.DESCRIPTOR
    assert file.package == "pluginregistration"  # the kubelet's, without a version
    service = file.services_by_name["Registration"]
    assert [m.name for m in service.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert [(f.name, f.number) for f in reg.PluginInfo.DESCRIPTOR.fields] == [
        ("type", 1),
        ("name", 2),
        ("endpoint", 3),
        ("supported_versions", 4),
    ]
    assert [(f.name, f.number) for f in reg.RegistrationStatus.DESCRIPTOR.fields] == [
        ("plugin_registered", 1),
        ("error", 2),
    ]


def test_dra_messages_encode_to_the_expected_bytes() -> None:
    claim = dra_v1.Claim(namespace="n", uid="u", name="c")
    assert claim.SerializeToString() == b"\x0a\x01n\x12\x01u\x1a\x01c"
    # The same bytes decode as the other version: the kubelet may pick either.
    assert dra_v1beta1.Claim.FromString(claim.SerializeToString()).uid == "u"
    device = dra_v1.Device(pool_name="p", device_name="d", cdi_device_ids=["k/c=x"])
    assert device.SerializeToString() == b"\x12\x01p\x1a\x01d\x22\x05k/c=x"
    assert not device.HasField("share_id")
    info = reg.PluginInfo(type="DRAPlugin", supported_versions=["v1.DRAPlugin"])
    assert info.SerializeToString() == b"\x0a\x09DRAPlugin\x22\x0cv1.DRAPlugin"
