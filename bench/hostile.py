"""Hostile traffic against a real `kube-vgpu webhook` process: fuzzed reviews, a worst-case legal pod,
and a flood of idle TLS connections.

The stand-in API server (in this process) holds a few GPU nodes; the webhook runs as its own
process. Printed: answers by status class (5xx must be 0, and no answer may be an "internal
error" denial), the webhook's RSS before and after, the time of the worst-case legal pod, and
its RSS with N idle connections opened (at the connection cap the longest idle are closed to admit
new ones), and whether a review on a new connection is answered after them; then the same with
connections that each send a request and, in the same write, the largest part of a next head the
webhook holds (`--held-heads`), which never ends; then with connections left idle after one gzip
review each that inflates to 1 MiB (`--idle-after-large`).

    .venv/bin/python bench/hostile.py                     # 100,000 reviews, 5,000 idle connections
    .venv/bin/python bench/hostile.py --quick             # 5,000 reviews, 1,500 idle connections
    .venv/bin/python bench/hostile.py --paths /mutate,/validate
    .venv/bin/python bench/hostile.py --tenant-flood      # one namespace floods, another's p50/p99

Every body is a pure function of (--seed, its index), so a failing body can be regenerated.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import importlib.util
import json
import multiprocessing
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_vgpu.certs.issue import issue_ca, issue_serving  # noqa: E402
from kube_vgpu.httpedge.listener import MAX_FIELD_BYTES, MAX_HEADERS  # noqa: E402
from kube_vgpu.standins.apiserver.server import ApiServerStandin  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_webhook", REPO / "bench" / "webhook.py")
assert _spec is not None and _spec.loader is not None
bench_webhook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_webhook)

BODY_LIMIT = 3 * 1024 * 1024
NAMESPACES = ["default", "team-a", "team-b"]
Body = tuple[bytes, dict[str, str]]  # (body, extra headers)


def envelope(request: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def known_uuids() -> list[str]:
    """The GPU UUIDs of one stand-in node."""
    prefix = "gpu-uuid.kube-vgpu.io/"
    return [
        k.removeprefix(prefix) for k in bench_webhook.node(1)["metadata"]["labels"] if k.startswith(prefix)
    ]


def valid_review(rng: random.Random, index: int) -> dict[str, Any]:
    namespace = rng.choice(NAMESPACES)
    annotations = rng.choice(
        [
            {},
            {"nvidia.com/use-gputype": "A100"},
            {"nvidia.com/nouse-gputype": "H100"},
            {"volcano.sh/vgpu-mode": "mig"},
            {"nvidia.com/use-gpuuuid": known_uuids()[0]},
        ]
    )
    obj = bench_webhook.vgpu_pod(index, namespace=namespace, annotations=annotations)
    obj.pop("status", None)
    obj["spec"].pop("schedulerName", None)
    return envelope(
        {
            "uid": f"hostile-{index}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": namespace,
            "name": obj["metadata"]["name"],
            "object": obj,
            "dryRun": rng.random() < 0.5,
        }
    )


# Where a wrong type can be put in a review (each is a path of keys and list indexes).
TYPED_PATHS: list[tuple[str | int, ...]] = [
    ("request",),
    ("request", "uid"),
    ("request", "kind"),
    ("request", "operation"),
    ("request", "namespace"),
    ("request", "dryRun"),
    ("request", "object"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "name"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "spec", "containers", 0),
    ("request", "object", "spec", "containers", 0, "name"),
    ("request", "object", "spec", "containers", 0, "resources"),
    ("request", "object", "spec", "containers", 0, "resources", "limits"),
    ("request", "object", "spec", "containers", 0, "resources", "limits", "volcano.sh/vgpu-memory"),
    ("request", "object", "spec", "nodeName"),
    ("request", "object", "spec", "affinity"),
]
WRONG_VALUES: list[Any] = [None, 0, -1, 2**63, 1.5, True, "", "x", [], [1, "a"], {}, {"a": {"b": []}}]


def _set(doc: Any, path: tuple[str | int, ...], value: Any) -> None:
    node = doc
    for key in path[:-1]:
        node = node[key] if isinstance(key, int) else node.setdefault(key, {})
        if not isinstance(node, dict | list):
            return
    fits_list = isinstance(node, list) and isinstance(path[-1], int) and path[-1] < len(node)
    if fits_list or isinstance(node, dict):
        node[path[-1]] = value


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def fuzzed(seed: int, index: int) -> Body:
    """The body number `index`: about a third valid, the rest malformed or hostile in one way."""
    rng = random.Random(seed * 1_000_003 + index)
    doc = valid_review(rng, index)
    kind = rng.randrange(16)
    if kind <= 4:
        return _json(doc), {}
    if kind == 5:
        return rng.randbytes(rng.randrange(1, 512)), {}
    if kind == 6:
        data = _json(doc)
        return data[: rng.randrange(len(data))], {}
    if kind == 7:
        depth = rng.choice([101, 1000, 10_000, 200_000])
        opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
        inner = opener * depth + b"1" + closer * depth
        return (
            inner if rng.random() < 0.5 else _json(doc).replace(b'"dryRun"', b'"x": ' + inner + b', "dryRun"')
        ), {}
    if kind == 8:
        number = rng.choice(["9" * rng.randrange(25, 6000), "1e999", "-1e999", "NaN", "Infinity"])
        return _json(doc).replace(b'"dryRun": ', f'"n": {number}, "dryRun": '.encode()), {}
    if kind == 9:
        choice = rng.randrange(4)
        if choice == 0:
            return b'{"a": "' + bytes([rng.randrange(0x80, 0x100)]) + b'"}', {}
        if choice == 1:
            return _json(doc).decode().encode("utf-16"), {}
        text = json.dumps(doc).replace('"default"', '"\\ud800"').replace('"team-a"', '"a\\udfffb"')
        return text.replace('"pod-', '"p\\ud83d\\n\\"od-').encode(), {}
    if kind == 10:
        _set(doc, rng.choice(TYPED_PATHS), rng.choice(WRONG_VALUES))
        return _json(doc), {}
    if kind == 11:
        encoding = rng.choice(["gzip", "deflate"])
        if rng.random() < 0.5:
            return rng.randbytes(rng.randrange(1, 256)), {"Content-Encoding": encoding}
        data = gzip.compress(_json(doc)) if encoding == "gzip" else zlib.compress(_json(doc))
        return data, {"Content-Encoding": encoding}
    if kind == 12:
        marker = rng.choice(["[" * 5000 + "]" * 5000, json.dumps([{"key": {"k": []}, "operator": 1}])])
        doc["request"]["object"]["metadata"].setdefault("annotations", {})["kube-vgpu.io/node-affinity"] = (
            marker
        )
        return _json(doc), {}
    if kind == 13:
        doc["request"]["namespace"] = doc["request"]["object"]["metadata"]["namespace"] = f"forged-{index}"
        return _json(doc), {}
    if kind == 14:
        limits = doc["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]
        limits["volcano.sh/vgpu-memory"] = rng.choice(["9" * 5000, "3Gi", "-1", "0.5", "1e30", "", "\ud800"])
        return _json(doc), {}
    if rng.random() < 0.02:  # over the body limit, rarely: each one is 3 MiB on the wire
        return b" " * (BODY_LIMIT + 1), {}
    doc["request"]["operation"] = rng.choice(["UPDATE", "DELETE", "CONNECT"])
    return _json(doc), {}


def worst_legal_review(terms: int, uuids: int, containers: int) -> bytes:
    """A pod with `terms` own nodeSelectorTerms, `uuids` GPU UUIDs (known and unknown) and `containers`."""
    rng = random.Random(7)
    doc = valid_review(rng, 0)
    pod = doc["request"]["object"]
    chosen = (known_uuids() + [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(uuids)])[:uuids]
    pod["metadata"]["annotations"] = {"volcano.sh/vgpu-use-gpuuuid": ",".join(chosen)}
    pod["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"limits": {"volcano.sh/vgpu-memory": "1024"}}}
        for i in range(containers)
    ]
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": f"zone-{i}", "operator": "Exists"}]} for i in range(terms)
                ]
            }
        }
    }
    return _json(doc)


async def fuzz(
    url: str, context: ssl.SSLContext, paths: list[str], count: int, *, seed: int, concurrency: int
) -> tuple[Counter[str], list[str], float]:
    """Send `count` fuzzed bodies; (answers by class, the first few failures, seconds)."""
    classes: Counter[str] = Counter()
    failures: list[str] = []
    indexes = iter(range(count))
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for index in indexes:
                body, headers = fuzzed(seed, index)
                path = paths[index % len(paths)]
                headers = {"Content-Type": "application/json"} | headers
                try:
                    async with session.post(url + path, data=body, headers=headers) as response:
                        raw = await response.read()
                        status = response.status
                except aiohttp.ClientError:
                    classes["connection closed early"] += 1  # e.g. a 413 answered mid-upload
                    continue
                classes[f"{status // 100}xx"] += 1
                if status >= 500 or (status == 200 and b"internal error" in raw):
                    classes["internal error"] += status == 200
                    if len(failures) < 5:
                        failures.append(f"seed {seed} index {index} {path}: {status} {raw[:200]!r}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return classes, failures, time.perf_counter() - started


async def time_review(url: str, context: ssl.SSLContext, body: bytes, repeat: int) -> tuple[float, int, str]:
    """(median seconds, status, outcome) of `repeat` sends of one body on a keep-alive connection."""
    times = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=1)) as session:
        for _ in range(repeat):
            started = time.perf_counter()
            async with session.post(
                url + "/mutate", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                raw = await r.read()
            times.append(time.perf_counter() - started)
    answer = json.loads(raw)
    response = answer.get("response", {})
    outcome = (
        "allowed"
        if response.get("allowed")
        else f"denied: {response.get('status', {}).get('message', answer)}"
    )
    return statistics.median(times), r.status, outcome[:160]


# --- tenant flood: one namespace's heavy dry-run reviews against another's ordinary ones ----------

FLOOD_NAMESPACE, ORDINARY_NAMESPACE = "team-a", "team-b"


def heavy_reviews() -> list[tuple[str, bytes]]:
    """The flooding namespace's dry-run CREATEs: (what, body). Issue 22's two pods (20,000
    containers, 1.8 MiB; 40,000 hostPath volumes), and the heaviest shape the default limits let
    through whole (256 containers of 100 mounts each), which every rule then walks."""
    limits = {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "1k"}

    def review(what: str, spec: dict[str, Any]) -> tuple[str, bytes]:
        obj = {"metadata": {"name": what, "namespace": FLOOD_NAMESPACE}, "spec": spec}
        request = {
            "uid": f"flood-{what}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": FLOOD_NAMESPACE,
            "name": what,
            "object": obj,
            "dryRun": True,
        }
        return what, _json(envelope(request))

    wide = [
        {"name": f"c{i}", "resources": {"limits": {"volcano.sh/vgpu-memory": "1k"}}} for i in range(20_000)
    ]
    hosts = [{"name": f"h{i}", "hostPath": {"path": f"/srv/data/{i}"}} for i in range(40_000)]
    mounts = [{"name": f"v{j}", "mountPath": f"/data/{j}"} for j in range(100)]
    under = [{"name": f"c{i}", "resources": {"limits": limits}, "volumeMounts": mounts} for i in range(256)]
    volumes = [{"name": f"v{j}", "emptyDir": {}} for j in range(100)]
    return [
        review("containers-20000", {"containers": wide}),
        review(
            "hostpaths-40000",
            {"containers": [{"name": "c", "resources": {"limits": limits}}], "volumes": hosts},
        ),
        review("under-limits", {"containers": under, "volumes": volumes}),
    ]


def ordinary_review(index: int) -> bytes:
    """Another namespace's everyday pod: one vGPU container, a dry run, as the API server sends it."""
    doc = valid_review(random.Random(index), index)
    doc["request"]["namespace"] = ORDINARY_NAMESPACE
    doc["request"]["object"]["metadata"]["namespace"] = ORDINARY_NAMESPACE
    doc["request"]["dryRun"] = True
    return _json(doc)


