"""A connection that received much is closed after its answer, over real TLS (SPEC §2.3).

A TLS connection keeps buffers as large as its largest read for as long as it is open, so a caller
that sends one large review and then idles would hold that memory on every connection up to the
cap. Past `MAX_KEEP_ALIVE_READ_BYTES` received on the wire since the last answer (TLS records,
their padding and the handshake included, not only HTTP bytes), the answer says `Connection: close`
and the connection ends; at or under it, the connection is kept alive. A closing connection waits
for the caller's TLS close only `tls_close_timeout_seconds`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kube_vgpu.httpedge.edge import MAX_KEEP_ALIVE_READ_BYTES
from kube_vgpu.httpedge.listener import NON_HTTP_CHECK_SECONDS, ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import (
    A100,
    ThreadedWebhook,
    closed_by_server,
    container,
    gpu_node,
    pod,
    review,
    write_tls,
)

BOUND = 10.0  # seconds any wait in these tests may take before it fails


def _request_of(size: int, uid: str = "review-1") -> bytes:
    """A POST /mutate of exactly `size` bytes, head and body: a review of a pod padded by an annotation."""

    def build(padding: int) -> bytes:
        document = review(pod(container(), annotations={"example.com/pad": "x" * padding}), uid=uid)
        body = json.dumps(document, separators=(",", ":")).encode()
        head = (
            "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        return head + body

    padding = 0
    for _ in range(3):  # the Content-Length's digits settle after a step or two
        request = build(padding)
        padding += size - len(request)
    assert len(request) == size
    return request


def _read_answer(sock: ssl.SSLSocket) -> tuple[bytes, dict[str, object]]:
    """The next answer on `sock`: its head, and its JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the answer"
        body += chunk
    answer: dict[str, object] = json.loads(body)
    return head, answer


def _says_close(head: bytes) -> bool:
    return any(line.lower() == b"connection: close" for line in head.split(b"\r\n"))


def _allowed(answer: dict[str, object], uid: str) -> bool:
    response = answer["response"]
    assert isinstance(response, dict)
    return response["uid"] == uid and response["allowed"] is True


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    sockets: list[socket.socket] = []
    yield sockets
    for sock in sockets:
        sock.close()


def _webhook(
    apiserver: ApiServerStandin, tmp_path: Path, tls_close_timeout_seconds: float
) -> ThreadedWebhook:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    limits = ConnectionLimits(
        request_timeout_seconds=30,
        idle_timeout_seconds=60,
        tls_close_timeout_seconds=tls_close_timeout_seconds,
    )
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    return ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), limits=limits)


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    with _webhook(apiserver, tmp_path, tls_close_timeout_seconds=1.0) as running:
        yield running


def _connect(webhook: ThreadedWebhook, opened: list[socket.socket]) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    opened.append(raw)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    opened.append(sock)
    return sock


# A TLS 1.3 record on the wire: a 5-byte header, its bytes, their content type (1 byte) and a 16-byte
# AEAD tag; Python's TLS writes records of at most 16 KiB.
_RECORD_OVERHEAD = 5 + 1 + 16
_RECORD_BYTES = 16384


