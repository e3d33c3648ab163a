"""Node plugin benchmark: Allocate latency and ListAndWatch message sizes on simulated H200 nodes.

Everything real that can run here: the node plugin as deployed, real gRPC over unix sockets to the
kubelet stand-in, the official Kubernetes client against the stand-in API server, the simulated NVML.
For 1, 8 and 16 GPUs of 143771 MiB (an H200's NVML total) it prints the ListAndWatch message size, the
size a per-MiB memory device list would have had (the kubelet drops messages over 4 MiB), and the
latency of kubelet Allocate calls, one after another and in bursts, while the node holds a steady
number of pods.

    .venv/bin/python -m bench.node [--pods 200] [--gpus 1,8,16] [--live 50] [--burst 8]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from kube_vgpu.contract.config import Config, NodeConfig
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.plugin import NodePlugin, PluginSettings
from kube_vgpu.proto import deviceplugin_v1beta1_pb2 as pb
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.hamicore import install_placeholder
from kube_vgpu.standins.kubelet.deviceplugin import MAX_MESSAGE_BYTES, KubeletStandin
from kube_vgpu.standins.nvml.api import load_simulation

NODE = "bench-node"
RESOURCE = "volcano.sh/vgpu-number"
H200 = "NVIDIA H200"
H200_MIB = 143771  # nvmlDeviceGetMemoryInfo(h).total // 2**20 on an H200 141 GB


def gpu_uuid(i: int) -> str:
    """A stable full-length UUID per GPU index."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{NODE}-{i}')}"


