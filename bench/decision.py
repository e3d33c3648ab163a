"""The webhook's per-review CPU cost in process, without HTTP: parse, decide and encode, per phase.

The same 2.8 KB inference-pod reviews `bench/webhook.py` sends (its builders, loaded from that file),
decided against a cache filled with its fleet of N GPU nodes and M vGPU pods in 50 namespaces. The
`/validate` body is the `/mutate` answer applied to the pod, with a uid and creation time, as the API
server sends it. Printed: microseconds per review for each step of each phase (the fastest of
five rounds). Decide is timed on a freshly parsed request each call, as the server decides one
(parse and decide, less parse alone): a request decided over and over would time warm attribute
caches and lazily built members that a real review never has.

The quota step is wired as the server wires it, with a shared reservation book; the bench's
namespaces set no quota, so the book is never asked (`NamespaceQuota.admit` returns first, as in the
server) and a stand-in that fails if it were serves.

    .venv/bin/python bench/decision.py                      # 50,000 pods, 5,000 nodes
    .venv/bin/python bench/decision.py --pods 2000 --profile  # plus a cProfile of both phases
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib.util
import pstats
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import jsonpatch
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_vgpu.contract.config import Config  # noqa: E402
from kube_vgpu.kubeapi.client import Kube  # noqa: E402
from kube_vgpu.kubeapi.listwatch import Listed, object_key  # noqa: E402
from kube_vgpu.webhook.admission.mutation import Admission  # noqa: E402
from kube_vgpu.webhook.admission.review import Verdict, encode_json, encode_response, parse_review  # noqa: E402
from kube_vgpu.webhook.admission.validation import Validation  # noqa: E402
from kube_vgpu.webhook.cache import CachedKind, ClusterCache  # noqa: E402
from kube_vgpu.webhook.metrics import WebhookMetrics  # noqa: E402
from kube_vgpu.webhook.quota.charge import ZERO, Charge  # noqa: E402
from kube_vgpu.webhook.quota.shared import Answer, Ask, NamespaceSnapshot, SharedBook  # noqa: E402
from kube_vgpu.webhook.service import build_quota, build_services  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_webhook", REPO / "bench" / "webhook.py")
assert _spec is not None and _spec.loader is not None
bench_webhook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_webhook)


Phases = tuple[Admission, Validation]


class UnaskedBook:
    """The shared reservation book of a server whose reviews all come from namespaces without quota:
    `NamespaceQuota.admit` answers those before asking it, so it is never asked (and says so if it is)."""

    async def decide(self, namespace: str, ask: Ask) -> Answer:
        raise AssertionError(f"namespace {namespace} sets no quota: the shared book is never asked")

    def in_flight(self, namespace: str) -> Charge:
        return ZERO

    def namespaces(self) -> list[str]:
        return []

    def forget(self, namespace: str) -> None:
        pass

    def namespaces_listed(self, exists: Callable[[str], bool]) -> None:
        pass


def _unasked_book(cache_state: Callable[[str], NamespaceSnapshot]) -> SharedBook:
    return UnaskedBook()


def filled_phases(nodes: int, pods: int) -> Phases:
    """The webhook's two decisions over a cache holding the bench's fleet and pods (no API server)."""
    # Never started, so it makes no API call: it is filled below as its reflector fills it.
    cache = ClusterCache(cast(Kube, None))
    # Built first, as the server builds them: the quota ledger hears of every pod the cache lists.
    metrics = WebhookMetrics()
    services = build_services(cache, Config(), metrics, build_quota(cache, Config(), metrics, _unasked_book))
    names = [f"team-{i}" for i in range(bench_webhook.NAMESPACES)] + [bench_webhook.REVIEW_NAMESPACE]
    metadata = [{"name": n, "labels": {}, "resourceVersion": "1"} for n in names]

    def listed(kind: CachedKind, objects: list[dict[str, Any]]) -> None:
        """Hand the cache a complete list as its reflector would: each object reduced as it arrives."""
        reduce = cache._reducers[kind]  # noqa: SLF001 (our own cache, driven as its watch would)
        kept = [(object_key(o), r) for o in objects if (r := reduce(o)) is not None]
        cache._on_list(kind, Listed(kept, "1", 1, len(objects), time.monotonic()))  # noqa: SLF001 (our own cache, driven as its watch would)

    listed("namespace", [{"apiVersion": "v1", "kind": "Namespace", "metadata": m} for m in metadata])
    listed("node", [bench_webhook.node(i) for i in range(nodes)])
    spread = bench_webhook.NAMESPACES
    listed("pod", [bench_webhook.vgpu_pod(i, namespace=f"team-{i % spread}") for i in range(pods)])
    return services.admission, services.validation


def review_bodies(admission: Admission) -> tuple[bytes, bytes]:
    """(/mutate body, /validate body) for the inference pod, the second built from the first's patch."""
    review = bench_webhook.review_of(bench_webhook.inference_pod())
    mutate = orjson.dumps(review)
    verdict = admission.review(parse_review(mutate))
    if not verdict.allowed:
        raise SystemExit(f"the bench pod was refused: {verdict.message}")
    mutated = jsonpatch.apply_patch(review["request"]["object"], list(verdict.patch))
    validate = orjson.dumps(bench_webhook.review_of(bench_webhook.validate_object(mutated)))
    return mutate, validate


