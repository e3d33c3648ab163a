"""The webhook's listening socket: TLS and a cap on open connections (SPEC §2.3).

`webhook.http.connection` serves HTTP on each connection (with its request deadline and idle
timeout); this module decides which connections exist. It accepts on its own loop so that a
connection over the cap is closed before any TLS work or buffer is spent on it (asyncio gives every
TLS connection a 256 KiB read buffer, so open connections, not requests, are what a flood turns
into memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass

from kube_vgpu.webhook.serving.http.connection import HttpConnection, HttpSettings
from kube_vgpu.webhook.serving.http.message import HttpApp

log = logging.getLogger("kube_vgpu.webhook.listener")

# Connections the kernel queues while the accept loop is busy; beyond it new SYNs wait or fail.
_BACKLOG = 512
# How long to pause accepting when the process is out of file descriptors.
_ACCEPT_ERROR_PAUSE_SECONDS = 0.1


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on connections (defaults: SPEC §2.3; `kube-vgpu webhook --help` names the flags)."""

    # Open connections (TLS handshakes included); more are closed at once.
    max_connections: int = 1000
    # From a request's first byte (a new connection: from its accept, TLS handshake included) to its
    # answer; also bounds the TLS close exchange.
    request_timeout_seconds: float = 10.0
    # An idle keep-alive connection is closed after this; above the 90 s the API server's HTTP
    # client keeps idle connections, so the client, not the server, ends them (no request is
    # ever sent on a connection the server is closing).
    idle_timeout_seconds: float = 100.0

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max connections must be at least 1, got {self.max_connections}")
        if self.request_timeout_seconds <= 0 or self.idle_timeout_seconds <= 0:
            raise ValueError("request and idle timeouts must be positive seconds")


class Listener:
    """Accepts TLS connections up to the cap and serves `app` on each."""

    def __init__(
        self,
        app: HttpApp,
        settings: HttpSettings,
        ssl_context: ssl.SSLContext | None,
        limits: ConnectionLimits,
        *,
        host: str,
        port: int,
    ) -> None:
        self.app = app
        self.settings = settings
        self.ssl_context = ssl_context
        self.limits = limits
        self.host = host
        self.port = port
        self.connections: set[HttpConnection] = set()
        self.refused = 0  # connections closed at once because the cap was reached
        self.expired = 0  # connections closed by the request deadline
        self._sock: socket.socket | None = None
        # Connections accepted and not yet through their TLS handshake.
        self._opening: dict[asyncio.Task[None], tuple[socket.socket, HttpConnection]] = {}
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
        asyncio.get_running_loop().add_reader(sock.fileno(), self._accept_ready, sock)

    def _accept_ready(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(_BACKLOG):  # what is queued now, but never the loop's whole turn
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: let some connections end first
                log.warning("event=accept_failed error=%r", str(exc))
                self._pause_accepting(sock)
                return
            if len(self.connections) >= self.limits.max_connections:
                self._refuse(conn)
                continue
            self._at_cap_logged = False
            conn.setblocking(False)
            connection = HttpConnection(self.app, self.settings, self, loop.time())
            self.connections.add(connection)
            self._all_closed.clear()
            task = loop.create_task(self._open(conn, connection))
            self._opening[task] = (conn, connection)
            task.add_done_callback(self._opened)

    def _pause_accepting(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())

        def resume() -> None:
            if self._sock is sock:
                loop.add_reader(sock.fileno(), self._accept_ready, sock)

        loop.call_later(_ACCEPT_ERROR_PAUSE_SECONDS, resume)

    def _refuse(self, conn: socket.socket) -> None:
        self.refused += 1
        if not self._at_cap_logged:  # one line per episode, not one per refused connection
            log.warning("event=connection_cap_reached max_connections=%d", self.limits.max_connections)
            self._at_cap_logged = True
        with contextlib.suppress(OSError):
            conn.close()

    async def _open(self, conn: socket.socket, connection: HttpConnection) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.limits.request_timeout_seconds
        try:
            if self.ssl_context is None:
                await loop.connect_accepted_socket(lambda: connection, conn)
            else:
                await loop.connect_accepted_socket(
                    lambda: connection,
                    conn,
                    ssl=self.ssl_context,
                    ssl_handshake_timeout=timeout,
                    ssl_shutdown_timeout=timeout,
                )
        except (OSError, ssl.SSLError, asyncio.CancelledError) as exc:
            # A failed or timed-out handshake never reaches the protocol; the slot is freed here.
            log.debug("event=handshake_failed error=%r", str(exc))
            self._abandon(conn, connection)

    def _opened(self, task: asyncio.Task[None]) -> None:
        self._opening.pop(task, None)

    def _abandon(self, conn: socket.socket, connection: HttpConnection) -> None:
        with contextlib.suppress(OSError):
            conn.close()
        if connection.transport is None:  # else its connection_lost forgets it
            connection.abort()
            self.forget(connection)

    def count_expired(self) -> None:
        """A connection was closed by its request deadline."""
        self.expired += 1

    def forget(self, connection: HttpConnection) -> None:
        """A connection ended (or never opened)."""
        self.connections.discard(connection)
        if not self.connections:
            self._all_closed.set()

    async def close(self) -> None:
        """Stop accepting; handshakes still in progress are abandoned. Open connections stay."""
        if self._sock is not None:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        opening = dict(self._opening)
        for task in opening:
            task.cancel()
        await asyncio.gather(*opening, return_exceptions=True)
        # A task cancelled before it ran never reached its own clean-up.
        for conn, connection in opening.values():
            self._abandon(conn, connection)

    async def wait_all_closed(self) -> None:
        """Return once no connection is open."""
        await self._all_closed.wait()

    def close_idle(self) -> int:
        """Close (with the TLS close exchange) every connection between requests; the number closed.

        A connection with part of a request buffered is not idle: it gets its answer first.
        """
        idle = [c for c in self.connections if c.idle]
        for connection in idle:
            connection.close()
        return len(idle)

    def abort_all(self) -> None:
        """Close every open connection now."""
        for connection in list(self.connections):
            connection.abort()
