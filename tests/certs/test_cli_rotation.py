"""Rotation end to end: the real webhook server serves files from `certs write` laid out as a Secret
volume; new certificates swapped in the way the kubelet does (a `..data` symlink) are served to new
handshakes without a restart, while a connection opened before keeps working."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509

from kube_vgpu.certs.issue import Issued
from kube_vgpu.cli.main import main
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from tests.support.webhook import ThreadedWebhook, TlsFiles


def publish(volume: Path, source: Path, version: str) -> None:
    """Project tls.crt and tls.key of `source` into `volume` as the kubelet updates a Secret volume.

    Each version lives in its own hidden folder; `..data` points at the current one and is replaced
    by renaming a new symlink over it, so readers of `volume/tls.crt` switch files in one step.
    """
    volume.mkdir(exist_ok=True)
    folder = volume / f"..{version}"
    folder.mkdir()
    for name in ("tls.crt", "tls.key"):
        shutil.copy2(source / name, folder / name)
    data = volume / "..data"
    previous = data.resolve() if data.is_symlink() else None
    staged = volume / "..data_tmp"
    staged.symlink_to(folder.name)
    os.replace(staged, data)
    for name in ("tls.crt", "tls.key"):
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(Path("..data") / name)
    if previous is not None:
        shutil.rmtree(previous)


def serial_of(pem_file: Path) -> int:
    return x509.load_pem_x509_certificate(pem_file.read_bytes()).serial_number


def served_serial(port: int, ca_file: Path) -> int:
    """A new TLS handshake verifying against `ca_file` for 127.0.0.1; the served certificate's serial."""
    context = ssl.create_default_context(cafile=str(ca_file))
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def healthz(conn: http.client.HTTPSConnection) -> int:
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    response.read()
    return response.status


def test_new_certificates_are_served_without_a_restart(apiserver: ApiServerStandin, tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    write = ["certs", "write", "--out", str(staging), "--host", "127.0.0.1", "localhost"]
    assert main(write) == 0
    volume = tmp_path / "volume"
    publish(volume, staging, "v1")
    first = serial_of(staging / "tls.crt")

    ca = Issued((staging / "ca.crt").read_bytes(), (staging / "ca.key").read_bytes())
    files = TlsFiles(ca, staging / "ca.crt", volume / "tls.crt", volume / "tls.key")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, files, cert_poll_seconds=0.05) as webhook:
        assert served_serial(webhook.port, staging / "ca.crt") == first
        before = webhook.connect()
        assert healthz(before) == 200

        # A renewal: new serving certificate, same CA, so the caBundle stays as it is.
        assert main([*write, "--force"]) == 0
        second = serial_of(staging / "tls.crt")
        assert second != first
        publish(volume, staging, "v2")

        pause = threading.Event()
        for _ in range(1500):  # until the poller (every 0.05 s) has seen the swap; 30 s at most
            served = served_serial(webhook.port, staging / "ca.crt")
            if served != first:
                break
            pause.wait(0.02)
        assert served == second
        assert webhook.server.reloader.reloads == 1
        assert healthz(before) == 200  # the connection opened before the swap was not dropped
        assert healthz(webhook.connect()) == 200
