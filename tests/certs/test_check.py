"""Judging stored material: every way a Secret can be unusable is found, and valid material passes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from kube_vgpu.certs.check import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, certificate_hosts, examine
from kube_vgpu.certs.issue import issue_ca, issue_serving

NOW = datetime(2030, 6, 1, tzinfo=UTC)
RENEW = timedelta(days=30)
HOSTS = ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"]


def material(*, ca_days: int = 3650, days: int = 365, hosts: list[str] = HOSTS) -> dict[str, bytes]:
    ca = issue_ca("test-ca", ca_days, now=NOW)
    leaf = issue_serving(ca, hosts, days=days, now=NOW)
    return {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem, TLS_CERT: leaf.cert_pem, TLS_KEY: leaf.key_pem}


def test_valid_material_has_no_findings_and_names_compare_case_and_order_blind() -> None:
    findings = examine(material(), [h.upper() for h in reversed(HOSTS)], now=NOW, renew_before=RENEW)
    assert findings.ok, findings.problem
    assert findings.ca is not None


def test_nothing_stored() -> None:
    findings = examine({}, HOSTS, now=NOW, renew_before=RENEW)
    assert findings.ca is None
    assert findings.problem == "no certificates stored yet"


def _other_key_pem() -> bytes:
    return ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _rsa_key_pem() -> bytes:
    return rsa.generate_private_key(public_exponent=65537, key_size=1024).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.mark.parametrize(
    ("broken", "serving_problem"),
    [
        ({TLS_CERT: b"garbage"}, "tls.crt is not a PEM certificate"),
        ({TLS_KEY: b""}, "tls.key is missing"),
        (
            {TLS_KEY: b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"},
            "not a PEM private key",
        ),
        ({TLS_KEY: "other"}, "tls.key does not match tls.crt"),
        ({TLS_KEY: "rsa"}, "tls.key is not an ECDSA P-256 key"),
        ("foreign-signer", "tls.crt is not signed by the CA in ca.crt"),
        ("renamed", "tls.crt names"),
        ("expiring", "tls.crt expires in 10.0 days"),
    ],
)
def test_serving_problems_keep_the_ca_usable(broken: object, serving_problem: str) -> None:
    stored = material()
    if broken == "foreign-signer":
        foreign = issue_ca("other", 3650, now=NOW)
        leaf = issue_serving(foreign, HOSTS, days=365, now=NOW)
        stored |= {TLS_CERT: leaf.cert_pem, TLS_KEY: leaf.key_pem}
    elif broken == "renamed":
        stored = material(hosts=["old", "old.ns", "old.ns.svc", "old.ns.svc.cluster.local"])
    elif broken == "expiring":
        stored = material(days=10)
    else:
        assert isinstance(broken, dict)
        replacements = {"other": _other_key_pem(), "rsa": _rsa_key_pem()}
        stored |= {k: replacements.get(v, v) if isinstance(v, str) else v for k, v in broken.items()}
    findings = examine(stored, HOSTS, now=NOW, renew_before=RENEW)
    assert findings.ca_problem is None
    assert findings.ca is not None
    assert findings.serving_problem is not None
    assert serving_problem in findings.serving_problem


@pytest.mark.parametrize(
    ("broken", "ca_problem"),
    [
        ({CA_CERT: b"not pem"}, "ca.crt is not a PEM certificate"),
        ({CA_KEY: b""}, "ca.key is missing"),
        ({CA_KEY: "other"}, "ca.key does not belong to any certificate in ca.crt"),
        ("leaf-as-ca", "the certificate in ca.crt is not a CA"),
        ("short-ca", "ca.crt expires in 20.0 days"),
    ],
)
def test_ca_problems(broken: object, ca_problem: str) -> None:
    stored = material()
    if broken == "leaf-as-ca":
        stored |= {CA_CERT: stored[TLS_CERT], CA_KEY: stored[TLS_KEY]}
    elif broken == "short-ca":
        stored = material(ca_days=20, days=365)
    else:
        assert isinstance(broken, dict)
        stored |= {k: _other_key_pem() if v == "other" else v for k, v in broken.items()}
    findings = examine(stored, HOSTS, now=NOW, renew_before=RENEW)
    assert findings.ca_problem is not None
    assert ca_problem in findings.ca_problem
    assert not findings.ok


def test_a_bundle_finds_the_signing_ca_among_others() -> None:
    stored = material()
    older = issue_ca("older", 100, now=NOW - timedelta(days=50))
    expired = issue_ca("expired", 10, now=NOW - timedelta(days=50))
    stored[CA_CERT] = older.cert_pem + stored[CA_CERT] + expired.cert_pem
    findings = examine(stored, HOSTS, now=NOW, renew_before=RENEW)
    assert findings.ok, findings.problem
    assert [c.subject.rfc4514_string() for c in findings.other_cas] == ["CN=older"]


def test_not_yet_valid_beyond_clock_skew() -> None:
    stored = material()
    findings = examine(stored, HOSTS, now=NOW - timedelta(days=1), renew_before=RENEW)
    assert findings.ca_problem is not None
    assert "not valid before" in findings.ca_problem
    assert examine(stored, HOSTS, now=NOW - timedelta(minutes=30), renew_before=RENEW).ok


def test_certificate_hosts_reads_dns_and_ip_sans() -> None:
    ca = issue_ca("ca", 30, now=NOW)
    leaf = issue_serving(ca, ["Local.Host"], ["::1", "127.0.0.1"], days=10, now=NOW)
    assert certificate_hosts(leaf.certificate) == {"local.host", "::1", "127.0.0.1"}
    assert leaf.certificate.signature_hash_algorithm is not None
    assert isinstance(leaf.certificate.signature_hash_algorithm, hashes.SHA256)
