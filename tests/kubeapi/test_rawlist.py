"""Reading a List page's items out of its raw JSON: the items a prefilter keeps are exactly those a
whole decode gives, whatever the strings inside them hold; any page the split cannot trust (a count
that does not match, items in another key order, a broken item) is decoded whole.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kube_vgpu.kubeapi.rawlist import contains_any, read_page

NEEDLE = "volcano.sh/vgpu-number"
keep = contains_any((NEEDLE, "volcano.sh/vgpu-memory"))

# Strings that look like the structure the split relies on, and a needle inside a string value.
tricky = st.sampled_from(
    ['},{"metadata":{', '"items":[', "]}", '\\"', "\u2028", "é", NEEDLE, "{", "}", ""]
) | st.text(max_size=12)


@st.composite
def items(draw: st.DrawFn) -> dict[str, Any]:
    item: dict[str, Any] = {"metadata": {"name": draw(tricky), "annotations": {draw(tricky): draw(tricky)}}}
    if draw(st.booleans()):
        item["spec"] = {"containers": [{"resources": {"limits": {NEEDLE: "1"}}}]}
    if draw(st.booleans()):
        item["status"] = {"message": draw(tricky), "list": [{"metadata": {"x": draw(tricky)}}]}
    return item


def page(objects: list[dict[str, Any]], **metadata: Any) -> bytes:
    """A page as kube-apiserver writes it: compact JSON, ListMeta before items."""
    return orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": objects})


def wanted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if keep(orjson.dumps(o))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(items(), max_size=8))
def test_split_items_are_exactly_the_kept_items_of_a_whole_decode(objects: list[dict[str, Any]]) -> None:
    raw = page(objects, resourceVersion="9", remainingItemCount=3)
    result = read_page(raw, keep, lambda metadata: len(objects))
    assert result.split and result.count == len(objects)
    assert result.items == wanted(objects)
    assert result.metadata == {"resourceVersion": "9", "remainingItemCount": 3}


@given(st.lists(items(), min_size=1, max_size=5))
def test_a_count_that_does_not_match_decodes_the_whole_page(objects: list[dict[str, Any]]) -> None:
    counts: list[int | None] = [len(objects) - 1, len(objects) + 1, None]
    for expected in counts:

        def count(metadata: dict[str, Any], n: int | None = expected) -> int | None:
            return n

        result = read_page(page(objects), keep, count)
        assert not result.split and result.items == objects and result.count == len(objects)


def test_items_in_another_key_order_are_decoded_whole() -> None:
    objects: list[dict[str, Any]] = [
        {"spec": {NEEDLE: 1}, "metadata": {"name": "a"}},
        {"metadata": {"name": "b"}},
    ]
    result = read_page(page(objects), keep, lambda metadata: 2)
    assert not result.split and result.items == objects


def test_a_kept_item_that_is_not_one_object_decodes_the_whole_page() -> None:
    # An inner array element that starts with "metadata" splits an item in two: the count is then one
    # too many, and were it not, the broken halves would not decode.
    objects = [{"metadata": {"name": "a"}, "x": [{"y": 1}, {"metadata": {NEEDLE: 1}}]}]
    assert read_page(page(objects), keep, lambda metadata: 1).items == objects
    result = read_page(page(objects), keep, lambda metadata: 2)
    assert not result.split and result.items == objects


def test_an_empty_page_and_a_page_with_no_items_key() -> None:
    empty = read_page(page([], resourceVersion="4"), keep, lambda metadata: 0)
    assert empty.split and empty.items == [] and empty.metadata == {"resourceVersion": "4"}
    bare = read_page(b'{"kind":"PodList","metadata":{"resourceVersion":"5"}}', keep, lambda m: 0)
    assert not bare.split and bare.items == [] and bare.metadata == {"resourceVersion": "5"}


def test_a_page_that_is_not_json_raises() -> None:
    with pytest.raises(orjson.JSONDecodeError):
        read_page(b'{"items":[{"metadata":{', keep, lambda metadata: 1)


def test_contains_any_matches_each_needle_as_json_writes_it() -> None:
    test = contains_any(("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", 'odd"name'))
    assert test(b'{"volcano.sh/vgpu-memory":"1"}') and test(b'{"odd\\"name":1}')
    assert not test(b'{"volcano.sh/vgpu-cores":"1"}')  # the common prefix alone is not enough
    assert not test(b'{"volcano.sh/vgpu-numbe":"1"}') and not test(b"{}")
    assert not contains_any(())(b'{"anything":1}')
