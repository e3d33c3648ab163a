"""The AdmissionReview v1 wire format: one parser for what the API server sends, one encoder for the answer.

A body that is not a well-formed AdmissionReview raises `MalformedReview` (the server answers HTTP 400);
a policy refusal is a well-formed review with `allowed: false`. The two never mix.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

import jsonpatch

API_VERSION: Literal["admission.k8s.io/v1"] = "admission.k8s.io/v1"
KIND: Literal["AdmissionReview"] = "AdmissionReview"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_OPERATIONS: tuple[Operation, ...] = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request; `str()` is the reason sent back."""


class GroupVersionKind(TypedDict):
    """`request.kind` of an AdmissionReview."""

    group: str
    version: str
    kind: str


class Status(TypedDict):
    """The `metav1.Status` subset a denial carries."""

    code: int
    message: str


class ResponseBody(TypedDict):
    """`response` of an AdmissionReview v1."""

    uid: str
    allowed: bool
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    status: NotRequired[Status]
    warnings: NotRequired[list[str]]


class ReviewResponse(TypedDict):
    """The whole AdmissionReview v1 document the webhook answers with."""

    apiVersion: Literal["admission.k8s.io/v1"]
    kind: Literal["AdmissionReview"]
    response: ResponseBody


@dataclass(frozen=True)
class AdmissionRequest:
    """The parts of `request` the webhook decides on."""

    uid: str
    kind: GroupVersionKind
    operation: Operation
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    dry_run: bool = False
    sub_resource: str = ""
    # UPDATE only: the pod before the change, and who made it (`request.userInfo.username`).
    old_object: Mapping[str, Any] | None = None
    username: str = ""

    @property
    def is_pod(self) -> bool:
        """Whether the request is about a core/v1 Pod itself (not a subresource)."""
        return self.kind["group"] == "" and self.kind["kind"] == "Pod" and not self.sub_resource

    @property
    def is_pod_create(self) -> bool:
        """Whether this is the CREATE of a core/v1 Pod (every other request passes untouched)."""
        return self.operation == "CREATE" and self.is_pod

    @property
    def is_pod_update(self) -> bool:
        """Whether this is an UPDATE (or PATCH, which reaches webhooks as UPDATE) of a core/v1 Pod."""
        return self.operation == "UPDATE" and self.is_pod


def _text(value: object, where: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise MalformedReview(
            f"{where} must be a non-empty string" if required else f"{where} must be a string"
        )
    return value


def parse_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview v1 request body; raise MalformedReview naming what is wrong."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise MalformedReview(f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise MalformedReview("body is not a JSON object")
    if doc.get("kind") != KIND or doc.get("apiVersion") != API_VERSION:
        raise MalformedReview(
            f"expected apiVersion {API_VERSION} and kind {KIND}, "
            f"got {str(doc.get('apiVersion'))[:64]!r} and {str(doc.get('kind'))[:64]!r}"
        )
    request = doc.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("request is missing or not an object")
    uid = _text(request.get("uid"), "request.uid", required=True)
    raw_kind = request.get("kind")
    if not isinstance(raw_kind, dict):
        raise MalformedReview("request.kind is missing or not an object")
    kind = GroupVersionKind(
        group=_text(raw_kind.get("group"), "request.kind.group"),
        version=_text(raw_kind.get("version"), "request.kind.version"),
        kind=_text(raw_kind.get("kind"), "request.kind.kind", required=True),
    )
    operation = request.get("operation")
    if operation not in _OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {', '.join(_OPERATIONS)}")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise MalformedReview("request.object is not an object")
    old = request.get("oldObject")
    if old is not None and not isinstance(old, dict):
        raise MalformedReview("request.oldObject is not an object")
    user_info = request.get("userInfo")
    if user_info is not None and not isinstance(user_info, dict):
        raise MalformedReview("request.userInfo is not an object")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool) and dry_run is not None:
        raise MalformedReview("request.dryRun must be a boolean")
    parsed = AdmissionRequest(
        uid=uid,
        kind=kind,
        operation=operation,
        namespace=_text(request.get("namespace"), "request.namespace"),
        name=_text(request.get("name"), "request.name"),
        object=obj,
        dry_run=bool(dry_run),
        sub_resource=_text(request.get("subResource"), "request.subResource"),
        old_object=old,
        username=_text((user_info or {}).get("username"), "request.userInfo.username"),
    )
    if parsed.is_pod_create or parsed.is_pod_update:
        if obj is None:
            raise MalformedReview(f"request.object is missing for a Pod {operation}")
        _check_pod_shape(obj)
    elif obj is not None and kind["kind"] == "Pod" and parsed.sub_resource == "ephemeralcontainers":
        _check_pod_shape(obj)  # `kubectl debug`: the object is the whole Pod
    if parsed.is_pod_update and old is not None:
        # Without oldObject every scheduler-owned annotation on the object counts as added.
        _check_pod_shape(old)
    return parsed