async def _post(session: aiohttp.ClientSession, url: str, path: str, body: bytes) -> tuple[float, str]:
    """(seconds, outcome) of one review."""
    started = time.perf_counter()
    try:
        async with session.post(url + path, data=body, headers={"Content-Type": "application/json"}) as r:
            raw = await r.read()
    except aiohttp.ClientError as exc:
        return time.perf_counter() - started, f"HTTP none ({type(exc).__name__})"
    elapsed = time.perf_counter() - started
    if r.status != 200:
        return elapsed, f"HTTP {r.status}"
    answer = json.loads(raw)["response"]
    return elapsed, "allowed" if answer["allowed"] else "denied: " + answer["status"]["message"][:60]


async def _flood(url: str, ca_pem: str, flooders: int, seconds: float) -> Counter[str]:
    """`flooders` connections sending heavy dry runs at full speed, alternating /mutate and /validate."""
    heavy = heavy_reviews()
    outcomes: Counter[str] = Counter()
    context = ssl.create_default_context(cadata=ca_pem)
    connector = aiohttp.TCPConnector(ssl=context, limit=flooders)
    timeout = aiohttp.ClientTimeout(total=120)
    stop = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker(sent: int) -> None:
            while time.perf_counter() < stop:
                what, body = heavy[sent % len(heavy)]
                _, outcome = await _post(session, url, ("/mutate", "/validate")[sent // len(heavy) % 2], body)
                outcomes[f"{what}: {outcome}"] += 1
                sent += 1

        await asyncio.gather(*(worker(w) for w in range(flooders)))
    return outcomes


def _flood_process(url: str, ca_pem: str, flooders: int, seconds: float, out: Any) -> None:
    """The flooding tenant, a client process of its own (as another tenant's pods would be)."""
    out.put(dict(asyncio.run(_flood(url, ca_pem, flooders, seconds))))


async def tenant_flood(
    url: str, ca_pem: str, *, flooders: int, ordinary: int, seconds: float
) -> dict[str, Any]:
    """One namespace floods (`flooders` connections of heavy dry runs, in a process of its own) while
    `ordinary` connections of another namespace send everyday reviews; the latter's latencies are
    measured alone first (for half as long) and then during the flood."""
    context = ssl.create_default_context(cadata=ca_pem)
    outcomes: Counter[str] = Counter()
    connector = aiohttp.TCPConnector(ssl=context, limit=ordinary)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=120)
    ) as session:

        async def everyday(worker: int, stop: float, latencies: list[float]) -> None:
            index = worker * 1_000_000
            while time.perf_counter() < stop:
                elapsed, outcome = await _post(
                    session, url, ("/mutate", "/validate")[index % 2], ordinary_review(index)
                )
                if outcome.startswith("HTTP"):
                    outcomes[f"ordinary: {outcome}"] += 1
                latencies.append(elapsed)
                index += 1

        alone: list[float] = []
        stop = time.perf_counter() + seconds / 2
        await asyncio.gather(*(everyday(w, stop, alone) for w in range(ordinary)))
        spawn = multiprocessing.get_context("spawn")
        results = spawn.Queue()
        flood = spawn.Process(target=_flood_process, args=(url, ca_pem, flooders, seconds, results))
        flood.start()
        await asyncio.sleep(2.0)  # the flood process starting up (imports) and its bodies built
        during: list[float] = []
        stop = time.perf_counter() + seconds - 4.0
        await asyncio.gather(*(everyday(w, stop, during) for w in range(ordinary)))
        outcomes.update(await asyncio.to_thread(results.get, True, seconds + 120))
        await asyncio.to_thread(flood.join, 30)
    sizes = {what: len(body) for what, body in heavy_reviews()}
    return {"alone": alone, "during": during, "outcomes": outcomes, "sizes": sizes}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def print_tenant_flood(figures: dict[str, Any], flooders: int, ordinary: int, seconds: float) -> bool:
    """Print the flood's figures; True when the ordinary reviews' p99 stayed under one second."""
    sizes = ", ".join(f"{w} {size / 2**20:.2f} MiB" for w, size in figures["sizes"].items())
    print(f"tenant flood: {flooders} connections of {FLOOD_NAMESPACE} sending heavy dry runs ({sizes})")
    print(
        f"  to /mutate and /validate for {seconds:.0f} s; "
        f"{ordinary} connections of {ORDINARY_NAMESPACE} meanwhile"
    )
    for label in ("alone", "during"):
        latencies = figures[label]
        p50, p99 = _percentile(latencies, 0.5) * 1000, _percentile(latencies, 0.99) * 1000
        worst = max(latencies, default=float("nan")) * 1000
        print(
            f"  {ORDINARY_NAMESPACE} reviews {label:>6}: {len(latencies)} answered, p50 {p50:.1f} ms, "
            f"p99 {p99:.1f} ms, max {worst:.1f} ms, over 5 s: {sum(t > 5 for t in latencies)}"
        )
    for outcome, count in sorted(figures["outcomes"].items()):
        print(f"  {count:6d} x {outcome}")
    return _percentile(figures["during"], 0.99) < 1.0


