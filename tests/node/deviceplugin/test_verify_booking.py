"""The node plugin checks every booking against the container's own limits, and reads those
limits in the apiserver's canonical form, over real gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.contract.names import BIND_PHASE, VGPU_IDS_NEW
from kube_vgpu.contract.quantity import INT32_MAX
from kube_vgpu.node.deviceplugin.verify import booking_problem
from kube_vgpu.node.events import ALLOCATE_FAILED
from kube_vgpu.standins.apiserver import quantity as k8s
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.contract.test_quantity import FACTS_TABLE
from tests.node.test_events import describe_events
from tests.support.node import (
    CORES,
    COUNT,
    GPUS,
    MEMORY,
    UUID_A,
    Harness,
    container,
    eventually,
    make_pod,
    node_object,
    running_plugin,
)

NAMES = ResourceNames()
BY_UUID = {g.uuid: g for g in GPUS}
CARD = GPUS[0].memory_mib  # 32768


@pytest.fixture
async def h(apiserver: ApiServerStandin, kdir: Path, tmp_path: Path) -> AsyncIterator[Harness]:
    apiserver.put(node_object())
    async with running_plugin(apiserver, kdir, tmp_path) as harness:
        yield harness


async def refused(h: Harness) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as info:
        await h.allocate(1)
    return info.value


@pytest.mark.parametrize(("written", "seen"), FACTS_TABLE)
async def test_every_row_of_the_quantity_table_through_the_node_plugin(
    h: Harness, written: str, seen: str
) -> None:
    """The pod carries what the apiserver stores (`seen`), Volcano books what `Value()` gives; only a whole
    number without a binary suffix, within the card and int32, is a usable number of MiB."""
    booked = k8s.value(seen)
    h.api.put(
        make_pod("p", [container("main", {COUNT: "1", MEMORY: written})], ids=f"{UUID_A},NVIDIA,{booked},0:")
    )
    stored = h.pod("p")["spec"]["containers"][0]["resources"]["limits"][MEMORY]
    assert stored == seen  # the stand-in API server canonicalised it
    usable = "i" not in seen and "m" not in seen and booked <= min(CARD, INT32_MAX)
    if usable:
        response = await h.allocate(1)
        assert response.container_responses[0].envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{booked}m"
        assert h.annotations("p")[BIND_PHASE] == "success"
    else:
        error = await refused(h)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "pod default/p" in (error.details() or "")
        assert h.annotations("p")[BIND_PHASE] == "failed"


async def test_an_edited_booking_is_refused_naming_both_figures(h: Harness) -> None:
    # The author asked 10000 MiB; devices-to-allocate was edited to the whole card before Allocate.
    pod = make_pod(
        "p",
        [container("main", {COUNT: "1", MEMORY: "10000", CORES: "30"})],
        ids=f"{UUID_A},NVIDIA,10000,30:",
        to_allocate=f"{UUID_A},NVIDIA,{CARD},30:",
    )
    uid = h.api.put(pod)["metadata"]["uid"]
    error = await refused(h)
    details = error.details() or ""
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"booked with {CARD} MiB" in details and "asks 10000 MiB" in details and "'main'" in details
    annotations = h.annotations("p")
    assert annotations[BIND_PHASE] == "failed"
    assert annotations[VGPU_IDS_NEW] == f"{UUID_A},NVIDIA,10000,30:"  # the permanent record is untouched
    # ... and the pod's events say so (`kubectl describe pod`), naming both figures.
    await eventually(lambda: bool(describe_events(h.api, "Pod", "p", "default", uid)))
    (event,) = describe_events(h.api, "Pod", "p", "default", uid)
    assert event["type"] == "Warning" and event["reason"] == ALLOCATE_FAILED
    assert f"booked with {CARD} MiB" in event["message"] and "asks 10000 MiB" in event["message"]


async def test_edited_cores_are_refused_and_an_honest_booking_still_allocates(h: Harness) -> None:
    h.api.put(
        make_pod(
            "cheat",
            [container("main", {COUNT: "1", MEMORY: "1000"})],
            ids=f"{UUID_A},NVIDIA,1000,0:",
            to_allocate=f"{UUID_A},NVIDIA,1000,100:",
        )
    )
    error = await refused(h)
    assert "booked with 100% cores" in (error.details() or "") and "asks 0%" in (error.details() or "")
    h.api.put(
        make_pod(
            "honest",
            [container("main", {COUNT: "1", MEMORY: "1000", CORES: "25"})],
            ids=f"{UUID_A},NVIDIA,1000,25:",
        )
    )
    response = await h.allocate(1)
    assert response.container_responses[0].envs["CUDA_DEVICE_SM_LIMIT"] == "25"


def records(*pairs: tuple[int, int]) -> tuple[DeviceRecord, ...]:
    return tuple(DeviceRecord(GPUS[i].uuid, mem, cores) for i, (mem, cores) in enumerate(pairs))


@pytest.mark.parametrize(
    ("limits", "booking", "problem"),
    [
        ({COUNT: "1", MEMORY: "3k"}, records((3000, 0)), None),
        (
            {COUNT: "1", MEMORY: "3k"},
            records((3001, 0)),
            "booked with 3001 MiB but container 'c' asks 3000 MiB",
        ),
        ({COUNT: "1", "volcano.sh/vgpu-memory-percentage": "25"}, records((CARD // 4, 0)), None),
        ({COUNT: "1", "volcano.sh/vgpu-memory-percentage": "25"}, records((CARD, 0)), "asks 8192 MiB"),
        ({COUNT: "1"}, records((CARD, 0)), None),  # neither memory nor percentage: the whole card
        ({COUNT: "1"}, records((0, 0)), None),  # ... which a booking may also write as 0
        # ... but only then: 0 MiB booked for a container asking 100 would let HAMi-core give it
        # the whole card (issue 22).
        ({COUNT: "1", MEMORY: "100"}, records((0, 0)), "booked with 0 MiB but container 'c' asks 100 MiB"),
        ({COUNT: "1", "volcano.sh/vgpu-memory-percentage": "25"}, records((0, 0)), "asks 8192 MiB"),
        ({COUNT: "1", MEMORY: "100"}, records((99, 0)), "booked with 99 MiB"),  # one short
        ({COUNT: "1", MEMORY: "100"}, records((101, 0)), "booked with 101 MiB"),  # one over
        ({COUNT: "1", MEMORY: "100"}, records((100, 0)), None),
        ({COUNT: "1", MEMORY: str(CARD)}, records((0, 0)), None),  # asks the whole card: 0 means that
        ({COUNT: "2", MEMORY: "100"}, records((100, 0)), "holds 1 device(s) but container 'c' asks 2"),
        ({COUNT: "1", MEMORY: "100", CORES: "30"}, records((100, 31)), "booked with 31% cores"),
        ({COUNT: "1", MEMORY: "500m"}, records((1, 0)), "unreadable"),
        ({COUNT: "1", MEMORY: "3Gi"}, records((3072, 0)), "unreadable"),
    ],
)
def test_booking_against_limits(
    limits: dict[str, str], booking: tuple[DeviceRecord, ...], problem: str | None
) -> None:
    found = booking_problem(booking, {"name": "c", "resources": {"limits": limits}}, NAMES, BY_UUID)
    assert (found is None) if problem is None else (found is not None and problem in found), found


def test_a_nameless_container_is_named_as_empty_in_the_refusal() -> None:
    found = booking_problem(
        records((5, 0)), {"resources": {"limits": {COUNT: "1", MEMORY: "100"}}}, NAMES, BY_UUID
    )
    assert found == f"device {GPUS[0].uuid} is booked with 5 MiB but container '' asks 100 MiB"


def test_requests_count_when_limits_leave_memory_out() -> None:
    """Volcano (pkg/scheduler/api/devices/util.go): memory is the limit, else the request (cores likewise)."""
    c = {"name": "c", "resources": {"limits": {COUNT: "1"}, "requests": {MEMORY: "2k", CORES: "10"}}}
    assert booking_problem(records((2000, 10)), c, NAMES, BY_UUID) is None
    assert booking_problem(records((2000, 0)), c, NAMES, BY_UUID) is not None
