"""The caches and shortcuts of the per-review decision: each answers as the full computation would,
an answer derived from the cluster is never handed out after the cluster changed under it, and
nothing written into a pod is shared with what later reviews reuse."""

from __future__ import annotations

import copy
import posixpath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.names import MIG, USE_GPUTYPE
from kube_vgpu.contract.quantity import QuantityError, WholeQuantity, parse_whole
from kube_vgpu.contract.resources import PodRequest, parse_pod
from kube_vgpu.webhook.admission.isolation import normalize
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement import resolve as placement_module
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.resolve import Placement, resolve_placement
from kube_vgpu.webhook.placement.selectors import Selectors, parse_selectors
from kube_vgpu.webhook.records import NodeRecord
from tests.support.webhook import A10, A100, container, gpu_node, pod

A10_NODE = gpu_node("a10", "hami-core", [(A10, 24576)])
A100_NODE = gpu_node("a100", "hami-core", [(A100, 40960)])
WANTS_A100 = parse_selectors({USE_GPUTYPE: "A100"})
SMALL = parse_pod(pod(container(memory=1000)), ResourceNames())


def _inventory(*nodes: NodeRecord) -> Inventory:
    inv = Inventory()
    for node in nodes:
        inv.upsert(node)
    return inv


def _uncached(sel: Selectors, request: PodRequest, inv: Inventory) -> Placement:
    memory = max((c.memory_mib or 0 for c in request.containers), default=0)
    return placement_module._resolve(sel, memory, "hami-core", inv)  # noqa: SLF001 (our own memo, inspected on purpose)


def test_a_node_joining_changes_the_next_placement() -> None:
    inv = _inventory(A10_NODE)
    before = resolve_placement(WANTS_A100, SMALL, inv, "hami-core")
    assert before.matches_nothing and before.largest_gpu_mib is None
    inv.upsert(A100_NODE)
    after = resolve_placement(WANTS_A100, SMALL, inv, "hami-core")
    assert not after.matches_nothing and after.largest_gpu_mib == 40960
    assert after == _uncached(WANTS_A100, SMALL, inv)


def test_a_node_leaving_or_changing_or_the_inventory_clearing_changes_the_next_placement() -> None:
    inv = _inventory(A10_NODE, A100_NODE)
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core").largest_gpu_mib == 40960
    bigger = gpu_node("a100", "hami-core", [(A100, 81920)])
    inv.upsert(bigger)  # same node name, new facts
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core").largest_gpu_mib == 81920
    inv.remove("a100")
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core").matches_nothing
    inv.upsert(bigger)
    assert not resolve_placement(WANTS_A100, SMALL, inv, "hami-core").matches_nothing
    inv.clear()
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core").matches_nothing


def test_a_node_relabelled_to_another_mode_changes_the_mode_resolved() -> None:
    inv = _inventory(A100_NODE)
    assert resolve_placement(Selectors(), SMALL, inv, "hami-core").mode == "hami-core"
    inv.upsert(gpu_node("a100", MIG, [(A100, 40960)]))
    assert resolve_placement(Selectors(), SMALL, inv, "hami-core").mode == MIG


def test_two_inventories_at_the_same_generation_are_not_confused() -> None:
    with_a100, without = _inventory(A100_NODE), _inventory(A10_NODE)
    assert with_a100.generation == without.generation
    assert not resolve_placement(WANTS_A100, SMALL, with_a100, "hami-core").matches_nothing
    assert resolve_placement(WANTS_A100, SMALL, without, "hami-core").matches_nothing


def test_an_unchanged_node_keeps_the_generation_and_the_memoised_placement() -> None:
    inv = _inventory(A100_NODE)
    first = resolve_placement(WANTS_A100, SMALL, inv, "hami-core")
    generation = inv.generation
    inv.upsert(copy.deepcopy(A100_NODE))  # a watch event that changes nothing the inventory keeps
    assert inv.generation == generation
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core") is first