def still_open(socks: list[ssl.SSLSocket]) -> int:
    """How many of `socks` the server has not closed."""
    count = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            if sock.recv(1):
                count += 1
        except (BlockingIOError, ssl.SSLWantReadError):
            count += 1
        except OSError:
            pass
    return count


def held_silent(socks: list[ssl.SSLSocket]) -> tuple[int, int]:
    """Of `socks`, those the server holds open without a word, and those it answered (an error)."""
    silent = answered = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            answered += sock.recv(16).startswith(b"HTTP/1.")
        except (BlockingIOError, ssl.SSLWantReadError):
            silent += 1
        except OSError:
            pass
    return silent, answered


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


class Opened(NamedTuple):
    """Connections opened by `open_connections`."""

    held: list[ssl.SSLSocket]  # those that got an answer, kept open
    ok: int  # of those, the answers that were HTTP 200
    refused: int  # closed, or failed, before any answer


def open_connections(port: int, context: ssl.SSLContext, count: int, write: bytes) -> Opened:
    """Open `count` TLS connections one after another, each sending `write` and reading the start of
    its first answer; those answered stay open."""
    held: list[ssl.SSLSocket] = []
    ok = refused = 0
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock = context.wrap_socket(raw, server_hostname="localhost")
            sock.sendall(write)
            answer = sock.recv(4096)
            if not answer:
                raise ConnectionError("closed")
            ok += answer.startswith(b"HTTP/1.1 200")
            held.append(sock)
        except (OSError, ssl.SSLError):
            raw.close()
            refused += 1
    return Opened(held, ok, refused)


