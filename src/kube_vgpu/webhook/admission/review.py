"""The AdmissionReview v1 wire format: one parser for what the API server sends, one encoder for the answer.

A body that is not a well-formed AdmissionReview raises `MalformedReview` (the server answers HTTP 400);
a policy refusal is a well-formed review with `allowed: false`. The two never mix.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

import jsonpatch
import orjson

from kube_vgpu.webhook.admission.bounds import DEFAULT_BOUNDS, WorkBounds, work_problem
from kube_vgpu.webhook.admission.pod_shape import is_namespace_name, is_unicode_text, pod_problem
from kube_vgpu.webhook.records import PodRecord

API_VERSION: Literal["admission.k8s.io/v1"] = "admission.k8s.io/v1"
KIND: Literal["AdmissionReview"] = "AdmissionReview"
Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_OPERATIONS: tuple[Operation, ...] = ("CREATE", "UPDATE", "DELETE", "CONNECT")

# A Pod review nests about a dozen levels; deeper input is refused before it is decoded, so neither
# the decoder nor any later copy or diff of the document can run out of stack.
MAX_NESTING = 100
# Numbers in a review are 64-bit at most (20 characters with the sign); longer digit strings are
# refused before Python converts them (which is quadratic, and refused past 4300 digits).
MAX_NUMBER_CHARS = 24
_STRING = re.compile(r'"(?:[^"\\]++|\\.)*+"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
# 17 digits in a row: a number orjson might round (it turns integers past 64 bits into floats), or
# digits in a string; either way the body takes the exact path. Found by mapping every digit to "0"
# and searching, two C passes (a regular expression costs several times more on a 3 KB body). The
# same copy maps "{" to "[", so one count of "[" counts the openers of both kinds.
_SCAN = bytes.maketrans(b"123456789{", b"000000000[")
_LONG_DIGITS = b"0" * 17
# Every byte but quotes and brackets, deleted to measure the nesting of a large body (see `_depth_of`).
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
_QUOTED = re.compile(rb'"[^"]*+"')


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

    # What is wrong with the shape of the pod ("" when nothing): a denial, not a 400.
    object_error: str = ""
    # The work limit the pod passes ("" when none): a denial, decided before its shape is walked.
    over_limit: str = ""
    # `object` when it is a pod the webhook judges (a Pod CREATE or UPDATE, `kubectl debug`), read
    # through the pod record's fields; None otherwise.
    pod: PodRecord | None = None

    @property
    def is_pod_create(self) -> bool:
        """Whether this is the CREATE of a core/v1 Pod (every other request passes untouched)."""
        return self.operation == "CREATE" and self.is_pod

    @property
    def is_pod_update(self) -> bool:
        """Whether this is an UPDATE (or PATCH, which reaches webhooks as UPDATE) of a core/v1 Pod."""
        return self.operation == "UPDATE" and self.is_pod


def _text(value: object, where: str, *, required: bool = False) -> str:
    if type(value) is str and value.isascii() and (value or not required):
        return value  # what the API server sends: no further test needed
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise MalformedReview(
            f"{where} must be a non-empty string" if required else f"{where} must be a string"
        )
    if not is_unicode_text(value):
        raise MalformedReview(f"{where} holds a lone UTF-16 surrogate, which is not text")
    return value


def nesting_depth(text: str) -> int:
    """How deeply the arrays and objects of a JSON text nest (brackets inside strings do not count).

    Linear and without recursion, in C-level passes: strings blanked, everything but brackets
    removed, then the running sum of +1/-1 steps.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _depth_of(body: bytes) -> int:
    """`nesting_depth` of a body, in passes of C a large body needs (tens of times faster than the
    regular expression over the whole text, which cost as much as decoding a 2 MB pod).

    Escapes are dropped first, `\\\\` pairs then `\\"`, left to right as JSON pairs them; then every
    byte but quotes and brackets; what is left between two quotes was inside a string. Two quotes in a
    row hold no bracket between them, whichever string they open or close, so they go first (most
    strings hold no bracket), leaving the regular expression little to read.
    """
    skeleton = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    # A quote left over opened a string the body never closes: its brackets count, as in
    # `nesting_depth` (and the quote itself is no step of depth).
    brackets = _QUOTED.sub(b"", skeleton.replace(b'""', b"")).replace(b'"', b"").decode("ascii")
    return max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)


