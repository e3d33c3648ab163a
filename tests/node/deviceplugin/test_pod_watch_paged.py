"""The node plugin's two watches (its pods, its Node) read their lists through the one reflector as
every other list is read: in pages (`limit`/`continue`), against the stand-in API server through the
real client; the first page names resourceVersion "0", so that the API server's watch cache answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.kubeapi.client import Kube, WatchInterrupt, load_api_client
from kube_vgpu.kubeapi.listwatch import KubeSource
from kube_vgpu.node.api import NodeApi
from kube_vgpu.node.deviceplugin.bind_order import BindOrder
from kube_vgpu.node.deviceplugin.pod_watch import PodWatch
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.publish.publisher import NodePublisher
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.node import GPUS, NODE, node_object
from tests.support.timeouts import HANG_S


def bound(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
    }


@pytest.fixture
def api(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[NodeApi]:
    kube = Kube(load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))))
    node_api = NodeApi(kube, NODE)
    yield node_api
    node_api.close()
    kube.close()


def list_requests(apiserver: ApiServerStandin, path: str) -> list[dict[str, str]]:
    return [r.query for r in apiserver.requests("GET", path) if r.query.get("watch") is None]


async def test_the_pod_watch_lists_this_nodes_pods_page_by_page(
    apiserver: ApiServerStandin, api: NodeApi
) -> None:
    mine = [apiserver.put(bound(f"p{index}", NODE)) for index in range(5)]
    elsewhere = apiserver.put(bound("other", "gpu-node-2"))
    watch = PodWatch(api, BindOrder(), call_budget=5.0, watch_timeout=5, page_size=2)
    loop = asyncio.get_running_loop()
    thread = loop.run_in_executor(None, watch.watch_forever, loop)
    try:
        assert await watch.wait_known(mine, within=HANG_S)
    finally:
        watch.stop()
        await thread
    assert not watch.order.knows(elsewhere)
    lists = list_requests(apiserver, "/api/v1/pods")
    assert [q.get("limit") for q in lists] == ["2", "2", "2"]  # 5 pods: pages of 2, 2 and 1
    assert all(q.get("fieldSelector") == f"spec.nodeName={NODE}" for q in lists)
    assert "continue" not in lists[0] and all(q.get("continue") for q in lists[1:])
    # The first page from the watch cache; the later ones follow their token, which names its version.
    assert [q.get("resourceVersion") for q in lists] == ["0", None, None]


async def test_the_node_watch_lists_its_node_in_a_page_and_sees_a_drift_there(
    apiserver: ApiServerStandin, api: NodeApi, caplog: pytest.LogCaptureFixture
) -> None:
    apiserver.put(node_object())  # as the kubelet registered it: nothing published yet, so drifted
    publisher = NodePublisher(
        api, LiveGpus(list(GPUS), 10, NODE), mode="hami-core", names=ResourceNames(), interval=30
    )
    loop = asyncio.get_running_loop()
    caplog.set_level(logging.INFO, logger="kube_vgpu.node.publish.publisher")
    thread = loop.run_in_executor(None, publisher.watch_forever, loop)
    try:
        async with asyncio.timeout(HANG_S):
            while "event=node_drift" not in caplog.text:  # noqa: ASYNC110 - logged on the loop
                await asyncio.sleep(0.01)
    finally:
        publisher.stop_watch()
        await thread
    (listed,) = list_requests(apiserver, "/api/v1/nodes")
    assert listed.get("limit") == "500" and listed.get("fieldSelector") == f"metadata.name={NODE}"
    assert listed.get("resourceVersion") == "0"


class CompactingPods:
    """The real source of a node's pods; after the first page of its list, a pod is bound, one is
    deleted and etcd compacts past the list's version, so the continue token of the second page has
    expired."""

    def __init__(self, source: KubeSource, apiserver: ApiServerStandin) -> None:
        self.source = source
        self.apiserver = apiserver
        self.pages = 0

    def list_page(self, limit: int, continue_token: str | None) -> Mapping[str, Any]:
        return self._counted(self.source.list_page(limit, continue_token))

    def list_page_at(self, limit: int | None, resource_version: str) -> Mapping[str, Any]:
        return self._counted(self.source.list_page_at(limit, resource_version))

    def _counted(self, page: Mapping[str, Any]) -> Mapping[str, Any]:
        self.pages += 1
        if self.pages == 1:
            self.apiserver.put(bound("late", NODE))
            self.apiserver.delete("Pod", "p4", "default")
            self.apiserver.expire_history()
        return page

    def watch(self, resource_version: str, interrupt: WatchInterrupt, timeout_seconds: int) -> Any:
        return self.source.watch(resource_version, interrupt, timeout_seconds)


class CompactingApi(NodeApi):
    """The real NodeApi, whose pod source compacts the history mid-list (`CompactingPods`)."""

    def __init__(self, kube: Kube, node: str, apiserver: ApiServerStandin) -> None:
        super().__init__(kube, node)
        self.apiserver = apiserver
        self.pods: CompactingPods | None = None

    def pods_source(self, list_timeout: float) -> Any:
        self.pods = CompactingPods(super().pods_source(list_timeout), self.apiserver)
        return self.pods


async def test_an_expired_continue_token_mid_list_gives_the_bind_order_one_whole_fresh_list(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    mine = [apiserver.put(bound(f"p{index}", NODE)) for index in range(5)]
    kube = Kube(load_api_client(str(apiserver.write_kubeconfig(tmp_path / "kubeconfig"))))
    api = CompactingApi(kube, NODE, apiserver)
    order = BindOrder()
    taken: list[list[str]] = []
    listed = order.listed

    def record(pods: Any) -> None:
        pods = list(pods)
        taken.append(sorted(p["metadata"]["name"] for p in pods))
        listed(pods)

    order.listed = record  # type: ignore[method-assign]
    watch = PodWatch(api, order, call_budget=5.0, watch_timeout=5, page_size=2)
    loop = asyncio.get_running_loop()
    thread = loop.run_in_executor(None, watch.watch_forever, loop)
    try:
        assert await watch.wait_known(mine[:4], within=HANG_S)
    finally:
        watch.stop()
        await thread
        api.close()
        kube.close()
    # One list reached the bind order, the restarted one: neither the half read before the token
    # expired (a pod missed or deleted counted) nor the two halves joined (p0, p1 twice).
    assert taken == [["late", "p0", "p1", "p2", "p3"]]
    assert api.pods is not None and api.pods.pages == 1 + 3 and not order.knows(mine[4])
