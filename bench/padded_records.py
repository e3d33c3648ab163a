"""Idle TLS connections whose last request came in TLS 1.3 records padded to 16 KiB each: the webhook's
RSS, and how many of them it kept open.

A TLS 1.3 record may carry one byte of HTTP and up to 16 KiB of padding, which the server's TLS layer
reads (into uvloop's buffer and OpenSSL's) and drops before HTTP sees it. Each connection hands
shakes, sends a 42-byte `GET /healthz` split into `--records` records padded to `--block` bytes
(OpenSSL's `SSL_CTX_set_block_padding`, called through ctypes since Python does not expose it) in one
write, reads its answer and stays open; `--block 0` sends the same request unpadded, in one record.
With `--key-updates N`, each connection then also sends N TLS 1.3 KeyUpdate messages, each in a
record padded to `--block`: bytes with no HTTP in them at all, sent while the connection is idle.

    .venv/bin/python bench/padded_records.py                 # 1,000 connections, 16 records of 16 KiB
    .venv/bin/python bench/padded_records.py --block 0       # the same request, unpadded
    .venv/bin/python bench/padded_records.py --records 1 --key-updates 16   # idle, 256 KiB of KeyUpdates
    .venv/bin/python bench/padded_records.py --records 1 --key-updates 64 --after head   # 1 MiB, mid-request

`--after head` sends the first byte of a next request before the KeyUpdates, so a request (and its
deadline) is running while they arrive.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import ctypes.util
import importlib.util
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kube_vgpu.certs.issue import issue_ca, issue_serving  # noqa: E402
from kube_vgpu.standins.apiserver.server import ApiServerStandin  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_webhook", REPO / "bench" / "webhook.py")
assert _spec is not None and _spec.loader is not None
bench_webhook = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_webhook)

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


def padding_context(ca_pem: bytes, block: int) -> ssl.SSLContext:
    """A TLS 1.3 client context whose records are padded to `block` bytes (0: not padded)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    if block:
        libssl = ctypes.CDLL(ctypes.util.find_library("ssl"))
        libssl.SSL_CTX_set_block_padding.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libssl.SSL_CTX_set_block_padding.restype = ctypes.c_int
        # CPython's SSLContext object holds its SSL_CTX pointer right after the object header.
        ssl_ctx = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
        if libssl.SSL_CTX_set_block_padding(ssl_ctx, block) != 1:
            raise SystemExit(f"libssl refused a block padding of {block}")
    return context


def _libssl() -> ctypes.CDLL:
    libssl = ctypes.CDLL(ctypes.util.find_library("ssl"))
    libssl.SSL_set_block_padding.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libssl.SSL_set_block_padding.restype = ctypes.c_int
    libssl.SSL_key_update.argtypes = [ctypes.c_void_p, ctypes.c_int]
    libssl.SSL_key_update.restype = ctypes.c_int
    libssl.SSL_do_handshake.argtypes = [ctypes.c_void_p]
    libssl.SSL_do_handshake.restype = ctypes.c_int
    return libssl


def key_updates(tls: ssl.SSLObject, count: int, block: int) -> None:
    """Have `tls` write `count` KeyUpdate messages (not requesting one back), each in a record padded
    to `block` bytes, into its outgoing BIO."""
    libssl = _libssl()
    # CPython's _ssl._SSLSocket holds a weak reference to its socket, then its SSL pointer.
    inner = tls._sslobj  # type: ignore[attr-defined]
    ssl_ptr = ctypes.c_void_p.from_address(id(inner) + object.__basicsize__ + 8).value
    if block and libssl.SSL_set_block_padding(ssl_ptr, block) != 1:
        raise SystemExit(f"libssl refused a block padding of {block}")
    for _ in range(count):
        if libssl.SSL_key_update(ssl_ptr, 0) != 1:  # SSL_KEY_UPDATE_NOT_REQUESTED
            raise SystemExit("libssl refused a KeyUpdate")
        libssl.SSL_do_handshake(ssl_ptr)  # writes it


