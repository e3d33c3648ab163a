"""Floods and framing slips over real TLS: pipelined requests that are never read, idle and
never-handshaking connections past the cap, and the HTTP/1.1 framing cases a hand-written server got
wrong. Throughout, a well-formed review from another client is answered (each wait has a ceiling only a
hang reaches: these tests assert what happens, never how fast).
"""

from __future__ import annotations

import gzip
import json
import logging
import socket
import ssl
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube_vgpu.httpedge.listener import MAX_FIELD_BYTES, MAX_HEADERS, ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.serving.server import MAX_BODY_BYTES
from tests.support.webhook import (
    A100,
    ThreadedWebhook,
    container,
    gpu_node,
    pod,
    review,
    write_tls,
)

# A ceiling on every wait that only a hang reaches, however loaded the machine.
BOUND = 30.0
_REVIEW = json.dumps(review(pod(container(memory=1000)))).encode()


def _head(path: str = "/mutate", length: int = len(_REVIEW), extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    limits = ConnectionLimits(max_connections=40, request_timeout_seconds=5, idle_timeout_seconds=60)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls"), limits=limits) as running:
        yield running


def _tls(webhook: ThreadedWebhook, timeout: float = BOUND) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=timeout)
    return webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")


def _answer(sock: ssl.SSLSocket) -> tuple[bytes, bytes]:
    """One whole answer: its head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed before the answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next((int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed in the middle of the answer"
        body += chunk
    return head, body


def _review_answered(webhook: ThreadedWebhook) -> bool:
    """A new connection's well-formed review gets its 200 answer (before BOUND: not locked out)."""
    try:
        with _tls(webhook) as sock:
            sock.sendall(_head() + _REVIEW)
            head, body = _answer(sock)
    except (OSError, AssertionError):
        return False
    return b" 200 " in head.split(b"\r\n")[0] and json.loads(body)["response"]["allowed"] is True


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _reviews_computed(webhook: ThreadedWebhook) -> int:
    registry = webhook.server.metrics.registry

    def count() -> float:
        return sum(
            registry.get_sample_value("kube_vgpu_webhook_reviews_total", {"outcome": outcome}) or 0.0
            for outcome in ("allowed", "denied")
        )

    return int(webhook.read(count))


def test_pipelined_requests_never_read_do_not_wedge_the_webhook(webhook: ThreadedWebhook) -> None:
    attackers = 20
    stop = threading.Event()
    socks = [_tls(webhook) for _ in range(attackers)]
    batch = (_head() + _REVIEW) * 50  # 50 pipelined reviews a write, answers never read
    sent = [0] * attackers  # reviews each attacker has written whole

    def flood(index: int, sock: ssl.SSLSocket) -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                sock.sendall(batch)
                sent[index] += 50
            except TimeoutError:
                continue  # the server stopped reading this connection: as it should
            except OSError:
                return

    rss_before = _rss_mib()
    threads = [threading.Thread(target=flood, args=(i, s), daemon=True) for i, s in enumerate(socks)]
    for thread in threads:
        thread.start()
    try:
        # Others are answered, again and again, while the flood goes on.
        for _ in range(5):
            time.sleep(0.3)
            assert _review_answered(webhook)
        # Each attacker holds a bounded queue: the server stops reading a connection whose answers
        # are not read, so it computes fewer reviews than were sent (how many fewer depends on the
        # kernel's socket buffers, which hold the answers), and memory stays bounded.
        computed = _reviews_computed(webhook)
        assert computed < sum(sent), (computed, sum(sent))
        assert _rss_mib() - rss_before < 100
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=BOUND)
        for sock in socks:  # a reset, as the attackers in the issue left
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
    listener = webhook.server.listener
    assert listener is not None
    deadline = time.monotonic() + BOUND
    while webhook.read(lambda: len(listener.connections)) > 0:
        assert time.monotonic() < deadline, "attackers' connections never closed"
        time.sleep(0.05)
    # Nothing more is computed for connections that are gone.
    settled = _reviews_computed(webhook)
    time.sleep(0.5)
    assert _reviews_computed(webhook) == settled
    assert _review_answered(webhook)


def test_shutdown_drains_in_time_while_pipelining_attackers_hold_connections(
    webhook: ThreadedWebhook,
) -> None:
    socks = [_tls(webhook) for _ in range(10)]
    for sock in socks:
        sock.settimeout(0.5)
        try:  # fill both directions: the server's answers back up, then its reading pauses
            for _ in range(20):
                sock.sendall((_head() + _REVIEW) * 50)
        except TimeoutError:
            pass
    assert _review_answered(webhook)
    stopping = webhook.submit(webhook.server.stop())
    # The shutdown timeout is 5 s (ThreadedWebhook); stop returns by then, attackers or not.
    stopping.result(timeout=5.0 + 5.0)
    listener = webhook.server.listener
    assert listener is not None and webhook.read(lambda: len(listener.connections)) == 0
    for sock in socks:
        sock.close()


