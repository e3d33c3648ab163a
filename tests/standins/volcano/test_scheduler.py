"""The local Volcano stand-in reproduces the allocations Volcano's own vGPU code
makes on the worked examples."""

from __future__ import annotations

from typing import Any

from kube_vgpu.contract import names as n
from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.standins.volcano.scheduler import node_matches, place

NAMES = ResourceNames()
A = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"
B = "GPU-9f8e7d6c-5b4a-3928-1706-f5e4d3c2b1a0"
READY = {"volcano.sh/vgpu-number": "20", "volcano.sh/vgpu-memory": "65536", "volcano.sh/vgpu-cores": "200"}


def node(name: str, records: list[GpuRecord], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {n.NODE_REGISTER: encode_register(records)},
        },
        "status": {"allocatable": READY},
    }


def ctr(name: str, **limits: str) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits}}


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "annotations": annotations or {}},
        "spec": {"containers": list(containers)},
    }


V100 = "NVIDIA-Tesla V100-PCIE-32GB"
WORKED_NODE = node(
    "gpu-node-1",
    [GpuRecord(A, 10, 32768, V100, True, "hami-core"), GpuRecord(B, 10, 32768, V100, True, "hami-core")],
)
WORKED_POD = pod(
    ctr("c1", **{NAMES.count: "1", NAMES.memory: "3000", NAMES.cores: "30"}),
    ctr("sidecar"),
    ctr("c2", **{NAMES.count: "2", NAMES.memory: "2048"}),
)


def test_worked_binpack_example_is_reproduced_byte_for_byte() -> None:
    placement = place(WORKED_POD, [WORKED_NODE], [], NAMES)
    assert not isinstance(placement, str)
    assert placement.node == "gpu-node-1"
    assert placement.devices == f"{A},NVIDIA,3000,30:;{A},NVIDIA,2048,0:{B},NVIDIA,2048,0:"


def test_live_pods_are_charged_and_full_gpus_skipped() -> None:
    holder = {
        "metadata": {"annotations": {n.VGPU_IDS_NEW: f"{A},NVIDIA,32000,0:"}},
        "spec": {"nodeName": "gpu-node-1"},
        "status": {"phase": "Running"},
    }
    placement = place(
        pod(ctr("c", **{NAMES.count: "1", NAMES.memory: "1000"})), [WORKED_NODE], [holder], NAMES
    )
    assert not isinstance(placement, str) and placement.devices == f"{B},NVIDIA,1000,0:"
    finished = dict(holder, status={"phase": "Succeeded"})
    placement = place(
        pod(ctr("c", **{NAMES.count: "1", NAMES.memory: "1000"})), [WORKED_NODE], [finished], NAMES
    )
    assert not isinstance(placement, str) and placement.devices.startswith(A)


def test_substring_type_rule_is_volcanos_not_ours() -> None:
    # Appendix C.2: a plain `A10` item also matches the A100; kube-vgpu's bracketed items do not.
    a10, a100 = register_type("NVIDIA A10"), register_type("NVIDIA A100-PCIE-40GB")
    mixed = node(
        "mixed",
        [GpuRecord(A, 10, 23028, a10, True, "hami-core"), GpuRecord(B, 10, 40960, a100, True, "hami-core")],
    )
    ask = ctr("c", **{NAMES.count: "1", NAMES.memory: "30000"})  # fits only the A100
    assert not isinstance(place(pod(ask, annotations={n.USE_GPUTYPE: "A10"}), [mixed], [], NAMES), str)
    assert isinstance(place(pod(ask, annotations={n.USE_GPUTYPE: "[NVIDIA A10]"}), [mixed], [], NAMES), str)


def test_mode_mismatch_and_unready_nodes_are_skipped() -> None:
    ask = ctr("c", **{NAMES.count: "1"})
    assert "mode" in str(place(pod(ask, annotations={n.VGPU_MODE: "mig"}), [WORKED_NODE], [], NAMES))
    unready = dict(WORKED_NODE, status={"allocatable": {**READY, "volcano.sh/vgpu-memory": "0"}})
    assert "not advertised" in str(place(pod(ask), [unready], [], NAMES))


def test_required_affinity_terms_are_ored_and_expressions_anded() -> None:
    target = {"metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}}

    def term(*exprs: dict[str, Any]) -> dict[str, Any]:
        return {"matchExpressions": list(exprs)}

    def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
        required = {"nodeSelectorTerms": list(terms)}
        return {
            "spec": {
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
            }
        }

    exists_a = {"key": "a", "operator": "Exists"}
    not_b = {"key": "b", "operator": "NotIn", "values": ["2"]}
    assert node_matches(affinity(term(exists_a)), target)
    assert not node_matches(affinity(term(exists_a, not_b)), target)
    assert node_matches(affinity(term(not_b), term(exists_a)), target)
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}
    assert not node_matches(affinity(by_name), target)
