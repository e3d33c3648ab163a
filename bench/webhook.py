"""Benchmark the admission webhook against the Go floor: the same review, certificate and core, alternately.

The stand-in API server (in this process) holds N GPU nodes and M vGPU pods; `kube-vgpu webhook`
runs as a separate process pinned to one core (`taskset`) and fills its cache through the real
client's list+watch. The floor (`bench/gofloor/gowebhook.go`, or any `--floor-cmd`) runs pinned to
the same core with the same certificate. The Go load generator (`loadgen.go`, pinned to another
core) sends one realistic inference-pod review over TLS keep-alive to each server in turn (A B C A B C),
at concurrency 8 and 1, for `/mutate` and `/validate` (the floor only has `/mutate`; it gets the
same body). The third server (`bench/bare_aiohttp.py`, same core, same certificate) is aiohttp's
low-level server on uvloop answering a fixed review: what the HTTP server alone costs, apart from the
decision (`--bare none` leaves it out). With `--bare decision` it answers with kube-vgpu's own
decision instead (parse, the phase's rules, encode, on a cache filled from the same stand-in API
server) and none of the webhook's layers around it (connection cap, request deadline, body budget,
fair turns, metrics): what the decision costs on aiohttp alone. Printed: reviews/s, p50 and p99 of
each, the ratios, CPU per review, and the webhook's RSS.

    .venv/bin/python bench/webhook.py   # builds the Go floor with bench/gofloor/build.sh
    .venv/bin/python bench/webhook.py --loadgen BIN/loadgen \
        --floor-cmd "BIN/gowebhook -addr {addr} -cert {cert} -key {key}"

`--profile FILE` records a sampling profile of the webhook during an extra `/mutate` run
(py-spy when installed, else cProfile over the whole webhook process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import jsonpatch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_vgpu.certs.issue import issue_ca, issue_serving  # noqa: E402
from kube_vgpu.contract.models import model_label_name, register_type  # noqa: E402
from kube_vgpu.contract.names import (  # noqa: E402
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NODE_REGISTER,
    UUID_LABEL_PREFIX,
)
from kube_vgpu.contract.register import GpuRecord, encode_register  # noqa: E402
from kube_vgpu.standins.apiserver.quantity import canonical as canonical_quantity  # noqa: E402
from kube_vgpu.standins.apiserver.server import ApiServerStandin  # noqa: E402
from kube_vgpu.webhook.admission.review import decode_patch  # noqa: E402

# (model, MiB, mode, GPUs per node): a mixed fleet, so selectors and mode resolution have work to do.
FLEET = [
    ("NVIDIA A10", 24576, "hami-core", 4),
    ("NVIDIA A100-PCIE-40GB", 40960, "hami-core", 8),
    ("NVIDIA H100 80GB HBM3", 81920, "mig", 8),
    ("NVIDIA L4", 23034, "hami-core", 2),
]
NAMESPACES = 50
# The namespace of the benchmark's review: no quota labels, so /validate runs safety but no ledger.
REVIEW_NAMESPACE = "inference"


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


def inference_pod() -> dict[str, Any]:
    """A model server as a Deployment creates it: probes, env, mounts, tolerations (a 2.8 KB review)."""
    labels = {
        "app.kubernetes.io/name": "llm-server",
        "app.kubernetes.io/instance": "llama-8b",
        "app.kubernetes.io/component": "inference",
        "pod-template-hash": "7d9c5b6f4",
        "team": "ml-platform",
    }
    env = [
        {"name": "MODEL_ID", "value": "meta-llama/Llama-3.1-8B-Instruct"},
        {"name": "MAX_MODEL_LEN", "value": "8192"},
        {"name": "GPU_MEMORY_UTILIZATION", "value": "0.90"},
        {"name": "HF_HOME", "value": "/models/cache"},
        {"name": "PORT", "value": "8000"},
    ]
    evict_after = {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
    probe = {"httpGet": {"path": "/health", "port": 8000}, "periodSeconds": 10, "failureThreshold": 3}
    server = {
        "name": "server",
        "image": "registry.example.com/ml/vllm-openai:v0.6.3",
        "args": ["--model", "$(MODEL_ID)", "--max-model-len", "$(MAX_MODEL_LEN)", "--port", "$(PORT)"],
        "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "env": env,
        "resources": {
            "limits": {
                "cpu": "8",
                "memory": "32Gi",
                "volcano.sh/vgpu-number": "1",
                "volcano.sh/vgpu-memory": "20000",
            },
            "requests": {"cpu": "4", "memory": "24Gi"},
        },
        "volumeMounts": [
            {"name": "models", "mountPath": "/models", "readOnly": True},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "readinessProbe": probe,
        "livenessProbe": {**probe, "initialDelaySeconds": 120},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llama-8b-7d9c5b6f4-q2xkz",
            "generateName": "llama-8b-7d9c5b6f4-",
            "namespace": REVIEW_NAMESPACE,
            "labels": labels,
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9400",
                "kubectl.kubernetes.io/default-container": "server",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "llama-8b-7d9c5b6f4",
                    "uid": "0f7d3c1e-5a7b-4c2d-9e8f-1a2b3c4d5e6f",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [server],
            "volumes": [
                {"name": "models", "persistentVolumeClaim": {"claimName": "model-cache", "readOnly": True}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 60,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "llm-server",
            "priority": 0,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", **evict_after},
                {"key": "node.kubernetes.io/unreachable", **evict_after},
            ],
        },
    }  # fmt: skip


def review_of(obj: dict[str, Any]) -> dict[str, Any]:
    """The AdmissionReview the API server sends for the CREATE of `obj`."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": obj["metadata"]["namespace"],
            "name": obj["metadata"]["name"],
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": obj,
            "dryRun": False,
        },
    }


