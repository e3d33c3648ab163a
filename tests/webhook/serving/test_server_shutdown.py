"""Shutdown within its timeout, checked by the order of events: once `stop` begins, new
connections are refused and idle keep-alive connections closed; a review whose body is still
arriving is answered (and its connection closed); a body that never completes cannot hold the
process past the shutdown timeout: its connection is aborted and `stop` returns.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

from kube_vgpu.httpedge.listener import ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import A100, ThreadedWebhook, container, gpu_node, pod, review, write_tls

BOUND = 20.0  # seconds any wait may take before the test fails; far above the shutdown timeout


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:  # queued by the kernel as the listening socket closed
        return False
    return False


def _closed(sock: ssl.SSLSocket) -> bool:
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
        return True
    except TimeoutError:
        return False


def _post_head(body: bytes) -> bytes:
    return f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n".encode()


def _answer(sock: ssl.SSLSocket) -> tuple[bytes, dict[str, object]]:
    sock.settimeout(BOUND)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before the answer"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head, json.loads(rest)


def test_shutdown_refuses_closes_idle_finishes_in_flight_and_aborts_the_stalled(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    # The request deadline is far away, so only the shutdown timeout can end the stalled body.
    limits = ConnectionLimits(request_timeout_seconds=600, idle_timeout_seconds=600)
    webhook = ThreadedWebhook(
        apiserver.write_kubeconfig(tmp_path / "kubeconfig"),
        write_tls(tmp_path / "tls"),
        limits=limits,
        # Long enough for the steps below on a loaded machine; the stalled body then holds it all.
        shutdown_timeout_seconds=5.0,
    )
    events: list[str] = []
    sockets: list[ssl.SSLSocket] = []

    def connect() -> ssl.SSLSocket:
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
        sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
        sockets.append(sock)
        return sock

    with webhook:
        listener = webhook.server.listener
        assert listener is not None
        body = json.dumps(review(pod(container(memory=1000)), uid="in-flight")).encode()
        idle = connect()
        idle.sendall(_post_head(body) + body)
        _answer(idle)  # now an idle keep-alive connection
        in_flight = connect()
        in_flight.sendall(_post_head(body) + body[:10])
        stalled = connect()
        stalled.sendall(_post_head(body) + body[:10])
        _wait(lambda: webhook.read(lambda: len(listener.connections)) == 3, "three connections")
        _wait(lambda: webhook.read(lambda: listener.in_flight) == 2, "two reviews in flight")

        stopping = webhook.submit(webhook.server.stop())
        events.append("stop")
        _wait(lambda: _refused(webhook.port), "new connections refused")
        events.append("refusing")
        _wait(lambda: _closed(idle), "the idle connection closed")
        events.append("idle closed")
        assert not stopping.done()  # two reviews are still in flight

        in_flight.sendall(body[10:])
        head, answer = _answer(in_flight)
        assert b" 200 " in head.split(b"\r\n")[0] and b"connection: close" in head.lower()
        assert answer["response"]["uid"] == "in-flight"  # type: ignore[index]
        events.append("in-flight answered")

        stopping.result(timeout=BOUND)  # the stalled body never completes, yet stop returns
        events.append("stopped")
        assert webhook.read(lambda: len(listener.connections)) == 0
        assert _closed(stalled)
        for sock in sockets:
            sock.close()
    assert events == ["stop", "refusing", "idle closed", "in-flight answered", "stopped"]
