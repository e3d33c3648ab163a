"""The shortcuts of the per-review decision that skip work: each answers exactly as the full path."""

from __future__ import annotations

import dataclasses

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.mig.shipped import default_device_config
from kube_vgpu.contract.names import HAMI_CORE, MIG, VGPU_MODE, VGPU_MODE_ALIAS
from kube_vgpu.contract.resources import parse_pod
from kube_vgpu.webhook.admission.patch import pointer
from kube_vgpu.webhook.placement.fit import never_fits, never_fits_in
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.selectors import ORIGINAL_NOUSE_GPUTYPE, SelectorError, parse_selectors
from kube_vgpu.webhook.quota.charge import LABELS, QuotaLimits, parse_limits
from kube_vgpu.webhook.quota.sizing import mig_slot_sizer
from tests.support.records import as_pod
from tests.support.webhook import A100, H100, container, gpu_node, pod


def _mig_inventory() -> Inventory:
    inv = Inventory()
    inv.upsert(gpu_node("h100", MIG, [(H100, 81920)]))
    return inv


@pytest.mark.parametrize(
    ("annotations", "slotted"),
    [
        ({VGPU_MODE: MIG}, True),
        ({}, True),  # no mode written: the only mode the inventory offers is mig
        ({VGPU_MODE: HAMI_CORE}, False),
        ({VGPU_MODE_ALIAS: HAMI_CORE}, False),
        ({VGPU_MODE: HAMI_CORE, VGPU_MODE_ALIAS: MIG}, False),  # disagreeing alias: no selectors, no slot
        ({VGPU_MODE: MIG, VGPU_MODE_ALIAS: HAMI_CORE}, False),
    ],
)
def test_the_mig_slot_sizer_skips_only_pods_it_would_not_size(
    annotations: dict[str, str], slotted: bool
) -> None:
    inv = _mig_inventory()
    size = mig_slot_sizer(lambda: inv, default_device_config, ResourceNames(), HAMI_CORE)
    assert (size(as_pod(pod(container(memory=1), annotations=annotations))) is not None) is slotted


def test_labels_without_quota_keys_are_unlimited_and_quota_keys_are_still_read() -> None:
    assert parse_limits({}) == parse_limits({"team": "ml"}) == QuotaLimits()
    assert parse_limits({LABELS["vgpu-number"]: "2", "team": "ml"}) == QuotaLimits(number=2)
    assert parse_limits({LABELS["vgpu-cores"]: "x"}).invalid == ((LABELS["vgpu-cores"], "x"),)


def test_never_fits_in_answers_as_never_fits_and_follows_the_inventory() -> None:
    inv = Inventory()
    inv.upsert(gpu_node("small", HAMI_CORE, [(A100, 40960)]))
    big_ask = parse_pod(pod(container("c", number=1, memory=60000)), ResourceNames())
    assert never_fits_in(big_ask, inv) == never_fits(big_ask, inv.memory_shapes()) != []
    inv.upsert(gpu_node("big", HAMI_CORE, [(H100, 81920)]))
    assert never_fits_in(big_ask, inv) == never_fits(big_ask, inv.memory_shapes()) == []
    inv.remove("big")
    assert never_fits_in(big_ask, inv) != []
    inv.clear()
    assert never_fits_in(big_ask, inv) == []  # no GPU node known: nothing said


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {"team": "ml"},
        {VGPU_MODE: HAMI_CORE},
        {VGPU_MODE: MIG, "team": "ml"},
        {VGPU_MODE_ALIAS: MIG},
        {VGPU_MODE: MIG, VGPU_MODE_ALIAS: MIG},
    ],
)
def test_parse_selectors_shortcuts_answer_as_the_full_parse(annotations: dict[str, str]) -> None:
    # The full parse is reached through a key it reads that holds nothing a rule looks at.
    full = parse_selectors({**annotations, ORIGINAL_NOUSE_GPUTYPE: "X"})
    assert parse_selectors(annotations) == dataclasses.replace(full, nouse_types=None, nouse_types_text=None)


def test_an_unknown_mode_alone_is_still_refused() -> None:
    with pytest.raises(SelectorError, match="unknown mode"):
        parse_selectors({VGPU_MODE: "fast"})


def test_pointer_escapes_only_parts_that_need_it() -> None:
    assert pointer() == ""
    assert pointer("metadata", "annotations", "a/b~c") == "/metadata/annotations/a~1b~0c"
    assert pointer("spec", "containers", 0) == "/spec/containers/0"