def per_mib_list_bytes(uuids: list[str], mib: int) -> int:
    """The exact encoded size of the device list a per-MiB `vgpu-memory` plugin would send.

    Each entry is a Device{ID: `<uuid>-memory-<k>`, health: "Healthy"} inside the repeated field 1;
    computed arithmetically (building 2.3 million messages in Python would only measure Python).
    """

    def varint_len(n: int) -> int:
        return max(1, (n.bit_length() + 6) // 7)

    total = 0
    for u in uuids:
        for digits in range(1, len(str(mib - 1)) + 1):
            low, high = (0 if digits == 1 else 10 ** (digits - 1)), min(10**digits, mib)
            if low >= high:
                continue
            id_len = len(u) + len("-memory-") + digits
            device = (1 + varint_len(id_len) + id_len) + (1 + 1 + len("Healthy"))
            total += (high - low) * (1 + varint_len(device) + device)
    return total


def pod(name: str, gpu: str, mem: int, created: int) -> dict[str, Any]:
    """A one-container pod bound to the node as Volcano leaves it."""
    record = f"{gpu},NVIDIA,{mem},10:"
    limits = {RESOURCE: "1", "volcano.sh/vgpu-memory": str(mem), "volcano.sh/vgpu-cores": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {
                "volcano.sh/vgpu-node": NODE,
                "volcano.sh/vgpu-time": str(created),
                "volcano.sh/bind-time": str(created),
                "volcano.sh/bind-phase": "allocating",
                "volcano.sh/vgpu-ids-new": record,
                "volcano.sh/devices-to-allocate": record,
            },
        },
        "spec": {
            "nodeName": NODE,
            "schedulerName": "volcano",
            "containers": [
                {"name": "main", "image": "x", "resources": {"limits": limits, "requests": limits}}
            ],
        },
        "status": {"phase": "Pending"},
    }


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def bench_node(gpus: int, pods: int, live: int, burst: int, work: Path) -> dict[str, Any]:
    """One simulated node of `gpus` H200s: sizes, then Allocate latencies."""
    kdir = Path(tempfile.mkdtemp(prefix="kvb-"))
    uuids = [gpu_uuid(i) for i in range(gpus)]
    nvml = load_simulation(
        {"gpus": [{"model": H200, "memoryMiB": H200_MIB, "count": gpus, "uuids": uuids}]}, NODE
    )
    nvml.nvmlInit()
    config = Config(node=NodeConfig(hook_path=str(work / "hook"), metrics_port=0))
    install_placeholder(work / "hook")  # HAMi-core's files, as the chart's installer leaves them
    settings = PluginSettings(
        node_name=NODE,
        mode="hami-core",
        kubelet_dir=kdir,
        config=config,
        lock_dir=str(work / "lock"),
        metrics_port=0,
    )
    with ApiServerStandin() as api:
        api.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}, "status": {"capacity": {}}})
        kube = Kube(api.api_client())
        kubelet = KubeletStandin(kdir)
        plugin = NodePlugin(settings, nvml, kube)
        try:
            await kubelet.start()
            await plugin.start()
            async with asyncio.timeout(30):
                endpoint = await kubelet.wait_registered(RESOURCE)
            result: dict[str, Any] = {
                "gpus": gpus,
                "devices": len(endpoint.devices),
                "law_bytes": endpoint.sizes[0],
                "per_mib_bytes": per_mib_list_bytes(uuids, H200_MIB),
            }
            sequential: list[float] = []
            names: list[str] = []
            created = 1_700_000_000
            for i in range(pods):
                name = f"p{i}"
                created += 1
                api.put(pod(name, uuids[i % gpus], 1024, created))
                names.append(name)
                start = time.perf_counter()
                await kubelet.allocate(RESOURCE, [f"{uuids[0]}-0"])
                sequential.append(time.perf_counter() - start)
                if len(names) > live:  # keep the node at a steady number of pods
                    api.delete("Pod", names.pop(0), "default")
            bursts: list[float] = []
            for b in range(max(1, pods // burst // 4)):
                for j in range(burst):
                    created += 1
                    api.put(pod(f"b{b}-{j}", uuids[j % gpus], 512, created))

                async def one() -> float:
                    start = time.perf_counter()
                    await kubelet.allocate(RESOURCE, [f"{uuids[0]}-0"])
                    return time.perf_counter() - start

                bursts += await asyncio.gather(*(one() for _ in range(burst)))
                for j in range(burst):
                    api.delete("Pod", f"b{b}-{j}", "default")
            result.update(
                seq_p50=percentile(sequential, 50) * 1000,
                seq_p99=percentile(sequential, 99) * 1000,
                seq_mean=statistics.fmean(sequential) * 1000,
                burst_p50=percentile(bursts, 50) * 1000,
                burst_p99=percentile(bursts, 99) * 1000,
                allocations=len(sequential) + len(bursts),
            )
            return result
        finally:
            await plugin.stop()
            await kubelet.stop()
            kube.close()
            nvml.nvmlShutdown()
            shutil.rmtree(kdir, ignore_errors=True)


async def main_async(args: argparse.Namespace) -> None:
    """Run every node size and print the table."""
    work = Path(tempfile.mkdtemp(prefix="kvb-work-"))
    try:
        rows = [await bench_node(n, args.pods, args.live, args.burst, work) for n in args.gpus]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"kube-vgpu node plugin: {args.pods} sequential Allocates per node "
        f"({args.live} live pods), bursts of {args.burst}"
    )
    print(
        f"GPUs: NVIDIA H200, {H200_MIB} MiB each; split 10; kubelet message limit {MAX_MESSAGE_BYTES} bytes"
    )
    header = (
        "| GPUs | devices | ListAndWatch bytes | per-MiB list bytes (refused) "
        "| Allocate p50 ms | p99 ms | burst p50 ms | burst p99 ms |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for r in rows:
        print(
            f"| {r['gpus']} | {r['devices']} | {r['law_bytes']} | {r['per_mib_bytes']:,} "
            f"| {r['seq_p50']:.1f} | {r['seq_p99']:.1f} | {r['burst_p50']:.1f} | {r['burst_p99']:.1f} |"
        )
    probe = pb.ListAndWatchResponse(
        devices=[pb.Device(ID=f"{gpu_uuid(0)}-memory-{k}", health="Healthy") for k in range(H200_MIB)]
    ).ByteSize()
    formula = per_mib_list_bytes([gpu_uuid(0)], H200_MIB)
    print(f"(check: one H200's per-MiB list built for real: {probe:,} bytes; formula: {formula:,})")


def main() -> None:
    """Parse flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=200, help="sequential Allocates per node size")
    parser.add_argument("--live", type=int, default=50, help="pods kept on the node while measuring")
    parser.add_argument("--burst", type=int, default=8, help="Allocates in flight at once in the burst runs")
    parser.add_argument(
        "--gpus",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 8, 16],
        help="node sizes, e.g. 1,8,16",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