@pytest.mark.parametrize("kind", ["idle TLS", "never handshaking"])
def test_a_flood_past_the_cap_never_locks_a_review_out(
    webhook: ThreadedWebhook, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    listener = webhook.server.listener
    assert listener is not None
    held: list[socket.socket] = []
    try:
        for _ in range(3):  # three waves, each the size of the cap
            for _ in range(40):
                if kind == "idle TLS":
                    held.append(_tls(webhook))
                else:
                    held.append(socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND))
            assert _review_answered(webhook)
        assert webhook.read(lambda: len(listener.connections)) <= 40
        assert webhook.read(lambda: listener.evicted) >= 80
        # Closing a connection in its handshake leaves nothing for the loop to trip over.
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        for sock in held:
            sock.close()


def _exchange(webhook: ThreadedWebhook, data: bytes) -> tuple[bytes, bytes]:
    with _tls(webhook) as sock:
        sock.sendall(data)
        return _answer(sock)


def test_head_is_answered_without_a_body_and_keep_alive_stays_framed(webhook: ThreadedWebhook) -> None:
    with _tls(webhook) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    first, _, rest = data.partition(b"\r\n\r\n")
    assert b" 200 " in first.split(b"\r\n")[0]
    # No body after the HEAD answer: the next bytes are the GET's status line.
    assert rest.startswith(b"HTTP/1.1 200"), rest[:60]
    assert rest.endswith(b'{"ok":true}')


