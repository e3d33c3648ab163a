"""The pure bind-order ranking (node.bind_order), event by event."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.node.deviceplugin.bind_order import BindOrder, fallback_key
from kube_vgpu.node.deviceplugin.pod_watch import PodWatch
from kube_vgpu.node.nvml.gpus import GpuInfo
from kube_vgpu.node.nvml.inventory import LiveGpus
from kube_vgpu.node.publish.publisher import NodePublisher
from tests.support.timeouts import HANG_S


def pod(name: str, *, vgpu_time: str = "100", created: str = "2026-08-20T10:00:00Z") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": {"volcano.sh/vgpu-time": vgpu_time, "volcano.sh/bind-time": vgpu_time},
        }
    }


def ranked(order: BindOrder, *pods: dict[str, Any]) -> list[str]:
    return [p["metadata"]["name"] for p in sorted(pods, key=order.key)]


def test_watched_binds_rank_in_event_order_not_by_name_or_time() -> None:
    order = BindOrder()
    order.listed([])
    b, a, c = pod("b", vgpu_time="300"), pod("a", vgpu_time="200"), pod("c", vgpu_time="100")
    for p in (b, a, c):
        order.event("ADDED", p)
    order.event("MODIFIED", b)  # a later change is not a second bind
    assert ranked(order, a, b, c) == ["b", "a", "c"]


def test_listed_pods_rank_first_by_the_fallback_then_watched_ones() -> None:
    order = BindOrder()
    old_late, old_early = pod("x", vgpu_time="200"), pod("y", vgpu_time="100")
    order.listed([old_late, old_early])
    new = pod("a", vgpu_time="50")
    order.event("ADDED", new)
    assert ranked(order, new, old_late, old_early) == ["y", "x", "a"]


def test_unknown_pods_rank_after_every_known_one() -> None:
    order = BindOrder()
    order.listed([])
    known, unknown = pod("z"), pod("a", vgpu_time="1")
    order.event("ADDED", known)
    assert not order.knows(unknown)
    assert ranked(order, unknown, known) == ["z", "a"]


def test_a_relist_forgets_deleted_pods_and_ranks_new_ones_by_the_fallback() -> None:
    order = BindOrder()
    first, gone = pod("first"), pod("gone")
    order.listed([first, gone])
    late, early = pod("late", vgpu_time="900"), pod("early", vgpu_time="800")
    order.listed([first, late, early])
    assert not order.knows(gone)
    assert ranked(order, late, early, first) == ["first", "early", "late"]


def test_deleted_event_forgets_and_a_kubelet_restart_ranks_the_waiting_by_creation() -> None:
    order = BindOrder()
    order.listed([])
    bound_first = pod("p", created="2026-08-20T10:00:09Z")
    bound_second = pod("q", created="2026-08-20T10:00:01Z")
    order.event("ADDED", bound_first)
    order.event("ADDED", bound_second)
    order.kubelet_restarted([bound_first, bound_second])
    assert ranked(order, bound_first, bound_second) == ["q", "p"]
    order.event("DELETED", bound_second)
    assert not order.knows(bound_second)


def test_hostile_times_sort_last_without_raising() -> None:
    odd = [pod("a", vgpu_time="x"), pod("b", vgpu_time="9" * 40), pod("c", vgpu_time="\u0663")]
    assert sorted(odd, key=fallback_key)[0]["metadata"]["name"] == "a"  # all max: then by name
    order = BindOrder()
    order.listed([*odd, {"metadata": "not a mapping"}, {}])
    assert all(order.knows(p) for p in odd)


def test_pods_found_by_a_relist_rank_after_binds_already_seen() -> None:
    # The watch saw A's bind, then broke; B was bound meanwhile and shows up only in the relist.
    order = BindOrder()
    order.listed([])
    a, b = pod("a", vgpu_time="500"), pod("b", vgpu_time="100")
    order.event("ADDED", a)
    order.listed([a, b])
    assert ranked(order, b, a) == ["a", "b"]


class FlakyApi:
    """A pod API whose first watch breaks with garbage (a cut-off JSON line), then works."""

    node_name = "n1"

    def __init__(self) -> None:
        self.lists = 0
        self.asked: list[str] = []  # the resourceVersion each list asked for
        self.watches: list[str] = []
        self.stop, self.released = threading.Event(), threading.Event()

    def pods_source(self, list_timeout: float) -> FlakyApi:
        return self  # the reflector's source: list_page(_at) and watch below

    def list_page(self, limit: int, continue_token: str | None) -> dict[str, Any]:
        self.lists += 1
        return {"items": [], "metadata": {"resourceVersion": "10"}}

    def list_page_at(self, limit: int | None, resource_version: str) -> dict[str, Any]:
        self.asked.append(resource_version)
        return self.list_page(limit or 0, None)

    def watch(self, version: str, interrupt: Any, timeout_seconds: int) -> Any:
        self.watches.append(version)
        if len(self.watches) == 1:
            raise json.JSONDecodeError("Unterminated string", '{"type": "ADD', 13)
        if len(self.watches) == 2:
            p = pod("a")
            p["metadata"]["resourceVersion"] = "11"
            yield {"type": "ADDED", "object": p}
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}
            return  # the server ends the watch: resumed from 12, no relist
        self.stop.set()
        self.released.wait(10)  # a real watch blocks until the server's timeout
        yield from ()


async def test_a_garbled_watch_stream_costs_a_relist_not_the_watch() -> None:
    api = FlakyApi()
    watch = PodWatch(api, BindOrder(), call_budget=1.0, watch_timeout=5)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    thread = loop.run_in_executor(None, watch.watch_forever, loop)
    try:
        assert await watch.wait_known([pod("a")], within=HANG_S)
        async with asyncio.timeout(HANG_S):
            while not api.stop.is_set():  # noqa: ASYNC110 - the fake sets a threading.Event
                await asyncio.sleep(0.01)
    finally:
        watch.stop()
        api.released.set()
        await thread
    assert api.lists == 2  # the first list, and one after the garbled stream
    # From the API server's watch cache: at any version first, then not older than the one seen.
    assert api.asked == ["0", "10"]
    assert api.watches == ["10", "10", "12"]  # resumed from the bookmark's version, not relisted


class GarbledNodeApi:
    """A node API whose first read breaks with garbage, then answers and blocks in its watch."""

    node_name = "n1"

    def __init__(self) -> None:
        self.reads = 0
        self.asked: list[str] = []  # the resourceVersion each list asked for
        self.watching, self.released = threading.Event(), threading.Event()

    def node_source(self, list_timeout: float) -> GarbledNodeApi:
        return self  # the reflector's source: list_page(_at) and watch below

    def list_page(self, limit: int, continue_token: str | None) -> dict[str, Any]:
        self.reads += 1
        if self.reads == 1:
            raise json.JSONDecodeError("Unterminated string", '{"items": [', 11)
        return {"items": [], "metadata": {"resourceVersion": "5"}}

    def list_page_at(self, limit: int | None, resource_version: str) -> dict[str, Any]:
        self.asked.append(resource_version)
        return self.list_page(limit or 0, None)

    def watch(self, version: str, interrupt: Any, timeout_seconds: int) -> Any:
        self.watching.set()
        self.released.wait(10)
        yield from ()


async def test_the_node_watch_also_survives_a_garbled_answer() -> None:
    # The twin of the pod watch's loop: an unexpected error costs a retry, not the watch.
    api = GarbledNodeApi()
    gpus = [GpuInfo(index=0, uuid="GPU-a", name="NVIDIA A100", minor=0, memory_mib=81920)]
    publisher = NodePublisher(
        api,  # type: ignore[arg-type]
        LiveGpus(gpus, 10, "n1"),
        mode="hami-core",
        names=ResourceNames(),
        interval=30,
    )
    loop = asyncio.get_running_loop()
    thread = loop.run_in_executor(None, publisher.watch_forever, loop)
    try:
        assert await asyncio.to_thread(api.watching.wait, 20)
    finally:
        publisher.stop_watch()
        api.released.set()
        await thread
    assert api.reads == 2
    assert api.asked == ["0", "0"]  # no list succeeded before the retry: still any version
