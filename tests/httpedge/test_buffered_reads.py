"""`httpedge.edge.BufferedReads`: the transport reads every connection on a thread into that thread's
one buffer, and each connection's protocol gets its own copy of what was read, so no TLS read
allocates a 256 KiB block."""

from __future__ import annotations

import asyncio
import http.client
import queue
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kube_vgpu.httpedge import edge
from kube_vgpu.httpedge.edge import BufferedReads, EdgeServer
from kube_vgpu.httpedge.listener import ConnectionLimits, Listener
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cli import new_event_loop
from tests.support.webhook import (
    A100,
    ThreadedWebhook,
    TlsFiles,
    container,
    gpu_node,
    pod,
    post,
    review,
    write_tls,
)


class _Recorded:
    """Stands where `AdmissionProtocol` stands: records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def connection_made(self, transport: object) -> None:
        self.calls.append(("made", transport))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.calls.append(("lost", exc))

    def pause_writing(self) -> None:
        self.calls.append(("pause", None))

    def resume_writing(self) -> None:
        self.calls.append(("resume", None))

    def data_received(self, data: bytes) -> None:
        self.calls.append(("data", data))

    def eof_received(self) -> None:
        self.calls.append(("eof", None))


def _reads(protocol: _Recorded) -> BufferedReads:
    return BufferedReads(protocol)  # type: ignore[arg-type]  # a recorder in the protocol's place


def test_each_connection_gets_its_own_copy_of_what_was_read_into_the_shared_buffer() -> None:
    first, second = _Recorded(), _Recorded()
    a, b = _reads(first), _reads(second)
    buffer = a.get_buffer(-1)
    assert b.get_buffer(-1).obj is buffer.obj  # one buffer for every connection on this thread
    buffer[:5] = b"hello"
    a.buffer_updated(5)
    buffer[:3] = b"bye"  # the next read, another connection's, overwrites the buffer
    b.buffer_updated(3)
    assert first.calls == [("data", b"hello")]
    assert second.calls == [("data", b"bye")]
    assert type(first.calls[0][1]) is bytes  # what aiohttp's C parser takes without copying again


def test_a_read_that_fills_the_whole_buffer_is_handed_on_whole() -> None:
    recorded = _Recorded()
    reads = _reads(recorded)
    buffer = reads.get_buffer(-1)
    buffer[:] = b"x" * len(buffer)
    reads.buffer_updated(len(buffer))
    assert recorded.calls == [("data", b"x" * len(buffer))]


def test_everything_but_reads_goes_to_the_protocol_as_it_is() -> None:
    recorded = _Recorded()
    reads = _reads(recorded)
    transport, error = object(), ConnectionResetError()
    reads.connection_made(transport)  # type: ignore[arg-type]
    reads.pause_writing()
    reads.resume_writing()
    assert reads.eof_received() is None  # the transport closes: aiohttp never keeps a half-closed one
    reads.connection_lost(error)
    assert recorded.calls == [
        ("made", transport),
        ("pause", None),
        ("resume", None),
        ("eof", None),
        ("lost", error),
    ]


def test_the_webhooks_tls_reads_go_through_the_shared_buffer(
    apiserver: ApiServerStandin, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvloop (and asyncio) read into a protocol's buffer only when it is a buffered protocol: this
    # fails if the listener hands the transport aiohttp's protocol itself.
    served: list[int] = []
    real = BufferedReads.buffer_updated

    def counted(self: BufferedReads, nbytes: int) -> None:
        served.append(nbytes)
        real(self, nbytes)

    monkeypatch.setattr(BufferedReads, "buffer_updated", counted)
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    body = review(pod(container(memory=1024)))
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as webhook:
        status, answer = post(webhook.connect(), body, "/mutate")
    assert status == 200 and answer["response"]["allowed"] is True
    assert sum(served) > 0


def test_a_body_larger_than_the_shared_buffer_arrives_whole(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    # A body ten times the buffer is read in many pieces through it; each piece is copied before the
    # next read overwrites it, so the review decodes as sent.
    size = edge.SHARED_READ_BYTES * 10
    obj = pod(container(memory=1024))
    obj["metadata"]["annotations"] = {"pad": "x" * size}
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as webhook:
        status, answer = post(webhook.connect(), review(obj), "/mutate")
    assert status == 200
    assert answer["response"]["allowed"] is True, answer


def _serve_in_thread(
    tls: TlsFiles,
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
    mismatches: list[tuple[str, int, bytes]],
    ports: queue.Queue[int],
    stop: threading.Event,
) -> None:
    """A Listener on its own event loop in this thread; its handler records every body that is not
    all one byte (the byte the request's X-Fill header names)."""

    async def main() -> None:
        async def handle(request: web.BaseRequest) -> web.StreamResponse:
            body = await request.read()
            fill = request.headers["X-Fill"].encode()
            if body != fill * _BODY_BYTES:
                mismatches.append((fill.decode(), len(body), bytes(sorted(set(body)))))
            return web.Response(body=b"ok")

        server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_context.load_cert_chain(tls.cert_file, tls.key_file)
        edge_server = EdgeServer(handle, idle_timeout_seconds=30.0, max_body_bytes=2 * _BODY_BYTES)
        listener = Listener(edge_server, server_context, ConnectionLimits(), host="127.0.0.1", port=0)
        await listener.start()
        ports.put(listener.port)
        await asyncio.to_thread(stop.wait)
        await listener.close()
        await listener.drain(listener.loop.time() + 1.0)

    loop = loop_factory()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


_BODY_BYTES = 2 * 1024 * 1024


@pytest.mark.parametrize("loop_factory", [new_event_loop, asyncio.new_event_loop], ids=["uvloop", "asyncio"])
def test_event_loops_on_two_threads_never_read_into_each_others_buffer(
    tmp_path: Path, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    # Two webhooks in one process, each on its own thread's loop (as tests and embedders run them):
    # the transports read with the GIL released, so one buffer for the process would let one
    # connection's bytes land in another's request. Every body must arrive as its client sent it.
    tls = write_tls(tmp_path / "tls")
    mismatches: list[tuple[str, int, bytes]] = []
    ports: queue.Queue[int] = queue.Queue()
    stop = threading.Event()
    servers = [
        threading.Thread(target=_serve_in_thread, args=(tls, loop_factory, mismatches, ports, stop))
        for _ in range(2)
    ]
    for server in servers:
        server.start()
    try:
        first, second = ports.get(timeout=30), ports.get(timeout=30)
        client_context = ssl.create_default_context(cafile=str(tls.ca_file))

        answered: list[str] = []  # a failure in a client thread would not fail the test by itself

        def send(port: int, fill: str) -> None:
            for _ in range(8):
                connection = http.client.HTTPSConnection("127.0.0.1", port, context=client_context)
                connection.request("POST", "/", body=fill.encode() * _BODY_BYTES, headers={"X-Fill": fill})
                if connection.getresponse().read() == b"ok":
                    answered.append(fill)
                connection.close()

        clients = [
            threading.Thread(target=send, args=(port, fill))
            for port, fill in ((first, "a"), (second, "b"), (first, "c"), (second, "d"))
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
    finally:
        stop.set()
        for server in servers:
            server.join()
    assert sorted(answered) == sorted("abcd" * 8)  # every body reached its server and was answered
    assert mismatches == []
