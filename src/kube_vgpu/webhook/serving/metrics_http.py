"""`GET /metrics` of the webhook on a port of its own, apart from admission (SPEC §2.3).

Plain HTTP through an aiohttp Application, as the node plugin serves its metrics: scraping never
shares a connection cap, deadline or TLS handshake budget with the API server's reviews, and a
NetworkPolicy can open this port to Prometheus without opening the admission port to it.
"""

from __future__ import annotations

import logging

from aiohttp import web

from kube_vgpu.webhook.serving.metrics import WebhookMetrics

log = logging.getLogger("kube_vgpu.webhook.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsServer:
    """Serves `metrics` at `/metrics` on `host:port` (0 picks a free port; see `port` once started)."""

    def __init__(self, metrics: WebhookMetrics, *, host: str, port: int) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def start(self) -> None:
        """Listen."""
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("event=metrics_serving address=%s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close its connections."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
