"""The serving certificate, reloaded by content without a restart.

A mounted Secret is updated by swapping a `..data` symlink, which file events report unreliably, so
the files are read and hashed on a timer. A changed pair is first loaded into a scratch context, then
into the live SSLContext in place: new handshakes use it, open connections keep theirs. Both loads
read one private snapshot of the bytes, so a swap between reading the certificate and the key can
never install a mismatched pair; a bad pair is logged and retried.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


class TlsFilesError(RuntimeError):
    """The serving certificate and key cannot be loaded at start-up; the message names the files."""


def server_context() -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class CertReloader:
    """Owns the server's SSLContext and keeps it loaded with the current certificate files; with
    `client_ca_file`, callers must present a client certificate signed by a CA in it."""

    def __init__(
        self,
        cert_file: str | Path,
        key_file: str | Path,
        *,
        poll_seconds: float = 10.0,
        client_ca_file: str | Path | None = None,
    ) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.poll_seconds = poll_seconds
        self.context = server_context()
        if client_ca_file is not None:
            try:
                self.context.load_verify_locations(cafile=str(client_ca_file))
            except (ssl.SSLError, OSError) as exc:
                raise TlsFilesError(f"cannot load the client CA file {client_ca_file}: {exc}") from None
            self.context.verify_mode = ssl.CERT_REQUIRED
        self.reloads = 0
        self._digest = ""
        if not self.reload_if_changed():
            raise TlsFilesError(
                f"cannot load the serving certificate {self.cert_file} with key {self.key_file}"
            )

    def reload_if_changed(self) -> bool:
        """Load the files into the live context if their content changed; False when they cannot be used."""
        try:
            cert_pem, key_pem = self.cert_file.read_bytes(), self.key_file.read_bytes()
        except OSError as exc:
            log.warning(
                "event=tls_read_failed cert=%s key=%s error=%r", self.cert_file, self.key_file, str(exc)
            )
            return False
        digest = hashlib.sha256(cert_pem + b"\0" + key_pem).hexdigest()
        if digest == self._digest:
            return True
        with tempfile.TemporaryDirectory(prefix="kube-vgpu-tls-") as scratch:
            cert, key = Path(scratch, "tls.crt"), Path(scratch, "tls.key")
            cert.write_bytes(cert_pem)
            with os.fdopen(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
                handle.write(key_pem)
            try:
                # A failed load can leave a context with a certificate and no key: try a scratch one first.
                server_context().load_cert_chain(cert, key)
                self.context.load_cert_chain(cert, key)
            except (ssl.SSLError, OSError) as exc:
                log.warning("event=tls_load_failed cert=%s error=%r", self.cert_file, str(exc))
                return False
        first, self._digest = not self._digest, digest
        self.reloads += not first
        log.info("event=tls_loaded cert=%s sha256=%s reload=%s", self.cert_file, digest[:16], not first)
        return True

    async def run(self) -> None:
        """Poll the files until cancelled."""
        while True:
            await asyncio.sleep(self.poll_seconds)
            self.reload_if_changed()
