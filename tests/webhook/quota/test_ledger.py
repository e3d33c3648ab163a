"""The quota ledger fed by the cache: deletions, terminal pods, expiry, matching reservations to pods,
relists, and 200 concurrent reviews.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from kube_vgpu.contract.devices import DeviceRecord, encode_pod_devices
from kube_vgpu.contract.names import MIG, QUOTA_CORES_LABEL, QUOTA_MEMORY_LABEL, VGPU_IDS_NEW, VGPU_MODE
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.quota.charge import Charge, SlotSize
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


# -- edges of the ledger's rules (mutation testing: docs/testing.md) -------------------------------------


def stamp(wall: float) -> str:
    """A deletionTimestamp for a wall-clock time."""
    return datetime.fromtimestamp(wall, tz=UTC).isoformat()


def terminating(p: dict[str, Any], at: float, grace: object = 0) -> dict[str, Any]:
    """`p` with a deletionTimestamp at wall time `at`, and `grace` as its grace period (ABSENT: none)."""
    meta = {**p["metadata"], "deletionTimestamp": stamp(at)}
    if grace is not ABSENT:
        meta["deletionGracePeriodSeconds"] = grace
    return {**p, "metadata": meta}


ABSENT = object()
ONE_GIB = Charge(1, 1024, 100)


@pytest.mark.parametrize("grace", [ABSENT, None, True, "30", 1.5])
def test_a_terminating_pod_without_a_whole_grace_period_stops_counting_at_its_deletion_timestamp(
    grace: object,
) -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    gate.ledger.pod_seen(terminating(in_cache(make_pod(1024, name="old")), clocks.wall + 10, grace))
    clocks.advance(9.5)
    assert gate.ledger.usage("team-a") == ONE_GIB
    clocks.advance(0.5)
    assert gate.ledger.usage("team-a") == Charge()


def test_a_pod_past_its_deadline_when_first_seen_is_never_counted_even_if_the_clock_steps_back() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    gate.ledger.pod_seen(terminating(in_cache(make_pod(1024, name="old")), clocks.wall))
    clocks.wall -= 5  # the node's clock is stepped back (NTP): the deadline was already judged
    assert gate.ledger.usage("team-a") == Charge()


def test_a_pod_that_starts_terminating_later_stops_counting_once_its_grace_has_passed() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    running = in_cache(make_pod(1024, name="old", phase="Running"))
    gate.ledger.pod_seen(running)
    gate.ledger.pod_seen(terminating(running, clocks.wall + 30))
    clocks.advance(29.5)
    assert gate.ledger.usage("team-a") == ONE_GIB
    clocks.advance(0.5)
    assert gate.ledger.usage("team-a") == Charge()


def test_a_terminating_pod_is_subtracted_once_whether_it_is_deleted_before_or_after_its_deadline() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    stays = in_cache(make_pod(2048, name="stays"))
    early = terminating(in_cache(make_pod(1024, name="early")), clocks.wall + 10)
    late = terminating(in_cache(make_pod(4096, name="late")), clocks.wall + 10)
    for p in (stays, early, late):
        gate.ledger.pod_seen(p)
    gate.ledger.pod_gone(early)  # deleted before its deadline: freed at once, once
    assert gate.ledger.usage("team-a") == Charge(2, 2048 + 4096, 200)
    clocks.advance(10)  # past the deadline of both: only the one still shown had to be uncounted
    assert gate.ledger.usage("team-a") == Charge(1, 2048, 100)
    gate.ledger.pod_seen(late)  # later events and the deletion of a pod already uncounted
    gate.ledger.pod_gone(late)
    assert gate.ledger.usage("team-a") == Charge(1, 2048, 100)


def test_a_terminating_pods_deadline_is_applied_while_reservations_are_live() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    gate.ledger.pod_seen(terminating(in_cache(make_pod(4096, name="old")), clocks.wall + 10))
    assert admit(gate, make_pod(1024, name="new"), {}) is None  # a live reservation
    clocks.advance(10)
    assert gate.ledger.usage("team-a") == ONE_GIB


def test_forgetting_a_namespace_keeps_the_others() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(1024, name="a")))
    gate.ledger.pod_seen(in_cache(make_pod(2048, name="b", namespace="team-b")))
    gate.ledger.forget("team-a")
    assert gate.ledger.namespaces() == ["team-b"]
    assert gate.ledger.usage("team-a") == Charge() and gate.ledger.usage("team-b") == Charge(1, 2048, 100)


def test_events_the_ledger_cannot_file_change_nothing() -> None:
    gate = make_gate()
    real = in_cache(make_pod(1024, name="real"))
    gate.ledger.pod_seen(real)
    no_uid = make_pod(2048, name="no-uid")  # a namespace but no uid
    no_namespace = in_cache(make_pod(2048, name="x"))
    del no_namespace["metadata"]["namespace"]
    odd_namespace = in_cache(make_pod(2048, name="y"))
    odd_namespace["metadata"]["namespace"] = ["team-a"]
    for p in (no_uid, no_namespace, odd_namespace, {"metadata": None}, {"metadata": ["x"]}):
        gate.ledger.pod_seen(p)
        gate.ledger.pod_gone(p)
    gate.ledger.pod_gone(in_cache(make_pod(2048, name="never-seen")))  # a known namespace, unknown uid
    gate.ledger.pod_gone(in_cache(make_pod(2048, name="z", namespace="team-z")))  # an unknown namespace
    assert gate.ledger.usage("team-a") == ONE_GIB
    gate.ledger.resync([real, odd_namespace, no_uid, {"metadata": None}])
    assert gate.ledger.usage("team-a") == ONE_GIB and gate.ledger.namespaces() == ["team-a"]


def test_the_cache_state_tells_shown_finished_and_deleted_pods_apart() -> None:
    clocks = Clocks()
    gate = make_gate(clocks, stream_current_at=lambda: 42.0)
    running = in_cache(make_pod(1024, name="run", uid="u-run", phase="Running"))
    gate.ledger.pod_seen(running)
    gate.ledger.pod_seen(in_cache(make_pod(2048, name="done", uid="u-done", phase="Succeeded")))
    deleted = in_cache(make_pod(4096, name="deleted", uid="u-deleted"))
    gate.ledger.pod_seen(deleted)
    gate.ledger.pod_gone(deleted)
    clocks.advance(10)
    gate.ledger.pod_seen(running)  # a later event: the pod is still shown since its first
    clocks.advance(20)
    state = gate.ledger.cache_state("team-a")
    assert state.pods == ONE_GIB  # the running pod alone
    assert state.stream_current_at == 42.0
    uids = ("u-run", "u-done", "u-deleted", "u-other")
    assert [state.accounts_for(u) for u in uids] == [True, True, True, False]
    assert [state.released(u) for u in uids] == [False, True, True, False]
    assert [state.shown_for(u) for u in uids] == [30.0, 30.0, None, None]
    # A namespace the ledger holds nothing for: no pods, and only the deletions it remembers.
    other = gate.ledger.cache_state("team-b")
    assert other.pods == Charge() and other.accounts_for("u-deleted") and not other.accounts_for("u-run")


def test_a_deleted_pod_is_remembered_for_two_reservation_lifetimes() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    deleted = in_cache(make_pod(1024, name="deleted", uid="u-deleted"))
    relisted_out = in_cache(make_pod(1024, name="relisted-out", uid="u-relisted-out"))
    gate.ledger.pod_seen(deleted)
    gate.ledger.pod_seen(relisted_out)
    gate.ledger.pod_gone(deleted)
    gate.ledger.resync([])  # the relist no longer shows it: deleted while the watch was down
    clocks.advance(2 * PENDING - 0.5)
    state = gate.ledger.cache_state("team-a")
    assert state.accounts_for("u-deleted") and state.released("u-deleted")
    assert state.accounts_for("u-relisted-out") and state.released("u-relisted-out")
    clocks.advance(0.5)
    state = gate.ledger.cache_state("team-a")
    assert not state.accounts_for("u-deleted") and not state.released("u-deleted")
    assert not state.accounts_for("u-relisted-out")


GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"


def booked(p: dict[str, Any], booking: str) -> dict[str, Any]:
    """`p` with the scheduler's `volcano.sh/vgpu-ids-new` booking."""
    return {
        **p,
        "metadata": {**p["metadata"], "annotations": {**p["metadata"]["annotations"], VGPU_IDS_NEW: booking}},
    }


