"""aiohttp's low-level HTTP/1.1 server, configured for admission reviews.

aiohttp frames requests, bounds a head's line, fields and count, queues at most 32 pipelined
requests per connection (reading pauses past that), inflates gzip/deflate bodies in bounded pieces,
and closes idle keep-alive connections. Its handler class is extended through its public methods
only: framing errors are answered with JSON and logged at INFO without a traceback, and each
connection tells its `listener.Slot` when it opens, when bytes arrive and when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

if TYPE_CHECKING:
    from kube_vgpu.httpedge.listener import Slot

log = logging.getLogger(__name__)

JSON = "application/json"
# A request line, one header's name or value, and the header count. The API server's heads are a few
# hundred bytes in under ten headers (a bearer token, where its kubeconfig sends one, 1-2 kB).
# aiohttp holds an unfinished head until the request deadline, and the connection's TLS buffers grow
# to its reads: at aiohttp's defaults (8,190 bytes, 100 headers) a flood of connections each holding
# one takes the webhook past the chart's memory limit (`bench/hostile.py --held-heads`).
MAX_LINE_BYTES = 4096
MAX_FIELD_BYTES = 4096
MAX_HEADERS = 16
# A connection that received more than this since its last answer is closed after its next answer:
# its TLS layer keeps buffers as large as its largest read for as long as it is open (uvloop's
# 256 KiB read buffer and OpenSSL's incoming buffer), and the API server's reviews of ordinary
# pods are a few kB, so only a large review costs its caller a new handshake.
MAX_KEEP_ALIVE_READ_BYTES = 32 * 1024
# An answer given before the body was read: aiohttp reads and drops the rest for up to this long, so a
# client still sending reads the answer rather than a reset (Go's server: 500 ms).
LINGER_SECONDS = 0.5


def error_body(reason: str) -> bytes:
    """The JSON of a 4xx/5xx answer: `{"error": reason}` (lone surrogates escaped, so it always encodes)."""
    return orjson.dumps({"error": reason.encode("utf-8", "backslashreplace").decode("utf-8")})


def error_response(status: int, reason: str, *, close: bool = False) -> web.Response:
    """A JSON error answer; `close` ends the connection after it (its body may not have been read)."""
    response = web.Response(status=status, body=error_body(reason), content_type=JSON)
    if close:
        response.force_close()
    return response


class EdgeProtocol(web.RequestHandler):
    """aiohttp's handler of one connection, reporting to its slot and answering framing errors with JSON."""

    __slots__ = ("edge", "received_bytes", "slot")

    def __init__(self, manager: EdgeServer, slot: Slot | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.edge = manager
        self.slot = slot
        self.received_bytes = 0  # HTTP bytes since the last answer (see `answer_closes`)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.slot is not None:
            self.slot.opened(self, transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        if self.slot is not None:
            self.slot.lost()
            self.slot = None

    def data_received(self, data: bytes) -> None:
        self.received_bytes += len(data)
        if data and self.slot is not None:
            self.slot.received()
        super().data_received(data)

    def answer_closes(self) -> bool:
        """Whether the answer about to be sent must close the connection: more than
        MAX_KEEP_ALIVE_READ_BYTES arrived since the last answer. The count starts again."""
        received, self.received_bytes = self.received_bytes, 0
        return received > MAX_KEEP_ALIVE_READ_BYTES

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR line with a traceback, kept for bugs; a body the caller broke is INFO (after
        an answer given without reading the whole body, aiohttp reads and drops the rest, and damage
        there raises again: the caller's mistake, already answered)."""
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError | ConnectionError):
            log.info("event=http_body_dropped error=%r", " ".join(str(exc).split())[:300])
            return
        super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not frame (or a handler that raised): JSON, and a log
        line without a traceback for the caller's mistake."""
        if request.writer.output_size > 0:  # an answer is half sent: only closing is left
            raise ConnectionError("the answer was already being sent")
        if status >= 500:
            log.error("event=http_handler_failed error=%r", f"{type(exc).__name__}: {exc}")
            reason = f"kube-vgpu webhook internal error: {type(exc).__name__}"
        else:
            reason = f"request cannot be read: {message or exc or 'bad request'}"
            log.info("event=http_bad_request remote=%s reason=%r", request.remote, reason[:300])
        self.edge.refused("malformed" if status < 500 else "error")
        return error_response(status, reason, close=True)


class EdgeServer(web.Server):
    """aiohttp's low-level server whose connections are `EdgeProtocol`s."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        idle_timeout_seconds: float,
        refused: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.options: dict[str, Any] = {
            "keepalive_timeout": idle_timeout_seconds,
            "max_line_size": MAX_LINE_BYTES,
            "max_field_size": MAX_FIELD_BYTES,
            "max_headers": MAX_HEADERS,
            "lingering_time": LINGER_SECONDS,
            "access_log": None,
        }
        # The handler runs to its answer even when the caller goes: a validating review may be
        # recording a quota reservation through the API, which must not stop half-way.
        super().__init__(handler, handler_cancellation=False, loop=self.loop, **self.options)
        self.refused = refused

    def protocol(self, slot: Slot | None) -> EdgeProtocol:
        """The handler of one accepted connection, reporting to `slot`."""
        return EdgeProtocol(self, slot, loop=self.loop, **self.options)

    def __call__(self) -> EdgeProtocol:
        return self.protocol(None)
