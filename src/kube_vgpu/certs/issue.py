"""Pure certificate minting: an ECDSA P-256 CA and serving certificates it signs, as PEM bytes.

No files and no Kubernetes here: the `certs` CLI stores the results in a Secret or on disk, and
tests mint throwaway CAs in memory. Times come from an injectable `now`, so expiry is testable.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Backdating absorbs clock skew between the issuer and the API server that verifies the chain.
_BACKDATE = datetime.timedelta(minutes=5)


class IssueError(ValueError):
    """Inputs that cannot make a valid certificate (no names, bad IP, non-positive validity)."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM-encoded (the key as unencrypted PKCS#8)."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def from_parsed(cls, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
        """PEM-encode a parsed certificate and its key."""
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM), key_pem)

    @property
    def certificate(self) -> x509.Certificate:
        """The parsed certificate."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def private_key(self) -> ec.EllipticCurvePrivateKey:
        """The parsed private key."""
        key = serialization.load_pem_private_key(self.key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise IssueError(f"expected an ECDSA private key, got {type(key).__name__}")
        return key

    @property
    def not_after(self) -> datetime.datetime:
        """When the certificate expires (timezone-aware UTC)."""
        return self.certificate.not_valid_after_utc

    def remaining(self, now: datetime.datetime | None = None) -> datetime.timedelta:
        """Validity left at `now` (default: the current time); negative once expired."""
        return self.not_after - (now or _utcnow())


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """Digital signatures always; certificate and CRL signing for a CA only."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _validity(days: int, now: datetime.datetime | None) -> tuple[datetime.datetime, datetime.datetime]:
    if days < 1:
        raise IssueError(f"validity must be at least 1 day, got {days}")
    start = (now or _utcnow()) - _BACKDATE
    return start, start + _BACKDATE + datetime.timedelta(days=days)


def issue_ca(common_name: str, days: int, *, now: datetime.datetime | None = None) -> Issued:
    """A self-signed CA certificate (path length 0: it signs serving certificates only)."""
    if not common_name:
        raise IssueError("the CA needs a non-empty common name")
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start, end = _validity(days, now)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued.from_parsed(cert, key)


def issue_serving(
    ca: Issued,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    days: int = 365,
    *,
    now: datetime.datetime | None = None,
) -> Issued:
    """A TLS server certificate for `dns_names` and `ip_addresses`, signed by `ca`.

    The first DNS name (or IP) is also the subject common name; clients verify the SANs only.
    """
    if not dns_names and not ip_addresses:
        raise IssueError("a serving certificate needs at least one DNS name or IP address")
    try:
        ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    except ValueError as exc:
        raise IssueError(str(exc)) from None
    if any(not name or " " in name for name in dns_names):
        raise IssueError(f"DNS names must be non-empty and hold no spaces, got {list(dns_names)}")
    ca_cert = ca.certificate
    ca_key = ca.private_key
    key = _new_key()
    start, end = _validity(days, now)
    # A leaf must not outlive its CA: verifiers would reject the chain once the CA expires anyway.
    end = min(end, ca_cert.not_valid_after_utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else str(ips[0]))])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return Issued.from_parsed(cert, key)
