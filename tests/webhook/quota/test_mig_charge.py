"""`webhook.mig_charge`: a `mig` pod is charged the slot Volcano would give it (protocol §6.2)."""

from __future__ import annotations

from kube_vgpu.contract.mig.geometry import parse_device_config
from kube_vgpu.contract.models import register_type
from kube_vgpu.webhook.quota.mig_charge import slot_mib, slot_sizer

GEOMETRY = parse_device_config(
    """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  knownMigGeometries:
  - models: ["A100-PCIE-40GB"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.5gb, memory: 4864, count: 7}]
    - group: group2
      geometries: [{name: 2g.10gb, memory: 9856, count: 3}, {name: 1g.5gb, memory: 4864, count: 1}]
    - group: group3
      geometries: [{name: 3g.20gb, memory: 19968, count: 2}]
  - models: ["H100 80GB HBM3"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.10gb, memory: 9984, count: 7}]
"""
)
A100 = register_type("NVIDIA A100-PCIE-40GB")
H100 = register_type("NVIDIA H100 80GB HBM3")
A10 = register_type("NVIDIA A10")


def test_a_tiny_request_is_charged_the_smallest_slot() -> None:
    assert slot_mib(GEOMETRY, [A100], 1) == 4864
    assert slot_mib(GEOMETRY, [A100], 4864) == 4864


def test_the_first_group_with_a_fitting_slot_decides_as_in_volcano() -> None:
    # group1 has nothing >= 5000, group2's smallest fitting type is 2g.10gb.
    assert slot_mib(GEOMETRY, [A100], 5000) == 9856
    assert slot_mib(GEOMETRY, [A100], 10000) == 19968


def test_the_largest_slot_over_the_candidate_gpus_is_charged() -> None:
    assert slot_mib(GEOMETRY, [A100, H100], 1) == 9984
    assert slot_sizer(GEOMETRY, [H100, A100])(1) == 9984


def test_unknown_geometries_and_requests_no_slot_fits_are_charged_as_asked() -> None:
    assert slot_mib(GEOMETRY, [A10], 1) == 1
    assert slot_mib(GEOMETRY, [], 1234) == 1234
    assert slot_mib(GEOMETRY, [A100], 30000) == 30000


def test_types_that_give_no_slot_do_not_stop_the_others_from_being_weighed() -> None:
    # An unknown type first (no geometry), or one no slot fits (10,000 MiB on an H100's 9,984 slots),
    # is skipped, and the next type still sets the charge.
    assert slot_mib(GEOMETRY, [A10, A100], 1) == 4864
    assert slot_mib(GEOMETRY, [H100, A100], 10_000) == 19968


def test_a_slot_is_described_by_its_name_and_size_only_where_it_rounds_up() -> None:
    slots = slot_sizer(GEOMETRY, [A100, A10])
    assert slots(1) == 4864 and slots.describe(1) == "1g.5gb slot of 4864 MiB"
    assert slots.describe(4864) is None  # exactly a slot: charged as asked
    assert slots.describe(5000) == "2g.10gb slot of 9856 MiB"
    assert slots.describe(30000) is None  # no slot fits: charged as asked
    # The largest over the GPUs the pod may land on names it.
    assert slot_sizer(GEOMETRY, [A100, H100]).describe(1) == "1g.10gb slot of 9984 MiB"
    assert slot_sizer(GEOMETRY, [H100, A100]).describe(5000) == "1g.10gb slot of 9984 MiB"
    assert slot_sizer(GEOMETRY, [A10]).describe(1) is None


def test_among_slots_of_one_size_the_first_type_names_it() -> None:
    twins = parse_device_config(
        """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  knownMigGeometries:
  - models: ["A100-PCIE-40GB"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.first, memory: 5000, count: 7}]
  - models: ["H100 80GB HBM3"]
    allowedGeometries:
    - group: group1
      geometries: [{name: 1g.second, memory: 5000, count: 7}]
"""
    )
    # The candidate TYPEs are kept sorted: A100's register TYPE sorts before H100's.
    assert sorted([A100, H100]) == [A100, H100]
    assert slot_sizer(twins, [H100, A100]).describe(1) == "1g.first slot of 5000 MiB"
