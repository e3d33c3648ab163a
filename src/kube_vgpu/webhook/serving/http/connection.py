"""One HTTP/1.1 connection: httptools (llhttp) frames requests; this class bounds and answers them.

Requests on a connection are answered one at a time, in order (pipelined ones wait their turn,
with reading paused meanwhile). Every bound of SPEC §2.3 that concerns one connection lives here:

- the request deadline: from a request's first byte (for a new connection, from its accept, TLS
  handshake included) to its answer; past it the connection is aborted;
- the idle timeout of a keep-alive connection between requests;
- the request head (request line and headers) and the body, decoded, each within a byte limit;
- the bytes a body may take are reserved in the process-wide `BodyBudget` before it is read.

A request the connection cannot read (bad framing, a head or body over its limit, an encoding it
does not know, a body that does not decode) gets a 4xx answer with a JSON reason, after the answers
owed to the requests before it, and the connection is closed: what follows cannot be framed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, cast

import httptools

from kube_vgpu.webhook.serving.body_budget import BodyBudget, body_reservation
from kube_vgpu.webhook.serving.http.decoding import ENCODINGS, BodyDecoder, BodyTooLarge, BodyUnreadable
from kube_vgpu.webhook.serving.http.drain import Drain
from kube_vgpu.webhook.serving.http.message import (
    Handler,
    HttpApp,
    Request,
    Response,
    encode_response,
    error_response,
)

log = logging.getLogger("kube_vgpu.webhook.http")

# The request line and headers of one request; more is answered 431. Go's and aiohttp's defaults
# are in this range; an AdmissionReview's head is a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
# Requests read ahead of their answers on one connection before reading pauses (pipelining).
MAX_PENDING = 32
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A request answered before its body was read (over the limit, busy, unknown path) has the rest of
# its body read and dropped, up to this much (within the request deadline), before the connection
# closes: a client still sending it then reads the answer instead of a reset.
DISCARD_BYTES = 4 * 1024 * 1024
# A request that cannot be framed (or whose head is over the limit) is answered and the connection
# then reads and drops what still comes for this long (or DISCARD_BYTES), so that a client in the
# middle of sending reads the answer rather than a reset ("lingering close").
LINGER_SECONDS = 0.5  # Go's net/http waits 500 ms the same way (rstAvoidanceDelay)
# The `refused` outcome of an answer given before the handler (404 and 405 are no review at all).
_OUTCOMES = {413: "too_large", 429: "busy"}


@dataclass
class HttpSettings:
    """What every connection of one server shares."""

    request_timeout_seconds: float
    idle_timeout_seconds: float
    max_body_bytes: int
    bodies: BodyBudget = field(default_factory=BodyBudget)
    drain: Drain = field(default_factory=Drain)
    # Told the outcome of every request refused before a handler saw it: "malformed" (framing,
    # head, encoding, a body that does not decode), "too_large" or "busy" (the body budget).
    refused: Callable[[str], None] = lambda outcome: None


class ConnectionOwner(Protocol):
    """The listener that accepted a connection: told when it ends and when its deadline passed."""

    def forget(self, connection: HttpConnection) -> None:
        """The connection ended (or never opened)."""
        ...

    def count_expired(self) -> None:
        """A connection was closed by its request deadline."""
        ...


class _Stop(Exception):
    """Raised in a parser callback: the request is answered without reading further."""


class _Exchange:
    """One request from its headers to its answer: holds its place in the drain and its body bytes."""

    __slots__ = ("open", "reserved", "settings")

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.reserved = 0
        self.open = True
        settings.drain.begin()

    def end(self) -> None:
        """Answered or abandoned: give back the body bytes and leave the drain (once)."""
        if self.open:
            self.open = False
            self.settings.bodies.release(self.reserved)
            self.settings.drain.end()


@dataclass(slots=True)
class _Pending:
    """A request whose answer is owed, in arrival order."""

    exchange: _Exchange | None
    answer: Handler | Response
    request: Request | None
    keep_alive: bool


class HttpConnection(asyncio.Protocol):
    """Serves HTTP/1.1 on one (TLS) connection for `app`."""

    def __init__(
        self, app: HttpApp, settings: HttpSettings, owner: ConnectionOwner, accepted_at: float
    ) -> None:
        self.app = app
        self.settings = settings
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.remote = "?"
        self._loop = asyncio.get_running_loop()
        self._parser = httptools.HttpRequestParser(self)
        # When the request in progress must have been answered, and when an idle connection is
        # closed; one alarm checks both, so a request arms no timer of its own.
        self._deadline: float | None = None
        self._idle_until: float | None = None
        self._alarm: asyncio.TimerHandle | None = None
        self._alarm_at = 0.0
        self._pending: deque[_Pending] = deque()
        self._busy = False  # a handler's coroutine is running for the oldest request
        self._stopped = False  # nothing more is read; the connection closes after what is owed
        self._paused = False  # reading paused by us
        self._serve_soon = False  # a _serve is scheduled for the loop's next turn
        self._write_paused = False  # the transport's write buffer is full: the client is not reading
        self._task: asyncio.Task[None] | None = None  # the handler coroutine of the oldest request
        # The body of the request being read is dropped (it was answered already).
        self._discarding = False
        self._discard_left = 0
        self._close_when_read = False  # its answer is sent; close once the body has passed
        self._linger_after = False  # the owed refusal ends the connection with a lingering close
        self._lingering = False
        # The message being read.
        self._reading = False
        self._head_done = False
        self._head_bytes = 0  # request line and headers the parser reported
        self._head_chunk_bytes = 0  # chunks received whole while the head was incomplete
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._header_count = 0
        self._ended_in_chunk = False  # a message ended in the chunk being parsed
        self._method = ""
        self._path = ""
        self._received_at = 0.0
        self._exchange: _Exchange | None = None
        self._target: Handler | Response | None = None
        self._decoder: BodyDecoder | None = None
        self._arm(accepted_at)

    # -- what the listener reads and calls ------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Open, with no request owed and no byte of a next one received."""
        return (
            self.transport is not None
            and not self._busy
            and not self._pending
            and not self._reading
            and self._deadline is None
        )

    def close(self) -> None:
        """Close once what was written is sent (TLS close exchange included)."""
        self._stopped = True
        self._lingering = False
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self._paused:
            # asyncio's TLS transport reads the peer's close_notify only while reading is on; the
            # request deadline (still armed) aborts a peer that never sends it.
            self._paused = False
            transport.resume_reading()
        transport.close()

    def abort(self) -> None:
        """Close now, without waiting for the peer."""
        self._disarm()
        self._stopped = True
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's implement asyncio.Transport's methods without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote = f"{peer[0]}:{peer[1]}"

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            self._discard_left -= len(data)
            if self._discard_left < 0:
                self.close()
            return
        if self._stopped:
            return
        if self._discarding:
            self._discard_left -= len(data)
            if self._discard_left < 0:
                self.close()
                return
        if self._deadline is None and not self._busy:
            self._arm(self._loop.time())  # a new request begins
        # The parser reports a header only once it is whole, so one endless header would never be
        # counted by the callbacks: chunks received while a head is incomplete are counted too,
        # all of the chunk unless a message ended in it (then the head's start in it is not).
        in_head = self._reading and not self._head_done
        self._ended_in_chunk = False
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Stop):
                self._bad_request(f"request cannot be read: {exc.__context__ or exc}")
        except httptools.HttpParserUpgrade:
            self._bad_request("protocol upgrades are not served")
        except httptools.HttpParserError as exc:
            self._bad_request(f"request is not HTTP/1.1: {exc}")
        if self._reading and not self._head_done and not self._stopped:
            if in_head or not self._ended_in_chunk:
                self._head_chunk_bytes += len(data)
            if self._head_chunk_bytes > MAX_HEAD_BYTES:
                self._bad_request(f"request head is over {MAX_HEAD_BYTES} bytes", status=431)
        if self._pending and not self._serve_soon:
            # Answered in the loop's next turn, after every connection with data ready has been read:
            # under load the reviews of one turn then run back to back, with the decision's code
            # and data still in the caches (bench/webhook.py: about 15 % less CPU per /mutate at 8
            # callers than answering inside each read).
            self._serve_soon = True
            self._loop.call_soon(self._serve_deferred)
        if len(self._pending) >= MAX_PENDING:
            # The event loop may read a connection many times in one turn; pipelined requests wait
            # in memory only up to this many (more arrive once these are answered).
            self._pause()
        elif not self._pending:
            self._resume()

    def _serve_deferred(self) -> None:
        self._serve_soon = False
        self._serve()

    def eof_received(self) -> bool | None:
        # The peer sends no more. Over plain TCP owed answers still go out before the close; TLS
        # has no half-close (asyncio closes the transport whatever this returns), so they are lost.
        self._stopped = True
        owed = self._busy or bool(self._pending)
        tls = self.transport is not None and self.transport.get_extra_info("sslcontext") is not None
        return True if owed and not tls else None

    def pause_writing(self) -> None:
        # No answer is written, and no request read, until the client reads what it was sent;
        # the request deadline ends a client that never does.
        self._write_paused = True
        self._pause()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._serve()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._stopped = True
        if self._alarm is not None:
            self._alarm.cancel()
            self._alarm = None
        if self._exchange is not None:
            self._exchange.end()
            self._exchange = None
        # The request whose coroutine is running ends when it does; the rest are dropped.
        running = self._pending.popleft() if self._busy and self._pending else None
        for pending in self._pending:
            if pending.exchange is not None:
                pending.exchange.end()
        self._pending.clear()
        if running is not None:
            self._pending.append(running)
        self.transport = None
        self.owner.forget(self)

    # -- httptools callbacks --------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._stopped:  # a request after one that ends the connection is not read
            raise _Stop
        self._reading = True
        self._head_done = False
        self._head_bytes = 0
        self._head_chunk_bytes = 0
        self._url = []
        self._headers = {}
        self._header_count = 0
        self._decoder = None

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._stop_with(error_response(431, f"request has more than {MAX_HEADERS} headers"))
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._stop_with(error_response(431, f"request head is over {MAX_HEAD_BYTES} bytes"))

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._exchange = _Exchange(self.settings)
        if self._parser.should_upgrade():
            self._stop_with(error_response(400, "protocol upgrades are not served"))
        path = b"".join(self._url).decode("latin-1").partition("?")[0]
        method = self._parser.get_method().decode("latin-1")
        self._method, self._path = method, path
        self._received_at = time.perf_counter()
        headers = self._headers
        has_body = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")
        target = self.app.route(method, path)
        if isinstance(target, Response):
            if has_body:  # a path that takes no body: answered now, the body dropped
                self._discard_with(target)
            else:
                self._target = target
            return
        limit = self.settings.max_body_bytes
        length = _content_length(headers.get("content-length"))
        if length is not None and length > limit:
            self._discard_with(error_response(413, f"body of {length} bytes is over the {limit}-byte limit"))
            return
        encoding = headers.get("content-encoding", "identity").strip().lower() or "identity"
        if encoding not in ENCODINGS:
            reason = f"content encoding {encoding[:40]!r} is not served; send gzip, deflate or none"
            self._discard_with(error_response(415, reason))
            return
        size = body_reservation(length, encoding != "identity" or length is None, limit) if has_body else 0
        if not self.settings.bodies.hold(size):
            log.info("event=review_refused_busy remote=%s reserved_bytes=%d", self.remote, size)
            self._discard_with(error_response(429, "too many request bodies are being read right now; retry"))
            return
        self._exchange.reserved = size
        self._decoder = BodyDecoder(encoding, limit)
        self._target = target
        if (
            headers.get("expect", "").lower() == "100-continue"
            and self._parser.get_http_version() == "1.1"
            and not self._busy
            and not self._pending
        ):
            assert self.transport is not None
            self.transport.write(_CONTINUE)

    def on_body(self, body: bytes) -> None:
        if self._decoder is None:  # no body was expected, or it is being dropped
            return
        try:
            self._decoder.feed(body)
        except BodyTooLarge as exc:
            self._discard_with(error_response(413, str(exc)))
        except BodyUnreadable as exc:
            self._discard_with(self._unreadable(str(exc)))

    def on_message_complete(self) -> None:
        if self._discarding:  # the dropped body has passed: close once its answer is out
            self._discarding = False
            self._reading = False
            self._stopped = True
            if self._close_when_read:
                self.close()
            else:
                self._pause()
            raise _Stop
        body = b""
        if self._decoder is not None:
            try:
                body = self._decoder.finish()
            except BodyUnreadable as exc:
                self._refuse(self._unreadable(str(exc)))
                self._reading = False
                self._stop_reading()
                return
        target = self._target
        assert target is not None
        request = None
        if not isinstance(target, Response):
            request = Request(self._method, self._path, self._headers, body, self.remote, self._received_at)
        self._ended_in_chunk = True
        keep_alive = self._parser.should_keep_alive()
        self._pending.append(_Pending(self._exchange, target, request, keep_alive))
        self._exchange = None
        self._reading = False
        self._decoder = None
        self._target = None
        if not keep_alive:  # HTTP/1.0 or `Connection: close`: whatever follows is not read
            self._stopped = True
            raise _Stop

    # -- answering ------------------------------------------------------------------------------

    def _unreadable(self, reason: str) -> Response:
        log.info("event=http_bad_request remote=%s reason=%r", self.remote, f"body cannot be read: {reason}")
        return error_response(400, f"body cannot be read: {reason}")

    def _refuse(self, response: Response) -> None:
        """Owe `response` (closing the connection) for the request being read, after those before it."""
        if response.status not in (404, 405):  # those refuse a path, not a review
            self.settings.refused(_OUTCOMES.get(response.status, "malformed"))
        closing = Response(response.status, response.body, response.content_type, close=True)
        self._pending.append(_Pending(self._exchange, closing, None, False))
        self._exchange = None
        self._decoder = None

    def _stop_with(self, response: Response) -> None:
        """Refuse the request being read and read nothing more (its head cannot be trusted)."""
        self._refuse(response)
        self._reading = False
        self._stop_reading()
        raise _Stop

    def _discard_with(self, response: Response) -> None:
        """Refuse the request being read now; read and drop the rest of its body, then close."""
        self._refuse(response)
        self._discarding = True
        self._discard_left = DISCARD_BYTES

    def _bad_request(self, reason: str, status: int = 400) -> None:
        if self._discarding:  # the request was answered; what is dropped cannot even be framed
            self._discarding = False
            self._reading = False
            self._stop_reading()
            if self._close_when_read:
                self.close()
            return
        if self._stopped:
            return
        log.info("event=http_bad_request remote=%s reason=%r", self.remote, " ".join(reason.split())[:300])
        self._refuse(error_response(status, reason))
        self._reading = False
        self._stop_reading()

    def _stop_reading(self) -> None:
        self._stopped = True
        self._linger_after = True
        self._pause()

    def _serve(self) -> None:
        """Answer what is owed, oldest first, until a handler has to wait."""
        while self._pending and not self._busy and not self._write_paused:
            pending = self._pending[0]
            answer = pending.answer
            if isinstance(answer, Response):
                self._send(answer)
                continue
            assert pending.request is not None
            try:
                result = answer(pending.request)
            except Exception as exc:  # a bug answers 500, never a dropped connection
                result = _internal_error(exc)
            if isinstance(result, Response):
                self._send(result)
                continue
            self._busy = True
            self._pause()
            self._task = self._loop.create_task(self._finish(result))
        if not self._pending and not self._stopped:
            self._resume()

    async def _finish(self, result: Awaitable[Response]) -> None:
        try:
            response = await result
        except Exception as exc:
            response = _internal_error(exc)
        self._busy = False
        self._task = None
        self._send(response)
        self._serve()

    def _send(self, response: Response) -> None:
        pending = self._pending.popleft()
        transport = self.transport
        close = response.close or not pending.keep_alive or self.settings.drain.draining
        if pending.exchange is not None:
            pending.exchange.end()
        if transport is None or transport.is_closing():
            return
        transport.write(encode_response(response, close=close))
        if close:
            self._stopped = True
            for dropped in self._pending:
                if dropped.exchange is not None:
                    dropped.exchange.end()
            self._pending.clear()
            if self._discarding:  # what the client still sends of the body is read first
                self._close_when_read = True
                self._stopped = False
                self._resume()
                return
            if self._linger_after:
                self._linger()
                return
            self.close()
            return
        if self._reading or self._pending:
            self._arm(self._loop.time())  # the next request's clock starts now
        else:
            self._disarm()
            self._idle_until = self._loop.time() + self.settings.idle_timeout_seconds
            self._wake_by(self._idle_until)

    # -- timers -----------------------------------------------------------------------------------

    def _arm(self, start: float) -> None:
        """A request's clock starts at `start`."""
        self._deadline = start + self.settings.request_timeout_seconds
        self._idle_until = None
        self._wake_by(self._deadline)

    def _disarm(self) -> None:
        self._deadline = None

    def _wake_by(self, when: float) -> None:
        """Make the alarm ring no later than `when` (rarely moves it: it rings every period anyway)."""
        if self._alarm is None or self._alarm_at > when:
            self._set_alarm(when)

    def _set_alarm(self, when: float) -> None:
        if self._alarm is not None:
            self._alarm.cancel()
        self._alarm_at = when
        self._alarm = self._loop.call_at(when, self._ring)

    def _ring(self) -> None:
        """Expire what is due; otherwise look again at the next moment something could be.

        While the connection is open the alarm rings at least once per request timeout, so that a
        request beginning at any time is checked at its deadline without arming a timer itself.
        """
        self._alarm = None
        now = self._loop.time()
        if self._deadline is not None and now >= self._deadline:
            self._expired()
            return
        if self._idle_until is not None and now >= self._idle_until and self.idle:
            self.close()
            return
        if self.transport is None and self._deadline is None:
            return  # closed, or never opened
        period = min(self.settings.request_timeout_seconds, self.settings.idle_timeout_seconds)
        self._set_alarm(min(t for t in (self._deadline, self._idle_until, now + period) if t is not None))

    def _linger(self) -> None:
        self._lingering = True
        self._discard_left = DISCARD_BYTES
        self._deadline = self._loop.time() + LINGER_SECONDS
        self._wake_by(self._deadline)
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    def _expired(self) -> None:
        if self._lingering:  # the end of a lingering close, not a late request
            self._deadline = None
            self.close()
            return
        self._deadline = None
        self.owner.count_expired()
        log.info(
            "event=request_deadline peer=%s busy=%s timeout_s=%.1f",
            self.remote,
            self._busy or bool(self._pending),
            self.settings.request_timeout_seconds,
        )
        self.abort()

    def _pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            with contextlib.suppress(RuntimeError):  # already closing
                self.transport.pause_reading()

    def _resume(self) -> None:
        if self._stopped or not self._paused or self._write_paused:
            return
        if self.transport is not None and not self.transport.is_closing():
            self._paused = False
            self.transport.resume_reading()


def _content_length(text: str | None) -> int | None:
    # llhttp has already refused a Content-Length that is not digits (or two that disagree).
    if not text:
        return None
    return int(text) if len(text) <= 20 else 1 << 64


def _internal_error(exc: Exception) -> Response:
    log.error("event=http_handler_failed error=%r", f"{type(exc).__name__}: {exc}")
    return error_response(500, f"kube-vgpu webhook internal error: {type(exc).__name__}")
