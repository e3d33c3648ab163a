"""Certificate minting: the chain verifies for the names asked, keys match, validity is bounded."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from kube_vgpu.certs.issue import IssueError, issue_ca, issue_serving


def _verify(ca_pem: bytes, leaf_pem: bytes, host: str) -> None:
    store = Store([x509.load_pem_x509_certificate(ca_pem)])
    verifier = PolicyBuilder().store(store).build_server_verifier(x509.DNSName(host))
    verifier.verify(x509.load_pem_x509_certificate(leaf_pem), [])


def test_serving_certificate_verifies_for_its_names_only() -> None:
    ca = issue_ca("kube-vgpu-ca", 30)
    leaf = issue_serving(ca, ["svc", "svc.ns.svc"], ["127.0.0.1"], 10)
    _verify(ca.cert_pem, leaf.cert_pem, "svc.ns.svc")
    with pytest.raises(VerificationError):
        _verify(ca.cert_pem, leaf.cert_pem, "other.ns.svc")
    sans = leaf.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert isinstance(leaf.private_key.curve, ec.SECP256R1)


def test_ssl_accepts_the_issued_pair() -> None:
    ca = issue_ca("ca", 1)
    leaf = issue_serving(ca, ["localhost"], days=1)
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(leaf.cert_pem)
        key.write_bytes(leaf.key_pem)
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)


def test_validity_is_days_and_never_outlives_the_ca() -> None:
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    ca = issue_ca("ca", 10, now=now)
    leaf = issue_serving(ca, ["x"], days=365, now=now)
    assert ca.not_after - now == datetime.timedelta(days=10)
    assert leaf.not_after == ca.not_after
    assert ca.remaining(now + datetime.timedelta(days=11)) < datetime.timedelta(0)


@pytest.mark.parametrize(
    ("dns", "ips", "days", "match"),
    [([], [], 1, "at least one"), (["x"], ["not-an-ip"], 1, "not-an-ip"), (["x"], [], 0, "at least 1 day")],
)
def test_bad_inputs_are_refused(dns: list[str], ips: list[str], days: int, match: str) -> None:
    with pytest.raises(IssueError, match=match):
        issue_serving(issue_ca("ca", 1), dns, ips, days)
