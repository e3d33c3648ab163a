"""The kubelet-facing edge: the `vgpu-number` device plugin served over gRPC on a unix socket.

Serves DevicePlugin (full device lists on ListAndWatch, Allocate delegated to the allocator), registers
with the kubelet's Registration service, and notices a kubelet restart by the identity of its socket.
Only this module and `standins.kubelet` speak gRPC.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc import aio

from kube_vgpu.node.deviceplugin.hamicore import ContainerResponse
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger("kube_vgpu.node.deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class AllocateFailed(Exception):
    """An Allocate that must fail; `code` is the gRPC status the kubelet receives with the message."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.FAILED_PRECONDITION) -> None:
        super().__init__(message)
        self.code = code


AllocateFn = Callable[[Sequence[str]], Awaitable[ContainerResponse]]


def socket_name(resource_name: str) -> str:
    """The plugin's socket file name for a resource, e.g. `kube-vgpu-vgpu-number.sock`."""
    return f"kube-vgpu-{resource_name.rsplit('/', 1)[-1]}.sock"


def to_proto(response: ContainerResponse) -> pb.ContainerAllocateResponse:
    """The wire form of one container's response."""
    return pb.ContainerAllocateResponse(
        envs=response.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in response.mounts
        ],
    )


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """DevicePlugin for `vgpu-number`: the inventory's device list and the allocator's answers."""

    def __init__(self, inventory: LiveGpus, allocate: AllocateFn) -> None:
        self._inventory = inventory
        self._allocate = allocate

    async def GetDevicePluginOptions(
        self, request: pb.Empty, context: aio.ServicerContext[pb.Empty, pb.DevicePluginOptions]
    ) -> pb.DevicePluginOptions:
        """No PreStartContainer, no preferred allocation: the kubelet's choice of IDs does not matter."""
        return pb.DevicePluginOptions()

    async def ListAndWatch(
        self, request: pb.Empty, context: aio.ServicerContext[pb.Empty, pb.ListAndWatchResponse]
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        """The full device list now, and again after every health change, until the plugin stops."""
        version: int | None = self._inventory.version
        while version is not None:
            devices = self._inventory.devices()
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=d.id, health=d.health) for d in devices])
            version = await self._inventory.wait_newer(version)

    async def GetPreferredAllocation(
        self,
        request: pb.PreferredAllocationRequest,
        context: aio.ServicerContext[pb.PreferredAllocationRequest, pb.PreferredAllocationResponse],
    ) -> pb.PreferredAllocationResponse:
        """Not offered (see GetDevicePluginOptions); answers empty if asked anyway."""
        return pb.PreferredAllocationResponse()

    async def Allocate(
        self,
        request: pb.AllocateRequest,
        context: aio.ServicerContext[pb.AllocateRequest, pb.AllocateResponse],
    ) -> pb.AllocateResponse:
        """One container per call, as the kubelet sends; anything the allocator refuses fails the call."""
        if len(request.container_requests) != 1:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"expected one container request per Allocate, got {len(request.container_requests)}",
            )
        try:
            response = await self._allocate(list(request.container_requests[0].devices_ids))
        except AllocateFailed as exc:
            await context.abort(exc.code, str(exc))
        return pb.AllocateResponse(container_responses=[to_proto(response)])

    async def PreStartContainer(
        self,
        request: pb.PreStartContainerRequest,
        context: aio.ServicerContext[pb.PreStartContainerRequest, pb.PreStartContainerResponse],
    ) -> pb.PreStartContainerResponse:
        """Not required (see GetDevicePluginOptions)."""
        return pb.PreStartContainerResponse()


@dataclass(frozen=True)
class SocketIdentity:
    """What tells one socket file from its replacement: a recreated socket may reuse the inode."""

    device: int
    inode: int
    ctime_ns: int
    mtime_ns: int


def socket_identity(path: str | Path) -> SocketIdentity | None:
    """The identity of the socket at `path`, or None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return SocketIdentity(st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns)


def remove_stale_socket(path: str | Path) -> None:
    """Remove what a previous run left at our socket path (refusing to delete a non-socket)."""
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode):
            raise RuntimeError(f"{path} exists and is not a socket; refusing to remove it")
        os.unlink(path)
        log.info("event=stale_socket_removed path=%s", path)


class PluginServer:
    """One gRPC server on the plugin's socket; a new one is started after every kubelet restart."""

    def __init__(self, path: Path, service: DevicePluginService) -> None:
        self.path = path
        self._service = service
        self._server: aio.Server | None = None
        self.identity: SocketIdentity | None = None

    async def start(self) -> None:
        """Bind the socket (removing a stale one first) and serve."""
        remove_stale_socket(self.path)
        server = aio.server()
        pb_grpc.add_DevicePluginServicer_to_server(self._service, server)
        server.add_insecure_port(f"unix:{self.path}")
        await server.start()
        self._server = server
        self.identity = socket_identity(self.path)
        log.info("event=plugin_serving socket=%s", self.path)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving; open streams are cancelled after `grace` seconds."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(grace)
            # Only our own socket: after a kubelet restart the path may already be someone else's.
            if self.identity is not None and socket_identity(self.path) == self.identity:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
            self.identity = None

    @property
    def intact(self) -> bool:
        """Whether our socket file is still the one we bound (a kubelet restart removes it)."""
        return self.identity is not None and socket_identity(self.path) == self.identity


async def register(kubelet_socket: Path, endpoint: str, resource_name: str, *, deadline: float) -> None:
    """Register with the kubelet (Registration.Register, v1beta1) within `deadline` seconds.

    Raises grpc.aio.AioRpcError when the kubelet refuses or does not answer.
    """
    async with aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
        stub = pb_grpc.RegistrationStub(channel)
        await stub.Register(
            pb.RegisterRequest(
                version=API_VERSION,
                endpoint=endpoint,
                resource_name=resource_name,
                options=pb.DevicePluginOptions(),
            ),
            timeout=deadline,
            wait_for_ready=False,
        )