def _request_on_the_wire(wire: int, uid: str) -> bytes:
    """A request that puts exactly `wire` bytes on the wire in TLS 1.3 records."""
    size = wire - _RECORD_OVERHEAD * -(-wire // (_RECORD_BYTES + _RECORD_OVERHEAD))
    assert size + _RECORD_OVERHEAD * -(-size // _RECORD_BYTES) == wire
    return _request_of(size, uid=uid)


def _kept_alive_connection(webhook: ThreadedWebhook, opened: list[socket.socket]) -> ssl.SSLSocket:
    """A connection that has had one small review answered (its handshake counts toward that answer's
    bytes), over TLS 1.3 with a 16-byte tag, so a request's bytes on the wire are known."""
    sock = _connect(webhook, opened)
    assert sock.version() == "TLSv1.3"
    cipher = sock.cipher()
    assert cipher is not None and "CCM_8" not in cipher[0]
    sock.sendall(_request_of(4096, uid="warm-up"))
    head, answer = _read_answer(sock)
    assert _allowed(answer, "warm-up") and not _says_close(head)
    return sock


def test_a_request_of_the_bound_keeps_its_connection_alive(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    sock = _kept_alive_connection(webhook, opened)
    sock.sendall(_request_on_the_wire(MAX_KEEP_ALIVE_READ_BYTES, uid="first"))
    head, answer = _read_answer(sock)
    assert b" 200 " in head and _allowed(answer, "first")
    assert not _says_close(head)
    # The count starts again at each answer: two requests of the bound, one after the other, are
    # twice the bound in all and still keep the connection.
    sock.sendall(_request_on_the_wire(MAX_KEEP_ALIVE_READ_BYTES, uid="second"))
    head, answer = _read_answer(sock)
    assert _allowed(answer, "second") and not _says_close(head)


def test_a_request_one_byte_past_the_bound_is_answered_and_its_connection_closed(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    sock = _kept_alive_connection(webhook, opened)
    sock.sendall(_request_on_the_wire(MAX_KEEP_ALIVE_READ_BYTES + 1, uid="large"))
    head, answer = _read_answer(sock)
    assert b" 200 " in head and _allowed(answer, "large")
    assert _says_close(head)
    assert closed_by_server(sock)
    # The caller opens a new connection and is served there.
    again = _kept_alive_connection(webhook, opened)
    again.sendall(_request_on_the_wire(MAX_KEEP_ALIVE_READ_BYTES, uid="again"))
    head, answer = _read_answer(again)
    assert _allowed(answer, "again") and not _says_close(head)


def test_a_request_past_the_bound_after_small_ones_closes_after_its_own_answer(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    sock = _connect(webhook, opened)
    for number in range(3):
        sock.sendall(_request_of(4096, uid=f"small-{number}"))
        head, answer = _read_answer(sock)
        assert _allowed(answer, f"small-{number}") and not _says_close(head)
    sock.sendall(_request_of(3 * MAX_KEEP_ALIVE_READ_BYTES, uid="large"))
    head, answer = _read_answer(sock)
    assert _allowed(answer, "large") and _says_close(head)


def _open_count(webhook: ThreadedWebhook) -> int:
    listener = webhook.server.listener
    assert listener is not None
    return webhook.read(lambda: len(listener.connections))


def test_a_caller_that_never_closes_its_tls_is_let_go_after_the_tls_close_timeout(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    sock = _connect(webhook, opened)
    sock.sendall(_request_of(MAX_KEEP_ALIVE_READ_BYTES + 1, uid="large"))
    head, _ = _read_answer(sock)
    assert _says_close(head)
    # The caller keeps its socket and never answers the server's close_notify: the server's side
    # is gone after the 1 s TLS close timeout, not after the 30 s request deadline.
    _wait(lambda: _open_count(webhook) == 0, "the closing connection to be let go")
    assert sock.fileno() != -1  # the caller did not close it


def test_a_closing_connection_waits_for_the_callers_tls_close_up_to_its_timeout(
    apiserver: ApiServerStandin, tmp_path: Path, opened: list[socket.socket]
) -> None:
    with _webhook(apiserver, tmp_path, tls_close_timeout_seconds=30.0) as webhook:
        sock = _connect(webhook, opened)
        sock.sendall(_request_of(MAX_KEEP_ALIVE_READ_BYTES + 1, uid="large"))
        head, _ = _read_answer(sock)
        assert _says_close(head)
        time.sleep(1.5)
        assert _open_count(webhook) == 1  # still waiting for the caller's close_notify
        sock.unwrap()  # the caller's close_notify ends the wait
        _wait(lambda: _open_count(webhook) == 0, "the closed connection to be forgotten")


@pytest.mark.parametrize("seconds", [0.0, -1.0])
def test_a_tls_close_timeout_that_is_not_positive_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="TLS close timeouts must be positive"):
        ConnectionLimits(tls_close_timeout_seconds=seconds)


def test_the_smallest_positive_tls_close_timeout_is_accepted() -> None:
    assert ConnectionLimits(tls_close_timeout_seconds=1e-3).tls_close_timeout_seconds == 1e-3


# -- bytes the TLS layer read that never reach HTTP -----------------------------------------------

_LIBSSL = ctypes.util.find_library("ssl")


def _padding_context(webhook: ThreadedWebhook, block: int) -> ssl.SSLContext:
    """A TLS 1.3 client context whose every record is padded to `block` bytes (OpenSSL's
    `SSL_CTX_set_block_padding`, which Python does not expose): a caller may pad each record to
    16 KiB whatever it carries, and the server's TLS layer reads the padding before dropping it."""
    if _LIBSSL is None:
        pytest.skip("no libssl to call")
    libssl = ctypes.CDLL(_LIBSSL)
    if not hasattr(libssl, "SSL_CTX_set_block_padding"):
        pytest.skip("this libssl cannot pad records")
    libssl.SSL_CTX_set_block_padding.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libssl.SSL_CTX_set_block_padding.restype = ctypes.c_int
    context = webhook.tls.client_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # CPython's SSLContext object holds its SSL_CTX pointer right after the object header.
    ssl_ctx = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    assert libssl.SSL_CTX_set_block_padding(ssl_ctx, block) == 1
    return context


def _send_in_padded_records(
    webhook: ThreadedWebhook,
    opened: list[socket.socket],
    context: ssl.SSLContext,
    request: bytes,
    records: int,
) -> tuple[socket.socket, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, int]:
    """Connect, hand-shake, and send `request` split into `records` TLS records in one write; the
    raw socket, the TLS object and its incoming and outgoing BIOs, and the bytes that write put on
    the wire."""
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    opened.append(raw)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            data = raw.recv(65536)
            assert data, "connection closed in the handshake"
            incoming.write(data)
    raw.sendall(outgoing.read())
    for number in range(records):
        tls.write(request[number * len(request) // records : (number + 1) * len(request) // records])
    wire = outgoing.read()
    raw.sendall(wire)
    return raw, tls, incoming, outgoing, len(wire)


def _read_head_over(raw: socket.socket, tls: ssl.SSLObject, incoming: ssl.MemoryBIO) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = raw.recv(65536)
        assert chunk, "connection closed before the answer"
        incoming.write(chunk)
        with contextlib.suppress(ssl.SSLWantReadError):
            data += tls.read(65536)
    return data.partition(b"\r\n\r\n")[0]


def test_a_small_request_in_records_padded_past_the_bound_closes_its_connection(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    # 42 bytes of HTTP in 16 records of 16 KiB each: the TLS layer read 256 KiB, and holds it as an
    # unpadded 256 KiB review would (1,000 such idle connections: 332 MiB, `bench/padded_records.py`);
    # the answer must close the connection as it does for that review.
    request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    raw, tls, incoming, _, wire = _send_in_padded_records(
        webhook, opened, _padding_context(webhook, 16384), request, records=16
    )
    assert wire > 16 * 16384
    head = _read_head_over(raw, tls, incoming)
    assert b" 200 " in head.split(b"\r\n")[0]
    assert _says_close(head)


_HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def _key_updates_after(
    webhook: ThreadedWebhook, opened: list[socket.socket], updates: int, after: str = "an answer"
) -> tuple[socket.socket, ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO, int]:
    """A connection that, after its handshake (`after="the handshake"`), after one request answered
    and kept alive (`"an answer"`), or after that and the first byte of a next request
    (`"a request's first byte"`), sends `updates` TLS 1.3 KeyUpdate messages, each in a record padded
    to 16 KiB: bytes the TLS layer reads and keeps, and not one byte of HTTP. The raw socket, TLS
    object, its BIOs, and the bytes the KeyUpdates put on the wire."""
    answered = after != "the handshake"
    raw, tls, incoming, outgoing, _ = _send_in_padded_records(
        webhook, opened, webhook.tls.client_context(), _HEALTHZ if answered else b"", 1 if answered else 0
    )
    if answered:
        head = _read_head_over(raw, tls, incoming)
        assert not _says_close(head)
    if after == "a request's first byte":
        tls.write(_HEALTHZ[:1])
        raw.sendall(outgoing.read())
    libssl = ctypes.CDLL(_LIBSSL or "libssl.so.3")
    libssl.SSL_set_block_padding.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libssl.SSL_key_update.argtypes = [ctypes.c_void_p, ctypes.c_int]
    libssl.SSL_do_handshake.argtypes = [ctypes.c_void_p]
    # CPython's _ssl._SSLSocket holds a weak reference to its socket, then its SSL pointer.
    inner = tls._sslobj  # type: ignore[attr-defined]
    ssl_ptr = ctypes.c_void_p.from_address(id(inner) + object.__basicsize__ + 8).value
    assert libssl.SSL_set_block_padding(ssl_ptr, 16384) == 1
    for _ in range(updates):
        assert libssl.SSL_key_update(ssl_ptr, 0) == 1  # SSL_KEY_UPDATE_NOT_REQUESTED
        libssl.SSL_do_handshake(ssl_ptr)  # writes the KeyUpdate
    wire = outgoing.read()
    raw.sendall(wire)
    return raw, tls, incoming, outgoing, len(wire)


def _non_http_closed(webhook: ThreadedWebhook) -> int:
    listener = webhook.server.listener
    assert listener is not None
    return webhook.read(lambda: listener.non_http_closed)


@pytest.mark.parametrize("after", ["an answer", "the handshake", "a request's first byte"])
def test_padded_tls_messages_without_http_close_the_connection(
    webhook: ThreadedWebhook, opened: list[socket.socket], after: str
) -> None:
    # 256 KiB of KeyUpdates: a check finds them, and the next one closes the connection, long
    # before the 30 s request deadline that runs after the handshake or a request's first byte.
    raw, _, _, _, wire = _key_updates_after(webhook, opened, 16, after)
    assert wire > 16 * 16384
    raw.settimeout(BOUND)
    try:
        while raw.recv(65536):
            pass
    except TimeoutError:
        pytest.fail(f"a connection sent 256 KiB of padded TLS messages after {after} was kept open")
    except ConnectionResetError:
        pass
    assert _non_http_closed(webhook) == 1
    assert "kube_vgpu_webhook_non_http_bytes_closed_total 1.0" in webhook.metrics()


def test_a_large_review_sent_while_the_loop_is_blocked_is_answered(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    # Its bytes wait in the kernel, counted there and not yet read, while the loop is held past two
    # checks' times: they reach HTTP before a second check finds them, so the connection stays.
    sock = _connect(webhook, opened)
    sock.sendall(_request_of(2048, uid="first"))
    head, _ = _read_answer(sock)
    assert not _says_close(head)

    async def hold_the_loop() -> None:
        time.sleep(2.5 * NON_HTTP_CHECK_SECONDS)  # noqa: ASYNC251 (blocks the loop, as a long review would)

    held = webhook.submit(hold_the_loop())
    time.sleep(0.2)
    sock.sendall(_request_of(200 * 1024, uid="large"))
    head, answer = _read_answer(sock)
    held.result(timeout=BOUND)
    assert b" 200 " in head and _allowed(answer, "large") and _says_close(head)
    assert _non_http_closed(webhook) == 0


def test_padded_tls_messages_under_the_bound_leave_the_idle_connection_open(
    webhook: ThreadedWebhook, opened: list[socket.socket]
) -> None:
    # One padded KeyUpdate (about 16 KiB): under the bound, through several idle checks.
    raw, tls, incoming, outgoing, wire = _key_updates_after(webhook, opened, 1)
    assert 16384 < wire <= MAX_KEEP_ALIVE_READ_BYTES
    time.sleep(3.5 * NON_HTTP_CHECK_SECONDS)
    tls.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    raw.sendall(outgoing.read())
    head = _read_head_over(raw, tls, incoming)
    assert b" 200 " in head.split(b"\r\n")[0]
    assert _non_http_closed(webhook) == 0