def validate_object(mutated: dict[str, Any]) -> dict[str, Any]:
    """The pod as the validating phase sees it: mutated, then given a uid and creation time."""
    metadata = {**mutated["metadata"], "uid": "6b1f0e2c-3d4a-4b5c-8d9e-0a1b2c3d4e5f"}
    return {**mutated, "metadata": {**metadata, "creationTimestamp": "2026-01-01T00:00:00Z"}}


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


async def review_once(
    url: str, context: ssl.SSLContext, body: bytes, phase: str = "mutate"
) -> dict[str, Any]:
    """The server's answer to one review (to build the validating phase's body from its patch)."""
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.post(f"{url}/{phase}", data=body, headers=headers) as resp,
    ):
        answer: dict[str, Any] = await resp.json()
        return answer


def wait_floor(url: str, context: ssl.SSLContext, proc: subprocess.Popen[bytes], limit_s: float) -> None:
    """Until the floor server accepts TLS connections."""
    host, port = url.removeprefix("https://").split(":")
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the floor server exited with {proc.returncode}")
        try:
            with (
                socket.create_connection((host, int(port)), timeout=1) as raw,
                context.wrap_socket(raw, server_hostname="localhost"),
            ):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the floor server did not start in time")


class Run(NamedTuple):
    """One load generator run: its JSON line."""

    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    # Server CPU time (user + system, every thread) per review: steadier than throughput on a
    # shared machine, since time the server waits for the core is not counted.
    cpu_us: float


def pinned(cpu: str | None, command: list[str]) -> list[str]:
    """`command` run on the given CPUs (`taskset -c`), or as is when no CPU is given."""
    return ["taskset", "-c", cpu, *command] if cpu else command


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/<pid>/stat, every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(args: argparse.Namespace, url: str, body: Path, ca: Path, concurrency: int, *, pid: int) -> Run:
    """One load generator run against the server of process `pid`."""
    n = args.reviews if concurrency > 1 else args.reviews_single
    command = [
        args.loadgen, "-url", url, "-ca", str(ca), "-body", str(body),
        "-n", str(n), "-c", str(concurrency), "-warmup", str(args.warmup),
    ]  # fmt: skip
    before = cpu_seconds(pid)
    out = subprocess.run(pinned(args.load_cpu, command), check=True, capture_output=True, text=True).stdout
    cpu_us = (cpu_seconds(pid) - before) * 1e6 / (n + args.warmup)
    line = json.loads(out.strip().splitlines()[-1])
    return Run(line["rps"], line["p50_ms"], line["p99_ms"], line["errors"], cpu_us)


