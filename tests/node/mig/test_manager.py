"""The MIG manager over the simulated NVML: slots made and handed out, refusals, reconcile, adoption."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kube_vgpu.contract.mig.geometry import parse_device_config
from kube_vgpu.node.mig.manager import MigManager, MigRefused
from kube_vgpu.node.mig.nvml import read_state
from kube_vgpu.standins.nvml.api import SimProcess, SimulatedNvml
from tests.support.node_mig import (
    A100_40,
    GPU_0,
    GPU_1,
    ManualClock,
    claim_of,
    manager,
    mig_pod,
    mig_sim,
    scheduler_slot,
)


def mig_profile_of(nvml: SimulatedNvml, mig_uuid: str) -> tuple[str, int]:
    """(NVML name, memory MiB) of a MIG device, looked up by its UUID as a container runtime would."""
    handle = nvml.nvmlDeviceGetHandleByUUID(mig_uuid)
    return nvml.nvmlDeviceGetName(handle), int(nvml.nvmlDeviceGetAttributes(handle).memorySizeMB)


async def grant(mig: MigManager, pod: dict[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    response = await mig.respond(claim_of(pod), pods)
    assert response.mounts == ()
    assert set(response.envs) == {"NVIDIA_VISIBLE_DEVICES"}  # no HAMi-core variables in mig mode
    return response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")


def consumed(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as it is after its Allocate: entry consumed, bind phase success."""
    annotations = pod["metadata"]["annotations"]
    annotations["volcano.sh/devices-to-allocate"] = ""
    annotations["volcano.sh/bind-phase"] = "success"
    return pod


def instance_uuids(nvml: SimulatedNvml, gpu: str = GPU_0) -> list[str]:
    return [c.mig_uuid for o in read_state(nvml, gpu).instances for c in o.compute]


async def test_worked_example_two_pods_get_two_different_2g_10gb_instances() -> None:
    nvml = mig_sim()
    mig, gpus = manager(nvml)
    # Volcano's mig.go: 8000 MiB on an empty A100-SXM4-40GB is [group2-0]; 4000 MiB next is [group2-1].
    first_id = scheduler_slot(gpus[0], {}, 8000)
    assert first_id == f"{GPU_0}[group2-0]"
    p1 = mig_pod("p1", [first_id], 8000)
    (mig_1,) = await grant(mig, p1, [p1])
    second_id = scheduler_slot(gpus[0], {"group2": {0}}, 4000)
    assert second_id == f"{GPU_0}[group2-1]"
    p2 = mig_pod("p2", [second_id], 4000)
    (mig_2,) = await grant(mig, p2, [consumed(p1), p2])
    assert mig_1 != mig_2
    assert mig_profile_of(nvml, mig_1) == (f"{A100_40} MIG 2g.10gb", 9856)
    assert mig_profile_of(nvml, mig_2) == (f"{A100_40} MIG 2g.10gb", 9856)
    # The whole group2 layout was made once, at its planned placements, and nothing more.
    state = read_state(nvml, GPU_0)
    assert [(o.start, o.size) for o in state.instances] == [(0, 2), (2, 2), (4, 2), (6, 1)]
    assert instance_uuids(nvml)[:2] == [mig_1, mig_2]


async def test_a_container_with_two_vgpus_gets_a_slot_on_each_gpu() -> None:
    nvml = mig_sim(count=2)
    mig, _ = manager(nvml)
    pod = mig_pod("two", [f"{GPU_0}[group3-1]", f"{GPU_1}[group4-0]"], 15000)
    uuids = await grant(mig, pod, [pod])
    assert [mig_profile_of(nvml, u)[0].rsplit(" ", 1)[1] for u in uuids] == ["3g.20gb", "7g.40gb"]
    assert uuids[0] == instance_uuids(nvml, GPU_0)[1]  # position 1 is the instance at 4:4