def _bounded_int(digits: str) -> int:
    if len(digits) > MAX_NUMBER_CHARS:
        raise MalformedReview(
            f"body holds a number of {len(digits)} characters; numbers in an AdmissionReview fit in 64 bits"
        )
    return int(digits)


def _finite_float(text: str) -> float:
    value = float(text) if len(text) <= 64 else math.inf
    if not math.isfinite(value):
        raise MalformedReview(f"body holds a number out of range ({text[:32]})")
    return value


def _no_constant(name: str) -> Any:
    raise MalformedReview(f"body holds {name}, which is not JSON")


def decode_json(body: bytes) -> Any:
    """The JSON document in `body` (strict UTF-8, bounded nesting and numbers) or MalformedReview.

    orjson reads an ordinary body (few brackets, no long digit runs); whatever it refuses or might
    read differently takes the exact path, which names what is wrong. Both refuse invalid UTF-8 and
    non-JSON constants; orjson also refuses lone surrogates, which the exact path passes on for the
    pod's shape check to deny.
    """
    scan = body.translate(_SCAN)
    # Few brackets cannot nest deeply; a large pod has thousands, and is measured in C passes.
    few_brackets = scan.count(b"[") <= MAX_NESTING
    depth = None if few_brackets else _depth_of(body)
    if (depth is None or depth <= MAX_NESTING) and _LONG_DIGITS not in scan:
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return _decode_exactly(body, depth)


def _decode_exactly(body: bytes, depth: int | None = None) -> Any:
    """`decode_json` with the standard library: slower, every bound checked with its own reason."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedReview(
            f"body is not UTF-8 text (byte {body[exc.start]:#04x} at offset {exc.start}); "
            "send the AdmissionReview as UTF-8 JSON"
        ) from None
    # Counting brackets is far cheaper than measuring depth, and few bodies have many.
    if depth is None:
        openers = text.count("[") + text.count("{")
        depth = nesting_depth(text) if openers > MAX_NESTING else 0
    if depth > MAX_NESTING:
        raise MalformedReview(
            f"body nests {depth} levels deep; an AdmissionReview nests at most {MAX_NESTING}"
        )
    try:
        return json.loads(
            text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant
        )
    except MalformedReview:
        raise
    except (ValueError, RecursionError) as exc:
        raise MalformedReview(f"body is not JSON: {str(exc)[:200]}") from None


def parse_review(body: bytes, bounds: WorkBounds = DEFAULT_BOUNDS) -> AdmissionRequest:
    """Parse an AdmissionReview v1 request body; raise MalformedReview naming what is wrong.

    A pod over one of `bounds` is marked `over_limit` and its shape is not walked: the limits are
    read from list lengths alone, so such a review costs little more than its decoding.
    """
    doc = decode_json(body)
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
    namespace = _text(request.get("namespace"), "request.namespace")
    if namespace and not is_namespace_name(namespace):
        raise MalformedReview(f"request.namespace {namespace[:80]!r} is not a namespace name")
    name = _text(request.get("name"), "request.name")
    sub_resource = _text(request.get("subResource"), "request.subResource")
    username = _text((user_info or {}).get("username"), "request.userInfo.username")
    # `AdmissionRequest.is_pod_create` and `is_pod_update`, decided before it is built: the request is
    # built once, with what the walks below find, rather than built and then replaced.
    pod_write = (
        operation in ("CREATE", "UPDATE")
        and kind["group"] == ""
        and kind["kind"] == "Pod"
        and not sub_resource
    )
    # What /validate judges as `kubectl debug` (whatever request.kind says), so nothing it walks
    # skips the shape check and the bounds.
    debug = obj is not None and operation == "UPDATE" and sub_resource == "ephemeralcontainers"
    if pod_write and obj is None:
        raise MalformedReview(f"request.object is missing for a Pod {operation}")
    over_limit = object_error = ""
    pod: PodRecord | None = None
    if obj is not None and (pod_write or debug):
        # `kubectl debug` sends the whole Pod as the object; an UPDATE's oldObject is walked as well.
        over_limit, object_error = _pod_findings(
            obj, old, bounds, shape_of_old=pod_write and operation == "UPDATE"
        )
        # The one conversion of a reviewed pod to its record type: a rule reads it only when
        # `over_limit` and `object_error` are empty, that is when `pod_problem` found the fields
        # admission reads well-formed.
        pod = cast("PodRecord", obj)
    return AdmissionRequest(
        uid=uid,
        kind=kind,
        operation=operation,
        namespace=namespace,
        name=name,
        object=obj,
        dry_run=bool(dry_run),
        sub_resource=sub_resource,
        old_object=old,
        username=username,
        object_error=object_error,
        over_limit=over_limit,
        pod=pod,
    )


def _pod_findings(
    obj: Mapping[str, Any], old: Mapping[str, Any] | None, bounds: WorkBounds, *, shape_of_old: bool
) -> tuple[str, str]:
    """(the work limit the pod passes, what is wrong with its shape), "" for none; the shape is not
    walked once a limit is passed. The oldObject's shape counts only for a Pod UPDATE."""
    over = work_problem(obj, bounds)
    if not over and old is not None:
        old_over = work_problem(old, bounds)
        over = f"oldObject: {old_over}" if old_over else None
    if over:
        return over, ""
    problem = pod_problem(obj)
    if not problem and shape_of_old and old is not None:
        # Without a readable oldObject every scheduler-owned annotation counts as added.
        old_problem = pod_problem(old)
        problem = f"oldObject: {old_problem}" if old_problem else None
    return "", problem or ""


