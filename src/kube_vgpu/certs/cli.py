"""`kube-vgpu certs create|patch|write`: the webhook's certificates in a Secret, its caBundle, or files.

Exit codes (see `certs.errors`): 0 done (also when nothing needed changing), 1 other failure,
2 bad flags, 3 Secret or webhook configuration not found, 4 an object unusable as it is,
5 RBAC denied a request, 6 API server unreachable or no credentials.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import re
import sys
from pathlib import Path

from kube_vgpu.certs.cluster import ensure_secret, patch_ca_bundle, utcnow
from kube_vgpu.certs.errors import EXIT_OK, CertsError, UnreachableError, UsageError
from kube_vgpu.certs.files import ensure_files
from kube_vgpu.certs.plan import DEFAULT_CA_DAYS, DEFAULT_DAYS, MAX_DAYS, RENEW_BEFORE, Action
from kube_vgpu.contract.logformat import configure_logging
from kube_vgpu.kubeapi.client import Kube, KubeConfigError, load_api_client
from kube_vgpu.kubeapi.flags import add_cluster_arguments
from kube_vgpu.kubeapi.permissions import Component

log = logging.getLogger("kube_vgpu.certs")

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_HOSTNAME = re.compile(
    r"^(\*\.)?[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*\.?$"
)


def _add_validity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--days",
        type=int,
        default=DEFAULT_DAYS,
        help=f"serving certificate validity; renewed when fewer than {RENEW_BEFORE.days} days remain "
        f"(default {DEFAULT_DAYS})",
    )
    parser.add_argument(
        "--ca-days",
        type=int,
        default=DEFAULT_CA_DAYS,
        help=f"CA validity when a new CA is made; the CA is kept while it outlives a new serving "
        f"certificate (default {DEFAULT_CA_DAYS})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `create`, `patch` and `write` sub-subcommands and their flags."""
    actions = parser.add_subparsers(dest="certs_command", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create",
        help="make or renew the CA and serving certificate in a kubernetes.io/tls Secret",
        description="Idempotent: a Secret that is valid for the Service is left untouched.",
    )
    create.add_argument("--service", required=True, help="the webhook's Service name")
    create.add_argument("--namespace", required=True, help="namespace of the Service and the Secret")
    create.add_argument(
        "--secret-name", required=True, help="Secret to hold tls.crt, tls.key, ca.crt, ca.key"
    )
    _add_validity(create)
    add_cluster_arguments(create)
    create.set_defaults(certs_run=_run_create)

    patch = actions.add_parser(
        "patch",
        help="write the Secret's ca.crt into every webhook's clientConfig.caBundle",
        description="Only webhooks whose caBundle differs are written.",
    )
    patch.add_argument(
        "--webhook-name", required=True, help="the name of the Mutating- and ValidatingWebhookConfiguration"
    )
    patch.add_argument("--namespace", required=True, help="namespace of the Secret")
    patch.add_argument("--secret-name", required=True, help="Secret holding ca.crt")
    add_cluster_arguments(patch)
    patch.set_defaults(certs_run=_run_patch)

    write = actions.add_parser(
        "write",
        help="write the CA and serving certificate as files, for local runs",
        description="Writes ca.crt, ca.key, tls.crt and tls.key (keys mode 0600), each replaced atomically; "
        "valid files for the same hosts are left alone unless --force.",
    )
    write.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the files")
    write.add_argument(
        "--host", required=True, nargs="+", metavar="H", help="DNS names or IP addresses to serve"
    )
    _add_validity(write)
    write.add_argument(
        "--force", action="store_true", help="re-issue the serving certificate even when it is valid"
    )
    write.set_defaults(certs_run=_run_write)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


def _check_validity(args: argparse.Namespace) -> None:
    _check(
        args.days > RENEW_BEFORE.days,
        f"--days must be more than {RENEW_BEFORE.days} (certificates are renewed when fewer than "
        f"{RENEW_BEFORE.days} days remain), got {args.days}",
    )
    for flag, days in (("--days", args.days), ("--ca-days", args.ca_days)):
        _check(days <= MAX_DAYS, f"{flag} must be at most {MAX_DAYS} (100 years), got {days}")
    _check(
        args.ca_days >= args.days,
        f"--ca-days must be at least --days ({args.days}): the CA has to outlive the serving "
        f"certificate, got {args.ca_days}",
    )


