"""Usage as the quota counts it: the ledger fed by the cache (deletions, terminal and terminating pods,
relists, bookings) plus the shared reservations (matched to pods by uid, lapsing when their pod never
appears), and 200 concurrent reviews over three replicas.
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
from kube_vgpu.contract.names import (
    MIG,
    QUOTA_CORES_LABEL,
    QUOTA_MEMORY_LABEL,
    QUOTA_NUMBER_LABEL,
    VGPU_IDS_NEW,
    VGPU_MODE,
)
from kube_vgpu.webhook.quota.charge import Charge, SlotSize
from kube_vgpu.webhook.quota.gate import NamespaceQuota
from kube_vgpu.webhook.quota.shared import NEVER_CREATED_AFTER
from kube_vgpu.webhook.records import PodRecord
from tests.support.memory_store import MemoryStore
from tests.support.records import as_pod
from tests.support.webhook_quota import (
    MEM_80G,
    NAMES,
    PENDING,
    Clocks,
    admit,
    close,
    in_cache,
    make_gate,
    make_pod,
    request_for,
)


def test_a_deleted_pod_frees_its_share_at_once() -> None:
    gate = make_gate()
    pod_a = in_cache(make_pod(81920, name="a"))
    assert admit(gate, pod_a, MEM_80G) is None
    gate.ledger.pod_seen(pod_a)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    gate.ledger.pod_gone(pod_a)
    assert gate.usage("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_terminal_pod_frees_its_share(phase: str) -> None:
    gate = make_gate()
    running = in_cache(make_pod(81920, name="job", phase="Running"))
    gate.ledger.pod_seen(running)
    assert admit(gate, make_pod(1, name="b"), MEM_80G) is not None
    done = as_pod({**running, "status": {"phase": phase}})
    gate.ledger.pod_seen(done)
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None
    # Later events about the finished pod, and its deletion, change nothing.
    gate.ledger.pod_seen(done)
    gate.ledger.pod_gone(done)
    assert gate.usage("team-a") == Charge(1, 81920, 100)


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
    assert gate.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.5)
    assert gate.reserved("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="b"), MEM_80G) is None


def test_a_pod_appearing_in_the_cache_replaces_its_reservation_and_is_counted_once() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    labels = {QUOTA_MEMORY_LABEL: "4096"}
    named = in_cache(make_pod(1024, name="named"))
    generated = in_cache(make_pod(1024, generate_name="rs-abc-"))
    assert admit(gate, named, labels) is None
    assert admit(gate, generated, labels) is None
    assert gate.usage("team-a") == Charge(2, 2048, 200)
    gate.ledger.pod_seen(named)
    gate.ledger.pod_seen(generated)
    assert gate.usage("team-a") == Charge(2, 2048, 200)
    assert gate.reserved("team-a") == Charge()
    # Long after the pending time, the pods still count: they are pods now, not reservations.
    clocks.advance(10 * PENDING)
    assert gate.usage("team-a") == Charge(2, 2048, 200)
    assert admit(gate, make_pod(2049, name="more"), labels) is not None
    assert admit(gate, make_pod(2048, name="more"), labels) is None


def test_a_retried_review_is_booked_once() -> None:
    gate = make_gate()
    labels = {QUOTA_MEMORY_LABEL: "2048"}
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r1") is None
    assert admit(gate, make_pod(2048, generate_name="w-"), labels, review="r2") is not None
    assert gate.usage("team-a") == Charge(1, 2048, 100)


def test_a_pods_charge_is_frozen_until_the_scheduler_books_it() -> None:
    sizes = {"gpu": 81920}
    gate = make_gate(gpu_size=lambda pod: sizes["gpu"])
    cached = in_cache(make_pod(None, percent=50, name="pct"))
    gate.ledger.pod_seen(cached)
    assert gate.ledger.usage("team-a").memory_mib == 40960
    sizes["gpu"] = 24576  # the big nodes went away; the pod's usage does not drift
    gate.ledger.pod_seen(as_pod({**cached, "status": {"phase": "Pending"}}))
    assert gate.ledger.usage("team-a").memory_mib == 40960
    booking = encode_pod_devices([[DeviceRecord("GPU-aaaaaaaa-0000-0000-0000-000000000001", 12288, 0)]])
    booked = as_pod({**cached, "metadata": {**cached["metadata"], "annotations": {VGPU_IDS_NEW: booking}}})
    gate.ledger.pod_seen(booked)
    assert gate.ledger.usage("team-a").memory_mib == 12288


def test_a_pod_unsized_at_admission_is_sized_when_it_appears() -> None:
    gate = make_gate(gpu_size=lambda pod: 81920)
    pct = in_cache(make_pod(None, percent=50, name="pct"))
    assert admit(gate, pct, {QUOTA_NUMBER_LABEL: "4"}, gpu=None) is None
    assert gate.usage("team-a") == Charge(1, 0, 100)
    gate.ledger.pod_seen(pct)
    assert gate.usage("team-a") == Charge(1, 40960, 100)


def test_pods_seen_before_the_gpus_are_known_are_sized_again_once_they_are() -> None:
    sizes: dict[str, int | None] = {"gpu": None}
    slots: dict[str, SlotSize | None] = {"slot": None}

    def slot_size(pod: Mapping[str, Any]) -> SlotSize | None:
        return slots["slot"] if pod["metadata"]["name"] == "mig" else None

    gate = make_gate(gpu_size=lambda pod: sizes["gpu"], slot_size=slot_size)
    pct = in_cache(make_pod(None, percent=50, name="pct"))
    mig = in_cache(make_pod(9000, name="mig", annotations={VGPU_MODE: MIG}))
    gate.ledger.pod_seen(pct)
    gate.ledger.pod_seen(mig)
    assert gate.usage("team-a").memory_mib == 9000  # the share unsized, the MIG request as asked
    assert gate.ledger.unsized("team-a") == ["pct"]
    sizes["gpu"], slots["slot"] = 81920, lambda mib: 9984 if mib <= 9984 else 20096
    gate.ledger.pod_seen(pct)  # seen again without a new booking: the first charge is kept
    assert gate.usage("team-a").memory_mib == 9000
    gate.ledger.size_again([pct, mig])
    assert gate.usage("team-a") == Charge(2, 40960 + 9984, 200)
    assert gate.ledger.unsized("team-a") == []


def test_a_relist_drops_pods_that_are_gone_and_keeps_the_rest() -> None:
    gate = make_gate()
    keep = in_cache(make_pod(1000, name="keep"))
    gone = in_cache(make_pod(2000, name="gone"))
    elsewhere = in_cache(make_pod(4000, name="x", namespace="team-b"))
    for p in (keep, gone, elsewhere):
        gate.ledger.pod_seen(p)
    new = in_cache(make_pod(500, generate_name="new-"))
    assert admit(gate, new, MEM_80G) is None
    assert gate.usage("team-a") == Charge(3, 3500, 300)
    gate.ledger.resync([keep, new])
    assert gate.usage("team-a") == Charge(2, 1500, 200)
    assert gate.reserved("team-a") == Charge()
    assert gate.ledger.usage("team-b") == Charge()
    assert set(gate.ledger.namespaces()) == {"team-a"}


def test_pods_without_vgpu_or_unreadable_are_not_counted() -> None:
    gate = make_gate()
    plain = {"metadata": {"namespace": "team-a"}, "spec": {"containers": [{"name": "c"}]}}
    malformed = make_pod(None, name="bad")
    malformed["spec"]["containers"][0]["resources"]["limits"] = {NAMES.memory: "3Gi"}
    for p in (plain, malformed):
        gate.ledger.pod_seen(in_cache(as_pod(p)))
    gate.ledger.pod_seen({"metadata": {"namespace": "team-a", "name": "no-uid"}})
    assert gate.ledger.usage("team-a") == Charge()
    assert gate.ledger.namespaces() == []


async def _review(
    gates: list[NamespaceQuota], index: int, labels: Mapping[str, str], rng: random.Random
) -> bool:
    """One review as the webhook handles it, on one of the replicas."""
    for _ in range(rng.randrange(4)):
        await asyncio.sleep(0)  # parsing, the cache lookup, other reviews interleaving
    p = in_cache(make_pod(1024, cores=10, generate_name="burst-", uid=f"burst-{index}"))
    verdict = await rng.choice(gates).admit(request_for(p, labels))
    await asyncio.sleep(0)
    if verdict is None and rng.random() < 0.5:
        for gate in gates:
            gate.ledger.pod_seen(p)  # some admitted pods reach every replica's cache mid-burst
    return verdict is None


@pytest.mark.parametrize("seed", range(5))
async def test_two_hundred_concurrent_reviews_over_three_replicas_admit_exactly_what_the_quota_fits(
    seed: int,
) -> None:
    store = MemoryStore()
    gates = [make_gate(store=store) for _ in range(3)]
    # 3 older pods hold 3 GiB; the quota leaves room for exactly 37 more 1 GiB pods (and cores for more).
    for i in range(3):
        old = in_cache(make_pod(1024, cores=10, name=f"old-{i}"))
        for gate in gates:
            gate.ledger.pod_seen(old)
    labels = {QUOTA_MEMORY_LABEL: str(40 * 1024), QUOTA_CORES_LABEL: "1000"}
    rng = random.Random(seed)
    try:
        results = await asyncio.gather(*(_review(gates, i, labels, rng) for i in range(200)))
        assert sum(results) == 37
        for gate in gates:
            assert gate.usage("team-a") == Charge(40, 40 * 1024, 400)
    finally:
        for gate in gates:
            await close(gate)


# -- a reservation whose pod never appears (a forged review) --------------------------------------------


class Watch:
    """The cache's pod list/watch as the ledger reads it: when it last confirmed it was current."""

    def __init__(self) -> None:
        self.current_at: float | None = None


