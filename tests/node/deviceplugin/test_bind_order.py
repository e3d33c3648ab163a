"""Allocate serves the pod the kubelet is admitting, over real gRPC and the API stand-in.

The kubelet stand-in admits pods as the real kubelet does (pkg/kubelet/kubelet.go):
in the order their binds reach it, one update per bind event; pods arriving together go in creation
order. Pods here are bound in the same second, in an order that is neither by name nor by creation,
as one Volcano session does; each container must get exactly the GPUs and limits booked for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.contract.names import (
    BIND_PHASE,
    BIND_TIME,
    DEVICES_TO_ALLOCATE,
    NODE_LOCK,
    VGPU_IDS_NEW,
    VGPU_NODE,
    VGPU_TIME,
)
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.node.plugin import NodePlugin
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.kubelet.admission import KubeletAdmission, PodAdmission
from kube_vgpu.standins.kubelet.deviceplugin import KubeletStandin
from kube_vgpu.standins.nvml.api import load_simulation
from tests.support.node import (
    COUNT,
    MEMORY,
    NODE,
    RESOURCE,
    UUID_A,
    UUID_B,
    container,
    eventually,
    node_object,
    plugin_settings,
    simulation,
)

SECOND = "1786255641"  # vgpu-time and bind-time: all binds of one scheduling session


class Cluster:
    """The API stand-in, one node's kubelet (device manager and admission) and its plugin."""

    def __init__(self, api: ApiServerStandin, kdir: Path, tmp: Path) -> None:
        self.api = api
        self.kdir = kdir
        self.tmp = tmp
        self.kubelet = KubeletStandin(kdir)
        self.admission = KubeletAdmission(self.kubelet, api, NODE, RESOURCE, seed=7)
        self.nvml = load_simulation(simulation(), NODE)
        self.nvml.nvmlInit()
        self.scheduler = Kube(api.api_client())
        self.plugin: NodePlugin | None = None
        self._kubes: list[Kube] = [self.scheduler]

    async def start_plugin(self, registrations: int = 1) -> None:
        kube = Kube(self.api.api_client())
        self._kubes.append(kube)
        self.plugin = NodePlugin(plugin_settings(self.kdir, self.tmp), self.nvml, kube)
        await self.plugin.start()
        await self.kubelet.wait_registered(RESOURCE, count=registrations)

    async def stop_plugin(self) -> None:
        assert self.plugin is not None
        await self.plugin.stop()
        self.plugin = None

    def create(
        self, name: str, containers: list[dict[str, Any]], *, init: list[dict[str, Any]] | None = None
    ) -> None:
        spec: dict[str, Any] = {"schedulerName": "volcano", "containers": containers}
        if init:
            spec["initContainers"] = init
        self.api.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": spec,
            }
        )

    def bind(self, name: str, devices: str, second: str = SECOND) -> None:
        """Volcano's bind (pkg/scheduler/api/devices/nvidia/vgpu/device_info.go): the six annotations on
        the Binding."""
        annotations = {
            VGPU_NODE: NODE,
            VGPU_TIME: second,
            BIND_TIME: second,
            BIND_PHASE: "allocating",
            VGPU_IDS_NEW: devices,
            DEVICES_TO_ALLOCATE: devices,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        }
        self.scheduler.create_binding(name, "default", body)

    def annotations(self, name: str) -> dict[str, str]:
        pod = self.api.get("Pod", name, "default")
        assert pod is not None
        return dict(pod["metadata"].get("annotations") or {})

    async def close(self) -> None:
        await self.admission.stop()
        if self.plugin is not None:
            await self.plugin.stop()
        await self.kubelet.stop()
        for kube in self._kubes:
            kube.close()
        self.nvml.nvmlShutdown()


@pytest.fixture
async def cluster(apiserver: ApiServerStandin, kdir: Path, tmp_path: Path) -> AsyncIterator[Cluster]:
    apiserver.put(node_object())
    c = Cluster(apiserver, kdir, tmp_path)
    try:
        await c.kubelet.start()
        await c.start_plugin()
        await c.admission.start()
        yield c
    finally:
        await c.close()


def gpu(name: str, memory: str) -> dict[str, Any]:
    # Written as users write it; the API stand-in stores it canonical (3000 -> 3k).
    return container(name, {COUNT: "1", MEMORY: memory})


