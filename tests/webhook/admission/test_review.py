"""The review codec's two readers agree: orjson for ordinary bodies, the standard library (with every
bound named) for the rest; and an answer quoting a lone surrogate is still encoded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.webhook.admission.review import (
    MAX_NESTING,
    MalformedReview,
    _decode_exactly,
    _depth_of,
    decode_json,
    encode_json,
    nesting_depth,
)

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=12,
)


def _outcome(read: Any, body: bytes) -> tuple[str, Any]:
    try:
        return "ok", read(body)
    except MalformedReview:
        return "refused", None


@settings(max_examples=400, deadline=None)
@given(doc=_json)
def test_the_fast_reader_reads_what_the_exact_reader_reads(doc: Any) -> None:
    body = json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert _outcome(decode_json, body) == _outcome(_decode_exactly, body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"n": 18446744073709551616}',  # past 64 bits: orjson would make it a float
        b'{"n": ' + b"9" * 30 + b"}",
        b'{"n": 1e400}',
        b'{"n": NaN}',
        b'{"s": "\\ud800"}',  # a lone surrogate escape: read, for the pod shape check to deny
        b'{"s": "\xed\xa0\x80"}',
        b'{"s": "\xff"}',
        b"\xef\xbb\xbf{}",
        b"[" * 101 + b"]" * 101,
        b'{"a": [1,]}',
    ],
)
def test_bodies_orjson_refuses_or_might_misread_get_the_exact_answer(body: bytes) -> None:
    assert _outcome(decode_json, body) == _outcome(_decode_exactly, body)


def test_an_answer_quoting_a_lone_surrogate_is_encoded_as_an_escape() -> None:
    assert json.loads(encode_json({"message": "bad \ud800 value"})) == {"message": "bad \ud800 value"}


_tricky_text = st.text(alphabet='[]{}"\\\\ab\n\u00e9', max_size=10)
_nested = st.recursive(
    st.none() | st.integers(-5, 5) | _tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_tricky_text, inner, max_size=3),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(doc=_nested, depth=st.integers(0, 120))
def test_the_byte_depth_of_a_body_is_its_nesting_depth(doc: Any, depth: int) -> None:
    # Strings full of brackets, quotes and backslashes, nested up to past the limit.
    text = "[" * depth + json.dumps(doc, ensure_ascii=False) + "]" * depth
    assert _depth_of(text.encode()) == nesting_depth(text)


@settings(max_examples=200, deadline=None)
@given(doc=_nested, depth=st.integers(90, 110))
def test_a_body_of_many_brackets_is_read_as_the_exact_reader_reads_it(doc: Any, depth: int) -> None:
    # Over MAX_NESTING brackets: the depth is measured in bytes before orjson may read it.
    padding = ", ".join(["[]"] * 20)  # so even a scalar doc makes more than MAX_NESTING brackets
    body = (
        "[" * depth + json.dumps([doc] * 30, ensure_ascii=False)[:-1] + f", {padding}]" + "]" * depth
    ).encode()
    assert body.count(b"[") + body.count(b"{") > MAX_NESTING
    assert _outcome(decode_json, body) == _outcome(_decode_exactly, body)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200 + b'"',  # a string opened after the brackets and never closed
        b'{"a":"' + b"[" * 200,  # brackets inside a string that is never closed
        b'"' + b"[" * 200,
        b"[" * 200 + b'"\\\\',  # an escaped backslash, then the end of the body
    ],
)
def test_a_body_with_an_unclosed_string_among_many_brackets_is_refused_not_a_crash(body: bytes) -> None:
    # Attack: a lone quote in a body of more than MAX_NESTING brackets reached the byte-level depth
    # measure with a quote left over, which raised KeyError (a 500 with a traceback) instead of a 400.
    # An unclosed string's brackets count, as `nesting_depth` counts them: the body is refused.
    assert _depth_of(body) == nesting_depth(body.decode())
    with pytest.raises(MalformedReview, match="nests"):
        decode_json(body)
