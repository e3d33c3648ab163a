"""The listener over real TLS, in front of the webhook: a request that does not arrive within its
deadline is closed, idle keep-alive connections live until the idle timeout, open connections are
capped (at the cap the connection longest without progress is closed, never the newcomer), with
`--client-ca-file` only callers holding a client certificate from that CA are served; floods of
pipelined, idle and never-handshaking connections never lock a review out; the HTTP/1.1 framing cases
a hand-written server got wrong; and shutdown drains within its timeout.

Each wait has a ceiling only a hang reaches: these tests assert what happens, never how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kube_vgpu.certs.issue import Issued, issue_ca
from kube_vgpu.cli.main import build_parser
from kube_vgpu.httpedge.listener import MAX_FIELD_BYTES, MAX_HEADERS, ConnectionLimits, Listener
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cli import run
from kube_vgpu.webhook.reviews import Readiness
from tests.support.timeouts import HANG_S
from tests.support.webhook import (
    ThreadedWebhook,
    TlsFiles,
    closed_by_server,
    container,
    exchange,
    no_tracebacks,
    pod,
    post,
    read_answer,
    request_head,
    review,
    rss_mib,
    serve_one_gpu,
    status_of,
    wait_for,
    write_tls,
)

STRICT_DEADLINE = 1.0  # the request deadline of the `strict` webhook
_REVIEW = json.dumps(review(pod(container(memory=1000)))).encode()
_HEALTHZ = request_head("/healthz", method="GET")
JSON_BODY = "Content-Type: application/json\r\n"


def _review_head(length: int = len(_REVIEW), extra: str = "") -> bytes:
    return request_head("/mutate", length, extra=JSON_BODY + extra)


def _serve(apiserver: ApiServerStandin, tmp_path: Path, **limits: Any) -> ThreadedWebhook:
    return serve_one_gpu(apiserver, tmp_path, limits=ConnectionLimits(**limits))


@pytest.fixture
def strict(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    """A webhook with a short request deadline and a long idle timeout."""
    # Short enough to wait out, long enough that a request on a loaded machine is never cut.
    limits = {"max_connections": 50, "request_timeout_seconds": STRICT_DEADLINE, "idle_timeout_seconds": 60}
    with _serve(apiserver, tmp_path, **limits) as running:
        yield running


@pytest.fixture
def capped(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    """A webhook that keeps at most three connections open."""
    with _serve(
        apiserver, tmp_path, max_connections=3, request_timeout_seconds=30, idle_timeout_seconds=60
    ) as running:
        yield running


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    """A webhook with a cap of 40 connections and a 5 s request deadline, for the floods."""
    with _serve(
        apiserver, tmp_path, max_connections=40, request_timeout_seconds=5, idle_timeout_seconds=60
    ) as running:
        yield running


def _listener_of(webhook: ThreadedWebhook) -> Listener:
    listener = webhook.server.listener
    assert listener is not None
    return listener


def _open(webhook: ThreadedWebhook) -> int:
    listener = _listener_of(webhook)
    return webhook.read(lambda: len(listener.connections))


def _expired(webhook: ThreadedWebhook) -> int:
    listener = _listener_of(webhook)
    return webhook.read(lambda: listener.expired)


def _evicted(webhook: ThreadedWebhook) -> int:
    listener = _listener_of(webhook)
    return webhook.read(lambda: listener.evicted)


def _answered_200(sock: ssl.SSLSocket) -> bool:
    return status_of(read_answer(sock)[0]) == 200


def _served(connect: Callable[[], ssl.SSLSocket]) -> bool:
    """Whether a connection made by `connect` gets an answer to a request."""
    try:
        sock = connect()
        sock.sendall(_HEALTHZ)
        return _answered_200(sock)
    except (ssl.SSLError, ConnectionError, AssertionError):
        return False


def _review_answered(webhook: ThreadedWebhook) -> bool:
    """A new connection's well-formed review gets its 200 answer (not locked out)."""
    try:
        status, _, body = exchange(webhook, _review_head() + _REVIEW)
    except (OSError, AssertionError):
        return False
    return status == 200 and json.loads(body)["response"]["allowed"] is True


def _closed_within_deadlines(sock: ssl.SSLSocket) -> bool:
    """Whether the server closes `sock` within five request deadlines of `strict` (well under its
    60 s idle timeout, so only the request deadline can have closed it)."""
    sock.settimeout(5 * STRICT_DEADLINE)
    return closed_by_server(sock)


