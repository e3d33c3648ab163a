"""Builders shared by the node plugin's tests: the protocol's worked-example node and pods (no tests here)."""

from __future__ import annotations

from typing import Any

from contract.names import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    VGPU_IDS_NEW,
    VGPU_NODE,
    VGPU_TIME,
)
from node.gpus import GpuInfo

NODE = "gpu-node-1"
UUID_A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
UUID_B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"
V100 = "Tesla V100-PCIE-32GB"
# The node of protocol §2.2: two V100 32 GB.
GPUS = (
    GpuInfo(index=0, uuid=UUID_A, name=V100, minor=0, memory_mib=32768),
    GpuInfo(index=1, uuid=UUID_B, name=V100, minor=1, memory_mib=32768),
)
# The pod of protocol §4.3 (binpack): c1 on A, sidecar without GPU, c2 on A and B.
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
    """`c1`, `sidecar`, `c2` of protocol §4.3."""
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
