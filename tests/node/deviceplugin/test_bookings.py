"""The node's own ledger: true per-GPU sums and over-commit (Volcano counts only the
first record per pod and GPU)."""

from __future__ import annotations

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.node.deviceplugin.bookings import GpuUse, Ledger, Overcommit
from tests.support.node import (
    EXAMPLE_IDS,
    GPUS,
    NODE,
    UUID_A,
    UUID_B,
    example_containers,
    make_pod,
    one_gpu_pod,
)

NAMES = ResourceNames()


def test_containers_sharing_a_gpu_are_all_counted() -> None:
    ledger = Ledger(GPUS, 10, NAMES, NODE)
    problems = ledger.rebuild([make_pod("p", example_containers(), ids=EXAMPLE_IDS, phase="success")])
    assert problems == []
    # Volcano books 3000 on GPU A for this pod; the containers really use 3000 + 2048.
    assert ledger.usage() == {UUID_A: GpuUse(5048, 30, 2), UUID_B: GpuUse(2048, 0, 1)}
    assert [(u.container, u.gpu_uuid) for u in ledger.containers()] == [
        ("c1", UUID_A),
        ("c2", UUID_A),
        ("c2", UUID_B),
    ]


def test_overcommit_is_reported_and_dead_pods_do_not_count() -> None:
    ledger = Ledger(GPUS, 10, NAMES, NODE)
    pods = [
        one_gpu_pod("a", mem=20000, cores=60, phase="success"),
        one_gpu_pod("b", mem=10000, cores=50, phase="success"),
        one_gpu_pod("failed", mem=10000, phase="failed"),
        one_gpu_pod("elsewhere", mem=10000, node="other"),
    ]
    finished = one_gpu_pod("finished", mem=30000, phase="success")
    finished["status"]["phase"] = "Succeeded"
    ledger.rebuild([*pods, finished])
    assert ledger.overcommits() == [Overcommit(UUID_A, "cores", 110, 100)]
    ledger.observe(one_gpu_pod("c", mem=5000, phase="success"))
    assert Overcommit(UUID_A, "memory", 35000, 32768) in ledger.overcommits()
    gone = one_gpu_pod("c", mem=5000, phase="success")
    gone["status"]["phase"] = "Failed"
    ledger.observe(gone)
    assert [o.resource for o in ledger.overcommits()] == ["cores"]


def test_malformed_pod_is_reported_not_counted() -> None:
    ledger = Ledger(GPUS, 10, NAMES, NODE)
    bad = one_gpu_pod("bad", phase="success")
    bad["metadata"]["annotations"]["volcano.sh/vgpu-ids-new"] = "garbage"
    problems = ledger.rebuild([bad])
    assert len(problems) == 1 and "default/bad" in problems[0]
    assert ledger.usage()[UUID_A] == GpuUse()
