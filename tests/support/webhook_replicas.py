"""Several `kube-vgpu webhook` processes against one stand-in API server, as the replica tests of the
quota run them: each with its own cache, API client and metrics port, sharing one TLS pair."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import aiohttp

from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import TlsFiles, write_tls

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Replica:
    """One webhook process and where it listens."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, metrics_port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log
        self.base = f"https://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"


@contextlib.contextmanager
def webhook_replicas(
    apiserver: ApiServerStandin, tmp_path: Path, count: int, *, release: str, args: Sequence[str] = ()
) -> Iterator[tuple[list[Replica], TlsFiles]]:
    """Start `count` webhook processes on `apiserver` (more flags in `args`); on exit stop them and
    fail when any of them logged a traceback."""
    tls = write_tls(tmp_path / "tls")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    started: list[Replica] = []
    try:
        for i in range(count):
            port, metrics_port = free_port(), free_port()
            log = tmp_path / f"webhook-{i}.log"
            command = [
                sys.executable, "-m", "kube_vgpu", "webhook",
                "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
                "--host", "127.0.0.1", "--port", str(port), "--metrics-port", str(metrics_port),
                "--kubeconfig", str(kubeconfig),
                "--release-namespace", release, "--log-level", "warning",
                *args,
            ]  # fmt: skip
            with log.open("wb") as out:
                proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
            started.append(Replica(proc, port, metrics_port, log))
        yield started, tls
    finally:
        for replica in started:
            replica.proc.terminate()
        for replica in started:
            try:
                replica.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                replica.proc.kill()
                replica.proc.wait()
    for replica in started:
        assert "Traceback" not in replica.log.read_text(), replica.log.read_text()


async def wait_for(condition: Callable[[], Awaitable[bool]], what: str, *, tries: int = 1500) -> None:
    """Poll an async condition until it holds (bounded by tries, not by a clock)."""
    for _ in range(tries):
        if await condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never saw {what}")


async def ready(session: aiohttp.ClientSession, replica: Replica, context: ssl.SSLContext) -> bool:
    """Whether the replica answers /readyz with 200 (it must still be running)."""
    assert replica.proc.poll() is None, replica.log.read_text()
    try:
        async with session.get(f"{replica.base}/readyz", ssl=context) as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def memory_used(session: aiohttp.ClientSession, replica: Replica, namespace: str) -> float | None:
    """The replica's `kube_vgpu_quota_used` of vgpu-memory in `namespace` (None: not exported)."""
    async with session.get(replica.metrics_url) as response:
        text = await response.text()
    prefix = f'kube_vgpu_quota_used{{namespace="{namespace}",resource="vgpu-memory"}} '
    line = next((x for x in text.splitlines() if x.startswith(prefix)), None)
    return float(line[len(prefix) :]) if line else None


async def equals(value: Awaitable[float | None], expected: float) -> bool:
    """Whether an awaited figure is `expected` (for `wait_for`)."""
    return await value == expected


def memory_used_is(
    session: aiohttp.ClientSession, replica: Replica, namespace: str, expected: float
) -> Callable[[], Awaitable[bool]]:
    """A `wait_for` condition: the replica exports `expected` as the vgpu-memory used in `namespace`."""
    return lambda: equals(memory_used(session, replica, namespace), expected)


def is_ready(
    session: aiohttp.ClientSession, replica: Replica, context: ssl.SSLContext
) -> Callable[[], Awaitable[bool]]:
    """A `wait_for` condition: the replica answers /readyz with 200."""
    return lambda: ready(session, replica, context)
