"""The cluster cache against the stand-in API server, through the real client: sync, watch events,
watch timeouts, 410 Gone with a deletion in the gap, outage and staleness, subscriptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.config import Config
from kube_vgpu.kubeapi.client import Kube, WatchInterrupt, load_api_client
from kube_vgpu.kubeapi.listwatch import KubeSource
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cache import CachedKind, CacheEvent, ClusterCache
from kube_vgpu.webhook.metrics import WebhookMetrics
from kube_vgpu.webhook.records import PodRecord
from kube_vgpu.webhook.service import build_quota
from tests.support.timeouts import HANG_S
from tests.support.webhook import A100, container, gpu_node, pod
from tests.support.webhook_quota import memory_book


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def vgpu_pod(*, name: str) -> dict[str, Any]:
    """A pod with one vGPU: the cache keeps only pods that ask for one."""
    return pod(container("main", number=1), name=name)


async def until(condition: Callable[[], bool], what: str, limit_s: float = HANG_S) -> None:
    """Wait for a condition the cache's threads bring about (no event to await: poll it)."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert condition(), what


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def cache(apiserver: ApiServerStandin, tmp_path: Path, clock: FakeClock) -> AsyncIterator[ClusterCache]:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    apiserver.put(vgpu_pod(name="p1") | {"metadata": {"name": "p1", "namespace": "default", "uid": "u1"}})
    kube = Kube(
        load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))), component="webhook"
    )
    cache = ClusterCache(
        kube,
        staleness_seconds=30,
        clock=clock,
        watch_timeout_seconds=1,
        retry_seconds=0.05,
        max_retry_seconds=0.2,
    )
    await cache.start()
    async with asyncio.timeout(HANG_S):
        await cache.wait_synced()
    yield cache
    await cache.stop()
    kube.close()


async def test_first_list_fills_stores_and_inventory_and_readiness(cache: ClusterCache) -> None:
    assert cache.synced and cache.ready()
    assert set(cache.objects("node")) == {"n1"} and "default/p1" in cache.objects("pod")
    assert cache.namespace_labels("default") == {"kubernetes.io/metadata.name": "default"}
    assert cache.namespace_labels("nope") is None
    assert cache.inventory.models() == {"NVIDIA-A100-PCIE-40GB"}
    assert cache.sizes()["gpu-node"] == 1


async def test_watch_events_reach_stores_inventory_and_subscribers(
    cache: ClusterCache, apiserver: ApiServerStandin
) -> None:
    events: list[CacheEvent[PodRecord]] = []
    cache.subscribe("pod", events.append)
    apiserver.put(gpu_node("n2", "mig", [("NVIDIA H100 80GB HBM3", 81920)]))
    apiserver.put(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "labels": {"a": "b"}}}
    )
    apiserver.put(vgpu_pod(name="p2"))
    apiserver.delete("Pod", "p1", "default")
    await until(
        lambda: "n2" in cache.inventory.nodes and (cache.namespace_labels("team") or {}).get("a") == "b",
        "events",
    )
    await until(lambda: [e.type for e in events] == ["added", "deleted"], "pod events")
    assert events[1].obj["metadata"]["name"] == "p1" and "default/p1" not in cache.objects("pod")
    apiserver.delete("Node", "n2")
    await until(lambda: "n2" not in cache.inventory.nodes, "node removal")


async def test_watch_timeouts_resume_without_relisting(
    cache: ClusterCache, apiserver: ApiServerStandin
) -> None:
    # Watches are opened with timeoutSeconds=1: the server ends them; the cache re-watches from its RV.
    def pod_watches() -> list[Any]:
        requests = apiserver.requests("GET", "/api/v1/pods")
        return [r for r in requests if r.query.get("watch") in ("true", "1")]

    await until(lambda: len(pod_watches()) >= 3, "two watches ended by the server and opened again")
    apiserver.close_watches()
    apiserver.put(vgpu_pod(name="late"))
    await until(lambda: "default/late" in cache.objects("pod"), "event after several watch ends")
    assert all(r.query.get("timeoutSeconds") == "1" for r in pod_watches())
    assert cache.relists == {"node": 1, "namespace": 1, "pod": 1}


