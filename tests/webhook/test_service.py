"""`kube-vgpu webhook` as a real process: serves HTTPS against the stand-in API server, and on SIGTERM
stops accepting, finishes the review in flight on a keep-alive connection, closes it, exits 0.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kube_vgpu.contract.config import Config
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.service import Options, WebhookServer, log_caller_protection
from tests.support.timeouts import HANG_S
from tests.support.webhook import A100, container, gpu_node, pod, review, write_tls

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_sigterm_finishes_the_review_in_flight_and_exits_zero(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    apiserver.put(gpu_node("n1", "hami-core", [(A100, 40960)]))
    tls = write_tls(tmp_path / "tls")
    port = _free_port()
    log_file = tmp_path / "webhook.log"
    command = [
        sys.executable, "-m", "kube_vgpu", "webhook",
        "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
        "--host", "127.0.0.1", "--port", str(port),
        "--kubeconfig", str(apiserver.write_kubeconfig(tmp_path / "kubeconfig")),
        # Generous: what is tested is the order of events, not how fast a loaded machine sends.
        "--shutdown-timeout", "120", "--request-timeout", "120",
    ]  # fmt: skip
    with (
        log_file.open("wb") as log,
        subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT) as proc,
    ):
        try:
            conn = _wait_ready(port, tls.client_context(), proc)
            body = json.dumps(review(pod(container(memory=1000)), uid="before")).encode()
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            first = conn.getresponse()
            assert first.status == 200 and json.loads(first.read())["response"]["uid"] == "before"

            # A second review on the same keep-alive connection, its body only half sent at SIGTERM.
            body = json.dumps(review(pod(container(memory=1000)), uid="in-flight")).encode()
            conn.putrequest("POST", "/mutate")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Content-Length", str(len(body)))
            # The 100 Continue comes from the review's handler: once it is read, the review is in
            # flight at the webhook (no sleep racing the webhook's reading of the head).
            conn.putheader("Expect", "100-continue")
            conn.endheaders()
            assert conn.sock is not None
            assert _read_interim(conn.sock).startswith(b"HTTP/1.1 100 ")
            conn.send(body[: len(body) // 2])
            proc.send_signal(signal.SIGTERM)
            _wait_refused(port)  # no longer accepting
            conn.send(body[len(body) // 2 :])
            response = conn.getresponse()
            answer = json.loads(response.read())
            assert response.status == 200 and answer["response"]["uid"] == "in-flight"
            assert answer["response"]["allowed"] and answer["response"]["patch"]
            assert response.getheader("Connection", "").lower() == "close"
            conn.close()
            assert proc.wait(timeout=120) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log_file.read_text()
    assert "event=webhook_stopped" in text and "Traceback" not in text, text
    assert re.search(r"event=webhook_draining connections=\d+ in_flight=1\b", text), text
    # Started with neither client certificates nor a NetworkPolicy: it says so, as a warning.
    assert "event=webhook_caller_protection client_certificate=off network_policy=off" in text, text
    assert "can send forged reviews" in text


def _wait_ready(
    port: int, context: ssl.SSLContext, proc: subprocess.Popen[bytes]
) -> http.client.HTTPSConnection:
    """A keep-alive connection, once /readyz says the cache has synced."""
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the webhook exited early"
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=HANG_S)
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                return conn
        except OSError:
            pass
        conn.close()
        time.sleep(0.1)
    raise AssertionError("the webhook never became ready")


def _read_interim(sock: socket.socket) -> bytes:
    """One interim answer's head (up to its blank line), read off the socket before the final answer."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        chunk = sock.recv(1)
        assert chunk, f"the connection closed after {head!r}"
        head += chunk
    return head


def _wait_refused(port: int) -> None:
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=HANG_S):
                pass
        except ConnectionRefusedError:
            return
        time.sleep(0.02)
    raise AssertionError("the webhook still accepts connections after SIGTERM")


@pytest.mark.parametrize(
    ("client_ca", "network_policy"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_the_start_up_log_and_the_metric_say_which_protection_of_the_port_is_on(
    apiserver: ApiServerStandin,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    client_ca: bool,
    network_policy: bool,
) -> None:
    level = logging.INFO if client_ca or network_policy else logging.WARNING
    on_off = {True: "on", False: "off"}
    said = f"client_certificate={on_off[client_ca]} network_policy={on_off[network_policy]}"
    tls = write_tls(tmp_path / "tls")
    options = Options(
        tls_cert_file=tls.cert_file,
        tls_key_file=tls.key_file,
        client_ca_file=tls.ca_file if client_ca else None,
        network_policy=network_policy,
    )
    with caplog.at_level(logging.INFO, logger="kube_vgpu.webhook"):
        log_caller_protection(options)
    (record,) = [r for r in caplog.records if "webhook_caller_protection" in r.getMessage()]
    assert record.levelno == level and said in record.getMessage()
    assert ("forged reviews" in record.getMessage()) == (level == logging.WARNING)
    kube = Kube(apiserver.api_client(), component="webhook")
    try:
        exposition = WebhookServer(options, Config(), kube=kube).metrics.exposition().decode()
    finally:
        kube.close()
    assert (
        f'kube_vgpu_webhook_caller_protection{{mechanism="client-certificate"}} {float(client_ca)}'
        in exposition
    )
    assert (
        f'kube_vgpu_webhook_caller_protection{{mechanism="network-policy"}} {float(network_policy)}'
        in exposition
    )