async def test_layout_switch_on_an_idle_gpu() -> None:
    nvml = mig_sim()
    mig, _ = manager(nvml)
    old = mig_pod("old", [f"{GPU_0}[group1-0]"], 3000)
    await grant(mig, old, [old])
    assert len(read_state(nvml, GPU_0).instances) == 7
    # The old pod is gone; a new one is given the group2 layout on the same GPU.
    new = mig_pod("new", [f"{GPU_0}[group2-2]"], 9000)
    (uuid,) = await grant(mig, new, [new])
    state = read_state(nvml, GPU_0)
    assert [(o.start, o.size) for o in state.instances] == [(0, 2), (2, 2), (4, 2), (6, 1)]
    assert uuid == instance_uuids(nvml)[2]


async def test_refusal_on_a_busy_gpu_keeps_the_live_instance(caplog: pytest.LogCaptureFixture) -> None:
    # Volcano does this: pod 1 holds [group2-0]; pod 2 is given [group1-0] on the same GPU.
    nvml = mig_sim()
    mig, _ = manager(nvml)
    p1 = mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000)
    (held,) = await grant(mig, p1, [p1])
    before = instance_uuids(nvml)
    p2 = mig_pod("p2", [f"{GPU_0}[group1-0]"], 4000)
    with caplog.at_level(logging.ERROR, "kube_vgpu.node.mig"), pytest.raises(MigRefused) as refused:
        await grant(mig, p2, [consumed(p1), p2])
    message = str(refused.value)
    assert f"GPU {GPU_0}" in message and "partitioned as group2 for live pod default/p1" in message
    assert instance_uuids(nvml) == before and held in before
    assert "event=mig_refused" in caplog.text and "pod=default/p2" in caplog.text


async def test_the_same_slot_is_not_given_to_two_pods() -> None:
    nvml = mig_sim()
    mig, _ = manager(nvml)
    p1 = mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000)
    await grant(mig, p1, [p1])
    p2 = mig_pod("p2", [f"{GPU_0}[group2-0]"], 8000)
    with pytest.raises(MigRefused, match=r"\[group2-0\] is already held by pod default/p1"):
        await grant(mig, p2, [consumed(p1), p2])


@pytest.mark.parametrize(
    ("sim", "device", "mem", "reason"),
    [
        (
            {"mig_enabled": False},
            f"{GPU_0}[group2-0]",
            8000,
            "MIG mode is off; enable it with `nvidia-smi -i 0 -mig 1`",
        ),
        (
            {"mig_enabled": False, "migPending": True},
            f"{GPU_0}[group2-0]",
            8000,
            "MIG mode is off (enabled, pending a GPU reset)",
        ),
        ({"migPending": True}, f"{GPU_0}[group2-0]", 8000, "MIG mode is being disabled"),
        ({}, f"{GPU_0}[group2-4]", 4000, "position 4 is outside group 'group2', whose positions are 0..3"),
        ({}, f"{GPU_0}[group9-0]", 4000, "no MIG group 'group9'"),
        ({}, GPU_0, 4000, "the scheduler gave a whole GPU but this node runs mig"),
        ({}, "GPU-00000000-0000-0000-0000-00000000dead[group2-0]", 4000, "is not a GPU of this node"),
        ({}, f"{GPU_0}[group2-0]", 9900, "9900 MiB asked but MIG slot [group2-0] (2g.10gb) has 9856 MiB"),
    ],
)
async def test_slots_that_cannot_be_honoured_fail_naming_gpu_and_reason(
    sim: dict[str, Any], device: str, mem: int, reason: str
) -> None:
    nvml = mig_sim(**sim)
    mig, _ = manager(nvml)
    pod = mig_pod("p", [device], mem)
    with pytest.raises(MigRefused) as refused:
        await grant(mig, pod, [pod])
    assert reason in str(refused.value)
    assert "GPU " in str(refused.value)