def slot_of(mib: int) -> int:
    """A MIG geometry whose slots are 10 GiB or 20 GiB: the smallest that holds `mib`."""
    return 10240 if mib <= 10240 else 20480


def mig_slots(p: Mapping[str, Any]) -> SlotSize | None:
    """The slot sizer of a cluster whose `mig` pods get `slot_of`'s slots."""
    return slot_of if p["metadata"]["annotations"].get(VGPU_MODE) == MIG else None


def test_a_booking_the_ledger_can_check_replaces_the_sizing_of_a_share_of_a_card(
    caplog: pytest.LogCaptureFixture,
) -> None:
    on_40g = encode_pod_devices([[DeviceRecord(GPU_A, 20480, 0)]])
    gate = make_gate(gpu_memory={GPU_A: 40960}.get, slot_size=mig_slots)
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        gate.ledger.pod_seen(booked(in_cache(make_pod(None, percent=50, name="pct")), on_40g))
        # Booked on a known 40 GiB card: 20480 MiB, with no GPU size needed (none is known here).
        assert gate.ledger.usage("team-a") == Charge(1, 20480, 100)
        mig = in_cache(make_pod(None, percent=50, name="mig", annotations={VGPU_MODE: MIG}))
        gate.ledger.pod_seen(booked(mig, on_40g))
        assert gate.ledger.usage("team-a") == Charge(2, 40960, 200)
    assert not [r for r in caplog.records if "quota_pod_unsized" in r.getMessage()]


