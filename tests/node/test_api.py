"""Which resourceVersion the node plugin's own lists of its pods ask for, against the stand-in API
server through the real client: the periodic sweeps from the API server's watch cache (never older
than the last list), the reads that must see a bind made a moment ago as consistent reads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.kubeapi.client import ApiError, Kube, load_api_client
from kube_vgpu.node.api import NodeApi
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import NODE
from tests.support.timeouts import HANG_S


def bound(name: str, node: str = NODE) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


def kube_for(apiserver: ApiServerStandin, path: Path) -> Kube:
    return Kube(load_api_client(str(apiserver.write_kubeconfig(path))), component="node")


@pytest.fixture
def api(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[NodeApi]:
    node_api = NodeApi(kube_for(apiserver, tmp_path / "kubeconfig"), NODE)
    yield node_api
    node_api.close()
    node_api.kube.close()


def pod_lists(apiserver: ApiServerStandin) -> list[tuple[dict[str, str], int | None]]:
    """(query, status) of each pod list the stand-in answered, oldest first."""
    return [(r.query, r.status) for r in apiserver.requests("GET", "/api/v1/pods")]


def names(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


async def test_a_sweep_lists_from_the_watch_cache_and_then_never_older_than_its_last_list(
    apiserver: ApiServerStandin, api: NodeApi
) -> None:
    apiserver.put(bound("a"))
    apiserver.put(bound("elsewhere", "gpu-node-2"))
    assert names(await api.pods_on_node_cached(5.0)) == ["a"]
    first_version = str(apiserver.store.rv)
    apiserver.put(bound("b"))
    assert names(await api.pods_on_node_cached(5.0)) == ["a", "b"]
    (first, _), (second, _) = pod_lists(apiserver)
    assert first == {"fieldSelector": f"spec.nodeName={NODE}", "resourceVersion": "0"}
    # Unpaged: kube-apiserver serves a list with a limit at a version other than "0" from etcd.
    assert second == {
        "fieldSelector": f"spec.nodeName={NODE}",
        "resourceVersion": first_version,
        "resourceVersionMatch": "NotOlderThan",
    }


async def test_the_reads_that_must_see_a_new_bind_stay_consistent(
    apiserver: ApiServerStandin, api: NodeApi
) -> None:
    apiserver.put(bound("a"))
    await api.pods_on_node_cached(5.0)
    apiserver.put(bound("b"))
    # An Allocate's list: the pod bound a moment ago must be there, whatever the cache holds.
    assert names(await api.pods_on_node(5.0)) == ["a", "b"]
    api.read_node(timeout=5.0)
    assert "resourceVersion" not in pod_lists(apiserver)[-1][0]
    node_reads = [r.query for r in apiserver.requests("GET", "/api/v1/nodes")]
    assert node_reads == [{"fieldSelector": f"metadata.name={NODE}"}]


async def test_a_version_the_server_has_not_reached_is_read_again_at_once_consistently(
    apiserver: ApiServerStandin, api: NodeApi, tmp_path: Path
) -> None:
    # An API server restored from an older etcd backup: the version last seen lies in its future.
    for index in range(20):
        apiserver.put(bound(f"old-{index}"))
    await api.pods_on_node_cached(5.0)
    await api.pods_on_node_cached(5.0)
    seen = str(apiserver.store.rv)
    with ApiServerStandin() as restored:
        restored.put(bound("a"))
        restored_version = str(restored.store.rv)
        api.kube.close()
        api.kube = kube_for(restored, tmp_path / "restored")
        assert names(await api.pods_on_node_cached(5.0)) == ["a"]
        (too_new, refused), (again, answered) = pod_lists(restored)
        assert too_new.get("resourceVersion") == seen and refused == 504
        assert "resourceVersion" not in again and answered == 200
        # The consistent read's version is the one asked for next.
        restored.put(bound("b"))
        assert names(await api.pods_on_node_cached(5.0)) == ["a", "b"]
        assert pod_lists(restored)[-1][0].get("resourceVersion") == restored_version


async def test_a_refusal_other_than_an_unavailable_version_is_not_retried(
    apiserver: ApiServerStandin, api: NodeApi
) -> None:
    await api.pods_on_node_cached(5.0)
    apiserver.deny("list", "pods")
    with pytest.raises(ApiError) as info:
        await api.pods_on_node_cached(5.0)
    assert info.value.status == 403
    assert [status for _, status in pod_lists(apiserver)] == [200, 403]


class HeldCachedLists(Kube):
    """The real client, whose lists from the watch cache (`NotOlderThan`) are answered by the server at
    once but handed to the caller only when the test says: a cached list sent before a consistent read
    that answers after it."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.api_client, component="node")
        self.answered = threading.Event()
        self.release = threading.Event()

    def list(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        result = super().list(*args, **kwargs)
        if kwargs.get("resource_version_match") == "NotOlderThan":
            self.answered.set()
            assert self.release.wait(HANG_S)
        return result


async def test_a_cached_list_answering_after_a_consistent_read_does_not_lower_the_floor(
    apiserver: ApiServerStandin, api: NodeApi
) -> None:
    held = HeldCachedLists(api.kube)
    api.kube = held
    apiserver.put(bound("a"))
    await api.pods_on_node_cached(5.0)
    apiserver.put(bound("b"))
    sweep = asyncio.create_task(api.pods_on_node_cached(HANG_S))
    assert await asyncio.to_thread(held.answered.wait, HANG_S)
    sweep_version = str(apiserver.store.rv)  # the version the held sweep's list was answered at
    apiserver.put(bound("c"))
    # An Allocate's consistent read, while the sweep's answer is on its way.
    assert names(await api.pods_on_node(5.0)) == ["a", "b", "c"]
    allocate_version = str(apiserver.store.rv)
    assert int(sweep_version) < int(allocate_version)
    held.release.set()
    assert names(await sweep) == ["a", "b"]
    # The next sweep reads no state older than the one the Allocate acted on.
    assert names(await api.pods_on_node_cached(5.0)) == ["a", "b", "c"]
    assert pod_lists(apiserver)[-1][0] == {
        "fieldSelector": f"spec.nodeName={NODE}",
        "resourceVersion": allocate_version,
        "resourceVersionMatch": "NotOlderThan",
    }
