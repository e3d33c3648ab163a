"""Pure MIG planning: placements per group, decisions against NVML state and held slots, idle clocks."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.mig.geometry import MigGroup, MigInstanceType, geometry_for_type
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.models import register_type
from kube_vgpu.node.mig.layout import (
    LayoutActions,
    LayoutError,
    ObservedCompute,
    ObservedInstance,
    ProfileSpec,
    Refusal,
    SlotHolder,
    decide_layout,
    find_planned,
    matching_groups,
    plan_group,
    plan_groups,
    teardown_due,
)
from kube_vgpu.node.mig.nvml import gpu_handle, read_profiles
from kube_vgpu.standins.nvml.profiles import MODELS
from tests.support.node_mig import A100_40, mig_sim


def profiles_of(model: str) -> dict[str, ProfileSpec]:
    nvml = mig_sim(model=model)
    return read_profiles(nvml, gpu_handle(nvml, nvml.gpus[0].uuid))


A100 = profiles_of(A100_40)


def group(name: str, *types: tuple[str, int]) -> MigGroup:
    return MigGroup(name, tuple(MigInstanceType(t, A100[t].memory_mib, n) for t, n in types))


GROUP1 = group("group1", ("1g.5gb", 7))
GROUP2 = group("group2", ("2g.10gb", 3), ("1g.5gb", 1))


def observed_from(plan_name: str, positions: list[int], *, mig: str = "MIG-x") -> list[ObservedInstance]:
    plan = plan_group(GROUP2 if plan_name == "group2" else GROUP1, A100)
    return [
        ObservedInstance(
            gi_id=10 + p,
            profile_id=plan.at(p).profile_id,
            start=plan.at(p).start,
            size=plan.at(p).size,
            compute=(ObservedCompute(0, f"{mig}-{p}", plan.at(p).memory_mib, True),),
        )
        for p in positions
    ]


def test_group2_is_placed_in_template_order_at_the_lowest_free_starts() -> None:
    plan = plan_group(GROUP2, A100)
    assert [(p.position, p.type_name, p.start, p.size, p.memory_mib) for p in plan.instances] == [
        (0, "2g.10gb", 0, 2, 9856),
        (1, "2g.10gb", 2, 2, 9856),
        (2, "2g.10gb", 4, 2, 9856),
        (3, "1g.5gb", 6, 1, 4864),
    ]


def test_a_template_order_that_does_not_fit_greedily_is_placed_by_backtracking() -> None:
    # 3g first would take start 0, where the only 4g placement is; the plan moves it to 4.
    plan = plan_group(group("mixed", ("3g.20gb", 1), ("4g.20gb", 1)), A100)
    assert [(p.type_name, p.start) for p in plan.instances] == [("3g.20gb", 4), ("4g.20gb", 0)]


@pytest.mark.parametrize(
    "model", sorted(m for m in MODELS if geometry_for_type(default_device_config(), register_type(m)))
)
def test_every_default_group_can_be_laid_out_on_its_models(model: str) -> None:
    groups = geometry_for_type(default_device_config(), register_type(model))
    assert groups is not None
    profiles = profiles_of(model)
    plans = plan_groups(groups, profiles)
    assert sorted(plans) == sorted(g.name for g in groups)
    for name, plan in plans.items():
        slices = [s for p in plan.instances for s in p.slices]
        assert len(slices) == len(set(slices)), name
        # The geometry's memory is NVML's for every slot: requests the scheduler places fit.
        geometry = next(g for g in groups if g.name == name)
        memories = [t.memory_mib for t in geometry.instance_types for _ in range(t.count)]
        assert [p.memory_mib for p in plan.instances] == memories


def test_groups_that_cannot_exist_are_refused_with_the_reason() -> None:
    with pytest.raises(LayoutError, match=r"no MIG profile '1g\.6gb'.*1g\.5gb"):
        plan_group(MigGroup("g", (MigInstanceType("1g.6gb", 6000, 1),)), A100)
    with pytest.raises(LayoutError, match=r"3 x 3g\.20gb asked, the GPU holds at most 2"):
        plan_group(group("g", ("3g.20gb", 3)), A100)
    with pytest.raises(LayoutError, match="needs 8 compute slices, the GPU has 7"):
        plan_group(group("g", ("4g.20gb", 1), ("2g.10gb", 2)), A100)
    with pytest.raises(LayoutError, match="no placement"):
        plan_group(group("g", ("1g.10gb", 4), ("1g.5gb", 1)), A100)
    assert plan_groups([group("bad", ("3g.20gb", 3)), GROUP1], A100).keys() == {"group1"}


def test_an_empty_gpu_gets_the_whole_layout() -> None:
    plan = plan_group(GROUP2, A100)
    assert decide_layout(plan, 0, [], []) == LayoutActions(create=plan.instances)


def test_an_existing_layout_of_the_group_is_used_as_it_is() -> None:
    plan = plan_group(GROUP2, A100)
    observed = observed_from("group2", [0, 1, 2, 3])
    holders = [SlotHolder("pod default/a", "group2", 0)]
    assert decide_layout(plan, 1, observed, holders) == LayoutActions()
    found = find_planned(plan, 1, observed)
    assert found is not None and found.compute[0].mig_uuid == "MIG-x-1"
    assert matching_groups({"group1": plan_group(GROUP1, A100), "group2": plan}, observed) == ["group2"]


def test_missing_instances_of_a_held_group_are_added_and_nothing_is_destroyed() -> None:
    plan = plan_group(GROUP2, A100)
    observed = observed_from("group2", [0])
    actions = decide_layout(plan, 1, observed, [SlotHolder("pod default/a", "group2", 0)])
    assert actions == LayoutActions(create=plan.instances[1:])


def test_a_gpu_instance_left_without_compute_instance_gets_one() -> None:
    plan = plan_group(GROUP2, A100)
    half = [*observed_from("group2", [0]), ObservedInstance(20, plan.at(1).profile_id, plan.at(1).start, 2)]
    actions = decide_layout(plan, 1, half, [SlotHolder("pod default/a", "group2", 0)])
    assert isinstance(actions, LayoutActions)
    assert actions.add_compute == (20,) and [p.position for p in actions.create] == [2, 3]


def test_an_idle_gpu_partitioned_otherwise_is_switched() -> None:
    plan = plan_group(GROUP2, A100)
    old = observed_from("group1", [0, 1, 2])
    assert decide_layout(plan, 0, old, []) == LayoutActions(destroy=(10, 11, 12), create=plan.instances)


def test_a_layout_change_under_a_live_pod_is_refused_naming_pod_and_groups() -> None:
    # Volcano does this: pod 1 holds [group2-0], pod 2 is given [group1-0] on the same GPU.
    decision = decide_layout(
        plan_group(GROUP1, A100),
        0,
        observed_from("group2", [0, 1, 2, 3]),
        [SlotHolder("pod default/p1", "group2", 0)],
    )
    assert isinstance(decision, Refusal)
    assert "partitioned as group2 for live pod default/p1" in decision.reason
    assert "[group1-0] needs layout group1" in decision.reason


def test_a_slot_already_held_is_not_shared() -> None:
    decision = decide_layout(
        plan_group(GROUP2, A100),
        0,
        observed_from("group2", [0, 1, 2, 3]),
        [SlotHolder("pod default/p1", "group2", 0)],
    )
    assert isinstance(decision, Refusal) and "already held by pod default/p1" in decision.reason


def test_a_foreign_instance_blocking_the_slot_under_live_pods_is_refused() -> None:
    plan = plan_group(GROUP2, A100)
    foreign = ObservedInstance(30, A100["1g.5gb"].profile_id, 2, 1)  # sits where position 1 goes
    decision = decide_layout(
        plan, 1, [*observed_from("group2", [0]), foreign], [SlotHolder("pod a/b", "group2", 0)]
    )
    assert isinstance(decision, Refusal) and "blocked by GPU instance(s) 30" in decision.reason
    # A slot the foreign instance leaves room for is still made (without the blocked one).
    actions = decide_layout(
        plan, 2, [*observed_from("group2", [0]), foreign], [SlotHolder("pod a/b", "group2", 0)]
    )
    assert isinstance(actions, LayoutActions) and [p.position for p in actions.create] == [2, 3]


def test_a_position_outside_the_group_is_refused() -> None:
    decision = decide_layout(plan_group(GROUP2, A100), 4, [], [])
    assert isinstance(decision, Refusal) and "positions are 0..3" in decision.reason


def test_a_split_instance_is_not_the_plans() -> None:
    plan = plan_group(GROUP2, A100)
    at0 = plan.at(0)
    split = ObservedInstance(
        3,
        at0.profile_id,
        at0.start,
        at0.size,
        (ObservedCompute(0, "MIG-a", 9856, False), ObservedCompute(1, "MIG-b", 9856, False)),
    )
    assert find_planned(plan, 0, [split]) is None
    assert decide_layout(plan, 0, [split], []) == LayoutActions(destroy=(3,), create=plan.instances)


def test_idle_clock_starts_when_first_seen_and_runs_out_after_the_grace() -> None:
    due, clocks = teardown_due(["a", "b"], {}, 100.0, 60.0)
    assert (due, clocks) == ([], {"a": 100.0, "b": 100.0})
    due, clocks = teardown_due(["a", "b"], clocks, 159.9, 60.0)
    assert due == []
    due, clocks = teardown_due(["a"], clocks, 160.0, 60.0)  # b is busy again: its clock is dropped
    assert (due, clocks) == (["a"], {})
    due, clocks = teardown_due(["b"], clocks, 170.0, 60.0)
    assert (due, clocks) == ([], {"b": 170.0})
