"""The webhook's listening socket: TLS, the cap on open connections and the request deadline (SPEC §2.3).

aiohttp (`httpedge.edge`) serves HTTP on each connection; this module decides which
connections exist. It accepts on its own, so that a connection is counted from its accept, before
any TLS work: a flood of connections that never finish their handshake fills the cap like any other.
At the cap the newcomer is never refused: the connection that has gone longest without progress
(idle since its last answer, or without completing the request it began: counted from its accept or
that request's first byte) is closed to make room, so the API server's reviews always get through
a flood of idle or slow callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

from kube_vgpu.httpedge.edge import MAX_KEEP_ALIVE_READ_BYTES, AdmissionProtocol, BufferedReads, EdgeServer

log = logging.getLogger("kube_vgpu.webhook.listener")

# Connections the kernel queues while the accept loop is busy; beyond it new SYNs wait or fail.
_BACKLOG = 512
# How long to pause accepting when the process is out of file descriptors.
_ACCEPT_ERROR_PAUSE_SECONDS = 0.1
# A deadline this close is due when its wake-up runs (the loop's clock is read once a pass, in ms).
_CLOCK_SLACK_SECONDS = 0.001
# How often TLS connections are asked what the kernel received since their last answer that never
# reached HTTP (see `Slot.check_non_http`): a getsockopt each, about 2.5 ms a check for 1,000
# connections (the webhook idle with 1,000 open: 3.5 ms of CPU a second, against 1.0 without it).
NON_HTTP_CHECK_SECONDS = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on connections (defaults: SPEC §2.3; `kube-vgpu webhook --help` names the flags)."""

    # Open connections (TLS handshakes included); at the cap the one longest without progress closes.
    max_connections: int = 1000
    # From a connection's accept (TLS handshake included), or a request's first bytes, until the
    # request has arrived whole.
    request_timeout_seconds: float = 10.0
    # How long a closing TLS connection has to close: from the close, to push out what it still has
    # to send (an answer of a few kB, in the kernel's buffer long before) and exchange close_notify
    # with the peer; past it, the connection is aborted. Until then it keeps its TLS buffers, which
    # hold up to about 2.3 times its largest read (`httpedge.edge.MAX_KEEP_ALIVE_READ_BYTES`). Go's
    # server does not wait for the peer's close_notify at all.
    tls_close_timeout_seconds: float = 1.0
    # An idle keep-alive connection is closed after this; above the 90 s the API server's HTTP
    # client keeps idle connections, so the client, not the server, ends them (no request is
    # ever sent on a connection the server is closing).
    idle_timeout_seconds: float = 100.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections must be at least 1, got {self.max_connections}")
        if min(self.request_timeout_seconds, self.idle_timeout_seconds, self.tls_close_timeout_seconds) <= 0:
            raise ValueError("request, idle and TLS close timeouts must be positive seconds")


