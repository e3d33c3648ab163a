"""Judging stored certificate material: is it a CA and a serving certificate that work for these names?

Pure: bytes in (the four files of a Secret or a directory), findings out. Anything that does not parse,
does not match or does not chain is a finding, never an exception, because the answer to bad material
is always the same: issue new material.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
TLS_CERT = "tls.crt"
TLS_KEY = "tls.key"
FILES = (CA_CERT, CA_KEY, TLS_CERT, TLS_KEY)

# Clocks of the jobs and of the machine that issued a certificate may disagree a little; a certificate
# that starts within this margin is not "not yet valid" (re-issuing it would only make two jobs fight).
CLOCK_SKEW = timedelta(hours=1)


def normalize_host(host: str) -> str:
    """A host as it is compared with a certificate's names: IPs in canonical form, DNS names lower case."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def certificate_hosts(cert: x509.Certificate) -> frozenset[str]:
    """The DNS names and IP addresses a certificate's subjectAltName covers, normalised."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return frozenset()
    names = [normalize_host(n) for n in san.get_values_for_type(x509.DNSName)]
    names += [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return frozenset(names)


def _public_der(key: ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey) -> bytes:
    public = key.public_key() if isinstance(key, ec.EllipticCurvePrivateKey) else key
    return public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _p256_key(data: bytes | None, name: str) -> tuple[ec.EllipticCurvePrivateKey | None, str | None]:
    if not data:
        return None, f"{name} is missing"
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None, f"{name} is not a PEM private key"
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        return None, f"{name} is not an ECDSA P-256 key"
    return key, None


def _certificates(data: bytes | None, name: str) -> tuple[list[x509.Certificate], str | None]:
    if not data:
        return [], f"{name} is missing"
    try:
        return x509.load_pem_x509_certificates(data), None
    except ValueError:
        return [], f"{name} is not a PEM certificate"


def _days(delta: timedelta) -> str:
    return f"{delta.total_seconds() / 86400:.1f} days"


def _validity_problem(
    cert: x509.Certificate, name: str, now: datetime, renew_before: timedelta
) -> str | None:
    if cert.not_valid_before_utc > now + CLOCK_SKEW:
        return f"{name} is not valid before {cert.not_valid_before_utc.isoformat()}"
    remaining = cert.not_valid_after_utc - now
    if remaining <= timedelta(0):
        return f"{name} expired on {cert.not_valid_after_utc.isoformat()}"
    if remaining < renew_before:
        return f"{name} expires in {_days(remaining)} (renewed when fewer than {_days(renew_before)} remain)"
    return None


@dataclass(frozen=True)
class SigningCA:
    """A CA certificate with its private key: what new serving certificates are signed with."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def remaining(self, now: datetime) -> timedelta:
        """How long the CA certificate stays valid after `now`."""
        return self.cert.not_valid_after_utc - now


@dataclass(frozen=True)
class Findings:
    """What is wrong with stored material, if anything.

    `ca` is the CA that can still sign (present whenever its certificate and key match and it has
    not expired, even when it is too close to expiry to keep); `ca_problem` says why the CA should
    not be kept as it is, `serving_problem` the same for the serving certificate and key.
    `other_cas` are the further unexpired CA certificates of `ca.crt` (a previous CA, still trusted
    so that servers not yet reloaded keep working while caBundles move to the new CA).
    """

    ca: SigningCA | None
    ca_problem: str | None
    serving_problem: str | None
    other_cas: tuple[x509.Certificate, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Nothing to fix."""
        return self.ca_problem is None and self.serving_problem is None

    @property
    def problem(self) -> str | None:
        """The first reason to issue anything, for logs and messages."""
        return self.ca_problem or self.serving_problem


def _examine_ca(
    material: Mapping[str, bytes], now: datetime, renew_before: timedelta
) -> tuple[SigningCA | None, str | None, tuple[x509.Certificate, ...]]:
    certs, problem = _certificates(material.get(CA_CERT), CA_CERT)
    key, key_problem = _p256_key(material.get(CA_KEY), CA_KEY)
    unexpired = [c for c in certs if c.not_valid_after_utc > now and _is_ca(c)]
    if problem or key is None:
        return None, problem or key_problem, tuple(unexpired)
    wanted = _public_der(key)
    match = next((c for c in certs if _public_der_of(c) == wanted), None)
    others = tuple(c for c in unexpired if c is not match)
    if match is None:
        return None, f"{CA_KEY} does not belong to any certificate in {CA_CERT}", others
    if not _is_ca(match):
        return None, f"the certificate in {CA_CERT} is not a CA", others
    if match.not_valid_after_utc <= now or match.not_valid_before_utc > now + CLOCK_SKEW:
        return None, _validity_problem(match, CA_CERT, now, renew_before), others
    ca = SigningCA(match, key)
    return ca, _validity_problem(match, CA_CERT, now, renew_before), others


def _is_ca(cert: x509.Certificate) -> bool:
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _public_der_of(cert: x509.Certificate) -> bytes | None:
    try:
        public = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return None
    if not isinstance(public, ec.EllipticCurvePublicKey):
        return None
    return _public_der(public)


def _examine_serving(
    material: Mapping[str, bytes],
    ca: SigningCA | None,
    hosts: frozenset[str],
    now: datetime,
    renew_before: timedelta,
) -> str | None:
    certs, problem = _certificates(material.get(TLS_CERT), TLS_CERT)
    if problem:
        return problem
    key, problem = _p256_key(material.get(TLS_KEY), TLS_KEY)
    if key is None:
        return problem
    cert = certs[0]
    if _public_der_of(cert) != _public_der(key):
        return f"{TLS_KEY} does not match {TLS_CERT}"
    if ca is None:
        return f"{TLS_CERT} has no usable CA to chain to"
    try:
        cert.verify_directly_issued_by(ca.cert)
    except (ValueError, TypeError, InvalidSignature):
        return f"{TLS_CERT} is not signed by the CA in {CA_CERT}"
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = x509.ExtendedKeyUsage([])
    if ExtendedKeyUsageOID.SERVER_AUTH not in usages:
        return f"{TLS_CERT} is not for server authentication"
    have = certificate_hosts(cert)
    if have != hosts:
        return f"{TLS_CERT} names {sorted(have)}, wanted {sorted(hosts)}"
    return _validity_problem(cert, TLS_CERT, now, renew_before)


def examine(
    material: Mapping[str, bytes], hosts: Iterable[str], *, now: datetime, renew_before: timedelta
) -> Findings:
    """Check material (file name -> content) against the names the serving certificate must cover."""
    if not any(material.get(name) for name in FILES):
        return Findings(None, "no certificates stored yet", "no certificates stored yet")
    ca, ca_problem, others = _examine_ca(material, now, renew_before)
    wanted = frozenset(normalize_host(h) for h in hosts)
    serving_problem = _examine_serving(material, ca, wanted, now, renew_before)
    return Findings(ca, ca_problem, serving_problem, others)