def test_the_memory_ask_and_the_default_mode_are_part_of_the_key() -> None:
    inv = _inventory(A10_NODE, A100_NODE)
    large = parse_pod(pod(container(memory=30000)), ResourceNames())
    small_answer = resolve_placement(Selectors(), SMALL, inv, "hami-core")
    large_answer = resolve_placement(Selectors(), large, inv, "hami-core")
    assert small_answer.filter.min_memory_mib == 1000 and large_answer.filter.min_memory_mib == 30000
    empty = Inventory()
    assert resolve_placement(Selectors(), SMALL, empty, "hami-core").mode == "hami-core"
    assert resolve_placement(Selectors(), SMALL, empty, MIG).mode == MIG


def test_long_selectors_are_resolved_each_time_and_not_kept() -> None:
    inv = _inventory(A100_NODE)
    long_selectors = parse_selectors({USE_GPUTYPE: ",".join(["A100"] + [f"model-{i}" for i in range(200)])})
    assert placement_module._written_chars(long_selectors) > placement_module._MEMO_MAX_CHARS  # noqa: SLF001 (our own memo, inspected on purpose)
    kept_before = placement_module._resolve_memoised.cache_info().currsize  # noqa: SLF001 (our own memo, inspected on purpose)
    first = resolve_placement(long_selectors, SMALL, inv, "hami-core")
    assert placement_module._resolve_memoised.cache_info().currsize == kept_before  # noqa: SLF001 (our own memo, inspected on purpose)
    assert first == resolve_placement(long_selectors, SMALL, inv, "hami-core")
    assert first is not resolve_placement(long_selectors, SMALL, inv, "hami-core")
    assert not first.matches_nothing


def test_a_kept_quantity_reads_as_the_first_time_and_a_refusal_is_refused_every_time() -> None:
    assert parse_whole("20k") == parse_whole("20k") == WholeQuantity(20000, binary=False)
    assert parse_whole("1Gi") == WholeQuantity(1024**3, binary=True)
    for _ in range(2):
        with pytest.raises(QuantityError, match="fraction"):
            parse_whole("1.5")
        with pytest.raises(QuantityError, match="larger than"):
            parse_whole("3G")
    # An integer is never confused with text of the same digits, nor a boolean with 1.
    assert parse_whole(7) == parse_whole("7")
    with pytest.raises(QuantityError, match="bool"):
        parse_whole(True)


def test_the_placement_carries_the_marker_of_its_alternatives() -> None:
    inv = _inventory(A10_NODE, A100_NODE)
    placement = resolve_placement(WANTS_A100, SMALL, inv, "hami-core")
    added = [r for alt in placement.alternatives for r in alt]
    assert placement.marker == affinity.encode_marker(added)
    assert affinity.decode_marker(placement.marker) == sorted(
        {affinity.canonical(r): r for r in added}.values(), key=affinity.canonical
    )


def test_the_affinity_written_shares_nothing_with_the_kept_placement() -> None:
    inv = _inventory(A10_NODE, A100_NODE)
    placement = resolve_placement(WANTS_A100, SMALL, inv, "hami-core")
    kept = copy.deepcopy(placement.alternatives)
    written = affinity.required_with(pod(), affinity.own_terms(pod(), []), placement.alternatives, [])
    required = written["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in required["nodeSelectorTerms"]:
        for requirement in term["matchExpressions"]:
            requirement["key"] = "changed"
            requirement.setdefault("values", []).append("changed")
    assert resolve_placement(WANTS_A100, SMALL, inv, "hami-core").alternatives == kept


@given(st.text(alphabet="/.a\\ \x00", max_size=12))
def test_a_mount_path_normalises_as_the_runtime_resolves_it(path: str) -> None:
    joined = posixpath.normpath("/" + path)
    assert normalize(path) == "/" + joined.lstrip("/")
