"""From slice to container: the node plugin publishes its pool, the scheduler stand-in allocates claims
from it, the kubelet stand-in prepares them through the plugin, and the container's CDI edits carry the
limits of what was allocated."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.publisher import SlicePublisher
from kube_vgpu.node.dra.server import DRIVER_NAME, DraServer, inventory_cards, serve_dra
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.scheduler import DraScheduler, Unschedulable
from kube_vgpu.standins.kubelet.dra import ClaimId, DraError, DraKubelet, cdi_ids_for, resolve
from tests.support.node import short_tempdir

NODE = "node-a"
GPUS = [
    GpuInfo(i, f"GPU-{i}aaaaaaa-0000-0000-0000-000000000000", "NVIDIA A100-SXM4-80GB", i, 81920)
    for i in range(2)
]


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tempdir() as path:
        yield path


@dataclass
class Cluster:
    api: ApiServerStandin
    scheduler: DraScheduler
    kubelet: DraKubelet
    inventory: Inventory
    publisher: SlicePublisher
    cdi_dir: Path

    def claim(self, name: str, **capacity: str) -> ClaimId:
        exactly: dict[str, Any] = {"deviceClassName": DRIVER_NAME}
        if capacity:
            exactly["capacity"] = {"requests": capacity}
        stored = self.api.put(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            }
        )
        return ClaimId("default", name, stored["metadata"]["uid"])

    def allocate(self, claim: ClaimId) -> dict[str, Any]:
        stored = self.scheduler.allocate(claim.namespace, claim.name, NODE)
        result: dict[str, Any] = stored["status"]["allocation"]["devices"]["results"][0]
        return result

    async def container_env(self, claim: ClaimId) -> dict[str, str]:
        devices = (await self.kubelet.prepare(DRIVER_NAME, [claim]))[claim.uid]
        return resolve([self.cdi_dir], cdi_ids_for(devices, "gpu")).env_map


@asynccontextmanager
async def cluster(
    apiserver: ApiServerStandin, root: Path, gpus: list[GpuInfo] = GPUS
) -> AsyncIterator[Cluster]:
    apiserver.feature_gates = FeatureGates.of_release(36)  # consumable capacity on
    apiserver.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    apiserver.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DRIVER_NAME},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER_NAME}"'}}]},
        }
    )
    cdi_dir = root / "cdi"
    cdi_dir.mkdir()
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {"name": g.uuid, "containerEdits": {"deviceNodes": [{"path": f"/dev/nvidia{g.minor}"}]}}
            for g in gpus
        ],
    }
    (cdi_dir / "nvidia.json").write_text(json.dumps(spec))
    inventory = Inventory(gpus, 10, NODE)
    kube = Kube(apiserver.api_client(), component="node")
    facts = [GpuFacts(g.index, g.minor, g.uuid, g.name, g.memory_mib) for g in gpus]
    publisher = SlicePublisher(kube, NODE, facts, inventory, retry_seconds=0.05)
    server: DraServer | None = None
    kubelet = DraKubelet(root / "kubelet")
    try:
        await publisher.publish()
        server = await serve_dra(
            node_name=NODE,
            kube=kube,
            cards=inventory_cards(inventory),
            hook_path=str(root / "hook"),
            lock_dir=str(root / "lock"),
            kubelet_root_dir=root / "kubelet",
            cdi_dir=cdi_dir,
            gpu_cdi_dirs=[cdi_dir],
        )
        await kubelet.register_all()
        yield Cluster(apiserver, DraScheduler(apiserver), kubelet, inventory, publisher, cdi_dir)
    finally:
        await kubelet.close()
        if server is not None:
            await server.stop()
        kube.close()


async def test_three_30_gib_claims_on_one_80_gib_gpu_two_prepared(
    apiserver: ApiServerStandin, root: Path
) -> None:
    async with cluster(apiserver, root, GPUS[:1]) as c:
        first, second, third = (c.claim(n, memory="30Gi", cores="30") for n in ("c1", "c2", "c3"))
        assert c.allocate(first)["device"] == c.allocate(second)["device"] == "gpu-0"
        with pytest.raises(Unschedulable):
            c.allocate(third)
        for claim in (first, second):
            env = await c.container_env(claim)
            assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == ("30720m", "30")


async def test_a_claim_with_no_capacity_request_gets_the_whole_card(
    apiserver: ApiServerStandin, root: Path
) -> None:
    async with cluster(apiserver, root) as c:
        whole = c.claim("whole")
        assert c.allocate(whole)["consumedCapacity"] == {"memory": "80Gi", "cores": "100"}
        env = await c.container_env(whole)
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == ("81920m", "100")


async def test_a_gpu_that_turns_unhealthy_after_allocation_is_refused_at_prepare(
    apiserver: ApiServerStandin, root: Path
) -> None:
    async with cluster(apiserver, root) as c:
        claim = c.claim("late", memory="10Gi", cores="10")
        device = c.allocate(claim)["device"]
        gpu = next(g for g in GPUS if f"gpu-{g.minor}" == device)
        c.inventory.set_health(gpu.uuid, False, "XID 79")
        with pytest.raises(DraError, match=f"device {device} \\({gpu.uuid}\\), which is unhealthy: XID 79"):
            await c.kubelet.prepare(DRIVER_NAME, [claim])
