"""The webhook bounds the request bodies it holds at once (SPEC §2.3: memory stays within the chart's
limit under a flood): stalled compressed bodies cannot each hold the whole body limit."""

from __future__ import annotations

import gzip
import json
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.serving.body_budget import SMALL_BODY_BYTES, BodyBudget, body_reservation
from kube_vgpu.webhook.serving.server import MAX_BODY_BYTES
from tests.support.webhook import A100, ThreadedWebhook, container, gpu_node, pod, post, review, write_tls

BOUND = 10.0


def test_a_budget_refuses_what_does_not_fit_and_frees_what_it_held() -> None:
    budget = BodyBudget(100, small_reserve_bytes=0)
    assert budget.hold(60) and budget.held_bytes == 60
    assert not budget.hold(50) and budget.held_bytes == 60  # refused: nothing reserved
    assert budget.hold(40) and budget.held_bytes == 100
    budget.release(40)
    budget.release(60)
    assert budget.held_bytes == 0
    with pytest.raises(ValueError, match="positive"):
        BodyBudget(0)
    with pytest.raises(ValueError, match="reserve"):
        BodyBudget(100, small_reserve_bytes=100)


def test_the_last_bytes_of_the_budget_are_kept_for_small_bodies() -> None:
    # Attack: one namespace's large reviews (dry-run creates of 1-3 MiB pods, or stalled large
    # bodies) wait for their fair turn holding their bytes; once they held the whole budget, every
    # other namespace's ordinary review was answered 429, and the API server refused those pods.
    small = SMALL_BODY_BYTES
    budget = BodyBudget(10 * small, small_reserve_bytes=4 * small)
    assert not budget.hold(6 * small + 1)  # a large body one byte into the reserve: refused
    assert budget.hold(6 * small)  # a large body up to the limit less the reserve: accepted
    assert not budget.hold(small + 1)  # the smallest large body: no room left for it
    for _ in range(4):
        assert budget.hold(small)  # the largest small body: the reserve is its
    assert budget.held_bytes == budget.limit_bytes
    assert not budget.hold(1)  # the whole budget is still the bound for everyone


@pytest.mark.parametrize(
    ("length", "compressed", "reserved"),
    [
        (1000, False, 1000),
        (1000, True, MAX_BODY_BYTES),
        (None, False, MAX_BODY_BYTES),
        (10**9, False, MAX_BODY_BYTES),
    ],
)
def test_what_a_body_reserves(length: int | None, compressed: bool, reserved: int) -> None:
    # A compressed body's length says nothing of its size once inflated.
    assert body_reservation(length, compressed, MAX_BODY_BYTES) == reserved


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


def test_stalled_compressed_bodies_fill_the_budget_and_others_are_refused_at_once(
    webhook: ThreadedWebhook,
) -> None:
    budget = webhook.server.app.bodies
    # two worst-case bodies and the small ones' reserve
    budget.limit_bytes = 2 * MAX_BODY_BYTES + budget.small_reserve_bytes
    stalled = [_stalled_gzip_body(webhook) for _ in range(2)]
    try:
        _wait(lambda: webhook.read(lambda: budget.held_bytes) >= 2 * MAX_BODY_BYTES, "two bodies held")
        small = review(pod(container(memory=1000)))
        status, answer = post(webhook.connect(), small)
        assert status == 200 and answer["response"]["allowed"]  # small bodies still fit
        third = _stalled_gzip_body(webhook)
        stalled.append(third)
        third.settimeout(BOUND)
        answer_bytes = third.recv(65536)
        assert b" 429 " in answer_bytes.split(b"\r\n", 1)[0]
        assert json.loads(answer_bytes.split(b"\r\n\r\n", 1)[1])["error"].startswith(
            "too many request bodies"
        )
    finally:
        for sock in stalled:
            sock.close()
    _wait(lambda: webhook.read(lambda: budget.held_bytes) == 0, "the budget freed")
    status, _ = post(webhook.connect(), review(pod(container(memory=1000))))
    assert status == 200


def _stalled_large_body(webhook: ThreadedWebhook, size: int) -> ssl.SSLSocket:
    """A connection that announces a plain body of `size` bytes, sends part of it, then waits."""
    raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=BOUND)
    sock = webhook.tls.client_context().wrap_socket(raw, server_hostname="localhost")
    head = (
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"request": ')
    return sock


def test_large_bodies_cannot_take_the_budget_from_ordinary_reviews(webhook: ThreadedWebhook) -> None:
    # One tenant holds as many large bodies as the budget lets it (here stalled; through the API
    # server, its large reviews waiting for their fair turn): another namespace's ordinary review
    # is still read and answered, not refused 429.
    budget = webhook.server.app.bodies
    budget.limit_bytes = 8 * 1024 * 1024 + budget.small_reserve_bytes
    large = 1024 * 1024
    stalled: list[ssl.SSLSocket] = []
    try:
        refused = False
        for _ in range(budget.limit_bytes // large + 1):
            sock = _stalled_large_body(webhook, large)
            stalled.append(sock)
            held = len(stalled) * large
            deadline = time.monotonic() + BOUND
            while webhook.read(lambda: budget.held_bytes) < held:
                assert time.monotonic() < deadline, "timed out waiting for the body held or refused"
                if _refused(sock):
                    refused = True
                    break
                time.sleep(0.01)
            if refused:
                break
        assert refused, f"the large bodies were never refused ({budget.held_bytes} bytes held)"
        assert webhook.read(lambda: budget.held_bytes) <= budget.limit_bytes - budget.small_reserve_bytes
        ordinary = review(pod(container(memory=1000), namespace="team-b"))
        status, answer = post(webhook.connect(), ordinary, "/validate")
        assert status == 200 and answer["response"]["allowed"], answer
    finally:
        for sock in stalled:
            sock.close()


def _refused(sock: ssl.SSLSocket) -> bool:
    """Whether the server answered this stalled request already (429: no room for its body)."""
    sock.setblocking(False)
    try:
        first = sock.recv(65536)
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    finally:
        sock.setblocking(True)
    assert b" 429 " in first.split(b"\r\n", 1)[0], first[:200]
    return True
