"""aiohttp's low-level HTTP/1.1 server behind a capped accept loop, on public API only.

aiohttp frames requests, queues at most 32 pipelined ones per connection, inflates bodies in bounded
pieces and closes idle keep-alive connections. The accept loop is ours (`connect_accepted_socket`)
so that a connection counts from its accept, before any TLS work: at most `max_connections` are
open, and at the cap the one longest without progress is closed, never the newcomer, so a flood of
idle, slow or never-handshaking callers cannot lock the API server out. A request must arrive whole
within the request deadline, counted from the accept or from its first bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

JSON = "application/json"
# A request line, one header's name or value, and the header count. The API server's heads are a few
# hundred bytes in under ten headers; at aiohttp's defaults (8,190 bytes, 100 headers) connections
# each holding an unfinished head take the webhook past the chart's memory limit.
MAX_LINE_BYTES = MAX_FIELD_BYTES = 4096
MAX_HEADERS = 16
# A connection that received more than this since its last answer is closed after its next answer:
# its TLS layer keeps buffers as large as its largest read while it is open.
MAX_KEEP_ALIVE_READ_BYTES = 32 * 1024
_BACKLOG = 512


def error_response(status: int, reason: str, *, close: bool = False) -> web.Response:
    """`{"error": reason}` (lone surrogates escaped); `close` ends the connection after it."""
    body = orjson.dumps({"error": reason.encode("utf-8", "backslashreplace").decode("utf-8")})
    response = web.Response(status=status, body=body, content_type=JSON)
    if close:
        response.force_close()
    return response


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on connections (`kube-vgpu webhook --help` names the flags)."""

    # Open connections, TLS handshakes included; the API server keeps a few dozen at most. 500 keeps a
    # flood within the chart's 512 Mi beside a large cluster's cache (docs/benchmarks.md).
    max_connections: int = 500
    # From a connection's accept (TLS handshake included), or a request's first bytes, until the
    # request has arrived whole.
    request_timeout_seconds: float = 10.0
    # How long a closing TLS connection waits for the peer's close_notify (Go's server: not at all).
    tls_close_timeout_seconds: float = 1.0
    # Above the API server's 90 s, so the client ends idle connections, never sending on a closing one.
    idle_timeout_seconds: float = 100.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections must be at least 1, got {self.max_connections}")
        if min(self.request_timeout_seconds, self.idle_timeout_seconds, self.tls_close_timeout_seconds) <= 0:
            raise ValueError("request, idle and TLS close timeouts must be positive seconds")


