"""`httpedge.edge.BufferedReads`: the transport reads every connection into one shared buffer, and each
connection's protocol gets its own copy of what was read, so no TLS read allocates a 256 KiB block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kube_vgpu.httpedge import edge
from kube_vgpu.httpedge.edge import BufferedReads
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import ThreadedWebhook, container, gpu_node, pod, post, review, write_tls

A100 = "NVIDIA A100-PCIE-40GB"


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
    assert b.get_buffer(-1).obj is buffer.obj  # one buffer for every connection
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
    # A 3 MiB body is read in many pieces through the one buffer; each piece is copied before the
    # next read overwrites it, so the review decodes as sent.
    size = len(edge._READ_VIEW) * 10
    obj = pod(container(memory=1024))
    obj["metadata"]["annotations"] = {"pad": "x" * size}
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as webhook:
        status, answer = post(webhook.connect(), review(obj), "/mutate")
    assert status == 200
    assert answer["response"]["allowed"] is True, answer