async def test_a_model_with_no_geometry_is_refused() -> None:
    nvml = mig_sim(model="NVIDIA H100 PCIe")
    only_a100 = parse_device_config(
        "nvidia:\n  knownMigGeometries:\n  - models: [A100-SXM4-40GB]\n    allowedGeometries:\n"
        "    - group: group1\n      geometries: [{name: 1g.5gb, memory: 4864, count: 7}]\n"
    )
    mig, _ = manager(nvml, geometry=only_a100)
    pod = mig_pod("p", [f"{GPU_0}[group1-0]"], 1000)
    with pytest.raises(
        MigRefused, match="no knownMigGeometries entry matches its TYPE 'NVIDIA-\\[NVIDIA H100 PCIe\\]'"
    ):
        await grant(mig, pod, [pod])
    assert any("no knownMigGeometries entry" in p for p in mig.check_node())


def test_check_node_reports_mig_off_and_geometry_memory_above_nvmls() -> None:
    volcano_shipped = parse_device_config(
        "nvidia:\n  knownMigGeometries:\n  - models: [A100-SXM4-40GB]\n    allowedGeometries:\n"
        "    - group: group2\n      geometries:\n      - {name: 2g.10gb, memory: 10240, count: 3}\n"
        "      - {name: 1g.5gb, memory: 5120, count: 1}\n"
    )
    mig, _ = manager(mig_sim(count=2), geometry=volcano_shipped)
    problems = mig.check_node()
    assert any("2g.10gb is configured with 10240 MiB but NVML gives it 9856 MiB" in p for p in problems)
    off, _ = manager(mig_sim(mig_enabled=False))
    assert off.check_node() == [
        f"GPU {GPU_0}: MIG mode is off; enable it with `nvidia-smi -i 0 -mig 1` and reset the GPU"
    ]


async def test_reconcile_destroys_a_layout_after_the_grace_period_not_before() -> None:
    nvml = mig_sim()
    clock = ManualClock()
    mig, _ = manager(nvml, grace=120.0, clock=clock)
    pod = mig_pod("p", [f"{GPU_0}[group2-0]"], 8000)
    await grant(mig, pod, [pod])
    live: list[dict[str, Any]] = [consumed(pod)]

    async def pods() -> list[dict[str, Any]]:
        return live

    assert await mig.reconcile_once(pods) == []
    clock.advance(500)
    assert await mig.reconcile_once(pods) == []  # held: kept however long
    live.clear()  # the pod is gone
    assert await mig.reconcile_once(pods) == []  # idle clock starts
    clock.advance(119)
    assert await mig.reconcile_once(pods) == []
    assert len(read_state(nvml, GPU_0).instances) == 4
    clock.advance(1)
    assert await mig.reconcile_once(pods) == [GPU_0]
    assert read_state(nvml, GPU_0).instances == ()


async def test_a_pod_coming_back_within_the_grace_resets_the_clock() -> None:
    nvml = mig_sim()
    clock = ManualClock()
    mig, _ = manager(nvml, grace=60.0, clock=clock)
    first = mig_pod("first", [f"{GPU_0}[group2-0]"], 8000)
    await grant(mig, first, [first])
    none: list[dict[str, Any]] = []

    async def no_pods() -> list[dict[str, Any]]:
        return none

    await mig.reconcile_once(no_pods)
    clock.advance(50)
    second = mig_pod("second", [f"{GPU_0}[group2-1]"], 4000)
    await grant(mig, second, [second])  # handed out: the GPU is in use again
    clock.advance(50)  # 100 s after the first idle sighting, but the clock restarted

    async def only_second() -> list[dict[str, Any]]:
        return [consumed(second)]

    assert await mig.reconcile_once(only_second) == []
    assert len(read_state(nvml, GPU_0).instances) == 4


async def test_a_slot_handed_out_while_pods_were_listed_is_not_torn_down() -> None:
    nvml = mig_sim()
    clock = ManualClock()
    mig, _ = manager(nvml, grace=0.0, clock=clock)
    pod = mig_pod("p", [f"{GPU_0}[group2-0]"], 8000)
    stale: list[dict[str, Any]] = []  # listed before the Allocate recorded the pod

    async def slow_list() -> list[dict[str, Any]]:
        await grant(mig, pod, [pod])
        return stale

    assert await mig.reconcile_once(slow_list) == []
    assert len(read_state(nvml, GPU_0).instances) == 4


