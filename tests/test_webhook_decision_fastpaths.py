"""The shortcuts of the per-review decision that skip work: each answers exactly as the full path."""

from __future__ import annotations

import pytest
from test_webhook_support import H100, container, gpu_node, pod

from contract.config import ResourceNames
from contract.mig_geometry_default import default_device_config
from contract.names import HAMI_CORE, MIG, VGPU_MODE, VGPU_MODE_ALIAS
from webhook.inventory import Inventory
from webhook.quota import mig_slot_sizer
from webhook.quota_charge import LABELS, Limits, parse_limits


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
    assert (size(pod(container(memory=1), annotations=annotations)) is not None) is slotted


def test_labels_without_quota_keys_are_unlimited_and_quota_keys_are_still_read() -> None:
    assert parse_limits({}) == parse_limits({"team": "ml"}) == Limits()
    assert parse_limits({LABELS["vgpu-number"]: "2", "team": "ml"}) == Limits(number=2)
    assert parse_limits({LABELS["vgpu-cores"]: "x"}).invalid == ((LABELS["vgpu-cores"], "x"),)
