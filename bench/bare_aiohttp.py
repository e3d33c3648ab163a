"""A bare aiohttp server for bench/webhook.py: TLS, aiohttp's low-level server on uvloop, nothing around it.

By default it reads each request's body and answers every POST with the same AdmissionReview
response, computing nothing: the cost of aiohttp itself (framing, TLS, keep-alive) that the webhook
stands on. With `--kubeconfig` it answers with kube-vgpu's own decision instead (the review parsed,
the path's phase run against a cache filled from that API server, the answer encoded) and still
nothing around it: no connection cap, request deadline, body budget, fair turns, metrics or log
lines. So the benchmark can tell how much of a review is the HTTP server, how much the decision and
how much the webhook's own layers.

    python bench/bare_aiohttp.py --addr 127.0.0.1:9443 --cert tls.crt --key tls.key [--kubeconfig K]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
from aiohttp import web

from kube_vgpu.contract.config import load_config
from kube_vgpu.webhook.admission.review import encode_json, encode_response, parse_review
from kube_vgpu.webhook.service import Options, WebhookServer, load_mig_geometry

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

ANSWER = orjson.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "bench", "allowed": True},
    }
)


async def handle(request: web.BaseRequest) -> web.StreamResponse:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def decision(webhook: WebhookServer) -> Handler:
    """kube-vgpu's decision with nothing around it: the review parsed, the path's phase, the answer."""
    services = webhook.services

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "POST":
            ready = request.path != "/readyz" or services.readiness.ready()  # the harness waits on it
            return web.json_response({"ready": ready}, status=200 if ready else 503)
        review = parse_review(await request.read(), services.admission.bounds)
        if request.path == "/validate":
            verdict = await services.validation.review(review)
        else:
            verdict = services.admission.review(review)
        return web.Response(
            body=encode_json(encode_response(review.uid, verdict)), content_type="application/json"
        )

    return handle


async def serve(addr: str, cert: str, key: str, kubeconfig: str | None) -> None:
    host, port = addr.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    loop = asyncio.get_running_loop()
    webhook: WebhookServer | None = None
    handler: Handler = handle
    if kubeconfig is not None:
        # The webhook's own parts, filled as `kube-vgpu webhook` fills them, before listening.
        webhook = WebhookServer(Options(Path(cert), Path(key), kubeconfig=kubeconfig), load_config(None))
        await webhook.cache.start()
        webhook.geometry = await load_mig_geometry(webhook.kube, webhook.config.node)
        await webhook.cache.wait_synced()
        handler = decision(webhook)
    server = web.Server(handler, access_log=None)
    listening = await loop.create_server(server, host, int(port), ssl=context)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    listening.close()
    await server.shutdown(1.0)
    if webhook is not None:
        await webhook.cache.stop()
        webhook.kube.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--kubeconfig", help="answer with kube-vgpu's decision on this API server's state")
    args = parser.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args.addr, args.cert, args.key, args.kubeconfig))


if __name__ == "__main__":
    main()
