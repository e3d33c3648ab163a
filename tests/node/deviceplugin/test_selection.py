"""Which pod and container an Allocate is for (the worked two-container pod)."""

from __future__ import annotations

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import DEVICES_TO_ALLOCATE
from kube_vgpu.node.deviceplugin.selection import select
from tests.support.node import (
    COUNT,
    EXAMPLE_IDS,
    MEMORY,
    NODE,
    UUID_A,
    UUID_B,
    container,
    example_containers,
    make_pod,
    one_gpu_pod,
)

NAMES = ResourceNames()


def test_worked_example_consumption_sequence() -> None:
    pod = make_pod("p", example_containers(), ids=EXAMPLE_IDS)
    first = select([pod], NODE, 1, NAMES).claim
    assert first is not None
    assert (first.container_name, first.index, first.last) == ("c1", 0, False)
    assert first.consumed_value == f";{UUID_A},NVIDIA,2048,0:{UUID_B},NVIDIA,2048,0:"
    # kubelet asks 2 devices for c1? no pod matches: the first pending entry holds one device
    assert select([pod], NODE, 2, NAMES).claim is None

    pod["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = first.consumed_value
    second = select([pod], NODE, 2, NAMES).claim
    assert second is not None
    assert (second.container_name, second.index, second.last) == ("c2", 1, True)
    assert [r.gpu_uuid for r in second.records] == [UUID_A, UUID_B]
    assert second.consumed_value == ";"


def test_oldest_vgpu_time_then_bind_time_then_creation() -> None:
    newer = one_gpu_pod("newer", vgpu_time="200")
    older = one_gpu_pod("older", vgpu_time="100")
    claim = select([newer, older], NODE, 1, NAMES).claim
    assert claim is not None and claim.pod.name == "older"
    tie_a = one_gpu_pod("a", vgpu_time="100", bind_time="7")
    tie_b = one_gpu_pod("b", vgpu_time="100", bind_time="5")
    claim = select([tie_a, tie_b], NODE, 1, NAMES).claim
    assert claim is not None and claim.pod.name == "b"
    c1 = one_gpu_pod("c1", created="2026-01-02T00:00:00Z")
    c2 = one_gpu_pod("c2", created="2026-01-01T00:00:00Z")
    claim = select([c1, c2], NODE, 1, NAMES).claim
    assert claim is not None and claim.pod.name == "c2"
    garbage = one_gpu_pod("garbage", vgpu_time="not-a-time")
    claim = select([garbage, newer], NODE, 1, NAMES).claim
    assert claim is not None and claim.pod.name == "newer"


def test_pods_that_are_not_allocating_here_are_ignored() -> None:
    other_node = one_gpu_pod("elsewhere", node="gpu-node-2", vgpu_time="1")
    done = one_gpu_pod("done", phase="success", vgpu_time="1")
    terminating = one_gpu_pod("terminating", vgpu_time="1")
    terminating["metadata"]["deletionTimestamp"] = "2026-08-20T10:00:00Z"
    moved = one_gpu_pod("moved", vgpu_time="1")
    moved["spec"]["nodeName"] = "gpu-node-2"  # annotation says here, the pod is bound elsewhere
    ok = one_gpu_pod("ok", vgpu_time="99")
    selection = select([other_node, done, terminating, moved, ok], NODE, 1, NAMES)
    assert selection.claim is not None and selection.claim.pod.name == "ok"
    assert selection.allocating == 1


def test_first_non_empty_entry_count_decides_not_the_total() -> None:
    # The reference plugin compares the pod's total (3) and never matches this pod
    # (Project-HAMi/volcano-vgpu-device-plugin#77).
    pod = make_pod("multi", example_containers(), ids=EXAMPLE_IDS)
    assert select([pod], NODE, 3, NAMES).claim is None
    assert select([pod], NODE, 1, NAMES).claim is not None


def test_memory_only_container_entry_is_skipped() -> None:
    containers = [container("mem-only", {MEMORY: "100"}), container("gpu", {COUNT: "1", MEMORY: "200"})]
    ids = f"{UUID_A},NVIDIA,100,0:;{UUID_B},NVIDIA,200,0:"
    claim = select([make_pod("p", containers, ids=ids)], NODE, 1, NAMES).claim
    assert claim is not None
    assert (claim.container_name, claim.index, claim.last) == ("gpu", 1, True)
    assert claim.consumed_value == f"{UUID_A},NVIDIA,100,0:;"


def test_broken_pods_are_reported() -> None:
    malformed = one_gpu_pod("malformed")
    malformed["metadata"]["annotations"][DEVICES_TO_ALLOCATE] = "GPU-x,NVIDIA,abc,0:"
    mismatch = make_pod("mismatch", [container("a", {COUNT: "1"})], ids="GPU-x,NVIDIA,1,0:;GPU-y,NVIDIA,1,0:")
    init = make_pod(
        "init",
        [container("a", {COUNT: "1"})],
        ids=f"{UUID_A},NVIDIA,1,0:",
        init_containers=[container("setup", {COUNT: "1"})],
    )
    wrong_count = make_pod("wrong-count", [container("a", {COUNT: "2"})], ids=f"{UUID_A},NVIDIA,1,0:")
    selection = select([malformed, mismatch, init, wrong_count], NODE, 1, NAMES)
    assert selection.claim is None
    reasons = {b.pod.name: b.reason for b in selection.broken}
    assert set(reasons) == {"malformed", "mismatch", "init", "wrong-count"}
    assert "malformed" in reasons["malformed"]
    assert "2 entries" in reasons["mismatch"]
    assert "init container 'setup'" in reasons["init"]
    assert "holds 1 devices" in reasons["wrong-count"]


def test_fully_consumed_pod_is_not_selected() -> None:
    pod = make_pod("p", example_containers(), ids=EXAMPLE_IDS, to_allocate=";")
    selection = select([pod], NODE, 1, NAMES)
    assert selection.claim is None and not selection.broken
