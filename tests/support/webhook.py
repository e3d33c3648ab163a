"""Builders the webhook tests share: GPU nodes as the node plugin publishes them, pods, reviews, and
Volcano's own type rule (`pkg/scheduler/api/devices/nvidia/vgpu/type.go`) to check what the patched
annotations mean to the scheduler.

It holds no tests; it is named like a test module so it lives among the webhook's test files.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import dataclasses
import http.client
import json
import logging
import socket
import ssl
import threading
import time
import urllib.request
import uuid as uuidlib
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import jsonpatch
import pytest

from kube_vgpu.certs.issue import Issued, issue_ca, issue_serving
from kube_vgpu.contract.config import Config
from kube_vgpu.contract.models import model_label_name, register_type
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NODE_REGISTER,
    NOUSE_GPUTYPE,
    USE_GPUTYPE,
    UUID_LABEL_PREFIX,
)
from kube_vgpu.contract.register import GpuRecord, encode_register
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.cli import new_event_loop
from kube_vgpu.webhook.records import NodeRecord
from kube_vgpu.webhook.service import Options, WebhookServer
from tests.support.timeouts import HANG_S

_T = TypeVar("_T")

A10 = "NVIDIA A10"
A100 = "NVIDIA A100-PCIE-40GB"
H100 = "NVIDIA H100 80GB HBM3"
NUMBER = "volcano.sh/vgpu-number"
MEMORY = "volcano.sh/vgpu-memory"
PERCENT = "volcano.sh/vgpu-memory-percentage"
CORES = "volcano.sh/vgpu-cores"


def gpu_uuid(node: str, index: int) -> str:
    """A full-length, stable GPU UUID for a node's GPU (UUIDs on a node must not be substrings)."""
    return "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{index}"))


def gpu_node(
    name: str,
    mode: str,
    gpus: Sequence[tuple[str, int]],
    *,
    reference_form: bool = False,
    hostname: str | None = None,
    register: bool = True,
) -> NodeRecord:
    """A Node with the labels and register annotation kube-vgpu's node plugin writes for (model, MiB) GPUs."""
    records = [
        GpuRecord(
            uuid=gpu_uuid(name, i),
            count=10,
            memory_mib=mib,
            type=f"NVIDIA-{model}" if reference_form else register_type(model),
            healthy=True,
            mode=mode,
        )
        for i, (model, mib) in enumerate(gpus)
    ]
    labels = {HOSTNAME_LABEL: hostname or name, MODE_LABEL: mode}
    labels |= {MODEL_LABEL_PREFIX + model_label_name(model): "true" for model, _ in gpus}
    labels |= {UUID_LABEL_PREFIX + r.uuid: "true" for r in records}
    annotations = {NODE_REGISTER: encode_register(records)} if register else {}
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {},
    }
    return cast(NodeRecord, node)  # a whole Node: its record's fields and more


def container(name: str = "main", /, **amounts: Any) -> dict[str, Any]:
    """A container with vGPU limits given as number=, memory=, percent=, cores= (strings or ints)."""
    keys = {"number": NUMBER, "memory": MEMORY, "percent": PERCENT, "cores": CORES}
    limits = {keys[k]: str(v) for k, v in amounts.items()}
    return {"name": name, "image": "busybox", "resources": {"limits": limits} if limits else {}}


def pod(
    *containers: dict[str, Any],
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    name: str = "p",
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """A Pod as the API server hands it to admission (defaults applied are left out)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": list(containers or [container()]), **spec},
    }


def review(
    obj: Mapping[str, Any] | None,
    *,
    uid: str = "review-1",
    operation: str = "CREATE",
    kind: str = "Pod",
    dry_run: bool = False,
) -> dict[str, Any]:
    """An AdmissionReview v1 request for `obj`."""
    namespace = str(((obj or {}).get("metadata") or {}).get("namespace", "default"))
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "operation": operation,
            "namespace": namespace,
            "name": str(((obj or {}).get("metadata") or {}).get("name", "")),
            "object": obj,
            "dryRun": dry_run,
        },
    }


def apply(obj: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The object after a JSONPatch (the input is not changed)."""
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), list(patch))
    return result


