"""The admission routes over real HTTPS (`webhook.serving.server`): a body that is not a review gets a
4xx with a JSON reason, never a 5xx or a traceback; compressed bodies are read and bounded after
decompression; an answer given before a body arrived closes its connection; and the bodies held at
once stay within the body budget, the one waiting longest closed to make room, so stalled or queued
bodies never lock the API server out nor take memory past the chart's limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import ssl
import tracemalloc
import zlib
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.httpedge.listener import ConnectionLimits
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.review import MAX_NESTING
from kube_vgpu.webhook.serving.server import MAX_BODY_BYTES, SMALL_BODIES_ROOM_BYTES
from tests.support.timeouts import HANG_S
from tests.support.webhook import (
    ThreadedWebhook,
    closed_by_server,
    container,
    get,
    no_tracebacks,
    pod,
    post,
    post_once,
    read_answer,
    request_head,
    review,
    rss_mib,
    serve_one_gpu,
    status_of,
    wait_for,
)

LIMIT = MAX_BODY_BYTES
_REVIEW = json.dumps(review(pod(container(memory=1000)))).encode()
JSON_BODY = "Content-Type: application/json\r\n"
# The fixture's request deadline and idle timeout: far past the tests' waits.
IDLE_S = 60.0


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    # The request deadline far past the tests' waits: only the webhook's answers and the body budget
    # end a connection here.
    limits = ConnectionLimits(request_timeout_seconds=IDLE_S, idle_timeout_seconds=IDLE_S)
    with serve_one_gpu(apiserver, tmp_path, limits=limits) as running:
        yield running


def _sent(webhook: ThreadedWebhook, data: bytes) -> ssl.SSLSocket:
    """A TLS connection that has sent `data` and waits."""
    sock = webhook.open_tls()
    sock.sendall(data)
    return sock


def _small_review_allowed(webhook: ThreadedWebhook) -> bool:
    status, answer = post(webhook.connect(), review(pod(container(memory=1000))))
    return status == 200 and answer["response"]["allowed"] is True


# --- bodies that are not reviews ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "not JSON"),
        (b"[1, 2]", 400, "not a JSON object"),
        (json.dumps({"kind": "Pod"}).encode(), 400, "AdmissionReview"),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"kind": {"kind": "Pod"}},
                }
            ).encode(),
            400,
            "request.uid",
        ),
        (b"x" * (LIMIT + 1), 413, "limit"),
    ],
)
def test_bad_bodies_get_a_json_reason(
    webhook: ThreadedWebhook, body: bytes, status: int, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    conn = webhook.connect()
    got, answer = post(conn, body)
    assert got == status and reason in answer["error"]
    conn.close()
    # Counted and logged as what it is: a body that is no review, or one over the limit.
    outcome, event = ("too_large", "http_bad_request") if status == 413 else ("malformed", "review_malformed")
    assert f'kube_vgpu_webhook_reviews_total{{outcome="{outcome}"}} 1.0' in webhook.metrics()
    assert any(f"event={event} " in r.getMessage() for r in caplog.records)
    # The server is unharmed.
    assert get(webhook.connect(), "/healthz")[0] == 200


def _envelope(request: Any) -> bytes:
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()


def _with_request(**fields: Any) -> bytes:
    return _envelope(review(pod(container(memory=1000)))["request"] | fields)


def _nested_in_object(depth: int) -> bytes:
    doc = review(pod(container(memory=1000)))
    doc["request"]["object"]["spec"]["x"] = json.loads("[" * depth + "]" * depth)
    return json.dumps(doc).encode()


# (case, body, extra headers, status, what the JSON reason says)
BAD_BODIES: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("deep arrays", b"[" * 100_000, {}, 400, "nests 100000 levels"),
    ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, 400, "nests 50000 levels"),
    ("deep inside a review", _nested_in_object(MAX_NESTING + 5), {}, 400, f"at most {MAX_NESTING}"),
    ("brackets in strings do not count", _envelope({"uid": "[" * 5000}), {}, 400, "request.kind"),
    ("garbage gzip", b"\x1f\x8b not really gzip", {"Content-Encoding": "gzip"}, 400, "cannot be read"),
    ("garbage deflate", b"not deflate at all", {"Content-Encoding": "deflate"}, 400, "cannot be read"),
    ("truncated gzip", gzip.compress(_REVIEW)[:40], {"Content-Encoding": "gzip"}, 400, ""),
    ("gzip bomb", gzip.compress(b" " * (LIMIT * 4)), {"Content-Encoding": "gzip"}, 413, "limit"),
    ("5,000-digit integer", b'{"a": ' + b"9" * 5000 + b"}", {}, 400, "5000 characters"),
    ("30-digit integer in a review", _with_request(dryRun=10**30), {}, 400, "64 bits"),
    ("float overflow", b'{"a": 1e999}', {}, 400, "out of range"),
    ("NaN", b'{"a": NaN}', {}, 400, "NaN"),
    ("Infinity", b'{"a": -Infinity}', {}, 400, "Infinity"),
    ("invalid UTF-8", b'{"a": "\xff\xfe"}', {}, 400, "not UTF-8"),
    ("UTF-16", _REVIEW.decode().encode("utf-16"), {}, 400, "not UTF-8"),
    ("surrogate encoded in UTF-8", b'{"a": "\xed\xa0\x80"}', {}, 400, "not UTF-8"),
    ("lone surrogate in the uid", _with_request(uid="\ud800"), {}, 400, "request.uid"),
    ("lone surrogate in the namespace", _with_request(namespace="a\udfff"), {}, 400, "request.namespace"),
    ("not a namespace name", _with_request(namespace="Team A\n"), {}, 400, "not a namespace name"),
    ("request is a list", _envelope([]), {}, 400, "request"),
    ("uid is a number", _with_request(uid=5), {}, 400, "request.uid"),
    ("kind is a string", _with_request(kind="Pod"), {}, 400, "request.kind"),
    ("operation is a number", _with_request(operation=1), {}, 400, "request.operation"),
    ("object is a string", _with_request(object="pod"), {}, 400, "request.object"),
    ("dryRun is a string", _with_request(dryRun="true"), {}, 400, "dryRun"),
    ("empty body", b"", {}, 400, "not JSON"),
    ("over the size limit", b" " * (LIMIT + 1), {}, 413, "limit"),
]


def test_hostile_bodies_get_a_4xx_with_a_json_reason_and_no_traceback(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for case, body, headers, status, reason in BAD_BODIES:
        got, raw = post_once(webhook, body, "/mutate", headers)
        assert got == status, (case, raw[:300])
        assert reason in json.loads(raw)["error"], (case, raw[:300])
    no_tracebacks(caplog)
    assert _small_review_allowed(webhook)  # the server is unharmed


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/healthz", 405), ("POST", "/nowhere", 404), ("POST", "/mutate", 400)],
)
def test_a_broken_body_sent_where_no_body_is_read_is_answered_and_the_connection_closed(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, method: str, path: str, status: int
) -> None:
    caplog.set_level(logging.INFO)
    conn = webhook.connect()
    conn.request(method, path, body=b"\x1f\x8b garbage" * 100, headers={"Content-Encoding": "gzip"})
    response = conn.getresponse()
    answer = json.loads(response.read())
    # A path that takes no body answers before reading it, a route that reads one refuses the
    # garbage; either way what follows on the connection cannot be framed, so it is closed.
    assert response.status == status and answer["error"], answer
    assert response.getheader("Connection") == "close"
    conn.close()
    no_tracebacks(caplog)


# --- compressed bodies ----------------------------------------------------------------------------


def test_compressed_reviews_are_read(webhook: ThreadedWebhook) -> None:
    for encoding, data in (("gzip", gzip.compress(_REVIEW)), ("deflate", zlib.compress(_REVIEW))):
        status, raw = post_once(webhook, data, "/mutate", {"Content-Encoding": encoding})
        assert status == 200 and json.loads(raw)["response"]["allowed"], encoding


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_that_ends_wrongly_in_one_packet_gets_a_400_without_traceback(
    webhook: ThreadedWebhook, caplog: pytest.LogCaptureFixture, encoding: str
) -> None:
    caplog.set_level(logging.INFO)
    whole = gzip.compress(_REVIEW) if encoding == "gzip" else zlib.compress(_REVIEW)
    # (body, whether it must be refused): a gzip stream missing only its trailer still decodes whole.
    cases = [(whole[:-5], False), (whole[: len(whole) // 2], True), (whole[:3], True)]
    cases.append((b"\x78\x9c" + b"\x00" * 8, True))
    for body, refused in cases:
        extra = f"Content-Encoding: {encoding}\r\n{JSON_BODY}"
        # Head and body in one write: parsed at once.
        with _sent(webhook, request_head("/mutate", len(body), extra=extra) + body) as sock:
            status = status_of(read_answer(sock)[0])
        assert (400 <= status < 500) if refused else status < 500, (body, status)
    no_tracebacks(caplog)


def test_a_compressed_body_is_bounded_after_decompression_on_both_sides(webhook: ThreadedWebhook) -> None:
    # Padding inside the JSON keeps it a review: MAX_BODY_BYTES decoded is read, one more byte is 413.
    padded = _REVIEW[:-1] + b" " * (MAX_BODY_BYTES - len(_REVIEW)) + b"}"
    assert len(padded) == MAX_BODY_BYTES
    for body, status in ((padded, 200), (padded[:-1] + b" }", 413)):
        data = gzip.compress(body)
        head = request_head("/mutate", len(data), extra=f"Content-Encoding: gzip\r\n{JSON_BODY}")
        with _sent(webhook, head + data) as sock:
            assert status_of(read_answer(sock)[0]) == status, len(body)


def test_expect_100_continue_is_answered_before_the_body_is_sent(webhook: ThreadedWebhook) -> None:
    with _sent(webhook, request_head("/mutate", len(_REVIEW), extra="Expect: 100-continue\r\n")) as sock:
        interim = b""
        while b"\r\n\r\n" not in interim:
            chunk = sock.recv(4096)
            assert chunk, "closed before 100 Continue"
            interim += chunk
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(_REVIEW)
        head, body = read_answer(sock)
    assert status_of(head) == 200 and json.loads(body)["response"]["allowed"]


def test_a_kept_alive_connection_does_not_hold_its_last_body_while_idle(webhook: ThreadedWebhook) -> None:
    # Attack: a 3 kB gzip review that inflates to the 3 MiB body limit, answered, and the connection
    # kept open. aiohttp keeps the last request of a connection until the next one arrives, and
    # `read()` keeps the body on it: 1,000 such idle connections (1 MB each) put the webhook at
    # 1,377 MiB. The body is read without being kept on the request.
    inflated = b" " * (MAX_BODY_BYTES - len(_REVIEW) - 1) + _REVIEW  # just within the limit
    sent = gzip.compress(inflated)
    write = request_head("/mutate", len(sent), extra=f"Content-Encoding: gzip\r\n{JSON_BODY}") + sent
    del inflated
    connections = 20
    # Live Python objects, not RSS: glibc may keep freed 3 MiB buffers in the heap (its mmap
    # threshold rises after such a free), which grows RSS on a busy machine without anything held.
    tracemalloc.start()
    live_before = tracemalloc.get_traced_memory()[0]
    rss_before = rss_mib()
    try:
        for _ in range(connections):
            head, body = read_answer(_sent(webhook, write))
            assert status_of(head) == 200 and json.loads(body)["response"]["allowed"] is True
        grown = (tracemalloc.get_traced_memory()[0] - live_before) / 2**20
        rss_grown = rss_mib() - rss_before
    finally:
        tracemalloc.stop()
        webhook.close_connections()
    held = connections * MAX_BODY_BYTES / 2**20  # 60 MiB, were the bodies kept
    assert grown < held / 4, f"{grown:.0f} MiB more live with {connections} idle connections"
    # And the process as a whole, loosely (what Python does not see: TLS and loop buffers; the
    # allocator may keep freed buffers, so the bound is the bodies' size, not a quarter of it).
    assert rss_grown < held, f"RSS {rss_grown:.0f} MiB more with {connections} idle connections"


# --- answers given before the body ------------------------------------------------------------------
# aiohttp reads and drops the body of a request answered before it (lingering), and keeps the
# connection alive if the body ends soon enough. Those bytes came after the answer, so no answer counts
# them: 1,000 connections each sending a `GET /healthz` and then a 1 MiB body in one write held the
# webhook at 830 MiB until their request deadlines. Such an answer says `Connection: close`.

_AFTER_BODY = 1024 * 1024


def _says_close(head: bytes) -> bool:
    return any(line.lower() == b"connection: close" for line in head.split(b"\r\n"))


def _ends(sock: ssl.SSLSocket) -> bool:
    """Whether the server ends the connection within half the fixture's idle timeout, so that only
    its answer, not the idle timeout, can have ended it (what it still sends is read and dropped)."""
    sock.settimeout(IDLE_S / 2)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_get_answered_before_its_body_closes_its_connection(webhook: ThreadedWebhook, path: str) -> None:
    sock = _sent(webhook, request_head(path, _AFTER_BODY, method="GET"))
    head, _ = read_answer(sock)
    assert _says_close(head), head
    with contextlib.suppress(ConnectionError, ssl.SSLError):  # read and dropped, or refused
        sock.sendall(b"x" * _AFTER_BODY)
    assert _ends(sock), "a connection whose body came after its answer was kept open"


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_a_get_without_a_body_keeps_its_connection_alive(webhook: ThreadedWebhook, path: str) -> None:
    sock = webhook.open_tls()
    for _ in range(2):
        sock.sendall(request_head(path, method="GET"))
        head, _ = read_answer(sock)
        assert not _says_close(head), head


# --- the body budget: the bodies held at once -------------------------------------------------------


def _stalled_gzip_body(webhook: ThreadedWebhook) -> ssl.SSLSocket:
    """A connection that sends the start of a gzip body inflating to ~3 MiB, then waits."""
    bomb = gzip.compress(b" " * (3 * 1024 * 1024 - 100))
    extra = f"{JSON_BODY}Content-Encoding: gzip\r\n"
    return _sent(webhook, request_head("/validate", len(bomb) + 100, extra=extra) + bomb)  # 100 short


def _held(webhook: ThreadedWebhook) -> int:
    app = webhook.server.app
    return webhook.read(lambda: app.held_bytes)


def _wait_freed(webhook: ThreadedWebhook) -> None:
    wait_for(lambda: _held(webhook) == 0, "the budget freed")


def test_stalled_compressed_bodies_fill_the_budget_and_the_one_waiting_longest_makes_room(
    webhook: ThreadedWebhook,
) -> None:
    budget = webhook.server.app
    budget.budget_bytes = 2 * MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES  # two worst-case bodies, small ones
    stalled = [_stalled_gzip_body(webhook) for _ in range(2)]
    wait_for(lambda: _held(webhook) >= 2 * MAX_BODY_BYTES, "two bodies held")
    assert _small_review_allowed(webhook)  # small bodies still fit
    stalled.append(_stalled_gzip_body(webhook))
    stalled[0].settimeout(IDLE_S / 2)  # closed well before its request deadline could close it
    assert closed_by_server(stalled[0])  # closed to make room; the newcomer is read
    wait_for(lambda: _held(webhook) >= 2 * MAX_BODY_BYTES, "the third held")
    assert _held(webhook) <= budget.budget_bytes
    stalled[1].settimeout(0.2)
    assert not closed_by_server(stalled[1])
    webhook.close_connections()
    _wait_freed(webhook)
    assert _small_review_allowed(webhook)


def test_a_body_that_could_never_fit_the_budget_is_refused_at_once(webhook: ThreadedWebhook) -> None:
    budget = webhook.server.app
    # A compressed body reserves the whole body limit, beside the room kept for small bodies: it fits.
    budget.budget_bytes = MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES
    fits = _stalled_gzip_body(webhook)
    wait_for(lambda: _held(webhook) == MAX_BODY_BYTES, "the body held")
    fits.close()
    _wait_freed(webhook)
    budget.budget_bytes = MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES - 1  # one byte short: it never could
    head, body = read_answer(_stalled_gzip_body(webhook))
    assert status_of(head) == 429
    assert json.loads(body)["error"].startswith("too many request bodies")
    assert 'kube_vgpu_webhook_reviews_total{outcome="busy"} 1.0' in webhook.metrics()
    assert _small_review_allowed(webhook)


def test_a_chunked_body_holds_the_whole_limit_and_a_declared_one_its_length(webhook: ThreadedWebhook) -> None:
    # A chunked body says nothing of its size until it ends; a declared one holds what it declares.
    for framing, held in (
        ("Transfer-Encoding: chunked\r\n", MAX_BODY_BYTES),
        ("Content-Length: 5000\r\n", 5000),
    ):
        sock = _sent(webhook, request_head("/mutate", extra=framing))
        wait_for(lambda: _held(webhook) == held, f"{held} bytes held")  # noqa: B023
        sock.close()
        _wait_freed(webhook)


def test_bodies_declared_to_fill_the_budget_exactly_do_not_lock_the_api_server_out(
    webhook: ThreadedWebhook,
) -> None:
    # Attack: a few connections declare bodies whose lengths add up to the whole budget (20 of 3 MiB
    # and 64 of 64 KiB fill the default 64 MiB) and send nothing. Each is cut at its request deadline,
    # but the attacker opens new ones; meanwhile every review, however small, found no room.
    budget = webhook.server.app
    budget.budget_bytes = 2 * MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES
    small = 64 * 1024  # the largest body that never waits for a turn, so it may use the small bodies' room
    lengths = [MAX_BODY_BYTES, MAX_BODY_BYTES] + [small] * (SMALL_BODIES_ROOM_BYTES // small)
    stalled = []
    for length in lengths:
        stalled.append(_sent(webhook, request_head("/validate", length, extra=JSON_BODY)))
        wait_for(lambda: _held(webhook) == sum(lengths[: len(stalled)]), "held")
    assert _small_review_allowed(webhook)
    # Room was made by closing the body that had been waiting longest, and only it.
    assert closed_by_server(stalled[0])
    for sock in (stalled[1], stalled[-1]):
        sock.settimeout(0.2)
        assert not closed_by_server(sock)
    assert _held(webhook) <= budget.budget_bytes
    webhook.close_connections()
    _wait_freed(webhook)


def test_bodies_waiting_for_their_turn_stay_within_the_budget(webhook: ThreadedWebhook) -> None:
    # Attack: many connections each send a whole 2 MiB review as fast as they can. Large reviews are
    # answered one at a time (fair turns), so they queue; the budget was given back as soon as a body
    # had been read, so the queued bodies (up to the connection cap's worth, gigabytes) counted nowhere.
    app = budget = webhook.server.app
    budget.budget_bytes = 4 * MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES  # four worst-case bodies, small ones
    size = 2 * 1024 * 1024
    prefix = b'{"request":{"namespace":"flood"},"pad":"'
    large = prefix + b"x" * (size - len(prefix) - 2) + b'"}'  # larger than waits for a turn

    async def hold_the_turn(release: asyncio.Event) -> None:
        # A large review being answered (its quota write waiting on the API, say): the others queue.
        async def answer() -> None:
            await release.wait()

        turn: Awaitable[None] | None = app.turns.run(b"x" * (app.turns.large_bytes + 1), answer)
        assert turn is not None  # a large body's answer waits for its turn: an awaitable
        await turn

    release = webhook.read(asyncio.Event)
    holder = webhook.submit(hold_the_turn(release))
    flood = [_sent(webhook, request_head("/mutate", len(large)) + large) for _ in range(12)]
    try:
        listener = webhook.server.listener
        assert listener is not None

        def waiting() -> int | None:
            # Once every connection still open has its review read whole and waiting for a turn (the
            # others were refused with 429 or closed to make room), how many there are.
            conns = list(listener.connections)
            return len(conns) if conns and all(conn.busy for conn in conns) else None

        def sweep() -> None:  # close the sockets that got their answer (a 429) or were closed
            for sock in flood:
                if sock.fileno() < 0:
                    continue
                sock.settimeout(0)
                try:
                    sock.recv(65536)
                except (BlockingIOError, ssl.SSLWantReadError):
                    continue
                except OSError:
                    pass
                sock.close()

        def settled() -> bool:
            sweep()
            return webhook.read(waiting) is not None

        wait_for(settled, "every large review waiting, refused or closed")
        waiting_now = webhook.read(waiting)
        assert waiting_now is not None
        # What the webhook holds for the queued reviews never passes the budget.
        assert waiting_now * size <= budget.budget_bytes
        assert waiting_now >= 4  # and the budget is used: four of them wait
        assert _small_review_allowed(webhook)  # a small review is still answered while they wait
    finally:
        webhook.read(release.set)
        holder.result(timeout=HANG_S)
        webhook.close_connections()
    _wait_freed(webhook)
