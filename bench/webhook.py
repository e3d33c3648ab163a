"""Benchmark the admission webhook: reviews over HTTPS keep-alive against a large cluster cache.

The stand-in API server (in this process) holds N GPU nodes and M vGPU pods; `kube-vgpu webhook`
runs as a separate process and fills its cache through the real client's list+watch. A pool of
keep-alive HTTPS connections then sends reviews at a fixed concurrency. Printed: cache sync time,
p50/p99 latency, reviews per second, and the webhook process's RSS.

    .venv/bin/python bench/webhook.py --nodes 5000 --pods 50000 --concurrency 32 --reviews 20000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from certs.issue import issue_ca, issue_serving  # noqa: E402
from contract.models import model_label_name, register_type  # noqa: E402
from contract.names import HOSTNAME_LABEL, MODE_LABEL, MODEL_LABEL_PREFIX, NODE_REGISTER, UUID_LABEL_PREFIX  # noqa: E402
from contract.register import GpuRecord, encode_register  # noqa: E402
from standins.apiserver import ApiServerStandin  # noqa: E402
from standins.quantity import canonical as canonical_quantity  # noqa: E402

# (model, MiB, mode, GPUs per node): a mixed fleet, so selectors and mode resolution have work to do.
FLEET = [
    ("NVIDIA A10", 24576, "hami-core", 4),
    ("NVIDIA A100-PCIE-40GB", 40960, "hami-core", 8),
    ("NVIDIA H100 80GB HBM3", 81920, "mig", 8),
    ("NVIDIA L4", 23034, "hami-core", 2),
]
NAMESPACES = 50


def node(index: int) -> dict[str, Any]:
    model, mib, mode, count = FLEET[index % len(FLEET)]
    name = f"gpu-node-{index:05d}"
    records = [
        GpuRecord(
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{name}/{i}')}", 10, mib, register_type(model), True, mode
        )
        for i in range(count)
    ]
    labels = {HOSTNAME_LABEL: name, MODE_LABEL: mode, MODEL_LABEL_PREFIX + model_label_name(model): "true"}
    labels |= {UUID_LABEL_PREFIX + r.uuid: "true" for r in records}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {NODE_REGISTER: encode_register(records)},
        },
    }


def vgpu_pod(index: int, *, namespace: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    # As the API server hands them on: users write 1000..8000, webhooks read "1k".."8k".
    memory = canonical_quantity(str(1000 * (1 + index % 8)))
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{index:06d}", "namespace": namespace, "annotations": annotations or {}},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
        },
        "status": {"phase": "Running"},
    }


def review_bodies(count: int, *, validate: bool = False) -> list[bytes]:
    """A mix of what users send: plain memory, type selectors, UUID selectors, explicit mode.

    For the validating phase each pod carries the uid the API server fills in before it (quota
    reservations are keyed by it)."""
    uuid0 = f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, 'gpu-node-00001/0')}"
    variants = [
        {},
        {"nvidia.com/use-gputype": "A100"},
        {"nvidia.com/use-gputype": "A10,L4"},
        {"nvidia.com/nouse-gputype": "H100"},
        {"nvidia.com/use-gpuuuid": uuid0},
        {"volcano.sh/vgpu-mode": "mig"},
    ]
    bodies = []
    for i in range(count):
        obj = vgpu_pod(i, namespace=f"team-{i % NAMESPACES}", annotations=variants[i % len(variants)])
        obj["spec"].pop("schedulerName")
        obj.pop("status")
        if validate:
            obj["metadata"]["name"] = f"new-{i:06d}"
            obj["metadata"]["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{i}"))
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"bench-{i}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": obj["metadata"]["namespace"],
                "name": obj["metadata"]["name"],
                "object": obj,
                "dryRun": False,
            },
        }
        bodies.append(json.dumps(review).encode())
    return bodies


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set size of a process in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


async def wait_ready(
    url: str, context: ssl.SSLContext, proc: subprocess.Popen[bytes], limit_s: float
) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session:
        while time.perf_counter() - started < limit_s:
            if proc.poll() is not None:
                raise SystemExit(f"the webhook exited with {proc.returncode}")
            try:
                async with session.get(url + "/readyz") as response:
                    if response.status == 200:
                        return time.perf_counter() - started
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("the webhook did not become ready in time")


async def drive(
    url: str, context: ssl.SSLContext, bodies: list[bytes], concurrency: int, path: str = "/mutate"
) -> tuple[list[float], float, int]:
    """Send every body with `concurrency` workers on keep-alive connections; (latencies, seconds, errors)."""
    latencies: list[float] = []
    errors = 0
    queue = iter(bodies)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal errors
            for body in queue:
                started = time.perf_counter()
                async with session.post(url + path, data=body, headers=headers) as response:
                    answer = await response.json()
                latencies.append(time.perf_counter() - started)
                if response.status != 200 or not answer["response"]["allowed"]:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, time.perf_counter() - started, errors


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--reviews", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument(
        "--quota",
        action="store_true",
        help="label every namespace with (generous) GPU quotas (the ledger runs in the validate phase)",
    )
    parser.add_argument(
        "--phase",
        choices=["mutate", "validate"],
        default="mutate",
        help="which admission phase to send the reviews to (quota is decided in validate)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        help="with --quota: quota decisions under contention across N webhook replicas (runs "
        "bench/quota_replicas.py with --reviews creates at --concurrency)",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if args.replicas:
        import quota_replicas  # bench/ is on sys.path when run as a script

        counts = [str(n) for n in args.replicas]
        return quota_replicas.main(
            ["--replicas", *counts, "--pods", str(args.reviews), "--concurrency", str(args.concurrency)]
        )

    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-bench-"))
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())

    with ApiServerStandin() as api:
        started = time.perf_counter()
        quota = {"quota.kube-vgpu.io/vgpu-number": "1000000", "quota.kube-vgpu.io/vgpu-memory": "1000000000"}
        for n in range(NAMESPACES):
            labels = quota if args.quota else {}
            api.put(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{n}", "labels": labels}}
            )
        for i in range(args.nodes):
            api.put(node(i))
        for i in range(args.pods):
            api.put(vgpu_pod(i, namespace=f"team-{i % NAMESPACES}"))
        filled_s = time.perf_counter() - started
        print(f"stand-in API server filled: {args.nodes} nodes, {args.pods} pods in {filled_s:.1f} s")

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [
            sys.executable, "-m", "cli", "webhook",
            "--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key"),
            "--host", "127.0.0.1", "--port", str(port),
            "--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig")),
            "--log-level", "warning",
        ]  # fmt: skip
        log = (workdir / "webhook.log").open("wb")
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        url = f"https://127.0.0.1:{port}"
        try:
            sync_s = asyncio.run(wait_ready(url, context, proc, 600))
            rss_synced, _ = rss_mib(proc.pid)
            path = "/" + args.phase
            bodies = review_bodies(args.reviews + args.warmup, validate=args.phase == "validate")
            asyncio.run(drive(url, context, bodies[: args.warmup], args.concurrency, path))
            latencies, seconds, errors = asyncio.run(
                drive(url, context, bodies[args.warmup :], args.concurrency, path)
            )
            rss_now, rss_peak = rss_mib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.close()
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    listed = f"{args.nodes} nodes + {args.pods} pods"
    print(f"cache synced (list of {listed}) in {sync_s:.1f} s; RSS {rss_synced:.0f} MiB")
    print(
        f"{len(latencies)} {args.phase} reviews, concurrency {args.concurrency}, "
        f"quota {'on' if args.quota else 'off'}: "
        f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, {len(latencies) / seconds:.0f} reviews/s, {errors} errors"
    )
    print(f"webhook RSS after load {rss_now:.0f} MiB (peak {rss_peak:.0f} MiB); exit code on SIGTERM {code}")
    print(f"cpu count {os.cpu_count()}; webhook log: {workdir / 'webhook.log'}")
    return 0 if errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
