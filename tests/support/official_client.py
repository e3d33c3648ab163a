"""Typed views of what the official `kubernetes` client hands the tests that drive the stand-in API
server through it, where its generated signatures name something else than what it sends or returns."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, cast

from kubernetes.client.exceptions import ApiException


def body(obj: Mapping[str, Any]) -> Any:
    """`obj` as a request body where the signature names a model class: the client sends a plain dict
    as it is (`ApiClient.sanitize_for_serialization`), and the tests write the wire form they mean."""
    return obj


class RawResponse(Protocol):
    """What a call made with `_preload_content=False` returns: urllib3's response, undecoded."""

    status: int
    data: bytes


def raw(response: object) -> RawResponse:
    """The undecoded answer of a call made with `_preload_content=False` (the generated signature
    still names the model it would have decoded)."""
    return cast(RawResponse, response)


def json_object(value: object) -> dict[str, Any]:
    """A `CustomObjectsApi` answer (typed `object`) as the JSON object it is."""
    assert isinstance(value, dict), value
    return value


def status_of(exc: ApiException) -> dict[str, Any]:
    """The `Status` object an API error carries."""
    decoded: dict[str, Any] = json.loads(exc.body or "{}")
    return decoded
