"""The quota ledger fed by the cache: deletions, terminal pods, expiry, matching reservations to pods,
relists, and 200 concurrent reviews.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping

import pytest

from kube_vgpu.contract.devices import DeviceRecord, encode_pod_devices
from kube_vgpu.contract.names import QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, VGPU_IDS_NEW
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.quota.charge import Charge
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.shared import NEVER_CREATED_AFTER
from tests.support.webhook_quota import MEM_80G, NAMES, PENDING, Clocks, admit, in_cache, make_gate, make_pod


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
    assert gate.ledger.usage("team-a") == Charge(1, 81920, 100)


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
    assert gate.ledger.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.5)
    assert gate.ledger.reserved("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


def test_a_pod_appearing_in_the_cache_replaces_its_reservation_and_is_counted_once() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    labels = {QUOTA_MEMORY_LABEL: "4096"}
    assert admit(gate, make_pod(1024, name="named"), labels) is None
    assert admit(gate, make_pod(1024, generate_name="rs-abc-"), labels) is None
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 200)
    gate.ledger.pod_seen(in_cache(make_pod(1024, name="named")))
    gate.ledger.pod_seen(in_cache(make_pod(1024, generate_name="rs-abc-")))
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 200)
    assert gate.ledger.reserved("team-a") == Charge()
    # Long after the pending time, the pods still count: they are pods now, not reservations.
    clocks.advance(10 * PENDING)
    assert gate.ledger.usage("team-a") == Charge(2, 2048, 200)


def test_generate_name_matching_prefers_the_identical_charge_then_the_oldest() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(3000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(5000, generate_name="other-"), {}) is None
    gate.ledger.pod_seen(in_cache(make_pod(3000, generate_name="w-")))
    assert gate.ledger.reserved("team-a") == Charge(2, 6000, 200)  # the 3000 reservation retired
    # A pod whose charge matches none of its prefix (sized differently) retires the oldest.
    gate.ledger.pod_seen(in_cache(make_pod(1500, generate_name="w-")))
    assert gate.ledger.reserved("team-a") == Charge(1, 5000, 100)
    # Another prefix, or a name that does not start with the prefix, claims nothing.
    gate.ledger.pod_seen(in_cache(make_pod(5000, generate_name="w-")))
    gate.ledger.pod_seen(in_cache(make_pod(5000, generate_name="other-"), name="renamed"))
    assert gate.ledger.reserved("team-a") == Charge(1, 5000, 100)


def test_later_events_for_a_known_pod_claim_no_further_reservation() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    assert admit(gate, make_pod(1000, generate_name="w-"), {}) is None
    first = in_cache(make_pod(1000, generate_name="w-"))
    for phase in ("Pending", "Running", "Running"):
        gate.ledger.pod_seen({**first, "status": {"phase": phase}})
    assert gate.ledger.reserved("team-a") == Charge(1, 1000, 100)
    assert gate.ledger.usage("team-a") == Charge(2, 2000, 200)


def test_a_retried_review_or_a_second_create_of_one_name_is_booked_once() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "2048"}
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r2") is not None
    other = make_gate()
    assert admit(other, make_pod(2048, name="x"), labels) is None
    assert admit(other, make_pod(2048, name="x"), labels) is None
    assert other.ledger.usage("team-a") == Charge(1, 2048, 100)


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
    assert gate.ledger.usage("team-a") == Charge(2, 1500, 200)
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
    verdict = await gate.admit(
        namespace="team-a",
        namespace_labels=labels,
        pod=p,
        request=parse_pod(p, NAMES),
        largest_gpu_mib=81920,
        pod_uid=f"burst-{index}",
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


# -- a reservation whose pod never appears (a forged review) --------------------------------------------


class Watch:
    """The cache's pod list/watch as the ledger reads it: when it last confirmed it was current."""

    def __init__(self) -> None:
        self.current_at: float | None = None


def forged_gate(clocks: Clocks, watch: Watch) -> NamespaceQuota:
    """A gate whose reservations lapse at the staleness bound of the chart's default (120 s)."""
    return NamespaceQuota(
        names=NAMES,
        pending_seconds=120.0,
        clock=lambda: clocks.mono,
        wall_clock=lambda: clocks.wall,
        stream_current_at=lambda: watch.current_at,
    )


def test_a_forged_reservation_goes_65_s_after_the_admission_once_the_watch_is_past_it() -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    admitted_at = clocks.mono
    # A forged CREATE: a made-up uid, a pod that will never exist.
    assert admit(gate, make_pod(81920, name="ghost"), MEM_80G, review="forged-uid") is None
    # The watch keeps confirming it is current; up to the request timeout plus the delivery slack
    # the pod could still appear, so the reservation holds.
    clocks.advance(NEVER_CREATED_AFTER - 0.01)
    watch.current_at = clocks.mono
    assert admit(gate, make_pod(1, name="real"), MEM_80G) is not None
    assert gate.ledger.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.01)
    watch.current_at = admitted_at + NEVER_CREATED_AFTER
    assert gate.ledger.reserved("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="real"), MEM_80G) is None
    assert NEVER_CREATED_AFTER == 65.0  # the request timeout (60 s) and 5 s for the watch's delivery


def test_without_a_watch_past_the_admission_a_reservation_waits_for_the_staleness_bound() -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    watch.current_at = clocks.mono + 30  # the watch stopped 30 s after the admission (API down)
    assert admit(gate, make_pod(81920, name="ghost"), MEM_80G, review="forged-uid") is None
    clocks.advance(119.9)
    assert gate.ledger.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.1)
    assert gate.ledger.reserved("team-a") == Charge()


def test_a_pod_that_appears_is_matched_by_uid_and_never_released_early() -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    # Its generateName and name match nothing: only the uid ties the pod to its review.
    assert admit(gate, make_pod(81920, generate_name="job-"), MEM_80G, review="real-uid") is None
    clocks.advance(NEVER_CREATED_AFTER - 1)  # a slow create: stored just before the bound
    watch.current_at = clocks.mono
    gate.ledger.pod_seen(in_cache(make_pod(81920, generate_name="job-", uid="real-uid"), name="job-x1"))
    assert gate.ledger.reserved("team-a") == Charge()  # claimed, not released
    for _ in range(5):  # the watch goes on, far past the staleness bound
        clocks.advance(100)
        watch.current_at = clocks.mono
        assert gate.ledger.usage("team-a") == Charge(1, 81920, 100)
        assert admit(gate, make_pod(1, name="other"), MEM_80G) is not None
