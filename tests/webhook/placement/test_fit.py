"""The webhook warns when a vGPU pod can never fit the cluster's GPUs (more vGPUs than any node
has GPUs, more memory than any GPU has, or no node with enough big GPUs), and says what would fit."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, ResourceNames
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import parse_review
from kube_vgpu.webhook.placement.fit import never_fits
from kube_vgpu.webhook.placement.inventory import Inventory, NodeGpus, node_gpus
from tests.support.admission_view import StaticView
from tests.support.records import as_node
from tests.support.webhook import container, gpu_node, pod, review

A100 = "NVIDIA A100-SXM4-80GB"
L4 = "NVIDIA L4"
NODES = [
    gpu_node("big", "hami-core", [(A100, 81920), (A100, 81920)]),
    gpu_node("wide", "hami-core", [(L4, 23034)] * 4),
]


def known(nodes: Sequence[Mapping[str, Any]] = NODES) -> list[NodeGpus]:
    found = [node_gpus(as_node(n)) for n in nodes]
    return [n for n in found if n is not None]


def warnings_for(*containers: dict[str, Any], nodes: Sequence[Mapping[str, Any]] = NODES) -> list[str]:
    shapes = [[g.memory_mib for g in n.gpus] for n in known(nodes)]
    return never_fits(parse_pod(pod(*containers), ResourceNames()), shapes)


@pytest.mark.parametrize(
    "limits",
    [
        {"number": 4, "memory": 20000},  # four L4s on "wide"
        {"number": 2, "memory": 81920},  # both A100s on "big", exactly full
        {"number": 1, "percent": 100},  # a share of a card always has a card
        {"memory": 1000},  # vgpu-number defaults to 1
    ],
)
def test_pods_that_fit_some_node_get_no_warning(limits: dict[str, Any]) -> None:
    assert warnings_for(container("c", **limits)) == []


def test_more_vgpus_than_any_node_has_gpus() -> None:
    (warning,) = warnings_for(container("train", number=5))
    assert "'train' asks for 5 vGPUs" in warning and "no node has more than 4 GPUs" in warning
    assert "ask for at most 4" in warning


def test_more_memory_than_any_gpu_has() -> None:
    (warning,) = warnings_for(container("big", number=1, memory=100000))
    assert "100000 MiB per vGPU" in warning and "largest GPU in the cluster has 81920 MiB" in warning


def test_enough_gpus_and_enough_memory_but_never_on_one_node() -> None:
    # "wide" has 4 GPUs but small ones; "big" has big ones but only 2
    (warning,) = warnings_for(container("c", number=3, memory=30000))
    assert "no node has 3 GPUs with 30000 MiB or more" in warning


def test_each_container_is_judged_and_named() -> None:
    found = warnings_for(container("ok", number=1, memory=1000), container("bad", number=9))
    assert len(found) == 1 and "'bad'" in found[0]


def test_no_gpu_node_known_says_nothing_here() -> None:
    assert warnings_for(container("c", number=99), nodes=[]) == []


def test_the_warning_reaches_the_admission_review() -> None:
    inventory = Inventory()
    for node in NODES:
        inventory.upsert(node)
    admission = Admission(Config(), StaticView(inventory, None))
    request = review(pod(container("train", number=8, memory=1000)))
    verdict = admission.review(parse_review(json.dumps(request).encode()))
    assert verdict.allowed  # a warning, not a denial: a bigger node may join
    assert any("'train' asks for 8 vGPUs" in w for w in verdict.warnings)


def test_inventory_keeps_one_memory_shape_per_kind_of_node() -> None:
    inv = Inventory()
    for index in range(3):
        inv.upsert(gpu_node(f"wide-{index}", "hami-core", [(L4, 23034)] * 4))
    inv.upsert(gpu_node("big", "hami-core", [(A100, 40960), (A100, 81920)]))
    assert sorted(inv.memory_shapes()) == [(23034,) * 4, (81920, 40960)]
    for index in range(3):
        inv.remove(f"wide-{index}")
    assert list(inv.memory_shapes()) == [(81920, 40960)]