class Connection(web.RequestHandler):
    """aiohttp's handler of one connection, made at its accept: answers framing errors with JSON and
    keeps the request deadline and the progress the listener orders connections by."""

    def __init__(self, listener: Listener, sock: socket.socket) -> None:
        super().__init__(listener.server, loop=listener.loop, **listener.options)
        self.listener, self.sock = listener, sock
        self.busy = False  # a request arrived whole and is being answered: never closed to make room
        self.handling = False  # a request's head arrived and it has no answer yet
        self.received_bytes = 0  # since the last answer
        # Kept apart from aiohttp's `transport`, which it clears when it starts closing (a TLS close
        # exchange can still be running): a closing connection is aborted, never its socket closed.
        self.opened: asyncio.BaseTransport | None = None  # once the TLS handshake is done
        self.opening: asyncio.Future[Any] | None = None  # the TLS handshake, until it ends
        # When the request arriving now must have arrived whole (loop clock); None when none is. A
        # request pipelined behind one being answered gets its deadline at its first bytes after that
        # answer, or when its handler starts.
        self.deadline: float | None = listener.loop.time() + listener.limits.request_timeout_seconds

    def opening_done(self, opening: asyncio.Future[Any]) -> None:
        """The handshake ended (even cancelled before it began): close a connection that never opened."""
        self.opening = None
        if not opening.cancelled() and opening.exception() is not None:
            log.debug("event=handshake_failed error=%r", str(opening.exception()))
        if self.opened is None:
            self.close_now()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.opened = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self.listener.forget(self)

    def data_received(self, data: bytes) -> None:
        self.received_bytes += len(data)
        if data and self.deadline is None and not self.busy:
            self.began_request()
        super().data_received(data)

    def began_request(self) -> None:
        """A request began: its deadline runs, and the cap counts its progress from now."""
        self.listener.progressed(self)
        self.deadline = self.listener.loop.time() + self.listener.limits.request_timeout_seconds

    def answered(self) -> bool:
        """The answer is about to be sent; True when it must close the connection (a large read)."""
        self.busy = self.handling = False
        self.deadline = None
        self.listener.progressed(self)
        received, self.received_bytes = self.received_bytes, 0
        return received > MAX_KEEP_ALIVE_READ_BYTES

    def close_now(self) -> None:
        """Close at once, without waiting for the peer (handshake or not)."""
        self.listener.forget(self)  # now, so the count never passes the cap
        if self.opened is not None:
            cast(asyncio.Transport, self.opened).abort()
        elif self.opening is not None:
            # Cancelling the handshake closes its transport, which owns the socket; closing the socket
            # first left the transport's queued read on a closed descriptor (logged as an error).
            self.opening.cancel()
        else:
            with contextlib.suppress(OSError):
                self.sock.close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR with a traceback, kept for bugs; damage in a body dropped after an early
        answer is the caller's mistake, already answered: INFO."""
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError | ConnectionError):
            log.info("event=http_body_dropped error=%r", " ".join(str(exc).split())[:300])
        else:
            super().log_exception(*args, **kw)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not frame (or a handler that raised): JSON, logged
        without a traceback."""
        if request.writer.output_size > 0:  # an answer is half sent: only closing is left
            raise ConnectionError("the answer was already being sent")
        if status >= 500:
            log.error("event=http_handler_failed error=%r", f"{type(exc).__name__}: {exc}")
            reason = f"kube-vgpu webhook internal error: {type(exc).__name__}"
        else:
            reason = f"request cannot be read: {message or exc or 'bad request'}"
            log.info("event=http_bad_request remote=%s reason=%r", request.remote, reason[:300])
        self.listener.refused("malformed" if status < 500 else "error")
        return error_response(status, reason, close=True)


def arrived(request: web.BaseRequest) -> None:
    """Tell the listener that `request` arrived whole (its body read, or never to be): its deadline
    stops, and the cap will not close it while it is answered."""
    if isinstance(conn := request.protocol, Connection):  # a server of our own listener
        conn.busy, conn.deadline = True, None


class Listener:
    """Accepts connections (TLS when given a context), keeps at most `max_connections` open, and
    serves `handler` on each with aiohttp."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        *,
        host: str,
        port: int,
        refused: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        self.handler, self.limits, self.refused = handler, limits, refused
        self.host, self.port, self.loop = host, port, asyncio.get_running_loop()
        self.tls: dict[str, Any] = {}
        if ssl_context is not None:
            self.tls = {
                "ssl": ssl_context,
                "ssl_handshake_timeout": limits.request_timeout_seconds,
                "ssl_shutdown_timeout": limits.tls_close_timeout_seconds,
            }
        # After an answer given before the body was read, aiohttp drops the rest for up to 0.5 s, so a
        # client still sending reads the answer rather than a reset (as Go's server does).
        self.options: dict[str, Any] = {
            "keepalive_timeout": limits.idle_timeout_seconds,
            "max_line_size": MAX_LINE_BYTES,
            "max_field_size": MAX_FIELD_BYTES,
            "max_headers": MAX_HEADERS,
            "lingering_time": 0.5,
            "access_log": None,
        }
        # The handler runs to its answer even when the caller goes: a validating review may be
        # recording a quota reservation through the API, which must not stop half-way.
        self.server = web.Server(self.handle, handler_cancellation=False, loop=self.loop, **self.options)
        # Open connections, longest without progress first (progress re-inserts at the end).
        self.connections: dict[Connection, None] = {}
        self.evicted = self.expired = 0  # closed to make room at the cap; by the request deadline
        self.in_flight = 0  # requests whose handler runs
        self.draining = False  # every answer closes its connection
        self.all_closed, self.at_cap_logged = asyncio.Event(), False
        self.sock: socket.socket | None = None
        self.sweeper: asyncio.TimerHandle | None = None

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        conn = cast(Connection, request.protocol)
        self.in_flight += 1
        conn.handling = True
        if conn.deadline is None:  # it arrived while the one before was answered
            conn.began_request()
        try:
            response = await self.handler(request)
        finally:
            self.in_flight -= 1
            closes = conn.answered()
        if closes or self.draining:
            response.force_close()
        return response

    async def start(self) -> None:
        """Bind and listen (port 0 picks a free one, see `port`), then accept in the background."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=_BACKLOG)
        sock.setblocking(False)
        self.sock, self.port = sock, int(sock.getsockname()[1])
        # A reader callback, not `loop.sock_accept`: no accepted socket is lost to a cancellation.
        self.loop.add_reader(sock.fileno(), self.accept_ready, sock)
        self.sweep()

    def sweep(self) -> None:
        """Close the connections whose request deadline has passed; look again within a second (or a
        tenth of the deadline): the most a deadline is overrun by."""
        now, timeout = self.loop.time(), self.limits.request_timeout_seconds
        for conn in [c for c in self.connections if c.deadline is not None and c.deadline <= now]:
            self.expired += 1
            log.info("event=request_deadline handshaken=%s timeout_s=%.1f", conn.opened is not None, timeout)
            conn.close_now()
        self.sweeper = self.loop.call_later(min(1.0, timeout / 10), self.sweep)

    def accept_ready(self, sock: socket.socket) -> None:
        for _ in range(_BACKLOG):  # what is queued now, but never the loop's whole turn
            try:
                accepted, _ = sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: let some connections end first
                log.warning("event=accept_failed error=%r", str(exc))
                self.loop.remove_reader(sock.fileno())
                self.loop.call_later(0.1, self.resume_accepting, sock)
                return
            if len(self.connections) >= self.limits.max_connections and not self.make_room():
                accepted.close()  # every connection is computing an answer
                continue
            self.open(accepted)

    def open(self, accepted: socket.socket) -> None:
        accepted.setblocking(False)
        conn = Connection(self, accepted)
        self.connections[conn] = None
        self.all_closed.clear()
        conn.opening = asyncio.ensure_future(
            self.loop.connect_accepted_socket(lambda: conn, accepted, **self.tls)
        )
        conn.opening.add_done_callback(conn.opening_done)

    def resume_accepting(self, sock: socket.socket) -> None:
        if self.sock is sock:
            self.loop.add_reader(sock.fileno(), self.accept_ready, sock)

    def make_room(self) -> bool:
        """Close the connection longest without progress that is not computing an answer."""
        victim = next((conn for conn in self.connections if not conn.busy), None)
        if victim is None:
            return False
        self.evicted += 1
        if not self.at_cap_logged:  # one line per episode
            log.warning(
                "event=connection_cap_reached max_connections=%d action=close_longest_without_progress",
                self.limits.max_connections,
            )
            self.at_cap_logged = True
        victim.close_now()
        return True

    def progressed(self, conn: Connection) -> None:
        """`conn` made progress: it moves to the back of the order the cap closes in."""
        if self.connections.pop(conn, 0) is None:
            self.connections[conn] = None

    def forget(self, conn: Connection) -> None:
        conn.deadline = None
        self.connections.pop(conn, None)
        self.at_cap_logged &= len(self.connections) >= self.limits.max_connections
        if not self.connections:
            self.all_closed.set()

    async def close(self, deadline: float) -> None:
        """Stop accepting and close every connection by `deadline` (the loop's clock): one whose
        request head has arrived gets its answer first (with `Connection: close`), every other is
        closed now, and what is left at the deadline is aborted."""
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        self.draining = True
        for conn in list(self.connections):
            if conn.opened is None:
                conn.close_now()  # a handshake in progress
            elif not conn.handling:
                conn.force_close()  # a TLS close exchange, bounded by ssl_shutdown_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while self.connections:
                    await self.all_closed.wait()
        if self.connections:
            log.warning("event=webhook_connections_aborted count=%d", len(self.connections))
            for conn in list(self.connections):
                conn.close_now()
        if self.sweeper is not None:
            self.sweeper.cancel()
