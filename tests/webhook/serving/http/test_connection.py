"""The webhook's HTTP/1.1 edge over real TLS, on both event loops it can run on (uvloop in production,
asyncio's where uvloop is not installed): framing, pipelining, limits and what a broken or hostile
client gets (SPEC §2.3). Every refusal is a 4xx with a JSON reason, never a traceback or a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import uvloop

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.serving.http.connection import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_PENDING,
    HttpConnection,
    HttpSettings,
)
from kube_vgpu.webhook.serving.http.message import Request, Response
from kube_vgpu.webhook.serving.server import MAX_BODY_BYTES
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

BOUND = 10.0
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.new_event_loop,
}


@pytest.fixture(params=sorted(LOOPS))
def webhook(
    request: pytest.FixtureRequest, apiserver: ApiServerStandin, tmp_path: Path
) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(
        kubeconfig, write_tls(tmp_path / "tls"), loop_factory=LOOPS[request.param]
    ) as running:
        try:
            yield running
        finally:
            _close_sockets()  # before the webhook stops, which waits for each TLS close exchange


_opened: list[socket.socket] = []


def _close_sockets() -> None:
    while _opened:
        _opened.pop().close()


def _connect(webhook: ThreadedWebhook) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    _opened.append(raw)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    _opened.append(sock)
    return sock


class _Stream:
    """Buffered reads from a socket (without `makefile`, whose reference keeps the socket open)."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self.sock = sock
        self.buffer = b""

    def _more(self) -> bool:
        chunk = self.sock.recv(65536)
        self.buffer += chunk
        return bool(chunk)

    def readline(self) -> bytes:
        while b"\n" not in self.buffer:
            if not self._more():
                break
        line, sep, self.buffer = self.buffer.partition(b"\n")
        return line + sep

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size and self._more():
            pass
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data


