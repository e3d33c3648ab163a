"""A large review arriving while the event loop is loaded is answered, over real TLS (SPEC §2.3).

While the loop is slow to come back, uvloop reads the socket into its TLS layer's incoming buffer
(up to its 256 KiB high-water mark, plus a read) faster than it decrypts for aiohttp; the non-HTTP
check must not count those bytes, read and not yet decrypted, as bytes that never reached HTTP. It
did: a 3 MiB review sent while the loop ran in 0.6 s slices was aborted after two checks, well before
its request deadline, and the API server, with failurePolicy Fail, refused the pod.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

from kube_vgpu.httpedge.listener import ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import A100, ThreadedWebhook, container, gpu_node, pod, review, write_tls

BOUND = 60.0  # seconds any wait in this test may take before it fails
# How long the loop is held at a time, and for how long in all: slices past two checks' worth of
# slow reads, as a review that takes CPU in pieces (or many at once) holds it.
SLICE_SECONDS = 0.6
LOADED_SECONDS = 8.0


def test_a_large_review_sent_while_the_loop_runs_in_slow_slices_is_answered(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    limits = ConnectionLimits(request_timeout_seconds=BOUND, idle_timeout_seconds=BOUND)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), limits=limits) as webhook:
        padded = pod(container(), annotations={"example.com/pad": "x" * 3_000_000})
        body = json.dumps(review(padded, uid="big"))
        head = (
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )

        async def load() -> None:
            end = time.monotonic() + LOADED_SECONDS
            while time.monotonic() < end:
                time.sleep(SLICE_SECONDS)  # noqa: ASYNC251 (holds the loop, as a review taking CPU would)
                await asyncio.sleep(0)

        loaded = webhook.submit(load())
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
        with webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(head.encode() + body.encode())
            answer = b""
            while b"\r\n\r\n" not in answer:
                chunk = sock.recv(65536)
                assert chunk, "the connection was closed before the review's answer"
                answer += chunk
        loaded.result(timeout=BOUND)
        assert answer.startswith(b"HTTP/1.1 200 ")
        listener = webhook.server.listener
        assert listener is not None
        assert webhook.read(lambda: listener.non_http_closed) == 0
