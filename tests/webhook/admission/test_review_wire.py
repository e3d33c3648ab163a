"""The AdmissionReview wire format: what a malformed review is refused with, and what a response
carries."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kube_vgpu.webhook.admission.review import MalformedReview, Verdict, encode_response, parse_review


def _review(**request: Any) -> bytes:
    base = {
        "uid": "1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "object": {},
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": base | request}
    ).encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_review(uid=""), "request.uid"),
        (_review(operation="PATCH"), "request.operation"),
        (_review(object=None), "missing for a Pod CREATE"),
        (_review(dryRun="yes"), "dryRun"),
        (b"\xff", "not UTF-8"),
    ],
)
def test_parse_review_names_what_is_wrong(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedReview, match=reason):
        parse_review(body)


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"metadata": {"annotations": {"a": 1}}}, "metadata.annotations['a'] must be a string"),
        ({"spec": {"containers": {}}}, "spec.containers must be a list"),
        ({"spec": {"affinity": {"nodeAffinity": []}}}, "spec.affinity.nodeAffinity must be an object"),
    ],
)
def test_a_mistyped_pod_in_a_well_formed_review_is_named_for_a_denial(
    pod: dict[str, Any], field: str
) -> None:
    assert field in parse_review(_review(object=pod)).object_error


def test_encode_response_carries_patch_warnings_and_denials() -> None:
    allowed = encode_response(
        "u", Verdict(allowed=True, patch=[{"op": "add", "path": "/a", "value": 1}], warnings=("w",))
    )
    body = allowed["response"]
    assert body["patchType"] == "JSONPatch" and json.loads(base64.b64decode(body["patch"]))[0]["path"] == "/a"
    assert body["warnings"] == ["w"] and "status" not in body
    denied = encode_response("u", Verdict(allowed=False, message="no", reason="quota"))["response"]
    assert denied["status"] == {"code": 403, "message": "no"} and "patch" not in denied
