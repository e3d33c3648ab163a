"""The demo's stand-in for the container runtime and the workloads it starts, so the node plugin's
usage metrics run the path a real node takes.

Once an example pod is allocated, each of its containers gets an ID in the pod's status (as the
kubelet writes `containerStatuses`) and every GPU container a process on each of its GPUs in the
simulated NVML, in the cgroup the runtime would create (cgroup v2, systemd driver, containerd),
using three fifths of its memory limit and four fifths of its SM limit. The plugin then maps each
process back to its container through the cgroup text and the pod's status, as it does on a node.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kube_vgpu.demo.cluster import LocalCluster, SimulatedNode
from kube_vgpu.demo.flow import Outcome
from kube_vgpu.standins.nvml.api import SimProcess
from kube_vgpu.standins.nvml.config import WHOLE_GPU

_MIB = 1 << 20
_USAGE_METRICS = ("kube_vgpu_container_memory_used_mib", "kube_vgpu_container_sm_utilization_percent")
_PIDS = itertools.count(20000)


@dataclass(frozen=True)
class Workload:
    """One process the demo started: whose it is, where, and how much it uses."""

    node: str
    namespace: str
    pod: str
    container: str
    gpu: str  # the physical GPU's UUID, the `gpu` label of the metrics
    used_mib: int
    limit_mib: int
    sm_percent: int | None  # None on MIG, where NVML reports no process utilisation


def _cgroup(pod_uid: str, container_id: str) -> str:
    slice_name = f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice"
    return f"0::/kubepods.slice/kubepods-burstable.slice/{slice_name}/cri-containerd-{container_id}.scope\n"


Placed = tuple[str, int, int, int | None]  # GPU UUID, MiB used, MiB limit, SM percent


def _start_process(
    node: SimulatedNode, device: str, limit_mib: int | None, sm_limit: int | None, cgroup: str
) -> Placed | None:
    """Put one process on the GPU or MIG device `device`; None when the node has no such device."""
    for index, gpu in enumerate(node.nvml.gpus):
        if gpu.uuid == device:
            limit = limit_mib or gpu.memory_mib
            sm = (sm_limit or 50) * 4 // 5
            process = SimProcess(next(_PIDS), limit * 3 // 5 * _MIB, WHOLE_GPU, WHOLE_GPU, sm, cgroup)
            node.nvml.add_process(index, process)
            return gpu.uuid, limit * 3 // 5, limit, sm
        for ci in gpu.mig_devices():
            if ci.uuid == device:
                limit = ci.gi.profile.memory_size_mb
                process = SimProcess(next(_PIDS), limit * 3 // 5 * _MIB, ci.gi.id, ci.id, None, cgroup)
                node.nvml.add_process(index, process)
                return gpu.uuid, limit * 3 // 5, limit, None
    return None


def start_workloads(cluster: LocalCluster, outcomes: Sequence[Outcome]) -> list[Workload]:
    """Start the containers of every allocated example (status IDs, NVML processes)."""
    started: list[Workload] = []
    for outcome in outcomes:
        if not outcome.allocated or outcome.node not in cluster.nodes:
            continue
        node = cluster.nodes[outcome.node]
        namespace, name = outcome.example.key.split("/", 1)
        pod = cluster.apiserver.get("Pod", name, namespace)
        if pod is None:
            continue
        uid = pod["metadata"]["uid"]
        ids = {
            c["name"]: hashlib.sha256(f"{uid}/{c['name']}".encode()).hexdigest()
            for c in pod["spec"].get("containers", [])
        }
        statuses = [{"name": c, "containerID": f"containerd://{i}", "ready": True} for c, i in ids.items()]
        cluster.apiserver.patch("Pod", name, {"status": {"containerStatuses": statuses}}, namespace, "merge")
        for allocation in outcome.allocations:
            if allocation.container not in ids:
                continue
            envs = allocation.envs
            sm_limit = int(envs["CUDA_DEVICE_SM_LIMIT"]) if envs.get("CUDA_DEVICE_SM_LIMIT") else None
            devices = [d for d in envs.get("NVIDIA_VISIBLE_DEVICES", "").split(",") if d]
            for i, device in enumerate(devices):
                limit = envs.get(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", "").removesuffix("m")
                placed = _start_process(
                    node, device, int(limit) if limit.isdigit() else None, sm_limit,
                    _cgroup(uid, ids[allocation.container]),
                )  # fmt: skip
                if placed is not None:
                    gpu, used, total, sm = placed
                    started.append(
                        Workload(outcome.node, namespace, name, allocation.container, gpu, used, total, sm)
                    )
    return started


Usage = dict[tuple[str, str, str, str], dict[str, float]]


async def _container_usage(port: int) -> Usage:
    """Per (namespace, pod, container, gpu): the node plugin's usage metrics, by metric name."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        text = await response.text()
    found: Usage = {}
    for family in text_string_to_metric_families(text):
        if family.name in (
            "kube_vgpu_container_memory_used_mib",
            "kube_vgpu_container_sm_utilization_percent",
        ):
            for s in family.samples:
                key = (s.labels["namespace"], s.labels["pod"], s.labels["container"], s.labels["gpu"])
                found.setdefault(key, {})[family.name] = s.value
    return found


async def usage_report(cluster: LocalCluster, workloads: Sequence[Workload], within: float) -> list[str]:
    """Wait (at most `within` seconds) until each node plugin reports its workloads, then one line each,
    with the figures read back from the plugins' /metrics."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    wanted = {(w.namespace, w.pod, w.container, w.gpu) for w in workloads}
    while True:
        seen: Usage = {}
        for node in cluster.nodes.values():
            if node.plugin.metrics_server is not None:
                seen |= await _container_usage(node.plugin.metrics_server.port)
        if wanted <= seen.keys() or loop.time() >= deadline:
            break
        await asyncio.sleep(0.2)  # the plugin lists its pods on its own period
    lines = []
    for w in workloads:
        figures = seen.get((w.namespace, w.pod, w.container, w.gpu), {})
        memory = figures.get("kube_vgpu_container_memory_used_mib")
        shown = "not reported yet" if memory is None else f"memory {memory:.0f} of {w.limit_mib} MiB"
        sm = figures.get("kube_vgpu_container_sm_utilization_percent")
        shown += "" if sm is None else f", SM {sm:.0f}%"
        lines.append(f"    {w.node}  {w.namespace}/{w.pod}/{w.container}  {w.gpu}  {shown}")
    return lines