# Each step runs in ROUNDS rounds of repeat/ROUNDS reviews and the fastest round is reported, as
# `timeit` advises: on a shared machine the slower rounds measure the other load, not the webhook.
ROUNDS = 5


def per_call_us(step: Callable[[], object], repeat: int) -> float:
    per_round = max(1, repeat // ROUNDS)
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(per_round):
            step()
        best = min(best, time.perf_counter() - started)
    return best / per_round * 1e6


async def per_await_us(step: Callable[[], Awaitable[object]], repeat: int) -> float:
    per_round = max(1, repeat // ROUNDS)
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for _ in range(per_round):
            await step()
        best = min(best, time.perf_counter() - started)
    return best / per_round * 1e6


async def measure(phases: Phases, bodies: tuple[bytes, bytes], repeat: int) -> None:
    admission, validation = phases
    for phase, body in zip(("mutate", "validate"), bodies, strict=True):
        request = parse_review(body)
        parse = per_call_us(partial(parse_review, body), repeat)
        if phase == "mutate":
            verdict = admission.review(request)
            both = per_call_us(partial(_mutate_fresh, admission, body), repeat)
        else:
            verdict = await validation.review(request)
            both = await per_await_us(partial(_validate_fresh, validation, body), repeat)
        decide = both - parse
        encode = per_call_us(partial(encode_answer, request.uid, verdict), repeat)
        print(
            f"{phase:8}  parse {parse:6.1f} us  decide {decide:6.1f} us  encode {encode:5.1f} us  "
            f"total {parse + decide + encode:6.1f} us  ({len(body)} B, allowed={verdict.allowed})"
        )


def _mutate_fresh(admission: Admission, body: bytes) -> Verdict:
    return admission.review(parse_review(body))


async def _validate_fresh(validation: Validation, body: bytes) -> Verdict:
    return await validation.review(parse_review(body))


def encode_answer(uid: str, verdict: Verdict) -> bytes:
    return encode_json(encode_response(uid, verdict))


async def profile(phases: Phases, bodies: tuple[bytes, bytes], repeat: int) -> None:
    admission, validation = phases
    mutate, validate = bodies
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(repeat):
        admission.review(parse_review(mutate))
        await validation.review(parse_review(validate))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=5000, help="GPU nodes in the cache")
    parser.add_argument("--pods", type=int, default=50_000, help="vGPU pods in the cache")
    parser.add_argument("--repeat", type=int, default=10_000, help="reviews per measured step")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of both phases")
    args = parser.parse_args()
    phases = filled_phases(args.nodes, args.pods)
    bodies = review_bodies(phases[0])
    asyncio.run(measure(phases, bodies, args.repeat))
    if args.profile:
        asyncio.run(profile(phases, bodies, args.repeat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
