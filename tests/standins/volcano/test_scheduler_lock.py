"""The Volcano stand-in's node lock and quantity reading, pinned to
Volcano's nodelock.go and pkg/scheduler/api/devices/util.go."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kube_vgpu.contract import names as n
from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.volcano.fit import container_asks
from kube_vgpu.standins.volcano.scheduler import VolcanoStandin

NAMES = ResourceNames()
A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
NOW = datetime(2026, 8, 20, 10, 0, 0, tzinfo=UTC)
READY = {NAMES.count: "10", NAMES.memory: "32768", NAMES.cores: "100"}


@pytest.fixture
def kube(apiserver: ApiServerStandin) -> Iterator[Kube]:
    record = GpuRecord(A, 10, 32768, "NVIDIA-Tesla V100-PCIE-32GB", True, "hami-core")
    apiserver.put(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "annotations": {n.NODE_REGISTER: encode_register([record])}},
            "status": {"capacity": READY, "allocatable": READY},
        }
    )
    client = Kube(apiserver.api_client())
    yield client
    client.close()


def add_pod(api: ApiServerStandin, name: str, memory: str = "3000") -> None:
    limits = {NAMES.count: "1", NAMES.memory: memory}
    api.put(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "schedulerName": "volcano",
                "containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}],
            },
        }
    )


def lock_of(api: ApiServerStandin) -> str | None:
    node = api.get("Node", "n1")
    assert node is not None
    return (node["metadata"].get("annotations") or {}).get(n.NODE_LOCK)


def test_the_lock_is_taken_on_allocate_and_refuses_the_next_pod_for_five_minutes(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    volcano = VolcanoStandin(kube, NAMES, node_lock=True, clock=lambda: NOW)
    add_pod(apiserver, "first")
    assert not isinstance(volcano.schedule_once()["default/first"], str)
    assert lock_of(apiserver) == "2026-08-20T10:00:00Z"  # RFC 3339, as Volcano writes it
    add_pod(apiserver, "second")
    volcano.clock = lambda: NOW + timedelta(minutes=4)
    assert volcano.schedule_once()["default/second"] == "node n1 has been locked within 5 minutes"
    second = apiserver.get("Pod", "second", "default")
    assert second is not None and not second["spec"].get("nodeName")


def test_an_expired_lock_is_replaced_and_an_unparseable_one_refuses(
    apiserver: ApiServerStandin, kube: Kube
) -> None:
    volcano = VolcanoStandin(kube, NAMES, node_lock=True, clock=lambda: NOW)
    apiserver.patch("Node", "n1", {"metadata": {"annotations": {n.NODE_LOCK: "2026-08-20T09:54:00Z"}}})
    add_pod(apiserver, "p")
    assert not isinstance(volcano.schedule_once()["default/p"], str)
    assert lock_of(apiserver) == "2026-08-20T10:00:00Z"
    add_pod(apiserver, "q")
    # Go's time.Parse(time.RFC3339) refuses all of these, so Volcano fails the allocation.
    for text in ("yesterday", "20200101T000000Z", "2020-01-01 00:00:00+00:00", "2020-01-01T00:00Z"):
        apiserver.patch("Node", "n1", {"metadata": {"annotations": {n.NODE_LOCK: text}}})
        assert "is not RFC 3339" in str(volcano.schedule_once()["default/q"]), text


def test_without_the_lock_nothing_is_written_to_the_node(apiserver: ApiServerStandin, kube: Kube) -> None:
    add_pod(apiserver, "p")
    assert not isinstance(VolcanoStandin(kube, NAMES).schedule_once()["default/p"], str)
    assert lock_of(apiserver) is None


@pytest.mark.parametrize(("written", "value"), [("3k", 3000), ("1e3", 1000), ("500m", 1), ("10k", 10000)])
def test_volcano_reads_limits_with_quantity_value(written: str, value: int) -> None:
    """Value() gives 3000 for 3k, 1 for 500m."""
    pod: dict[str, Any] = {
        "spec": {"containers": [{"name": "c", "resources": {"limits": {NAMES.memory: written}}}]}
    }
    assert container_asks(pod, NAMES)[0].memory_mib == value
