"""Segment matching of model tokens and the register TYPE bridge to Volcano's substring rule."""

from __future__ import annotations

import pytest

from kube_vgpu.contract.models import (
    gputype_items,
    model_label_name,
    parse_register_type,
    register_type,
    token_matches_model,
)


@pytest.mark.parametrize(
    ("token", "model", "expected"),
    [
        ("A100", "NVIDIA A100-SXM4-80GB", True),
        ("A10", "NVIDIA A100-SXM4-80GB", False),
        ("a10", "NVIDIA A10", True),
        ("H100-80GB", "NVIDIA H100 80GB HBM3", True),
        ("H100_80GB", "NVIDIA H100 80GB HBM3", True),
        ("80GB-H100", "NVIDIA H100 80GB HBM3", False),
        ("", "NVIDIA A10", False),
        ("NVIDIA-H200-141GB-X", "NVIDIA H200", False),
    ],
)
def test_segment_rule(token: str, model: str, expected: bool) -> None:
    assert token_matches_model(token, model) is expected


def test_label_name_is_valid_and_keeps_segments() -> None:
    assert model_label_name("NVIDIA A100-SXM4-80GB") == "NVIDIA-A100-SXM4-80GB"
    weird = model_label_name("NVIDIA (x) H100/80GB " + "y" * 80)
    assert len(weird) <= 63 and weird[0].isalnum() and weird[-1].isalnum()
    assert token_matches_model("H100", model_label_name("NVIDIA H100 80GB HBM3"))


def test_register_type_round_trips_both_forms() -> None:
    ours = register_type("NVIDIA A10")
    assert ours == "NVIDIA-[NVIDIA A10]" and "NVIDIA" in ours
    assert parse_register_type(ours).model == "NVIDIA A10" and parse_register_type(ours).delimited
    ref = parse_register_type("NVIDIA-NVIDIA A100-PCIE-40GB")
    assert ref.model == "NVIDIA A100-PCIE-40GB" and not ref.delimited
    with pytest.raises(ValueError, match="cannot carry"):
        register_type("A,B")


def _volcano_allows(items: tuple[str, ...], type_field: str) -> bool:
    """Volcano's rule (pkg/scheduler/api/devices/nvidia/vgpu/utils.go): any item is a case-insensitive
    substring of TYPE."""
    return any(item.lower() in type_field.lower() for item in items)


def test_items_pick_exactly_the_allowed_models_under_volcanos_substring_rule() -> None:
    a10, a100 = register_type("NVIDIA A10"), register_type("NVIDIA A100-PCIE-40GB")
    only_a10 = gputype_items([a10], [a10, a100])
    assert not only_a10.inexact
    assert _volcano_allows(only_a10.items, a10) and not _volcano_allows(only_a10.items, a100)
    only_a100 = gputype_items([a100], [a10, a100])
    assert _volcano_allows(only_a100.items, a100) and not _volcano_allows(only_a100.items, a10)
    # The naive token would pick both, which is the bug these items avoid.
    assert _volcano_allows(("A10",), a100)


def test_reference_form_types_that_cannot_be_separated_are_reported() -> None:
    a10, a100 = "NVIDIA-NVIDIA A10", "NVIDIA-NVIDIA A100-PCIE-40GB"
    result = gputype_items([a10], [a10, a100])
    assert result.inexact == (a10,)
    assert not gputype_items([a100], [a10, a100]).inexact
