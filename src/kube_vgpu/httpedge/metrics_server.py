"""`GET /metrics` on a port of its own, for the webhook and the node plugin.

Plain HTTP behind a `Listener` of its own, with a smaller cap and the request deadline: scrapes never
share a cap with the API server's reviews, a NetworkPolicy can open this port to Prometheus alone,
and a flood holds at most the cap's connections (the node plugin's kubelet socket needs file
descriptors too).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from kube_vgpu.httpedge.listener import ConnectionLimits, Listener, arrived, error_response

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Prometheus keeps one or two connections per target.
METRICS_LIMITS = ConnectionLimits(max_connections=100)

# The exposition of every metric, read at each scrape.
Render = Callable[[], Awaitable[bytes]]


class MetricsServer:
    """Serves what `render` returns at `/metrics` on `host:port` (0 picks a free port; see `port`)."""

    def __init__(
        self,
        render: Render,
        *,
        host: str,
        port: int,
        limits: ConnectionLimits = METRICS_LIMITS,
        content_type: str = CONTENT_TYPE,
    ) -> None:
        self.render, self.content_type = render, content_type
        self.host, self.port, self.limits = host, port, limits
        self.listener: Listener | None = None  # while serving

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived(request)  # its body, if any, is never read: the answer closes then
        if request.raw_path.partition("?")[0] != "/metrics":
            return error_response(404, "only /metrics is served on this port", close=True)
        if request.method not in ("GET", "HEAD"):
            return error_response(405, f"method {request.method[:16]} is not served; use GET", close=True)
        response = web.Response(body=await self.render(), headers={"Content-Type": self.content_type})
        if request.body_exists:
            response.force_close()
        return response

    async def start(self) -> None:
        self.listener = Listener(self._handle, None, self.limits, host=self.host, port=self.port)
        await self.listener.start()
        self.port = self.listener.port
        log.info("event=metrics_serving address=%s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close its connections (within a second)."""
        if self.listener is not None:
            listener, self.listener = self.listener, None
            await listener.close(listener.loop.time() + 1.0)
