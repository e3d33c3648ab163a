"""The pure part of shared quota reservations (`webhook.quota.shared`): the object's name and codec,
pruning, and the decision for a batch of asks against one version of the object plus the cache."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

import pytest

from kube_vgpu.webhook.quota.charge import ZERO, Charge, QuotaLimits
from kube_vgpu.webhook.quota.shared import (
    MAX_ENTRIES,
    NAMESPACE_LABEL,
    NEVER_CREATED_AFTER,
    Answer,
    Ask,
    Entry,
    NamespaceSnapshot,
    SharedStateError,
    Sightings,
    decide,
    decode_entries,
    encode_object,
    in_flight,
    object_name,
    prune,
)

LIFETIME = 120.0
NOW = 1_000_000.0
ONE = Charge(1, 1024, 10)
LIMITS = QuotaLimits(memory_mib=4 * 1024)


def cache(
    pods: Charge = ZERO,
    shown: Mapping[str, float] | None = None,
    gone: frozenset[str] = frozenset(),
    terminal: frozenset[str] = frozenset(),
    current_at: float | None = None,
) -> NamespaceSnapshot:
    shown = dict(shown or {})
    return NamespaceSnapshot(
        pods=pods,
        accounts_for=lambda uid: uid in shown or uid in gone or uid in terminal,
        released=lambda uid: uid in gone or uid in terminal,
        shown_for=shown.get,
        stream_current_at=current_at,
    )


def ask(uid: str, charge: Charge = ONE, *, reserve: bool = True, limits: QuotaLimits = LIMITS) -> Ask:
    return Ask(uid, charge, limits, reserve)


# -- name and codec ---------------------------------------------------------------------------------------


def test_object_names_are_short_valid_and_distinct_for_any_namespace() -> None:
    # The name is stored state: replicas of different versions must agree on it.
    assert object_name("team-a") == "kube-vgpu-quota-96c2886c51d1dfb4901d9feccff66213"
    longest = "n" * 63  # the longest namespace name
    names = {object_name(ns) for ns in ("a", "team-a", "team-b", longest, "x" * 62 + "y")}
    assert len(names) == 5
    for name in names:
        assert len(name) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name)
    assert object_name("team-a") == object_name("team-a")


def test_entries_round_trip_through_the_stored_object() -> None:
    entries = {"u1": Entry(ONE, 1_000_120), "u2": Entry(Charge(2, 0, 200), 1_000_121)}
    obj = encode_object("team-a", "kube-vgpu", entries, "42")
    assert obj["metadata"] == {
        "name": object_name("team-a"),
        "namespace": "kube-vgpu",
        "labels": {NAMESPACE_LABEL: "team-a", "app.kubernetes.io/component": "quota-reservations"},
        "resourceVersion": "42",
    }
    assert decode_entries(json.loads(json.dumps(obj)), "team-a") == entries
    assert decode_entries(None, "team-a") == {}
    assert "resourceVersion" not in encode_object("team-a", "kube-vgpu", {}, None)["metadata"]


@pytest.mark.parametrize(
    "obj",
    [
        {"metadata": {"labels": {NAMESPACE_LABEL: "team-b"}}, "data": {}},  # another namespace's object
        {"metadata": {}, "data": {}},  # not ours at all
        {"metadata": {"labels": {NAMESPACE_LABEL: "team-a"}}, "data": {"u": "1,2,3"}},
        {"metadata": {"labels": {NAMESPACE_LABEL: "team-a"}}, "data": {"u": "1,2,3,x"}},
        {"metadata": {"labels": {NAMESPACE_LABEL: "team-a"}}, "data": {"u": "1,2,3,4,5"}},
        {"metadata": {"labels": {NAMESPACE_LABEL: "team-a"}}, "data": ["u"]},
    ],
)
def test_an_object_that_is_not_our_reservations_fails_closed(obj: dict[str, object]) -> None:
    with pytest.raises(SharedStateError):
        decode_entries(obj, "team-a")


def test_the_object_stays_small_under_a_burst() -> None:
    # A thousand pods in flight at once, each with a worst-case-width charge.
    entries = {
        f"{i:08x}-0000-4000-8000-{i:012x}": Entry(Charge(16, 16 * 143_771, 1600), 1_764_000_000)
        for i in range(1000)
    }
    size = len(json.dumps(encode_object("n" * 63, "kube-vgpu", entries, "123456789")))
    assert size < 80_000  # about 75 bytes a reservation
    per_entry = size / 1000
    # So the cap keeps the object well under the API server's 1 MiB limit.
    assert per_entry * MAX_ENTRIES < 1024 * 1024


# -- pruning ------------------------------------------------------------------------------------------------


def test_an_entry_stays_until_expired_and_the_pod_was_shown_for_the_whole_lifetime() -> None:
    entries = {
        "young": Entry(ONE, int(NOW) + 1),  # not expired
        "never-created": Entry(ONE, int(NOW) - 1),  # expired, the cache never showed it
        "seen-briefly": Entry(ONE, int(NOW) - 1),  # expired, but shown for less than the lifetime
        "seen-long": Entry(ONE, int(NOW) - 1),  # expired and shown for longer
        "deleted": Entry(ONE, int(NOW) + 100),  # the pod is gone: no replica may count it
        "finished": Entry(ONE, int(NOW) + 100),  # terminal
    }
    state = cache(
        shown={"seen-briefly": 5.0, "seen-long": LIFETIME, "finished": 1.0},
        gone=frozenset({"deleted"}),
        terminal=frozenset({"finished"}),
    )
    assert set(prune(entries, state, NOW, LIFETIME)) == {"young", "seen-briefly"}


# -- the decision ------------------------------------------------------------------------------------------


def test_usage_is_the_cache_plus_entries_the_cache_does_not_account_for() -> None:
    entries = {"other-replica": Entry(ONE, int(NOW) + 60), "in-cache": Entry(ONE, int(NOW) + 60)}
    state = cache(pods=Charge(1, 1024, 10), shown={"in-cache": 1.0})
    assert in_flight(entries, state, NOW, LIFETIME) == ONE
    kept, answers = decide(entries, [ask("new")], state, now=NOW, lifetime=LIFETIME)
    assert answers[0].fits and answers[0].usage == Charge(2, 2048, 20)
    assert kept["new"] == Entry(ONE, int(NOW + LIFETIME))
    assert set(kept) == {"other-replica", "in-cache", "new"}


def test_a_batch_admits_exactly_what_fits_in_order() -> None:
    asks = [ask(f"p{i}") for i in range(7)]
    kept, answers = decide({}, asks, cache(pods=ONE), now=NOW, lifetime=LIFETIME)
    assert [a.fits for a in answers] == [True, True, True, False, False, False, False]
    assert set(kept) == {"p0", "p1", "p2"}
    assert answers[3].over == ("vgpu-memory",) and answers[3].usage == Charge(4, 4096, 40)


def test_one_pod_decided_again_counts_once() -> None:
    entries = {"p": Entry(Charge(1, 3072, 10), int(NOW) + 30)}
    # The retry of the same pod (same uid) replaces its own entry rather than adding to it.
    kept, answers = decide(entries, [ask("p", Charge(1, 3072, 10))], cache(), now=NOW, lifetime=LIFETIME)
    assert answers[0].fits and answers[0].usage == Charge()
    assert list(kept) == ["p"] and kept["p"].expires == int(NOW + LIFETIME)
    # Twice in one batch: still one entry, and room for exactly one more 1 GiB pod.
    kept, answers = decide(
        {}, [ask("q", Charge(1, 3072, 10))] * 2 + [ask("r"), ask("s")], cache(), now=NOW, lifetime=LIFETIME
    )
    assert [a.fits for a in answers] == [True, True, True, False]
    assert set(kept) == {"q", "r"}


def test_dry_runs_and_existing_names_are_decided_but_book_nothing() -> None:
    kept, answers = decide(
        {},
        [ask("dry", reserve=False), ask("dry2", Charge(1, 4096, 10), reserve=False)],
        cache(),
        now=NOW,
        lifetime=LIFETIME,
    )
    assert [a.fits for a in answers] == [True, True]
    assert kept == {}
    full = {"x": Entry(Charge(1, 4096, 1), int(NOW) + 10)}
    _, answers = decide(full, [ask("dry", reserve=False)], cache(), now=NOW, lifetime=LIFETIME)
    assert not answers[0].fits


def test_a_full_object_refuses_new_reservations_but_not_retries() -> None:
    entries = {f"u{i}": Entry(Charge(), int(NOW) + 10) for i in range(3)}
    unlimited = QuotaLimits(number=1000)
    kept, answers = decide(
        entries,
        [
            ask("new", limits=unlimited),
            ask("u1", limits=unlimited),
            ask("dry", reserve=False, limits=unlimited),
        ],
        cache(),
        now=NOW,
        lifetime=LIFETIME,
        max_entries=3,
    )
    assert [(a.fits, a.full) for a in answers] == [(False, True), (True, False), (True, False)]
    assert set(kept) == {"u0", "u1", "u2"}


def test_expired_entries_free_their_share_for_the_next_ask() -> None:
    entries = {f"old{i}": Entry(ONE, int(NOW) - 1) for i in range(4)}
    kept, answers = decide(entries, [ask("new")], cache(), now=NOW, lifetime=LIFETIME)
    assert answers[0].fits and set(kept) == {"new"}


# -- entries whose pod was never created -------------------------------------------------------------------

SEEN = 500.0  # this replica's monotonic clock when it first saw the entries


@pytest.mark.parametrize(
    ("current_at", "kept"),
    [
        (None, {"forged", "shown"}),  # the watch never confirmed it was current: wait for expiry
        (SEEN + NEVER_CREATED_AFTER - 0.001, {"forged", "shown"}),  # a create could still be stored
        (SEEN + NEVER_CREATED_AFTER, {"shown"}),  # past any create: the forged entry goes
        (SEEN + 10 * LIFETIME, {"shown"}),  # a pod the cache shows is never released early
    ],
)
def test_an_entry_whose_pod_was_never_created_goes_once_the_watch_is_past_the_request_timeout(
    current_at: float | None, kept: set[str]
) -> None:
    entries = {"forged": Entry(ONE, int(NOW) + 100), "shown": Entry(ONE, int(NOW) + 100)}
    state = cache(shown={"shown": 1.0}, current_at=current_at)
    first_seen = {"forged": SEEN, "shown": SEEN}
    assert set(prune(entries, state, NOW, LIFETIME, first_seen)) == kept
    assert in_flight(entries, state, NOW, LIFETIME, first_seen) == (ONE if "forged" in kept else ZERO)
    after, answers = decide(
        entries,
        [ask("next", limits=QuotaLimits(number=1))],
        state,
        now=NOW,
        lifetime=LIFETIME,
        first_seen=first_seen,
    )
    # The next ask fits exactly when the forged entry no longer counts, and is booked then.
    assert answers[0].fits == ("forged" not in kept)
    assert set(after) == kept | ({"next"} if answers[0].fits else set())
    # Without a first sighting this replica cannot date the entry: it keeps it until it expires.
    assert set(prune(entries, state, NOW, LIFETIME)) == {"forged", "shown"}


def test_sightings_date_an_entry_from_when_this_replica_first_saw_it() -> None:
    seen = Sightings()
    assert seen.note("ns", ["a"], 10.0) == {"a": 10.0}
    # Seen again later: still dated from the first sight; a new entry from now.
    assert seen.note("ns", ["a", "b"], 20.0) == {"a": 10.0, "b": 20.0}
    # An entry gone from the object is forgotten; if a uid comes back it is new again.
    assert seen.note("ns", ["b"], 30.0) == {"b": 20.0}
    assert seen.note("ns", ["a", "b"], 40.0) == {"a": 40.0, "b": 20.0}
    assert seen.of("other") == {} and seen.of("ns") == {"a": 40.0, "b": 20.0}
    seen.forget("ns")
    assert seen.of("ns") == {}
    seen.forget("never-seen")  # nothing to forget is no error


# -- boundaries of pruning and of the decision (mutation testing: docs/testing.md) ---------------------


def test_an_entry_expires_at_its_second_and_each_entry_is_judged_on_its_own() -> None:
    entries = {
        "deleted": Entry(ONE, int(NOW) + 100),  # first: dropping it must not stop the others' review
        "due-now": Entry(ONE, int(NOW)),  # expires this very second, never shown: dropped
        "briefly": Entry(ONE, int(NOW) - 1),  # expired, shown for less than the lifetime: kept
        "next-second": Entry(ONE, int(NOW) + 1),
    }
    state = cache(shown={"briefly": LIFETIME - 1}, gone=frozenset({"deleted"}))
    assert set(prune(entries, state, NOW, LIFETIME)) == {"briefly", "next-second"}
    kept, _ = decide(entries, [], state, now=NOW, lifetime=LIFETIME)
    assert set(kept) == {"briefly", "next-second"}
    # What counts: the entries kept that the cache does not account for, each once.
    assert in_flight(entries, state, NOW, LIFETIME) == ONE
    assert (
        in_flight({"a": Entry(ONE, int(NOW) + 9), "b": Entry(ONE, int(NOW) + 9)}, cache(), NOW, LIFETIME)
        == ONE + ONE
    )


def test_answers_carry_no_resources_when_they_fit_and_the_usage_they_saw() -> None:
    entries = {"other": Entry(ONE, int(NOW) + 60)}
    kept, answers = decide(entries, [ask("a"), ask("b")], cache(), now=NOW, lifetime=LIFETIME, max_entries=2)
    assert answers == [Answer((), ONE), Answer((), ONE + ONE, full=True)]
    assert set(kept) == {"other", "a"}


def test_a_pod_the_cache_counts_is_not_discounted_when_it_is_decided_again() -> None:
    # The API server never reviews the CREATE of a stored pod; a second review of its uid (a
    # forgery) is decided against usage that already holds the pod, so it can only be refused.
    entries = {"p": Entry(ONE, int(NOW) + 60)}
    state = cache(pods=ONE, shown={"p": 1.0})
    _, answers = decide(entries, [ask("p", limits=QuotaLimits(number=1))], state, now=NOW, lifetime=LIFETIME)
    assert not answers[0].fits and answers[0].usage == ONE
    # Deciding it again adds nothing to what later asks of the batch see.
    _, answers = decide(
        entries,
        [ask("p", limits=QuotaLimits(number=2)), ask("q", limits=QuotaLimits(number=2))],
        state,
        now=NOW,
        lifetime=LIFETIME,
    )
    assert [a.fits for a in answers] == [True, True] and answers[1].usage == ONE


@pytest.mark.parametrize(
    ("labels", "data", "message"),
    [
        (
            {NAMESPACE_LABEL: "team-b"},
            {},
            f"cm-x is labelled {NAMESPACE_LABEL}='team-b', not 'team-a'",
        ),
        ({}, {}, f"cm-x is labelled {NAMESPACE_LABEL}=None, not 'team-a'"),
        ({NAMESPACE_LABEL: "team-a"}, ["u"], "data is not a map"),
        (
            {NAMESPACE_LABEL: "team-a"},
            {"u": "1,2,x,4"},
            "entry 'u' is not number,memory,cores,expires: '1,2,x,4'",
        ),
    ],
)
def test_an_unreadable_object_is_refused_saying_what_is_wrong_with_it(
    labels: dict[str, str], data: object, message: str
) -> None:
    obj = {"metadata": {"name": "cm-x", "labels": labels}, "data": data}
    with pytest.raises(SharedStateError) as info:
        decode_entries(obj, "team-a")
    assert str(info.value) == message
