"""DRA kubelet plugin benchmark: NodePrepareResources latency with 50 claims prepared on an 8-GPU node.

Everything real that can run here: the plugin's gRPC server on its unix socket, registered with the
kubelet stand-in through the real registration socket, the kubelet stand-in's DRA calls (v1), each
claim read through the official Kubernetes client from the stand-in API server (in this process, on
its own thread), the checkpoint and CDI spec written and fsynced on the local disk. Each round
prepares 50 claims one call at a time (claim i on GPU i % 8, 8 GiB and 10 % of the SMs each, so up to
7 per GPU), prepares them all again (the kubelet repeats prepares after a restart: answered from the
checkpoint), then unprepares them.

    .venv/bin/python -m bench.dra_prepare [--claims 50] [--gpus 8] [--rounds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.dra.cdi import write_atomic
from kube_vgpu.node.dra.limits import Card
from kube_vgpu.node.dra.server import DRIVER_NAME, serve_dra
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.kubelet.dra import ClaimId, DraKubelet

NODE = "bench-node"
GPU_MIB = 81920


def gpu_uuid(i: int) -> str:
    return f"GPU-{i:08x}-0000-4000-8000-000000000000"


def nvidia_spec(gpus: int) -> dict[str, Any]:
    devices = []
    for i in range(gpus):
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{i}"}]}
        devices += [{"name": str(i), "containerEdits": edits}, {"name": gpu_uuid(i), "containerEdits": edits}]
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidiactl"}]},
    }


def make_claims(custom: client.CustomObjectsApi, count: int, gpus: int, round_: int) -> list[ClaimId]:
    claims = []
    for i in range(count):
        name = f"r{round_}-c{i}"
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER_NAME}}]}},
        }
        created = custom.create_namespaced_custom_object(
            "resource.k8s.io", "v1", "default", "resourceclaims", body
        )
        result = {
            "request": "gpu",
            "driver": DRIVER_NAME,
            "pool": NODE,
            "device": f"gpu-{i % gpus}",
            "consumedCapacity": {"memory": "8Gi", "cores": "10"},
            "shareID": f"{round_}-{i}",
        }
        custom.patch_namespaced_custom_object_status(
            "resource.k8s.io",
            "v1",
            "default",
            "resourceclaims",
            name,
            {"status": {"allocation": {"devices": {"results": [result]}}}},
        )
        claims.append(ClaimId("default", name, created["metadata"]["uid"]))
    return claims


def disk_floor(folder: Path, count: int = 200) -> list[float]:
    """What one durable write costs on this disk, alone: the atomic write prepare makes twice (side by
    side) before it answers."""
    samples = []
    for i in range(count):
        started = time.perf_counter()
        write_atomic(folder / f"probe-{i % 2}.json", b"{}" * 1000)
        samples.append(time.perf_counter() - started)
    return samples


def percentiles(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):6.2f} ms  p99 {p99:6.2f} ms  max {ms[-1]:6.2f} ms  (n={len(ms)})"


async def run(claims: int, gpus: int, rounds: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="kv-bench-"))
    try:
        (root / "cdi").mkdir()
        (root / "cdi" / "nvidia.json").write_text(json.dumps(nvidia_spec(gpus)))
        cards = {f"gpu-{i}": Card(f"gpu-{i}", gpu_uuid(i), i, GPU_MIB) for i in range(gpus)}
        with ApiServerStandin() as api, api.api_client() as api_client:
            custom = client.CustomObjectsApi(api_client)
            kube = Kube(api.api_client(), component="node")
            server = await serve_dra(
                node_name=NODE,
                kube=kube,
                cards=lambda: cards,
                hook_path=str(root / "hook"),
                lock_dir=str(root / "lock"),
                kubelet_root_dir=root / "kubelet",
                cdi_dir=root / "cdi",
                gpu_cdi_dirs=[root / "cdi"],
            )
            kubelet = DraKubelet(root / "kubelet")
            await kubelet.register_all()
            first: list[float] = []
            again: list[float] = []
            undo: list[float] = []
            try:
                for r in range(rounds):
                    batch = make_claims(custom, claims, gpus, r)
                    for claim in batch:
                        started = time.perf_counter()
                        await kubelet.prepare(DRIVER_NAME, [claim])
                        first.append(time.perf_counter() - started)
                    for claim in batch:
                        started = time.perf_counter()
                        await kubelet.prepare(DRIVER_NAME, [claim])
                        again.append(time.perf_counter() - started)
                    for claim in batch:
                        started = time.perf_counter()
                        await kubelet.unprepare(DRIVER_NAME, [claim])
                        undo.append(time.perf_counter() - started)
            finally:
                await kubelet.close()
                await server.stop()
                kube.close()
        probe = root / "probe"
        probe.mkdir()
        floor = disk_floor(probe)
        print(f"{gpus} GPUs, {claims} claims prepared per round, {rounds} rounds (v1 over unix sockets)")
        print(f"NodePrepareResources, first (API read, checkpoint, CDI spec): {percentiles(first)}")
        print(f"NodePrepareResources, repeated (from the checkpoint):          {percentiles(again)}")
        print(f"NodeUnprepareResources:                                        {percentiles(undo)}")
        print(f"one durable write on this disk (write, fsync, rename, fsync):  {percentiles(floor)}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args.claims, args.gpus, args.rounds))


if __name__ == "__main__":
    main()