def _check_pod_shape(pod: Mapping[str, Any]) -> None:
    """The containers of a Pod must be where the API server puts them; anything else is not a Pod."""
    for key in ("metadata", "spec"):
        if key in pod and not isinstance(pod[key], dict):
            raise MalformedReview(f"request.object.{key} is not an object")
    metadata = pod.get("metadata") or {}
    for key in ("annotations", "labels"):
        value = metadata.get(key)
        if value is not None and (
            not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values())
        ):
            raise MalformedReview(f"request.object.metadata.{key} must map strings to strings")
    spec = pod.get("spec") or {}
    for key in ("containers", "initContainers"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(c, dict) for c in value)):
            raise MalformedReview(f"request.object.spec.{key} must be a list of objects")
        for container in value or []:
            resources = container.get("resources")
            if resources is not None and not isinstance(resources, dict):
                raise MalformedReview(f"request.object.spec.{key}[].resources is not an object")
            for part in ("limits", "requests"):
                amounts = (resources or {}).get(part)
                if amounts is not None and not isinstance(amounts, dict):
                    raise MalformedReview(f"request.object.spec.{key}[].resources.{part} is not an object")
            security = container.get("securityContext")
            if security is not None and not isinstance(security, dict):
                raise MalformedReview(f"request.object.spec.{key}[].securityContext is not an object")
    _check_affinity_shape(spec.get("affinity"))


def _check_affinity_shape(affinity: Any) -> None:
    """The required node affinity, which the webhook rewrites, must have the API's shape."""
    where = "request.object.spec.affinity"
    if affinity is None:
        return
    if not isinstance(affinity, dict):
        raise MalformedReview(f"{where} is not an object")
    node_affinity = affinity.get("nodeAffinity")
    if node_affinity is None:
        return
    if not isinstance(node_affinity, dict):
        raise MalformedReview(f"{where}.nodeAffinity is not an object")
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return
    where += ".nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    if not isinstance(required, dict):
        raise MalformedReview(f"{where} is not an object")
    terms = required.get("nodeSelectorTerms")
    if terms is not None and (not isinstance(terms, list) or not all(isinstance(t, dict) for t in terms)):
        raise MalformedReview(f"{where}.nodeSelectorTerms must be a list of objects")
    for term in terms or []:
        for key in ("matchExpressions", "matchFields"):
            value = term.get(key)
            if value is not None and (
                not isinstance(value, list) or not all(isinstance(r, dict) for r in value)
            ):
                raise MalformedReview(f"{where}.nodeSelectorTerms[].{key} must be a list of objects")


@dataclass(frozen=True)
class Verdict:
    """What the webhook answers for one review, before encoding."""

    allowed: bool
    patch: Sequence[Mapping[str, Any]] = ()
    message: str = ""
    # Short machine-readable cause of a denial, for the denials metric and the log line.
    reason: str = ""
    warnings: tuple[str, ...] = field(default=())


def make_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch that turns `before` into `after` (empty when they are equal)."""
    operations: list[dict[str, Any]] = jsonpatch.make_patch(before, after).patch
    return operations


def encode_response(uid: str, verdict: Verdict) -> ReviewResponse:
    """The AdmissionReview v1 document answering review `uid`."""
    body = ResponseBody(uid=uid, allowed=verdict.allowed)
    if verdict.allowed and verdict.patch:
        body["patchType"] = "JSONPatch"
        body["patch"] = base64.b64encode(json.dumps(list(verdict.patch)).encode()).decode()
    if not verdict.allowed:
        # `reason` stays out of the Status: there it is an enum (Forbidden, ...), ours is a metrics label.
        body["status"] = Status(code=403, message=verdict.message)
    if verdict.warnings:
        body["warnings"] = list(verdict.warnings)
    return ReviewResponse(apiVersion=API_VERSION, kind=KIND, response=body)


def decode_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch operations an encoded response carries (empty when none); for tests and bench."""
    body = response["response"]
    if "patch" not in body:
        return []
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(body["patch"]))
    return operations
