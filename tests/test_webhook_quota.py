"""Namespace GPU quotas at admission (SPEC §2 step 4): the gate, the ledger, the cache feeding it."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from test_webhook_support import A100, H100, gpu_node

from contract.config import ResourceNames
from contract.devices import DeviceRecord, encode_pod_devices
from contract.names import (
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    QUOTA_NUMBER_LABEL,
    USE_GPUTYPE,
    VGPU_IDS_NEW,
    VGPU_MODE,
)
from contract.resources import parse_pod
from webhook import gates
from webhook.inventory import Inventory
from webhook.quota import NamespaceQuota, placement_sizer
from webhook.quota_charge import Charge

NAMES = ResourceNames()
PENDING = 60.0
_uids = itertools.count()


@dataclass
class Clocks:
    """Both clocks the gate reads, moved by hand."""

    mono: float = 1000.0
    wall: float = 1_700_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


def make_pod(
    memory: int | None = 1024,
    *,
    number: int | None = None,
    percent: int | None = None,
    cores: int | None = None,
    name: str | None = None,
    generate_name: str | None = None,
    namespace: str = "team-a",
    uid: str | None = None,
    phase: str | None = None,
    annotations: Mapping[str, str] | None = None,
    deletion: tuple[str, int] | None = None,
) -> dict[str, Any]:
    limits = {
        key: str(value)
        for key, value in (
            (NAMES.count, number),
            (NAMES.memory, memory),
            (NAMES.memory_percentage, percent),
            (NAMES.cores, cores),
        )
        if value is not None
    }
    meta: dict[str, Any] = {"namespace": namespace, "annotations": dict(annotations or {})}
    if name is not None:
        meta["name"] = name
    if generate_name is not None:
        meta["generateName"] = generate_name
    if uid is not None:
        meta["uid"] = uid
    if deletion is not None:
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = deletion
    p: dict[str, Any] = {
        "metadata": meta,
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]},
    }
    if phase is not None:
        p["status"] = {"phase": phase}
    return p


def in_cache(p: Mapping[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """The pod as the cache shows it once created: with a uid, and a name picked from generateName."""
    meta = dict(p["metadata"])
    meta["uid"] = meta.get("uid") or f"uid-{next(_uids)}"
    meta["name"] = name or meta.get("name") or f"{meta.get('generateName', 'p-')}{next(_uids):05d}"
    return {**p, "metadata": meta}


def make_gate(clocks: Clocks | None = None, **kwargs: Any) -> NamespaceQuota:
    clocks = clocks or Clocks()
    return NamespaceQuota(
        names=NAMES,
        pending_seconds=PENDING,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
        **kwargs,
    )


def admit(
    gate: NamespaceQuota,
    p: Mapping[str, Any],
    labels: Mapping[str, str],
    *,
    gpu: int | None = 81920,
    dry_run: bool = False,
    review: str | None = None,
) -> str | None:
    return gate.admit(
        namespace=p["metadata"]["namespace"],
        namespace_labels=labels,
        pod=p,
        request=parse_pod(p, NAMES),
        largest_gpu_mib=gpu,
        review_uid=review or f"review-{next(_uids)}",
        dry_run=dry_run,
    )


MEM_80G = {QUOTA_MEMORY_LABEL: "81920"}


def test_the_issue_example_is_denied_word_for_word() -> None:
    gate = make_gate()
    for i in range(4):
        gate.ledger.pod_seen(in_cache(make_pod(16384, name=f"old-{i}")))
    message = admit(gate, make_pod(24576, name="new"), MEM_80G)
    assert message == (
        "namespace team-a: vgpu-memory quota exceeded: requested 24576 MiB, in use 65536 MiB of 81920 MiB"
    )


def test_a_pod_that_fills_the_quota_exactly_is_admitted_and_the_next_is_not() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(65536, name="old")))
    assert admit(gate, make_pod(16384, name="fits"), MEM_80G) is None
    assert gate.ledger.usage("team-a") == Charge(2, 81920, 0)
    assert "in use 81920 MiB of 81920 MiB" in (admit(gate, make_pod(1, name="one-more"), MEM_80G) or "")


def test_zero_allows_none_and_absent_labels_are_unlimited() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1, name="a"), {QUOTA_NUMBER_LABEL: "0"}) == (
        "namespace team-a: vgpu-number quota exceeded: requested 1 vGPU, in use 0 vGPUs of 0 vGPUs"
    )
    for i in range(50):
        assert admit(gate, make_pod(81920, number=8, cores=100, name=f"big-{i}"), {}) is None
    # A label on one resource leaves the others unlimited.
    assert admit(gate, make_pod(81920, number=8, cores=100, name="c"), {QUOTA_CORES_LABEL: "100000"}) is None


def test_cores_quota_counts_number_times_cores() -> None:
    gate = make_gate()
    labels = {QUOTA_CORES_LABEL: "400"}
    assert admit(gate, make_pod(1000, number=3, cores=100, name="a"), labels) is None
    assert admit(gate, make_pod(1000, number=2, cores=60, name="b"), labels) == (
        "namespace team-a: vgpu-cores quota exceeded: requested 120%, in use 300% of 400%"
    )
    assert admit(gate, make_pod(1000, number=2, cores=50, name="c"), labels) is None


@pytest.mark.parametrize("value", ["10Gi", "-1", "lots"])
def test_an_invalid_label_denies_every_vgpu_pod_naming_the_label(value: str) -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: value, QUOTA_NUMBER_LABEL: "100"}
    message = admit(gate, make_pod(1, name="tiny"), labels)
    assert message is not None and QUOTA_MEMORY_LABEL in message and "team-a" in message
    # A pod asking for no vGPU is not the quota's business.
    plain = {"metadata": {"namespace": "team-a", "name": "web"}, "spec": {"containers": [{"name": "c"}]}}
    assert admit(gate, plain, labels) is None
    assert gate.ledger.usage("team-a") == Charge()


def test_relabelling_a_namespace_takes_effect_on_the_next_review() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(40000, name="old")))
    assert admit(gate, make_pod(40000, name="a"), MEM_80G) is None
    assert admit(gate, make_pod(40000, name="b"), MEM_80G) is not None
    assert admit(gate, make_pod(40000, name="b"), {QUOTA_MEMORY_LABEL: "120000"}) is None
    assert admit(gate, make_pod(40000, name="c"), {QUOTA_MEMORY_LABEL: "120000"}) is not None
    assert admit(gate, make_pod(40000, name="c"), {}) is None  # label removed: unlimited
    assert admit(gate, make_pod(1, name="d"), {QUOTA_MEMORY_LABEL: "0"}) is not None


def test_percentages_count_against_the_largest_gpu_the_pod_could_land_on() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "61440"}
    # Restricted to 40 GiB cards: half a card is 20480 MiB; on an 80 GiB card it is 40960.
    assert admit(gate, make_pod(None, percent=50, name="small"), labels, gpu=40960) is None
    assert admit(gate, make_pod(None, percent=50, name="large"), labels, gpu=81920) is None
    assert gate.ledger.usage("team-a").memory_mib == 61440
    message = admit(gate, make_pod(None, percent=10, name="more"), labels, gpu=24576)
    assert message is not None and "requested 2457 MiB, in use 61440 MiB of 61440 MiB" in message


def test_a_share_of_a_card_with_no_gpu_to_size_it_is_denied_only_under_a_memory_quota() -> None:
    gate = make_gate()
    message = admit(gate, make_pod(None, percent=50, name="a"), MEM_80G, gpu=None)
    assert message is not None and "vgpu-memory" in message and "team-a" in message
    assert admit(gate, make_pod(None, percent=50, name="a"), {QUOTA_NUMBER_LABEL: "1"}, gpu=None) is None
    assert gate.ledger.usage("team-a") == Charge(1, 0, 0)


def test_a_deleted_pod_frees_its_share_at_once() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(81920, name="a"), MEM_80G) is None
    pod_a = in_cache(make_pod(81920, name="a"))
    gate.ledger.pod_seen(pod_a)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    gate.ledger.pod_gone(pod_a)
    assert gate.ledger.usage("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_terminal_pod_frees_its_share(phase: str) -> None:
    gate = make_gate()
    running = in_cache(make_pod(81920, name="job", phase="Running"))
    gate.ledger.pod_seen(running)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    done = {**running, "status": {"phase": phase}}
    gate.ledger.pod_seen(done)
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None
    # Later events about the finished pod, and its deletion, change nothing.
    gate.ledger.pod_seen(done)
    gate.ledger.pod_gone(done)
    assert gate.ledger.usage("team-a") == Charge(1, 81920, 0)


def test_a_terminating_pod_counts_until_its_grace_period_has_passed_twice_like_kubernetes() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    # deletionTimestamp is already now + grace; Kubernetes' quota adds the grace period once more.
    stamp = "2023-11-14T22:13:50+00:00"  # == 1_700_000_030
    gate.ledger.pod_seen(in_cache(make_pod(81920, name="old", deletion=(stamp, 30))))
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    clocks.advance(59)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    clocks.advance(1)
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


def test_an_admitted_pod_that_never_appears_stops_counting_after_the_pending_time() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    assert admit(gate, make_pod(81920, generate_name="job-"), MEM_80G) is None
    clocks.advance(PENDING - 0.5)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    assert gate.ledger.reserved("team-a") == Charge(1, 81920, 0)
    clocks.advance(0.5)
    assert gate.ledger.reserved("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


def test_a_pod_appearing_in_the_cache_replaces_its_reservation_and_is_counted_once() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    labels = {QUOTA_MEMORY_LABEL: "4096"}
    assert admit(gate, make_pod(1024, name="named"), labels) is None
    assert admit(gate, make_pod(1024, generate_name="rs-abc-"), labels) is None
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 0)
    gate.ledger.pod_seen(in_cache(make_pod(1024, name="named")))
    gate.ledger.pod_seen(in_cache(make_pod(1024, generate_name="rs-abc-")))
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 0)
    assert gate.ledger.reserved("team-a") == Charge()
    # Long after the pending time, the pods still count: they are pods now, not reservations.
    clocks.advance(10 * PENDING)
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 0)


def test_generate_name_matching_prefers_the_identical_charge_then_the_oldest() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(3000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(5000, generate_name="other-"), {}) is None
    gate.ledger.pod_seen(in_cache(make_pod(3000, generate_name="w-")))
    assert gate.ledger.reserved("team-a") == Charge(2, 6000, 0)  # the 3000 reservation retired
    # A pod whose charge matches none of its prefix (sized differently) retires the oldest.
    gate.ledger.pod_seen(in_cache(make_pod(1500, generate_name="w-")))
    assert gate.ledger.reserved("team-a") == Charge(1, 5000, 0)
    # Another prefix, or a name that does not start with the prefix, claims nothing.
    gate.ledger.pod_seen(in_cache(make_pod(5000, generate_name="w-")))
    gate.ledger.pod_seen(in_cache(make_pod(5000, generate_name="other-"), name="renamed"))
    assert gate.ledger.reserved("team-a") == Charge(1, 5000, 0)


def test_later_events_for_a_known_pod_claim_no_further_reservation() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    first = in_cache(make_pod(1000, generate_name="w-"))
    for phase in ("Pending", "Running", "Running"):
        gate.ledger.pod_seen({**first, "status": {"phase": phase}})
    assert gate.ledger.reserved("team-a") == Charge(1, 1000, 0)
    assert gate.ledger.usage("team-a") == Charge(2, 2000, 0)


def test_a_retried_review_or_a_second_create_of_one_name_is_booked_once() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "2048"}
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r2") is not None
    other = make_gate()
    assert admit(other, make_pod(2048, name="x"), labels) is None
    assert admit(other, make_pod(2048, name="x"), labels) is None
    assert other.ledger.usage("team-a") == Charge(1, 2048, 0)


def test_dry_run_is_decided_the_same_way_and_reserves_nothing() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(65536, name="old")))
    assert admit(gate, make_pod(16384, name="a"), MEM_80G, dry_run=True) is None
    assert admit(gate, make_pod(16385, name="a"), MEM_80G, dry_run=True) == (
        "namespace team-a: vgpu-memory quota exceeded: requested 16385 MiB, in use 65536 MiB of 81920 MiB"
    )
    assert gate.ledger.usage("team-a") == Charge(1, 65536, 0)
    assert gate.ledger.reserved("team-a") == Charge()


def test_namespaces_are_counted_apart() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(81920, name="a", namespace="team-a"), MEM_80G) is None
    assert admit(gate, make_pod(81920, name="a", namespace="team-b"), MEM_80G) is None
    assert admit(gate, make_pod(1, name="b", namespace="team-b"), MEM_80G) is not None


def test_init_containers_are_charged_as_kubernetes_counts_them() -> None:
    gate = make_gate()
    p = make_pod(1000, name="with-init")
    p["spec"]["initContainers"] = [
        {"name": "warm", "resources": {"limits": {NAMES.count: "2", NAMES.memory: "8000"}}}
    ]
    labels = {QUOTA_MEMORY_LABEL: "16000", QUOTA_NUMBER_LABEL: "2"}
    assert admit(gate, p, labels) is None
    assert gate.ledger.usage("team-a") == Charge(2, 16000, 0)
    gate.ledger.pod_seen(in_cache(p))
    assert gate.ledger.usage("team-a") == Charge(2, 16000, 0)


def test_a_pods_charge_is_frozen_until_the_scheduler_books_it() -> None:
    sizes = {"gpu": 81920}
    gate = make_gate(gpu_size=lambda pod: sizes["gpu"])
    cached = in_cache(make_pod(None, percent=50, name="pct"))
    gate.ledger.pod_seen(cached)
    assert gate.ledger.usage("team-a").memory_mib == 40960
    sizes["gpu"] = 24576  # the big nodes went away; the pod's usage does not drift
    gate.ledger.pod_seen({**cached, "status": {"phase": "Pending"}})
    assert gate.ledger.usage("team-a").memory_mib == 40960
    booking = encode_pod_devices([[DeviceRecord("GPU-aaaaaaaa-0000-0000-0000-000000000001", 12288, 0)]])
    booked = {**cached, "metadata": {**cached["metadata"], "annotations": {VGPU_IDS_NEW: booking}}}
    gate.ledger.pod_seen(booked)
    assert gate.ledger.usage("team-a").memory_mib == 12288


def test_a_pod_sized_at_admission_keeps_that_size_when_it_appears() -> None:
    gate = make_gate(gpu_size=lambda pod: 40960)  # the cache-side sizer now sees smaller cards
    assert admit(gate, make_pod(None, percent=50, name="pct"), {}, gpu=81920) is None
    gate.ledger.pod_seen(in_cache(make_pod(None, percent=50, name="pct")))
    assert gate.ledger.usage("team-a").memory_mib == 40960  # 50 % of 81920, as admitted


def test_a_pod_unsized_at_admission_is_sized_when_it_appears() -> None:
    gate = make_gate(gpu_size=lambda pod: 81920)
    assert admit(gate, make_pod(None, percent=50, name="pct"), {}, gpu=None) is None
    assert gate.ledger.usage("team-a").memory_mib == 0
    gate.ledger.pod_seen(in_cache(make_pod(None, percent=50, name="pct")))
    assert gate.ledger.usage("team-a").memory_mib == 40960


def test_a_relist_drops_pods_that_are_gone_and_keeps_the_rest() -> None:
    gate = make_gate()
    keep = in_cache(make_pod(1000, name="keep"))
    gone = in_cache(make_pod(2000, name="gone"))
    elsewhere = in_cache(make_pod(4000, name="x", namespace="team-b"))
    for p in (keep, gone, elsewhere):
        gate.ledger.pod_seen(p)
    assert admit(gate, make_pod(500, generate_name="new-"), {}) is None
    new = in_cache(make_pod(500, generate_name="new-"))
    gate.ledger.resync([keep, new])
    assert gate.ledger.usage("team-a") == Charge(2, 1500, 0)
    assert gate.ledger.reserved("team-a") == Charge()
    assert gate.ledger.usage("team-b") == Charge()
    assert set(gate.ledger.namespaces()) == {"team-a"}


def test_pods_without_vgpu_or_unreadable_are_not_counted() -> None:
    gate = make_gate()
    plain = {"metadata": {"namespace": "team-a"}, "spec": {"containers": [{"name": "c"}]}}
    malformed = make_pod(None, name="bad")
    malformed["spec"]["containers"][0]["resources"]["limits"] = {NAMES.memory: "3Gi"}
    for p in (plain, malformed):
        gate.ledger.pod_seen(in_cache(p))
    gate.ledger.pod_seen({"metadata": {"namespace": "team-a", "name": "no-uid"}})
    assert gate.ledger.usage("team-a") == Charge()
    assert gate.ledger.namespaces() == []


async def _review(gate: NamespaceQuota, index: int, labels: Mapping[str, str], rng: random.Random) -> bool:
    """One review as the webhook handles it: awaits around a synchronous gate call."""
    for _ in range(rng.randrange(4)):
        await asyncio.sleep(0)  # parsing, the cache lookup, other reviews interleaving
    p = make_pod(1024, cores=10, generate_name="burst-")
    verdict = gate.admit(
        namespace="team-a",
        namespace_labels=labels,
        pod=p,
        request=parse_pod(p, NAMES),
        largest_gpu_mib=81920,
        review_uid=f"burst-{index}",
        dry_run=False,
    )
    await asyncio.sleep(0)
    if verdict is None and rng.random() < 0.5:
        gate.ledger.pod_seen(in_cache(p))  # some admitted pods reach the cache mid-burst
    return verdict is None


@pytest.mark.parametrize("seed", range(20))
async def test_two_hundred_concurrent_reviews_admit_exactly_what_the_quota_fits(seed: int) -> None:
    gate = make_gate()
    # 3 older pods hold 3 GiB; the quota leaves room for exactly 37 more 1 GiB pods (and cores for more).
    for i in range(3):
        gate.ledger.pod_seen(in_cache(make_pod(1024, cores=10, name=f"old-{i}")))
    labels = {QUOTA_MEMORY_LABEL: str(40 * 1024), QUOTA_CORES_LABEL: "1000"}
    rng = random.Random(seed)
    results = await asyncio.gather(*(_review(gate, i, labels, rng) for i in range(200)))
    assert sum(results) == 37
    assert gate.ledger.usage("team-a") == Charge(40, 40 * 1024, 400)


def test_the_gate_is_the_quota_step_the_admission_pipeline_calls() -> None:
    step: gates.QuotaGate = make_gate()  # mypy checks the Protocol; the call checks the keywords
    p = make_pod(1024, name="a")
    assert step.admit(
        namespace="team-a",
        namespace_labels={QUOTA_NUMBER_LABEL: "0"},
        pod=p,
        request=parse_pod(p, NAMES),
        largest_gpu_mib=None,
        review_uid="r",
        dry_run=False,
    )


def test_cache_pods_are_sized_against_the_largest_gpu_their_selectors_allow() -> None:
    inventory = Inventory()
    inventory.upsert(gpu_node("small", "hami-core", [(A100, 40960)]))
    inventory.upsert(gpu_node("big", "hami-core", [(H100, 81920)]))
    size = placement_sizer(lambda: inventory, NAMES, "hami-core")
    anywhere = in_cache(make_pod(None, percent=50, name="any"))
    on_a100 = in_cache(make_pod(None, percent=50, name="a100", annotations={USE_GPUTYPE: "A100"}))
    assert (size(anywhere), size(on_a100)) == (81920, 40960)
    gate = make_gate(gpu_size=size)
    gate.ledger.pod_seen(anywhere)
    gate.ledger.pod_seen(on_a100)
    assert gate.ledger.usage("team-a").memory_mib == 40960 + 20480
    broken = in_cache(make_pod(None, percent=50, name="x", annotations={VGPU_MODE: "fast"}))
    assert size(broken) is None
