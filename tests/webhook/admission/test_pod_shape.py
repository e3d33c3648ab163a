"""The pure parts of hostile-input handling: nesting measured without recursion, and the pod shape check."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.config import Config
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.pod_shape import (
    _POD_ACCEPTS,
    _POD_CHECK,
    POD,
    ListOf,
    MapOf,
    Obj,
    Shape,
    is_namespace_name,
    is_unicode_text,
    pod_problem,
)
from kube_vgpu.webhook.admission.review import MalformedReview, nesting_depth, parse_review
from tests.support.admission_view import StaticView
from tests.support.webhook import container, pod, review

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


def _schema_paths(shape: Shape, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place the shape describes (list items as index 0, map values under the key "k")."""
    paths = [path] if path else []
    if isinstance(shape, Obj):
        for key, field_shape in shape.fields.items():
            paths += _schema_paths(field_shape, (*path, key))
    elif isinstance(shape, ListOf):
        paths += _schema_paths(shape.item, (*path, 0))
    elif isinstance(shape, MapOf):
        paths += _schema_paths(shape.value, (*path, "volcano.sh/vgpu-memory"))
    return paths


PATHS = _schema_paths(POD)
WRONG: list[object] = [None, 0, 2**62, -1.5, True, "", "x" * 70, "\ud800", [], [None], {}, {"a": []}]


def _put(obj: Any, path: tuple[str | int, ...], value: Any) -> None:
    for step in path[:-1]:
        if isinstance(step, int):
            if not isinstance(obj, list) or not obj:
                return
            obj = obj[0]
        else:
            if not isinstance(obj, dict):
                return
            obj = obj.setdefault(step, [{}] if step in _LISTS else {})
    if isinstance(path[-1], int):
        if isinstance(obj, list):
            obj[:1] = [value]
    elif isinstance(obj, dict):
        obj[path[-1]] = value


_LISTS = {"containers", "initContainers", "volumes", "env", "volumeMounts", "nodeSelectorTerms"}
_LISTS |= {"matchExpressions", "matchFields", "values"}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PATHS), st.sampled_from(WRONG), st.booleans())
def test_a_wrong_value_anywhere_the_rules_read_is_a_verdict_never_an_exception(
    path: tuple[str | int, ...], value: Any, vgpu: bool
) -> None:
    doc = review(pod(container(memory=1000) if vgpu else container(), annotations={"a": "b"}))
    _put(doc["request"]["object"], path, value)
    body = json.dumps(doc, ensure_ascii=True).encode()
    try:
        request = parse_review(body)
    except MalformedReview:
        return  # the envelope carries the pod's namespace; a bad one is a 400
    verdict = ADMISSION.review(request)  # must not raise
    assert verdict.allowed or verdict.message


ADMISSION = Admission(Config(), StaticView())


class _Str(str):
    pass


class _Dict(dict[str, Any]):
    pass


# What the quick yes must not wave through unread: every wrong value, and right ones it leaves to the
# exact walk (non-ASCII text, subclasses), which must then find what it always found.
QUICK_PROBES = [*WRONG, "é", "a\ud800b", _Str("x"), _Dict(), ["é"], {"é": "x"}, {"a": "é"}, 65 * "9"]


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(PATHS), st.sampled_from(QUICK_PROBES), st.booleans())
def test_the_quick_yes_passes_only_pods_the_exact_check_finds_nothing_in(
    path: tuple[str | int, ...], value: Any, vgpu: bool
) -> None:
    obj = pod(container(memory=1000) if vgpu else container(), annotations={"a": "b"}, labels={"l": "v"})
    _put(obj, path, value)
    if _POD_ACCEPTS(obj):
        assert _POD_CHECK(obj) is None
    assert pod_problem(obj) == _exact_problem(obj)


def _exact_problem(obj: Any) -> str | None:
    problem = _POD_CHECK(obj)
    return None if problem is None else "".join(reversed(problem[0])) + problem[1]


def test_the_quick_yes_passes_a_pod_as_the_api_server_sends_it() -> None:
    obj = pod(container(memory=1000), annotations={"a": "b"}, labels={"l": "v"})
    obj["spec"]["initContainers"] = [container(memory=1000)]
    obj["spec"]["volumes"] = [{"name": "v", "hostPath": {"path": "/data"}}]
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["a"]}]}]
            }
        }
    }
    assert _POD_ACCEPTS(obj)
    assert _POD_ACCEPTS({"metadata": {"namespace": "team-a"}, "spec": {"nodeName": None}})
    # Left to the exact walk, which passes them: non-ASCII text, and what only a Python caller sends.
    assert (
        not _POD_ACCEPTS({"metadata": {"labels": {"a": "ünï"}}})
        and pod_problem({"metadata": {"labels": {"a": "ünï"}}}) is None
    )
    assert not _POD_ACCEPTS(_Dict()) and pod_problem(_Dict()) is None
