"""The resourceVersion floor of a collection's lists (`ListVersion`) only moves forward."""

from __future__ import annotations

import pytest

from kube_vgpu.kubeapi.client import ApiError
from kube_vgpu.kubeapi.listwatch import ListVersion


def test_the_first_list_asks_the_watch_cache_and_later_ones_the_last_version() -> None:
    versions = ListVersion()
    assert versions.next() == "0"
    versions.listed("7")
    assert versions.next() == "7"


@pytest.mark.parametrize(
    ("first", "then", "floor"),
    [
        ("10", "9", "10"),  # older: kept at 10 (as text "9" > "10": compared as integers)
        ("10", "10", "10"),  # the same version
        ("10", "11", "11"),  # newer: moves
        ("9", "10", "10"),
        ("123456789012345678901", "123456789012345678900", "123456789012345678901"),  # past 64 bits
    ],
)
def test_numeric_versions_move_the_floor_only_forward(first: str, then: str, floor: str) -> None:
    listed, seen = ListVersion(), ListVersion()
    listed.listed(first)
    listed.listed(then)
    seen.seen(first)
    seen.seen(then)
    assert listed.next() == seen.next() == floor


@pytest.mark.parametrize(("first", "then"), [("10", "a9"), ("abc", "9"), ("10", "٣"), ("10", "-1")])
def test_a_version_that_is_not_a_decimal_integer_is_opaque_and_the_newest_report_is_kept(
    first: str, then: str
) -> None:
    # "٣" (Arabic-Indic three) is a digit to str.isdigit and to int(), not to kube-apiserver.
    versions = ListVersion()
    versions.listed(first)
    versions.listed(then)
    assert versions.next() == then


def test_an_empty_version_changes_nothing() -> None:
    versions = ListVersion()
    versions.listed("5")
    versions.listed("")
    versions.seen("")
    assert versions.next() == "5"


def test_after_an_unavailable_version_the_consistent_list_sets_the_floor_even_backwards() -> None:
    # A server restored from an older etcd backup has not reached the floor: the 504 makes the next
    # list a consistent read, and its version, older, is the floor from then on.
    versions = ListVersion()
    versions.listed("500")
    too_large = ApiError(504, "Timeout", "Too large resource version: 500, current: 40")
    assert versions.failed("500", too_large)
    assert versions.next() == ""
    versions.listed("41")
    assert versions.next() == "41"
    versions.listed("40")  # and forward only again
    assert versions.next() == "41"


def test_a_failure_other_than_an_unavailable_version_keeps_the_floor() -> None:
    versions = ListVersion()
    versions.listed("500")
    assert not versions.failed("500", ApiError(403, "Forbidden", "pods is forbidden"))
    assert not versions.failed("", ApiError(410, "Expired", "too old resource version"))
    assert versions.next() == "500"