@dataclass(frozen=True)
class Verdict:
    """What the webhook answers for one review, before encoding."""

    allowed: bool
    patch: Sequence[Mapping[str, Any]] = ()
    message: str = ""
    # Short machine-readable cause of a denial, for the denials metric and the log line.
    reason: str = ""
    warnings: tuple[str, ...] = field(default=())


# The plain "allowed" (no patch, no warning) of every review that is not a vGPU pod's: frozen, so
# one instance serves them all rather than one built per review.
ALLOWED: Final = Verdict(allowed=True)


def make_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch that turns `before` into `after` (empty when they are equal)."""
    operations: list[dict[str, Any]] = jsonpatch.make_patch(before, after).patch
    return operations


def encode_response(uid: str, verdict: Verdict) -> ReviewResponse:
    """The AdmissionReview v1 document answering review `uid`."""
    body = ResponseBody(uid=uid, allowed=verdict.allowed)
    if verdict.allowed and verdict.patch:
        body["patchType"] = "JSONPatch"
        patch = verdict.patch  # a list as the rules build it: encoded as it is, not copied first
        body["patch"] = base64.b64encode(encode_json(patch if type(patch) is list else list(patch))).decode()
    if not verdict.allowed:
        # `reason` stays out of the Status: there it is an enum (Forbidden, ...), ours is a metrics label.
        body["status"] = Status(code=403, message=verdict.message)
    if verdict.warnings:
        body["warnings"] = list(verdict.warnings)
    return ReviewResponse(apiVersion=API_VERSION, kind=KIND, response=body)


def encode_json(document: Any) -> bytes:
    """UTF-8 JSON of an answer (a review response or an error reason).

    A message may quote a caller's text with a lone surrogate, which orjson refuses to encode; the
    standard library writes it as an escape, so such an answer still goes out.
    """
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        return json.dumps(document).encode()


def decode_patch(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch operations an encoded response carries (empty when none); for tests and bench."""
    body = response["response"]
    if "patch" not in body:
        return []
    operations: list[dict[str, Any]] = json.loads(base64.b64decode(body["patch"]))
    return operations
