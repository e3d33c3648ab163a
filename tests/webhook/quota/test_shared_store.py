"""Shared quota reservations through the API (`webhook.quota.shared_store`), against the stand-in
API server: several replicas' writers on one namespace never over-book, a stale version is re-read
and decided again (409), and a slow, refusing or absent API refuses instead of admitting."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.quota import shared_store
from kube_vgpu.webhook.quota.charge import Charge, QuotaLimits
from kube_vgpu.webhook.quota.shared import (
    NEVER_CREATED_AFTER,
    Ask,
    NamespaceSnapshot,
    Unrecorded,
    decode_entries,
    encode_object,
    object_name,
)
from kube_vgpu.webhook.quota.shared_store import SharedReservations
from tests.support.timeouts import HANG_S

NAMESPACE = "team-a"
RELEASE = "default"
ONE = Charge(1, 1024, 10)


def empty_cache(namespace: str) -> NamespaceSnapshot:
    return NamespaceSnapshot(
        pods=Charge(), accounts_for=lambda uid: False, released=lambda uid: False, shown_for=lambda uid: None
    )


@pytest.fixture
def clients(apiserver: ApiServerStandin) -> Iterator[list[Kube]]:
    kubes = [Kube(apiserver.api_client(), component="webhook") for _ in range(3)]
    yield kubes
    for kube in kubes:
        kube.close()


def replica(kube: Kube, budget_seconds: float = 3.5) -> SharedReservations:
    return SharedReservations(
        kube, RELEASE, lifetime_seconds=120.0, cache_state=empty_cache, budget_seconds=budget_seconds
    )


def stored(apiserver: ApiServerStandin) -> dict[str, object]:
    kube = Kube(apiserver.api_client())
    try:
        obj = kube.get("configmap", object_name(NAMESPACE), namespace=RELEASE)
    finally:
        kube.close()
    return dict(decode_entries(obj, NAMESPACE))


def ask(uid: str, memory_room: int, *, reserve: bool = True) -> Ask:
    return Ask(uid, ONE, QuotaLimits(memory_mib=memory_room * 1024), reserve)


async def test_three_replicas_book_exactly_the_room_between_them(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    replicas = [replica(k) for k in clients]
    configmaps = f"/api/v1/namespaces/{RELEASE}/configmaps"
    # Every replica's first read waits until all three have asked: they start from the same version,
    # so their writes must meet (without this, one replica could finish before another begins).
    apiserver.set_hang(True, [configmaps])
    try:
        deciding = asyncio.gather(
            *(replicas[i % 3].decide(NAMESPACE, ask(f"pod-{i}", 20)) for i in range(90))
        )
        try:
            async with asyncio.timeout(HANG_S):
                while len(apiserver.requests(path_prefix=configmaps)) < 3:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        finally:
            apiserver.set_hang(False)
        answers = await deciding
    finally:
        for r in replicas:
            await r.close()
    admitted = {f"pod-{i}" for i, a in enumerate(answers) if a.fits}
    assert len(admitted) == 20
    assert set(stored(apiserver)) == admitted
    # The writers did meet: two replicas at least wrote against a version another had replaced.
    assert sum(r.stats.conflicts for r in replicas) >= 2
    # Group commit: far fewer writes than admissions asked for.
    assert sum(r.stats.writes for r in replicas) < 90


async def test_a_stale_local_version_is_reread_and_decided_again(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    a, b = replica(clients[0]), replica(clients[1])
    try:
        assert (await a.decide(NAMESPACE, ask("a1", 2))).fits
        assert (await b.decide(NAMESPACE, ask("b1", 2))).fits  # b read a's version, then wrote
        # a's remembered version is now stale: its write conflicts, it re-reads, and sees b1.
        late = await a.decide(NAMESPACE, ask("a2", 2))
        assert not late.fits and late.usage == Charge(2, 2048, 20)
        assert a.stats.conflicts == 1
        assert set(stored(apiserver)) == {"a1", "b1"}
    finally:
        await a.close()
        await b.close()


async def test_dry_runs_write_nothing(apiserver: ApiServerStandin, clients: list[Kube]) -> None:
    r = replica(clients[0])
    try:
        assert (await r.decide(NAMESPACE, ask("dry", 1, reserve=False))).fits
    finally:
        await r.close()
    assert r.stats.writes == 0
    assert Kube(apiserver.api_client()).get("configmap", object_name(NAMESPACE), namespace=RELEASE) is None


async def test_a_hung_api_refuses_within_the_budget(apiserver: ApiServerStandin, clients: list[Kube]) -> None:
    r = replica(clients[0], 0.3)
    apiserver.set_hang(True, [f"/api/v1/namespaces/{RELEASE}/configmaps"])
    try:
        with pytest.raises(Unrecorded, match=r"did not answer within 0\.3 s"):
            await r.decide(NAMESPACE, ask("p", 5))
    finally:
        apiserver.set_hang(False)
        await r.close()
    assert r.stats.writes == 0


async def test_a_refused_write_refuses_the_review(apiserver: ApiServerStandin, clients: list[Kube]) -> None:
    r = replica(clients[0])
    apiserver.deny("create", "configmaps", RELEASE)
    try:
        with pytest.raises(Unrecorded, match="403"):
            await r.decide(NAMESPACE, ask("p", 5))
    finally:
        await r.close()
    assert stored(apiserver) == {}


async def test_an_unreachable_api_refuses_the_review(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    r = replica(clients[0])
    apiserver.set_outage(True)
    try:
        with pytest.raises(Unrecorded, match=r"unreachable|did not answer"):
            await r.decide(NAMESPACE, ask("p", 5))
    finally:
        apiserver.set_outage(False)
        await r.close()


async def test_an_object_that_is_not_ours_fails_closed(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": object_name(NAMESPACE), "namespace": RELEASE},
            "data": {"x": "y"},
        }
    )
    r = replica(clients[0])
    try:
        with pytest.raises(Unrecorded, match="unreadable"):
            await r.decide(NAMESPACE, ask("p", 5))
    finally:
        await r.close()


async def test_a_review_waits_no_longer_than_the_budget_even_behind_a_write(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    r = replica(clients[0], 0.3)
    apiserver.set_hang(True, [f"/api/v1/namespaces/{RELEASE}/configmaps"])
    try:
        first = asyncio.ensure_future(r.decide(NAMESPACE, ask("first", 5)))
        await asyncio.sleep(0)  # the first write is under way; the second queues behind it
        with pytest.raises(Unrecorded):
            await r.decide(NAMESPACE, ask("second", 5))
        with pytest.raises(Unrecorded):
            await first
    finally:
        apiserver.set_hang(False)
        await r.close()
    # The one that gave up waiting is left out of later writes.
    assert "second" not in stored(apiserver)


async def test_a_bug_in_a_write_refuses_the_reviews_instead_of_leaving_them_waiting(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    def broken(namespace: str) -> NamespaceSnapshot:
        raise ZeroDivisionError

    r = SharedReservations(clients[0], RELEASE, lifetime_seconds=120.0, cache_state=broken)
    try:
        with pytest.raises(Unrecorded, match="internal error: ZeroDivisionError"):
            await r.decide(NAMESPACE, ask("p", 5))
    finally:
        await r.close()


async def test_an_object_deleted_behind_the_replicas_back_is_created_again(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    r = replica(clients[0])
    try:
        assert (await r.decide(NAMESPACE, ask("before", 5))).fits
        apiserver.delete("configmap", object_name(NAMESPACE), RELEASE)
        assert (await r.decide(NAMESPACE, ask("after", 5))).fits
    finally:
        await r.close()
    # What was deleted is gone for good (an operator's choice); what came after is booked.
    assert set(stored(apiserver)) == {"after"}


class ReplicaCache:
    """One replica's view for the forged-review tests: the pods its cache shows, and its pod watch."""

    def __init__(self) -> None:
        self.shown: set[str] = set()
        self.current_at: float | None = None

    def state(self, namespace: str) -> NamespaceSnapshot:
        return NamespaceSnapshot(
            pods=Charge(),
            accounts_for=lambda uid: uid in self.shown,
            released=lambda uid: False,
            shown_for=lambda uid: 1.0 if uid in self.shown else None,
            stream_current_at=self.current_at,
        )


