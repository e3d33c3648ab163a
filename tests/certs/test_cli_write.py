"""`kube-vgpu certs write`: files with private modes, IP SANs, and a real TLS handshake with them."""

from __future__ import annotations

import contextlib
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from kube_vgpu.certs.errors import EXIT_USAGE
from kube_vgpu.cli.main import main


@contextlib.contextmanager
def tls_server(cert: Path, key: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 serving `cert`; each connection gets b"ok". Yields its port."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # listener closed: the test is done
            with connection:
                try:
                    with context.wrap_socket(connection, server_side=True) as tls:
                        tls.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    continue  # the client refused the certificate

    thread = threading.Thread(target=serve, name="tls-server")
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join()


def handshake(port: int, ca: Path, hostname: str) -> tuple[bytes, x509.Certificate]:
    """Connect verifying against `ca` for `hostname`; returns what the server sent and its certificate."""
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        context.wrap_socket(raw, server_hostname=hostname) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return tls.recv(2), x509.load_der_x509_certificate(der)


def write(out: Path, *hosts: str, force: bool = False) -> int:
    return main(["certs", "write", "--out", str(out), "--host", *hosts, *(["--force"] if force else [])])


def test_files_modes_and_a_handshake_for_dns_and_ip_names(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert write(out, "localhost", "127.0.0.1", "::1") == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"ca.crt": 0o644, "ca.key": 0o600, "tls.crt": 0o644, "tls.key": 0o600}
    leaf = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]

    with tls_server(out / "tls.crt", out / "tls.key") as port:
        assert handshake(port, out / "ca.crt", "127.0.0.1")[0] == b"ok"
        assert handshake(port, out / "ca.crt", "localhost")[0] == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            handshake(port, out / "ca.crt", "elsewhere.example")


def test_valid_files_are_left_alone_and_force_renews_with_the_same_ca(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert write(tmp_path, "localhost") == 0
    before = {p.name: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.iterdir()}
    assert write(tmp_path, "localhost") == 0
    assert "nothing written" in capsys.readouterr().out
    assert {p.name: (p.stat().st_ino, p.read_bytes()) for p in tmp_path.iterdir()} == before

    assert write(tmp_path, "localhost", force=True) == 0
    assert "new serving certificate, CA kept" in capsys.readouterr().out
    assert (tmp_path / "ca.crt").read_bytes() == before["ca.crt"][1]
    assert (tmp_path / "tls.crt").read_bytes() != before["tls.crt"][1]
    with tls_server(tmp_path / "tls.crt", tmp_path / "tls.key") as port:
        assert handshake(port, tmp_path / "ca.crt", "localhost")[0] == b"ok"

    # Another host set means another serving certificate, still from the same CA.
    assert write(tmp_path, "localhost", "10.0.0.7") == 0
    assert (tmp_path / "ca.crt").read_bytes() == before["ca.crt"][1]


def test_the_log_says_why_files_were_written_and_never_reason_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="kube_vgpu.certs"):
        assert write(tmp_path, "localhost") == 0
        assert write(tmp_path, "localhost") == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "kube_vgpu.certs"]
    assert lines[0].startswith("event=files_written") and "reason='no certificates stored yet'" in lines[0]
    assert lines[1] == f"event=files_valid directory={tmp_path} action=keep"
    assert not any("None" in line for line in lines)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "bad host"], "--host must be DNS names or IP addresses, got 'bad host'"),
        (["--host", "x", "--days", "30"], "--days must be more than 30"),
        (["--host", "x", "--days", "400", "--ca-days", "365"], "--ca-days must be at least --days (400)"),
        # Past the bound, the dates would overflow (a traceback, before the bound existed).
        (["--host", "x", "--days", "36501", "--ca-days", "36501"], "--days must be at most 36500"),
        (["--host", "x", "--ca-days", "36501"], "--ca-days must be at most 36500"),
        (["--host", "x", "--days", "99999999", "--ca-days", "99999999"], "--days must be at most 36500"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["certs", "write", "--out", str(tmp_path / "out"), *argv]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_the_longest_validity_is_issued(tmp_path: Path) -> None:
    assert (
        main(
            ["certs", "write", "--out", str(tmp_path), "--host", "x", "--days", "36500", "--ca-days", "36500"]
        )
        == 0
    )
    for name in ("ca.crt", "tls.crt"):
        cert = x509.load_pem_x509_certificate((tmp_path / name).read_bytes())
        assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days >= 36500


def test_out_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert main(["certs", "write", "--out", str(tmp_path / "file"), "--host", "x"]) == EXIT_USAGE
    assert "--out must be a directory" in capsys.readouterr().err