def _read_answer(stream: _Stream) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer from the stream: status, headers (lower-case names), body."""
    status_line = stream.readline()
    assert status_line, "connection closed before an answer"
    status = int(status_line.split(b" ")[1])
    headers: dict[str, str] = {}
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = stream.read(int(headers.get("content-length", "0")))
    return status, headers, body


def _post(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: localhost", "Content-Type: application/json", *headers]
    if not any(h.lower().startswith(("content-length", "transfer-encoding")) for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()


def _review(name: str, *, uid: str = "") -> bytes:
    doc = review(pod(container(memory=1000), name=name))
    if uid:
        doc["request"]["object"]["metadata"]["uid"] = uid
    doc["request"]["uid"] = f"review-{name}"
    return json.dumps(doc).encode()


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


def _uid(body: bytes) -> str:
    uid: str = json.loads(body)["response"]["uid"]
    return uid


def test_pipelined_requests_are_answered_in_order_whatever_each_waits_for(webhook: ThreadedWebhook) -> None:
    # /validate runs as a coroutine, /mutate and /healthz answer at once: the order is still the caller's.
    sock = _connect(webhook)
    sock.sendall(
        _post("/validate", _review("a", uid="uid-a"))
        + _get("/healthz")
        + _post("/mutate", _review("b"))
        + _post("/validate", _review("c", uid="uid-c"))
        + _post("/mutate", _review("d"))
    )
    stream = _Stream(sock)
    answers = [_read_answer(stream) for _ in range(5)]
    assert [status for status, _, _ in answers] == [200] * 5
    assert _uid(answers[0][2]) == "review-a"
    assert json.loads(answers[1][2]) == {"ok": True}
    assert [_uid(body) for _, _, body in answers[2:]] == ["review-b", "review-c", "review-d"]
    sock.close()


def test_a_flood_of_pipelined_reviews_is_answered_whole_and_in_order(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    count = 300
    sock.sendall(b"".join(_post("/mutate", _review(f"p{i}")) for i in range(count)))
    stream = _Stream(sock)
    uids = [_uid(_read_answer(stream)[2]) for _ in range(count)]
    assert uids == [f"review-p{i}" for i in range(count)]
    sock.close()
    drain = webhook.server.http.drain
    bodies = webhook.server.http.bodies
    deadline = time.monotonic() + BOUND
    while webhook.read(lambda: (drain.in_flight, bodies.held_bytes)) != (0, 0):
        assert time.monotonic() < deadline, "requests or body bytes still held"
        time.sleep(0.01)


def test_a_chunked_body_is_read(webhook: ThreadedWebhook) -> None:
    body = _review("chunked")
    chunks = [body[:100], body[100:1000], body[1000:]]
    encoded = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    sock = _connect(webhook)
    sock.sendall(_post("/mutate", encoded, "Transfer-Encoding: chunked"))
    status, _, answer = _read_answer(_Stream(sock))
    assert status == 200 and json.loads(answer)["response"]["allowed"]
    sock.close()


def test_a_chunked_body_over_the_limit_is_refused_with_413(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    piece = b" " * (1024 * 1024)
    sock.sendall(_post("/mutate", b"", "Transfer-Encoding: chunked"))
    for _ in range(4):
        sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
    sock.sendall(b"0\r\n\r\n")
    status, headers, answer = _read_answer(_Stream(sock))
    assert status == 413 and "limit" in json.loads(answer)["error"]
    assert headers["connection"] == "close"
    sock.close()


def test_expect_100_continue_gets_the_interim_answer_then_the_review(webhook: ThreadedWebhook) -> None:
    body = _review("expects")
    sock = _connect(webhook)
    sock.sendall(_post("/mutate", b"", "Expect: 100-continue", f"Content-Length: {len(body)}"))
    stream = _Stream(sock)
    assert stream.readline() == b"HTTP/1.1 100 Continue\r\n" and stream.readline() == b"\r\n"
    sock.sendall(body)
    status, _, answer = _read_answer(stream)
    assert status == 200 and _uid(answer) == "review-expects"
    sock.close()


def test_http_1_0_is_answered_and_the_connection_closed(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
    status, headers, _ = _read_answer(_Stream(sock))
    assert status == 200 and headers["connection"] == "close"
    assert closed_by_server(sock)


def test_unknown_paths_and_methods_get_404_and_405_naming_what_is_served(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(_get("/admin") + _get("/mutate") + _get("/healthz"))
    stream = _Stream(sock)
    status, _, body = _read_answer(stream)
    assert status == 404 and "/mutate" in json.loads(body)["error"]
    status, _, body = _read_answer(stream)
    assert status == 405 and "use POST" in json.loads(body)["error"]
    assert _read_answer(stream)[0] == 200  # nothing was wrong with the connection
    sock.close()


# (case, raw request, status, what the JSON reason says)
BROKEN_REQUESTS: list[tuple[str, bytes, int, str]] = [
    ("not HTTP", b"HELLO THERE\r\n\r\n", 400, "not HTTP/1.1"),
    ("binary noise", b"\x16\x03\x01\x00\xff" * 20, 400, "not HTTP/1.1"),
    (
        "Content-Length and Transfer-Encoding together (request smuggling)",
        _post("/mutate", b"0\r\n\r\n", "Content-Length: 5", "Transfer-Encoding: chunked"),
        400,
        "not HTTP/1.1",
    ),
    ("two Content-Lengths", _post("/mutate", b"{}", "Content-Length: 2", "Content-Length: 3"), 400, ""),
    ("a negative Content-Length", _post("/mutate", b"", "Content-Length: -1"), 400, ""),
    ("a header over the head limit", _post("/mutate", b"{}", "X-Big: " + "a" * MAX_HEAD_BYTES), 431, "head"),
    (
        "a head over the limit in many small headers",
        _post("/mutate", b"{}", *(f"X-{i}: {'v' * 1000}" for i in range(70))),
        431,
        "head",
    ),
    (
        "too many headers",
        _post("/mutate", b"{}", *(f"X-H{i}: v" for i in range(MAX_HEADERS + 1))),
        431,
        f"more than {MAX_HEADERS} headers",
    ),
    (
        "a URL over the head limit",
        b"GET /" + b"a" * (MAX_HEAD_BYTES + 10) + b" HTTP/1.1\r\n\r\n",
        431,
        "head",
    ),
    ("brotli", _post("/mutate", b"\x0b\x02\x80{}\x03", "Content-Encoding: br"), 415, "'br' is not served"),
    (
        "an upgrade to h2c",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        400,
        "upgrades",
    ),
    (
        "truncated gzip",
        _post("/mutate", gzip.compress(_review("z"))[:-20], "Content-Encoding: gzip"),
        400,
        "ends",
    ),
    (
        "gzip with garbage after its end",
        _post("/mutate", gzip.compress(_review("z")) + b"junk", "Content-Encoding: gzip"),
        400,
        "after its end",
    ),
]


@pytest.mark.parametrize("broken", BROKEN_REQUESTS, ids=[c[0] for c in BROKEN_REQUESTS])
def test_a_broken_request_gets_a_4xx_with_a_json_reason_and_the_connection_is_closed(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, broken: tuple[str, bytes, int, str]
) -> None:
    case, raw, status, reason = broken
    caplog.set_level(logging.INFO)
    sock = _connect(webhook)
    sock.sendall(raw)
    got, headers, body = _read_answer(_Stream(sock))
    assert got == status, (case, body)
    assert reason in json.loads(body)["error"], (case, body)
    assert headers["connection"] == "close"
    assert closed_by_server(sock)
    _no_tracebacks(caplog)
    metrics = _metrics(webhook)
    assert 'kube_vgpu_webhook_reviews_total{outcome="malformed"} 1.0' in metrics, case


def _metrics(webhook: ThreadedWebhook) -> str:
    sock = _connect(webhook)
    sock.sendall(_get("/metrics"))
    status, _, body = _read_answer(_Stream(sock))
    sock.close()
    assert status == 200
    return body.decode()


def test_answers_owed_before_a_broken_request_still_go_out_first(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(_post("/validate", _review("first", uid="u1")) + b"NOT HTTP AT ALL\r\n\r\n")
    stream = _Stream(sock)
    status, _, body = _read_answer(stream)
    assert status == 200 and _uid(body) == "review-first"
    status, headers, _ = _read_answer(stream)
    assert status == 400 and headers["connection"] == "close"
    assert closed_by_server(sock)


def test_a_client_leaving_mid_review_holds_nothing(webhook: ThreadedWebhook) -> None:
    for _ in range(20):
        sock = _connect(webhook)
        body = _review("gone", uid="u-gone")
        # Two whole reviews and half of a third, then the client goes away without reading.
        sock.sendall(_post("/validate", body) + _post("/mutate", body) + _post("/mutate", body)[:-500])
        sock.close()
    drain = webhook.server.http.drain
    bodies = webhook.server.http.bodies
    listener = webhook.server.listener
    assert listener is not None
    deadline = time.monotonic() + BOUND
    while webhook.read(lambda: (drain.in_flight, bodies.held_bytes, len(listener.connections))) != (0, 0, 0):
        assert time.monotonic() < deadline, "a connection, request or body bytes still held"
        time.sleep(0.02)


def test_keep_alive_serves_many_reviews_on_one_connection(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    stream = _Stream(sock)
    for i in range(50):
        sock.sendall(_post("/mutate", _review(f"k{i}")))
        status, headers, body = _read_answer(stream)
        assert status == 200 and "connection" not in headers and _uid(body) == f"review-k{i}"
    sock.close()


def _answers(sock: ssl.SSLSocket, count: int) -> list[tuple[int, dict[str, str], Any]]:
    stream = _Stream(sock)
    out = []
    for _ in range(count):
        status, headers, body = _read_answer(stream)
        out.append((status, headers, json.loads(body)))
    return out


def test_a_query_string_does_not_change_the_route(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(_post("/mutate?timeout=10s", _review("q")))
    ((status, _, answer),) = _answers(sock, 1)
    assert status == 200 and answer["response"]["uid"] == "review-q"
    sock.close()


# -- found by an adversarial review of this edge --------------------------------------------------


def test_a_client_that_never_reads_cannot_make_the_server_buffer_answers_without_bound(
    webhook: ThreadedWebhook,
) -> None:
    sock = _connect(webhook)
    sock.settimeout(3.0)
    batch = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" * 200
    sent = 0
    with contextlib.suppress(TimeoutError):  # the server stopped reading: the client's sends block
        while sent < 40 * 1024 * 1024:
            sock.sendall(batch)
            sent += len(batch)
    listener = webhook.server.listener
    assert listener is not None
    buffered = webhook.read(
        lambda: sum(c.transport.get_write_buffer_size() for c in listener.connections if c.transport)
    )
    assert sent < 40 * 1024 * 1024 and buffered < 4 * 1024 * 1024, (sent, buffered)


def test_a_framing_error_in_a_body_being_dropped_gets_no_second_answer(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    stream = _Stream(sock)
    status, headers, _ = _read_answer(stream)
    assert status == 404 and headers["connection"] == "close"
    sock.settimeout(2.0)
    for _ in range(3):
        try:
            sock.sendall(b"zz-not-a-chunk-size\r\n")
        except OSError:
            break
        time.sleep(0.1)
    extra = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            extra += chunk
    assert not extra, extra


def test_requests_without_a_body_reserve_nothing_of_the_body_budget(webhook: ThreadedWebhook) -> None:
    # Behind a review that awaits (its reading paused), 30 body-less requests all parsed at once.
    sock = _connect(webhook)
    sock.sendall(_post("/validate", _review("v", uid="u-v")) + _get("/healthz") * 30)
    stream = _Stream(sock)
    assert [_read_answer(stream)[0] for _ in range(31)] == [200] * 31


def test_repeated_header_names_count_towards_the_header_limit(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X: v\r\n" * 5000 + b"\r\n")
    assert _read_answer(_Stream(sock))[0] == 431


def test_an_unfinished_header_over_the_head_limit_is_refused_at_once(webhook: ThreadedWebhook) -> None:
    sock = _connect(webhook)
    # One header line of 200 kB that never ends: the parser holds it, whole chunks are counted.
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 200_000)
    sock.settimeout(3.0)
    assert _read_answer(_Stream(sock))[0] == 431


def test_a_request_pipelined_after_connection_close_is_not_read(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sock = _connect(webhook)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" + _get("/healthz"))
    status, headers, _ = _read_answer(_Stream(sock))
    assert status == 200 and headers["connection"] == "close"
    assert closed_by_server(sock)
    assert not [r for r in caplog.records if "http_bad_request" in r.getMessage()]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_tls_half_close_after_a_request_logs_no_warning(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    # TLS has no half-close: after the client's close_notify the connection ends. The answer may be
    # lost (the API server never does this), but nothing is logged above INFO.
    caplog.set_level(logging.INFO)
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    _opened.append(raw)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = webhook.tls.client_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            incoming.write(raw.recv(65536))
    raw.sendall(outgoing.read())
    tls.write(_post(path, _review("h", uid="u-h")))
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.unwrap()  # close_notify
    raw.sendall(outgoing.read())
    with contextlib.suppress(OSError):
        while raw.recv(65536):
            pass
    time.sleep(0.1)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_random_abandoned_traffic_leaks_nothing(webhook: ThreadedWebhook) -> None:
    pick = random.Random(7)
    body = _review("r", uid="u-r")
    pieces = [
        _post("/validate", body),
        _post("/mutate", body),
        _get("/healthz"),
        _get("/nope"),
        _post("/nope", body),
        _post("/mutate", body, "Content-Length: 99999999"),
        _post("/mutate", gzip.compress(body), "Content-Encoding: gzip"),
        _post("/mutate", body, "Content-Encoding: br"),
        b"GARBAGE\r\n\r\n",
        _post("/mutate", b"", "Transfer-Encoding: chunked") + b"5\r\nabc",
        _post("/validate", b"", "Expect: 100-continue", f"Content-Length: {len(body)}"),
        b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    ]
    for _ in range(150):
        sock = _connect(webhook)
        data = b"".join(pick.choice(pieces) for _ in range(pick.randint(1, 6)))
        with contextlib.suppress(OSError):
            sock.sendall(data[: pick.randint(1, len(data))])
            if pick.random() < 0.5:
                sock.settimeout(0.05)
                sock.recv(100)
        sock.close()
    drain, bodies, listener = webhook.server.http.drain, webhook.server.http.bodies, webhook.server.listener
    assert listener is not None
    deadline = time.monotonic() + 15
    while (held := webhook.read(lambda: (drain.in_flight, bodies.held_bytes, len(listener.connections)))) != (
        0,
        0,
        0,
    ):
        assert time.monotonic() < deadline, held
        time.sleep(0.05)


class _RecordingTransport:
    """Just enough of a transport to drive one connection in-process and see its reading paused."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def close(self) -> None:
        pass


