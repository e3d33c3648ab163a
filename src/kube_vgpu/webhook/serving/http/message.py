"""What a handler sees of one HTTP request, and what it answers: plain data, one encoder for the answer."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

import orjson

JSON = "application/json"
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


@dataclass(slots=True)
class Request:
    """One request whose body has arrived whole (decoded when it was compressed)."""

    method: str
    path: str
    # Header names in lower case; a repeated header keeps its last value.
    headers: Mapping[str, str]
    body: bytes
    # The peer's address, for log lines.
    remote: str
    # `time.perf_counter()` when the headers arrived: latency includes reading the body.
    received_at: float


@dataclass(slots=True)
class Response:
    """An answer; `close` ends the connection once it is sent."""

    status: int
    body: bytes
    content_type: str = JSON
    close: bool = False


def json_response(document: object, status: int = 200) -> Response:
    """A JSON answer (`document` holds only what orjson encodes: the caller's text is checked first)."""
    return Response(status, orjson.dumps(document))


def error_response(status: int, reason: str) -> Response:
    """A 4xx/5xx answer whose JSON body names what was wrong: `{"error": reason}`."""
    # The reason may quote a caller's text; escaped lone surrogates keep it encodable.
    safe = reason.encode("utf-8", "backslashreplace").decode("utf-8")
    return Response(status, orjson.dumps({"error": safe}))


# The answer to a request, or a coroutine that will produce it.
Handler = Callable[[Request], "Response | Awaitable[Response]"]


class HttpApp(Protocol):
    """What the connection asks of the application: the handler for a method and path."""

    def route(self, method: str, path: str) -> Handler | Response:
        """The handler that gets the request once its body arrived, or an answer to send at once
        without reading the body (unknown path, wrong method)."""
        ...


class _Clock:
    """The `Date` header, formatted once per second rather than once per answer."""

    def __init__(self) -> None:
        self._second = -1
        self._header = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._header = b"Date: " + email.utils.formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._header


_clock = _Clock()


def encode_response(response: Response, *, close: bool) -> bytes:
    """The bytes of an HTTP/1.1 answer: status line, headers, body."""
    reason = _REASONS.get(response.status, b"Unknown")
    return b"".join(
        (
            b"HTTP/1.1 %d %s\r\n" % (response.status, reason),
            _clock.header(),
            b"Content-Type: %s\r\nContent-Length: %d\r\n"
            % (response.content_type.encode(), len(response.body)),
            b"Connection: close\r\n\r\n" if close else b"\r\n",
            response.body,
        )
    )