async def test_reconcile_never_destroys_under_a_running_process(caplog: pytest.LogCaptureFixture) -> None:
    nvml = mig_sim()
    mig, _ = manager(nvml, grace=0.0)
    pod = mig_pod("p", [f"{GPU_0}[group2-0]"], 8000)
    await grant(mig, pod, [pod])
    gi = read_state(nvml, GPU_0).instances[0]
    nvml.set_processes(0, [SimProcess(77, None, gi.gi_id, gi.compute[0].ci_id)])

    async def no_pods() -> list[dict[str, Any]]:
        return []

    with caplog.at_level(logging.WARNING, "kube_vgpu.node.mig"):
        assert await mig.reconcile_once(no_pods) == []
    assert "event=mig_teardown_failed" in caplog.text and "process 77" in caplog.text
    assert len(read_state(nvml, GPU_0).instances) == 4


async def test_adoption_after_restart_recreates_nothing() -> None:
    nvml = mig_sim()
    before_restart, _ = manager(nvml)
    p1 = mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000)
    (mig_1,) = await grant(before_restart, p1, [p1])
    layout_uuids = instance_uuids(nvml)

    after_restart, _ = manager(nvml)  # a new process: nothing carried over but NVML and the pods
    pods = [consumed(p1)]
    layouts = after_restart.adopt(pods)
    assert layouts[GPU_0].groups == ("group2",)
    assert layouts[GPU_0].slots[0] == mig_1
    p2 = mig_pod("p2", [f"{GPU_0}[group2-1]"], 4000)
    (mig_2,) = await grant(after_restart, p2, [*pods, p2])
    assert instance_uuids(nvml) == layout_uuids  # same instances, same MIG UUIDs
    assert mig_2 == layout_uuids[1]


async def test_a_partial_layout_left_by_a_crash_is_completed() -> None:
    nvml = mig_sim()
    mig, _ = manager(nvml)
    p1 = mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000)
    (mig_1,) = await grant(mig, p1, [p1])
    # Simulate a crash half-way: position 2's instance is gone, position 3's lost its compute instance.
    state = read_state(nvml, GPU_0)
    handle = nvml.nvmlDeviceGetHandleByUUID(GPU_0)
    for observed, drop_gi in ((state.instances[2], True), (state.instances[3], False)):
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, observed.gi_id)
        nvml.nvmlComputeInstanceDestroy(
            nvml.nvmlGpuInstanceGetComputeInstanceById(gi, observed.compute[0].ci_id)
        )
        if drop_gi:
            nvml.nvmlGpuInstanceDestroy(gi)
    p2 = mig_pod("p2", [f"{GPU_0}[group2-3]"], 4000)
    (mig_2,) = await grant(mig, p2, [consumed(p1), p2])
    after = read_state(nvml, GPU_0)
    assert [(o.start, len(o.compute)) for o in after.instances] == [(0, 1), (2, 1), (4, 1), (6, 1)]
    assert after.instances[0].compute[0].mig_uuid == mig_1  # the live one untouched
    assert mig_profile_of(nvml, mig_2)[1] == 4864


async def test_same_session_conflict_the_first_allocated_wins_and_the_other_is_refused() -> None:
    # Both pods were placed in one session: neither holds anything yet, so the first Allocate is
    # free to lay out group2; the second then finds it held.
    nvml = mig_sim()
    mig, _ = manager(nvml)
    p1 = mig_pod("p1", [f"{GPU_0}[group2-0]"], 8000)
    p2 = mig_pod("p2", [f"{GPU_0}[group1-0]"], 4000)
    await grant(mig, p1, [p1, p2])
    with pytest.raises(MigRefused, match="partitioned as group2 for live pod default/p1"):
        await grant(mig, p2, [consumed(p1), p2])
