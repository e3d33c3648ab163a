"""The webhook at a real cluster's size: memory, cache sync and admission speed with 5,000 GPU nodes and
50,000 or 150,000 realistic pods (`kubectl get pod -o json` shape, about 6 KB each, one in ten with a vGPU).

The stand-in API server (in this process) holds the cluster as compact JSON; `kube-vgpu webhook` runs
as a separate process and fills its cache through the real client's paged list+watch. Printed: the
cache sync time (start to /readyz 200), the webhook's RSS after sync and its peak (VmHWM), and /mutate
and /validate throughput and p99 from the Go load generator (bench/gofloor), driven over HTTPS as a
black box.

    .venv/bin/python bench/scale.py --pods 50000
    .venv/bin/python bench/scale.py --pods 150000
    .venv/bin/python bench/scale.py --pods 150000 --tracemalloc   # where the cache's memory goes
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import ssl
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import webhook as wb  # noqa: E402  (bench/webhook.py: its helpers drive the webhook as a black box)

from kube_vgpu.certs.issue import issue_ca, issue_serving  # noqa: E402
from kube_vgpu.standins.apiserver.realistic import realistic_pod  # noqa: E402
from kube_vgpu.standins.apiserver.server import ApiServerStandin  # noqa: E402

NAMESPACES = 50


def fill(api: ApiServerStandin, nodes: int, pods: int) -> None:
    for name in [f"team-{n}" for n in range(NAMESPACES)] + [wb.REVIEW_NAMESPACE]:
        api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    node_objects = []
    for i in range(nodes):
        node = wb.node(i)
        node.pop("apiVersion")
        node.pop("kind")
        node["metadata"]["uid"] = f"node-uid-{i}"
        node_objects.append(node)
    api.load_compact("Node", node_objects)
    api.load_compact("Pod", (realistic_pod(i, namespaces=NAMESPACES, nodes=nodes) for i in range(pods)))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--reviews", type=int, default=10000, help="measured reviews per run")
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="runs per phase (the median is printed)")
    parser.add_argument("--server-cpu", default="0", help="CPU list for the webhook (taskset -c); ''=any")
    parser.add_argument("--load-cpu", default="1", help="CPU list for the load generator; '' for none")
    parser.add_argument("--loadgen", help="the Go load generator (else built by bench/gofloor/build.sh)")
    parser.add_argument(
        "--tracemalloc",
        action="store_true",
        help="instead: sync the webhook's cache and quota ledger in a child process under tracemalloc "
        "and print where its memory goes",
    )
    parser.add_argument(
        "--webhook-src",
        help="run the webhook from this src/ folder (another checkout's code, for a before/after)",
    )
    parser.add_argument("--cache-child", help=argparse.SUPPRESS)  # kubeconfig: the tracemalloc child
    return parser.parse_args()


async def cache_child(kubeconfig: str) -> None:
    """Sync a ClusterCache wired to the quota ledger as the webhook wires it, then print the top
    allocation sites still alive (tracemalloc started before any of it was built)."""
    from collections.abc import Callable

    from kube_vgpu.contract.config import Config
    from kube_vgpu.kubeapi.client import Kube, load_api_client
    from kube_vgpu.webhook.cache import ClusterCache
    from kube_vgpu.webhook.metrics import WebhookMetrics
    from kube_vgpu.webhook.quota.shared import NamespaceSnapshot
    from kube_vgpu.webhook.quota.shared_store import SharedReservations
    from kube_vgpu.webhook.service import build_quota

    tracemalloc.start(1)
    config = Config()
    kube = Kube(load_api_client(kubeconfig), component="webhook")
    cache = ClusterCache(kube, names=config.resource_names)

    def book(cache_state: Callable[[str], NamespaceSnapshot]) -> SharedReservations:
        # As the server wires it; it calls the API only to decide, which nothing here asks.
        lifetime = config.webhook.cache_staleness_seconds
        return SharedReservations(kube, "kube-vgpu", lifetime_seconds=lifetime, cache_state=cache_state)

    build_quota(cache, config, WebhookMetrics(), book)
    started = time.perf_counter()
    await cache.start()
    await cache.wait_synced()
    synced_s = time.perf_counter() - started
    await cache.stop()
    gc.collect()
    snapshot = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    print(f"cache synced in {synced_s:.1f} s (under tracemalloc); sizes {dict(cache.sizes())}")
    print(f"traced Python memory: {current / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB peak")
    print("top allocation sites alive after sync (tracemalloc, by line):")
    for stat in snapshot.statistics("lineno")[:15]:
        frame = stat.traceback[0]
        where = frame.filename.removeprefix(str(REPO) + os.sep)
        print(f"  {stat.size / 2**20:7.2f} MiB  {stat.count:8d} blocks  {where}:{frame.lineno}")
    kube.close()


def main() -> int:
    args = parse_args()
    if args.cache_child:
        asyncio.run(cache_child(args.cache_child))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-scale-"))
    with ApiServerStandin() as api:
        started = time.perf_counter()
        fill(api, args.nodes, args.pods)
        print(
            f"stand-in API server filled: {args.nodes} GPU nodes, {args.pods} realistic pods "
            f"(1 in 10 with a vGPU) in {time.perf_counter() - started:.1f} s"
        )
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig")
        if args.tracemalloc:
            command = [sys.executable, __file__, "--cache-child", str(kubeconfig)]
            return subprocess.run(command, cwd=REPO, check=False).returncode
        return measure(args, api, workdir)


def measure(args: argparse.Namespace, api: ApiServerStandin, workdir: Path) -> int:
    loadgen = args.loadgen or wb.build_tools(str(REPO / "bench" / "gofloor" / "build.sh"), workdir / "bin")[1]
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    port = wb.free_port()
    url = f"https://127.0.0.1:{port}"
    if args.webhook_src:
        # Only the webhook process runs the other code; the stand-in stays this checkout's.
        os.environ["PYTHONPATH"] = str(Path(args.webhook_src).resolve())
    proc = wb.start_webhook(args, api, workdir, port, None)
    os.environ.pop("PYTHONPATH", None)
    try:
        sync_s = asyncio.run(wb.wait_ready(url, context, proc, 600))
        # CPU time says more than wall time on a machine shared with other work.
        sync_cpu = wb.cpu_seconds(proc.pid)
        time.sleep(2.0)  # settle: the last events and the allocator's first trims
        rss_synced, peak_synced = wb.rss_mib(proc.pid)
        print(f"cache synced in {sync_s:.1f} s ({sync_cpu:.1f} s of webhook CPU, start-up included)")
        print(f"webhook RSS {rss_synced:.0f} MiB, peak (VmHWM) {peak_synced:.0f} MiB")
        bodies = wb.write_bodies(url, context, workdir)
        load_args = argparse.Namespace(
            loadgen=loadgen,
            reviews=args.reviews,
            reviews_single=args.reviews,
            warmup=args.warmup,
            load_cpu=args.load_cpu,
        )
        results = {}
        for phase in ("mutate", "validate"):
            body, ca_file = bodies[phase], workdir / "ca.crt"
            runs = [
                wb.load(load_args, f"{url}/{phase}", body, ca_file, args.concurrency, pid=proc.pid)
                for _ in range(args.rounds)
            ]
            results[phase] = wb.median_run(runs)
        rss_now, rss_peak = wb.rss_mib(proc.pid)
    finally:
        code = wb.stop(proc)
    print()
    print(f"| {args.nodes} GPU nodes, {args.pods} pods | value |")
    print("|---|---|")
    print(f"| cache sync (start to ready) | {sync_s:.1f} s wall, {sync_cpu:.1f} s CPU |")
    print(f"| RSS after sync | {rss_synced:.0f} MiB |")
    print(f"| RSS after load / peak (VmHWM) | {rss_now:.0f} MiB / {rss_peak:.0f} MiB |")
    errors = 0
    for phase, run in results.items():
        print(
            f"| /{phase} at concurrency {args.concurrency}: reviews/s, p50, p99, webhook CPU per review "
            f"| {run.rps:,.0f}/s, {run.p50_ms:.2f} ms, {run.p99_ms:.2f} ms, {run.cpu_us:.0f} us |"
        )
        errors += run.errors
    print(f"errors {errors}; exit code on SIGTERM {code}; webhook log: {workdir / 'webhook.log'}")
    return 0 if errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