async def test_gone_relists_and_deletions_in_the_gap_disappear(
    cache: ClusterCache, apiserver: ApiServerStandin
) -> None:
    seen: list[tuple[str, str]] = []
    relisted: list[CachedKind] = []
    cache.subscribe("pod", lambda e: seen.append((e.type, e.obj["metadata"]["name"])))
    cache.subscribe("node", lambda e: seen.append((e.type, e.obj["metadata"]["name"])))
    cache.subscribe_relist(relisted.append)
    apiserver.set_outage(True)
    apiserver.delete("Pod", "p1", "default")
    apiserver.delete("Node", "n1")
    apiserver.put(vgpu_pod(name="born-in-gap"))
    apiserver.expire_history()
    apiserver.set_outage(False)
    await until(lambda: "pod" in relisted and "node" in relisted, "relist after 410")
    assert ("deleted", "p1") in seen and ("deleted", "n1") in seen and ("added", "born-in-gap") in seen
    assert "default/p1" not in cache.objects("pod") and "n1" not in cache.inventory.nodes
    assert not cache.has_pod_uid("u1") and "default/born-in-gap" in cache.objects("pod")
    assert cache.relists["pod"] == 2


async def test_outage_keeps_serving_and_readiness_follows_staleness(
    cache: ClusterCache, apiserver: ApiServerStandin, clock: FakeClock
) -> None:
    apiserver.set_outage(True)
    clock.now += 29
    assert cache.ready() and "n1" in cache.inventory.nodes
    clock.now += 2
    assert not cache.ready() and cache.objects("pod")  # stale, still serving the last state
    lag = cache.lag_seconds()
    assert lag is not None and lag > 30
    apiserver.set_outage(False)
    await until(cache.ready, "ready again once the API answers")


async def test_a_failing_subscriber_does_not_stop_the_cache(
    cache: ClusterCache, apiserver: ApiServerStandin
) -> None:
    def broken(event: CacheEvent[PodRecord]) -> None:
        raise RuntimeError("boom")

    cache.subscribe("pod", broken)
    apiserver.put(vgpu_pod(name="a"))
    apiserver.put(vgpu_pod(name="b"))
    await until(lambda: {"default/a", "default/b"} <= set(cache.objects("pod")), "both pods")


def client(apiserver: ApiServerStandin, tmp_path: Path) -> Kube:
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return Kube(load_api_client(str(kubeconfig)), component="webhook")


class PagedSource:
    """The cache's own source for a kind, with a hook run after each list page (the test's moment)."""

    def __init__(self, kube: Kube, kind: CachedKind) -> None:
        self.source = KubeSource(kube, kind)
        self.after_page: Callable[[], None] = lambda: None

    @property
    def filtered(self) -> bool:
        return self.source.filtered

    def list_page(self, limit: int, continue_token: str | None) -> Any:
        return self.source.list_page(limit, continue_token)

    def list_page_raw(self, limit: int, continue_token: str | None) -> bytes:
        page = self.source.list_page_raw(limit, continue_token)
        self.after_page()
        return page

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        return self.source.watch(resource_version, interrupt, timeout_seconds)


async def test_pods_from_before_the_start_and_from_during_a_relist_are_both_counted(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    for name in ("before-1", "before-2"):
        apiserver.put(vgpu_pod(name=name))
    apiserver.put(pod(name="cpu-only"))  # asks for no vGPU: never held
    kube = Kube(
        load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))), component="webhook"
    )
    sources: dict[CachedKind, PagedSource] = {}

    def source(kind: CachedKind) -> PagedSource:
        sources[kind] = PagedSource(kube, kind)
        return sources[kind]

    cache = ClusterCache(kube, watch_timeout_seconds=5, retry_seconds=0.05, page_size=1, source=source)
    ledger = build_quota(cache, Config(), WebhookMetrics(), memory_book()).ledger
    await cache.start()
    try:
        async with asyncio.timeout(HANG_S):
            await cache.wait_synced()
        assert set(cache.objects("pod")) == {"default/before-1", "default/before-2"}
        assert cache.listed_read["pod"] == 3 and ledger.usage("default").number == 2
        created: list[str] = []

        def create_once() -> None:
            if not created:  # after the relist's first page: the pod is not in the list's snapshot
                created.append(apiserver.put(vgpu_pod(name="during"))["metadata"]["uid"])

        sources["pod"].after_page = create_once
        apiserver.set_outage(True)  # the watch is cut before it can see the deletion
        apiserver.delete("Pod", "before-2", "default")
        apiserver.expire_history()
        apiserver.set_outage(False)  # it resumes from a compacted version: 410, relist
        await until(
            lambda: cache.relists["pod"] == 2 and "default/during" in cache.objects("pod"), "relist", 30
        )
        assert set(cache.objects("pod")) == {"default/before-1", "default/during"}
        assert cache.has_pod_uid(created[0]) and ledger.usage("default").number == 2
    finally:
        await cache.stop()
        kube.close()


