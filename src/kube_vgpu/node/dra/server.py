"""The DRA kubelet plugin's sockets: the registration socket the kubelet's plugin watcher finds and the
DRA socket it then calls NodePrepareResources / NodeUnprepareResources on. `serve_dra` starts both; the
node CLI calls it for `--api dra`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from grpc import aio

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.deviceplugin.server import SocketIdentity, remove_stale_socket, socket_identity
from kube_vgpu.node.dra.cdi import CLAIM_KIND, DEFAULT_GPU_KIND, GpuDevices, SpecDir
from kube_vgpu.node.dra.checkpoint import CheckpointFile
from kube_vgpu.node.dra.limits import Card
from kube_vgpu.node.dra.prepare import Fault, Preparer, add_to_server, no_fault
from kube_vgpu.node.dra.registration import Registration
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.proto import pluginregistration_v1_pb2_grpc as reg_grpc

log = logging.getLogger("kube_vgpu.node.dra")

DRIVER_NAME: Final = "vgpu.kube-vgpu.io"
# Every default path of the DRA plugin, in one place.
DEFAULT_KUBELET_ROOT_DIR: Final = "/var/lib/kubelet"
DEFAULT_CDI_DIR: Final = "/var/run/cdi"
# The CDI folders a runtime reads by default (tags.cncf.io/container-device-interface DefaultSpecDirs):
# `nvidia-ctk cdi generate` writes to /etc/cdi unless told otherwise, the GPU Operator to /var/run/cdi.
DEFAULT_GPU_CDI_DIRS: Final = ("/etc/cdi", "/var/run/cdi")


def registration_socket(kubelet_root_dir: str | Path, driver: str = DRIVER_NAME) -> Path:
    """`<root>/plugins_registry/<driver>-reg.sock`, where the kubeletplugin helper puts it."""
    return Path(kubelet_root_dir) / "plugins_registry" / f"{driver}-reg.sock"


def plugin_dir(kubelet_root_dir: str | Path, driver: str = DRIVER_NAME) -> Path:
    """`<root>/plugins/<driver>/`: the DRA socket and the checkpoint."""
    return Path(kubelet_root_dir) / "plugins" / driver


def dra_socket(kubelet_root_dir: str | Path, driver: str = DRIVER_NAME) -> Path:
    """`<root>/plugins/<driver>/dra.sock`."""
    return plugin_dir(kubelet_root_dir, driver) / "dra.sock"


@dataclass
class DraServer:
    """Both sockets, served until `stop`."""

    preparer: Preparer
    registration: Registration
    registration_path: Path
    dra_path: Path
    _servers: tuple[aio.Server, ...] = ()
    _bound: dict[Path, SocketIdentity | None] = field(default_factory=dict)

    async def start(self) -> None:
        """Serve the DRA socket first, then the registration socket (the kubelet dials the endpoint as
        soon as it sees the registration)."""
        dra = aio.server()
        add_to_server(self.preparer, dra)
        reg = aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self.registration, reg)
        try:
            for server, path in ((dra, self.dra_path), (reg, self.registration_path)):
                path.parent.mkdir(parents=True, exist_ok=True)
                remove_stale_socket(path)
                server.add_insecure_port(f"unix:{path}")
                await server.start()
                self._servers += (server,)
                self._bound[path] = socket_identity(path)
                log.info("event=dra_serving socket=%s", path)
        except BaseException:
            await self.stop(0)
            raise

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving and remove our sockets (the kubelet deregisters the plugin)."""
        for server in reversed(self._servers):
            await server.stop(grace)
        self._servers = ()
        # Only the sockets we bound: the path may be someone else's by now.
        for path, identity in self._bound.items():
            if identity is not None and socket_identity(path) == identity:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._bound.clear()


def inventory_cards(inventory: Inventory) -> Callable[[], dict[str, Card]]:
    """The node's GPUs as devices of the pool, named as the published slice names them
    (`GpuFacts.device_name`, `gpu-<minor>`), each with why it cannot be used now: an XID, or the
    node-wide hold while HAMi-core is missing (prepare then refuses, as Allocate does)."""

    def cards() -> dict[str, Card]:
        out = {}
        for gpu in inventory.gpus:
            name = f"gpu-{gpu.minor}"
            out[name] = Card(name, gpu.uuid, gpu.index, gpu.memory_mib, inventory.reason(gpu.uuid))
        return out

    return cards


def kube_claim_reader(kube: Kube) -> Callable[[str, str], Any]:
    """Read a ResourceClaim through the product's client, off the event loop."""

    async def read(namespace: str, name: str) -> Mapping[str, Any] | None:
        return await asyncio.to_thread(kube.get, "resourceclaim", name, namespace=namespace)

    return read


async def serve_dra(
    *,
    node_name: str,
    kube: Kube,
    cards: Callable[[], Mapping[str, Card]],
    hook_path: str,
    lock_dir: str,
    kubelet_root_dir: str | Path = DEFAULT_KUBELET_ROOT_DIR,
    cdi_dir: str | Path = DEFAULT_CDI_DIR,
    gpu_cdi_kind: str = DEFAULT_GPU_KIND,
    gpu_cdi_dirs: Sequence[str | Path] = DEFAULT_GPU_CDI_DIRS,
    claim_cdi_kind: str = CLAIM_KIND,
    driver: str = DRIVER_NAME,
    fault: Fault = no_fault,
) -> DraServer:
    """Load the checkpoint (CheckpointError when it cannot be used), then serve both sockets.

    The pool is the node's name; `cards` gives the node's GPUs as devices of the pool, with their
    health, at each prepare. kube-vgpu's claim specs go to `cdi_dir`; the GPUs' own devices are looked
    up in the specs of `gpu_cdi_kind` in `gpu_cdi_dirs`.
    """
    folder = plugin_dir(kubelet_root_dir, driver)
    preparer = Preparer(
        driver=driver,
        pool=node_name,
        cards=cards,
        read_claim=kube_claim_reader(kube),
        specs=SpecDir(Path(cdi_dir), claim_cdi_kind),
        gpu_devices=GpuDevices([Path(d) for d in gpu_cdi_dirs], gpu_cdi_kind),
        checkpoint_file=CheckpointFile(folder),
        hook_path=hook_path,
        lock_dir=lock_dir,
        fault=fault,
    )
    preparer.load()
    dra_path = dra_socket(kubelet_root_dir, driver)
    server = DraServer(
        preparer,
        Registration(driver, str(dra_path)),
        registration_socket(kubelet_root_dir, driver),
        dra_path,
    )
    await server.start()
    return server
