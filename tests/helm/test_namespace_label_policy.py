"""The optional ValidatingAdmissionPolicy over kube-vgpu's namespace labels (`namespaceLabelPolicy`),
rendered by the real Helm engine, validated against Kubernetes' schema and evaluated with cel-python
as the API server would: only the listed users and groups add, change or remove
quota.kube-vgpu.io/*, kube-vgpu.io/webhook and resource.kubernetes.io/admin-access; every other
label, and every other writer's unchanged labels, pass."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.helm.test_node_security import Policy
from tests.support.helm_render import Obj, Rendered, render

ADMINS = "platform-admins"
GITOPS = "system:serviceaccount:argocd:argocd-application-controller"
TENANT = "alice"


def _render(version: str = "v1.31.0", **policy: Any) -> Rendered:
    return render({"namespaceLabelPolicy": {"enabled": True, **policy}}, kube_version=version)


@pytest.fixture(scope="module")
def policy() -> Policy:
    r = _render(allowedGroups=["system:masters", ADMINS], allowedUsers=[GITOPS])
    vap = r.one("ValidatingAdmissionPolicy", "kube-vgpu-namespace-labels")
    binding = r.one("ValidatingAdmissionPolicyBinding", "kube-vgpu-namespace-labels")
    for obj in (vap, binding):
        kubernetes_validate.validate(obj, "1.31.0", strict=True)
    assert vap["metadata"]["name"] == "kube-vgpu-namespace-labels"
    assert binding["spec"] == {"policyName": "kube-vgpu-namespace-labels", "validationActions": ["Deny"]}
    return Policy(vap)


def _request(operation: str, user: str = TENANT, groups: list[str] | None = None) -> Obj:
    return {
        "operation": operation,
        "name": "team-a",
        "namespace": "",
        "resource": {"group": "", "version": "v1", "resource": "namespaces"},
        "subResource": "",
        "userInfo": {"username": user, "groups": groups or ["system:authenticated"]},
    }


def _ns(**labels: str) -> Obj:
    meta: Obj = {"name": "team-a"}
    if labels:
        meta["labels"] = {"kubernetes.io/metadata.name": "team-a", **labels}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


QUOTA = "quota.kube-vgpu.io/vgpu-memory"
# (what a write does, labels before (None: a CREATE), labels after)
PROTECTED_CHANGES = [
    ("lift the quota", {QUOTA: "61440"}, {}),
    ("raise the quota", {QUOTA: "61440"}, {QUOTA: "999999"}),
    ("add a quota label", {}, {"quota.kube-vgpu.io/vgpu-cores": "50"}),
    ("opt out of the webhook", {}, {"kube-vgpu.io/webhook": "ignore"}),
    ("take admin access", {}, {"resource.kubernetes.io/admin-access": "true"}),
    ("drop admin access", {"resource.kubernetes.io/admin-access": "true"}, {}),
    ("create opted out", None, {"kube-vgpu.io/webhook": "ignore"}),
    ("create with admin access", None, {"resource.kubernetes.io/admin-access": "true"}),
]


def _labels(
    policy: Policy, before: dict[str, str] | None, after: dict[str, str], **who: Any
) -> tuple[bool, str]:
    operation = "CREATE" if before is None else "UPDATE"
    old = None if before is None else _ns(**before)
    return policy.admit(_request(operation, **who), old, _ns(**after))


@pytest.mark.parametrize(
    ("what", "before", "after"), PROTECTED_CHANGES, ids=[c[0] for c in PROTECTED_CHANGES]
)
def test_a_tenant_cannot_change_a_protected_label(
    policy: Policy, what: str, before: dict[str, str] | None, after: dict[str, str]
) -> None:
    allowed, message = _labels(policy, before, after)
    assert not allowed, what
    assert message.startswith("namespace team-a: the labels quota.kube-vgpu.io/*, kube-vgpu.io/webhook and")
    assert message.endswith("(alice is not one)")


@pytest.mark.parametrize(
    ("what", "before", "after"), PROTECTED_CHANGES, ids=[c[0] for c in PROTECTED_CHANGES]
)
def test_the_listed_groups_and_users_can(
    policy: Policy, what: str, before: dict[str, str] | None, after: dict[str, str]
) -> None:
    # The match condition leaves their requests out of the policy.
    assert _labels(policy, before, after, user="bob", groups=["system:authenticated", ADMINS])[0]
    assert _labels(policy, before, after, user=GITOPS, groups=["system:serviceaccounts"])[0]


def test_a_tenant_keeps_every_other_label_and_the_protected_ones_unchanged(policy: Policy) -> None:
    quota = {QUOTA: "61440", "kube-vgpu.io/webhook": "ignore"}
    assert _labels(policy, quota, {**quota, "team": "a"}) == (True, "")
    assert _labels(policy, {**quota, "team": "a"}, quota) == (True, "")
    assert _labels(policy, {}, {"team": "a"}) == (True, "")
    assert _labels(policy, None, {"team": "a"}) == (True, "")
    # No labels at all, before or after (the API server adds kubernetes.io/metadata.name, but
    # the policy does not rely on it).
    bare = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert policy.admit(_request("CREATE"), None, bare) == (True, "")
    assert policy.admit(_request("UPDATE"), bare, bare) == (True, "")
    # A look-alike key is not protected; the prefix itself is.
    assert _labels(policy, {}, {"quota.kube-vgpu.io.example/x": "1", "kube-vgpu.io/webhooks": "x"}) == (
        True,
        "",
    )
    assert _labels(policy, {}, {"quota.kube-vgpu.io/anything": "1"})[0] is False


def test_it_covers_namespace_creates_and_updates_only(policy: Policy) -> None:
    assert policy.matches("namespaces", "CREATE") and policy.matches("namespaces", "UPDATE")
    assert not policy.matches("namespaces", "DELETE") and not policy.matches("pods", "UPDATE")


def test_off_by_default_and_refused_where_it_cannot_work() -> None:
    defaults = render(None, kube_version="v1.31.0")
    assert [p["metadata"]["name"] for p in defaults.of_kind("ValidatingAdmissionPolicy")] == [
        "kube-vgpu-node-writes"
    ]
    assert [p["metadata"]["name"] for p in _render("v1.30.0").of_kind("ValidatingAdmissionPolicy")] == [
        "kube-vgpu-namespace-labels",
        "kube-vgpu-node-writes",
    ]
    with pytest.raises(
        helm_python.HelmError, match=r"namespaceLabelPolicy.enabled needs Kubernetes >= 1.30.*v1.29.0"
    ):
        _render("v1.29.0")
    with pytest.raises(helm_python.HelmError, match="would let nobody change the protected namespace labels"):
        _render(allowedGroups=[], allowedUsers=[])
    for bad in (["it's"], ["a\\b"], [""], ["x", "x"]):
        with pytest.raises(helm_python.HelmError, match="values don't meet the specifications of the schema"):
            _render(allowedUsers=bad)


def test_the_policy_docs_quota_md_shows_refuses_and_allows_the_same() -> None:
    """docs/quota.md gives the policy for clusters installed without the chart's value: it must
    validate against Kubernetes' schema and decide as the chart's does."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "quota.md").read_text(encoding="utf-8")
    section = text[text.index("## Who may change the labels") :]
    (block,) = [
        b for b in re.findall(r"```yaml\n(.*?)```", section, re.S) if "kind: ValidatingAdmissionPolicy" in b
    ]
    vap, binding = yaml.safe_load_all(block)
    for obj in (vap, binding):
        kubernetes_validate.validate(obj, "1.30.0", strict=True)
    documented = Policy(vap)
    for what, before, after in PROTECTED_CHANGES:
        assert not _labels(documented, before, after)[0], what
        assert _labels(documented, before, after, user="bob", groups=["platform-admins"])[0], what
    assert _labels(documented, {QUOTA: "1"}, {QUOTA: "1", "team": "a"}) == (True, "")


def test_the_notes_say_who_may_change_the_labels() -> None:
    on = " ".join(_render(allowedGroups=[ADMINS], allowedUsers=[GITOPS]).notes.split())
    assert f"Namespace labels: only {ADMINS}, {GITOPS} may change quota.kube-vgpu.io/*" in on
    assert "(ValidatingAdmissionPolicy kube-vgpu-namespace-labels)" in on
    off = " ".join(render(None, kube_version="v1.31.0").notes.split())
    assert "whoever may update a namespace may change its quota.kube-vgpu.io/* quota" in off
    assert "namespaceLabelPolicy.enabled" in off
