"""Volcano's MIG geometry contract against the ConfigMap Volcano ships and
the slots its pkg/scheduler/api/devices/nvidia/vgpu/mig.go picks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kube_vgpu.contract.mig.geometry import (
    MigGeometryError,
    MigGroup,
    MigSlot,
    choose_slot,
    find_group,
    geometry_for_type,
    is_mig_device_id,
    parse_device_config,
    parse_mig_device_id,
    position_of,
    slot_for_position,
)
from kube_vgpu.contract.mig.shipped import DEFAULT_DEVICE_CONFIG_YAML, default_device_config
from kube_vgpu.standins.volcano.fit import mig_device_id

# The `volcano-vgpu-device-config` ConfigMap, as Volcano ships it.
FACTS_CONFIG = """\
nvidia:
  resourceCountName: volcano.sh/vgpu-number
  resourceMemoryName: volcano.sh/vgpu-memory
  resourceMemoryPercentageName: volcano.sh/vgpu-memory-percentage
  resourceCoreName: volcano.sh/vgpu-cores
  gpuMemoryFactor: 1
  deviceSplitCount: 10
  deviceCoreScaling: 1
  deviceMemoryScaling: 1
  knownMigGeometries:
  - models: ["A100-SXM4-40GB", "A100-40GB-PCIe", "A100-PCIE-40GB"]
    allowedGeometries:
    - group: group1
      geometries:
      - {name: 1g.5gb, memory: 5120, count: 7}
    - group: group2
      geometries:
      - {name: 2g.10gb, memory: 10240, count: 3}
      - {name: 1g.5gb,  memory: 5120,  count: 1}
    - group: group3
      geometries:
      - {name: 3g.20gb, memory: 20480, count: 2}
    - group: group4
      geometries:
      - {name: 7g.40gb, memory: 40960, count: 1}
