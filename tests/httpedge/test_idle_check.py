"""`Slot.check_idle`: an idle connection whose TLS layer read more than MAX_KEEP_ALIVE_READ_BYTES
since its last answer, with no request begun, is closed on the second check in a row that finds it
so; a request beginning or an answer in between starts the count again. (Over real TLS with padded
KeyUpdates: tests/webhook/serving/test_large_reads.py.)"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import cast

import pytest
from aiohttp import web

from kube_vgpu.httpedge.edge import MAX_KEEP_ALIVE_READ_BYTES, AdmissionProtocol, EdgeServer
from kube_vgpu.httpedge.listener import ConnectionLimits, Listener, Slot


class _Counted:
    """Stands where `AdmissionProtocol` stands: says what the kernel received since the last answer."""

    def __init__(self) -> None:
        self.received: int | None = 0

    def received_since_answer(self) -> int | None:
        return self.received


async def _answer(request: web.BaseRequest) -> web.Response:
    return web.Response()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    edge = EdgeServer(_answer, idle_timeout_seconds=60, max_body_bytes=1024)
    yield Listener(edge, None, ConnectionLimits(), host="127.0.0.1", port=0)


def _idle_slot(listener: Listener) -> tuple[Slot, _Counted, socket.socket]:
    """A connection that was answered and is idle now, its protocol a `_Counted`."""
    sock = socket.socket()
    slot = Slot(listener, sock, listener.loop.time())
    listener.connections[slot] = None
    counted = _Counted()
    slot.protocol = cast(AdmissionProtocol, counted)
    slot.request_complete()
    slot.answered()
    return slot, counted, sock


async def test_one_byte_past_the_bound_closes_on_the_second_check(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.received = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_idle()
    assert slot in listener.connections and sock.fileno() != -1  # the first finding only marks it
    slot.check_idle()
    assert slot not in listener.connections and sock.fileno() == -1
    assert listener.idle_closed == 1


async def test_the_bound_itself_never_closes(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.received = MAX_KEEP_ALIVE_READ_BYTES
    for _ in range(5):
        slot.check_idle()
    assert slot in listener.connections and sock.fileno() != -1
    assert listener.idle_closed == 0
    sock.close()


@pytest.mark.parametrize("between", ["request_began", "answered"])
async def test_a_request_between_two_findings_starts_over(listener: Listener, between: str) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.received = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_idle()
    if between == "request_began":
        # The bytes were a request's, not yet read when the first check came: it has begun now.
        slot.received()
        slot.check_idle()
        slot.request_complete()
    slot.answered()
    slot.check_idle()  # idle again, and more than the bound since: a first finding again
    assert slot in listener.connections and sock.fileno() != -1
    slot.check_idle()
    assert slot not in listener.connections
    assert listener.idle_closed == 1


@pytest.mark.parametrize("state", ["handling", "busy"])
async def test_a_connection_serving_a_request_is_never_closed_by_the_check(
    listener: Listener, state: str
) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.received = 10 * MAX_KEEP_ALIVE_READ_BYTES
    slot.began()
    if state == "busy":
        slot.request_complete()
    for _ in range(3):
        slot.check_idle()
    assert slot in listener.connections and listener.idle_closed == 0
    sock.close()


async def test_a_socket_that_cannot_say_is_left_alone(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.received = None
    for _ in range(3):
        slot.check_idle()
    assert slot in listener.connections and listener.idle_closed == 0
    sock.close()
