"""Usage-metrics benchmark: the cost of one scrape's NVML read, cgroup attribution and rendering.

A simulated node of 8 H200s with `--per-gpu` compute processes each, every process in a container
of one of `--pods` pods (cgroup v2, systemd driver), plus one host process per GPU. Prints the
median and p99 time of `UsageSampler.refresh` (NVML over the simulator, cgroup parse, mapping to
containers) and of rendering the whole registry, and the size of the text Prometheus receives.

    .venv/bin/python -m bench.node_usage [--pods 200] [--per-gpu 25] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.node.deviceplugin.bookings import Ledger
from kube_vgpu.node.metrics import Metrics
from kube_vgpu.node.nvml.gpus import discover
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.usage.metrics import UsageSampler
from kube_vgpu.standins.nvml.api import load_simulation

NODE = "bench-node"
GPUS = 8


def scenario(pods: int, per_gpu: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    pod_objects: list[dict[str, Any]] = []
    processes: list[dict[str, Any]] = []
    pid = 1000
    for p in range(pods):
        uid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"pod-{p}"))
        cid = uuid.uuid5(uuid.NAMESPACE_DNS, f"c-{p}").hex * 2
        pod_objects.append(
            {
                "metadata": {"namespace": f"ns-{p % 10}", "name": f"pod-{p}", "uid": uid},
                "status": {"containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}]},
            }
        )
    for gpu in range(GPUS):
        for k in range(per_gpu):
            p = (gpu * per_gpu + k) % pods
            meta = pod_objects[p]["metadata"]
            cid = pod_objects[p]["status"]["containerStatuses"][0]["containerID"].split("//")[1]
            slice_ = f"kubepods-burstable-pod{meta['uid'].replace('-', '_')}.slice"
            cgroup = f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"
            processes.append(
                {"gpu": gpu, "pid": pid, "usedMemoryMiB": 1024, "smUtilPercent": 3, "cgroup": cgroup}
            )
            pid += 1
        processes.append({"gpu": gpu, "pid": pid, "usedMemoryMiB": 500, "cgroup": "0::/user.slice\n"})
        pid += 1
    sim = {"gpus": [{"model": "NVIDIA H200", "memoryMiB": 143771, "count": GPUS}], "processes": processes}
    return sim, pod_objects


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200, help="pods on the node")
    parser.add_argument("--per-gpu", type=int, default=25, help="container processes per GPU")
    parser.add_argument("--rounds", type=int, default=200, help="scrapes measured")
    args = parser.parse_args()
    sim, pods = scenario(args.pods, args.per_gpu)
    nvml = load_simulation(sim, NODE)
    nvml.nvmlInit()
    gpus = discover(nvml)
    sampler = UsageSampler(nvml, gpus, NODE, nvml.process_cgroup)
    sampler.pods_seen(pods)
    metrics = Metrics(LiveGpus(gpus, 10, NODE), Ledger(gpus, 10, ResourceNames(), NODE), sampler)
    refresh: list[float] = []
    render: list[float] = []
    size = 0
    for _ in range(args.rounds):
        started = time.perf_counter()
        sampler.refresh()
        refresh.append(time.perf_counter() - started)
        started = time.perf_counter()
        size = len(metrics.render())
        render.append(time.perf_counter() - started)
    nvml.nvmlShutdown()

    def ms(values: list[float], q: float) -> str:
        return f"{sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000:.2f} ms"

    processes = GPUS * (args.per_gpu + 1)
    print(f"{GPUS} GPUs, {processes} processes ({GPUS} on the host), {args.pods} pods, {args.rounds} scrapes")
    print(f"  refresh (NVML + cgroups + attribution): median {ms(refresh, 0.5)}, p99 {ms(refresh, 0.99)}")
    print(f"  render (whole registry):                median {ms(render, 0.5)}, p99 {ms(render, 0.99)}")
    print(f"  exposition: {size} bytes, {len(sampler.containers)} container series per usage metric")
    print(f"  mean refresh {statistics.fmean(refresh) * 1000:.2f} ms")


if __name__ == "__main__":
    main()
