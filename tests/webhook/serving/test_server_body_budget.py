"""The webhook bounds the request bodies it holds at once (memory stays within the chart's
limit under a flood): stalled compressed bodies cannot each hold the whole body limit."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.serving.server import MAX_BODY_BYTES, SMALL_BODIES_ROOM_BYTES
from tests.support.webhook import (
    A100,
    ThreadedWebhook,
    closed_by_server,
    container,
    gpu_node,
    pod,
    post,
    review,
    write_tls,
)

BOUND = 10.0


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def webhook(apiserver: ApiServerStandin, tmp_path: Path) -> Iterator[ThreadedWebhook]:
    apiserver.put(gpu_node("a100", "hami-core", [(A100, 81920)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as running:
        yield running


def _stalled_gzip_body(webhook: ThreadedWebhook) -> ssl.SSLSocket:
    """A connection that sends the start of a gzip body inflating to ~3 MiB, then waits."""
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    bomb = gzip.compress(b" " * (3 * 1024 * 1024 - 100))
    head = (
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip\r\nContent-Length: {len(bomb) + 100}\r\n\r\n"
    )
    sock.sendall(head.encode() + bomb)  # 100 bytes short: the server waits for the rest
    return sock


def test_stalled_compressed_bodies_fill_the_budget_and_the_one_waiting_longest_makes_room(
    webhook: ThreadedWebhook,
) -> None:
    budget = webhook.server.app
    budget.budget_bytes = 2 * MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES  # two worst-case bodies, small ones
    stalled = [_stalled_gzip_body(webhook) for _ in range(2)]
    try:
        _wait(lambda: webhook.read(lambda: budget.held_bytes) >= 2 * MAX_BODY_BYTES, "two bodies held")
        small = review(pod(container(memory=1000)))
        status, answer = post(webhook.connect(), small)
        assert status == 200 and answer["response"]["allowed"]  # small bodies still fit
        third = _stalled_gzip_body(webhook)
        stalled.append(third)
        stalled[0].settimeout(BOUND)
        assert closed_by_server(stalled[0])  # closed to make room; the newcomer is read
        _wait(lambda: webhook.read(lambda: budget.held_bytes) >= 2 * MAX_BODY_BYTES, "the third held")
        assert webhook.read(lambda: budget.held_bytes) <= budget.budget_bytes
        stalled[1].settimeout(0.2)
        assert not closed_by_server(stalled[1])
    finally:
        for sock in stalled:
            sock.close()
    _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")
    status, _ = post(webhook.connect(), review(pod(container(memory=1000))))
    assert status == 200


def test_a_body_that_could_never_fit_the_budget_is_refused_at_once(webhook: ThreadedWebhook) -> None:
    budget = webhook.server.app
    # A compressed body reserves the whole body limit, beside the room kept for small bodies: it fits.
    budget.budget_bytes = MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES
    fits = _stalled_gzip_body(webhook)
    try:
        _wait(lambda: webhook.read(lambda: budget.held_bytes) == MAX_BODY_BYTES, "the body held")
    finally:
        fits.close()
    _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")
    budget.budget_bytes = MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES - 1  # one byte short: it never could
    sock = _stalled_gzip_body(webhook)
    try:
        sock.settimeout(BOUND)
        answer_bytes = sock.recv(65536)
        assert b" 429 " in answer_bytes.split(b"\r\n", 1)[0]
        reason = json.loads(answer_bytes.split(b"\r\n\r\n", 1)[1])["error"]
        assert reason.startswith("too many request bodies")
    finally:
        sock.close()
    status, _ = post(webhook.connect(), review(pod(container(memory=1000))))
    assert status == 200


def test_a_chunked_body_holds_the_whole_limit_and_a_declared_one_its_length(webhook: ThreadedWebhook) -> None:
    # A chunked body says nothing of its size until it ends; a declared one holds what it declares.
    budget = webhook.server.app
    for framing, held in (("Transfer-Encoding: chunked", MAX_BODY_BYTES), ("Content-Length: 5000", 5000)):
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
        sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
        try:
            sock.sendall(f"POST /mutate HTTP/1.1\r\nHost: localhost\r\n{framing}\r\n\r\n".encode())
            _wait(lambda: webhook.read(lambda: budget.held_bytes) == held, f"{held} bytes held")  # noqa: B023
        finally:
            sock.close()
        _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")


def _stalled_declared_body(webhook: ThreadedWebhook, length: int) -> ssl.SSLSocket:
    """A connection that declares a plain body of `length` bytes and sends none of it."""
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    head = (
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode())
    return sock


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
    try:
        for length in lengths:
            stalled.append(_stalled_declared_body(webhook, length))
            _wait(lambda: webhook.read(lambda: budget.held_bytes) == sum(lengths[: len(stalled)]), "held")
        status, answer = post(webhook.connect(), review(pod(container(memory=1000))))
        assert status == 200 and answer["response"]["allowed"]
        # Room was made by closing the body that had been waiting longest, and only it.
        stalled[0].settimeout(BOUND)
        assert closed_by_server(stalled[0])
        for sock in (stalled[1], stalled[-1]):
            sock.settimeout(0.2)
            assert not closed_by_server(sock)
        assert webhook.read(lambda: budget.held_bytes) <= budget.budget_bytes
    finally:
        for sock in stalled:
            sock.close()
    _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")


def _large_review_sent(webhook: ThreadedWebhook, size: int) -> ssl.SSLSocket:
    """A connection that sends a whole review body of `size` bytes, larger than waits for a turn."""
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    prefix = b'{"request":{"namespace":"flood"},"pad":"'
    body = prefix + b"x" * (size - len(prefix) - 2) + b'"}'
    head = f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)
    return sock


def test_bodies_waiting_for_their_turn_stay_within_the_budget(webhook: ThreadedWebhook) -> None:
    # Attack: many connections each send a whole 2 MiB review as fast as they can. Large reviews are
    # answered one at a time (fair turns), so they queue; the budget was given back as soon as a body
    # had been read, so the queued bodies (up to the connection cap's worth, gigabytes) counted nowhere.
    app = budget = webhook.server.app
    budget.budget_bytes = 4 * MAX_BODY_BYTES + SMALL_BODIES_ROOM_BYTES  # four worst-case bodies, small ones
    size = 2 * 1024 * 1024

    async def hold_the_turn(release: asyncio.Event) -> None:
        # A large review being answered (its quota write waiting on the API, say): the others queue.
        async def answer() -> None:
            await release.wait()

        turn: Awaitable[None] | None = app.turns.run(b"x" * (app.turns.large_bytes + 1), answer)
        assert turn is not None  # a large body's answer waits for its turn: an awaitable
        await turn

    release = webhook.read(asyncio.Event)
    holder = webhook.submit(hold_the_turn(release))
    flood: list[ssl.SSLSocket] = []
    try:
        for _ in range(12):
            flood.append(_large_review_sent(webhook, size))
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

        _wait(settled, "every large review waiting, refused or closed")
        waiting_now = webhook.read(waiting)
        assert waiting_now is not None
        # What the webhook holds for the queued reviews never passes the budget.
        assert waiting_now * size <= budget.budget_bytes
        assert waiting_now >= 4  # and the budget is used: four of them wait
        # A small review is still answered while they wait.
        status, answer = post(webhook.connect(), review(pod(container(memory=1000))))
        assert status == 200 and answer["response"]["allowed"]
    finally:
        webhook.read(release.set)
        holder.result(timeout=BOUND)
        for sock in flood:
            sock.close()
    _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")
