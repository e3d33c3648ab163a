"""Quantities in the apiserver's canonical form
(k8s.io/apimachinery/pkg/api/resource/quantity.go).

Three readers must agree: kube-vgpu's own parser (`contract.quantity`), the stand-in's restatement of
Kubernetes' `resource.Quantity` (what the API server writes back and what Volcano's `Value()` reads),
and the official client's `kubernetes.utils.parse_quantity` (the oracle).
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity

from kube_vgpu.contract.config import ResourceNames
from kube_vgpu.contract.quantity import (
    INT32_MAX,
    INT32_MIN,
    MAX_TEXT,
    QuantityError,
    WholeQuantity,
    has_binary_suffix,
    mib_from_binary,
    parse_whole,
)
from kube_vgpu.contract.resources import RequestError, parse_container
from kube_vgpu.standins.apiserver import quantity as k8s

NAMES = ResourceNames()

# What the user wrote, what every reader sees.
FACTS_TABLE = [
    ("3000", "3k"),
    ("8000", "8k"),
    ("10000", "10k"),
    ("20000", "20k"),
    ("1000000", "1M"),
    ("1.5k", "1500"),
    ("4096", "4096"),
    ("1500", "1500"),
    ("30", "30"),
    ("100", "100"),
    ("1e3", "1e3"),
    ("0.5", "500m"),
    ("3Gi", "3Gi"),
    ("3072Mi", "3Gi"),
    ("2048Mi", "2Gi"),
    ("1024Ki", "1Mi"),
]
# "Volcano reads quantities with Quantity.Value(), which gives 3000 for 3k, 1000 for 1e3,
# 1 for 500m (rounded up) and 3221225472 for 3Gi."
FACTS_VALUES = [("3k", 3000), ("1e3", 1000), ("500m", 1), ("3Gi", 3221225472)]


@pytest.mark.parametrize(("written", "seen"), FACTS_TABLE)
def test_the_stand_in_canonicalises_every_row_of_the_facts_table(written: str, seen: str) -> None:
    assert k8s.canonical(written) == seen


@pytest.mark.parametrize(("text", "value"), FACTS_VALUES)
def test_the_stand_ins_value_is_volcanos(text: str, value: int) -> None:
    assert k8s.value(text) == value


@pytest.mark.parametrize(("written", "seen"), FACTS_TABLE)
def test_kube_vgpu_reads_every_whole_row_as_volcano_does(written: str, seen: str) -> None:
    exact = parse_quantity(seen)
    if exact != exact.to_integral_value() or exact > INT32_MAX:
        with pytest.raises(QuantityError):
            parse_whole(seen)
    else:
        assert parse_whole(seen).value == k8s.value(seen) == int(exact) == int(parse_quantity(written))


@pytest.mark.parametrize(("written", "seen"), FACTS_TABLE)
def test_each_row_as_a_memory_request(written: str, seen: str) -> None:
    """Binary suffixes on vgpu-memory refused with the MiB hint; fractions refused."""
    container = {"name": "main", "resources": {"limits": {NAMES.memory: seen}}}
    if has_binary_suffix(seen):
        with pytest.raises(RequestError, match=r"number of MiB without a binary suffix: write \d+, not"):
            parse_container(container, NAMES, init=False)
    elif "m" in seen:
        with pytest.raises(RequestError, match="fraction"):
            parse_container(container, NAMES, init=False)
    else:
        assert parse_container(container, NAMES, init=False).memory_mib == int(parse_quantity(written))


def test_the_binary_hint_names_the_mib_the_user_meant() -> None:
    container = {"name": "main", "resources": {"limits": {NAMES.memory: "3Gi"}}}
    with pytest.raises(RequestError) as info:
        parse_container(container, NAMES, init=False)
    assert "write 3072, not 3Gi" in str(info.value) and "'main'" in str(info.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2147483648", "larger than"),
        ("2.147483648G", "larger than"),
        ("1e999999999", "larger than"),
        ("-1e999999999", "larger than"),
        ("9" * 64, "larger than"),
        ("9" * 65, "longer than 64"),
        ("1" + "0" * 5000, "longer than 64"),
        ("1e-999999999", "fraction"),
        ("500m", "fraction"),
        ("1.5", "fraction"),
        ("NaN", "not a Kubernetes quantity"),
        ("Infinity", "not a Kubernetes quantity"),
        ("1_000", "not a Kubernetes quantity"),
        (" 3", "not a Kubernetes quantity"),
        ("3K", "not a Kubernetes quantity"),
        ("3KiB", "not a Kubernetes quantity"),
        ("\u0663", "not a Kubernetes quantity"),  # an Arabic-Indic 3: Python's int() would take it
        ("", "not a Kubernetes quantity"),
    ],
)
def test_hostile_and_broken_quantities_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(QuantityError, match=reason):
        parse_whole(text)


@pytest.mark.parametrize("raw", [True, 1.5, None, [], {"a": 1}])
def test_non_quantity_json_types_are_refused(raw: object) -> None:
    with pytest.raises(QuantityError, match="must be a quantity"):
        parse_whole(raw)


_WHOLE_SUFFIXES = ["", "k", "M", "G", "Ki", "Mi", "Gi", "e0", "e1", "e2", "e3", "E6"]


@given(st.integers(min_value=0, max_value=5000), st.sampled_from(_WHOLE_SUFFIXES))
def test_every_whole_quantity_reads_as_the_official_client_and_volcano_read_it(
    number: int, suffix: str
) -> None:
    written = f"{number}{suffix}"
    seen = k8s.canonical(written)  # what reaches kube-vgpu on a real cluster
    exact = parse_quantity(seen)
    assert exact == parse_quantity(written)  # canonicalising never changes the value
    if exact > INT32_MAX:
        with pytest.raises(QuantityError, match="larger than"):
            parse_whole(seen)
    else:
        assert parse_whole(seen).value == k8s.value(seen) == int(exact)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.integers(min_value=1, max_value=999),
    st.sampled_from(["", "k", "m", "e3", "e-3"]),
)
def test_fractions_are_refused_or_read_exactly(whole: int, fraction: int, suffix: str) -> None:
    seen = k8s.canonical(f"{whole}.{fraction:03d}{suffix}")
    exact = parse_quantity(seen)
    if exact != exact.to_integral_value():
        with pytest.raises(QuantityError, match="fraction"):
            parse_whole(seen)
    elif exact <= INT32_MAX:
        assert parse_whole(seen).value == int(exact) == k8s.value(seen)


def test_the_stand_in_refuses_what_the_server_refuses() -> None:
    for text in ("abc", "1.2.3", "3KiB", "1e", " 3"):
        with pytest.raises(k8s.BadQuantity):
            k8s.parse(text)


def test_the_stand_in_rounds_below_nano_up_like_the_server() -> None:
    assert k8s.canonical("0.0000000001") == "1n"
    assert k8s.parse("0.0000000001").amount == Decimal("1e-9")


@pytest.mark.parametrize(
    ("written", "seen"),
    [("+123Ti", "123Ti"), ("000123Ti", "123Ti"), ("01Pi", "1Pi"), ("123Ki", "123Ki"), ("+3k", "+3k")],
)
def test_the_stand_in_keeps_text_only_where_gos_fast_path_does(written: str, seen: str) -> None:
    # ParseQuantity reuses the text as written only on its int64 fast path; for binary suffixes that
    # path needs 15 - len(digits) - exponent*3/10 - 1 >= 0, so a Ti or Pi value is always rebuilt.
    assert k8s.canonical(written) == seen


@pytest.mark.parametrize(("raw", "seen"), [(" 3000 ", "3k"), (None, "0"), (3000, "3k"), (1.5, "1500m")])
def test_the_stand_in_reads_json_as_unmarshal_json_does(raw: object, seen: str) -> None:
    assert k8s.from_json(raw) == seen


def test_a_negative_value_rounds_away_from_zero_like_go() -> None:
    assert k8s.value("-500m") == -1 and k8s.value("500m") == 1


# -- every limit on both sides (mutation testing: docs/testing.md) ----------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [
        ("2147483647", INT32_MAX),  # the largest int32: accepted
        (INT32_MAX, INT32_MAX),
        ("-2147483648", INT32_MIN),  # the smallest: accepted (the range is Volcano's int32)
        (INT32_MIN, INT32_MIN),
        (4096, 4096),
        ("3k", 3000),
    ],
)
def test_the_int32_range_is_accepted_to_its_last_value(raw: str | int, value: int) -> None:
    assert parse_whole(raw) == WholeQuantity(value, binary=False)


@pytest.mark.parametrize("raw", ["2147483648", INT32_MAX + 1, "-2147483649", INT32_MIN - 1])
def test_one_past_the_int32_range_is_refused(raw: str | int) -> None:
    with pytest.raises(QuantityError, match=f"is larger than {INT32_MAX}, which Volcano would wrap"):
        parse_whole(raw)


def test_the_binary_flag_is_set_by_a_binary_suffix_alone() -> None:
    assert parse_whole("1Ki") == WholeQuantity(1024, binary=True)
    assert parse_whole("2Mi").binary and not parse_whole("2M").binary
    assert not parse_whole("1e3").binary and not parse_whole("1024").binary


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("abc", "is not a Kubernetes quantity"),
        ("1.5", "is a fraction; write a whole number"),
        (1.5, 'must be a quantity such as "3000" or "3k", got a float'),
        ([], 'must be a quantity such as "3000" or "3k", got a list'),
    ],
)
def test_refusals_say_exactly_what_was_wrong(raw: object, message: str) -> None:
    with pytest.raises(QuantityError) as info:
        parse_whole(raw)
    assert str(info.value) == message


def test_has_binary_suffix_reads_text_up_to_the_length_bound() -> None:
    assert has_binary_suffix("0" * (MAX_TEXT - 2) + "Gi")  # 64 characters
    assert not has_binary_suffix("0" * (MAX_TEXT - 1) + "Gi")  # 65
    assert not has_binary_suffix("3G") and not has_binary_suffix(3) and not has_binary_suffix("x")


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("3Gi", 3072),
        ("1Mi", 1),
        ("0" * (MAX_TEXT - 3) + "1Mi", 1),  # 64 characters: read
        ("0" * (MAX_TEXT - 2) + "1Mi", None),  # 65: past the bound
        ("1Ki", None),  # a fraction of a MiB
        ("0Mi", None),  # no memory at all
        ("3k", None),  # no binary suffix
        ("3", None),
        ("garbage", None),
    ],
)
def test_the_mib_a_binary_quantity_meant(text: str, mib: int | None) -> None:
    assert mib_from_binary(text) == mib