# --- the request deadline and the idle timeout ------------------------------------------------------


@pytest.mark.parametrize("sent", [b"", _HEALTHZ[:20]], ids=["nothing", "a stalled head"])
def test_a_connection_whose_request_does_not_arrive_is_closed(strict: ThreadedWebhook, sent: bytes) -> None:
    sock = strict.open_tls()
    sock.sendall(sent)
    assert closed_by_server(sock)


def test_a_connection_that_never_starts_tls_is_closed_and_frees_its_slot(strict: ThreadedWebhook) -> None:
    raw = strict.open_raw()
    raw.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, and nothing more
    try:
        closed = raw.recv(1) == b""
    except ConnectionResetError:
        closed = True
    assert closed
    wait_for(lambda: _open(strict) == 0, "the slot to be freed")


def test_a_stalled_body_is_closed_and_counted(
    strict: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sock = strict.open_tls()
    sock.sendall(request_head("/mutate", len(_REVIEW)) + _REVIEW[: len(_REVIEW) // 2])
    assert closed_by_server(sock)
    assert _expired(strict) >= 1
    assert "kube_vgpu_webhook_request_deadline_expired_total" in strict.metrics()
    assert any("event=request_deadline" in r.getMessage() for r in caplog.records)
    no_tracebacks(caplog)


def test_an_idle_keep_alive_connection_outlives_the_request_deadline(strict: ThreadedWebhook) -> None:
    sock = strict.open_tls()
    sock.sendall(_HEALTHZ)
    assert _answered_200(sock)
    # Several request deadlines pass while the connection is idle; the idle timeout is 60 s.
    time.sleep(2.5 * STRICT_DEADLINE)
    sock.sendall(_HEALTHZ)
    assert _answered_200(sock)


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    with _serve(apiserver, tmp_path, request_timeout_seconds=30, idle_timeout_seconds=0.5) as webhook:
        sock = webhook.open_tls()
        sock.sendall(_HEALTHZ)
        assert _answered_200(sock)
        assert closed_by_server(sock)


def test_a_head_trickled_byte_by_byte_is_cut_at_the_deadline(strict: ThreadedWebhook) -> None:
    # Each byte comes well within the deadline of the one before: only a deadline that runs from
    # the request's first byte (not an idle timer) ends it. The head would take 10 deadlines.
    sock = strict.open_tls()
    pause = STRICT_DEADLINE / 4
    sent = 0
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        for byte in _HEALTHZ[:40]:
            sock.sendall(bytes([byte]))
            sent += 1
            time.sleep(pause)
        sock.settimeout(pause)
        sock.recv(1)  # the server has not closed it: this read times out
        raise ssl.SSLError("still open")
    assert sent < 40 or closed_by_server(sock)
    assert _expired(strict) >= 1


def test_a_body_begun_in_the_same_read_as_the_previous_answer_is_cut_at_the_deadline(
    strict: ThreadedWebhook,
) -> None:
    # Attack: one write holds a whole request and the head plus half the body of the next; the next
    # request's bytes arrived while the first was still in progress, so no deadline started with them.
    # Its handler then waits for the rest of the body (holding its share of the body budget) until
    # the idle timeout, not the request deadline.
    sock = strict.open_tls()
    sock.sendall(_HEALTHZ + request_head("/mutate", len(_REVIEW)) + _REVIEW[: len(_REVIEW) // 2])
    assert _answered_200(sock)  # the first request is answered
    assert _closed_within_deadlines(sock)
    assert _expired(strict) >= 1


def test_a_request_begun_late_in_an_earlier_deadline_gets_a_whole_deadline_of_its_own(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # The connection's first deadline runs from its accept; a request answered within it stops it,
    # and the next request's deadline runs from that request's first byte, however close the first
    # deadline was to passing when it began.
    deadline = 2.0
    with _serve(
        apiserver, tmp_path, max_connections=50, request_timeout_seconds=deadline, idle_timeout_seconds=60
    ) as webhook:
        sock = webhook.open_tls()
        accepted = time.monotonic()  # a little after the accept: the first deadline ends before +2.0
        sock.sendall(_HEALTHZ)
        assert _answered_200(sock)
        time.sleep(max(0.0, accepted + 0.7 * deadline - time.monotonic()))
        sock.sendall(_HEALTHZ[:20])  # begun at +1.4: its own deadline ends at +3.4
        time.sleep(max(0.0, accepted + 1.3 * deadline - time.monotonic()))  # +2.6: the first one passed
        sock.sendall(_HEALTHZ[20:])
        assert _answered_200(sock)
        assert _expired(webhook) == 0


@pytest.mark.parametrize(("path", "status"), [("/nope", 404), ("/mutate", 405)])
def test_an_idle_connection_after_a_request_answered_unread_outlives_the_request_deadline(
    strict: ThreadedWebhook, path: str, status: int
) -> None:
    # A 404 or 405 without a body is answered without `request_complete`: its deadline kept running,
    # closed the idle keep-alive connection a deadline after the request began, and cut short the
    # next request on it (whose deadline never started: one was running).
    sock = strict.open_tls()
    sock.sendall(request_head(path, method="GET"))
    assert status_of(read_answer(sock)[0]) == status
    time.sleep(1.5 * STRICT_DEADLINE)
    sock.sendall(_HEALTHZ)
    assert _answered_200(sock)
    assert _expired(strict) == 0


@pytest.mark.parametrize(
    "head",
    [
        request_head("/nope", 100000),
        request_head("/mutate", 100000, method="GET"),
        request_head("/mutate", 100000, extra="Content-Encoding: br\r\n"),
    ],
    ids=["no such path", "wrong method", "unserved encoding"],
)
def test_a_request_answered_unread_with_its_body_stalled_is_closed(
    strict: ThreadedWebhook, head: bytes
) -> None:
    # The other side: its deadline ends with its answer, and the answer closes the connection
    # (aiohttp reads the rest of the body for at most its lingering time first).
    sock = strict.open_tls()
    sock.sendall(head + b"x" * 10)
    assert 400 <= status_of(read_answer(sock)[0]) < 500
    assert _closed_within_deadlines(sock), head


def _hold_reviews(webhook: ThreadedWebhook) -> Callable[[], None]:
    """Make /mutate wait for the cache (its request whole, its handler busy) until the returned
    function is called."""

    async def install() -> asyncio.Event:
        gate = asyncio.Event()

        async def wait_synced() -> None:
            await gate.wait()

        app = webhook.server.app
        waiting = Readiness(synced=lambda: False, ready=lambda: False, wait_synced=wait_synced)
        app.services = dataclasses.replace(app.services, readiness=waiting)
        return gate

    gate = webhook.call(install())

    async def release() -> None:
        gate.set()

    return lambda: webhook.call(release())


def _next_head_begun_while_a_review_is_computed(
    webhook: ThreadedWebhook,
) -> tuple[ssl.SSLSocket, Callable[[], None]]:
    """A connection whose review is being computed (held until the returned function is called) and
    on which the first bytes of a next request have arrived."""
    release = _hold_reviews(webhook)
    conns = _listener_of(webhook).connections
    sock = webhook.open_tls()
    first = request_head("/mutate", len(_REVIEW)) + _REVIEW
    sock.sendall(first)
    wait_for(lambda: webhook.read(lambda: any(c.busy for c in conns)), "the review to be computed")
    sock.sendall(_HEALTHZ[:20])
    arrived = lambda: any(c.received_bytes > len(first) for c in conns)  # noqa: E731
    wait_for(lambda: webhook.read(arrived), "the next head's bytes")
    return sock, release


def test_a_head_begun_while_the_previous_review_is_computed_lives_until_the_idle_timeout(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # A head pipelined behind a review and then stalled gets no request deadline (the API server never
    # pipelines; the cap may still close it like an idle connection): the idle timeout ends it.
    deadline, idle = 1.0, 6.0
    with _serve(apiserver, tmp_path, request_timeout_seconds=deadline, idle_timeout_seconds=idle) as webhook:
        sock, release = _next_head_begun_while_a_review_is_computed(webhook)
        release()
        assert _answered_200(sock)
        sock.settimeout(3 * deadline)  # a deadline would have closed it by now; the idle timeout not
        assert not closed_by_server(sock)
        sock.settimeout(HANG_S)
        assert closed_by_server(sock)
        assert _expired(webhook) == 0


def test_a_stalled_head_after_many_kept_alive_requests_is_cut_at_the_deadline(
    strict: ThreadedWebhook,
) -> None:
    # Fifty requests within one deadline, then a stalled head: its own deadline runs from its first bytes.
    sock = strict.open_tls()
    for _ in range(50):
        sock.sendall(_HEALTHZ)
        assert _answered_200(sock)
    time.sleep(0.5 * STRICT_DEADLINE)
    sock.sendall(_HEALTHZ[:20])
    assert _closed_within_deadlines(sock)
    assert _expired(strict) == 1


def test_a_connection_gone_while_its_review_was_computed_is_not_counted_as_a_deadline(
    strict: ThreadedWebhook,
) -> None:
    # The caller began a next request while its review was computed, then went away; the answer comes
    # after the connection is gone. No deadline may start for the request that will never arrive: it
    # would count the connection as expired (an alert for slow callers) and keep its slot a deadline longer.
    sock, release = _next_head_begun_while_a_review_is_computed(strict)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    sock.close()
    wait_for(lambda: _open(strict) == 0, "the connection to be gone")
    release()
    time.sleep(2 * STRICT_DEADLINE)
    assert _expired(strict) == 0
    assert _open(strict) == 0  # the answer did not put the gone connection back


# --- the connection cap -----------------------------------------------------------------------------


def test_at_the_cap_the_connection_longest_without_progress_is_closed(capped: ThreadedWebhook) -> None:
    answered = capped.open_tls()
    silent = capped.open_tls()
    raw = capped.open_raw()  # never starts TLS
    wait_for(lambda: _open(capped) == 3, "three open connections")
    answered.sendall(_HEALTHZ)  # progress: it goes to the back of the line
    assert _answered_200(answered)
    # The newcomer is served; the silent TLS connection, longest without progress, makes room.
    assert _served(capped.open_tls)
    assert closed_by_server(silent)
    # The next newcomer closes the connection that never started TLS.
    assert _served(capped.open_tls)
    with contextlib.suppress(ConnectionResetError):
        assert raw.recv(1) == b""
    assert _evicted(capped) == 2
    # The connection that made progress was never closed, and the count never passed the cap.
    answered.sendall(_HEALTHZ)
    assert _answered_200(answered)
    assert _open(capped) <= 3
    assert "kube_vgpu_webhook_connections_evicted_total 2.0" in capped.metrics()


def test_at_the_cap_a_request_arriving_on_a_long_idle_connection_is_not_the_one_closed(
    capped: ThreadedWebhook,
) -> None:
    # Attack: fill the cap with silent connections and keep opening more while the API server's
    # keep-alive connection, idle for a while, sends its next review. That connection's last
    # progress was its previous answer, older than any silent newcomer's accept, so the review
    # in progress on it was the one closed to make room.
    listener = _listener_of(capped)
    keep_alive = capped.open_tls()
    keep_alive.sendall(_HEALTHZ)
    assert _answered_200(keep_alive)
    time.sleep(0.2)  # idle a while: the silent connections below are accepted after its answer
    silent = [capped.open_tls() for _ in range(2)]
    wait_for(lambda: _open(capped) == 3, "three open connections")
    keep_alive.sendall(request_head("/mutate", len(_REVIEW)) + _REVIEW[:100])  # a review in progress
    wait_for(
        lambda: capped.read(lambda: any(conn.handling for conn in listener.connections)),
        "the review's head to arrive",
    )
    newcomer = capped.open_tls()  # at the cap: someone is closed
    assert closed_by_server(silent[0])  # the silent connection accepted first
    keep_alive.sendall(_REVIEW[100:])
    assert _answered_200(keep_alive)
    assert _served(lambda: newcomer)
    assert _evicted(capped) == 1


@pytest.mark.parametrize("kind", ["idle TLS", "never handshaking"])
def test_a_flood_past_the_cap_never_locks_a_review_out(
    webhook: ThreadedWebhook, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    for _ in range(3):  # three waves, each the size of the cap
        for _ in range(40):
            if kind == "idle TLS":
                webhook.open_tls()
            else:
                webhook.open_raw()
        assert _review_answered(webhook)
    assert _open(webhook) <= 40
    assert _evicted(webhook) >= 80
    # Closing a connection in its handshake leaves nothing for the loop to trip over.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    webhook.close_connections()


# --- client certificates and the limits' flags --------------------------------------------------------


def _issue_client(ca: Issued, name: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.private_key, hashes.SHA256())
    )
    return Issued.from_parsed(cert, key)


def _client_context(tls: TlsFiles, client: Issued | None, directory: Path) -> ssl.SSLContext:
    context = tls.client_context()
    if client is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "client.crt").write_bytes(client.cert_pem)
        (directory / "client.key").write_bytes(client.key_pem)
        context.load_cert_chain(directory / "client.crt", directory / "client.key")
    return context


def test_client_ca_file_admits_only_callers_with_its_certificates(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    client_ca = issue_ca("apiserver-client-ca", 1)
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    tls = write_tls(tmp_path / "tls")
    with serve_one_gpu(apiserver, tmp_path, tls=tls, client_ca_file=tmp_path / "client-ca.crt") as webhook:
        trusted = _client_context(tls, _issue_client(client_ca, "kube-apiserver"), tmp_path / "a")
        assert _served(lambda: webhook.open_tls(trusted))

        stranger = _issue_client(issue_ca("another-ca", 1), "intruder")
        for name, context in (
            ("no client certificate", _client_context(tls, None, tmp_path / "b")),
            ("a certificate from another CA", _client_context(tls, stranger, tmp_path / "c")),
        ):
            # TLS 1.3 reports the refusal on the first read after the handshake.
            assert not _served(lambda: webhook.open_tls(context)), name  # noqa: B023


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--max-connections", "0", "max connections must be at least 1, got 0"),
        ("--request-timeout", "0", "timeouts must be positive"),
        ("--idle-timeout", "-1", "timeouts must be positive"),
    ],
)
def test_bad_connection_bounds_are_refused_at_start(
    caplog: pytest.LogCaptureFixture, flag: str, value: str, message: str
) -> None:
    args = build_parser().parse_args(
        ["webhook", "--tls-cert-file", "tls.crt", "--tls-key-file", "tls.key", flag, value]
    )
    assert run(args) == 2
    assert any(message in r.getMessage() for r in caplog.records)


# --- pipelining and framing -------------------------------------------------------------------------


def test_reviews_still_work_through_the_guarded_listener(strict: ThreadedWebhook) -> None:
    conn = strict.connect()
    for i in range(5):
        status, answer = post(conn, review(pod(container(memory=1000)), uid=f"u{i}"))
        assert status == 200 and answer["response"]["uid"] == f"u{i}"


def test_pipelined_reviews_are_answered_in_order(webhook: ThreadedWebhook) -> None:
    uids = [f"u{i}" for i in range(10)]
    bodies = [json.dumps(review(pod(container(memory=1000)), uid=u)).encode() for u in uids]
    with webhook.open_tls() as sock:
        sock.sendall(b"".join(_review_head(len(body)) + body for body in bodies))
        got = [json.loads(read_answer(sock)[1])["response"]["uid"] for _ in uids]
    assert got == uids


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
    socks = [webhook.open_tls() for _ in range(attackers)]
    batch = (_review_head() + _REVIEW) * 50  # 50 pipelined reviews a write, answers never read
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

    rss_before = rss_mib()
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
        assert rss_mib() - rss_before < 100
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=HANG_S)
        for sock in socks:  # a reset, as the attackers in the issue left
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
    wait_for(lambda: _open(webhook) == 0, "the attackers' connections closed")
    # Nothing more is computed for connections that are gone.
    settled = _reviews_computed(webhook)
    time.sleep(0.5)
    assert _reviews_computed(webhook) == settled
    assert _review_answered(webhook)


def test_head_is_answered_without_a_body_and_keep_alive_stays_framed(webhook: ThreadedWebhook) -> None:
    with webhook.open_tls() as sock:
        sock.sendall(request_head("/healthz", method="HEAD"))
        sock.sendall(_HEALTHZ)
        data = b""
        while data.count(b"HTTP/1.1 200") < 2 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
    first, _, rest = data.partition(b"\r\n\r\n")
    assert status_of(first) == 200
    # No body after the HEAD answer: the next bytes are the GET's status line.
    assert rest.startswith(b"HTTP/1.1 200"), rest[:60]
    assert rest.endswith(b'{"ok":true}')


def test_a_content_length_with_leading_zeros_means_its_value(webhook: ThreadedWebhook) -> None:
    head = request_head("/mutate", extra=f"{JSON_BODY}Content-Length: {'0' * 30}{len(_REVIEW)}\r\n")
    status, raw_head, body = exchange(webhook, head + _REVIEW)
    assert status == 200, (raw_head, body)
    assert json.loads(body)["response"]["allowed"]


@pytest.mark.parametrize(
    ("hosts", "reason"),
    [("", "Missing 'Host' header"), ("Host: a\r\nHost: b\r\n", "Duplicate 'Host' header")],
)
def test_a_request_without_one_host_is_refused(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, hosts: str, reason: str
) -> None:
    caplog.set_level(logging.INFO)
    head = f"POST /mutate HTTP/1.1\r\n{hosts}{JSON_BODY}Content-Length: {len(_REVIEW)}\r\n\r\n"
    status, _, body = exchange(webhook, head.encode() + _REVIEW)
    assert status == 400
    assert reason in json.loads(body)["error"]
    # One Host is served (the maximum accepted, next to the refusals).
    assert exchange(webhook, _review_head() + _REVIEW)[0] == 200
    no_tracebacks(caplog)


def _post_with_headers(webhook: ThreadedWebhook, headers: list[str]) -> int:
    head = "POST /mutate HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers)
    head += f"Content-Length: {len(_REVIEW)}\r\n\r\n"
    try:
        return exchange(webhook, head.encode() + _REVIEW)[0]
    except (OSError, AssertionError):
        return 0  # closed without an answer


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


def test_an_endless_chunk_extension_is_neither_kept_nor_allowed_past_the_deadline(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    # aiohttp's parser (llhttp) skips chunk extensions as they stream by without keeping them; what
    # bounds one that never ends is the request deadline (5 s here), from the request's first byte.
    caplog.set_level(logging.INFO)
    head = request_head("/mutate", extra="Transfer-Encoding: chunked\r\n")
    rss_before = rss_mib()
    sent = 0
    with webhook.open_tls() as sock:
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
    assert rss_mib() - rss_before < 50
    assert _expired(webhook) >= 1
    # A short extension is served.
    small = b"%x;ext=ok\r\n%s\r\n0\r\n\r\n" % (len(_REVIEW), _REVIEW)
    assert exchange(webhook, head + small)[0] == 200
    no_tracebacks(caplog)


# --- shutdown ---------------------------------------------------------------------------------------


def test_shutdown_drains_in_time_while_pipelining_attackers_hold_connections(
    webhook: ThreadedWebhook,
) -> None:
    for _ in range(10):
        sock = webhook.open_tls()
        sock.settimeout(0.5)
        try:  # fill both directions: the server's answers back up, then its reading pauses
            for _ in range(20):
                sock.sendall((_review_head() + _REVIEW) * 50)
        except TimeoutError:
            pass
    assert _review_answered(webhook)
    stopping = webhook.submit(webhook.server.stop())
    # The shutdown timeout is 5 s (ThreadedWebhook); stop returns by then, attackers or not.
    stopping.result(timeout=5.0 + 5.0)
    assert _open(webhook) == 0


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
    return closed_by_server(sock)


def test_shutdown_refuses_closes_idle_finishes_in_flight_and_aborts_the_stalled(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # Once `stop` begins, new connections are refused and idle keep-alive connections closed; a review
    # whose body is still arriving is answered (and its connection closed); a body that never
    # completes cannot hold the process past the shutdown timeout: its connection is aborted.
    # The request deadline is far away, so only the shutdown timeout can end the stalled body; the
    # shutdown timeout (ThreadedWebhook's 5 s) is long enough for the steps below on a loaded machine.
    events: list[str] = []
    with _serve(apiserver, tmp_path, request_timeout_seconds=600, idle_timeout_seconds=600) as webhook:
        body = json.dumps(review(pod(container(memory=1000)), uid="in-flight")).encode()
        idle = webhook.open_tls()
        idle.sendall(request_head("/mutate", len(body)) + body)
        read_answer(idle)  # now an idle keep-alive connection
        in_flight = webhook.open_tls()
        in_flight.sendall(request_head("/mutate", len(body)) + body[:10])
        stalled = webhook.open_tls()
        stalled.sendall(request_head("/mutate", len(body)) + body[:10])
        listener = _listener_of(webhook)
        wait_for(lambda: _open(webhook) == 3, "three connections")
        wait_for(lambda: webhook.read(lambda: listener.in_flight) == 2, "two reviews in flight")

        stopping = webhook.submit(webhook.server.stop())
        events.append("stop")
        wait_for(lambda: _refused(webhook.port), "new connections refused")
        events.append("refusing")
        wait_for(lambda: _closed(idle), "the idle connection closed")
        events.append("idle closed")
        assert not stopping.done()  # two reviews are still in flight

        in_flight.sendall(body[10:])
        head, answer = read_answer(in_flight)
        assert status_of(head) == 200 and b"connection: close" in head.lower()
        assert json.loads(answer)["response"]["uid"] == "in-flight"
        events.append("in-flight answered")

        stopping.result(timeout=HANG_S)  # the stalled body never completes, yet stop returns
        events.append("stopped")
        assert _open(webhook) == 0
        assert _closed(stalled)
    assert events == ["stop", "refusing", "idle closed", "in-flight answered", "stopped"]