def median_run(runs: list[Run]) -> Run:
    """The run of median throughput (its latencies with it), errors summed."""
    middle = sorted(runs, key=lambda r: r.rps)[(len(runs) - 1) // 2]
    cpu = sorted(r.cpu_us for r in runs)[(len(runs) - 1) // 2]
    return Run(middle.rps, middle.p50_ms, middle.p99_ms, sum(r.errors for r in runs), cpu)


def build_tools(script: str, outdir: Path) -> tuple[str, str]:
    """(gowebhook, loadgen) built by the floor's build script into `outdir`."""
    subprocess.run(["bash", script, str(outdir)], check=True, stdout=subprocess.DEVNULL)
    return str(outdir / "gowebhook"), str(outdir / "loadgen")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--concurrency", default="8,1", help="comma-separated concurrencies to measure")
    parser.add_argument("--phases", default="mutate,validate", help="comma-separated phases to measure")
    parser.add_argument(
        "--reviews", type=int, default=20000, help="measured reviews per run at concurrency > 1"
    )
    parser.add_argument(
        "--reviews-single", type=int, default=5000, help="measured reviews per run at concurrency 1"
    )
    parser.add_argument("--warmup", type=int, default=1000, help="unmeasured reviews before each run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="A B pairs per measurement (the median is printed)"
    )
    parser.add_argument(
        "--server-cpu", default="0", help="CPU list for both servers (taskset -c); '' for none"
    )
    parser.add_argument("--load-cpu", default="1", help="CPU list for the load generator; '' for none")
    parser.add_argument(
        "--floor-build-script",
        default=str(REPO / "bench" / "gofloor" / "build.sh"),
        help="the floor's build.sh: builds gowebhook and loadgen",
    )
    parser.add_argument("--loadgen", help="the Go load generator binary (else built by --floor-build-script)")
    parser.add_argument(
        "--floor-cmd",
        help="command starting the floor server; {addr}, {cert}, {key} are filled in "
        "(default: the built gowebhook); 'none' measures kube-vgpu alone",
    )
    parser.add_argument(
        "--bare",
        default="aiohttp",
        choices=["aiohttp", "decision", "none"],
        help="the third server: bench/bare_aiohttp.py answering a fixed review (aiohttp), kube-vgpu's "
        "decision with none of the webhook's layers (decision), or none",
    )
    parser.add_argument(
        "--quota",
        action="store_true",
        help="give every namespace, the review's too, generous GPU quotas (the ledger runs in /validate)",
    )
    parser.add_argument("--profile", help="write a profile of the webhook under a /mutate run to this file")
    parser.add_argument(
        "--replicas",
        type=int,
        nargs="+",
        help="with --quota: quota decisions under contention across N webhook replicas (runs "
        "bench/quota_replicas.py with --reviews creates at the first --concurrency)",
    )
    args = parser.parse_args()
    if args.replicas:
        if not args.quota:
            parser.error("--replicas measures quota decisions: give --quota too")
        return args
    if not args.loadgen and not args.floor_build_script:
        parser.error("give --loadgen (and --floor-cmd) or --floor-build-script")
    return args


def start_webhook(
    args: argparse.Namespace, api: ApiServerStandin, workdir: Path, port: int, profile: str | None
) -> subprocess.Popen[bytes]:
    python = [sys.executable]
    if profile:
        python += ["-m", "cProfile", "-o", profile]
    command = [
        *python, "-m", "kube_vgpu", "webhook",
        "--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key"),
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(free_port()),
        "--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig")),
        "--log-level", "info",
    ]  # fmt: skip
    log = (workdir / "webhook.log").open("ab")
    return subprocess.Popen(pinned(args.server_cpu, command), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def fill(api: ApiServerStandin, args: argparse.Namespace) -> None:
    quota = {"quota.kube-vgpu.io/vgpu-number": "1000000", "quota.kube-vgpu.io/vgpu-memory": "1000000000"}
    labels = quota if args.quota else {}
    for name in [f"team-{n}" for n in range(NAMESPACES)] + [REVIEW_NAMESPACE]:
        api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    for i in range(args.nodes):
        api.put(node(i))
    for i in range(args.pods):
        api.put(vgpu_pod(i, namespace=f"team-{i % NAMESPACES}"))


def ratio_row(label: str, floor: Run | None, ours: Run) -> str:
    if floor is None:
        return (
            f"| {label} | - | {ours.rps:,.0f} | {ours.p50_ms:.2f} | {ours.p99_ms:.2f} | - | - "
            f"| - / {ours.cpu_us:.0f} | - |"
        )
    return (
        f"| {label} | {floor.rps:,.0f} / {floor.p50_ms:.2f} / {floor.p99_ms:.2f} "
        f"| {ours.rps:,.0f} | {ours.p50_ms:.2f} | {ours.p99_ms:.2f} "
        f"| {ours.rps / floor.rps:.0%} | {ours.p99_ms / floor.p99_ms:.1f}x "
        f"| {floor.cpu_us:.0f} / {ours.cpu_us:.0f} | {floor.cpu_us / ours.cpu_us:.0%} |"
    )


def profile_run(
    args: argparse.Namespace, proc: subprocess.Popen[bytes], url: str, body: Path, ca: Path
) -> None:
    """A /mutate run under py-spy (when installed) writing `args.profile`."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return  # the webhook runs under cProfile instead, written on exit
    recorder = subprocess.Popen(
        [
            spy,
            "record",
            "--pid",
            str(proc.pid),
            "--output",
            args.profile,
            "--format",
            "speedscope",
            "--rate",
            "200",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1)
    load(args, url, body, ca, 8, pid=proc.pid)
    recorder.send_signal(signal.SIGINT)
    recorder.wait(timeout=60)


def write_bodies(url: str, context: ssl.SSLContext, workdir: Path) -> dict[str, Path]:
    """The review of each phase in a file: the pod as created, and as the validating phase sees it."""
    review = review_of(inference_pod())
    bodies = {"mutate": workdir / "mutate.json", "validate": workdir / "validate.json"}
    # Compact, as the API server's Go encoder writes it.
    bodies["mutate"].write_bytes(json.dumps(review, separators=(",", ":")).encode())
    answer = asyncio.run(review_once(url, context, bodies["mutate"].read_bytes()))
    mutated = jsonpatch.apply_patch(review["request"]["object"], decode_patch(answer))
    review["request"]["object"] = validate_object(mutated)
    bodies["validate"].write_bytes(json.dumps(review, separators=(",", ":")).encode())
    sizes = {phase: body.stat().st_size for phase, body in bodies.items()}
    print(f"review bodies: /mutate {sizes['mutate']} B, /validate {sizes['validate']} B")
    return bodies


def start_floor(
    args: argparse.Namespace, floor_cmd: str, workdir: Path, context: ssl.SSLContext
) -> tuple[subprocess.Popen[bytes], str]:
    """The floor server on the servers' core with the same certificate; (process, URL)."""
    port = free_port()
    command = floor_cmd.format(addr=f"127.0.0.1:{port}", cert=workdir / "tls.crt", key=workdir / "tls.key")
    floor = subprocess.Popen(pinned(args.server_cpu, shlex.split(command)), stdout=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}"
    wait_floor(url, context, floor, 60)
    return floor, url


def start_bare(
    args: argparse.Namespace, workdir: Path, context: ssl.SSLContext, kubeconfig: Path | None
) -> tuple[subprocess.Popen[bytes], str]:
    """bench/bare_aiohttp.py on the servers' core with the same certificate, deciding on the API
    server of `kubeconfig` when given (it listens once its cache has synced); (process, URL)."""
    port = free_port()
    command = [
        sys.executable, str(REPO / "bench" / "bare_aiohttp.py"), "--addr", f"127.0.0.1:{port}",
        "--cert", str(workdir / "tls.crt"), "--key", str(workdir / "tls.key"),
    ]  # fmt: skip
    if kubeconfig is not None:
        command += ["--kubeconfig", str(kubeconfig)]
    bare = subprocess.Popen(pinned(args.server_cpu, command), stdout=subprocess.DEVNULL)
    url = f"https://127.0.0.1:{port}"
    wait_floor(url, context, bare, 600)
    return bare, url


def same_answers(urls: tuple[str, str], context: ssl.SSLContext, bodies: dict[str, Path]) -> None:
    """Stop unless both servers answer each phase's review alike (allowed, patch, warnings): a
    server deciding on a cache that has not synced would answer cheaper, and measure nothing."""
    for phase, body in bodies.items():
        answers = [asyncio.run(review_once(url, context, body.read_bytes(), phase)) for url in urls]
        first, second = (
            {key: answer["response"].get(key) for key in ("allowed", "patch", "warnings")}
            for answer in answers
        )
        if first != second:
            raise SystemExit(f"/{phase}: the servers answer differently: {first} and {second}")


# What the third server is, by --bare, in the printed table.
BARE_NAMES = {"aiohttp": "bare aiohttp", "decision": "aiohttp + decision, no layers"}
# (phase, concurrency) -> (floor, bare aiohttp, kube-vgpu)
Results = dict[tuple[str, int], tuple[Run | None, Run | None, Run]]


def measure(
    args: argparse.Namespace,
    servers: tuple[tuple[str, int] | None, tuple[str, int] | None, tuple[str, int]],
    bodies: dict[str, Path],
    ca: Path,
) -> Results:
    """Each phase at each concurrency: `rounds` runs of the floor, bare aiohttp and kube-vgpu, in turn."""
    floor_server, bare_server, (url, pid) = servers
    results: Results = {}
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        for phase in args.phases.split(","):
            floor_runs, bare_runs, our_runs = [], [], []
            for _ in range(args.rounds):  # A B C A B C: drift on the shared machine hits all alike
                if floor_server:
                    floor_url, floor_pid = floor_server
                    floor_runs.append(
                        load(args, floor_url + "/mutate", bodies[phase], ca, concurrency, pid=floor_pid)
                    )
                if bare_server:
                    bare_url, bare_pid = bare_server
                    bare_runs.append(
                        load(args, f"{bare_url}/{phase}", bodies[phase], ca, concurrency, pid=bare_pid)
                    )
                our_runs.append(load(args, f"{url}/{phase}", bodies[phase], ca, concurrency, pid=pid))
            floor = median_run(floor_runs) if floor_runs else None
            bare = median_run(bare_runs) if bare_runs else None
            results[(phase, concurrency)] = (floor, bare, median_run(our_runs))
            print(f"  measured /{phase} at concurrency {concurrency}", flush=True)
    return results


def report(args: argparse.Namespace, results: Results) -> int:
    """Print the table; the number of failed requests."""
    print()
    print(
        f"rounds {args.rounds} (median of each), server CPU {args.server_cpu or 'any'}, "
        f"load generator CPU {args.load_cpu or 'any'}, cpu count {os.cpu_count()}"
    )
    print(
        "| run | floor rps / p50 / p99 ms | kube-vgpu rps | p50 ms | p99 ms | rps vs floor | p99 vs floor "
        "| server CPU us/review floor / kube-vgpu | one-core throughput vs floor (by CPU) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    errors = 0
    for (phase, concurrency), (floor_run, _, ours) in results.items():
        print(ratio_row(f"/{phase}, concurrency {concurrency}", floor_run, ours))
        errors += ours.errors + (floor_run.errors if floor_run else 0)
    if any(bare for _, bare, _ in results.values()):
        print()
        print(
            f"| run | {BARE_NAMES[args.bare]} rps / p50 / p99 ms | CPU us/review | kube-vgpu rps vs bare "
            "| kube-vgpu CPU us/review over bare |"
        )
        print("|---|---|---|---|---|")
        for (phase, concurrency), (_, bare, ours) in results.items():
            if bare is None:
                continue
            errors += bare.errors
            print(
                f"| /{phase}, concurrency {concurrency} | {bare.rps:,.0f} / {bare.p50_ms:.2f} / "
                f"{bare.p99_ms:.2f} | {bare.cpu_us:.0f} | {ours.rps / bare.rps:.0%} "
                f"| +{ours.cpu_us - bare.cpu_us:.0f} |"
            )
    return errors


def replicas_main(args: argparse.Namespace) -> int:
    """`--quota --replicas N...`: the contended quota benchmark of bench/quota_replicas.py."""
    import quota_replicas  # bench/ is on sys.path when run as a script

    counts = [str(n) for n in args.replicas]
    return int(
        quota_replicas.main(
            [
                "--replicas",
                *counts,
                "--pods",
                str(args.reviews),
                "--concurrency",
                args.concurrency.split(",")[0],
            ]
        )
    )


def main() -> int:  # noqa: PLR0915 - one straight script: set up, measure, print
    args = parse_args()
    if args.replicas:
        return replicas_main(args)

    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-bench-"))
    floor_cmd = args.floor_cmd
    if args.floor_build_script:
        gowebhook, built_loadgen = build_tools(args.floor_build_script, workdir / "bin")
        args.loadgen = args.loadgen or built_loadgen
        floor_cmd = floor_cmd or f"{shlex.quote(gowebhook)} -addr {{addr}} -cert {{cert}} -key {{key}}"
    if floor_cmd == "none":
        floor_cmd = None
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "ca.crt").write_bytes(ca.cert_pem)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    use_spy = bool(args.profile) and shutil.which("py-spy", path=str(Path(sys.executable).parent)) is not None

    with ApiServerStandin() as api:
        started = time.perf_counter()
        fill(api, args)
        filled_s = time.perf_counter() - started
        print(f"stand-in API server filled: {args.nodes} nodes, {args.pods} pods in {filled_s:.1f} s")
        port = free_port()
        url = f"https://127.0.0.1:{port}"
        proc = start_webhook(args, api, workdir, port, None if use_spy else args.profile)
        floor: subprocess.Popen[bytes] | None = None
        bare: subprocess.Popen[bytes] | None = None
        try:
            sync_s = asyncio.run(wait_ready(url, context, proc, 600))
            rss_synced, _ = rss_mib(proc.pid)
            listed = f"{args.nodes} nodes + {args.pods} pods"
            print(f"cache synced (list of {listed}) in {sync_s:.1f} s; RSS {rss_synced:.0f} MiB")
            bodies = write_bodies(url, context, workdir)
            floor, floor_url = start_floor(args, floor_cmd, workdir, context) if floor_cmd else (None, None)
            floor_server = (floor_url, floor.pid) if floor is not None and floor_url else None
            deciding = workdir / "kubeconfig" if args.bare == "decision" else None
            bare, bare_url = (
                start_bare(args, workdir, context, deciding) if args.bare != "none" else (None, None)
            )
            if bare_url and deciding:
                same_answers((url, bare_url), context, bodies)
            bare_server = (bare_url, bare.pid) if bare is not None and bare_url else None
            results = measure(args, (floor_server, bare_server, (url, proc.pid)), bodies, workdir / "ca.crt")
            if args.profile and use_spy:
                profile_run(args, proc, url + "/mutate", bodies["mutate"], workdir / "ca.crt")
            rss_now, rss_peak = rss_mib(proc.pid)
        finally:
            if floor is not None:
                stop(floor)
            if bare is not None:
                stop(bare)
            code = stop(proc)

    errors = report(args, results)
    print()
    after = f"{rss_now:.0f} MiB after load (peak {rss_peak:.0f} MiB)"
    print(f"webhook RSS: {rss_synced:.0f} MiB synced, {after}; exit code on SIGTERM {code}")
    print(f"errors {errors}; webhook log: {workdir / 'webhook.log'}")
    if args.profile:
        print(f"profile: {args.profile} ({'py-spy speedscope' if use_spy else 'cProfile'})")
    return 0 if errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
