"""The chart's webhook side of DRA: ResourceClaim CREATE reaches /validate only for claims naming a
kube-vgpu class, pods using claims reach it, the program is told the classes, and nothing of it is
rendered while `dra.enabled` is off. The matchConditions are evaluated with cel-python."""

from __future__ import annotations

from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from kube_vgpu.contract.dra import DEVICE_CLASS
from tests.support.helm_render import Rendered, render

Obj = dict[str, Any]
KUBE = "v1.36.0"


@pytest.fixture(scope="module")
def dra() -> Rendered:
    return render({"dra": {"enabled": True}}, kube_version=KUBE)


@pytest.fixture(scope="module")
def plain() -> Rendered:
    return render({}, kube_version=KUBE)


def _validating(r: Rendered) -> Obj:
    (config,) = r.of_kind("ValidatingWebhookConfiguration")
    return config


def _hook(r: Rendered, name: str) -> Obj:
    matching: list[Obj] = [h for h in _validating(r)["webhooks"] if h["name"] == name]
    (hook,) = matching
    return hook


def _passes(hook: Obj, obj: Obj, operation: str = "CREATE") -> bool:
    env = celpy.Environment()
    activation = {
        "request": json_to_cel({"operation": operation}),
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(None),
    }
    results = [
        env.program(env.compile(c["expression"])).evaluate(activation) for c in hook["matchConditions"]
    ]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


def _config(r: Rendered) -> Obj:
    (cm,) = [c for c in r.of_kind("ConfigMap") if "config.yaml" in c.get("data", {})]
    doc: Obj = yaml.safe_load(cm["data"]["config.yaml"])
    return doc


def _claim(*requests: Obj) -> Obj:
    return {"metadata": {"name": "c"}, "spec": {"devices": {"requests": list(requests)}}}


def test_everything_validates_against_kubernetes_1_36(dra: Rendered) -> None:
    for obj in dra.objects:
        if obj["apiVersion"].startswith("cert-manager"):
            continue
        kubernetes_validate.validate(obj, KUBE.lstrip("v"), strict=True)


def test_claim_create_goes_to_validate_with_the_pods_selectors(dra: Rendered) -> None:
    claims = _hook(dra, "claims.vgpu.kube-vgpu.io")
    pods = _hook(dra, "vgpu.kube-vgpu.io")
    assert claims["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": ["resource.k8s.io"],
            "apiVersions": ["v1"],
            "resources": ["resourceclaims"],
            "scope": "Namespaced",
        }
    ]
    assert claims["clientConfig"]["service"]["path"] == "/validate"
    assert claims["namespaceSelector"] == pods["namespaceSelector"]
    assert claims["sideEffects"] == "NoneOnDryRun"
    assert "objectSelector" not in claims
    assert _config(dra)["webhook"]["draDeviceClasses"] == [DEVICE_CLASS]


def test_only_claims_naming_a_kube_vgpu_class_pass_the_claim_condition(dra: Rendered) -> None:
    hook = _hook(dra, "claims.vgpu.kube-vgpu.io")
    ours = {"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}
    theirs = {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}}
    first = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "a", "deviceClassName": "gpu.nvidia.com"},
            {"name": "b", "deviceClassName": DEVICE_CLASS},
        ],
    }
    others_first = {"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}
    assert _passes(hook, _claim(ours))
    assert _passes(hook, _claim(theirs, ours))
    assert _passes(hook, _claim(first))
    assert not _passes(hook, _claim(theirs))
    assert not _passes(hook, _claim(others_first))
    assert not _passes(hook, _claim())
    assert not _passes(hook, {"metadata": {"name": "c"}, "spec": {}})
    # A request with neither field (refused by the API server's validation) is no error either.
    assert not _passes(hook, _claim({"name": "odd"}))


def test_pods_with_claims_reach_validate_and_other_pods_do_not(dra: Rendered, plain: Rendered) -> None:
    with_claim = {
        "metadata": {"name": "p"},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "slice"}],
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }
    plain_pod: Obj = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert _passes(_hook(dra, "vgpu.kube-vgpu.io"), with_claim)
    assert not _passes(_hook(dra, "vgpu.kube-vgpu.io"), plain_pod)
    assert not _passes(
        _hook(dra, "vgpu.kube-vgpu.io"), {**plain_pod, "spec": {**plain_pod["spec"], "resourceClaims": []}}
    )
    # Without DRA, pods with claims are none of the webhook's business.
    assert not _passes(_hook(plain, "vgpu.kube-vgpu.io"), with_claim)


def test_nothing_of_dra_is_rendered_when_off(plain: Rendered) -> None:
    assert [h["name"] for h in _validating(plain)["webhooks"]] == ["vgpu.kube-vgpu.io"]
    assert _config(plain)["webhook"]["draDeviceClasses"] == []


def test_listed_classes_replace_the_default(dra: Rendered) -> None:
    r = render(
        {
            "dra": {"enabled": True},
            "config": {"webhook": {"draDeviceClasses": ["a.example.com", "b.example.com"]}},
        },
        kube_version=KUBE,
    )
    hook = _hook(r, "claims.vgpu.kube-vgpu.io")
    assert _passes(hook, _claim({"name": "g", "exactly": {"deviceClassName": "b.example.com"}}))
    assert not _passes(hook, _claim({"name": "g", "exactly": {"deviceClassName": DEVICE_CLASS}}))
    assert _config(r)["webhook"]["draDeviceClasses"] == ["a.example.com", "b.example.com"]


def test_a_dra_node_group_brings_quotas_over_its_claims_without_dra_enabled() -> None:
    group = {"name": "dra", "mode": "hami-core", "api": "dra", "nodeSelector": {"kube-vgpu.io/dra": "true"}}
    r = render({"node": {"groups": [group]}}, kube_version=KUBE)
    hook = _hook(r, "claims.vgpu.kube-vgpu.io")
    assert _passes(hook, _claim({"name": "g", "exactly": {"deviceClassName": DEVICE_CLASS}}))
    assert _config(r)["webhook"]["draDeviceClasses"] == [DEVICE_CLASS]
