"""The inventory's indexes, kept from Node objects, and what a broken register annotation leaves."""

from __future__ import annotations

from kube_vgpu.webhook.placement.inventory import GpuFilter, Inventory
from tests.support.webhook import A10, A100, H100, gpu_node, gpu_uuid


def test_inventory_indexes_follow_upserts_and_removals() -> None:
    inv = Inventory()
    inv.upsert(gpu_node("a", "hami-core", [(A10, 24576), (A100, 40960)]))
    inv.upsert(gpu_node("b", "mig", [(H100, 81920)]))
    assert inv.models() == {"NVIDIA-A10", "NVIDIA-A100-PCIE-40GB", "NVIDIA-H100-80GB-HBM3"}
    assert inv.offered_modes(GpuFilter()) == {"hami-core", "mig"}
    assert inv.offered_modes(GpuFilter(min_memory_mib=50000)) == {"mig"}
    assert inv.largest_memory(GpuFilter(), "hami-core") == 40960
    assert inv.offered_modes(GpuFilter(excluded=frozenset({gpu_uuid("b", 0)}))) == {"hami-core"}
    assert inv.fully_excluded_hostnames([gpu_uuid("a", 0)]) == ()
    assert inv.fully_excluded_hostnames([gpu_uuid("a", 0), gpu_uuid("a", 1)]) == ("a",)
    # A relabelled node replaces its old facts; a removed node leaves no trace in any index.
    inv.upsert(gpu_node("b", "hami-core", [(H100, 81920)]))
    assert inv.offered_modes(GpuFilter(models=frozenset({"NVIDIA-H100-80GB-HBM3"}))) == {"hami-core"}
    inv.remove("b")
    assert inv.models() == {"NVIDIA-A10", "NVIDIA-A100-PCIE-40GB"} and inv.gpu(gpu_uuid("b", 0)) is None
    assert inv.types() == {f"NVIDIA-[{A10}]", f"NVIDIA-[{A100}]"}
    inv.upsert({"metadata": {"name": "a", "labels": {}}})  # not a GPU node any more
    assert len(inv) == 0 and not inv.any_gpu(GpuFilter())


def test_inventory_tolerates_a_missing_or_broken_register_annotation() -> None:
    node = gpu_node("x", "hami-core", [(A10, 24576)], register=False)
    inv = Inventory()
    facts = inv.upsert(node)
    assert facts is not None and facts.problem and facts.gpus[0].model == "NVIDIA-A10"
    assert facts.gpus[0].memory_mib is None and inv.offered_modes(GpuFilter(min_memory_mib=10**6)) == {
        "hami-core"
    }
    node["metadata"]["annotations"] = {"volcano.sh/node-vgpu-register": "garbage"}
    facts = inv.upsert(node)
    assert facts is not None and "no ':'" in facts.problem