class _Owner:
    def forget(self, connection: object) -> None:
        pass

    def count_expired(self) -> None:
        pass


class _HealthOnly:
    def route(self, method: str, path: str) -> Callable[[Request], Response]:
        return lambda request: Response(200, b"{}")


async def test_pipelined_requests_read_ahead_of_their_answers_are_bounded() -> None:
    # The loop may read one connection many times in a turn before any answer is given: reading
    # pauses once MAX_PENDING requests wait, and resumes when they are answered.
    loop = asyncio.get_running_loop()
    connection = HttpConnection(_HealthOnly(), HttpSettings(10, 100, 1 << 20), _Owner(), loop.time())
    transport = _RecordingTransport()
    connection.connection_made(cast(asyncio.Transport, transport))
    connection.data_received(_get("/healthz") * (MAX_PENDING + 5))
    assert transport.paused and not transport.written
    await asyncio.sleep(0)  # the loop's next turn answers them
    assert len(transport.written) == MAX_PENDING + 5 and not transport.paused
    connection.connection_lost(None)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_refused(
    webhook: ThreadedWebhook, chunked: bool
) -> None:
    doc = _review("at-the-limit")
    # JSON allows trailing white space: the same review, padded to the limit.
    at_limit = doc + b" " * (MAX_BODY_BYTES - len(doc))
    for body, expected in ((at_limit, 200), (at_limit + b" ", 413)):
        sock = _connect(webhook)
        if chunked:
            half = len(body) // 2
            pieces = [body[:half], body[half:]]
            encoded = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
            sock.sendall(_post("/mutate", encoded, "Transfer-Encoding: chunked"))
        else:
            sock.sendall(_post("/mutate", body))
        status, _, answer = _read_answer(_Stream(sock))
        assert status == expected, answer[:200]
        if expected == 200:
            assert json.loads(answer)["response"]["allowed"]
        else:
            assert f"{MAX_BODY_BYTES}-byte limit" in json.loads(answer)["error"]
        sock.close()