def forged_gate(clocks: Clocks, watch: Watch) -> NamespaceQuota:
    """A gate whose reservations lapse at the staleness bound of the chart's default (120 s)."""
    return make_gate(clocks, pending_seconds=120.0, stream_current_at=lambda: watch.current_at)


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
    assert gate.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.01)
    watch.current_at = admitted_at + NEVER_CREATED_AFTER
    assert gate.reserved("team-a") == Charge()
    assert admit(gate, make_pod(81920, name="real"), MEM_80G) is None
    assert NEVER_CREATED_AFTER == 65.0  # the request timeout (60 s) and 5 s for the watch's delivery


def test_without_a_watch_past_the_admission_a_reservation_waits_for_the_staleness_bound() -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    watch.current_at = clocks.mono + 30  # the watch stopped 30 s after the admission (API down)
    assert admit(gate, make_pod(81920, name="ghost"), MEM_80G, review="forged-uid") is None
    clocks.advance(119.9)
    assert gate.reserved("team-a") == Charge(1, 81920, 100)
    clocks.advance(0.1)
    assert gate.reserved("team-a") == Charge()


def test_a_pod_that_appears_is_matched_by_uid_and_never_released_early() -> None:
    clocks, watch = Clocks(), Watch()
    gate = forged_gate(clocks, watch)
    # Its generateName and name match nothing: only the uid ties the pod to its review.
    assert admit(gate, make_pod(81920, generate_name="job-"), MEM_80G, review="real-uid") is None
    clocks.advance(NEVER_CREATED_AFTER - 1)  # a slow create: stored just before the bound
    watch.current_at = clocks.mono
    gate.ledger.pod_seen(in_cache(make_pod(81920, generate_name="job-", uid="real-uid"), name="job-x1"))
    assert gate.reserved("team-a") == Charge()  # the pod counts now, not its reservation
    for _ in range(5):  # the watch goes on, far past the staleness bound
        clocks.advance(100)
        watch.current_at = clocks.mono
        assert gate.usage("team-a") == Charge(1, 81920, 100)
        assert admit(gate, make_pod(1, name="other"), MEM_80G) is not None


