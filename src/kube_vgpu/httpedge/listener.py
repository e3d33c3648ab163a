"""The listening socket: TLS, the cap on open connections and the request deadline.

aiohttp (`httpedge.edge`) serves HTTP on each connection; this module decides which connections
exist. It accepts on its own (`loop.connect_accepted_socket`), so a connection counts from its
accept, before any TLS work: connections that never finish their handshake fill the cap like any
other. At the cap the newcomer is never refused: the connection longest without progress (idle
since its last answer, or not done with the request it began, counted from its accept or that
request's first byte) is closed to make room, so a flood of idle or slow callers cannot lock the
API server's reviews out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

from kube_vgpu.httpedge.edge import EdgeProtocol, EdgeServer

log = logging.getLogger(__name__)

# Connections the kernel queues while the accept loop is busy.
_BACKLOG = 512
# How long to pause accepting when the process is out of file descriptors.
_ACCEPT_ERROR_PAUSE_SECONDS = 0.1
# The most a request deadline is overrun by: how often the sweep looks (or a tenth of the deadline).
_SWEEP_SECONDS = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on connections (`kube-vgpu webhook --help` names the flags)."""

    # Open connections (TLS handshakes included); at the cap the one longest without progress closes.
    # The API server keeps a few dozen at most. Each may hold buffers as large as its reads (an
    # unfinished head at aiohttp's bounds included), so 500 keeps a flood within the chart's 512 Mi
    # beside a large cluster's cache (`bench/hostile.py`; figures in docs/benchmarks.md).
    max_connections: int = 500
    # From a connection's accept (TLS handshake included), or a request's first bytes, until the
    # request has arrived whole.
    request_timeout_seconds: float = 10.0
    # How long a closing TLS connection may take to exchange close_notify before it is aborted (it
    # keeps its TLS buffers until then). Go's server does not wait for the peer's at all.
    tls_close_timeout_seconds: float = 1.0
    # An idle keep-alive connection is closed after this: above the 90 s the API server's HTTP client
    # keeps idle connections, so the client ends them and never sends on one the server is closing.
    idle_timeout_seconds: float = 100.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections must be at least 1, got {self.max_connections}")
        if min(self.request_timeout_seconds, self.idle_timeout_seconds, self.tls_close_timeout_seconds) <= 0:
            raise ValueError("request, idle and TLS close timeouts must be positive seconds")


class Slot:
    """One accepted connection as the listener sees it: its deadline and when it last made progress."""

    __slots__ = (
        "busy",
        "deadline",
        "handling",
        "listener",
        "opening",
        "protocol",
        "sock",
        "transport",
        "woke",
    )

    def __init__(self, listener: Listener, sock: socket.socket, now: float) -> None:
        self.listener = listener
        self.sock = sock
        self.busy = False  # a request arrived whole and is being answered: never closed to make room
        self.handling = False  # a request's head arrived and it has no answer yet
        self.woke = False  # bytes arrived while busy: a pipelined request may be waiting
        self.protocol: EdgeProtocol | None = None
        self.transport: asyncio.BaseTransport | None = None
        self.opening: asyncio.Task[None] | None = None
        # When the request arriving now must have arrived whole (loop clock); None when none is. The
        # listener's sweep closes the connection once it has passed: a request costs a store, not a timer.
        self.deadline: float | None = now + listener.limits.request_timeout_seconds

    def opening_done(self, task: asyncio.Task[None]) -> None:
        """The handshake ended (done, failed or cancelled, even before it began): a connection that
        never reached HTTP is closed."""
        self.opening = None
        if self.protocol is None:
            self.close_now()

    def opened(self, protocol: EdgeProtocol, transport: asyncio.BaseTransport) -> None:
        self.protocol, self.transport = protocol, transport

    def received(self) -> None:
        if self.busy:
            self.woke = True
        elif self.deadline is None:
            self.began_request()

    def lost(self) -> None:
        self.deadline = None
        self.listener.forget(self)

    def began(self) -> None:
        self.handling = True
        if self.deadline is None:  # its first bytes came in the read that ended the previous request
            self.began_request()

    def request_complete(self) -> None:
        self.busy, self.woke, self.deadline = True, False, None

    def answered(self) -> None:
        self.busy = self.handling = False
        self.deadline = None
        if self.woke and self in self.listener.connections:  # a pipelined request is arriving
            self.woke = False
            self.began_request()
        else:
            self.listener.progressed(self)

    def began_request(self) -> None:
        """A request began: its deadline runs, and the cap counts its progress from now."""
        self.listener.progressed(self)
        self.deadline = self.listener.loop.time() + self.listener.limits.request_timeout_seconds

    def close_now(self) -> None:
        """Close at once, without waiting for the peer (handshake or not)."""
        self.deadline = None
        self.listener.forget(self)  # now, so the count never passes the cap
        if self.transport is not None:
            self.transport.abort()  # type: ignore[attr-defined]
            return
        if self.opening is not None:
            # The handshake's transport may own the socket already: cancelling the handshake closes
            # the transport, and then `opening_done` the socket. Closing the socket here first left
            # the transport's queued read on a closed descriptor, which asyncio logs as an error.
            self.opening.cancel()
            return
        with contextlib.suppress(OSError):
            self.sock.close()


