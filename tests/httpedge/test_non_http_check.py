"""`Slot.check_non_http`: a connection, idle or not, whose TLS layer read more than
MAX_KEEP_ALIVE_READ_BYTES since its last answer that never reached HTTP, and more than did, is
closed on the second check in a row that finds it so; bytes reaching HTTP or an answer in between
start over. (Over real TLS with padded KeyUpdates: tests/webhook/serving/test_large_reads.py.)"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import cast

import pytest
from aiohttp import web

from kube_vgpu.httpedge.edge import MAX_KEEP_ALIVE_READ_BYTES, AdmissionProtocol, EdgeServer
from kube_vgpu.httpedge.listener import ConnectionLimits, Listener, Slot


class _Counted:
    """Stands where `AdmissionProtocol` stands: says what the TLS layer read since the last answer
    that never reached HTTP, and what did."""

    def __init__(self) -> None:
        self.non_http: int | None = 0
        self.http = 0

    def read_since_answer(self) -> tuple[int, int] | None:
        return None if self.non_http is None else (self.non_http + self.http, self.http)


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
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_non_http()
    assert slot in listener.connections and sock.fileno() != -1  # the first finding only marks it
    slot.check_non_http()
    assert slot not in listener.connections and sock.fileno() == -1
    assert listener.non_http_closed == 1


async def test_the_bound_itself_never_closes(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES
    for _ in range(5):
        slot.check_non_http()
    assert slot in listener.connections and sock.fileno() != -1
    assert listener.non_http_closed == 0
    sock.close()


async def test_bytes_that_reach_http_before_the_second_check_start_over(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_non_http()
    # They were a request's, in the kernel before the loop read them: read now, they are HTTP.
    slot.received()
    counted.non_http = 0
    slot.check_non_http()
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_non_http()  # a first finding again
    assert slot in listener.connections and sock.fileno() != -1
    slot.check_non_http()
    assert slot not in listener.connections and listener.non_http_closed == 1


async def test_an_answer_between_two_findings_starts_over(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_non_http()
    slot.received()
    slot.request_complete()
    slot.answered()
    slot.check_non_http()  # after the answer: a first finding again
    assert slot in listener.connections and sock.fileno() != -1
    slot.check_non_http()
    assert slot not in listener.connections and listener.non_http_closed == 1


@pytest.mark.parametrize("state", ["head arrived", "request arrived whole"])
async def test_a_connection_serving_a_request_is_closed_past_the_bound_too(
    listener: Listener, state: str
) -> None:
    # KeyUpdates sent while a request is arriving or computed: its deadline would end them, but
    # not before 1,000 such connections had put the webhook past its memory limit.
    slot, counted, sock = _idle_slot(listener)
    slot.received()
    slot.began()
    if state == "request arrived whole":
        slot.request_complete()
    counted.non_http = MAX_KEEP_ALIVE_READ_BYTES + 1
    slot.check_non_http()
    assert slot in listener.connections
    slot.check_non_http()
    assert slot not in listener.connections and sock.fileno() == -1 and listener.non_http_closed == 1


async def test_a_socket_that_cannot_say_is_left_alone(listener: Listener) -> None:
    slot, counted, sock = _idle_slot(listener)
    counted.non_http = None
    for _ in range(3):
        slot.check_non_http()
    assert slot in listener.connections and listener.non_http_closed == 0
    sock.close()


async def test_a_handshake_in_progress_is_left_to_the_request_deadline(listener: Listener) -> None:
    sock = socket.socket()
    slot = Slot(listener, sock, listener.loop.time())
    listener.connections[slot] = None
    for _ in range(3):
        slot.check_non_http()
    assert slot in listener.connections and listener.non_http_closed == 0
    slot.close_now()


@pytest.mark.parametrize("http", [40 * 1024, 1024 * 1024])
async def test_as_many_non_http_bytes_as_http_ones_are_left_alone(listener: Listener, http: int) -> None:
    # A streamed body's records read and not yet decrypted, while its HTTP bytes flow; such bytes
    # are bounded by the head limit and the body budget as the HTTP ones are.
    slot, counted, sock = _idle_slot(listener)
    slot.received()
    counted.http = http
    counted.non_http = http
    for _ in range(3):
        slot.check_non_http()
    assert slot in listener.connections and listener.non_http_closed == 0
    counted.non_http = http + 1  # one byte more than reached HTTP
    slot.check_non_http()
    slot.check_non_http()
    assert slot not in listener.connections and listener.non_http_closed == 1
    assert sock.fileno() == -1
