"""What to do about stored certificate material, and the new material when something must change.

Pure: findings and flags in, a decision and PEM bytes out. The one rule about the CA:

* keep the CA whenever it can sign and stays valid for the whole life of a new serving certificate
  (`ca.notAfter >= now + days`): only the serving certificate is re-issued, so caBundles already
  patched into webhook configurations keep verifying across serving-certificate rotations;
* otherwise issue a new CA (valid `ca_days`, 10 years by default) and keep the old CA's certificate,
  while it has not expired, after the new one in `ca.crt`: a webhook configuration patched with the new
  bundle still trusts a replica that has not yet reloaded its old serving certificate.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kube_vgpu.certs.check import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, Findings
from kube_vgpu.certs.issue import Issued, issue_ca, issue_serving

RENEW_BEFORE = timedelta(days=30)
DEFAULT_DAYS = 365
DEFAULT_CA_DAYS = 3650
# The longest validity issued: 100 years, far past any use and far inside the dates a certificate
# (and Python's datetime, whose overflow was a traceback) can hold.
MAX_DAYS = 36500
CA_COMMON_NAME = "kube-vgpu-webhook-ca"

Action = Literal["keep", "renew", "reissue"]


@dataclass(frozen=True)
class Plan:
    """`keep`: nothing to write; `renew`: new serving certificate, same CA; `reissue`: new CA too."""

    action: Action
    reason: str | None


def service_hosts(service: str, namespace: str) -> list[str]:
    """The names the API server may use to reach a Service: short, namespaced, `.svc` and the full FQDN."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def split_hosts(hosts: Sequence[str]) -> tuple[list[str], list[str]]:
    """Hosts as (DNS names, IP addresses), order kept."""
    dns: list[str] = []
    ips: list[str] = []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns.append(host)
    return dns, ips


def decide(findings: Findings, *, days: int, now: datetime) -> Plan:
    """Keep valid material; otherwise re-issue the serving certificate, and the CA only when it must go."""
    if findings.ok:
        return Plan("keep", None)
    ca = findings.ca
    if ca is not None and findings.ca_problem is None and ca.remaining(now) >= timedelta(days=days):
        return Plan("renew", findings.serving_problem)
    if findings.ca_problem is not None:
        return Plan("reissue", findings.ca_problem)
    return Plan("reissue", f"{CA_CERT} expires before a new {days}-day serving certificate would")


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def build(
    plan: Plan,
    findings: Findings,
    hosts: Sequence[str],
    *,
    days: int,
    ca_days: int,
    now: datetime,
) -> dict[str, bytes]:
    """The material to store for a `renew` or `reissue` plan (file name -> PEM bytes)."""
    if plan.action == "keep":
        raise ValueError("a keep plan writes nothing")
    dns, ips = split_hosts(hosts)
    if plan.action == "renew" and findings.ca is not None:
        ca = Issued.from_parsed(findings.ca.cert, findings.ca.key)
        trusted = [ca.cert_pem, *(_pem(c) for c in findings.other_cas)]
    else:
        ca = issue_ca(CA_COMMON_NAME, ca_days, now=now)
        previous = [findings.ca.cert] if findings.ca is not None else []
        previous += [c for c in findings.other_cas if c not in previous]
        trusted = [ca.cert_pem, *(_pem(c) for c in previous if c.not_valid_after_utc > now)]
    serving = issue_serving(ca, dns, ips, days, now=now)
    return {
        CA_CERT: b"".join(trusted),
        CA_KEY: ca.key_pem,
        TLS_CERT: serving.cert_pem,
        TLS_KEY: serving.key_pem,
    }