"""
A100_TYPE = "NVIDIA-NVIDIA A100-SXM4-40GB"
UUID = "GPU-1c2d3e4f-0a1b-2c3d-4e5f-60718293a4b5"


@pytest.fixture
def a100_groups() -> list[MigGroup]:
    groups = geometry_for_type(parse_device_config(FACTS_CONFIG), A100_TYPE)
    assert groups is not None
    return groups


def test_parse_reads_the_nvidia_section() -> None:
    config = parse_device_config(FACTS_CONFIG)
    assert config.resource_memory_name == "volcano.sh/vgpu-memory"
    assert (config.gpu_memory_factor, config.device_split_count) == (1, 10)
    (entry,) = config.known_mig_geometries
    assert entry.models[2] == "A100-PCIE-40GB"
    assert [g.name for g in entry.groups] == ["group1", "group2", "group3", "group4"]
    assert [(t.name, t.memory_mib, t.count) for t in entry.groups[1].instance_types] == [
        ("2g.10gb", 10240, 3),
        ("1g.5gb", 5120, 1),
    ]
    assert sum(t.count for t in entry.groups[1].instance_types) == 4


def test_omitted_names_are_empty_and_numbers_take_defaults() -> None:
    config = parse_device_config("nvidia:\n  resourceCountName: volcano.sh/vgpu-number\n")
    assert config.resource_memory_name == ""
    assert (config.gpu_memory_factor, config.device_split_count, config.known_mig_geometries) == (1, 10, ())


def test_worked_example_8000_then_4000_on_an_empty_a100(a100_groups: list[MigGroup]) -> None:
    first = choose_slot(a100_groups, {}, 8000)
    assert first == ("group2", 0)
    assert mig_device_id(UUID, *first) == f"{UUID}[group2-0]"
    # The second pod, once the first is in the ledger, gets the next 2g.10gb, not the 1g.5gb.
    assert choose_slot(a100_groups, {"group2": [0]}, 4000) == ("group2", 1)


def test_only_types_in_use_are_eligible_on_a_partitioned_gpu(a100_groups: list[MigGroup]) -> None:
    # Once a group is in use, only its used types are offered: with all three 2g.10gb taken, the free 1g.5gb
    # (not yet used) is never offered.
    assert choose_slot(a100_groups, {"group2": [0, 1, 2]}, 100) is None
    # Once the 1g.5gb is in use it is the smallest eligible type for a small request.
    assert choose_slot(a100_groups, {"group2": [3, 0]}, 100) == ("group2", 1)
    assert choose_slot(a100_groups, {"group1": [0, 1, 2, 3, 4, 5, 6]}, 100) is None
    # The lowest free index of the type is taken.
    assert choose_slot(a100_groups, {"group1": [0, 2]}, 5000) == ("group1", 1)


def test_unused_gpu_tries_groups_in_order_and_fails_when_nothing_fits(a100_groups: list[MigGroup]) -> None:
    assert choose_slot(a100_groups, {}, 5000) == ("group1", 0)
    assert choose_slot(a100_groups, {}, 12000) == ("group3", 0)
    assert choose_slot(a100_groups, {}, 40960) == ("group4", 0)
    assert choose_slot(a100_groups, {}, 40961) is None
    # A group listed with no positions is not in use.
    assert choose_slot(a100_groups, {"group3": []}, 5000) == ("group1", 0)


def test_choose_slot_rejects_impossible_usage(a100_groups: list[MigGroup]) -> None:
    with pytest.raises(MigGeometryError, match="one MIG group at a time"):
        choose_slot(a100_groups, {"group1": [0], "group2": [0]}, 10)
    with pytest.raises(MigGeometryError, match="outside group 'group3'"):
        choose_slot(a100_groups, {"group3": [2]}, 10)
    with pytest.raises(MigGeometryError, match="no MIG group 'group9'"):
        choose_slot(a100_groups, {"group9": [0]}, 10)
    with pytest.raises(MigGeometryError, match="not an integer >= 0"):
        choose_slot(a100_groups, {}, -1)


def test_position_arithmetic(a100_groups: list[MigGroup]) -> None:
    group2 = find_group(a100_groups, "group2")
    assert position_of(group2, "1g.5gb", 0) == 3
    assert position_of(group2, "2g.10gb", 2) == 2
    assert slot_for_position(group2, 3) == MigSlot("1g.5gb", 5120, 0)
    assert slot_for_position(group2, 1) == ("2g.10gb", 10240, 1)
    for position in range(sum(t.count for t in group2.instance_types)):
        slot = slot_for_position(group2, position)
        assert position_of(group2, slot.instance_type, slot.index_within_type) == position


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (
            lambda g: slot_for_position(g, 4),
            r"position 4 is outside group 'group2', whose positions are 0\.\.3",
        ),
        (lambda g: slot_for_position(g, -1), "not an integer >= 0"),
        (lambda g: position_of(g, "1g.5gb", 1), r"not in 0\.\.0"),
        (lambda g: position_of(g, "3g.20gb", 0), "has no instance type '3g.20gb'"),
    ],
)
def test_position_errors(
    a100_groups: list[MigGroup], call: Callable[[MigGroup], object], fragment: str
) -> None:
    with pytest.raises(MigGeometryError, match=fragment):
        call(find_group(a100_groups, "group2"))


def test_geometry_is_the_first_model_substring_match() -> None:
    config = parse_device_config(FACTS_CONFIG)
    assert geometry_for_type(config, "NVIDIA-NVIDIA A100-PCIE-40GB") is not None
    assert geometry_for_type(config, "NVIDIA-NVIDIA A100-SXM4-80GB") is None
    # Case-sensitive, like Volcano's strings.Contains.
    assert geometry_for_type(config, "nvidia-nvidia a100-sxm4-40gb") is None


def test_device_id_round_trip_and_rejections() -> None:
    parsed = parse_mig_device_id(f"{UUID}[group2-3]")
    assert parsed == (UUID, "group2", 3)
    assert mig_device_id(*parsed) == f"{UUID}[group2-3]"
    assert is_mig_device_id(f"{UUID}[group2-3]") and not is_mig_device_id(UUID)
    for bad, fragment in [
        (UUID, "is not <GPU-UUID>"),
        (f"{UUID}[group-2-3]", "exactly one '-'"),
        (f"{UUID}[group2]", "exactly one '-'"),
        (f"{UUID}[group2-x]", "position 'x' is not an integer"),
        (f"{UUID}[-3]", "group name is empty"),
        (f"{UUID}[group2-3]x", "is not <GPU-UUID>"),
    ]:
        with pytest.raises(MigGeometryError, match=fragment):
            parse_mig_device_id(bad)


@pytest.mark.parametrize("bad_name", ["my-group", "g[1]", "g,1", "g:1", "g;1"])
def test_group_names_that_break_the_device_id_are_rejected_by_name(bad_name: str) -> None:
    text = FACTS_CONFIG.replace("group: group3", f"group: {bad_name!r}")
    with pytest.raises(MigGeometryError, match=r"allowedGeometries\[2\]\.group: group name") as info:
        parse_device_config(text)
    assert repr(bad_name) in str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("count: 7}", 'count: "7"}', r"geometries\[0\]\.count: expected an integer >= 1, got '7'"),
        ("memory: 40960", "memory: 0", r"geometries\[0\]\.memory: expected an integer >= 1, got 0"),
        ("gpuMemoryFactor: 1", "gpuMemoryFactor: 0", "nvidia.gpuMemoryFactor: expected an integer >= 1"),
        ('models: ["A100-SXM4-40GB", ', 'models: ["", ', r"models\[0\]: expected a non-empty string"),
        ("group: group4", "group: group3", r"allowedGeometries\[3\]\.group: 'group3' appears twice"),
        ("{name: 1g.5gb,  memory", "{name: 2g.10gb, memory", "'2g.10gb' appears twice in group 'group2'"),
        ("nvidia:", "nvidia: 3\nother:", "nvidia: expected a mapping"),
        ("deviceSplitCount: 10", "deviceSplitCount: true", "deviceSplitCount: expected an integer"),
    ],
)
def test_bad_documents_are_refused_with_the_key(old: str, new: str, fragment: str) -> None:
    assert old in FACTS_CONFIG
    with pytest.raises(MigGeometryError, match=fragment):
        parse_device_config(FACTS_CONFIG.replace(old, new, 1))


def test_not_yaml_is_refused() -> None:
    with pytest.raises(MigGeometryError, match="not valid YAML"):
        parse_device_config("nvidia: [unclosed")


def test_default_document_covers_the_four_models_without_crossing_over() -> None:
    config = default_device_config()
    assert config == parse_device_config(DEFAULT_DEVICE_CONFIG_YAML)
    sevens: dict[str, str] = {}
    for nvml_name in [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H200",
    ]:
        groups = geometry_for_type(config, "NVIDIA-" + nvml_name)
        assert groups is not None, nvml_name
        assert [g.name for g in groups] == ["group1", "group2", "group3", "group4"]
        sevens[nvml_name] = find_group(groups, "group4").instance_types[0].name
    assert sevens["NVIDIA A100-PCIE-40GB"] == "7g.40gb"
    assert sevens["NVIDIA A100 80GB PCIe"] == "7g.80gb"
    assert sevens["NVIDIA H200"] == "7g.141gb"
    # GH200's profiles differ from H200's; a plain "H200" model would have matched it.
    assert geometry_for_type(config, "NVIDIA-NVIDIA GH200 480GB") is None
