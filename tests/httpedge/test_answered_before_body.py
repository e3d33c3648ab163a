"""A GET answered before its body arrived closes its connection, over real TLS.

aiohttp reads and drops the body of a request answered before it (lingering), and keeps the
connection alive if the body ends soon enough. Those bytes came after the answer, so no answer counts
them: 1,000 connections each sending a `GET /healthz` and then a 1 MiB body in one write held the
webhook at 830 MiB until their request deadlines. An answer given while a body is still to come
therefore says `Connection: close`, as the 404 and 405 answers do.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.httpedge.listener import ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import A100, ThreadedWebhook, gpu_node, write_tls

BOUND = 10.0  # seconds any wait in these tests may take before it fails
BODY = 1024 * 1024


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    # The request deadline far past the test's waits: only the answer may end the connection.
    limits = ConnectionLimits(request_timeout_seconds=60, idle_timeout_seconds=60)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), limits=limits) as running:
        yield running


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def _connect(webhook: ThreadedWebhook, opened: list[socket.socket]) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    opened.append(raw)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    opened.append(sock)
    return sock


def _head(sock: ssl.SSLSocket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the answer"
        data += chunk
    return data.partition(b"\r\n\r\n")[0]


def _says_close(head: bytes) -> bool:
    return any(line.lower() == b"connection: close" for line in head.split(b"\r\n"))


def _closed_by_server(sock: ssl.SSLSocket) -> bool:
    """Whether the server ends the connection within BOUND (what it still sends is read and dropped)."""
    sock.settimeout(BOUND)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_get_answered_before_its_body_closes_its_connection(
    webhook: ThreadedWebhook, opened: list[socket.socket], path: str
) -> None:
    sock = _connect(webhook, opened)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {BODY}\r\n\r\n".encode())
    head = _head(sock)
    assert _says_close(head), head
    with contextlib.suppress(ConnectionError, ssl.SSLError):  # read and dropped, or refused
        sock.sendall(b"x" * BODY)
    assert _closed_by_server(sock), "a connection whose body came after its answer was kept open"


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_get_without_a_body_keeps_its_connection_alive(
    webhook: ThreadedWebhook, opened: list[socket.socket], path: str
) -> None:
    sock = _connect(webhook, opened)
    for _ in range(2):
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        head = _head(sock)
        assert not _says_close(head), head
