"""DRA taint latency: the time from a GPU's XID to its NoSchedule taint in the published ResourceSlice.

Everything real that can run here: the simulated NVML reports an XID 79 (the whole path of a real
one: the health monitor's event thread, the inventory on the event loop, the slice publisher), the
publisher writes through the official Kubernetes client to the stand-in API server (Kubernetes 1.36
feature gates), and the bench polls the stored slice every millisecond. Each round starts a fresh
node of `--gpus` GPUs and fails them one after another.

    .venv/bin/python -m bench.dra_taint [--rounds 20] [--gpus 8]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from typing import Any

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.attributes import read_facts
from kube_vgpu.node.dra.publisher import SlicePublisher
from kube_vgpu.node.nvml.gpus import discover
from kube_vgpu.node.nvml.health import HealthMonitor, HealthTracker
from kube_vgpu.node.nvml.inventory import Inventory
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.nvml.api import load_simulation

NODE = "bench-node"


def tainted(api: ApiServerStandin, device: str) -> bool:
    for s in api.list("ResourceSlice"):
        for d in s["spec"].get("devices") or []:
            if d["name"] == device and d.get("taints"):
                return True
    return False


async def one_round(api: ApiServerStandin, gpus: int) -> list[float]:
    nvml = load_simulation(
        {"gpus": [{"model": "NVIDIA H100 80GB HBM3", "memoryMiB": 81559, "count": gpus}]}, NODE
    )
    nvml.nvmlInit()
    found = discover(nvml)
    inventory = Inventory(found, 10, NODE)
    loop = asyncio.get_running_loop()

    def report(uuid: str, healthy: bool, reason: str) -> None:
        loop.call_soon_threadsafe(inventory.set_health, uuid, healthy, reason)

    monitor = HealthMonitor(
        nvml, found, HealthTracker([g.uuid for g in found], (), 60.0), report, wait_ms=500
    )
    kube = Kube(api.api_client(), component="node")
    publisher = SlicePublisher(kube, NODE, read_facts(nvml, found), inventory)
    task = asyncio.create_task(publisher.run())
    monitor.start()
    samples: list[float] = []
    try:
        # The publisher and the stand-in run on other threads and loops: poll what they show.
        while publisher.state.devices != gpus:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for gpu in found:
            start = time.perf_counter()
            nvml.inject_xid(gpu.index, 79)
            while not await asyncio.to_thread(tainted, api, f"gpu-{gpu.minor}"):  # noqa: ASYNC110
                await asyncio.sleep(0.001)
            samples.append(time.perf_counter() - start)
    finally:
        monitor.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await publisher.remove()
        kube.close()
        nvml.nvmlShutdown()
    return samples


async def main_async(rounds: int, gpus: int) -> dict[str, Any]:
    samples: list[float] = []
    with ApiServerStandin(feature_gates=FeatureGates.of_release(36)) as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        for _ in range(rounds):
            samples += await one_round(api, gpus)
    samples.sort()
    return {
        "samples": len(samples),
        "p50_ms": round(statistics.median(samples) * 1000, 1),
        "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1000, 1),
        "max_ms": round(samples[-1] * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    print(asyncio.run(main_async(args.rounds, args.gpus)))


if __name__ == "__main__":
    main()