def _check_name(flag: str, value: str, pattern: re.Pattern[str], what: str, limit: int) -> None:
    _check(
        bool(pattern.match(value)) and len(value) <= limit,
        f"{flag} must be {what} (lower-case letters, digits, '-'; at most {limit} characters), got {value!r}",
    )


def _what_was_issued(action: Action) -> str:
    return "new CA and serving certificate" if action == "reissue" else "new serving certificate, CA kept"


def _kube(args: argparse.Namespace, component: Component) -> Kube:
    try:
        return Kube(load_api_client(args.kubeconfig, args.context), component=component)
    except KubeConfigError as exc:
        raise UnreachableError(str(exc)) from None


def _run_create(args: argparse.Namespace) -> str:
    _check_name("--service", args.service, _DNS_LABEL, "a DNS label", 63)
    _check_name("--namespace", args.namespace, _DNS_LABEL, "a DNS label", 63)
    _check_name("--secret-name", args.secret_name, _DNS_SUBDOMAIN, "a DNS subdomain", 253)
    _check_validity(args)
    kube = _kube(args, "certs-create")
    try:
        outcome = ensure_secret(
            kube,
            namespace=args.namespace,
            name=args.secret_name,
            service=args.service,
            days=args.days,
            ca_days=args.ca_days,
        )
    finally:
        kube.close()
    secret = f"Secret {args.namespace}/{args.secret_name}"
    if outcome.action == "keep":
        return f"{secret} is valid for {args.service}.{args.namespace}.svc; nothing written"
    verb = "created" if outcome.created else "updated"
    return f"{secret} {verb}: {_what_was_issued(outcome.action)} ({outcome.reason})"


def _run_patch(args: argparse.Namespace) -> str:
    _check_name("--webhook-name", args.webhook_name, _DNS_SUBDOMAIN, "a DNS subdomain", 253)
    _check_name("--namespace", args.namespace, _DNS_LABEL, "a DNS label", 63)
    _check_name("--secret-name", args.secret_name, _DNS_SUBDOMAIN, "a DNS subdomain", 253)
    kube = _kube(args, "certs-patch")
    try:
        outcome = patch_ca_bundle(
            kube, webhook_name=args.webhook_name, namespace=args.namespace, secret_name=args.secret_name
        )
    finally:
        kube.close()
    configuration = f"webhook configurations {args.webhook_name}"
    if not outcome.patched:
        return f"{configuration}: all {outcome.webhooks} webhooks already carry the CA; nothing written"
    return f"{configuration}: caBundle written for {', '.join(outcome.patched)}"


def _run_write(args: argparse.Namespace) -> str:
    for host in args.host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            _check(
                bool(_HOSTNAME.match(host)) and len(host) <= 253,
                f"--host must be DNS names or IP addresses, got {host!r}",
            )
    _check_validity(args)
    out: Path = args.out
    _check(not out.exists() or out.is_dir(), f"--out must be a directory, got the file {str(out)!r}")
    try:
        plan = ensure_files(
            out, args.host, days=args.days, ca_days=args.ca_days, force=args.force, now=utcnow()
        )
    except OSError as exc:
        raise CertsError(f"cannot write certificates to {out}: {exc.strerror or exc}") from None
    if plan.action == "keep":
        return f"{out}: certificates valid for {', '.join(args.host)}; nothing written"
    return f"{out}: {_what_was_issued(plan.action)} written ({plan.reason})"


def run(args: argparse.Namespace) -> int:
    """Run the chosen action; errors are printed as one line on stderr and become the exit code."""
    configure_logging(logging.INFO)
    try:
        summary: str = args.certs_run(args)
    except CertsError as exc:
        print(f"kube-vgpu certs {args.certs_command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(summary)
    return EXIT_OK