def test_a_content_length_with_leading_zeros_means_its_value(webhook: ThreadedWebhook) -> None:
    length = "0" * 30 + str(len(_REVIEW))
    head = (
        f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    status, body = _exchange(webhook, head + _REVIEW)
    assert b" 200 " in status.split(b"\r\n")[0], (status, body)
    assert json.loads(body)["response"]["allowed"]


@pytest.mark.parametrize(
    ("hosts", "reason"),
    [("", "Missing 'Host' header"), ("Host: a\r\nHost: b\r\n", "Duplicate 'Host' header")],
)
def test_a_request_without_one_host_is_refused(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, hosts: str, reason: str
) -> None:
    caplog.set_level(logging.INFO)
    head = (
        f"POST /mutate HTTP/1.1\r\n{hosts}Content-Type: application/json\r\n"
        f"Content-Length: {len(_REVIEW)}\r\n\r\n"
    ).encode()
    status, body = _exchange(webhook, head + _REVIEW)
    assert b" 400 " in status.split(b"\r\n")[0]
    assert reason in json.loads(body)["error"]
    # One Host is served (the maximum accepted, next to the refusals).
    status, _ = _exchange(webhook, _head() + _REVIEW)
    assert b" 200 " in status.split(b"\r\n")[0]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_an_endless_chunk_extension_is_neither_kept_nor_allowed_past_the_deadline(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    # aiohttp's parser (llhttp) skips chunk extensions as they stream by without keeping them; what
    # bounds one that never ends is the request deadline (5 s here), from the request's first byte.
    caplog.set_level(logging.INFO)
    head = b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
    rss_before = _rss_mib()
    sent = 0
    with _tls(webhook) as sock:
        sock.sendall(head + b"%x;ext=" % len(_REVIEW))
        try:
            while sent < 1024 * 1024 * 1024:
                sock.sendall(b"x" * 65536)
                sent += 65536
                time.sleep(0.005)
        except OSError:
            pass  # the server closed it
    assert sent < 1024 * 1024 * 1024, "an endless chunk extension was never cut"
    assert sent > 1024 * 1024  # more than a 1 MiB extension went by, and none of it was kept:
    assert _rss_mib() - rss_before < 50
    listener = webhook.server.listener
    assert listener is not None and webhook.read(lambda: listener.expired) >= 1
    # A short extension is served.
    small = b"%x;ext=ok\r\n%s\r\n0\r\n\r\n" % (len(_REVIEW), _REVIEW)
    status, _ = _exchange(webhook, head + small)
    assert b" 200 " in status.split(b"\r\n")[0]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_expect_100_continue_is_answered_before_the_body_is_sent(webhook: ThreadedWebhook) -> None:
    with _tls(webhook) as sock:
        sock.sendall(_head(extra="Expect: 100-continue\r\n"))
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(4096)
            assert chunk, "closed before 100 Continue"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(_REVIEW)
        status, body = _answer(sock)
    assert b" 200 " in status.split(b"\r\n")[0] and json.loads(body)["response"]["allowed"]


def test_pipelined_reviews_are_answered_in_order(webhook: ThreadedWebhook) -> None:
    uids = [f"u{i}" for i in range(10)]
    data = b"".join(
        _head(length=len(body)) + body
        for body in (json.dumps(review(pod(container(memory=1000)), uid=u)).encode() for u in uids)
    )
    with _tls(webhook) as sock:
        sock.sendall(data)
        got = [json.loads(_answer(sock)[1])["response"]["uid"] for _ in uids]
    assert got == uids


def _post_with_headers(webhook: ThreadedWebhook, headers: list[str], body: bytes = _REVIEW) -> int:
    head = "POST /mutate HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers)
    head += f"Content-Length: {len(body)}\r\n\r\n"
    try:
        status, _ = _exchange(webhook, head.encode() + body)
    except (OSError, AssertionError):
        return 0  # closed without an answer
    return int(status.split(b" ")[1])


def test_header_size_and_count_are_bounded_at_aiohttps_limits(webhook: ThreadedWebhook) -> None:
    # A header value of MAX_FIELD_BYTES is read; one byte more is refused (aiohttp's C parser bounds
    # a header's name and its value, each, by max_field_size).
    at_limit = "X-Pad: " + "a" * MAX_FIELD_BYTES
    assert _post_with_headers(webhook, ["Host: localhost", at_limit]) == 200
    assert _post_with_headers(webhook, ["Host: localhost", at_limit + "a"]) == 400
    # MAX_HEADERS headers in all (Host and Content-Length count) are read; one more is refused.
    pads = [f"X-Pad-{i}: 1" for i in range(MAX_HEADERS - 2)]
    assert _post_with_headers(webhook, ["Host: localhost", *pads]) == 200
    assert _post_with_headers(webhook, ["Host: localhost", *pads, "X-One-More: 1"]) == 400


def test_a_compressed_body_is_bounded_after_decompression_on_both_sides(webhook: ThreadedWebhook) -> None:
    # Padding inside the JSON keeps it a review: MAX_BODY_BYTES decoded is read, one more byte is 413.
    padded = _REVIEW[:-1] + b" " * (MAX_BODY_BYTES - len(_REVIEW)) + b"}"
    assert len(padded) == MAX_BODY_BYTES
    for body, status in ((padded, 200), (padded[:-1] + b" }", 413)):
        data = gzip.compress(body)
        headers = ["Host: localhost", "Content-Encoding: gzip", "Content-Type: application/json"]
        assert _post_with_headers(webhook, headers, data) == status, len(body)


def test_a_kept_alive_connection_does_not_hold_its_last_body_while_idle(webhook: ThreadedWebhook) -> None:
    # Attack: a 3 kB gzip review that inflates to the 3 MiB body limit, answered, and the connection
    # kept open. aiohttp keeps the last request of a connection until the next one arrives, and
    # `read()` keeps the body on it: 1,000 such idle connections (1 MB each) put the webhook at
    # 1,377 MiB. The body is read without being kept on the request.
    inflated = b" " * (MAX_BODY_BYTES - len(_REVIEW) - 1) + _REVIEW  # just within the limit
    sent = gzip.compress(inflated)
    write = _head(length=len(sent), extra="Content-Encoding: gzip\r\n") + sent
    del inflated
    connections = 20
    socks: list[ssl.SSLSocket] = []
    # Live Python objects, not RSS: glibc may keep freed 3 MiB buffers in the heap (its mmap
    # threshold rises after such a free), which grows RSS on a busy machine without anything held.
    tracemalloc.start()
    live_before = tracemalloc.get_traced_memory()[0]
    rss_before = _rss_mib()
    try:
        for _ in range(connections):
            sock = _tls(webhook)
            socks.append(sock)
            sock.sendall(write)
            head, body = _answer(sock)
            assert b" 200 " in head.split(b"\r\n")[0] and json.loads(body)["response"]["allowed"] is True
        grown = (tracemalloc.get_traced_memory()[0] - live_before) / 2**20
        rss_grown = _rss_mib() - rss_before
    finally:
        tracemalloc.stop()
        for sock in socks:
            sock.close()
    held = connections * MAX_BODY_BYTES / 2**20  # 60 MiB, were the bodies kept
    assert grown < held / 4, f"{grown:.0f} MiB more live with {connections} idle connections"
    # And the process as a whole, loosely (what Python does not see: TLS and loop buffers; the
    # allocator may keep freed buffers, so the bound is the bodies' size, not a quarter of it).
    assert rss_grown < held, f"RSS {rss_grown:.0f} MiB more with {connections} idle connections"
