"""Builders shared by the MIG tests: simulated MIG GPUs, MIG pods as Volcano leaves them (no tests here)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.geometry import DeviceConfig, choose_slot, geometry_for_type
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.models import register_type
from kube_vgpu.node.deviceplugin.selection import Claim, select
from kube_vgpu.node.mig.manager import MigManager
from kube_vgpu.node.nvml.gpus import GpuInfo, discover
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.nvml.api import SimulatedNvml, load_simulation
from kube_vgpu.standins.nvml.events import FakeClock
from kube_vgpu.standins.volcano.fit import mig_device_id
from tests.support.node import COUNT, MEMORY, NODE, Harness, container, make_pod, running_plugin

A100_40 = "NVIDIA A100-SXM4-40GB"
GPU_0 = "GPU-5a1e0000-aaaa-4bbb-8ccc-000000000000"
GPU_1 = "GPU-5a1e0001-aaaa-4bbb-8ccc-000000000001"


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def mig_sim(count: int = 1, model: str = A100_40, *, mig_enabled: bool = True, **flags: Any) -> SimulatedNvml:
    """An initialised simulated NVML with `count` MIG-capable GPUs of `model`."""
    gpu: dict[str, Any] = {
        "model": model,
        "count": count,
        "migCapable": True,
        "migEnabled": mig_enabled,
        "uuids": [GPU_0, GPU_1][:count],
        **flags,
    }
    nvml = load_simulation({"gpus": [gpu]}, NODE, clock=FakeClock())
    nvml.nvmlInit()
    return nvml


def manager(
    nvml: SimulatedNvml,
    *,
    geometry: DeviceConfig | None = None,
    grace: float = 60.0,
    clock: ManualClock | None = None,
) -> tuple[MigManager, list[GpuInfo]]:
    """A MigManager over every GPU of `nvml`."""
    gpus = discover(nvml)
    return (
        MigManager(
            nvml,
            gpus,
            geometry or default_device_config(),
            node_name=NODE,
            grace_seconds=grace,
            clock=clock or ManualClock(),
        ),
        gpus,
    )


def scheduler_slot(gpu: GpuInfo, used: dict[str, set[int]], request_mib: int) -> str:
    """The device ID Volcano writes for `request_mib` on `gpu` given the slots in use
    (pkg/scheduler/api/devices/nvidia/vgpu/mig.go)."""
    groups = geometry_for_type(default_device_config(), register_type(gpu.name))
    assert groups is not None
    chosen = choose_slot(groups, used, request_mib)
    assert chosen is not None
    return mig_device_id(gpu.uuid, *chosen)


def mig_pod(
    name: str, device_ids: list[str], mem: int, *, consumed: bool = False, **kw: Any
) -> dict[str, Any]:
    """A pod of one container given `device_ids` (one record each) by Volcano; `consumed`: already
    allocated (its entry emptied, bind phase success)."""
    ids = "".join(f"{d},NVIDIA,{mem},0:" for d in device_ids)
    extra: dict[str, Any] = {"extra_annotations": {"volcano.sh/vgpu-mode": "mig"}}
    if consumed:
        extra.update(to_allocate="", phase="success")
    return make_pod(
        name,
        [container("main", {COUNT: str(len(device_ids)), MEMORY: str(mem)})],
        ids=ids,
        uid=f"uid-{name}",
        **extra,
        **kw,
    )


def claim_of(pod: dict[str, Any]) -> Claim:
    """The claim the node plugin's selection makes for the pod's next container."""
    entries = pod["metadata"]["annotations"]["volcano.sh/devices-to-allocate"].split(";")
    count = next(len([r for r in e.split(":") if r]) for e in entries if e)
    claim = select([pod], NODE, count, ResourceNames()).claim
    assert claim is not None
    return claim


def running_mig_plugin(
    api: ApiServerStandin, kubelet_dir: Path, tmp: Path, nvml: SimulatedNvml, **node: Any
) -> contextlib.AbstractAsyncContextManager[Harness]:
    """The node plugin in mig mode over `nvml` (kept alive afterwards, as a GPU outlives a plugin
    restart), with a kubelet stand-in; the Node must exist in `api`."""
    return running_plugin(api, kubelet_dir, tmp, nvml=nvml, mode="mig", **node)
