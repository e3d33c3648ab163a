"""`GET /metrics` of the webhook on a port of its own, apart from admission (SPEC §2.3).

Plain HTTP on aiohttp's low-level server behind a `Listener` of its own: scraping never shares a
connection cap, deadline or TLS handshake budget with the API server's reviews, and a NetworkPolicy
can open this port to Prometheus without opening the admission port to it. The port has its own
(smaller) cap and the same request deadline, since without a NetworkPolicy any pod can reach it.
"""

from __future__ import annotations

import logging

from aiohttp import web

from kube_vgpu.webhook.serving.edge import AdmissionProtocol, EdgeServer, error_response
from kube_vgpu.webhook.serving.listener import ConnectionLimits, Listener
from kube_vgpu.webhook.serving.metrics import WebhookMetrics

log = logging.getLogger("kube_vgpu.webhook.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Prometheus keeps one or two connections per target; at the cap the one longest without progress
# closes, so a flood of partial heads holds at most this many (about 13 kB each) and no more.
METRICS_LIMITS = ConnectionLimits(max_connections=100)
# How long the connections left open at stop get to finish.
_STOP_SECONDS = 1.0


class MetricsServer:
    """Serves `metrics` at `/metrics` on `host:port` (0 picks a free port; see `port` once started)."""

    def __init__(
        self, metrics: WebhookMetrics, *, host: str, port: int, limits: ConnectionLimits = METRICS_LIMITS
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.limits = limits
        self._listener: Listener | None = None

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        protocol = request.protocol
        slot = protocol.slot if isinstance(protocol, AdmissionProtocol) else None
        if slot is not None:
            slot.began()
            slot.request_complete()  # its body, if any, is never read: the answer closes then
        try:
            if request.raw_path.partition("?")[0] != "/metrics":
                return error_response(404, "only /metrics is served on this port", close=True)
            if request.method not in ("GET", "HEAD"):
                return error_response(405, f"method {request.method[:16]} is not served; use GET", close=True)
            response = web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})
            if request.body_exists:
                response.force_close()
            return response
        finally:
            if slot is not None:
                slot.answered()

    async def start(self) -> None:
        """Listen."""
        edge = EdgeServer(
            self._handle, idle_timeout_seconds=self.limits.idle_timeout_seconds, max_body_bytes=0
        )
        listener = Listener(edge, None, self.limits, host=self.host, port=self.port)
        await listener.start()
        self._listener = listener
        self.port = listener.port
        log.info("event=metrics_serving address=%s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close its connections."""
        if self._listener is not None:
            listener, self._listener = self._listener, None
            await listener.close()
            await listener.drain(listener.loop.time() + _STOP_SECONDS)
