"""The pure parts of hostile-input handling: nesting measured without recursion, and the pod shape check."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from test_webhook_support import container, pod

from webhook.pod_shape import is_namespace_name, is_unicode_text, pod_problem
from webhook.review import nesting_depth

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab,:', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet='[]{}"\\a', max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(_json)
def test_nesting_depth_is_the_documents_depth_whatever_its_strings_hold(value: Any) -> None:
    assert nesting_depth(json.dumps(value)) == _depth(value)


def test_nesting_depth_of_very_deep_text_needs_no_recursion() -> None:
    assert nesting_depth("[" * 300_000 + "]" * 300_000) == 300_000
    assert nesting_depth('{"a": "' + "[" * 1000 + '"}') == 1


def test_a_pod_as_the_api_server_sends_it_has_no_problem() -> None:
    assert pod_problem(pod(container(memory=1000), annotations={"a": "b"}, labels={"l": "v"})) is None
    assert pod_problem({}) is None


def test_null_is_absent_for_text_but_not_for_objects_the_rules_write_into() -> None:
    assert pod_problem({"spec": {"nodeName": None, "schedulerName": None}}) is None
    assert pod_problem({"metadata": None}) == "metadata must be an object, got null"


def test_unicode_and_namespace_names() -> None:
    assert is_unicode_text("ünï ✓") and not is_unicode_text("a\ud800")
    assert is_namespace_name("team-a1") and is_namespace_name("a" * 63)
    for bad in ("", "Team", "a_b", "-a", "a-", "a" * 64, "a\n"):
        assert not is_namespace_name(bad), bad