class Listener:
    """Accepts connections (TLS when given a context), keeps at most `max_connections` open, and
    serves `edge` on each."""

    def __init__(
        self,
        edge: EdgeServer,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        *,
        host: str,
        port: int,
    ) -> None:
        self.edge, self.ssl_context, self.limits = edge, ssl_context, limits
        self.host, self.port = host, port
        self.loop = asyncio.get_running_loop()
        # Open connections, longest without progress first (progress re-inserts at the end).
        self.connections: dict[Slot, None] = {}
        self.evicted = 0  # closed to make room at the cap
        self.expired = 0  # closed by the request deadline
        self.sock: socket.socket | None = None
        self.all_closed = asyncio.Event()
        self.all_closed.set()
        self.at_cap_logged = False
        self.sweep_seconds = min(_SWEEP_SECONDS, limits.request_timeout_seconds / 10)
        self.sweeper: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Bind and listen (port 0 picks a free one, see `port`), then accept in the background."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.create_server((self.host, self.port), family=family, backlog=_BACKLOG)
        sock.setblocking(False)
        self.sock, self.port = sock, int(sock.getsockname()[1])
        # A reader callback, not `loop.sock_accept`: no accepted socket is lost to a cancellation.
        self.loop.add_reader(sock.fileno(), self.accept_ready, sock)
        self.sweeper = self.loop.call_later(self.sweep_seconds, self.sweep)

    def sweep(self) -> None:
        """Close the connections whose request deadline has passed; look again in `sweep_seconds`."""
        now = self.loop.time()
        for slot in [s for s in self.connections if s.deadline is not None and s.deadline <= now]:
            self.expired += 1
            log.info(
                "event=request_deadline handshaken=%s timeout_s=%.1f",
                slot.protocol is not None,
                self.limits.request_timeout_seconds,
            )
            slot.close_now()
        self.sweeper = self.loop.call_later(self.sweep_seconds, self.sweep)

    def accept_ready(self, sock: socket.socket) -> None:
        for _ in range(_BACKLOG):  # what is queued now, but never the loop's whole turn
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: let some connections end first
                log.warning("event=accept_failed error=%r", str(exc))
                self.loop.remove_reader(sock.fileno())
                self.loop.call_later(_ACCEPT_ERROR_PAUSE_SECONDS, self.resume_accepting, sock)
                return
            if len(self.connections) >= self.limits.max_connections and not self.make_room():
                conn.close()  # every connection is computing an answer
                continue
            conn.setblocking(False)
            slot = Slot(self, conn, self.loop.time())
            self.connections[slot] = None
            self.all_closed.clear()
            slot.opening = self.loop.create_task(self.open(slot))
            slot.opening.add_done_callback(slot.opening_done)

    def resume_accepting(self, sock: socket.socket) -> None:
        if self.sock is sock:
            self.loop.add_reader(sock.fileno(), self.accept_ready, sock)

    def make_room(self) -> bool:
        """Close the connection longest without progress that is not computing an answer."""
        victim = next((slot for slot in self.connections if not slot.busy), None)
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

    async def open(self, slot: Slot) -> None:
        limits = self.limits
        try:
            await self.loop.connect_accepted_socket(
                lambda: self.edge.protocol(slot),
                slot.sock,
                ssl=self.ssl_context,
                ssl_handshake_timeout=limits.request_timeout_seconds if self.ssl_context else None,
                ssl_shutdown_timeout=limits.tls_close_timeout_seconds if self.ssl_context else None,
            )
        except (OSError, ssl.SSLError, asyncio.CancelledError) as exc:
            log.debug("event=handshake_failed error=%r", str(exc))

    def progressed(self, slot: Slot) -> None:
        """`slot` made progress: it moves to the back of the order the cap closes in."""
        if self.connections.pop(slot, 0) is None:
            self.connections[slot] = None

    def forget(self, slot: Slot) -> None:
        self.connections.pop(slot, None)
        if len(self.connections) < self.limits.max_connections:
            self.at_cap_logged = False
        if not self.connections:
            self.all_closed.set()

    async def close(self) -> None:
        """Stop accepting and abandon handshakes in progress; open connections stay."""
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
        for slot in [s for s in self.connections if s.protocol is None]:
            slot.close_now()
        await asyncio.sleep(0)  # let the cancelled handshakes unwind

    async def drain(self, deadline: float) -> None:
        """Close every connection by `deadline` (the loop's clock): one whose request head has arrived
        gets its answer first (with `Connection: close`), every other is closed now, and what is left
        at the deadline is aborted."""
        for slot in list(self.connections):
            if slot.protocol is not None and not slot.handling:
                slot.protocol.force_close()  # a TLS close exchange, bounded by ssl_shutdown_timeout
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self.all_closed.wait()
        if self.connections:
            log.warning("event=webhook_connections_aborted count=%d", len(self.connections))
            for slot in list(self.connections):
                slot.close_now()
        if self.sweeper is not None:
            self.sweeper.cancel()
            self.sweeper = None
