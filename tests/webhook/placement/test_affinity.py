"""The required node affinity the mutation writes: the pod's own terms kept, the webhook's own
replaced, idempotent."""

from __future__ import annotations

import json
from typing import Any

from kube_vgpu.webhook.placement import affinity
from tests.support.affinity import apply_required

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