def test_a_booking_that_cannot_be_checked_keeps_the_charge_frozen_across_events() -> None:
    sizes = {"gpu": 81920}
    unknown_card = encode_pod_devices([[DeviceRecord(GPU_A, 20480, 0)]])  # no gpu_memory: not believed
    gate = make_gate(gpu_size=lambda pod: sizes["gpu"])
    pod = booked(in_cache(make_pod(None, percent=50, name="pct")), unknown_card)
    gate.ledger.pod_seen(pod)
    assert gate.ledger.usage("team-a").memory_mib == 40960
    sizes["gpu"] = 24576
    for _ in range(2):  # the same booking again and again: nothing to recompute
        gate.ledger.pod_seen(pod)
        assert gate.ledger.usage("team-a").memory_mib == 40960
    # An empty booking annotation is no booking: the charge stays frozen.
    sizes["gpu"] = 81920
    fresh = in_cache(make_pod(None, percent=50, name="fresh"))
    gate.ledger.pod_seen(fresh)
    sizes["gpu"] = 24576
    gate.ledger.pod_seen(booked(fresh, ""))
    assert gate.ledger.usage("team-a").memory_mib == 40960 + 40960


def test_cache_pods_are_charged_their_mig_slot_and_their_sidecars() -> None:
    gate = make_gate(slot_size=mig_slots)
    gate.ledger.pod_seen(in_cache(make_pod(1, name="mig", annotations={VGPU_MODE: MIG})))
    gate.ledger.pod_seen(in_cache(make_pod(1, name="plain")))
    assert gate.ledger.usage("team-a") == Charge(2, 10240 + 1, 200)
    sidecar = in_cache(make_pod(1000, name="with-sidecar", namespace="team-b"))
    sidecar["spec"]["initContainers"] = [
        {"name": "side", "restartPolicy": "Always", "resources": {"limits": {NAMES.memory: "2000"}}}
    ]
    gate.ledger.pod_seen(sidecar)
    assert gate.ledger.usage("team-b") == Charge(2, 3000, 200)


def test_a_cache_pod_no_gpu_can_size_is_counted_without_memory_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = make_gate()  # no sizer: no GPU known
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        gate.ledger.pod_seen(in_cache(make_pod(None, number=1, name="whole")))
    assert gate.ledger.usage("team-a") == Charge(1, 0, 100)
    assert [r.getMessage() for r in caplog.records] == [
        "event=quota_pod_unsized namespace=team-a pod=whole "
        "detail=no GPU known to size its memory share; counted without that memory"
    ]


def test_an_unreadable_cache_pod_is_logged_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    gate = make_gate()
    malformed = make_pod(None, name="bad")
    malformed["spec"]["containers"][0]["resources"]["limits"] = {NAMES.memory: "3Gi"}
    with caplog.at_level(logging.WARNING, logger="kube_vgpu.webhook.quota"):
        gate.ledger.pod_seen(in_cache(malformed))
    reason = (
        "container 'main': volcano.sh/vgpu-memory='3Gi': volcano.sh/vgpu-memory is a number of MiB "
        "without a binary suffix: write 3072, not 3Gi"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"event=quota_pod_unreadable namespace=team-a pod=bad reason={reason!r}"
    ]


def test_a_pod_claims_the_reservation_of_its_uid_whatever_its_name() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, name="x"), {}, review="uid-x") is None
    assert admit(gate, make_pod(3000, name="y"), {}, review="uid-y") is None
    gate.ledger.pod_seen(in_cache(make_pod(3000, uid="uid-y"), name="renamed"))
    assert gate.ledger.reserved("team-a") == Charge(1, 1000, 100)


