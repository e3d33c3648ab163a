"""The order in which the kube-apiserver admits a pod CREATE (kubernetes
staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go).

0. The body is decoded: quantities in canonical form, defaults applied.
1. Mutating webhooks, each call with a fresh `request.uid`; a `generateName` pod has no name, uid or
   creationTimestamp yet.
2. The system metadata is filled in: the generated name, `metadata.uid`, `creationTimestamp`.
3. Validating webhooks, exactly once, with that final object (a fresh `request.uid` again).
4. The write to storage, which keeps that uid.

`AdmissionChain` carries a pod through 1-3 over HTTPS the way the apiserver dials webhooks (TLS
against the configuration's CA bundle); the caller stores the result (step 4). A ResourceClaim
CREATE takes the same steps; kube-vgpu's chart sends claims to its validating webhook only. The demo
and the tests use it, so what they show is what a cluster would do.
"""

from __future__ import annotations

import base64
import copy
import json
import random
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import jsonpatch

from kube_vgpu.standins.apiserver.defaults import decoded
from kube_vgpu.standins.apiserver.ops import timestamp

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the real server's: no vowels, no look-alikes


class WebhookHttpError(Exception):
    """The webhook answered something other than HTTP 200 with an AdmissionReview."""


# The kinds whose writes the chain carries, and their resources.
_RESOURCES = {"Pod": "pods", "ResourceClaim": "resourceclaims"}


def admission_review(
    obj: Mapping[str, Any],
    *,
    operation: str = "CREATE",
    old: Mapping[str, Any] | None = None,
    username: str = "demo-user",
    dry_run: bool = False,
) -> dict[str, Any]:
    """The AdmissionReview v1 the API server sends for a write of a pod or a ResourceClaim (a fresh
    uid per call); an object without `kind` is a pod."""
    meta = obj.get("metadata") or {}
    kind = str(obj.get("kind") or "Pod")
    group, _, version = str(obj.get("apiVersion") or "v1").rpartition("/")
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": _RESOURCES[kind]}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "name": meta.get("name", ""),
            "namespace": meta.get("namespace", "default"),
            "operation": operation,
            "userInfo": {"username": username, "groups": ["system:authenticated"]},
            "object": obj,
            "oldObject": old,
            "dryRun": dry_run,
            "options": {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "UpdateOptions" if operation == "UPDATE" else "CreateOptions",
            },
        },
    }


def with_system_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Step 2: the object with its generated name (if it has only `generateName`), uid and
    creationTimestamp."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        # The real server truncates the prefix so that the name fits 63 characters.
        meta["name"] = str(meta["generateName"])[:58] + "".join(random.choices(_GENERATE_ALPHABET, k=5))
    meta["uid"] = str(uuid.uuid4())
    meta["creationTimestamp"] = timestamp()
    return out


@dataclass
class Admitted:
    """What admission made of a pod (or a claim): allowed or not, the final object, and what the
    webhook said."""

    allowed: bool
    pod: dict[str, Any]  # the final object: a pod, or the claim for `create_claim`
    message: str = ""
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    phase: str = ""  # the phase that refused it


@dataclass
class AdmissionChain:
    """Steps 1-3 against one webhook server at `base_url` (https://host:port)."""

    session: aiohttp.ClientSession
    base_url: str
    ca_pem: bytes
    username: str = "demo-user"

    def _ssl(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cadata=self.ca_pem.decode())
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        return context

    async def call(self, path: str, review: Mapping[str, Any]) -> dict[str, Any]:
        """POST one AdmissionReview; its `response`."""
        async with self.session.post(self.base_url + path, json=review, ssl=self._ssl()) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise WebhookHttpError(f"webhook {path} answered HTTP {resp.status}: {body}")
        response: dict[str, Any] = body["response"]
        return response

    async def create(self, pod: Mapping[str, Any], *, dry_run: bool = False) -> Admitted:
        """Decode (quantities canonical: `3000` is `3k` from here on), mutate, fill the system metadata,
        validate once: the pod as it would be stored."""
        return await create_across(self, self, pod, dry_run=dry_run)

    async def create_claim(self, claim: Mapping[str, Any], *, username: str) -> Admitted:
        """A ResourceClaim CREATE by `username` (the claim controller, for a claim made from a
        template): the system metadata filled in, then the validating webhook once."""
        final = with_system_metadata(claim)
        validated = await self.call("/validate", admission_review(final, username=username))
        if not validated["allowed"]:
            return Admitted(False, final, _message(validated), _warnings(validated), phase="validate")
        return Admitted(True, final, "", _warnings(validated))

    async def update(self, old: Mapping[str, Any], new: Mapping[str, Any], *, username: str) -> Admitted:
        """An UPDATE (or PATCH) of a pod by `username`: validating webhooks only (mutation is CREATE-only)."""
        validated = await self.call(
            "/validate", admission_review(new, operation="UPDATE", old=old, username=username)
        )
        if not validated["allowed"]:
            return Admitted(False, dict(new), _message(validated), _warnings(validated), phase="validate")
        return Admitted(True, dict(new), "", _warnings(validated))


async def create_across(
    mutating: AdmissionChain, validating: AdmissionChain, pod: Mapping[str, Any], *, dry_run: bool = False
) -> Admitted:
    """A CREATE whose two phases reach different webhook replicas, as the API server's calls through
    a Service may: mutate on one, fill the system metadata, validate once on the other."""
    user = mutating.username
    pod = decoded(pod)  # the API server decodes before any webhook: quantities are canonical
    mutated = await mutating.call("/mutate", admission_review(pod, username=user, dry_run=dry_run))
    if not mutated["allowed"]:
        return Admitted(False, dict(pod), _message(mutated), _warnings(mutated), phase="mutate")
    patch: list[dict[str, Any]] = (
        json.loads(base64.b64decode(mutated["patch"])) if mutated.get("patch") else []
    )
    final = with_system_metadata(jsonpatch.apply_patch(copy.deepcopy(dict(pod)), patch))
    validated = await validating.call("/validate", admission_review(final, username=user, dry_run=dry_run))
    warnings = _warnings(mutated) + _warnings(validated)
    if not validated["allowed"]:
        return Admitted(False, final, _message(validated), warnings, patch, phase="validate")
    return Admitted(True, final, "", warnings, patch)


def _message(response: Mapping[str, Any]) -> str:
    return str((response.get("status") or {}).get("message", ""))


def _warnings(response: Mapping[str, Any]) -> list[str]:
    return list(response.get("warnings") or [])