# -- edges of the ledger's rules (mutation testing: docs/testing.md) -------------------------------------


def stamp(wall: float) -> str:
    """A deletionTimestamp for a wall-clock time."""
    return datetime.fromtimestamp(wall, tz=UTC).isoformat()


def terminating(p: PodRecord, at: float, grace: object = 0) -> PodRecord:
    """`p` with a deletionTimestamp at wall time `at`, and `grace` as its grace period (ABSENT: none)."""
    meta: dict[str, Any] = {**p["metadata"], "deletionTimestamp": stamp(at)}
    if grace is not ABSENT:
        meta["deletionGracePeriodSeconds"] = grace
    return as_pod({**p, "metadata": meta})


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


def test_a_terminating_pods_deadline_is_applied_beside_live_reservations() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    gate.ledger.pod_seen(terminating(in_cache(make_pod(4096, name="old")), clocks.wall + 10))
    assert admit(gate, make_pod(1024, name="new"), MEM_80G) is None  # a live reservation
    clocks.advance(10)
    assert gate.usage("team-a") == ONE_GIB


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
    odd_namespace["metadata"]["namespace"] = ["team-a"]  # type: ignore[typeddict-item]  # hostile on purpose
    for p in (no_uid, no_namespace, odd_namespace, as_pod({"metadata": None}), as_pod({"metadata": ["x"]})):
        gate.ledger.pod_seen(p)
        gate.ledger.pod_gone(p)
    gate.ledger.pod_gone(in_cache(make_pod(2048, name="never-seen")))  # a known namespace, unknown uid
    gate.ledger.pod_gone(in_cache(make_pod(2048, name="z", namespace="team-z")))  # an unknown namespace
    assert gate.ledger.usage("team-a") == ONE_GIB
    gate.ledger.resync([real, odd_namespace, no_uid, as_pod({"metadata": None})])
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


