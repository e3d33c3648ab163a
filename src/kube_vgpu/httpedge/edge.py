"""aiohttp's low-level HTTP/1.1 server, with the few hooks the webhook needs around it (SPEC §2.3).

aiohttp frames requests, bounds heads (`max_line_size`, `max_field_size`, `max_headers`), queues at
most 32 pipelined requests per connection (reading pauses past that), decodes gzip/deflate bodies
in bounded pieces, times out idle keep-alive connections and stops serving a connection once it is
gone. This module only changes what aiohttp does with a request it cannot read (a JSON 4xx and one
INFO line instead of a text answer and an ERROR traceback), and tells the connection's `Slot` when
bytes arrive, so the listener can enforce the request deadline and choose whom to close at the cap.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError

log = logging.getLogger("kube_vgpu.webhook.http")

JSON = "application/json"
# A request line (method, path, version) longer than this is refused: reviews go to short paths.
MAX_LINE_BYTES = 8190
# One header (its name, and apart its value) and the header count; an AdmissionReview's head is a few hundred
# bytes, and these are aiohttp's (and Go's order of) defaults. The C parser bounds a header's name and
# its value each by MAX_FIELD_BYTES.
MAX_FIELD_BYTES = 8190
MAX_HEADERS = 100
# A request's head as a whole, and the heads of the requests queued on one connection together: aiohttp
# bounds each header and their count but not their sum (100 x 8 kB), and a head arriving (or queued
# behind an answer nobody reads) is held whole, in parsed headers worth about four times its bytes:
# 1,000 connections holding 56 kB heads put the webhook at 357 MiB, over the chart's 512 Mi limit
# beside a large cluster's cache. The API server's heads are under 2 kB (a bearer token included).
MAX_HEAD_BYTES = 16 * 1024
# A read is handed to aiohttp in slices of at most this many bytes. The bytes of a next head that
# follow the end of a request in the same slice cannot be told apart from that request's own (aiohttp's
# parser holds them and does not say so), so they are not counted: a slice bounds them. Unsliced, one
# 256 kB read did: 1,000 connections each holding a 96 kB head that way reached 508 MiB.
SLICE_BYTES = 16 * 1024
# aiohttp's read-ahead for one connection's body before it pauses reading (flow control).
READ_BUFFER_BYTES = 64 * 1024
# A TLS connection that received more than this since its last answer is closed after its next
# answer (`Connection: close`). Its TLS layer keeps what its largest read wrote, for as long as the
# connection is open: uvloop reads the socket into a 256 KiB buffer of the connection's own, and
# OpenSSL's incoming buffer grows to the largest read and never shrinks, so about 2.3 times the
# read. 1,000 connections left idle after one plain 256 KiB review each held 387 MiB; after 32 KiB,
# 208 MiB (`bench/hostile.py --plain-large`). The API server's reviews of ordinary pods are a few
# kB; a review past this costs it a new TLS handshake for its next one. Counted as the kernel counts
# the connection's bytes (TLS records, handshake and padding included), not as HTTP bytes: a TLS 1.3
# record may carry one byte of HTTP padded to 16 KiB, and 1,000 connections left idle after a 42-byte
# request sent in 16 such records held 332 MiB while their HTTP count said 42 bytes.
MAX_KEEP_ALIVE_READ_BYTES = 32 * 1024
# Linux's `struct tcp_info`: the buffer asked for, and where `tcpi_bytes_received` sits in it.
_TCP_INFO_BYTES = 136
_TCP_BYTES_RECEIVED = struct.Struct("=Q")
_TCP_BYTES_RECEIVED_OFFSET = 128
# The bytes the kernel holds that the connection has not read yet (FIONREAD's int).
_INT = struct.Struct("i")
# An answer given before the body was read (413, 415, 429, 404): aiohttp reads and drops the rest for
# up to this long, so a client still sending reads the answer rather than a reset (Go: 500 ms).
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


class SlotHooks(Protocol):
    """What a connection tells the listener's record of it (`httpedge.listener.Slot`)."""

    # The accepted socket (asked for the bytes the kernel received; the transport's own stand-in
    # for it answers `getsockopt` three times slower).
    sock: socket.socket

    def received(self) -> None:
        """Bytes arrived (a request may have begun)."""
        ...

    def opened(self, protocol: AdmissionProtocol) -> None:
        """The TLS handshake completed; HTTP is served from now on."""
        ...

    def lost(self) -> None:
        """The connection ended."""
        ...

    def began(self) -> None:
        """A request's head has arrived and its handler runs (until `answered`)."""
        ...

    def request_complete(self) -> None:
        """The request being served has arrived whole (its body too)."""
        ...

    def answered(self) -> None:
        """The request being served has its answer."""
        ...


