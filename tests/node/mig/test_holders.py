"""Which MIG slots the node's live pods hold, from `vgpu-ids-new` and `devices-to-allocate`."""

from __future__ import annotations

from kube_vgpu.node.deviceplugin.selection import PodRef
from kube_vgpu.node.mig.holders import node_holdings, pod_holdings
from kube_vgpu.node.mig.layout import SlotHolder
from tests.support.node import COUNT, MEMORY, NODE, container, make_pod
from tests.support.node_mig import GPU_0, GPU_1, mig_pod

SLOT_0 = f"{GPU_0}[group2-0]"
SLOT_1 = f"{GPU_0}[group2-1]"


def test_a_consumed_entry_holds_its_slot_and_a_waiting_one_does_not_yet() -> None:
    done = mig_pod("done", [SLOT_0], 8000, consumed=True)
    waiting = mig_pod("waiting", [SLOT_1], 4000)
    holdings = node_holdings([done, waiting], NODE)
    assert [(h.pod.name, h.gpu_uuid, h.group, h.position, h.held) for h in holdings.items] == [
        ("done", GPU_0, "group2", 0, True),
        ("waiting", GPU_0, "group2", 1, False),
    ]
    assert holdings.busy_gpus() == {GPU_0}
    # The waiting pod's own Allocate sees the done pod's slot, not its own.
    assert holdings.held_by_others(GPU_0, PodRef("default", "waiting", "uid-waiting"), 0) == [
        SlotHolder("pod default/done", "group2", 0)
    ]
    assert holdings.held_by_others(GPU_0, PodRef("default", "done", "uid-done"), 0) == []


def test_pods_that_hold_nothing_any_more_are_left_out() -> None:
    failed = mig_pod("failed", [SLOT_0], 8000, phase="failed")
    finished = mig_pod("finished", [SLOT_0], 8000, consumed=True)
    finished["status"]["phase"] = "Succeeded"
    elsewhere = mig_pod("elsewhere", [SLOT_0], 8000, consumed=True, node="other-node")
    assert node_holdings([failed, finished, elsewhere], NODE).items == ()


def test_a_terminating_pod_still_holds_its_slot() -> None:
    leaving = mig_pod("leaving", [SLOT_0], 8000, consumed=True)
    leaving["metadata"]["deletionTimestamp"] = "2026-08-20T10:05:00Z"
    assert [h.held for h in node_holdings([leaving], NODE).items] == [True]


def test_entries_map_to_containers_and_a_memory_only_container_never_holds() -> None:
    pod = make_pod(
        "two",
        [
            container("gpu", {COUNT: "1", MEMORY: "4000"}),
            container("memory-only", {MEMORY: "4000"}),
        ],
        ids=f"{SLOT_0},NVIDIA,4000,0:;{GPU_1}[group2-0],NVIDIA,4000,0:",
        # The first container was allocated, the memory-only one never gets an Allocate.
        to_allocate=f";{GPU_1}[group2-0],NVIDIA,4000,0:",
        phase="success",
    )
    found, problems = pod_holdings(pod)
    assert problems == []
    assert [(h.entry, h.gpu_uuid, h.held) for h in found] == [(0, GPU_0, True), (1, GPU_1, False)]


def test_whole_gpu_records_are_not_mig_slots_and_bad_ids_are_reported() -> None:
    pod = mig_pod("odd", [GPU_0, f"{GPU_1}[group-2-0]"], 1000, consumed=True)
    found, problems = pod_holdings(pod)
    assert found == []
    assert len(problems) == 1 and "pod default/odd" in problems[0] and "exactly one '-'" in problems[0]


def test_an_unreadable_devices_to_allocate_counts_as_held() -> None:
    pod = mig_pod("garbled", [SLOT_0], 8000, to_allocate="not a device list")
    assert [h.held for h in node_holdings([pod], NODE).items] == [True]
    broken = mig_pod("broken", [SLOT_0], 8000)
    broken["metadata"]["annotations"]["volcano.sh/vgpu-ids-new"] = "garbage"
    assert node_holdings([broken], NODE).items == ()
    assert "malformed" in node_holdings([broken], NODE).problems[0]
