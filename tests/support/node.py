"""Builders shared by the node plugin's tests: the protocol's worked-example node and pods (no tests here)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.contract.names import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_IDS_NEW,
    VGPU_NODE,
    VGPU_TIME,
)
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.plugin import NodePlugin, PluginSettings
from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from kube_vgpu.standins.nvml.api import SimulatedNvml, load_simulation
from tests.support.timeouts import HANG_S

NODE = "gpu-node-1"
UUID_A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
UUID_B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"
V100 = "Tesla V100-PCIE-32GB"
# The worked example's node: two V100 32 GB.
GPUS = (
    GpuInfo(index=0, uuid=UUID_A, name=V100, minor=0, memory_mib=32768),
    GpuInfo(index=1, uuid=UUID_B, name=V100, minor=1, memory_mib=32768),
)
# The worked example's pod (binpack): c1 on A, sidecar without GPU, c2 on A and B.
EXAMPLE_IDS = f"{UUID_A},NVIDIA,3000,30:;{UUID_A},NVIDIA,2048,0:{UUID_B},NVIDIA,2048,0:"
COUNT = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
CORES = "volcano.sh/vgpu-cores"


def container(
    name: str, limits: dict[str, str] | None = None, env: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    """A container dict with the given limits (requests mirror them)."""
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    if limits:
        c["resources"] = {"limits": dict(limits), "requests": dict(limits)}
    if env:
        c["env"] = env
    return c


def example_containers() -> list[dict[str, Any]]:
    """`c1`, `sidecar`, `c2` of the worked example."""
    return [
        container("c1", {COUNT: "1", MEMORY: "3000", CORES: "30"}),
        container("sidecar"),
        container("c2", {COUNT: "2", MEMORY: "2048"}),
    ]


def make_pod(
    name: str,
    containers: list[dict[str, Any]],
    *,
    ids: str | None = None,
    to_allocate: str | None = None,
    node: str = NODE,
    vgpu_time: str = "1786255641",
    bind_time: str | None = None,
    phase: str = "allocating",
    namespace: str = "default",
    uid: str | None = None,
    extra_annotations: dict[str, str] | None = None,
    init_containers: list[dict[str, Any]] | None = None,
    created: str = "2026-08-20T10:00:00Z",
) -> dict[str, Any]:
    """A pod bound to `node` as Volcano leaves it, allocating `ids` (devices-to-allocate defaults to it)."""
    annotations: dict[str, str] = {
        VGPU_NODE: node,
        VGPU_TIME: vgpu_time,
        BIND_TIME: bind_time if bind_time is not None else vgpu_time,
        BIND_PHASE: phase,
    }
    if ids is not None:
        annotations[VGPU_IDS_NEW] = ids
        annotations[DEVICES_TO_ALLOCATE] = ids if to_allocate is None else to_allocate
    annotations.update(extra_annotations or {})
    spec: dict[str, Any] = {"nodeName": node, "schedulerName": "volcano", "containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "annotations": annotations,
            "creationTimestamp": created,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def one_gpu_pod(name: str, uuid: str = UUID_A, mem: int = 1000, cores: int = 10, **kw: Any) -> dict[str, Any]:
    """A one-container pod asking one vGPU of `mem` MiB on `uuid`."""
    return make_pod(
        name,
        [container("main", {COUNT: "1", MEMORY: str(mem), CORES: str(cores)})],
        ids=f"{uuid},NVIDIA,{mem},{cores}:",
        **kw,
    )


# --- a whole node plugin against the stand-ins ---------------------------------------------------------

RESOURCE = "volcano.sh/vgpu-number"


def node_object(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """The Node the plugin runs on, as the kubelet registered it."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"kubernetes.io/hostname": NODE, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
    }


