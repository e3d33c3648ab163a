"""A List page's items read out of its raw JSON, decoding only the items a byte-level prefilter keeps.

Decoding is most of what a list costs (a page of 500 realistic pods is 3 MB of JSON), and the webhook
keeps one pod in ten. The API server writes a page as `{"kind":..,"apiVersion":..,"metadata":{..},
"items":[{"metadata":{..},..},..]}` (Go's field order: ListMeta before items, ObjectMeta first in each
object), and inside JSON strings every `"` is escaped, so the items are found by splitting on
`},{"metadata":{` without decoding them. The split is trusted only when its count is known to be
right (a full page holds exactly `limit` items; the last holds the previous page's
`remainingItemCount`) and every kept item decodes as one object; anything else, or an unknown count,
decodes the whole page, so a page that is not in this shape costs time, never correctness.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

_ITEMS = b'"items":['
_FIRST = b'{"metadata":{'
_SEPARATOR = b'},{"metadata":{'

Prefilter = Callable[[bytes], bool]


@dataclass(frozen=True)
class Page:
    """One decoded page: its List metadata, the items kept, and how many items it held."""

    metadata: dict[str, Any]
    items: list[dict[str, Any]]
    count: int
    split: bool  # whether the items were split out raw (False: the page was decoded whole)


def _common_prefix(values: tuple[bytes, ...]) -> bytes:
    if not values:
        return b""
    shortest, longest = min(values), max(values)  # the common prefix of all is theirs
    size = 0
    while size < len(shortest) and shortest[size] == longest[size]:
        size += 1
    return shortest[:size]


def contains_any(needles: tuple[str, ...]) -> Prefilter:
    """A prefilter keeping objects whose JSON holds one of these strings (as JSON encodes them)."""
    encoded = tuple(orjson.dumps(n)[1:-1] for n in needles)
    # Most objects hold none of them: one scan for what they all start with rules those out.
    common = _common_prefix(encoded)

    def test(raw: bytes) -> bool:
        if common and common not in raw:
            return False
        return any(n in raw for n in encoded)

    return test


def _decode_whole(raw: bytes) -> Page:
    page = orjson.loads(raw)
    if not isinstance(page, dict):
        raise ValueError(f"a List page is a JSON object, got {type(page).__name__}")
    items = page.get("items") or []
    metadata = page.get("metadata")
    return Page(metadata if isinstance(metadata, dict) else {}, list(items), len(items), False)


def _chunks(body: bytes) -> list[bytes] | None:
    """The items of an `items` array's inside, each as its own JSON text (None: not in the shape)."""
    if not body:
        return []
    if not body.startswith(_FIRST) or not body.endswith(b"}"):
        return None
    parts = body.split(_SEPARATOR)
    last = len(parts) - 1
    chunks = [parts[0] + b"}" if last else parts[0]]
    chunks += [_FIRST + part + (b"}" if k < last else b"") for k, part in enumerate(parts[1:], start=1)]
    return chunks


def read_page(raw: bytes, prefilter: Prefilter, expected: Callable[[dict[str, Any]], int | None]) -> Page:
    """The page's metadata and the items `prefilter` keeps, decoded; `expected(metadata)` says how
    many items the page must hold for a split to be trusted (None: unknown, decode it whole)."""
    start = raw.find(_ITEMS)
    if start < 0 or not raw.endswith(b"]}"):
        return _decode_whole(raw)
    try:
        head = orjson.loads(raw[:start] + b'"items":[]}')
    except orjson.JSONDecodeError:
        return _decode_whole(raw)
    metadata = head.get("metadata") if isinstance(head, dict) else None
    if not isinstance(metadata, dict):
        return _decode_whole(raw)
    chunks = _chunks(raw[start + len(_ITEMS) : -2])
    if chunks is None or expected(metadata) != len(chunks):
        return _decode_whole(raw)
    items: list[dict[str, Any]] = []
    for chunk in chunks:
        if not prefilter(chunk):
            continue
        try:
            item = orjson.loads(chunk)
        except orjson.JSONDecodeError:
            return _decode_whole(raw)
        if not isinstance(item, dict):
            return _decode_whole(raw)
        items.append(item)
    return Page(metadata, items, len(chunks), True)
