"""The metrics port (the webhook's and the node plugin's) is bounded like the admission port: any pod
can reach it when no NetworkPolicy is rendered, so its connections are capped and a request must
arrive within its deadline; otherwise connections holding part of a head pile up (a few kB each,
closed only by aiohttp's 75 s keep-alive timeout) until the process runs out of memory or file
descriptors."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from kube_vgpu.httpedge.listener import MAX_FIELD_BYTES, MAX_KEEP_ALIVE_READ_BYTES, ConnectionLimits
from kube_vgpu.httpedge.metrics_server import METRICS_LIMITS, MetricsServer
from tests.support.timeouts import HANG_S

EXPOSITION = b"# TYPE kube_vgpu_up gauge\nkube_vgpu_up 1\n"
_PARTIAL_HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (MAX_FIELD_BYTES - 96)
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _render() -> bytes:
    return EXPOSITION


@contextlib.asynccontextmanager
async def _serving(limits: ConnectionLimits = METRICS_LIMITS) -> AsyncIterator[MetricsServer]:
    server = MetricsServer(_render, host="127.0.0.1", port=0, limits=limits)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        async with asyncio.timeout(HANG_S):
            return await reader.read(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


async def _status_then_closed(port: int, request: bytes) -> bytes:
    """The whole answer to `request` (which asks for `Connection: close`)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        async with asyncio.timeout(HANG_S):
            answer = await reader.read()
        return answer
    finally:
        writer.close()


async def _kept_alive_answer(stream: Stream, request: bytes) -> bytes:
    """Send `request` on a keep-alive connection; its answer's head (the body read and dropped)."""
    reader, writer = stream
    writer.write(request)
    async with asyncio.timeout(HANG_S):
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
    return head


def _ok(answer: bytes) -> bool:
    return b" 200 " in answer.split(b"\r\n", 1)[0]


async def test_connections_holding_partial_heads_are_capped_and_a_scrape_still_answered() -> None:
    async with _serving() as server:
        opened: list[Stream] = []
        try:
            for _ in range(METRICS_LIMITS.max_connections + 20):
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
                writer.write(_PARTIAL_HEAD)
                await writer.drain()
                opened.append((reader, writer))
            # The 20 accepted first are closed to make room; the cap's worth that came after stay open.
            for reader, _ in opened[:20]:
                assert await _closed_by_server(reader)
            scrape = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            answer = await _status_then_closed(server.port, scrape)
            assert _ok(answer) and answer.endswith(b"\r\n\r\n" + EXPOSITION)
        finally:
            for _, writer in opened:
                writer.close()


async def test_a_partial_head_is_cut_at_the_deadline_and_an_idle_scraper_outlives_it() -> None:
    limits = ConnectionLimits(max_connections=10, request_timeout_seconds=0.5, idle_timeout_seconds=60)
    async with _serving(limits) as server:
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", server.port)
        slow_writer.write(_PARTIAL_HEAD)
        scraper = await asyncio.open_connection("127.0.0.1", server.port)
        for _ in range(2):  # keep-alive scrapes, two deadlines apart
            assert _ok(await _kept_alive_answer(scraper, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"))
            await asyncio.sleep(2 * limits.request_timeout_seconds)
        assert await _closed_by_server(slow_reader)
        slow_writer.close()
        scraper[1].close()


async def test_only_get_metrics_is_served_there() -> None:
    async with _serving() as server:
        wrong_path = b"GET /mutate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        assert b" 404 " in (await _status_then_closed(server.port, wrong_path)).split(b"\r\n", 1)[0]
        wrong_method = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        assert b" 405 " in (await _status_then_closed(server.port, wrong_method)).split(b"\r\n", 1)[0]


# What Prometheus sends for each scrape (about 300 bytes): 110 of them pass 32 KiB, half an hour of
# scrapes at a 15 s interval on one keep-alive connection.
_PROMETHEUS_HEAD = (
    b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:9395\r\nUser-Agent: Prometheus/2.53.0\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;"
    b"version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2\r\nAccept-Encoding: gzip\r\n"
    b"X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"
)


async def test_a_scraper_kept_alive_past_32_kib_of_scrapes_is_not_closed_while_idle() -> None:
    # Only the admission port closes a connection after 32 KiB received (what TLS buffers keep); the
    # metrics port is plain HTTP, and Prometheus keeps its connection across scrapes.
    async with _serving() as server:
        scraper = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            scrapes = MAX_KEEP_ALIVE_READ_BYTES // len(_PROMETHEUS_HEAD) + 2
            assert scrapes * len(_PROMETHEUS_HEAD) > MAX_KEEP_ALIVE_READ_BYTES
            for _ in range(scrapes + 1):
                assert _ok(await _kept_alive_answer(scraper, _PROMETHEUS_HEAD))
            assert server.listener is not None and server.listener.evicted == server.listener.expired == 0
        finally:
            scraper[1].close()
