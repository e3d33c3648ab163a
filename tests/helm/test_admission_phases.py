"""The chart's two admission configurations and its RBAC, against the code (issue 11).

The ValidatingWebhookConfiguration sends CREATE and UPDATE to /validate with the mutating one's
selectors; its UPDATE condition, evaluated with a real CEL implementation, lets through exactly the
updates that touch a scheduler-owned annotation; neither configuration has an objectSelector or a
condition a pod author can satisfy. The rendered Roles grant exactly what `kubeapi.permissions`
declares the code calls, in both directions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from kube_vgpu.contract.names import (
    PLACEMENT_ANNOTATIONS,
    SCHEDULER_OWNED_ANNOTATIONS,
    VGPU_IDS_NEW,
    VGPU_NODE,
)
from kube_vgpu.contract.resources import iter_containers
from kube_vgpu.kubeapi.permissions import API_CALLS, COMPONENTS, Component
from tests.support.helm_render import Rendered, render

Obj = dict[str, Any]
NAMESPACE = "gpu-system"


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render({}, kube_version="v1.31.0")


def _hook(r: Rendered, kind: str) -> Obj:
    (config,) = r.of_kind(kind)
    (hook,) = config["webhooks"]
    result: Obj = hook
    return result


def _conditions(hook: Obj) -> dict[str, Any]:
    env = celpy.Environment()
    return {c["name"]: env.program(env.compile(c["expression"])) for c in hook["matchConditions"]}


def _sent(hook: Obj, operation: str, new: Obj, old: Obj | None, sub_resource: str = "") -> bool:
    """Whether every matchCondition lets the request through (an error would fail the write)."""
    request: Obj = {"operation": operation}
    if sub_resource:
        request["subResource"] = sub_resource
    activation = {
        "request": json_to_cel(request),
        "object": json_to_cel(new),
        "oldObject": json_to_cel(old),
    }
    results = [program.evaluate(activation) for program in _conditions(hook).values()]
    assert all(isinstance(r, celpy.celtypes.BoolType) for r in results), results
    return all(bool(r) for r in results)


def _gpu_pod(annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None) -> Obj:
    meta: Obj = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    limits = {"volcano.sh/vgpu-number": "1"}
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


def test_validating_configuration_calls_validate_on_create_and_update_with_the_same_selectors(
    rendered: Rendered,
) -> None:
    mutating = _hook(rendered, "MutatingWebhookConfiguration")
    validating = _hook(rendered, "ValidatingWebhookConfiguration")
    assert validating["clientConfig"]["service"]["path"] == "/validate"
    assert mutating["clientConfig"]["service"]["path"] == "/mutate"
    assert validating["clientConfig"]["service"]["name"] == mutating["clientConfig"]["service"]["name"]
    (rule,) = validating["rules"]
    assert rule["operations"] == ["CREATE", "UPDATE"]
    assert rule["resources"] == ["pods", "pods/ephemeralcontainers"]
    assert mutating["rules"][0]["operations"] == ["CREATE"]
    for key in ("namespaceSelector", "failurePolicy", "timeoutSeconds", "admissionReviewVersions"):
        assert validating[key] == mutating[key], key
    # A dry run reserves no quota, so the call has no side effect then.
    assert validating["sideEffects"] == "NoneOnDryRun"
    assert "reinvocationPolicy" not in validating  # validating webhooks are never reinvoked


def test_no_configuration_lets_a_pod_author_exempt_a_pod(rendered: Rendered) -> None:
    opt_out = {"kube-vgpu.io/webhook": "ignore"}
    hostile = _gpu_pod(
        annotations={"kube-vgpu.io/webhook": "ignore"},
        labels={
            **opt_out,
            "app.kubernetes.io/instance": "kube-vgpu",
            "app.kubernetes.io/component": "certs-create",
        },
    )
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        hook = _hook(rendered, kind)
        assert "objectSelector" not in hook, kind
        assert _sent(hook, "CREATE", hostile, None), kind


GUARDED = (*SCHEDULER_OWNED_ANNOTATIONS, *PLACEMENT_ANNOTATIONS)


def test_the_update_condition_names_exactly_the_guarded_annotations(rendered: Rendered) -> None:
    validating = _hook(rendered, "ValidatingWebhookConfiguration")
    (text,) = [c["expression"] for c in validating["matchConditions"] if "UPDATE" in c["expression"]]
    quoted = set(re.findall(r"'([a-z0-9.-]+/[a-z0-9.-]+)'", text))
    assert quoted == set(GUARDED)


@pytest.mark.parametrize("key", GUARDED)
def test_updates_touching_a_scheduler_annotation_are_sent_and_others_are_not(
    rendered: Rendered, key: str
) -> None:
    hook = _hook(rendered, "ValidatingWebhookConfiguration")
    bare = _gpu_pod()
    booked = _gpu_pod({key: "x", "team": "a"})
    assert _sent(hook, "UPDATE", booked, bare)  # added (old pod has no annotations at all)
    assert _sent(hook, "UPDATE", bare, booked)  # removed
    assert _sent(hook, "UPDATE", _gpu_pod({key: "y", "team": "a"}), booked)  # changed
    assert _sent(hook, "UPDATE", _gpu_pod({key: ""}), _gpu_pod({}))  # added as empty text
    # An author relabelling or annotating their own pod is not the webhook's business.
    relabelled = copy.deepcopy(booked)
    relabelled["metadata"]["labels"] = {"team": "b"}
    relabelled["metadata"]["annotations"]["team"] = "b"
    assert not _sent(hook, "UPDATE", relabelled, booked)
    assert not _sent(hook, "UPDATE", bare, _gpu_pod({}))
    # An ephemeral container added to a vGPU pod is always checked.
    assert _sent(hook, "UPDATE", bare, bare, "ephemeralcontainers")


def test_every_create_of_a_vgpu_pod_is_sent_to_validation(rendered: Rendered) -> None:
    hook = _hook(rendered, "ValidatingWebhookConfiguration")
    assert _sent(hook, "CREATE", _gpu_pod({VGPU_NODE: "n1", VGPU_IDS_NEW: "x"}), None)
    cpu_only = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    assert not _sent(hook, "CREATE", cpu_only, None)


# --- RBAC against kubeapi.permissions -----------------------------------------------------------


def _named(r: Rendered) -> dict[str, str]:
    """The rendered object each `ApiCall.named` key stands for."""
    (config,) = r.of_kind("ValidatingWebhookConfiguration")
    secrets = {
        name
        for role in r.of_kind("Role")
        for rule in role["rules"]
        if rule["resources"] == ["secrets"]
        for name in rule.get("resourceNames") or []
    }
    (secret,) = secrets
    return {
        "tls-secret": secret,
        "webhook-configuration": config["metadata"]["name"],
        "device-config": "volcano-vgpu-device-config",
    }


def _account_component(account: str) -> Component:
    for component in COMPONENTS:
        if account.endswith("-" + component):
            return component
    raise AssertionError(f"service account {account} belongs to no component")


def _granted(r: Rendered) -> dict[Component, set[tuple[str, str, str, str | None]]]:
    roles = {(o["kind"], o["metadata"]["name"]): o for o in r.of_kind("ClusterRole") + r.of_kind("Role")}
    out: dict[Component, set[tuple[str, str, str, str | None]]] = {c: set() for c in COMPONENTS}
    for binding in r.of_kind("ClusterRoleBinding") + r.of_kind("RoleBinding"):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            component = _account_component(subject["name"])
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or [None]:
                                out[component].add((group, resource, verb, name))
    return out


def test_rbac_grants_exactly_the_calls_the_code_declares(rendered: Rendered) -> None:
    named = _named(rendered)
    declared: dict[Component, set[tuple[str, str, str, str | None]]] = {c: set() for c in COMPONENTS}
    for call in API_CALLS:
        name = named[call.named] if call.named is not None else None
        declared[call.component].add((call.group, call.resource, call.verb, name))
    granted = _granted(rendered)
    for component in COMPONENTS:
        unused = granted[component] - declared[component]
        missing = declared[component] - granted[component]
        assert not unused, (
            f"{component}: the chart grants calls the code never makes: {sorted(unused, key=str)}"
        )
        assert not missing, (
            f"{component}: the code makes calls the chart does not grant: {sorted(missing, key=str)}"
        )


def test_the_node_plugin_account_is_a_writer_of_scheduler_annotations(rendered: Rendered) -> None:
    (cm,) = [c for c in rendered.of_kind("ConfigMap") if "config.yaml" in c.get("data", {})]
    (daemonset, *_) = rendered.of_kind("DaemonSet")
    account = daemonset["spec"]["template"]["spec"]["serviceAccountName"]
    text = cm["data"]["config.yaml"]
    assert f"system:serviceaccount:{rendered.namespace}:{account}" in text
    assert "system:serviceaccount:volcano-system:volcano-scheduler" in text


def test_chart_pods_would_pass_their_own_isolation_rules(rendered: Rendered) -> None:
    # The chart's own workloads ask no vGPU, so the escape rules never apply to them; this keeps
    # that true (a future GPU-using helper pod would need its own thought).
    for _, template in rendered.pod_templates():
        for container, _init in iter_containers({"spec": template["spec"]}):
            limits = (container.get("resources") or {}).get("limits") or {}
            assert not any(k.startswith("volcano.sh/vgpu") for k in limits)