def open_one(
    port: int,
    context: ssl.SSLContext,
    records: int,
    *,
    updates: int = 0,
    block: int = 0,
    after: str = "answer",
) -> tuple[socket.socket, bytes, int] | None:
    """One connection that sent REQUEST in `records` records in one write, then `updates` padded
    KeyUpdates once answered: the socket, the answer's head and the bytes on the wire after the
    handshake; None when the server closed it first."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    try:
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                raw.sendall(outgoing.read())
                data = raw.recv(65536)
                if not data:
                    raise ConnectionError("closed in the handshake") from None
                incoming.write(data)
        raw.sendall(outgoing.read())
        for number in range(records):
            tls.write(REQUEST[number * len(REQUEST) // records : (number + 1) * len(REQUEST) // records])
        wire = outgoing.read()
        raw.sendall(wire)
        answer = b""
        while b"\r\n\r\n" not in answer:
            data = raw.recv(65536)
            if not data:
                raise ConnectionError("closed before the answer")
            incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError):
                answer += tls.read(65536)
        if updates:
            if after == "head":
                tls.write(REQUEST[:1])
            key_updates(tls, updates, block)
            sent = outgoing.read()
            raw.sendall(sent)
            wire += sent
    except (OSError, ssl.SSLError):
        raw.close()
        return None
    return raw, answer.partition(b"\r\n\r\n")[0], len(wire)


def still_open(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has not closed (whatever it sent before is read and dropped)."""
    count = 0
    for sock in socks:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--records", type=int, default=16, help="records the 42-byte request is split into")
    parser.add_argument("--block", type=int, default=16384, help="pad each record to this; 0: no padding")
    parser.add_argument(
        "--key-updates",
        type=int,
        default=0,
        help="padded KeyUpdate messages each connection sends once answered",
    )
    parser.add_argument(
        "--after",
        choices=("answer", "head"),
        default="answer",
        help="send the KeyUpdates once answered, or after the first byte of a next request",
    )
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kube-vgpu-padded-"))
    ca = issue_ca("bench-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    (workdir / "tls.crt").write_bytes(leaf.cert_pem)
    (workdir / "tls.key").write_bytes(leaf.key_pem)
    with ApiServerStandin() as api:
        api.put(bench_webhook.node(0))
        port = bench_webhook.free_port()
        command = [
            sys.executable, "-m", "kube_vgpu", "webhook",
            "--tls-cert-file", str(workdir / "tls.crt"), "--tls-key-file", str(workdir / "tls.key"),
            "--host", "127.0.0.1", "--port", str(port),
            "--metrics-port", str(bench_webhook.free_port()),
            "--kubeconfig", str(api.write_kubeconfig(workdir / "kubeconfig")),
            "--log-level", "warning",
        ]  # fmt: skip
        log = (workdir / "webhook.log").open("wb")
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        held: list[socket.socket] = []
        closing = wire = 0
        try:
            plain = ssl.create_default_context(cadata=ca.cert_pem.decode())
            asyncio.run(bench_webhook.wait_ready(f"https://127.0.0.1:{port}", plain, proc, 120))
            # KeyUpdates are padded on their own, after the answer: the request goes as it is.
            context = padding_context(ca.cert_pem, 0 if args.key_updates else args.block)
            rss_before, _ = bench_webhook.rss_mib(proc.pid)
            for _ in range(args.connections):
                opened = open_one(
                    port, context, args.records, updates=args.key_updates, block=args.block, after=args.after
                )
                if opened is not None:
                    held.append(opened[0])
                    closing += b"connection: close" in opened[1].lower()
                    wire = opened[2]
            # Idle connections are checked every second, and closed on the second finding in a row.
            time.sleep(3 if args.key_updates else 2)
            rss_after, rss_peak = bench_webhook.rss_mib(proc.pid)
            kept = still_open(held)
        finally:
            for sock in held:
                sock.close()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            log.close()
    print(
        f"{args.connections} TLS connections, each a {len(REQUEST)}-byte request in {args.records} records "
        + (
            f"then {'one byte of a next request and ' if args.after == 'head' else ''}"
            f"{args.key_updates} KeyUpdates padded to {args.block or 'no'} bytes"
            if args.key_updates
            else f"padded to {args.block or 'no'} bytes"
        )
        + f" ({wire} bytes on the wire after the handshake): {len(held)} answered, "
        f"{closing} answers said Connection: close, {kept} kept open by the webhook; webhook RSS "
        f"{rss_before:.0f} MiB before, {rss_after:.0f} MiB after (peak {rss_peak:.0f} MiB); "
        f"exit code on SIGTERM {code}"
    )
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