def replicas_on(
    clients: list[Kube], views: list[ReplicaCache], clock: list[float]
) -> tuple[SharedReservations, SharedReservations]:
    """Two replicas, each deciding on its own cache view, reading `clock[0]` (no background sweep)."""
    a, b = (
        SharedReservations(
            kube,
            RELEASE,
            lifetime_seconds=120.0,
            cache_state=view.state,
            clock=lambda: clock[0],
            sweep_seconds=3600,
        )
        for kube, view in zip(clients[:2], views, strict=True)
    )
    return a, b


async def test_a_forged_entry_leaves_the_shared_object_once_the_replica_that_booked_it_is_past_it(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    clock = [1000.0]  # the replicas' monotonic clocks (the same one here: each only reads its own)
    views = [ReplicaCache(), ReplicaCache()]
    a, b = replicas_on(clients, views, clock)
    try:
        # A forged CREATE reaches replica a; the pod will never exist. A real one (uid "real") too.
        assert (await a.decide(NAMESPACE, ask("forged", 2))).fits
        assert (await a.decide(NAMESPACE, ask("real", 2))).fits
        clock[0] += 50
        # b first sees the entries 50 s later, when the namespace's next pod reaches it: refused.
        assert not (await b.decide(NAMESPACE, ask("next", 2))).fits
        # 65 s after a booked it, a's watch is past any create it could come from; the real pod
        # has appeared in a's cache meanwhile, the forged one has not.
        clock[0] += NEVER_CREATED_AFTER - 50
        views[0].current_at = clock[0]
        views[0].shown.add("real")
        assert await a.sweep() == [NAMESPACE]
        assert set(stored(apiserver)) == {"real"}
        assert a.stats.sweeps == 1
        # b, which could not yet have dated the entry from its own watch, now sees it gone.
        assert (await b.decide(NAMESPACE, ask("next", 2))).fits
        assert set(stored(apiserver)) == {"real", "next"}
        # Nothing more to drop: a sweep writes nothing.
        assert await a.sweep() == []
    finally:
        await a.close()
        await b.close()


async def test_a_replica_dates_an_entry_from_its_own_first_sight_not_the_writers_clock(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    clock = [1000.0]
    views = [ReplicaCache(), ReplicaCache()]
    a, b = replicas_on(clients, views, clock)
    try:
        assert (await a.decide(NAMESPACE, ask("forged", 1))).fits  # a goes quiet after this
        clock[0] += 50
        assert not (await b.decide(NAMESPACE, ask("b1", 1))).fits  # b's first sight of "forged"
        clock[0] += NEVER_CREATED_AFTER - 0.5
        views[1].current_at = clock[0]  # b's watch: 64.5 s past b's first sight, 114.5 s past a's
        assert not (await b.decide(NAMESPACE, ask("b1", 1))).fits
        clock[0] += 0.5
        views[1].current_at = clock[0]
        assert (await b.decide(NAMESPACE, ask("b1", 1))).fits
        assert set(stored(apiserver)) == {"b1"}
    finally:
        await a.close()
        await b.close()


# -- the objects of deleted namespaces --------------------------------------------------------------


def object_of(apiserver: ApiServerStandin, namespace: str) -> dict[str, object] | None:
    return apiserver.get("ConfigMap", object_name(namespace), RELEASE)


async def booked(r: SharedReservations, *namespaces: str) -> None:
    for namespace in namespaces:
        assert (await r.decide(namespace, ask(f"pod-in-{namespace}", 2))).fits


async def test_the_object_of_a_deleted_namespace_is_deleted(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    r = replica(clients[0])
    try:
        await booked(r, NAMESPACE, "team-b")
        assert await r.remove(NAMESPACE)
        assert object_of(apiserver, NAMESPACE) is None
        assert object_of(apiserver, "team-b") is not None  # another namespace's object is not touched
        assert not await r.remove(NAMESPACE)  # gone already: nothing to delete, no error
    finally:
        await r.close()


async def test_forgetting_a_namespace_deletes_its_object_in_the_background(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    r = replica(clients[0])
    try:
        await booked(r, NAMESPACE)
        r.forget(NAMESPACE)
        async with asyncio.timeout(HANG_S):
            while object_of(apiserver, NAMESPACE) is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
    finally:
        await r.close()


class WrittenAfterRead(Kube):
    """A client whose next read of an object, once armed, is followed (before the caller sees it) by a
    write of another replica: the namespace was created again under its name and booked a pod."""

    def __init__(self, apiserver: ApiServerStandin, other: SharedReservations) -> None:
        super().__init__(apiserver.api_client(), component="webhook")
        self.other = other
        self.loop = asyncio.get_running_loop()
        self.armed = False

    def get(self, *args: object, **kwargs: object) -> dict[str, object] | None:
        found = super().get(*args, **kwargs)  # type: ignore[arg-type]
        if self.armed:
            self.armed = False
            again = self.other.decide(NAMESPACE, ask("pod-of-the-new-namespace", 2))
            assert asyncio.run_coroutine_threadsafe(again, self.loop).result(10).fits
        return found


async def test_an_object_written_after_it_was_read_for_deletion_stays(
    apiserver: ApiServerStandin, clients: list[Kube]
) -> None:
    other = replica(clients[1])
    kube = WrittenAfterRead(apiserver, other)
    r = replica(kube)
    try:
        await booked(r, NAMESPACE)
        kube.armed = True
        assert not await r.remove(NAMESPACE)  # its precondition failed: 409, kept
        assert set(stored(apiserver)) == {f"pod-in-{NAMESPACE}", "pod-of-the-new-namespace"}
        assert await r.remove(NAMESPACE)  # read again, nothing written since: deleted
    finally:
        await r.close()
        await other.close()
        kube.close()


async def test_objects_of_namespaces_gone_meanwhile_are_deleted_page_by_page_and_nothing_else(
    apiserver: ApiServerStandin, clients: list[Kube], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shared_store, "ORPHAN_PAGE", 2)
    r = replica(clients[0])
    try:
        await booked(r, "gone-1", "kept-1", "gone-2", "kept-2", "gone-3")
        unrelated = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "app", "namespace": RELEASE},
        }
        apiserver.put(unrelated)
        # Our labels on an object whose name is not the one its namespace's object has: not ours.
        lookalike = dict(encode_object("gone-4", RELEASE, {}, None))
        lookalike["metadata"] = {**lookalike["metadata"], "name": "kube-vgpu-quota-lookalike"}
        apiserver.put(lookalike)
        removed = await r.remove_orphans(lambda namespace: namespace.startswith("kept-"))
        assert sorted(removed) == ["gone-1", "gone-2", "gone-3"]
        left = {obj["metadata"]["name"] for obj in apiserver.list("ConfigMap", RELEASE)}
        assert left == {object_name("kept-1"), object_name("kept-2"), "app", "kube-vgpu-quota-lookalike"}
        assert await r.remove_orphans(lambda namespace: namespace.startswith("kept-")) == []
    finally:
        await r.close()
