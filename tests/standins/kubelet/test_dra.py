"""The kubelet stand-in's DRA side behaves as the kubelet does: service choice, registration refusals,
the DRA manager's checks of a plugin's answers, and CDI edits resolved as a runtime resolves them."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from kube_vgpu.proto import dra_v1_pb2 as v1
from kube_vgpu.proto import dra_v1_pb2_grpc as v1_grpc
from kube_vgpu.proto import pluginregistration_v1_pb2 as reg
from kube_vgpu.proto import pluginregistration_v1_pb2_grpc as reg_grpc
from kube_vgpu.standins.kubelet.dra import (
    ClaimId,
    DraError,
    DraKubelet,
    PreparedDevice,
    cdi_ids_for,
    choose_service,
    resolve,
)
from tests.support.node import short_tempdir


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tempdir() as path:
        yield path


def test_the_first_of_the_plugins_services_the_kubelet_knows_is_chosen() -> None:
    assert choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1.DRAPlugin"
    assert choose_service(["v1beta1.DRAPlugin", "v1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert choose_service(["v2.DRAPlugin", "v1beta1.DRAPlugin"]) == "v1beta1.DRAPlugin"
    assert (
        choose_service(["v1.DRAPlugin", "v1beta1.DRAPlugin"], ("v1beta1.DRAPlugin",)) == "v1beta1.DRAPlugin"
    )
    with pytest.raises(DraError, match=r"none of services supported by the plugin \(\['v1alpha4.Node'\]\)"):
        choose_service(["v1alpha4.Node"])
    with pytest.raises(DraError, match="empty list of supported gRPC services"):
        choose_service([])


class FakePlugin(reg_grpc.RegistrationServicer, v1_grpc.DRAPluginServicer):
    """A plugin that answers whatever the test sets."""

    def __init__(
        self, endpoint: str, *, kind: str = "DRAPlugin", versions: tuple[str, ...] = ("v1.DRAPlugin",)
    ):
        self.endpoint, self.kind, self.versions = endpoint, kind, versions
        self.prepared: v1.NodePrepareResourcesResponse = v1.NodePrepareResourcesResponse()
        self.unprepared: v1.NodeUnprepareResourcesResponse = v1.NodeUnprepareResourcesResponse()
        self.status: list[tuple[bool, str]] = []

    async def GetInfo(self, request: reg.InfoRequest, context: Any) -> reg.PluginInfo:
        return reg.PluginInfo(
            type=self.kind, name="x.example.com", endpoint=self.endpoint, supported_versions=self.versions
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: Any
    ) -> reg.RegistrationStatusResponse:
        self.status.append((request.plugin_registered, request.error))
        return reg.RegistrationStatusResponse()

    async def NodePrepareResources(
        self, request: v1.NodePrepareResourcesRequest, context: Any
    ) -> v1.NodePrepareResourcesResponse:
        return self.prepared

    async def NodeUnprepareResources(
        self, request: v1.NodeUnprepareResourcesRequest, context: Any
    ) -> v1.NodeUnprepareResourcesResponse:
        return self.unprepared


@asynccontextmanager
async def fake_plugin(root: Path, **kw: Any) -> AsyncIterator[FakePlugin]:
    (root / "plugins_registry").mkdir(exist_ok=True)
    endpoint = root / "dra.sock"
    plugin = FakePlugin(str(endpoint), **kw)
    server = aio.server()
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    v1_grpc.add_DRAPluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{root / 'plugins_registry' / 'x-reg.sock'}")
    server.add_insecure_port(f"unix:{endpoint}")
    await server.start()
    try:
        yield plugin
    finally:
        await server.stop(0)


async def test_a_plugin_of_another_type_is_refused_and_told(root: Path) -> None:
    async with fake_plugin(root, kind="CSIPlugin") as plugin:
        kubelet = DraKubelet(root)
        assert await kubelet.register_all() == []
        assert plugin.status == [(False, "no handler registered for plugin type: CSIPlugin")]


async def test_a_plugin_with_no_known_service_is_refused_and_told(root: Path) -> None:
    async with fake_plugin(root, versions=("v9.DRAPlugin",)) as plugin:
        assert await DraKubelet(root).register_all() == []
        ((registered, error),) = plugin.status
        assert not registered and "none of services supported by the plugin" in error


async def test_hidden_files_and_non_sockets_are_skipped(root: Path) -> None:
    registry = root / "plugins_registry"
    registry.mkdir()
    (registry / "notes.txt").write_text("x")
    hidden = socket.socket(socket.AF_UNIX)
    hidden.bind(str(registry / ".hidden.sock"))
    try:
        assert await DraKubelet(root).register_all() == []
    finally:
        hidden.close()


CLAIMS = [ClaimId("ns", "a", "uid-a"), ClaimId("ns", "b", "uid-b")]


async def test_the_dra_managers_checks_of_a_prepare_answer(root: Path) -> None:
    async with fake_plugin(root) as plugin:
        kubelet = DraKubelet(root)
        await kubelet.register_all()
        try:
            plugin.prepared = v1.NodePrepareResourcesResponse()
            plugin.prepared.claims["uid-a"].devices.add(
                pool_name="p", device_name="d", cdi_device_ids=["k/c=x"]
            )
            with pytest.raises(DraError, match="NodePrepareResources skipped 1 ResourceClaims"):
                await kubelet.prepare("x.example.com", CLAIMS)
            plugin.prepared.claims["uid-z"].error = ""
            with pytest.raises(DraError, match="returned result for unknown claim UID uid-z"):
                await kubelet.prepare("x.example.com", CLAIMS[:1])
            plugin.prepared = v1.NodePrepareResourcesResponse()
            plugin.prepared.claims["uid-a"].error = "boom"
            with pytest.raises(DraError, match="NodePrepareResources failed for ResourceClaim a: boom"):
                await kubelet.prepare("x.example.com", CLAIMS[:1])
            plugin.unprepared = v1.NodeUnprepareResourcesResponse()
            plugin.unprepared.claims["uid-a"].error = ""
            with pytest.raises(DraError, match="NodeUnprepareResources skipped 1 ResourceClaims"):
                await kubelet.unprepare("x.example.com", CLAIMS)
            await kubelet.unprepare("x.example.com", CLAIMS[:1])
            with pytest.raises(DraError, match=r"DRA driver y\.example\.com is not registered"):
                await kubelet.prepare("y.example.com", CLAIMS)
        finally:
            await kubelet.close()


def test_a_device_without_request_names_serves_every_request() -> None:
    devices = [PreparedDevice((), "p", "d0", ("k/c=all",)), PreparedDevice(("a",), "p", "d1", ("k/c=a",))]
    assert cdi_ids_for(devices, "a") == ["k/c=all", "k/c=a"]
    assert cdi_ids_for(devices, "b") == ["k/c=all"]


def spec(kind: str, devices: dict[str, dict[str, Any]], **edits: Any) -> str:
    document: dict[str, Any] = {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [{"name": n, "containerEdits": e} for n, e in devices.items()],
    }
    if edits:
        document["containerEdits"] = edits
    return json.dumps(document)


def test_cdi_edits_merge_as_a_runtime_applies_them(tmp_path: Path) -> None:
    (tmp_path / "gpu.json").write_text(
        spec(
            "nvidia.com/gpu",
            {
                "0": {"deviceNodes": [{"path": "/dev/nvidia0"}], "env": ["A=gpu0", "C=0"]},
                "1": {"deviceNodes": [{"path": "/dev/nvidia1"}]},
            },
            deviceNodes=[{"path": "/dev/nvidiactl"}],
            mounts=[{"hostPath": "/h/lib", "containerPath": "/usr/lib/x/libcuda.so"}],
        )
    )
    (tmp_path / "limits.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: vgpu.kube-vgpu.io/claim\ndevices:\n- name: c\n  containerEdits:\n"
        "    env: [A=limits, B=1]\n    mounts: [{hostPath: /h/other, containerPath: /usr/lib/x/libcuda.so},"
        " {hostPath: /h/tmp, containerPath: /tmp}]\n"
    )
    config = resolve([tmp_path], ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "vgpu.kube-vgpu.io/claim=c"])
    # The spec's own edits once although two of its devices are used; device nodes by path.
    assert [n["path"] for n in config.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]
    # A later device's variable replaces one of the same name where it stands.
    assert config.env == ["A=limits", "C=0", "B=1"]
    # A mount at the same container path replaces the earlier one; mounts sorted by depth.
    assert [(m["containerPath"], m["hostPath"]) for m in config.mounts] == [
        ("/tmp", "/h/tmp"),
        ("/usr/lib/x/libcuda.so", "/h/other"),
    ]


def test_unresolvable_conflicting_and_overridden_devices(tmp_path: Path) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "a.json").write_text(spec("k.io/c", {"x": {"env": ["W=etc"]}, "y": {"env": ["Y=1"]}}))
    (run / "b.json").write_text(spec("k.io/c", {"x": {"env": ["W=run"]}}))
    (run / "c.json").write_text(spec("k.io/c", {"y": {"env": ["Y=2"]}}))
    (run / "d.json").write_text(spec("k.io/c", {"y": {"env": ["Y=3"]}}))
    (run / "broken.json").write_text("{")
    # A later folder wins; two specs of one folder defining a device leave it unresolvable.
    assert resolve([etc, run], ["k.io/c=x"]).env == ["W=run"]
    with pytest.raises(DraError, match=r"unresolvable CDI devices k.io/c=y, k.io/c=z"):
        resolve([etc, run], ["k.io/c=y", "k.io/c=z"])