async def test_the_pod_stream_is_current_at_its_list_events_and_bookmarks(
    cache: ClusterCache, apiserver: ApiServerStandin, clock: FakeClock
) -> None:
    assert cache.pod_stream_current_at() == 1000.0  # the first list
    clock.now = 1100.0

    def bookmarked() -> bool:
        # A quiet cluster: only bookmarks arrive (sent again until a watch is open to take one).
        apiserver.send_bookmarks()
        return cache.pod_stream_current_at() == 1100.0

    await until(bookmarked, "a bookmark advances it")
    clock.now = 1200.0
    apiserver.put(vgpu_pod(name="p2"))
    await until(lambda: cache.pod_stream_current_at() == 1200.0, "an event advances it")
    clock.now = 1300.0
    # Watches end (timeoutSeconds=1): the API is heard from, but that confirms nothing new.
    await until(lambda: cache.lag_seconds() == 0.0, "every kind heard from at 1300")
    assert cache.pod_stream_current_at() == 1200.0


async def test_no_pod_stream_time_before_the_first_list(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    kube = Kube(
        load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))), component="webhook"
    )
    cache = ClusterCache(kube)
    assert cache.pod_stream_current_at() is None and not cache.has_pod_uid("u1")
    kube.close()


async def test_uids_follow_the_pods_held(cache: ClusterCache, apiserver: ApiServerStandin) -> None:
    assert cache.has_pod_uid("u1")
    apiserver.put(pod(name="cpu") | {"metadata": {"name": "cpu", "namespace": "default", "uid": "u-cpu"}})
    apiserver.delete("Pod", "p1", "default")
    await until(lambda: not cache.has_pod_uid("u1"), "the deleted pod's uid is forgotten")
    assert not cache.has_pod_uid("u-cpu") and "default/cpu" not in cache.objects("pod")


async def test_a_relist_after_410_takes_in_what_changed_in_the_gap_and_quota_follows(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    finishes_uid = apiserver.put(vgpu_pod(name="finishes"))["metadata"]["uid"]
    first_uid = apiserver.put(vgpu_pod(name="recreated"))["metadata"]["uid"]
    kube = client(apiserver, tmp_path)
    cache = ClusterCache(kube, watch_timeout_seconds=5, retry_seconds=0.05)
    ledger = build_quota(cache, Config(), WebhookMetrics(), memory_book()).ledger
    seen: list[tuple[str, str, str]] = []
    cache.subscribe(
        "pod", lambda e: seen.append((e.type, e.obj["metadata"]["name"], e.obj["metadata"]["uid"]))
    )
    await cache.start()
    try:
        async with asyncio.timeout(HANG_S):
            await cache.wait_synced()
        assert ledger.usage("default").number == 2
        apiserver.set_outage(True)  # the watch sees none of what follows
        finished = apiserver.get("Pod", "finishes", "default")
        assert finished is not None
        finished["status"]["phase"] = "Succeeded"  # a finished pod holds no quota
        apiserver.put(finished)
        apiserver.delete("Pod", "recreated", "default")
        second_uid = apiserver.put(vgpu_pod(name="recreated"))["metadata"]["uid"]
        apiserver.expire_history()
        apiserver.set_outage(False)  # it resumes from a compacted version: 410, relist
        await until(lambda: cache.relists["pod"] == 2, "the relist after 410", 30)
        assert cache.objects("pod")["default/finishes"]["status"]["phase"] == "Succeeded"
        assert not cache.has_pod_uid(first_uid) and cache.has_pod_uid(second_uid)
        # Same names, new states: the relist reports them as the changes they are.
        assert ("modified", "finishes", finishes_uid) in seen
        assert ("deleted", "recreated", first_uid) in seen and ("added", "recreated", second_uid) in seen
        assert ledger.usage("default").number == 1  # the re-created pod alone
    finally:
        await cache.stop()
        kube.close()