def test_a_name_whose_reservation_was_claimed_can_be_reserved_again() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(4096, name="stays")))  # the namespace stays known throughout
    assert admit(gate, make_pod(1024, name="a"), {}, review="first") is None
    first = in_cache(make_pod(1024, name="a", uid="first"))
    gate.ledger.pod_seen(first)
    gate.ledger.pod_gone(first)
    assert admit(gate, make_pod(2048, name="a"), {}, review="second") is None
    assert gate.ledger.reserved("team-a") == Charge(1, 2048, 100)


def test_a_review_retried_under_another_pods_name_leaves_nothing_when_both_lapse() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    assert admit(gate, make_pod(1024, name="a"), {}, review="k1") is None
    assert admit(gate, make_pod(1024, name="b"), {}, review="k2") is None
    assert admit(gate, make_pod(1024, name="b"), {}, review="k1") is None  # k1 again, now named b
    assert gate.ledger.reserved("team-a") == Charge(2, 2048, 200)
    clocks.advance(PENDING)
    assert gate.ledger.reserved("team-a") == Charge()


def test_each_lapsed_reservation_is_logged_with_its_pod_and_why(caplog: pytest.LogCaptureFixture) -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    assert admit(gate, make_pod(1, name="named"), {}, review="r1") is None
    assert admit(gate, make_pod(1, generate_name="job-"), {}, review="r2") is None
    assert admit(gate, make_pod(1), {}, review="r3") is None  # neither name nor generateName
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook.quota"):
        clocks.advance(120)
        assert gate.ledger.reserved("team-a") == Charge()
        assert admit(gate, make_pod(1, name="ghost"), {}, review="r4") is None
        clocks.advance(NEVER_CREATED_AFTER)
        watch.current_at = clocks.mono
        assert gate.ledger.reserved("team-a") == Charge()
    lapsed = "detail=admitted pod never appeared in the cache"
    assert [r.getMessage() for r in caplog.records] == [
        f"event=quota_reservation_expired namespace=team-a pod_uid=r1 pod=named {lapsed}",
        f"event=quota_reservation_expired namespace=team-a pod_uid=r2 pod=job-* {lapsed}",
        f"event=quota_reservation_expired namespace=team-a pod_uid=r3 pod=* {lapsed}",
        "event=quota_reservation_expired namespace=team-a pod_uid=r4 pod=ghost "
        "detail=the pod watch has passed the admission by more than a create can take",
    ]


def test_a_booked_mig_pod_asking_a_share_of_a_card_still_counts_its_whole_slot() -> None:
    # 10 % of a 40 GiB card is 4096 MiB, held as a 1g.5gb slot of 4864 MiB (A100 40GB). The
    # booking records the 4096 MiB asked; usage must not drop below the slot once it is booked.
    def a100_slot(mib: int) -> int:
        return 4864 if mib <= 4864 else 9856

    def slots(p: Mapping[str, Any]) -> SlotSize | None:
        return a100_slot if p["metadata"]["annotations"].get(VGPU_MODE) == MIG else None

    gate = make_gate(gpu_memory={GPU_A: 40960}.get, gpu_size=lambda pod: 40960, slot_size=slots)
    pod = make_pod(None, percent=10, name="m", annotations={VGPU_MODE: MIG})
    assert admit(gate, pod, {}, gpu=40960, review="u-m") is None
    assert gate.ledger.usage("team-a") == Charge(1, 4864, 100)
    shown = in_cache(make_pod(None, percent=10, name="m", uid="u-m", annotations={VGPU_MODE: MIG}))
    gate.ledger.pod_seen(shown)
    assert gate.ledger.usage("team-a") == Charge(1, 4864, 100)
    gate.ledger.pod_seen(booked(shown, encode_pod_devices([[DeviceRecord(GPU_A, 4096, 0)]])))
    assert gate.ledger.usage("team-a") == Charge(1, 4864, 100)
    # With no GPU known to size it, the booked pod still counts at least the smallest slot.
    unsized = make_gate(gpu_memory={GPU_A: 40960}.get, slot_size=slots)
    unsized.ledger.pod_seen(booked(shown, encode_pod_devices([[DeviceRecord(GPU_A, 4096, 0)]])))
    assert unsized.ledger.usage("team-a") == Charge(1, 4864, 100)