class AdmissionProtocol(RequestHandler):
    """aiohttp's RequestHandler for one connection, reporting to its slot and answering framing errors
    with JSON."""

    __slots__ = (
        "_head_bytes",
        "_last_payload",
        "_received",
        "_socket",
        "_unfed",
        "_wire_seen",
        "edge",
        "slot",
    )

    def __init__(self, manager: EdgeServer, slot: SlotHooks | None, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.edge = manager
        self.slot = slot
        # Bytes of the head arriving now (none while a body arrives), and the last request's body.
        self._head_bytes = 0
        self._last_payload: StreamReader | None = None
        # The rest of a read that came while aiohttp's parser was paused (see data_received).
        self._unfed = b""
        # HTTP bytes received since the last answer (see `answer_closes`), and the kernel's count of
        # the connection's bytes at the last answer; the socket it is asked on (None: not TCP).
        self._received = 0
        self._wire_seen = 0
        self._socket: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._socket = self.slot.sock if self.slot is not None else transport.get_extra_info("socket")
        if self.slot is not None:
            self.slot.opened(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        super().connection_lost(exc)
        self._unfed = b""
        if self.slot is not None:
            self.slot.lost()
            self.slot = None

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        if self.slot is not None and data:
            self.slot.received()
        if not data or self._unfed:
            if not data:  # aiohttp asks for more (its queue drained): what its parser kept goes first
                self._feed(data)
            data, self._unfed = self._unfed + data, b""
        for start in range(0, len(data), SLICE_BYTES):
            if self.transport is None or self.transport.is_closing():
                return  # closed by a bound below (or by aiohttp): the rest is never read
            if self._reading_paused or len(self._messages) >= self._max_msg_queue_size:
                # aiohttp's parser stops at its queue's bound, or for a body its handler has not read
                # yet, and keeps what it is fed after that unparsed, parsing it when it asks for more
                # (`data_received(b"")`) where no count would see it: a slice fed meanwhile completes
                # a request, or counts as body. Keep the rest of the read here, unparsed, and feed it
                # when asked.
                self._unfed = data[start:]
                return
            self._feed(data[start : start + SLICE_BYTES])

    def answer_closes(self) -> bool:
        """Whether the answer about to be sent must close the connection: more than
        MAX_KEEP_ALIVE_READ_BYTES arrived since the last answer (this request, and whatever was
        pipelined behind it), as the kernel counts the connection's bytes (TLS records and their
        padding, the handshake for the first answer); HTTP bytes where it cannot say (not TCP). The
        count starts again for the next answer."""
        received, self._received = self._received, 0
        wire = self._wire_received()
        if wire is not None:
            received, self._wire_seen = wire - self._wire_seen, wire
        return received > MAX_KEEP_ALIVE_READ_BYTES

    def read_since_answer(self) -> tuple[int, int] | None:
        """What the TLS layer has read from the socket since the last answer (the accept, before the
        first), and how much of it reached HTTP; None when the socket cannot say. The rest is TLS
        records' own bytes and padding, TLS messages with no HTTP in them (KeyUpdates padded to
        16 KiB) and the handshake before the first answer. Bytes the kernel holds unread, and those
        the TLS layer holds not yet decrypted, are left out: a caller streaming a body always has
        some in flight."""
        wire = self._wire_received()
        if wire is None:
            return None
        try:
            unread = _INT.unpack(fcntl.ioctl(self._socket.fileno(), termios.FIONREAD, _INT.pack(0)))[0]
        except (OSError, ValueError, AttributeError):  # closed meanwhile, or not a socket that can say
            return None
        # Bytes read from the socket and not yet decrypted are left out too: on a loaded loop (or while
        # aiohttp pauses reading) the TLS transport reads up to its 256 KiB high-water mark, and a
        # read past it, faster than it decrypts, so a large review's own bytes wait there for seconds.
        size = getattr(self.transport, "get_read_buffer_size", None)
        pending = size() if size is not None else 0
        return int(wire - unread - pending - self._wire_seen), self._received

    def _wire_received(self) -> int | None:
        """The bytes the kernel has received on this connection since it opened (Linux's
        `tcpi_bytes_received`), or None when the socket cannot say."""
        if self._socket is None:
            return None
        try:
            info = self._socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_BYTES)
        except (OSError, ValueError, AttributeError):  # closed (answered after the caller went), not TCP,
            self._socket = None  # or no TCP_INFO on this platform
            return None
        if len(info) < _TCP_BYTES_RECEIVED_OFFSET + _TCP_BYTES_RECEIVED.size:  # a kernel before 4.1
            self._socket = None
            return None
        count: int = _TCP_BYTES_RECEIVED.unpack_from(info, _TCP_BYTES_RECEIVED_OFFSET)[0]
        return count

    def _feed(self, data: bytes) -> None:
        """Hand aiohttp one slice of a read and count what it adds to the heads held."""
        count = self._request_count
        # Whether a body was arriving: asked before the feed, since the feed may complete it.
        in_body = self._last_payload is not None and not self._last_payload.is_eof()
        super().data_received(data)
        if self._request_count != count:  # a head completed: what follows is its body or the next head
            self._head_bytes = 0
            self._last_payload = self._messages[-1][1] if self._messages else None
            held = sum(_head_size(message) for message, _ in self._messages) if self._messages else 0
        elif not in_body:  # no body arriving: these bytes are a head
            self._head_bytes += len(data)
            held = self._head_bytes
        else:
            return
        if held > MAX_HEAD_BYTES and self.transport is not None:
            log.info("event=http_head_too_large bytes=%d limit=%d", held, MAX_HEAD_BYTES)
            self.edge.refused("malformed")
            self.transport.abort()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's ERROR line with a traceback, kept for bugs; a body the caller broke is INFO.

        After an answer given without reading the whole body (a 400 for a damaged gzip body, say),
        aiohttp reads and drops the rest, and the damage raises again there: that is still the
        caller's mistake, already answered, and the connection is closed after it.
        """
        exc = kw.get("exc_info")
        if isinstance(exc, RequestPayloadError | HttpProcessingError | ConnectionError):
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
        line without a traceback for the caller's mistake (aiohttp's own logs it at ERROR with one)."""
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


class BufferedReads(asyncio.BufferedProtocol):
    """What the transport talks to: it reads into one buffer that every connection on its thread
    shares and hands `protocol` a copy of each read's bytes; everything else goes to `protocol` as it is.

    aiohttp's protocol is a plain `asyncio.Protocol`, so uvloop's TLS reads for it allocate a
    256 KiB block per read (`SSLObject.read(256 KiB)`) and then shrink it. A buffered protocol is
    read into instead, so no read allocates more than its own bytes. The buffer is used only between
    `get_buffer` and `buffer_updated`, which the transport calls back to back on its loop's thread,
    so one per thread is enough: loops on two threads (tests, embedders) read with the GIL released,
    and one buffer for the process would let one connection's bytes land in another's request.
    """

    __slots__ = ("protocol", "view")

    def __init__(self, protocol: AdmissionProtocol) -> None:
        self.protocol = protocol
        self.view = _read_view()  # built by the transport's protocol factory, on its loop's thread

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.protocol.connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.protocol.connection_lost(exc)

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        self.protocol.data_received(self.view[:nbytes].tobytes())

    def eof_received(self) -> bool | None:
        self.protocol.eof_received()  # aiohttp's returns None: the transport closes
        return None


# The buffer every connection's reads on one thread land in (see BufferedReads). Each read's copy is
# under glibc's pinned 128 KiB mmap threshold (`httpedge.heap`), so it comes from the heap: with
# 256 KiB (uvloop's own TLS read size) every large read was mapped and unmapped, and a 3 MiB body
# cost 13.7 ms of CPU against 8.3 unpinned; with 64 KiB, 9.6 ms (`bench/large_body_cpu.py`).
SHARED_READ_BYTES = 64 * 1024
_THREAD_BUFFERS = threading.local()


def _read_view() -> memoryview:
    """This thread's read buffer (made on first use)."""
    view: memoryview | None = getattr(_THREAD_BUFFERS, "view", None)
    if view is None:
        view = _THREAD_BUFFERS.view = memoryview(bytearray(SHARED_READ_BYTES))
    return view


def _head_size(message: Any) -> int:
    """What a parsed head holds: its path and its headers' names and values."""
    raw = getattr(message, "raw_headers", ())  # a framing error's stand-in has none
    return len(getattr(message, "path", "")) + sum(len(name) + len(value) for name, value in raw)


class EdgeServer(web.Server):
    """aiohttp's low-level server whose connections are `AdmissionProtocol`s."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
        *,
        idle_timeout_seconds: float,
        max_body_bytes: int,
        refused: Callable[[str], None] = lambda outcome: None,
    ) -> None:
        loop = asyncio.get_running_loop()

        def request_factory(
            message: RawRequestMessage,
            payload: StreamReader,
            protocol: RequestHandler,
            writer: AbstractStreamWriter,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            # `client_max_size` bounds the body as `read()` returns it: after decompression.
            return web.BaseRequest(
                message, payload, protocol, writer, task, loop, client_max_size=max_body_bytes
            )

        super().__init__(
            handler,
            request_factory=request_factory,
            # The handler's coroutine runs to its answer even when the caller goes: a review in the
            # validating phase may be recording a quota reservation through the API, which must not
            # stop half-way. Requests queued behind it on a closed connection are never started.
            handler_cancellation=False,
            keepalive_timeout=idle_timeout_seconds,
            max_line_size=MAX_LINE_BYTES,
            max_field_size=MAX_FIELD_BYTES,
            max_headers=MAX_HEADERS,
            read_bufsize=READ_BUFFER_BYTES,
            lingering_time=LINGER_SECONDS,
            access_log=None,
        )
        self.refused = refused

    def protocol(self, slot: SlotHooks | None) -> AdmissionProtocol:
        """A protocol instance for one accepted connection, reporting to `slot`."""
        return AdmissionProtocol(self, slot, loop=self._loop, **self._kwargs)

    def __call__(self) -> AdmissionProtocol:
        return self.protocol(None)
