"""The cluster cache against the stand-in API server, through the real client: sync, watch events,
watch timeouts, 410 Gone with a deletion in the gap, outage and staleness, subscriptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kube_vgpu.kubeapi.client import Kube, load_api_client
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cache import CachedKind, CacheEvent, ClusterCache
from tests.support.webhook import A100, gpu_node, pod


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def until(condition: Callable[[], bool], what: str, limit_s: float = 10.0) -> None:
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
    apiserver.put(pod(name="p1") | {"metadata": {"name": "p1", "namespace": "default", "uid": "u1"}})
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
    async with asyncio.timeout(10):
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
    events: list[CacheEvent] = []
    cache.subscribe("pod", events.append)
    apiserver.put(gpu_node("n2", "mig", [("NVIDIA H100 80GB HBM3", 81920)]))
    apiserver.put(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team", "labels": {"a": "b"}}}
    )
    apiserver.put(pod(name="p2"))
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
    await asyncio.sleep(2.5)
    apiserver.close_watches()
    apiserver.put(pod(name="late"))
    await until(lambda: "default/late" in cache.objects("pod"), "event after several watch ends")
    watches = [r for r in apiserver.requests("GET", "/api/v1/pods") if r.query.get("watch") in ("true", "1")]
    assert len(watches) >= 3 and all(r.query.get("timeoutSeconds") == "1" for r in watches)
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
    apiserver.put(pod(name="born-in-gap"))
    apiserver.expire_history()
    apiserver.set_outage(False)
    await until(lambda: "pod" in relisted and "node" in relisted, "relist after 410")
    assert ("deleted", "p1") in seen and ("deleted", "n1") in seen and ("added", "born-in-gap") in seen
    assert "default/p1" not in cache.objects("pod") and "n1" not in cache.inventory.nodes
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
    def broken(event: CacheEvent) -> None:
        raise RuntimeError("boom")

    cache.subscribe("pod", broken)
    apiserver.put(pod(name="a"))
    apiserver.put(pod(name="b"))
    await until(lambda: {"default/a", "default/b"} <= set(cache.objects("pod")), "both pods")


async def test_the_pod_stream_is_current_at_its_list_and_each_pod_event_not_at_other_kinds(
    cache: ClusterCache, apiserver: ApiServerStandin, clock: FakeClock
) -> None:
    assert cache.pod_stream_current_at() == 1000.0  # the first list, on the cache's clock
    clock.now = 1010.0
    apiserver.put(gpu_node("n2", "mig", [("NVIDIA H100 80GB HBM3", 81920)]))
    await until(lambda: "n2" in cache.inventory.nodes, "node event")
    # A node event, and watch streams ending by their timeout, say nothing of the pod stream.
    apiserver.close_watches()
    await asyncio.sleep(0.2)
    assert cache.pod_stream_current_at() == 1000.0
    apiserver.put(pod(name="p2"))
    await until(lambda: cache.pod_stream_current_at() == 1010.0, "a pod event moves it on")


async def test_the_pod_stream_has_no_position_before_its_first_list(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    kube = Kube(
        load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))), component="webhook"
    )
    try:
        assert ClusterCache(kube).pod_stream_current_at() is None
    finally:
        kube.close()
