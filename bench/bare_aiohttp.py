"""A bare aiohttp server for bench/webhook.py: TLS, aiohttp's low-level server on uvloop, one fixed answer.

It reads each request's body and answers every POST with the same AdmissionReview response, computing
nothing: the cost of aiohttp itself (framing, TLS, keep-alive) that the webhook stands on, so the
benchmark can tell how much of a review is the HTTP server and how much is the decision.

    python bench/bare_aiohttp.py --addr 127.0.0.1:9443 --cert tls.crt --key tls.key
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import ssl

import orjson
from aiohttp import web

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


async def serve(addr: str, cert: str, key: str) -> None:
    host, port = addr.rsplit(":", 1)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    loop = asyncio.get_running_loop()
    server = web.Server(handle, access_log=None)
    listening = await loop.create_server(server, host, int(port), ssl=context)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    listening.close()
    await server.shutdown(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(serve(args.addr, args.cert, args.key))


if __name__ == "__main__":
    main()