def volcano_type_allows(annotations: Mapping[str, str], type_field: str) -> bool:
    """Volcano's type check for one GPU (`pkg/scheduler/api/devices/nvidia/vgpu/type.go`): case-insensitive
    substrings, items untrimmed."""
    if "NVIDIA" not in type_field:
        return False
    if USE_GPUTYPE in annotations:
        return any(item.lower() in type_field.lower() for item in annotations[USE_GPUTYPE].split(","))
    if NOUSE_GPUTYPE in annotations:
        return not any(item.lower() in type_field.lower() for item in annotations[NOUSE_GPUTYPE].split(","))
    return True


def required_terms(obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pod's required nodeSelectorTerms ([] when it has none)."""
    node_affinity = ((obj.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms: list[dict[str, Any]] = required.get("nodeSelectorTerms") or []
    return terms


def node_matches(node: Mapping[str, Any], terms: Sequence[Mapping[str, Any]]) -> bool:
    """Kubernetes' required node affinity rule for label expressions and metadata.name fields."""
    if not terms:
        return True
    labels: Mapping[str, str] = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}

    def requirement(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
        key, op, vals = req["key"], req["operator"], req.get("values") or []
        if op == "Exists":
            return key in values
        if op == "DoesNotExist":
            return key not in values
        if op == "In":
            return values.get(key) in vals
        if op == "NotIn":
            return values.get(key) not in vals
        raise AssertionError(f"operator {op} not modelled")

    def term(t: Mapping[str, Any]) -> bool:
        exprs = t.get("matchExpressions") or []
        flds = t.get("matchFields") or []
        if not exprs and not flds:
            return False
        return all(requirement(e, labels) for e in exprs) and all(requirement(f, fields) for f in flds)

    return any(term(t) for t in terms)


# --- a real webhook over HTTPS, on a loop of its own ------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and a serving pair for 127.0.0.1/localhost, written to disk."""

    ca: Issued
    ca_file: Path
    cert_file: Path
    key_file: Path

    def client_context(self) -> ssl.SSLContext:
        """A client context trusting only this CA."""
        return ssl.create_default_context(cafile=str(self.ca_file))


def write_tls(directory: Path, ca: Issued | None = None) -> TlsFiles:
    """Mint a CA (unless given) and a serving certificate into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = ca or issue_ca("kube-vgpu-test-ca", 1)
    leaf = issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)
    files = TlsFiles(ca, directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    files.ca_file.write_bytes(ca.cert_pem)
    files.cert_file.write_bytes(leaf.cert_pem)
    files.key_file.write_bytes(leaf.key_pem)
    return files


class ThreadedWebhook:
    """`webhook.service.WebhookServer` on a background event loop, for synchronous test clients."""

    def __init__(
        self,
        kubeconfig: Path,
        tls: TlsFiles,
        config: Config | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        cert_poll_seconds: float = 10.0,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] = new_event_loop,
        **overrides: Any,
    ) -> None:
        """`overrides` replace `Options` fields (limits=, client_ca_file=, shutdown_timeout_seconds=);
        the loop is the one `kube-vgpu webhook` serves on unless `loop_factory` says otherwise."""
        options = Options(
            tls_cert_file=tls.cert_file,
            tls_key_file=tls.key_file,
            host="127.0.0.1",
            port=0,
            metrics_port=0,
            kubeconfig=str(kubeconfig),
            cert_poll_seconds=cert_poll_seconds,
            shutdown_timeout_seconds=5.0,
        )
        options = dataclasses.replace(options, **overrides)
        self.tls = tls
        self._connections: list[http.client.HTTPSConnection | socket.socket] = []
        self._loop = loop_factory()
        self._thread = threading.Thread(target=self._loop.run_forever, name="webhook-under-test", daemon=True)
        self._thread.start()
        self.server: WebhookServer = self.call(_make_server(options, config or Config(), clock))

    def call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run a coroutine on the webhook's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=30)

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Start a coroutine on the webhook's loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def read(self, fn: Callable[[], _T]) -> _T:
        """Evaluate `fn` on the webhook's loop (the cache is only touched there)."""

        async def run() -> _T:
            return fn()

        return self.call(run())

    def __enter__(self) -> ThreadedWebhook:
        self.call(self.server.start())

        async def synced() -> None:
            async with asyncio.timeout(20):
                await self.server.cache.wait_synced()

        self.call(synced())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close_connections()
        try:
            self.call(self.server.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            # What is still pending (aiohttp reading and dropping the rest of an unread body for up
            # to its linger time) is cancelled and finished here, as asyncio.run does; left pending,
            # it is destroyed later and logs an ERROR into whichever test runs then.
            pending = asyncio.all_tasks(self._loop)
            for task in pending:
                task.cancel()
            if pending:
                self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
            self._loop.close()

    @property
    def port(self) -> int:
        return self.server.port

    def metrics(self) -> str:
        """The Prometheus text of the webhook's metrics port (plain HTTP, apart from admission)."""
        url = f"http://127.0.0.1:{self.server.metrics_server.port}/metrics"
        with urllib.request.urlopen(url, timeout=30) as response:
            text: str = response.read().decode()
            return text

    def connect(self) -> http.client.HTTPSConnection:
        """A keep-alive HTTPS connection that verifies the server against the test CA."""
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.port, context=self.tls.client_context(), timeout=30
        )
        self._connections.append(conn)  # closed at exit even when a test fails half-way
        return conn

    def open_raw(self, timeout: float = HANG_S) -> socket.socket:
        """A TCP connection to the admission port that has not begun TLS (closed at exit)."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        self._connections.append(raw)  # closed even when the handshake below fails
        return raw

    def open_tls(self, context: ssl.SSLContext | None = None, timeout: float = HANG_S) -> ssl.SSLSocket:
        """A TLS socket to the admission port, handshake done, for writing raw HTTP (closed at exit)."""
        raw = self.open_raw(timeout)
        sock = (context or self.tls.client_context()).wrap_socket(raw, server_hostname="localhost")
        self._connections.append(sock)
        return sock

    def close_connections(self) -> None:
        """Close every connection opened so far (before a stop, which waits for their TLS close)."""
        while self._connections:
            self._connections.pop().close()


def serve_one_gpu(apiserver: ApiServerStandin, tmp_path: Path, **overrides: Any) -> ThreadedWebhook:
    """A webhook (not yet entered) against `apiserver` with one A100 node; `overrides` as for
    `ThreadedWebhook` (limits=, client_ca_file=, tls=...)."""
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    tls = overrides.pop("tls", None) or write_tls(tmp_path / "tls")
    return ThreadedWebhook(apiserver.write_kubeconfig(tmp_path / "kubeconfig"), tls, **overrides)


async def _make_server(options: Options, config: Config, clock: Callable[[], float]) -> WebhookServer:
    return WebhookServer(options, config, clock=clock)


def post(
    conn: http.client.HTTPSConnection, body: bytes | Mapping[str, Any], path: str = "/mutate"
) -> tuple[int, Any]:
    """POST a body (a mapping is sent as JSON); returns the status and the decoded JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    raw = response.read()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw.decode(errors="replace")


def post_once(
    webhook: ThreadedWebhook, body: bytes, path: str, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    """POST raw bytes (with `headers` besides the JSON content type) on a connection of their own
    (closed after): the status and the raw answer."""
    conn = webhook.connect()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get(conn: http.client.HTTPSConnection, path: str) -> tuple[int, bytes]:
    """GET a path; the status and raw body."""
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, response.read()


def request_head(
    path: str = "/mutate", length: int | None = None, *, method: str = "POST", extra: str = ""
) -> bytes:
    """An HTTP/1.1 request head with a Host (and a Content-Length when `length` is given); `extra` is
    more header lines, each ending in CRLF."""
    framing = "" if length is None else f"Content-Length: {length}\r\n"
    return f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n{framing}{extra}\r\n".encode()


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One whole answer from a raw socket: its head and its body (by its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the answer: {data[:200]!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next((int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length")), 0)
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the answer"
        body += chunk
    return head, body


def status_of(head: bytes) -> int:
    """The status code of an answer's head."""
    return int(head.split(b" ", 2)[1])


def exchange(webhook: ThreadedWebhook, data: bytes) -> tuple[int, bytes, bytes]:
    """Send raw bytes on a TLS connection of their own: the answer's status, head and body."""
    with webhook.open_tls() as sock:
        sock.sendall(data)
        head, body = read_answer(sock)
    return status_of(head), head, body


def wait_for(condition: Callable[[], bool], what: str) -> None:
    """Poll until `condition` holds; fail naming `what` at HANG_S (only a hang gets there)."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def rss_mib() -> float:
    """This process's resident memory (the webhook under test runs in it), in MiB."""
    with open("/proc/self/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing was logged at ERROR or with a traceback."""
    noisy = [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not noisy, noisy


def closed_by_server(sock: ssl.SSLSocket) -> bool:
    """Block (up to the socket's timeout) until the server closes the connection; True when it did."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
