"""The node plugin's last check of a share-of-card booking: never more memory than the webhook charged."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.devices import DeviceRecord
from kube_vgpu.contract.names import CHARGED_GPU_MEMORY
from kube_vgpu.node.deviceplugin.verify import charged_gpu_mib, claim_problem
from tests.support.node import GPUS, UUID_A

NAMES = ResourceNames()
BY_UUID = {g.uuid: g for g in GPUS}
CARD = BY_UUID[UUID_A].memory_mib  # 32768


def _container(**limits: str) -> dict[str, Any]:
    return {"name": "c", "resources": {"limits": {NAMES.count: "1", **limits}}}


def _problem(container: dict[str, Any], used_mem: int, annotations: dict[str, str]) -> str | None:
    records = (DeviceRecord(UUID_A, used_mem, 0, "NVIDIA"),)
    return claim_problem(records, annotations, BY_UUID, set(), "hami-core", container=container, names=NAMES)


def test_a_whole_card_charged_exactly_the_gpu_is_allowed() -> None:
    assert _problem(_container(), CARD, {CHARGED_GPU_MEMORY: str(CARD)}) is None
    assert _problem(_container(), 0, {CHARGED_GPU_MEMORY: str(CARD)}) is None  # 0: the whole card
    assert _problem(_container(), CARD, {CHARGED_GPU_MEMORY: str(CARD + 1)}) is None


def test_a_whole_card_charged_one_mib_less_than_the_gpu_is_refused_naming_both_figures() -> None:
    found = _problem(_container(), CARD, {CHARGED_GPU_MEMORY: str(CARD - 1)})
    assert found == (
        f"device {UUID_A} would give container 'c' {CARD} MiB of GPU {UUID_A} ({CARD} MiB) but the pod "
        f"was charged {CARD - 1} MiB for it at admission (a GPU of {CARD - 1} MiB, {CHARGED_GPU_MEMORY})"
    )


def test_a_percentage_is_compared_as_volcano_rounds_it() -> None:
    half = _container(**{NAMES.memory_percentage: "50"})
    assert _problem(half, CARD // 2, {CHARGED_GPU_MEMORY: str(CARD)}) is None
    # 50 % of one MiB less is one MiB less (floor), so the booking is one MiB over the charge.
    found = _problem(half, CARD // 2, {CHARGED_GPU_MEMORY: str(CARD - 1)})
    assert (
        found is not None and f"{CARD // 2} MiB of GPU" in found and f"charged {(CARD - 1) // 2} MiB" in found
    )


def test_an_explicit_memory_is_not_a_share_and_is_not_bounded_by_the_record() -> None:
    # Its charge is its own limit, which the booking must match anyway.
    assert _problem(_container(**{NAMES.memory: "1000"}), 1000, {CHARGED_GPU_MEMORY: "1"}) is None


def test_without_the_record_a_share_is_not_bounded() -> None:
    assert _problem(_container(), CARD, {}) is None


@pytest.mark.parametrize("value", ["", "abc", "-1", "1.5", " 1", "\uff11", "0x10"])
def test_an_unreadable_record_refuses_the_booking(value: str) -> None:
    assert _problem(_container(), CARD, {CHARGED_GPU_MEMORY: value}) == (
        f"annotation {CHARGED_GPU_MEMORY}={value!r} is not a whole number of MiB"
    )


def test_the_record_is_read_as_whole_mib() -> None:
    assert charged_gpu_mib({}) is None
    assert charged_gpu_mib({CHARGED_GPU_MEMORY: "81920"}) == 81920
    assert charged_gpu_mib({CHARGED_GPU_MEMORY: "0"}) == 0
    assert (
        charged_gpu_mib({CHARGED_GPU_MEMORY: 5})
        == f"annotation {CHARGED_GPU_MEMORY}=5 is not a whole number of MiB"
    )