class Slot:
    """One accepted connection as the listener sees it: its deadline and when it last made progress."""

    __slots__ = (
        "_timer",
        "busy",
        "deadline",
        "handling",
        "listener",
        "opening",
        "protocol",
        "since",
        "sock",
        "suspect",
        "transport",
        "woke",
    )

    def __init__(self, listener: Listener, sock: socket.socket, now: float) -> None:
        self.listener = listener
        self.sock = sock
        # When the connection was accepted, last answered or began a request: the order the cap closes in.
        self.since = now
        # A request has arrived whole and its handler is running: never closed to make room.
        self.busy = False
        # A request's head has arrived and its handler has not answered yet (body may be arriving).
        self.handling = False
        # Bytes arrived while busy: a pipelined request may be waiting.
        self.woke = False
        self.protocol: AdmissionProtocol | None = None
        # Kept apart from the protocol's, which aiohttp drops as soon as it starts closing.
        self.transport: asyncio.Transport | None = None
        self.opening: asyncio.Task[None] | None = None
        # When the request arriving now must have arrived whole (loop clock), or None when none is.
        self.deadline: float | None = None
        # A check found more than MAX_KEEP_ALIVE_READ_BYTES received since the last answer that never
        # reached HTTP; the next one closes the connection if it is still so (see `check_non_http`).
        self.suspect = False
        # The pending wake-up that checks the deadline. It is left running when a request completes
        # and moved when it fires early, so a request on a kept-alive connection costs a store, not a
        # timer (a timer per request was 2 % of a review's CPU): one wake-up per deadline length.
        self._timer: asyncio.TimerHandle | None = None
        self._arm(now)

    # -- told by the protocol and the handler ---------------------------------------------------

    def received(self) -> None:
        """Bytes arrived: the deadline of the request they begin runs from now (if none is running)."""
        if self.busy:
            self.woke = True
        elif self.deadline is None:
            self._began_request(self.listener.loop.time())

    def opened(self, protocol: AdmissionProtocol) -> None:
        """The handshake is done; HTTP is aiohttp's from here."""
        self.protocol = protocol
        self.transport = protocol.transport

    def lost(self) -> None:
        """The connection ended."""
        self._disarm()
        self.listener.forget(self)

    def began(self) -> None:
        """A request's head has arrived and its handler runs."""
        self.handling = True
        if self.deadline is None:
            # Its first bytes came in the same read as the end of the previous request, while that
            # one's deadline ran: none started with them, so its body's deadline starts now.
            self._began_request(self.listener.loop.time())

    def request_complete(self) -> None:
        """The request's head and body have arrived: its deadline no longer runs."""
        self.busy = True
        self.woke = False
        self.deadline = None  # the wake-up, if pending, finds none and ends

    def answered(self) -> None:
        """The answer is written: idle from now (unless a pipelined request was already arriving)."""
        self.busy = False
        self.handling = False
        self.suspect = False  # what a check found was before this answer
        now = self.listener.loop.time()
        self.since = now
        self.listener.progressed(self)
        if self.woke and self in self.listener.connections:
            # (Not when the connection has gone, forgotten by the listener: a handler runs to its
            # answer after that, and a deadline for the next request it had begun, which will never
            # arrive, would count the connection as expired.)
            self.woke = False
            self._arm(now)
        else:
            # Answered without `request_complete` (a 404 or 405; with a body, its answer closes the
            # connection): its deadline ends with it, or it would close the idle connection, and cut
            # the next request on it short, a deadline after this one began.
            self.deadline = None

    def check_non_http(self) -> None:
        """Close a connection whose TLS layer has read, since its last answer, more bytes that never
        reached HTTP than MAX_KEEP_ALIVE_READ_BYTES and than those that did: TLS messages with no
        HTTP in them (KeyUpdates padded to 16 KiB), sent while idle (they begin no request, so no
        answer counts them) or while a request arrives (its deadline ends them, but 1,000
        connections each sent 1 MiB of them within it put the webhook past 600 MiB). The TLS layer
        keeps them in its buffers as it does a large review, and neither an answer nor the body
        budget counts them. A legitimate caller's are its records' 22 bytes each, its handshake, and
        a streamed body's records read and not yet decrypted (up to uvloop's 256 KiB read, while its
        HTTP bytes flow); a caller that sends as many HTTP bytes as the others is bounded by the
        head limit and the body budget. Two checks in a row must find it so.
        """
        protocol = self.protocol
        if protocol is None:  # the handshake: bounded by the request deadline
            self.suspect = False
            return
        counted = protocol.read_since_answer()
        if counted is None:
            self.suspect = False
            return
        read, http = counted
        non_http = read - http
        if non_http <= max(MAX_KEEP_ALIVE_READ_BYTES, http):
            self.suspect = False
        elif not self.suspect:
            self.suspect = True
        else:
            self.listener.non_http_closed += 1
            log.info(
                "event=non_http_tls_bytes_closed bytes=%d http_bytes=%d limit=%d",
                non_http,
                http,
                MAX_KEEP_ALIVE_READ_BYTES,
            )
            self.close_now()

    # -- closing ----------------------------------------------------------------------------------

    def close_now(self) -> None:
        """Close at once, without waiting for the peer (handshake or not)."""
        self._disarm()
        # Forgotten now, not when the loop reports the close: the count never passes the cap.
        self.listener.forget(self)
        if self.transport is not None:
            self.transport.abort()
            return
        if self.opening is not None:
            self.opening.cancel()
        with contextlib.suppress(OSError):
            self.sock.close()

    def _began_request(self, now: float) -> None:
        """A request began on a kept-alive connection: its deadline runs, and the cap counts from now, so
        a review arriving on a connection idle for a while is not closed before silent newcomers."""
        self.since = now
        self.listener.progressed(self)
        self._arm(now)

    def _arm(self, now: float) -> None:
        self.deadline = now + self.listener.limits.request_timeout_seconds
        if self._timer is None:
            self._timer = self.listener.loop.call_at(self.deadline, self._wake)

    def _disarm(self) -> None:
        self.deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        """The pending wake-up: close if the running deadline has passed, else wait for it."""
        self._timer = None
        deadline = self.deadline
        if deadline is None:  # the request it was set for arrived whole; none runs now
            return
        loop = self.listener.loop
        if deadline - loop.time() > _CLOCK_SLACK_SECONDS:  # a later request's deadline: wait for it
            self._timer = loop.call_at(deadline, self._wake)
            return
        self.deadline = None
        self.listener.expired += 1
        log.info(
            "event=request_deadline handshaken=%s timeout_s=%.1f",
            self.protocol is not None,
            self.listener.limits.request_timeout_seconds,
        )
        self.close_now()


