"""The kubelet stand-in admits pods in the real kubelet's order
(pkg/kubelet/kubelet.go, `HandlePodAdditions`): one update per bind event, in bind order; the pods of
one update by creation time, ties in no promised order; init containers first, one Allocate each."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.kubelet.admission import KubeletAdmission
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from tests.support.node import short_tempdir
from tests.support.timeouts import HANG_S

RESOURCE = "example.com/gpu"
NODE = "n1"


class RecordingPlugin(pb_grpc.DevicePluginServicer):
    """A device plugin that answers every Allocate and records the device IDs asked."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions()

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> Any:
        yield pb.ListAndWatchResponse(devices=[pb.Device(ID=f"d{i}", health="Healthy") for i in range(8)])
        await asyncio.Event().wait()

    async def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        ids = list(request.container_requests[0].devices_ids)
        self.calls.append(ids)
        return pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse(envs={"CALL": str(len(self.calls))})]
        )

    # Not offered (GetDevicePluginOptions answers all false); the kubelet never calls them.
    async def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        return pb.PreferredAllocationResponse()

    async def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


@pytest.fixture
async def kubelet(apiserver: ApiServerStandin) -> AsyncIterator[tuple[KubeletStandin, RecordingPlugin]]:
    from grpc import aio

    with short_tempdir() as folder:
        kubelet = KubeletStandin(folder)
        await kubelet.start()
        plugin = RecordingPlugin()
        server = aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(plugin, server)
        server.add_insecure_port(f"unix:{Path(folder) / 'p.sock'}")
        await server.start()
        stub = pb_grpc.RegistrationStub(aio.insecure_channel(f"unix:{kubelet.socket_path}"))
        await stub.Register(pb.RegisterRequest(version="v1beta1", endpoint="p.sock", resource_name=RESOURCE))
        await kubelet.wait_devices(RESOURCE, lambda d: len(d) == 8)
        try:
            yield kubelet, plugin
        finally:
            await kubelet.stop()
            await server.stop(0)


def create(
    api: ApiServerStandin, name: str, second: int, *, gpus: Sequence[int] = (1,), init: int = 0
) -> None:
    api.ops.clock = lambda: datetime(2026, 8, 20, 10, 0, second, tzinfo=UTC)
    spec: dict[str, Any] = {
        "containers": [
            {"name": f"c{i}", "image": "x", "resources": {"limits": {RESOURCE: str(n)}}}
            for i, n in enumerate(gpus)
        ]
    }
    if init:
        spec["initContainers"] = [
            {"name": "init", "image": "x", "resources": {"limits": {RESOURCE: str(init)}}}
        ]
    api.put(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}
    )


def bind(api: ApiServerStandin, name: str) -> None:
    api.ops.bind("default", name, {"target": {"kind": "Node", "name": NODE}})


async def test_pods_are_admitted_in_bind_order_one_update_each(
    apiserver: ApiServerStandin, kubelet: tuple[KubeletStandin, RecordingPlugin]
) -> None:
    stand_in, _ = kubelet
    admission = KubeletAdmission(stand_in, apiserver, NODE, RESOURCE)
    await admission.start()
    try:
        for name, second in (("a", 3), ("b", 1), ("c", 2)):
            create(apiserver, name, second)
        for name in ("c", "a", "b"):  # neither by name nor by creation
            bind(apiserver, name)
        await admission.wait_admitted("default", "b")
        assert [a.name for a in admission.admitted] == ["c", "a", "b"]
    finally:
        await admission.stop()


async def test_one_update_goes_in_creation_order_and_init_containers_come_first(
    apiserver: ApiServerStandin, kubelet: tuple[KubeletStandin, RecordingPlugin]
) -> None:
    stand_in, plugin = kubelet
    admission = KubeletAdmission(stand_in, apiserver, NODE, RESOURCE)
    await admission.start()
    try:
        admission.pause()
        create(apiserver, "late", 9, gpus=(1,))
        create(apiserver, "early", 1, gpus=(2, 0, 1), init=1)
        bind(apiserver, "late")
        bind(apiserver, "early")
        await admission.resume()
        await admission.wait_admitted("default", "late")
        assert [a.name for a in admission.admitted] == ["early", "late"]
        early = admission.admitted[0]
        # One Allocate per container naming the resource (c1 asks 0: none), init first, as many IDs.
        assert [(c.container, c.init, len(c.device_ids)) for c in early.containers] == [
            ("init", True, 1),
            ("c0", False, 2),
            ("c2", False, 1),
        ]
        assert [len(ids) for ids in plugin.calls] == [1, 2, 1, 1]
    finally:
        await admission.stop()


async def test_pods_already_bound_at_start_form_one_update_and_ties_have_no_promised_order(
    apiserver: ApiServerStandin, kubelet: tuple[KubeletStandin, RecordingPlugin]
) -> None:
    stand_in, _ = kubelet
    for name in ("p", "q", "r", "s"):
        create(apiserver, name, 5)  # all in one second
        bind(apiserver, name)
    orders = set()
    for seed in range(6):
        admission = KubeletAdmission(stand_in, apiserver, NODE, RESOURCE, seed=seed)
        await admission.start()
        try:
            await admission.wait_admitted("default", "p")
            async with asyncio.timeout(HANG_S):
                await _all(admission, 4)
            orders.add(tuple(a.name for a in admission.admitted))
        finally:
            await admission.stop()
    assert len(orders) > 1  # no order is promised, so a plugin must not rely on one


async def _all(admission: KubeletAdmission, count: int) -> None:
    while len(admission.admitted) < count:  # noqa: ASYNC110 - bounded by the caller's wait_for
        await asyncio.sleep(0.01)