def limits_seen(admission: PodAdmission) -> list[tuple[str, str, str]]:
    return [
        (c.container, c.envs.get("NVIDIA_VISIBLE_DEVICES", ""), c.envs.get("CUDA_DEVICE_MEMORY_LIMIT_0", ""))
        for c in admission.containers
    ]


def three_pods(c: Cluster) -> None:
    """Names sort a < m < z and creation order is z, a, m; they are bound m, z, a."""
    c.create("z-init", [gpu("main", "4000")], init=[container("setup")])
    c.create("a-single", [gpu("main", "5000")])
    c.create("m-two", [gpu("c1", "3000"), gpu("c2", "2000")])


EXPECTED = {
    "m-two": [("c1", UUID_A, "3000m"), ("c2", UUID_B, "2000m")],
    "z-init": [("main", UUID_B, "4000m")],
    "a-single": [("main", UUID_A, "5000m")],
}


def bind_three(c: Cluster) -> None:
    c.bind("m-two", f"{UUID_A},NVIDIA,3000,0:;{UUID_B},NVIDIA,2000,0:")
    c.bind("z-init", f"{UUID_B},NVIDIA,4000,0:")
    c.bind("a-single", f"{UUID_A},NVIDIA,5000,0:")


async def test_pods_bound_in_one_second_get_their_own_gpus_and_limits(cluster: Cluster) -> None:
    three_pods(cluster)
    stored = cluster.api.get("Pod", "m-two", "default")
    assert stored is not None and stored["spec"]["containers"][0]["resources"]["limits"][MEMORY] == "3k"
    bind_three(cluster)
    for name, expected in EXPECTED.items():
        admitted = await cluster.admission.wait_admitted("default", name)
        assert admitted.rejected is None, admitted.rejected
        assert limits_seen(admitted) == expected
        assert cluster.annotations(name)[BIND_PHASE] == "success"
    # The kubelet admitted them in bind order, neither by name nor by creation.
    assert [a.name for a in cluster.admission.admitted] == ["m-two", "z-init", "a-single"]


async def test_a_plugin_restarted_between_bind_and_allocate_falls_back_to_the_times(
    cluster: Cluster,
) -> None:
    # Pods bound before the plugin (re)started have no bind event it saw: the fallback (vgpu-time,
    # bind-time, creation) tells them apart when they were bound in different seconds.
    await cluster.stop_plugin()
    cluster.admission.pause()  # the kubelet is busy: it admits nothing before the plugin is back
    cluster.api.ops.clock = lambda: datetime(2026, 8, 20, 10, 0, 0, tzinfo=UTC)
    cluster.create("z-early", [gpu("main", "8000")])
    cluster.api.ops.clock = lambda: datetime(2026, 8, 20, 10, 0, 5, tzinfo=UTC)
    cluster.create("a-late", [gpu("main", "3000")])
    cluster.bind("z-early", f"{UUID_B},NVIDIA,8000,0:", second="1786255600")
    cluster.bind("a-late", f"{UUID_A},NVIDIA,3000,0:", second="1786255700")
    await cluster.start_plugin(registrations=2)
    await cluster.admission.resume()
    early = await cluster.admission.wait_admitted("default", "z-early")
    late = await cluster.admission.wait_admitted("default", "a-late")
    assert [a.name for a in cluster.admission.admitted] == ["z-early", "a-late"]
    assert limits_seen(early) == [("main", UUID_B, "8000m")]
    assert limits_seen(late) == [("main", UUID_A, "3000m")]


