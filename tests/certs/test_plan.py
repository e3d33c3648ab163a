"""The CA rule: kept across serving-certificate renewals while it outlives them, replaced (and still
trusted alongside the new one) when it does not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from kube_vgpu.certs.check import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, examine
from kube_vgpu.certs.issue import issue_ca, issue_serving
from kube_vgpu.certs.plan import RENEW_BEFORE, Plan, build, decide, service_hosts, split_hosts

NOW = datetime(2030, 6, 1, tzinfo=UTC)
HOSTS = service_hosts("svc", "ns")


def stored(*, ca_days: int, days: int, issued: datetime = NOW) -> dict[str, bytes]:
    ca = issue_ca("ca", ca_days, now=issued)
    leaf = issue_serving(ca, HOSTS, days=days, now=issued)
    return {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem, TLS_CERT: leaf.cert_pem, TLS_KEY: leaf.key_pem}


def test_service_hosts_and_split() -> None:
    assert HOSTS == ["svc", "svc.ns", "svc.ns.svc", "svc.ns.svc.cluster.local"]
    assert split_hosts(["a", "10.0.0.1", "::1", "b.c"]) == (["a", "b.c"], ["10.0.0.1", "::1"])


def test_valid_is_kept() -> None:
    assert decide(examine(stored(ca_days=3650, days=365), HOSTS, now=NOW, renew_before=RENEW_BEFORE),
                  days=365, now=NOW) == Plan("keep", None)  # fmt: skip


def test_renewal_keeps_the_ca_and_its_bundle() -> None:
    old = stored(ca_days=3650, days=365, issued=NOW - timedelta(days=345))
    findings = examine(old, HOSTS, now=NOW, renew_before=RENEW_BEFORE)
    plan = decide(findings, days=365, now=NOW)
    assert plan.action == "renew"
    assert plan.reason is not None
    assert "expires in 20.0 days" in plan.reason
    new = build(plan, findings, HOSTS, days=365, ca_days=3650, now=NOW)
    assert new[CA_CERT] == old[CA_CERT]
    assert new[TLS_CERT] != old[TLS_CERT]
    after = examine(new, HOSTS, now=NOW, renew_before=RENEW_BEFORE)
    assert after.ok, after.problem
    leaf = x509.load_pem_x509_certificate(new[TLS_CERT])
    assert leaf.not_valid_after_utc - NOW == timedelta(days=365)


def test_a_ca_that_would_not_outlive_a_new_serving_certificate_is_replaced_but_still_trusted() -> None:
    # The CA has 200 days left: enough to keep the current serving certificate, not to sign a 365-day one.
    old = stored(ca_days=400, days=200, issued=NOW - timedelta(days=200))
    findings = examine(old, HOSTS, now=NOW, renew_before=RENEW_BEFORE)
    assert findings.ca_problem is None
    assert findings.serving_problem is not None  # expired with the 200 days
    plan = decide(findings, days=365, now=NOW)
    assert plan.action == "reissue"
    new = build(plan, findings, HOSTS, days=365, ca_days=3650, now=NOW)
    bundle = x509.load_pem_x509_certificates(new[CA_CERT])
    old_ca = x509.load_pem_x509_certificate(old[CA_CERT])
    assert len(bundle) == 2
    assert bundle[1] == old_ca
    assert bundle[0].not_valid_after_utc - NOW == timedelta(days=3650)
    assert examine(new, HOSTS, now=NOW, renew_before=RENEW_BEFORE).ok
    # The next renewal keeps both: the previous CA stays trusted until it expires, then it is dropped.
    later = NOW + timedelta(days=340)
    findings = examine(new, HOSTS, now=later, renew_before=RENEW_BEFORE)
    renewed = build(decide(findings, days=365, now=later), findings, HOSTS, days=365, ca_days=3650, now=later)
    assert renewed[CA_CERT] == bundle[0].public_bytes(Encoding.PEM)


def test_a_ca_whose_key_is_lost_is_replaced_and_its_certificate_still_trusted() -> None:
    old = stored(ca_days=3650, days=365)
    old[CA_KEY] = b"junk"
    findings = examine(old, HOSTS, now=NOW, renew_before=RENEW_BEFORE)
    plan = decide(findings, days=365, now=NOW)
    assert plan == Plan("reissue", "ca.key is not a PEM private key")
    new = build(plan, findings, HOSTS, days=365, ca_days=3650, now=NOW)
    # Webhook configurations may still carry the old CA: it stays in the bundle until it expires.
    assert len(x509.load_pem_x509_certificates(new[CA_CERT])) == 2
    assert examine(new, HOSTS, now=NOW, renew_before=RENEW_BEFORE).ok


def test_keep_builds_nothing() -> None:
    findings = examine(stored(ca_days=3650, days=365), HOSTS, now=NOW, renew_before=RENEW_BEFORE)
    with pytest.raises(ValueError, match="writes nothing"):
        build(Plan("keep", None), findings, HOSTS, days=365, ca_days=3650, now=NOW)