def simulation(count: int = 2, uuids: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A `--simulate` document: `count` V100 32 GB (the worked example's node by default)."""
    gpu: dict[str, Any] = {"model": V100, "memoryMiB": 32768, "count": count}
    gpu["uuids"] = uuids if uuids is not None else [UUID_A, UUID_B][:count]
    return {"gpus": [gpu], **extra}


@dataclass
class Harness:
    """A running node plugin with its kubelet and API server stand-ins."""

    api: ApiServerStandin
    kubelet: KubeletStandin
    plugin: NodePlugin
    nvml: Any
    hook: Path

    @property
    def inventory(self) -> LiveGpus:
        assert self.plugin.inventory is not None
        return self.plugin.inventory

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any]:
        found = self.api.get("Pod", name, namespace)
        assert found is not None
        return found

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.pod(name)["metadata"].get("annotations") or {})

    async def allocate(self, count: int, *, deadline: float = HANG_S) -> pb.AllocateResponse:
        ids = [f"{UUID_A}-{k}" for k in range(count)]
        return await self.kubelet.allocate(RESOURCE, ids, deadline=deadline)


def plugin_settings(
    kubelet_dir: Path,
    tmp: Path,
    *,
    mode: str = "hami-core",
    hami_core: bool = True,
    plugin: Mapping[str, Any] | None = None,
    **node: Any,
) -> PluginSettings:
    """Production settings with short polls, files under `tmp`; with `hami_core`, the hookPath
    (`tmp/hook`) holds HAMi-core's files (stand-ins), as the chart's installer leaves a node.
    `node`: configuration file keys; `plugin`: PluginSettings fields."""
    if hami_core:
        install_placeholder(tmp / "hook")
    node_config = {
        # Generous: an Allocate's API calls on a loaded machine must not meet it (a test that is
        # about the bound passes its own).
        "allocate_timeout_seconds": HANG_S / 2,
        "hook_path": str(tmp / "hook"),
        "recovery_quiet_seconds": 0.5,
        "register_interval_seconds": 30.0,
        **node,
    }
    settings = PluginSettings(
        node_name=NODE,
        mode=mode,
        kubelet_dir=kubelet_dir,
        config=Config(node=NodeConfig(**node_config)),
        lock_dir=str(tmp / "vgpulock"),
        kubelet_poll_seconds=0.1,
        xid_wait_ms=50,
        probe_interval_seconds=0.1,
        watch_timeout_seconds=5,
        metrics_port=0,
        hook_path_poll_seconds=0.1,
    )
    return dataclasses.replace(settings, **(plugin or {}))


@contextlib.asynccontextmanager
async def running_plugin(
    api: ApiServerStandin,
    kubelet_dir: Path,
    tmp: Path,
    *,
    sim: dict[str, Any] | None = None,
    nvml: SimulatedNvml | None = None,
    start_kubelet: bool = True,
    on_register: Callable[[pb.RegisterRequest], None] | None = None,
    hami_core: bool = True,
    **node: Any,
) -> AsyncIterator[Harness]:
    """Start kubelet stand-in and plugin (the Node must exist in `api`); stop both afterwards.

    The plugin runs over `nvml` when given (the caller's: it outlives the plugin, as a GPU outlives a
    plugin restart), else over a fresh simulation of `sim`, shut down afterwards.
    """
    own_nvml = nvml is None
    if nvml is None:
        nvml = load_simulation(sim or simulation(), NODE)
        nvml.nvmlInit()
    kube = Kube(api.api_client(), component="node")
    kubelet = KubeletStandin(kubelet_dir, on_register=on_register)
    plugin = NodePlugin(plugin_settings(kubelet_dir, tmp, hami_core=hami_core, **node), nvml, kube)
    try:
        if start_kubelet:
            await kubelet.start()
        await plugin.start()
        if start_kubelet:
            async with asyncio.timeout(HANG_S):
                await kubelet.wait_registered(RESOURCE)
        yield Harness(api, kubelet, plugin, nvml, tmp / "hook")
    finally:
        await plugin.stop()
        await kubelet.stop()
        kube.close()
        if own_nvml:
            nvml.nvmlShutdown()


async def eventually(condition: Callable[[], bool], *, within: float = HANG_S, step: float = 0.05) -> None:
    """Wait until `condition()` holds (a bound, not a timing assertion: it fails only when it never does)."""
    async with asyncio.timeout(within):
        while not condition():  # noqa: ASYNC110 - polls stand-in state that has no event to await
            await asyncio.sleep(step)


@contextlib.contextmanager
def short_tempdir() -> Iterator[Path]:
    """A fresh folder with a short path: unix socket paths are limited to 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="kv-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    """A TCP port free right now, for a config file's metricsPort (which must be 1..65535)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