def unfinished_head() -> bytes:
    """The largest head aiohttp holds unfinished within the webhook's bounds: Host and MAX_HEADERS - 1
    headers of a MAX_FIELD_BYTES value and a name half as long (a longer name is refused with the
    value), without the final empty line."""
    value = b"a" * MAX_FIELD_BYTES
    names = [f"X-{i:04d}-".encode().ljust(MAX_FIELD_BYTES // 2, b"n") for i in range(MAX_HEADERS - 1)]
    headers = b"".join(name + b": " + value + b"\r\n" for name in names)
    return b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n" + headers


def open_holding(port: int, context: ssl.SSLContext, count: int, write: bytes) -> list[ssl.SSLSocket]:
    """Open `count` TLS connections, each sending `write` as its first bytes and reading nothing."""
    held: list[ssl.SSLSocket] = []
    for _ in range(count):
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock = context.wrap_socket(raw, server_hostname="localhost")
            sock.sendall(write)
            held.append(sock)
        except (OSError, ssl.SSLError):
            raw.close()
    return held


def inflating_review(size: int, *, compressed: bool = True) -> bytes:
    """A POST of a valid review padded with spaces to `size` bytes, gzip-compressed (a few kB on the
    wire), or sent as it is."""
    plain = json.dumps(valid_review(random.Random(0), 0)).encode()
    body = plain[:-1] + b" " * (size - len(plain)) + b"}"
    encoding = ""
    if compressed:
        body = gzip.compress(body)
        encoding = "Content-Encoding: gzip\r\n"
    head = (
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"{encoding}Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


def main() -> int:  # noqa: PLR0915 - one straight script: set up, measure, print
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=100_000)
    parser.add_argument("--idle", type=int, default=5000, help="idle TLS connections to open")
    parser.add_argument(
        "--held-heads", type=int, default=1000, help="connections holding a never-finished head"
    )
    parser.add_argument(
        "--idle-after-large",
        type=int,
        default=1000,
        help="connections left idle after one gzip review that inflates to --inflated-kib",
    )
    parser.add_argument("--inflated-kib", type=int, default=1024, help="what that gzip review inflates to")
    parser.add_argument(
        "--plain-large", action="store_true", help="send that review as it is (--inflated-kib on the wire)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--paths", default="/mutate", help="comma list of admission paths to send to")
    parser.add_argument(
        "--worst-terms", type=int, default=100, help="the worst-case pod's own nodeSelectorTerms"
    )
    parser.add_argument("--worst-uuids", type=int, default=64, help="the worst-case pod's use-gpuuuid items")
    parser.add_argument("--worst-containers", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="5,000 reviews and 1,500 idle connections")
    parser.add_argument("--webhook-arg", action="append", default=[], help="extra flag for the webhook")
    parser.add_argument(
        "--tenant-flood",
        action="store_true",
        help="only the tenant flood: heavy dry runs against ordinary reviews",
    )
    parser.add_argument("--flooders", type=int, default=24, help="tenant flood: the flooding connections")
    parser.add_argument("--ordinary", type=int, default=2, help="tenant flood: the ordinary connections")
    parser.add_argument("--flood-seconds", type=float, default=30.0, help="tenant flood: how long it floods")
    args = parser.parse_args()
    if args.quick:
        args.reviews, args.idle = 5000, 1500
    paths = [p for p in args.paths.split(",") if p]

    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-hostile-"))
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    worst = worst_legal_review(args.worst_terms, args.worst_uuids, args.worst_containers)

    with ApiServerStandin() as api:
        for name in NAMESPACES[1:]:
            labels = {"quota.kube-vgpu.io/vgpu-number": "1000000"}
            api.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        for i in range(8):
            api.put(bench_webhook.node(i))
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        command = [
            sys.executable, "-m", "kube_vgpu", "webhook",
            "--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key"),
            "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(bench_webhook.free_port()),
            "--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig")),
            "--log-level", "warning", *args.webhook_arg,
        ]  # fmt: skip
        log = (workdir / "webhook.log").open("wb")
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        url = f"https://127.0.0.1:{port}"
        held: list[ssl.SSLSocket] = []  # every connection opened below, closed at the end
        try:
            asyncio.run(bench_webhook.wait_ready(url, context, proc, 120))
            if args.tenant_flood:
                figures = asyncio.run(
                    tenant_flood(
                        url,
                        ca.cert_pem.decode(),
                        flooders=args.flooders,
                        ordinary=args.ordinary,
                        seconds=args.flood_seconds,
                    )
                )
                return (
                    0 if print_tenant_flood(figures, args.flooders, args.ordinary, args.flood_seconds) else 1
                )
            rss_before, _ = bench_webhook.rss_mib(proc.pid)
            classes, failures, seconds = asyncio.run(
                fuzz(url, context, paths, args.reviews, seed=args.seed, concurrency=args.concurrency)
            )
            rss_after, rss_peak = bench_webhook.rss_mib(proc.pid)
            worst_s, worst_status, worst_outcome = asyncio.run(time_review(url, context, worst, 5))
            idle = open_connections(port, context, args.idle, HEALTHZ)
            held += idle.held
            rss_idle, _ = bench_webhook.rss_mib(proc.pid)
            valid = json.dumps(valid_review(random.Random(args.seed), 0)).encode()
            after_s, after_status, _ = asyncio.run(time_review(url, context, valid, 1))
            open_now = still_open(idle.held)
            heads = open_holding(port, context, args.held_heads, unfinished_head())
            held += heads
            time.sleep(1)
            rss_heads, _ = bench_webhook.rss_mib(proc.pid)
            heads_open, heads_answered = held_silent(heads)
            heads_after_s, heads_after_status, _ = asyncio.run(time_review(url, context, valid, 1))
            for sock in heads:
                sock.close()
            large_write = inflating_review(args.inflated_kib * 1024, compressed=not args.plain_large)
            large = open_connections(port, context, args.idle_after_large, large_write)
            held += large.held
            time.sleep(1)
            rss_after_large, _ = bench_webhook.rss_mib(proc.pid)
            large_open = still_open(large.held)
        finally:
            for sock in held:
                sock.close()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.close()
    tracebacks = (workdir / "webhook.log").read_text(errors="replace").count("Traceback")
    print(f"{args.reviews} fuzzed reviews (seed {args.seed}) to {','.join(paths)} in {seconds:.0f} s:")
    print("  " + ", ".join(f"{k} {v}" for k, v in sorted(classes.items())))
    for failure in failures:
        print("  FAILED " + failure)
    print(f"webhook RSS before {rss_before:.0f} MiB, after {rss_after:.0f} MiB (peak {rss_peak:.0f} MiB)")
    print(
        f"worst-case legal pod ({args.worst_terms} terms x {args.worst_uuids} UUIDs, "
        f"{args.worst_containers} containers, {len(worst) // 1024} KiB): {worst_s * 1000:.1f} ms, "
        f"HTTP {worst_status}, {worst_outcome}"
    )
    print(
        f"{args.idle} idle TLS connections opened one after another: {len(idle.held)} answered, "
        f"{idle.refused} refused, {open_now} still open at the end (the cap closes the longest idle); "
        f"webhook RSS {rss_idle:.0f} MiB"
    )
    print(f"a review on a new connection after them: HTTP {after_status} in {after_s * 1000:.1f} ms")
    print(
        f"{args.held_heads} TLS connections each holding a never-finished first head of "
        f"{len(unfinished_head())} bytes: {len(heads)} opened, {heads_open} held open unanswered, "
        f"{heads_answered} answered (an error); "
        f"webhook RSS {rss_heads:.0f} MiB; a review on a new connection after them: "
        f"HTTP {heads_after_status} in {heads_after_s * 1000:.1f} ms"
    )
    print(
        f"{args.idle_after_large} TLS connections idle after one {'plain' if args.plain_large else 'gzip'} "
        f"review each ({len(large_write)} bytes sent, {args.inflated_kib} KiB decoded): {large.ok} "
        f"answered 200, {large_open} kept open by the webhook (the rest closed after their answer, "
        "or by the cap); webhook RSS "
        f"{rss_after_large:.0f} MiB"
    )
    print(f"tracebacks in the webhook log: {tracebacks}; exit code on SIGTERM {code}")
    print(f"webhook log: {workdir / 'webhook.log'}")
    bad = classes["5xx"] + classes["internal error"] + tracebacks + (heads_after_status != 200)
    return 0 if bad == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