class Listener:
    """Accepts TLS connections, keeps at most `max_connections` open, and serves `edge` on each."""

    def __init__(
        self,
        edge: EdgeServer,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        *,
        host: str,
        port: int,
    ) -> None:
        self.edge = edge
        self.ssl_context = ssl_context
        self.limits = limits
        self.host = host
        self.port = port
        self.loop = asyncio.get_running_loop()
        # Open connections, oldest progress first (a dict keeps insertion order; progress re-inserts).
        self.connections: dict[Slot, None] = {}
        self.evicted = 0  # connections closed to make room at the cap
        self.expired = 0  # connections closed by the request deadline
        self.non_http_closed = 0  # connections closed for TLS bytes that never reached HTTP
        self._non_http_checks: asyncio.TimerHandle | None = None
        self._sock: socket.socket | None = None
        self._all_closed = asyncio.Event()
        self._all_closed.set()
        self._at_cap_logged = False

    async def start(self) -> None:
        """Bind and listen (port 0 picks a free one, see `port`), then accept in the background."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=_BACKLOG)
        sock.setblocking(False)
        self._sock = sock
        self.port = int(sock.getsockname()[1])
        # A reader callback rather than `loop.sock_accept`: nothing to cancel on close, so no
        # accepted socket can be lost between the accept and a cancellation.
        self.loop.add_reader(sock.fileno(), self._accept_ready, sock)
        if self.ssl_context is not None:
            # Only TLS connections keep buffers as large as their largest read, and only the
            # webhook's answers restart the count (`AdmissionProtocol.answer_closes`): a plain
            # listener (the metrics port) is not checked.
            self._non_http_checks = self.loop.call_later(NON_HTTP_CHECK_SECONDS, self._check_non_http)

    def _check_non_http(self) -> None:
        """Every NON_HTTP_CHECK_SECONDS while listening for TLS: each open connection's `check_non_http`."""
        self._non_http_checks = self.loop.call_later(NON_HTTP_CHECK_SECONDS, self._check_non_http)
        for slot in list(self.connections):
            slot.check_non_http()

    def _accept_ready(self, sock: socket.socket) -> None:
        for _ in range(_BACKLOG):  # what is queued now, but never the loop's whole turn
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: let some connections end first
                log.warning("event=accept_failed error=%r", str(exc))
                self._pause_accepting(sock)
                return
            if len(self.connections) >= self.limits.max_connections and not self._make_room():
                with contextlib.suppress(OSError):  # every connection is computing an answer
                    conn.close()
                continue
            conn.setblocking(False)
            slot = Slot(self, conn, self.loop.time())
            self.connections[slot] = None
            self._all_closed.clear()
            slot.opening = self.loop.create_task(self._open(slot))

    def _make_room(self) -> bool:
        """Close the connection longest without progress that is not computing an answer."""
        victim = next((slot for slot in self.connections if not slot.busy), None)
        if victim is None:
            return False
        self.evicted += 1
        if not self._at_cap_logged:  # one line per episode, not one per closed connection
            log.warning(
                "event=connection_cap_reached max_connections=%d action=close_longest_without_progress",
                self.limits.max_connections,
            )
            self._at_cap_logged = True
        victim.close_now()
        return True

    def _pause_accepting(self, sock: socket.socket) -> None:
        self.loop.remove_reader(sock.fileno())

        def resume() -> None:
            if self._sock is sock:
                self.loop.add_reader(sock.fileno(), self._accept_ready, sock)

        self.loop.call_later(_ACCEPT_ERROR_PAUSE_SECONDS, resume)

    async def _open(self, slot: Slot) -> None:
        timeout = self.limits.request_timeout_seconds
        try:
            if self.ssl_context is None:
                await self.loop.connect_accepted_socket(
                    lambda: BufferedReads(self.edge.protocol(slot)), slot.sock
                )
            else:
                await self.loop.connect_accepted_socket(
                    lambda: BufferedReads(self.edge.protocol(slot)),
                    slot.sock,
                    ssl=self.ssl_context,
                    ssl_handshake_timeout=timeout,
                    ssl_shutdown_timeout=self.limits.tls_close_timeout_seconds,
                )
        except (OSError, ssl.SSLError, asyncio.CancelledError) as exc:
            # A failed or timed-out handshake never reaches the protocol; the slot is freed here.
            log.debug("event=handshake_failed error=%r", str(exc))
            if slot.protocol is None:
                slot.close_now()
        finally:
            slot.opening = None

    def progressed(self, slot: Slot) -> None:
        """`slot` answered a request: it moves to the back of the order the cap closes in."""
        if slot in self.connections:
            del self.connections[slot]
            self.connections[slot] = None

    def forget(self, slot: Slot) -> None:
        """A connection ended (or never opened)."""
        self.connections.pop(slot, None)
        if len(self.connections) < self.limits.max_connections:
            self._at_cap_logged = False
        if not self.connections:
            self._all_closed.set()

    async def close(self) -> None:
        """Stop accepting; handshakes still in progress are abandoned. Open connections stay."""
        if self._non_http_checks is not None:
            self._non_http_checks.cancel()
            self._non_http_checks = None
        if self._sock is not None:
            self.loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for slot in [s for s in self.connections if s.protocol is None]:
            slot.close_now()
        await asyncio.sleep(0)  # let the cancelled handshakes unwind

    async def drain(self, deadline: float) -> None:
        """Finish what is in flight and close every connection by `deadline` (the loop's clock).

        A connection whose request head has arrived gets its answer, its body still being read if
        need be (the answer says `Connection: close`, and aiohttp closes it after); every other
        connection (idle, or with part of a head) is closed now; what is left at the end is aborted.
        """
        for slot in list(self.connections):
            if slot.protocol is not None and not slot.handling:
                slot.protocol.force_close()  # a TLS close exchange, bounded by ssl_shutdown_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self._all_closed.wait()
        if self.connections:
            log.warning("event=webhook_connections_aborted count=%d", len(self.connections))
            for slot in list(self.connections):
                slot.close_now()

    async def wait_all_closed(self) -> None:
        """Return once no connection is open."""
        await self._all_closed.wait()