def booked(p: PodRecord, booking: str) -> PodRecord:
    """`p` with the scheduler's `volcano.sh/vgpu-ids-new` booking."""
    return as_pod(
        {
            **p,
            "metadata": {
                **p["metadata"],
                "annotations": {**p["metadata"]["annotations"], VGPU_IDS_NEW: booking},
            },
        }
    )


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


def test_a_pod_takes_the_place_of_the_reservation_of_its_uid_whatever_its_name() -> None:
    gate = make_gate()
    assert admit(gate, make_pod(1000, name="x"), MEM_80G, review="uid-x") is None
    assert admit(gate, make_pod(3000, name="y"), MEM_80G, review="uid-y") is None
    gate.ledger.pod_seen(in_cache(make_pod(3000, uid="uid-y"), name="renamed"))
    assert gate.reserved("team-a") == Charge(1, 1000, 100)
    assert gate.usage("team-a") == Charge(2, 4000, 200)


def test_a_name_whose_pod_was_deleted_can_be_reserved_again() -> None:
    gate = make_gate()
    gate.ledger.pod_seen(in_cache(make_pod(4096, name="stays")))
    assert admit(gate, make_pod(1024, name="a"), MEM_80G, review="first") is None
    first = in_cache(make_pod(1024, name="a", uid="first"))
    gate.ledger.pod_seen(first)
    gate.ledger.pod_gone(first)
    assert admit(gate, make_pod(2048, name="a"), MEM_80G, review="second") is None
    assert gate.reserved("team-a") == Charge(1, 2048, 100)
    assert gate.usage("team-a") == Charge(2, 4096 + 2048, 200)


