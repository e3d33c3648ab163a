"""A stand-in for the kubelet's device manager, speaking deviceplugin v1beta1 over unix sockets.

It serves Registration on `<dir>/kubelet.sock`, records every registration, dials each plugin back,
asks its options and keeps a ListAndWatch stream open (recording every device list, refusing lists over
the kubelet's 4 MiB gRPC limit as the real one does), and calls Allocate as the kubelet would. `restart()`
removes every socket in the folder and recreates `kubelet.sock` at the same path, like a restarted kubelet.
Built from `proto/` only; async API for tests, benchmarks and the local demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.proto import deviceplugin_v1beta1_pb2_grpc as pb_grpc

log = logging.getLogger("kube_vgpu.standins.kubelet")

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
# The kubelet's gRPC receive limit: a larger ListAndWatch message is dropped.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class DeviceState:
    """One device as the kubelet last heard of it."""

    id: str
    health: str


@dataclass
class PluginEndpoint:
    """One registered plugin: its channel, its stream and everything it sent."""

    resource: str
    endpoint: str
    options: pb.DevicePluginOptions | None = None
    lists: list[list[DeviceState]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    # Why the stream ended (None while open): a refused oversized list, the plugin going away, ...
    ended: str | None = None
    channel: aio.Channel | None = None
    task: asyncio.Task[None] | None = None

    @property
    def devices(self) -> list[DeviceState]:
        """The last device list received (empty before the first)."""
        return self.lists[-1] if self.lists else []

    @property
    def healthy(self) -> int:
        """How many devices the kubelet would count as allocatable now (0 once the stream ended)."""
        return 0 if self.ended else sum(d.health == "Healthy" for d in self.devices)


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandin) -> None:
        self._kubelet = kubelet

    async def Register(
        self, request: pb.RegisterRequest, context: aio.ServicerContext[pb.RegisterRequest, pb.Empty]
    ) -> pb.Empty:
        problem = self._kubelet.accept(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        return pb.Empty()


class KubeletStandin:
    """The device-manager part of a kubelet, over real unix sockets in `directory`."""

    def __init__(
        self,
        directory: str | Path,
        *,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        on_register: Callable[[pb.RegisterRequest], None] | None = None,
    ) -> None:
        """`on_register` is called with each accepted registration before Register answers."""
        self.directory = Path(directory)
        self.on_register = on_register
        self.socket_path = self.directory / KUBELET_SOCKET
        self.max_message_bytes = max_message_bytes
        self.registrations: list[pb.RegisterRequest] = []
        self.plugins: dict[str, PluginEndpoint] = {}
        self.restarts = 0
        self._server: aio.Server | None = None
        self._changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Serve Registration on `kubelet.sock` (the folder is created if needed)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        server = aio.server()
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving, close every plugin connection and remove `kubelet.sock`."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(0)
        for plugin in list(self.plugins.values()):
            await self._disconnect(plugin, "kubelet stopped")
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def restart(self) -> None:
        """What a kubelet restart does to the folder: every socket removed, `kubelet.sock` recreated."""
        await self.stop()
        for entry in self.directory.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
        self.plugins.clear()
        self.restarts += 1
        await self.start()
        self._notify()

    async def __aenter__(self) -> KubeletStandin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # registration and streams ------------------------------------------------------------------

    def accept(self, request: pb.RegisterRequest) -> str | None:
        if request.version != API_VERSION:
            return f"Unsupported version {request.version!r}: expected {API_VERSION}"
        if "/" not in request.resource_name or os.sep in request.endpoint:
            return f"invalid resource name {request.resource_name!r} or endpoint {request.endpoint!r}"
        self.registrations.append(request)
        if self.on_register is not None:
            self.on_register(request)
        previous = self.plugins.get(request.resource_name)
        plugin = PluginEndpoint(request.resource_name, request.endpoint)
        self.plugins[request.resource_name] = plugin
        # Like the kubelet: answer Register at once, dial the plugin back in the background.
        self._spawn(self._connect(plugin, previous))
        self._notify()
        return None

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, plugin: PluginEndpoint, previous: PluginEndpoint | None) -> None:
        if previous is not None:
            await self._disconnect(previous, "replaced by a new registration")
        channel = aio.insecure_channel(
            f"unix:{self.directory / plugin.endpoint}",
            options=[("grpc.max_receive_message_length", self.max_message_bytes)],
        )
        plugin.channel = channel
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            plugin.options = await stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
            async for message in stub.ListAndWatch(pb.Empty()):
                plugin.sizes.append(message.ByteSize())
                plugin.lists.append([DeviceState(d.ID, d.health) for d in message.devices])
                self._notify()
            plugin.ended = "stream closed by the plugin"
        except aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                plugin.ended = f"device list refused: over {self.max_message_bytes} bytes ({exc.details()})"
            else:
                plugin.ended = f"stream failed: {exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            plugin.ended = plugin.ended or "kubelet stopped"
            raise
        finally:
            self._notify()

    async def _disconnect(self, plugin: PluginEndpoint, why: str) -> None:
        plugin.ended = plugin.ended or why
        if plugin.channel is not None:
            await plugin.channel.close(None)
            plugin.channel = None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # queries for tests, benchmarks and the demo -------------------------------------------------------

    async def wait_for(self, condition: Callable[[], bool], *, within: float = 30.0) -> None:
        """Wait until `condition()` holds, re-checked after every registration, device list or stream end.

        Raises TimeoutError after `within` seconds, so a test that waits for something that never
        happens fails inside its own event loop and its clean-up still runs.
        """
        async with asyncio.timeout(within):
            while not condition():
                await self._changed.wait()

    async def wait_registered(self, resource: str, count: int = 1) -> PluginEndpoint:
        """Wait for the `count`-th registration of `resource` and its first device list (or stream end)."""

        def ready() -> bool:
            plugin = self.plugins.get(resource)
            done = sum(r.resource_name == resource for r in self.registrations) >= count
            return done and plugin is not None and (bool(plugin.lists) or plugin.ended is not None)

        await self.wait_for(ready)
        return self.plugins[resource]

    async def wait_devices(
        self, resource: str, condition: Callable[[list[DeviceState]], bool]
    ) -> list[DeviceState]:
        """Wait until the last device list of `resource` satisfies `condition`; returns it."""
        await self.wait_for(lambda: resource in self.plugins and condition(self.plugins[resource].devices))
        return self.plugins[resource].devices

    async def allocate(
        self, resource: str, device_ids: Sequence[str], *, deadline: float | None = None
    ) -> pb.AllocateResponse:
        """Allocate as the kubelet does for one container; raises grpc.aio.AioRpcError on refusal.

        The real kubelet sets no deadline; `deadline` (seconds) is for callers that want one.
        """
        plugin = self.plugins.get(resource)
        if plugin is None or plugin.channel is None:
            raise LookupError(f"no plugin registered for {resource}")
        stub = pb_grpc.DevicePluginStub(plugin.channel)
        request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=device_ids)])
        return await stub.Allocate(request, timeout=deadline)