async def test_after_a_kubelet_restart_the_waiting_pods_go_in_creation_order(cluster: Cluster) -> None:
    # A restarted kubelet gets the waiting pods in one update and sorts them by creation time; the
    # plugin, told of the restart by the recreated socket, ranks them the same way.
    cluster.admission.pause()
    cluster.api.ops.clock = lambda: datetime(2026, 8, 20, 10, 0, 0, tzinfo=UTC)
    cluster.create("m-first-created", [gpu("main", "6000")])
    cluster.api.ops.clock = lambda: datetime(2026, 8, 20, 10, 0, 9, tzinfo=UTC)
    cluster.create("a-second-created", [gpu("main", "7000")])
    # Bound first and a second earlier: bind order and the times both say a-second-created first.
    cluster.bind("a-second-created", f"{UUID_A},NVIDIA,7000,0:", second="1786255600")
    cluster.bind("m-first-created", f"{UUID_B},NVIDIA,6000,0:", second="1786255601")
    assert cluster.plugin is not None
    watch = cluster.plugin.pod_watch
    assert watch is not None
    await eventually(lambda: all(watch.order.knows(p) for p in cluster.api.list("Pod", "default")))
    await cluster.kubelet.restart()
    await cluster.kubelet.wait_registered(RESOURCE, count=2)
    await cluster.admission.resume()
    first = await cluster.admission.wait_admitted("default", "m-first-created")
    second = await cluster.admission.wait_admitted("default", "a-second-created")
    assert [a.name for a in cluster.admission.admitted] == ["m-first-created", "a-second-created"]
    assert limits_seen(first) == [("main", UUID_B, "6000m")]
    assert limits_seen(second) == [("main", UUID_A, "7000m")]


async def test_the_node_lock_is_released_after_the_last_allocate(cluster: Cluster) -> None:
    # With Volcano's node lock on, the plugin deletes
    # `hamivgpu` after the pod's last Allocate; the scheduler never does.
    cluster.create("two", [gpu("c1", "3000"), gpu("c2", "2000")])
    cluster.admission.pause()
    cluster.api.patch("Node", NODE, {"metadata": {"annotations": {NODE_LOCK: "2026-08-20T10:00:00Z"}}})
    cluster.bind("two", f"{UUID_A},NVIDIA,3000,0:;{UUID_B},NVIDIA,2000,0:")
    cluster.api.clear_requests()
    await cluster.admission.resume()
    admitted = await cluster.admission.wait_admitted("default", "two")
    assert admitted.rejected is None and len(admitted.containers) == 2
    await eventually(lambda: NODE_LOCK not in node_annotations(cluster))
    writes = [(r.method, r.path) for r in cluster.api.requests() if r.method == "PATCH"]
    pod_writes = [i for i, (_, path) in enumerate(writes) if "/pods/two" in path]
    node_writes = [i for i, (_, path) in enumerate(writes) if path.endswith(f"/nodes/{NODE}")]
    assert len(pod_writes) == 2 and node_writes and min(node_writes) > max(pod_writes)


async def test_the_node_lock_is_released_when_allocate_refuses(cluster: Cluster) -> None:
    cluster.create("forged", [gpu("main", "3000")])
    cluster.api.patch("Node", NODE, {"metadata": {"annotations": {NODE_LOCK: "2026-08-20T10:00:00Z"}}})
    cluster.bind("forged", "GPU-00000000-0000-4000-8000-000000000000,NVIDIA,3000,0:")  # not this node's
    admitted = await cluster.admission.wait_admitted("default", "forged")
    assert admitted.rejected is not None and "not a GPU of this node" in admitted.rejected
    assert cluster.annotations("forged")[BIND_PHASE] == "failed"
    failed = cluster.api.get("Pod", "forged", "default")
    assert failed is not None and failed["status"]["reason"] == "UnexpectedAdmissionError"
    await eventually(lambda: NODE_LOCK not in node_annotations(cluster))


def node_annotations(c: Cluster) -> dict[str, str]:
    node = c.api.get("Node", NODE)
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})


async def test_the_node_lock_is_released_when_the_allocation_cannot_be_recorded(cluster: Cluster) -> None:
    # The reference plugin (pkg/util/nodelock/nodelock.go) releases the lock "on any per-pod failure", a
    # refused write included.
    cluster.create("p", [gpu("main", "3000")])
    cluster.api.patch("Node", NODE, {"metadata": {"annotations": {NODE_LOCK: "2026-08-20T10:00:00Z"}}})
    cluster.api.deny("patch", "pods")
    try:
        cluster.bind("p", f"{UUID_A},NVIDIA,3000,0:")
        admitted = await cluster.admission.wait_admitted("default", "p")
        assert admitted.rejected is not None and "cannot record the allocation" in admitted.rejected
        await eventually(lambda: NODE_LOCK not in node_annotations(cluster))
    finally:
        cluster.api.allow_all()
