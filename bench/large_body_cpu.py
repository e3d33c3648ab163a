"""Server CPU per large request body over TLS, through `httpedge.Listener` alone (no review logic).

Measures what glibc's pinned mmap threshold (`httpedge.heap`) costs when each read and each body is
128 KiB or more: run it with `--pin` and without, and against an older checkout via PYTHONPATH.
Prints CPU microseconds per request (after 5 warm-up requests) and the server's minor page faults.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import http.client
import resource
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web


def serve(count: int, cert: str, key: str, pin: bool) -> None:
    """The server process: answers `count` requests, then prints its CPU per request."""
    import uvloop

    from kube_vgpu.httpedge.edge import EdgeServer
    from kube_vgpu.httpedge.listener import ConnectionLimits, Listener

    if pin:
        from kube_vgpu.httpedge.heap import pin_malloc_thresholds

        print(f"pin={pin_malloc_thresholds()}", file=sys.stderr)

    async def main() -> None:
        done = asyncio.Event()
        seen = [0]
        started = [0.0]

        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            body = await request.read()
            seen[0] += 1
            if seen[0] == 5:
                started[0] = time.process_time()
            if seen[0] == count:
                done.set()
            return web.Response(body=str(len(body)).encode())

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        edge = EdgeServer(handle, idle_timeout_seconds=30.0, max_body_bytes=8 << 20)
        listener = Listener(edge, context, ConnectionLimits(), host="127.0.0.1", port=0)
        await listener.start()
        print(listener.port, flush=True)
        await done.wait()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        per = (time.process_time() - started[0]) / (count - 5) * 1e6
        print(f"cpu_per_request_us={per:.0f} minor_faults={usage.ru_minflt}", flush=True)

    uvloop.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--kib", type=int, default=1024, help="body size")
    parser.add_argument("--pin", action="store_true", help="pin glibc's thresholds as the webhook does")
    parser.add_argument("--gzip", action="store_true", help="send the body gzip-compressed")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.requests, args.serve[0], args.serve[1], args.pin)
        return
    from kube_vgpu.certs.issue import issue_ca, issue_serving

    # The same throwaway CA and serving certificate as bench/webhook.py's.
    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-large-body-"))
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    command = [sys.executable, __file__, "--requests", str(args.requests), "--serve"]
    command += [str(workdir / "tls.crt"), str(workdir / "tls.key")] + (["--pin"] if args.pin else [])
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context)
    body = b"x" * (args.kib * 1024)
    headers = {"Content-Encoding": "gzip"} if args.gzip else {}
    if args.gzip:
        body = gzip.compress(body)
    for _ in range(args.requests):
        connection.request("POST", "/", body=body, headers=headers)
        connection.getresponse().read()
    print(f"kib={args.kib} gzip={args.gzip} pin={args.pin} {server.stdout.readline().strip()}")
    server.wait()


if __name__ == "__main__":
    main()
