"""Benchmark quota decisions under contention with 1..N webhook replicas sharing their reservations.

The stand-in API server (in this process) holds a few GPU nodes and one quota namespace; N
`kube-vgpu webhook` processes fill their caches from it. Pods are then created at a fixed concurrency,
all in that namespace (every decision contends for the same shared object), each mutated on a
random replica and validated on another, as the API server's calls through a Service land.
Printed per replica count: /validate p50/p99 as the caller sees it, pods admitted (must equal the
room), and the API traffic of the shared reservations: writes, 409 conflicts (each one a re-read and
a retry), reads, and the object's size.

    .venv/bin/python bench/quota_replicas.py --replicas 1 3 --pods 2000 --concurrency 64 --room 200
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import json
import random
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_vgpu.certs.issue import issue_ca, issue_serving  # noqa: E402
from kube_vgpu.contract.names import QUOTA_MEMORY_LABEL  # noqa: E402
from kube_vgpu.standins.apiserver.admission_chain import admission_review, with_system_metadata  # noqa: E402
from kube_vgpu.standins.apiserver.server import ApiServerStandin  # noqa: E402
from kube_vgpu.webhook.quota.shared import object_name  # noqa: E402

NAMESPACE = "team-bench"
RELEASE = "kube-vgpu"


@dataclass
class Result:
    replicas: int
    admitted: int
    validate_ms: list[float]
    writes: int
    conflicts: int
    reads: int
    object_bytes: int
    seconds: float


def gpu_node(index: int) -> dict[str, Any]:
    name = f"gpu-node-{index:03d}"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kube-vgpu.io/vgpu-mode": "hami-core"},
        },
    }


def pod() -> dict[str, Any]:
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1024", "volcano.sh/vgpu-cores": "10"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "bench-", "namespace": NAMESPACE},
        "spec": {"containers": [{"name": "main", "image": "app", "resources": {"limits": limits}}]},
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_ready(
    session: aiohttp.ClientSession, url: str, context: ssl.SSLContext, tries: int = 3000
) -> None:
    for _ in range(tries):
        try:
            async with session.get(url + "/readyz", ssl=context) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.02)
    raise SystemExit(f"webhook at {url} never became ready")


async def _drive(
    urls: list[str], ca_pem: bytes, pods: int, concurrency: int, seed: int
) -> tuple[int, list[float], float]:
    rng = random.Random(seed)
    context = ssl.create_default_context(cadata=ca_pem.decode())
    latencies: list[float] = []
    admitted = 0
    gate = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2)) as session:
        for url in urls:
            await _wait_ready(session, url, context)

        async def call(url: str, path: str, review: dict[str, Any]) -> dict[str, Any]:
            # One TLS context for every call, so keep-alive connections are reused.
            async with session.post(url + path, json=review, ssl=context) as response:
                body = await response.json()
            answer: dict[str, Any] = body["response"]
            return answer

        async def one() -> None:
            nonlocal admitted
            m = rng.randrange(len(urls))
            v = (m + rng.randrange(1, len(urls))) % len(urls) if len(urls) > 1 else m
            async with gate:
                spec = pod()
                mutated = await call(urls[m], "/mutate", admission_review(spec))
                ops = json.loads(base64.b64decode(mutated["patch"])) if mutated.get("patch") else []
                final = with_system_metadata(jsonpatch.apply_patch(copy.deepcopy(spec), ops))
                started = time.perf_counter()
                validated = await call(urls[v], "/validate", admission_review(final))
                latencies.append((time.perf_counter() - started) * 1000)
                admitted += bool(validated["allowed"])

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(pods)))
        return admitted, latencies, time.perf_counter() - started


def run(replicas: int, pods: int, concurrency: int, room: int, seed: int = 13) -> Result:
    """One measurement: `replicas` webhook processes, `pods` creates, room for `room` of them."""
    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-quota-bench-"))
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    with ApiServerStandin() as api:
        for i in range(8):
            api.put(gpu_node(i))
        api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE}})
        labels = {QUOTA_MEMORY_LABEL: str(room * 1024)}
        api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}})
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        procs: list[subprocess.Popen[bytes]] = []
        urls: list[str] = []
        try:
            for i in range(replicas):
                port = _free_port()
                command = [
                    sys.executable, "-m", "kube_vgpu", "webhook",
                    "--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key"),
                    "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", str(kubeconfig),
                    "--release-namespace", RELEASE, "--log-level", "warning",
                ]  # fmt: skip
                with (workdir / f"webhook-{i}.log").open("wb") as log:
                    procs.append(subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
                urls.append(f"https://127.0.0.1:{port}")
            api.clear_requests()
            admitted, latencies, seconds = asyncio.run(_drive(urls, ca.cert_pem, pods, concurrency, seed))
            path = f"/api/v1/namespaces/{RELEASE}/configmaps"
            records = api.requests(path_prefix=path)
            stored = api.get("configmap", object_name(NAMESPACE), RELEASE)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=60)
    return Result(
        replicas=replicas,
        admitted=admitted,
        validate_ms=sorted(latencies),
        writes=sum(1 for r in records if r.method in ("PUT", "POST") and r.status in (200, 201)),
        conflicts=sum(1 for r in records if r.status == 409),
        reads=sum(1 for r in records if r.method == "GET"),
        object_bytes=len(json.dumps(stored)) if stored else 0,
        seconds=seconds,
    )


def report(result: Result, pods: int, room: int) -> str:
    lat = result.validate_ms
    p50, p99 = statistics.median(lat), lat[max(0, int(len(lat) * 0.99) - 1)]
    fits = min(room, pods)  # every create fits when there are fewer than the room
    exact = "exact" if result.admitted == fits else f"WRONG (expected {fits})"
    return (
        f"replicas={result.replicas}: {pods} creates in {result.seconds:.1f} s, "
        f"admitted {result.admitted} ({exact}); "
        f"/validate p50 {p50:.1f} ms, p99 {p99:.1f} ms; shared object: {result.writes} writes, "
        f"{result.conflicts} conflicts (409, re-read and retried), {result.reads} reads, "
        f"{result.object_bytes} bytes holding {result.admitted} reservations"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--room", type=int, default=200, help="pods of 1 GiB the namespace's quota fits")
    args = parser.parse_args(argv)
    for replicas in args.replicas:
        print(report(run(replicas, args.pods, args.concurrency, args.room), args.pods, args.room), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
