"""`GET /metrics` on a port of its own, for the webhook and the node plugin.

Plain HTTP on aiohttp's low-level server behind a `Listener` of its own, with its own (smaller) cap
and the request deadline: scrapes never share a connection cap with the API server's reviews, a
NetworkPolicy can open this port to Prometheus alone, and a flood of idle or half-sent requests
holds at most the cap's connections (the node plugin's kubelet socket needs file descriptors too).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from kube_vgpu.httpedge.edge import EdgeProtocol, EdgeServer, error_response
from kube_vgpu.httpedge.listener import ConnectionLimits, Listener

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Prometheus keeps one or two connections per target.
METRICS_LIMITS = ConnectionLimits(max_connections=100)
# How long the connections left open at stop get to finish.
_STOP_SECONDS = 1.0


# The exposition of every metric, read at each scrape.
Render = Callable[[], Awaitable[bytes]]


class MetricsServer:
    """Serves what `render` returns at `/metrics` on `host:port` (0 picks a free port; see `port`
    once started)."""

    def __init__(
        self,
        render: Render,
        *,
        host: str,
        port: int,
        limits: ConnectionLimits = METRICS_LIMITS,
        content_type: str = CONTENT_TYPE,
    ) -> None:
        self.render = render
        self.content_type = content_type
        self.host = host
        self.port = port
        self.limits = limits
        self.listener: Listener | None = None  # while serving

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        slot = protocol.slot if isinstance(protocol, EdgeProtocol) else None
        if slot is not None:
            slot.began()
            slot.request_complete()  # its body, if any, is never read: the answer closes then
        try:
            if request.raw_path.partition("?")[0] != "/metrics":
                return error_response(404, "only /metrics is served on this port", close=True)
            if request.method not in ("GET", "HEAD"):
                return error_response(405, f"method {request.method[:16]} is not served; use GET", close=True)
            body = await self.render()
            response = web.Response(body=body, headers={"Content-Type": self.content_type})
            if request.body_exists:
                response.force_close()
            return response
        finally:
            if slot is not None:
                slot.answered()

    async def start(self) -> None:
        """Listen."""
        edge = EdgeServer(self._handle, idle_timeout_seconds=self.limits.idle_timeout_seconds)
        listener = Listener(edge, None, self.limits, host=self.host, port=self.port)
        await listener.start()
        self.listener = listener
        self.port = listener.port
        log.info("event=metrics_serving address=%s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close its connections."""
        if self.listener is not None:
            listener, self.listener = self.listener, None
            await listener.close()
            await listener.drain(listener.loop.time() + _STOP_SECONDS)
