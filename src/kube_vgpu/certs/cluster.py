"""The Kubernetes side of `certs create` and `certs patch`: read, decide, write, and re-decide on conflicts.

Writes are conditional (create, or replace carrying the resourceVersion that was read; JSON patches
guarded by `test`), so two jobs running at once cannot both win: the loser re-reads, finds the
winner's valid material, and writes nothing. API failures become `certs.errors` with one clear line.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from cryptography import x509

from kube_vgpu.certs.cabundle import ca_bundle_patch
from kube_vgpu.certs.check import CA_CERT, examine
from kube_vgpu.certs.errors import (
    CertsError,
    InvalidError,
    NotFoundError,
    PermissionDeniedError,
    UnreachableError,
)
from kube_vgpu.certs.plan import RENEW_BEFORE, Action, build, decide, service_hosts
from kube_vgpu.kubeapi.client import ApiError, ApiUnavailable, Kind, Kube

log = logging.getLogger("kube_vgpu.certs")

SECRET_TYPE = "kubernetes.io/tls"
MANAGED_BY = {"app.kubernetes.io/managed-by": "kube-vgpu"}
WEBHOOK_CONFIGURATION = "mutatingwebhookconfigurations"
# (client kind, API plural, kind as users read it) of the two configurations `certs patch` writes.
MUTATING: tuple[Kind, str, str] = (
    "mutatingwebhookconfiguration",
    WEBHOOK_CONFIGURATION,
    "MutatingWebhookConfiguration",
)
VALIDATING: tuple[Kind, str, str] = (
    "validatingwebhookconfiguration",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
)
# Each retry follows a conflict, i.e. another writer's success; more than a few in a row means a
# writer that disagrees with us (another tool owning the Secret), and looping would only fight it.
ATTEMPTS = 5

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    """The current time, timezone-aware."""
    return datetime.now(UTC)


@dataclass(frozen=True)
class SecretOutcome:
    """What `ensure_secret` did: `action` is `keep` (nothing written), `renew` or `reissue`."""

    action: Action
    created: bool
    reason: str | None


@dataclass(frozen=True)
class PatchOutcome:
    """The webhooks whose caBundle was written (empty: all already carried the CA)."""

    patched: list[str]
    webhooks: int


def _raise_api(
    exc: ApiError | ApiUnavailable, kube: Kube, verb: str, resource: str, namespace: str | None
) -> NoReturn:
    """Turn a client error into the one-line error the CLI prints."""
    server = kube.api_client.configuration.host
    where = f' in namespace "{namespace}"' if namespace else ""
    if isinstance(exc, ApiUnavailable):
        raise UnreachableError(f"cannot reach the Kubernetes API server at {server}: {exc}") from None
    if exc.status == 403:
        raise PermissionDeniedError(
            f'permission denied: cannot "{verb}" resource "{resource}"{where} '
            f"(add it to the job's RBAC role); the API server said: {exc.message}"
        ) from None
    if exc.status == 401:
        raise UnreachableError(
            f"the Kubernetes API server at {server} refused the credentials: {exc}"
        ) from None
    if exc.status >= 500:
        raise UnreachableError(f"the Kubernetes API server at {server} failed: {exc}") from None
    if exc.status == 404:
        raise NotFoundError(f"{verb} {resource}{where}: {exc.message or 'not found'}") from None
    raise CertsError(f"{verb} {resource}{where} failed: {exc}") from None


def _get(kube: Kube, kind: Kind, resource: str, name: str, namespace: str | None) -> dict[str, Any] | None:
    try:
        return kube.get(kind, name, namespace=namespace)
    except (ApiError, ApiUnavailable) as exc:
        _raise_api(exc, kube, "get", resource, namespace)


def decode_secret_data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's `data` decoded; values that are not base64 are left out (treated as missing)."""
    decoded: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        if isinstance(value, str):
            try:
                decoded[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                continue
    return decoded


def _encode(material: Mapping[str, bytes]) -> dict[str, str]:
    return {key: base64.b64encode(value).decode("ascii") for key, value in material.items()}


def ensure_secret(
    kube: Kube,
    *,
    namespace: str,
    name: str,
    service: str,
    days: int,
    ca_days: int,
    clock: Clock = utcnow,
) -> SecretOutcome:
    """Make Secret `namespace/name` hold a valid CA and serving certificate for `service`.

    A Secret that already does is left untouched (not even re-written); one whose serving certificate
    is close to expiry, names other hosts, or does not parse, match or chain is re-issued.
    """
    hosts = service_hosts(service, namespace)
    for attempt in range(1, ATTEMPTS + 1):
        secret = _get(kube, "secret", "secrets", name, namespace)
        if secret is not None and secret.get("type", "Opaque") != SECRET_TYPE:
            raise InvalidError(
                f"Secret {namespace}/{name} has type {secret.get('type', 'Opaque')!r}, not {SECRET_TYPE!r} "
                "(a Secret's type cannot change): delete it or choose another --secret-name"
            )
        material = decode_secret_data(secret) if secret is not None else {}
        now = clock()
        findings = examine(material, hosts, now=now, renew_before=RENEW_BEFORE)
        plan = decide(findings, days=days, now=now)
        if plan.action == "keep":
            log.info("event=secret_valid secret=%s/%s", namespace, name)
            return SecretOutcome("keep", False, None)
        new = _encode(build(plan, findings, hosts, days=days, ca_days=ca_days, now=now))
        try:
            if secret is None:
                body = {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": name, "namespace": namespace, "labels": dict(MANAGED_BY)},
                    "type": SECRET_TYPE,
                    "data": new,
                }
                kube.create("secret", body, namespace=namespace)
            else:
                # Keep everything else about the object (labels, owners, unrelated keys); the
                # resourceVersion read above makes the replace fail if someone wrote in between.
                body = dict(secret)
                body["data"] = {**(secret.get("data") or {}), **new}
                kube.replace("secret", name, body, namespace=namespace)
        except ApiError as exc:
            # 409: another writer got there first; 404 on a replace: the Secret was deleted meanwhile.
            if exc.status == 409 or (exc.status == 404 and secret is not None):
                log.info(
                    "event=secret_conflict secret=%s/%s attempt=%d reason=%r",
                    namespace,
                    name,
                    attempt,
                    exc.reason,
                )
                continue
            _raise_api(exc, kube, "create" if secret is None else "update", "secrets", namespace)
        except ApiUnavailable as exc:
            _raise_api(exc, kube, "create" if secret is None else "update", "secrets", namespace)
        log.info(
            "event=secret_written secret=%s/%s action=%s created=%s reason=%r",
            namespace,
            name,
            plan.action,
            secret is None,
            plan.reason,
        )
        return SecretOutcome(plan.action, secret is None, plan.reason)
    raise CertsError(
        f"Secret {namespace}/{name} kept changing while being written; gave up after {ATTEMPTS} tries"
    )


def read_ca(kube: Kube, *, namespace: str, secret_name: str) -> bytes:
    """`ca.crt` from the Secret, checked to be PEM certificates."""
    secret = _get(kube, "secret", "secrets", secret_name, namespace)
    if secret is None:
        raise NotFoundError(f"Secret {namespace}/{secret_name} not found (run kube-vgpu certs create first)")
    ca_pem = decode_secret_data(secret).get(CA_CERT)
    if not ca_pem:
        raise InvalidError(f"Secret {namespace}/{secret_name} has no {CA_CERT}")
    try:
        x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise InvalidError(
            f"{CA_CERT} in Secret {namespace}/{secret_name} is not a PEM certificate"
        ) from None
    return ca_pem


def patch_ca_bundle(kube: Kube, *, webhook_name: str, namespace: str, secret_name: str) -> PatchOutcome:
    """Write the Secret's `ca.crt` into every webhook's `clientConfig.caBundle`, where it differs.

    Both admission phases are served by the one server, so the CA goes into the
    MutatingWebhookConfiguration and the ValidatingWebhookConfiguration of that name; the latter
    is skipped when absent (a release installed by an older chart has none).
    """
    ca_pem = read_ca(kube, namespace=namespace, secret_name=secret_name)
    mutating = _patch_configuration(kube, MUTATING, webhook_name, ca_pem, required=True)
    validating = _patch_configuration(kube, VALIDATING, webhook_name, ca_pem, required=False)
    return PatchOutcome(mutating.patched + validating.patched, mutating.webhooks + validating.webhooks)


def _patch_configuration(
    kube: Kube, target: tuple[Kind, str, str], webhook_name: str, ca_pem: bytes, *, required: bool
) -> PatchOutcome:
    kind, plural, title = target
    refused: tuple[str, ApiError] | None = None  # the version a patch was refused on, and why
    for attempt in range(1, ATTEMPTS + 1):
        configuration = _get(kube, kind, plural, webhook_name, None)
        if configuration is None:
            if not required:
                log.info("event=ca_bundle_no_configuration kind=%s name=%s", title, webhook_name)
                return PatchOutcome([], 0)
            raise NotFoundError(f"{title} {webhook_name} not found")
        version = str((configuration.get("metadata") or {}).get("resourceVersion", ""))
        if refused is not None and refused[0] == version:
            # Nothing changed since the refusal, so it was not a race: retrying would fail the same way.
            raise InvalidError(f"{title} {webhook_name} refused the caBundle patch: {refused[1]}")
        webhooks = configuration.get("webhooks") or []
        operations = ca_bundle_patch(configuration, ca_pem)
        if not operations:
            log.info("event=ca_bundle_current configuration=%s webhooks=%d", webhook_name, len(webhooks))
            return PatchOutcome([], len(webhooks))
        names = [op["value"] for op in operations if op["op"] == "test"]
        try:
            kube.patch(kind, webhook_name, operations, patch_type="json")
        except ApiError as exc:
            # 422: a `test` failed (the list changed since it was read); 409: a concurrent write.
            if exc.status in (409, 422):
                refused = (version, exc)
                log.info(
                    "event=ca_bundle_conflict configuration=%s attempt=%d message=%r",
                    webhook_name,
                    attempt,
                    exc.message,
                )
                continue
            _raise_api(exc, kube, "patch", plural, None)
        except ApiUnavailable as exc:
            _raise_api(exc, kube, "patch", plural, None)
        log.info("event=ca_bundle_patched configuration=%s webhooks=%s", webhook_name, ",".join(names))
        return PatchOutcome(names, len(webhooks))
    raise CertsError(
        f"{title} {webhook_name} kept changing while being patched; gave up after {ATTEMPTS} tries"
    )
