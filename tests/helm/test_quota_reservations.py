"""The chart's side of shared quota reservations: the webhook is told its own namespace and may read,
create, update, list and delete ConfigMaps there and nowhere else (`test_helm_admission_phases`
holds the verbs equal to `kubeapi.permissions`; this pins where they apply)."""

from __future__ import annotations

from typing import Any

import pytest

from kube_vgpu.kubeapi.permissions import API_CALLS
from tests.support.helm_render import Rendered, render


@pytest.fixture(scope="module")
def rendered() -> Rendered:
    return render({}, kube_version="v1.31.0")


def _webhook_container(r: Rendered) -> dict[str, Any]:
    (deployment,) = r.of_kind("Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    found: dict[str, Any] = container
    return found


def test_the_webhook_is_told_its_own_namespace_through_the_downward_api(rendered: Rendered) -> None:
    container = _webhook_container(rendered)
    assert "--release-namespace=$(POD_NAMESPACE)" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_configmap_writes_are_granted_in_the_release_namespace_only(rendered: Rendered) -> None:
    (deployment,) = rendered.of_kind("Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in rendered.of_kind("Role")}
    writers = []
    for binding in rendered.of_kind("RoleBinding"):
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        role = roles[(binding["metadata"]["namespace"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            if "configmaps" in rule["resources"] and {"create", "update", "delete"} & set(rule["verbs"]):
                writers.append((binding["metadata"]["namespace"], rule))
    assert [ns for ns, _ in writers] == [rendered.namespace]
    (_, rule) = writers[0]
    assert sorted(rule["verbs"]) == ["create", "delete", "get", "list", "update"]
    assert "resourceNames" not in rule
    # No ClusterRole lets the webhook write ConfigMaps anywhere else.
    for role in rendered.of_kind("ClusterRole"):
        for rule in role["rules"]:
            writes = {"create", "update", "delete"} & set(rule["verbs"])
            assert not ("configmaps" in rule["resources"] and writes)
    declared = {
        c.verb for c in API_CALLS if c.component == "webhook" and c.resource == "configmaps" and not c.named
    }
    assert declared == {"get", "create", "update", "delete", "list"}
