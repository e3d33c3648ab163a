"""Serving-certificate rotation as a Secret volume does it (a `..data` symlink swapped), while a client
keeps sending: new handshakes see the new certificate, open connections keep working, nothing fails.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from kube_vgpu.certs.issue import Issued, issue_ca, issue_serving
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.serving.tls import CertReloader
from tests.support.timeouts import HANG_S
from tests.support.webhook import ThreadedWebhook, TlsFiles, container, pod, post, review, wait_for


class SecretVolume:
    """A directory laid out like a mounted Secret: files are symlinks through `..data`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        self.version = 0

    def publish(self, cert_pem: bytes, key_pem: bytes) -> None:
        """Write a new version and swap `..data` to it atomically, as the kubelet does."""
        self.version += 1
        version_dir = self.root / f"..v{self.version}"
        version_dir.mkdir()
        (version_dir / "tls.crt").write_bytes(cert_pem)
        (version_dir / "tls.key").write_bytes(key_pem)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(version_dir.name)
        os.replace(tmp, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"


def _serial(conn: http.client.HTTPSConnection) -> int:
    assert conn.sock is not None
    der = conn.sock.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _leaf(ca: Issued) -> Issued:
    return issue_serving(ca, ["localhost"], ["127.0.0.1"], 1)


@pytest.fixture
def ca() -> Issued:
    return issue_ca("rotation-ca", 1)


def test_reloader_loads_by_content_and_refuses_a_mismatched_pair(tmp_path: Path, ca: Issued) -> None:
    volume = SecretVolume(tmp_path / "secret")
    first, second = _leaf(ca), _leaf(ca)
    volume.publish(first.cert_pem, first.key_pem)
    reloader = CertReloader(volume.cert, volume.key)
    assert reloader.reload_if_changed() and reloader.reloads == 0  # unchanged content: nothing to do
    volume.publish(second.cert_pem, first.key_pem)  # half-rotated: cert and key do not match
    assert not reloader.reload_if_changed() and reloader.reloads == 0
    volume.publish(second.cert_pem, second.key_pem)
    assert reloader.reload_if_changed() and reloader.reloads == 1
    assert reloader.context.minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.fixture
def rotating(
    apiserver: ApiServerStandin, tmp_path: Path, ca: Issued
) -> Iterator[tuple[ThreadedWebhook, SecretVolume]]:
    volume = SecretVolume(tmp_path / "secret")
    first = _leaf(ca)
    volume.publish(first.cert_pem, first.key_pem)
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    tls = TlsFiles(ca, ca_file, volume.cert, volume.key)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, tls, cert_poll_seconds=0.05) as webhook:
        yield webhook, volume


def test_rotation_under_load_drops_nothing(
    rotating: tuple[ThreadedWebhook, SecretVolume], ca: Issued
) -> None:
    webhook, volume = rotating
    body = review(pod(container(memory=10)))
    kept_open = webhook.connect()
    assert post(kept_open, body)[0] == 200
    old_serial = _serial(kept_open)
    seen: list[tuple[int, int]] = []  # (serial, status) per fresh connection, in order
    errors: list[BaseException] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            conn = webhook.connect()
            try:
                status, _ = post(conn, body)
                seen.append((_serial(conn), status))
            except BaseException as exc:
                errors.append(exc)
            finally:
                conn.close()

    thread = threading.Thread(target=client, name="rotation-client")
    thread.start()
    try:
        wait_for(lambda: len(seen) >= 5 or bool(errors), "five reviews on the first certificate")
        new = _leaf(ca)
        new_serial = x509.load_pem_x509_certificate(new.cert_pem).serial_number
        volume.publish(new.cert_pem, new.key_pem)
        wait_for(lambda: any(s == new_serial for s, _ in seen) or bool(errors), "the new certificate")
        count = len(seen)
        wait_for(lambda: len(seen) >= count + 5 or bool(errors), "five more reviews")
    finally:
        stop.set()
        thread.join(timeout=HANG_S)
    assert errors == []
    assert {status for _, status in seen} == {200}
    serials = [s for s, _ in seen]
    assert serials[0] == old_serial and serials[-1] == new_serial
    switch = serials.index(new_serial)
    assert set(serials[:switch]) == {old_serial} and set(serials[switch:]) == {new_serial}
    # The connection opened before the swap still works, on its original certificate.
    assert post(kept_open, body)[0] == 200 and _serial(kept_open) == old_serial
