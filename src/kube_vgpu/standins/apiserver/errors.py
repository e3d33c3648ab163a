"""Kubernetes API errors as the real server reports them: `Status` objects with reason and code.

Every failure the stand-in API server answers is an `StatusError`; `status_body()` renders it in the
exact shape kube-apiserver uses, so client code that inspects `reason` or `code` behaves as in production.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Literal, TypedDict

Reason = Literal[
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "AlreadyExists",
    "Conflict",
    "Gone",
    "Expired",
    "Invalid",
    "MethodNotAllowed",
    "UnsupportedMediaType",
    "ServiceUnavailable",
    "InternalError",
    "Timeout",
]


class StatusDetails(TypedDict, total=False):
    """`Status.details`: which object the failure is about (`kind` holds the resource plural)."""

    name: str
    group: str
    kind: str
    uid: str
    causes: list[dict[str, str]]
    retryAfterSeconds: int


class StatusError(Exception):
    """A request the API server refuses; carries everything needed for the `Status` reply."""

    def __init__(self, code: int, reason: Reason, message: str, details: StatusDetails | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason: Reason = reason
        self.message = message
        self.details: StatusDetails = details if details is not None else {}
        # `metadata.continue` of the Status (an expired continue token's inconsistent remainder).
        self.list_continue: str | None = None

    def status_body(self) -> dict[str, Any]:
        """The `Status` object for this error, as kube-apiserver encodes it."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {"continue": self.list_continue} if self.list_continue else {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = dict(self.details)
        body["code"] = self.code
        return body


def _details(resource: str, name: str, group: str) -> StatusDetails:
    details: StatusDetails = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def _qualified(resource: str, group: str) -> str:
    # The real server names group resources as "<plural>.<group>" in messages.
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, name: str, group: str = "") -> StatusError:
    """`<resource> "<name>" not found` (404)."""
    return StatusError(
        404, "NotFound", f'{_qualified(resource, group)} "{name}" not found', _details(resource, name, group)
    )


def already_exists(resource: str, name: str, group: str = "") -> StatusError:
    """`<resource> "<name>" already exists` (409)."""
    return StatusError(
        409,
        "AlreadyExists",
        f'{_qualified(resource, group)} "{name}" already exists',
        _details(resource, name, group),
    )


def conflict(resource: str, name: str, group: str = "", why: str | None = None) -> StatusError:
    """Optimistic-concurrency failure (409), by default the stale-resourceVersion message."""
    if why is None:
        why = "the object has been modified; please apply your changes to the latest version and try again"
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
        _details(resource, name, group),
    )


def invalid(kind: str, name: str, causes: list[str], group: str = "") -> StatusError:
    """Validation failure (422): `<Kind> "<name>" is invalid: <field>: <problem>`."""
    qualified_kind = f"{kind}.{group}" if group else kind
    message = f'{qualified_kind} "{name}" is invalid: ' + ", ".join(causes)
    details: StatusDetails = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return StatusError(422, "Invalid", message, details)


def unprocessable(message: str) -> StatusError:
    """A patch that cannot be applied (422), as the server answers a failed JSON-patch `test`."""
    return StatusError(422, "Invalid", message)


def bad_request(message: str) -> StatusError:
    """Malformed request (400)."""
    return StatusError(400, "BadRequest", message)


def expired(message: str, *, continue_after: tuple[str, str] | None = None) -> StatusError:
    """A resourceVersion or continue token older than the retained history (410 Gone, reason Expired).

    With `continue_after` (the last key the expired token had read), the Status carries a new
    continue token at resourceVersion -1, as kube-apiserver's paging does, for a caller that accepts
    an inconsistent remainder."""
    error = StatusError(410, "Expired", message)
    if continue_after is not None:
        namespace, name = continue_after
        token = json.dumps({"v": "meta.k8s.io/v1", "rv": -1, "start": [namespace, name]})
        error.list_continue = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    return error


def too_large_resource_version(wanted: int, current: int) -> StatusError:
    """A list or watch from a resourceVersion the server has not reached (504 Timeout), as
    k8s.io/apiserver/pkg/storage/errors.go NewTooLargeResourceVersionError words it; clients such as
    client-go's reflector recognise it by its cause and list again without a resourceVersion."""
    details: StatusDetails = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    return StatusError(
        504, "Timeout", f"Timeout: Too large resource version: {wanted}, current: {current}", details
    )


def forbidden(message: str, resource: str, name: str, group: str) -> StatusError:
    """RBAC refusal (403)."""
    return StatusError(403, "Forbidden", message, _details(resource, name, group))


def unauthorized() -> StatusError:
    """Missing or wrong bearer token (401)."""
    return StatusError(401, "Unauthorized", "Unauthorized")


def page_not_found() -> StatusError:
    """A path under /api or /apis that names no known resource (404)."""
    return StatusError(404, "NotFound", "the server could not find the requested resource")


def method_not_allowed(method: str, what: str) -> StatusError:
    """A verb the resource does not support (405)."""
    return StatusError(405, "MethodNotAllowed", f"{method} is not supported on {what}")


def unsupported_media_type(content_type: str, accepted: list[str]) -> StatusError:
    """A body in a media type the endpoint does not take (415)."""
    return StatusError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type!r}) - "
        f"accepted media types include: {', '.join(accepted)}",
    )


def status_success(code: int | None = None, details: StatusDetails | None = None) -> dict[str, Any]:
    """A `Status` with status Success, as answered by deletes and bindings."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details:
        body["details"] = dict(details)
    if code is not None:
        body["code"] = code
    return body