def test_a_review_retried_under_another_pods_name_leaves_nothing_when_both_lapse() -> None:
    clocks = Clocks()
    gate = make_gate(clocks)
    assert admit(gate, make_pod(1024, name="a"), MEM_80G, review="k1") is None
    assert admit(gate, make_pod(1024, name="b"), MEM_80G, review="k2") is None
    assert admit(gate, make_pod(1024, name="b"), MEM_80G, review="k1") is None  # k1 again, now named b
    assert gate.reserved("team-a") == Charge(2, 2048, 200)
    clocks.advance(PENDING)
    assert gate.reserved("team-a") == Charge()


def test_a_booked_mig_pod_asking_a_share_of_a_card_still_counts_its_whole_slot() -> None:
    # 10 % of a 40 GiB card is 4096 MiB, held as a 1g.5gb slot of 4864 MiB (A100 40GB). The
    # booking records the 4096 MiB asked; usage must not drop below the slot once it is booked.
    def a100_slot(mib: int) -> int:
        return 4864 if mib <= 4864 else 9856

    def slots(p: Mapping[str, Any]) -> SlotSize | None:
        return a100_slot if p["metadata"]["annotations"].get(VGPU_MODE) == MIG else None

    gate = make_gate(gpu_memory={GPU_A: 40960}.get, gpu_size=lambda pod: 40960, slot_size=slots)
    pod = make_pod(None, percent=10, name="m", annotations={VGPU_MODE: MIG})
    assert admit(gate, pod, MEM_80G, gpu=40960, review="u-m") is None
    assert gate.usage("team-a") == Charge(1, 4864, 100)
    shown = in_cache(make_pod(None, percent=10, name="m", uid="u-m", annotations={VGPU_MODE: MIG}))
    gate.ledger.pod_seen(shown)
    assert gate.usage("team-a") == Charge(1, 4864, 100)
    gate.ledger.pod_seen(booked(shown, encode_pod_devices([[DeviceRecord(GPU_A, 4096, 0)]])))
    assert gate.usage("team-a") == Charge(1, 4864, 100)
    # With no GPU known to size it, the booked pod still counts at least the smallest slot.
    unsized = make_gate(gpu_memory={GPU_A: 40960}.get, slot_size=slots)
    unsized.ledger.pod_seen(booked(shown, encode_pod_devices([[DeviceRecord(GPU_A, 4096, 0)]])))
    assert unsized.ledger.usage("team-a") == Charge(1, 4864, 100)


def test_the_ledger_names_its_counted_pods_and_those_no_gpu_could_size() -> None:
    gate = make_gate()  # no GPU known: a share of a card cannot be sized
    whole = in_cache(make_pod(None, number=1, name="whole"))
    plain = in_cache(make_pod(1024, name="plain"))
    nameless = in_cache(make_pod(512))
    del nameless["metadata"]["name"]
    for p in (whole, plain, nameless):
        gate.ledger.pod_seen(p)
    assert gate.ledger.pods("team-a") == ["", "plain", "whole"]
    assert gate.ledger.unsized("team-a") == ["whole"]
    assert gate.ledger.pods("team-b") == [] and gate.ledger.unsized("team-b") == []
    # A later event with the same booking keeps the name and that the pod was not sized.
    gate.ledger.pod_seen({**whole, "status": {"phase": "Running"}})
    gate.ledger.pod_seen({**nameless, "status": {"phase": "Running"}})
    assert gate.ledger.pods("team-a") == ["", "plain", "whole"] and gate.ledger.unsized("team-a") == ["whole"]
    # Finished: no longer counted, so neither listed.
    gate.ledger.pod_seen({**whole, "status": {"phase": "Succeeded"}})
    assert gate.ledger.pods("team-a") == ["", "plain"] and gate.ledger.unsized("team-a") == []
