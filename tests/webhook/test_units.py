"""Unit tests of the webhook's pure pieces: affinity merging, the inventory's indexes, the review
wire format, and selector parsing (the pipeline itself is in test_webhook_admission.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from kube_vgpu.webhook.admission.review import MalformedReview, Verdict, encode_response, parse_review
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.inventory import GpuFilter, Inventory
from kube_vgpu.webhook.placement.selectors import SelectorError, parse_selectors
from tests.support.webhook import A10, A100, H100, gpu_node, gpu_uuid


def apply_required(
    pod: dict[str, Any],
    alternatives: list[list[affinity.Requirement]],
    previous: list[affinity.Requirement],
) -> None:
    """Rewrite `pod`'s required node affinity in place, as the mutation's patch would."""
    after = affinity.required_with(pod, affinity.own_terms(pod, previous), alternatives, previous)
    spec = pod.setdefault("spec", {})
    if after is None:
        spec.pop("affinity", None)
    else:
        spec["affinity"] = after


ZONE = {"key": "zone", "operator": "In", "values": ["a"]}
MODE = affinity.one_of("kube-vgpu.io/vgpu-mode", ["mig"])
M1, M2 = affinity.exists("gpu-model.kube-vgpu.io/a"), affinity.exists("gpu-model.kube-vgpu.io/b")


def _pod(terms: list[dict[str, Any]] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if terms is not None:
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    return {"spec": spec}


def _terms(pod: dict[str, Any]) -> Any:
    return pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]


def test_affinity_cross_product_keeps_user_terms_and_is_idempotent() -> None:
    user = [
        {"matchExpressions": [ZONE]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
    ]
    pod = _pod(user)
    alternatives = [[MODE, M1], [MODE, M2]]
    apply_required(pod, alternatives, [])
    first = json.loads(json.dumps(pod))
    assert len(_terms(pod)) == 4
    assert _terms(pod)[0]["matchExpressions"] == [ZONE, MODE, M1]
    assert _terms(pod)[3]["matchFields"] == user[1]["matchFields"] and _terms(pod)[3]["matchExpressions"] == [
        MODE,
        M2,
    ]
    marker = affinity.decode_marker(affinity.encode_marker(r for alt in alternatives for r in alt))
    apply_required(pod, alternatives, marker)
    assert pod == first


def test_affinity_empty_user_term_is_never_widened_and_own_terms_vanish() -> None:
    pod = _pod([{}])
    apply_required(pod, [[MODE]], [])
    assert _terms(pod) == [{}]  # an empty term matches no node; ANDing into it would match some
    created = _pod(None)
    apply_required(created, [[MODE, M1]], [])
    assert _terms(created) == [{"matchExpressions": [MODE, M1]}]
    apply_required(created, [], [MODE, M1])
    assert created == {"spec": {}}


def test_affinity_damaged_marker_strips_nothing() -> None:
    assert affinity.decode_marker("not json") == [] and affinity.decode_marker('{"a": 1}') == []


def test_inventory_indexes_follow_upserts_and_removals() -> None:
    inv = Inventory()
    inv.upsert(gpu_node("a", "hami-core", [(A10, 24576), (A100, 40960)]))
    inv.upsert(gpu_node("b", "mig", [(H100, 81920)]))
    assert inv.models() == {"NVIDIA-A10", "NVIDIA-A100-PCIE-40GB", "NVIDIA-H100-80GB-HBM3"}
    assert inv.offered_modes(GpuFilter()) == {"hami-core", "mig"}
    assert inv.offered_modes(GpuFilter(min_memory_mib=50000)) == {"mig"}
    assert inv.largest_memory(GpuFilter(), "hami-core") == 40960
    assert inv.offered_modes(GpuFilter(excluded=frozenset({gpu_uuid("b", 0)}))) == {"hami-core"}
    assert inv.fully_excluded_hostnames([gpu_uuid("a", 0)]) == ()
    assert inv.fully_excluded_hostnames([gpu_uuid("a", 0), gpu_uuid("a", 1)]) == ("a",)
    # A relabelled node replaces its old facts; a removed node leaves no trace in any index.
    inv.upsert(gpu_node("b", "hami-core", [(H100, 81920)]))
    assert inv.offered_modes(GpuFilter(models=frozenset({"NVIDIA-H100-80GB-HBM3"}))) == {"hami-core"}
    inv.remove("b")
    assert inv.models() == {"NVIDIA-A10", "NVIDIA-A100-PCIE-40GB"} and inv.gpu(gpu_uuid("b", 0)) is None
    assert inv.types() == {f"NVIDIA-[{A10}]", f"NVIDIA-[{A100}]"}
    inv.upsert({"metadata": {"name": "a", "labels": {}}})  # not a GPU node any more
    assert len(inv) == 0 and not inv.any_gpu(GpuFilter())


def test_inventory_tolerates_a_missing_or_broken_register_annotation() -> None:
    node = gpu_node("x", "hami-core", [(A10, 24576)], register=False)
    inv = Inventory()
    facts = inv.upsert(node)
    assert facts is not None and facts.problem and facts.gpus[0].model == "NVIDIA-A10"
    assert facts.gpus[0].memory_mib is None and inv.offered_modes(GpuFilter(min_memory_mib=10**6)) == {
        "hami-core"
    }
    node["metadata"]["annotations"] = {"volcano.sh/node-vgpu-register": "garbage"}
    facts = inv.upsert(node)
    assert facts is not None and "no ':'" in facts.problem


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


def test_selector_errors_name_the_key_the_user_wrote() -> None:
    with pytest.raises(SelectorError, match=r"nvidia\.com/use-gpuuuid"):
        parse_selectors({"nvidia.com/use-gpuuuid": "GPU-a,"})
    with pytest.raises(SelectorError, match="not a GPU UUID"):
        parse_selectors({"volcano.sh/vgpu-use-gpuuuid": "GPU a"})
    with pytest.raises(SelectorError, match="empty item"):
        parse_selectors({"nvidia.com/nouse-gputype": ""})
    # After a first admission, the user's own words are read back from the kube-vgpu.io copy.
    again = parse_selectors({"nvidia.com/use-gputype": "[NVIDIA A10]", "kube-vgpu.io/use-gputype": "A10"})
    assert again.use_types == ("A10",) and again.nouse_types is None
