"""What the node plugin's DaemonSet is given (host paths, privileges), and the ValidatingAdmissionPolicy
that binds its writes to its own node, rendered by the real Helm engine; the policy's CEL evaluated
with cel-python on both sides."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import celpy
import helm_python
import kubernetes_validate
import pytest
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from tests.support.helm_render import NAMESPACE, Obj, Rendered, render

ACCOUNT = f"system:serviceaccount:{NAMESPACE}:kube-vgpu-node"
NODE_CLAIM = "authentication.kubernetes.io/node-name"
MIG_GROUPS = {
    "node": {
        "groups": [
            {"name": "default", "mode": "hami-core", "nodeSelector": {"kube-vgpu.io/node-group": "hami"}},
            {"name": "mig", "mode": "mig", "nodeSelector": {"kube-vgpu.io/node-group": "mig"}},
        ]
    }
}


@functools.cache
def _render(kube_version: str, **node: Any) -> Rendered:
    values: dict[str, Any] = {"node": {**MIG_GROUPS["node"], **node}}
    return render(values, kube_version=kube_version)


def _daemonsets(r: Rendered) -> dict[str, Obj]:
    return {ds["metadata"]["labels"]["kube-vgpu.io/node-group"]: ds for ds in r.of_kind("DaemonSet")}


def _host_paths(ds: Obj) -> dict[str, str]:
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounted: dict[str, str] = {}
    for mount in container["volumeMounts"] + [
        m for c in spec.get("initContainers", []) for m in c["volumeMounts"]
    ]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            mounted[volume["hostPath"]["path"]] = mount["mountPath"]
    # Every host path volume is mounted somewhere.
    assert set(mounted) == {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
    return mounted


# --- host paths and privileges ----------------------------------------------------------------


def test_hami_core_group_mounts_the_lock_folder_not_the_hosts_tmp() -> None:
    ds = _daemonsets(_render("v1.31.0"))["default"]
    assert _host_paths(ds) == {
        "/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
        "/usr/local/vgpu": "/usr/local/vgpu",
        "/tmp/vgpulock": "/tmp/vgpulock",
    }
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    assert not sc.get("privileged")
    assert spec["hostPID"] is True and not spec.get("hostNetwork") and not spec.get("hostIPC")


def test_mig_group_mounts_neither_hami_core_nor_the_lock_folder() -> None:
    ds = _daemonsets(_render("v1.31.0"))["mig"]
    assert _host_paths(ds) == {"/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins"}
    spec = ds["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The NVIDIA container toolkit hands the MIG config capability to privileged containers only.
    assert container["securityContext"]["privileged"] is True
    assert env["NVIDIA_MIG_CONFIG_DEVICES"] == env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"


def test_unprivileged_mig_group_asks_for_no_mig_capability() -> None:
    values = {"node": {**MIG_GROUPS["node"], "mig": {"privileged": False}}}
    ds = _daemonsets(render(values, kube_version="v1.31.0"))["mig"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    env = {e["name"] for e in container["env"]}
    # The toolkit refuses to start an unprivileged container that asks for them.
    assert not {"NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"} & env
    sc = container["securityContext"]
    assert not sc.get("privileged") and sc["capabilities"] == {"drop": ["ALL"]}


# --- the ValidatingAdmissionPolicy: when it is installed ---------------------------------------


def _policy(r: Rendered) -> Obj | None:
    policies = r.of_kind("ValidatingAdmissionPolicy")
    bindings = r.of_kind("ValidatingAdmissionPolicyBinding")
    assert len(policies) == len(bindings) <= 1
    if not policies:
        return None
    (policy,), (binding,) = policies, bindings
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    return policy


@pytest.mark.parametrize("version", ["v1.30.0", "v1.31.0", "v1.34.0"])
def test_policy_installed_from_1_30_and_valid(version: str) -> None:
    r = _render(version)
    policy = _policy(r)
    assert policy is not None and policy["metadata"]["name"] == "kube-vgpu-node-writes"
    for obj in r.of_kind("ValidatingAdmissionPolicy") + r.of_kind("ValidatingAdmissionPolicyBinding"):
        kubernetes_validate.validate(obj, version, strict=True)
    assert "Node plugin writes: bound to each plugin's own node" in r.notes
    assert "WARNING: the node plugin's writes" not in r.notes


@pytest.mark.parametrize(
    ("version", "mode"), [("v1.29.0", "auto"), ("v1.27.4", "auto"), ("v1.31.0", "disabled")]
)
def test_without_the_policy_the_notes_say_what_the_role_allows(version: str, mode: str) -> None:
    r = _render(version, nodeBoundWrites=mode)
    assert _policy(r) is None
    notes = " ".join(r.notes.split())
    assert "WARNING: the node plugin's writes are not bound to its node" in notes
    assert "patch EVERY Node" in notes and "EVERY pod in the cluster" in notes


def test_enabled_on_a_cluster_older_than_1_30_fails_naming_the_value() -> None:
    with pytest.raises(helm_python.HelmError, match=r"node.nodeBoundWrites=enabled needs Kubernetes >= 1.30"):
        _render("v1.29.0", nodeBoundWrites="enabled")
    assert _policy(_render("v1.30.0", nodeBoundWrites="enabled")) is not None


def test_bad_mode_refused_by_the_values_schema() -> None:
    with pytest.raises(helm_python.HelmError, match="nodeBoundWrites"):
        _render("v1.31.0", nodeBoundWrites="yes")


# --- the policy's CEL, evaluated -----------------------------------------------------------------


class Policy:
    """The rendered policy evaluated as the API server does: match condition, variables in order,
    then every validation; a CEL error counts as a refusal (failurePolicy Fail)."""

    def __init__(self, policy: Obj) -> None:
        env = celpy.Environment()
        spec = policy["spec"]
        assert spec["failurePolicy"] == "Fail"
        self.rules = spec["matchConstraints"]["resourceRules"]
        self.conditions = [env.program(env.compile(c["expression"])) for c in spec["matchConditions"]]
        self.variables = [
            (v["name"], env.program(env.compile(v["expression"]))) for v in spec.get("variables", [])
        ]
        self.validations = [
            (
                env.program(env.compile(v["expression"])),
                env.program(env.compile(v["messageExpression"])) if "messageExpression" in v else None,
                v.get("message"),
            )
            for v in spec["validations"]
        ]

    def matches(self, resource: str, operation: str) -> bool:
        return any(resource in r["resources"] and operation in r["operations"] for r in self.rules)

    def admit(self, request: Mapping[str, Any], old: Obj | None, new: Obj | None) -> tuple[bool, str]:
        """(allowed, message) for one request."""
        activation: dict[str, Any] = {
            "request": json_to_cel(dict(request)),
            "object": json_to_cel(new),
            "oldObject": json_to_cel(old),
        }
        if not all(bool(c.evaluate(activation)) for c in self.conditions):
            return True, "not the node plugin"
        variables: dict[str, Any] = {}
        for name, program in self.variables:
            activation["variables"] = json_to_cel(variables)
            value = program.evaluate(activation)
            assert not isinstance(value, CELEvalError), f"variable {name}: {value!r}"
            variables[name] = value
        activation["variables"] = json_to_cel(variables)
        for program, message_program, message in self.validations:
            result = program.evaluate(activation)
            if isinstance(result, CELEvalError) or not bool(result):
                text = str(message_program.evaluate(activation)) if message_program else str(message)
                return False, " ".join(text.split())
        return True, ""


@pytest.fixture(scope="module")
def policy() -> Policy:
    rendered = _policy(_render("v1.31.0"))
    assert rendered is not None
    return Policy(rendered)


def _request(
    resource: str, name: str, *, user: str = ACCOUNT, nodes: list[str] | None = None, sub: str = ""
) -> Obj:
    user_info: Obj = {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if nodes is not None:
        user_info["extra"] = {NODE_CLAIM: nodes, "authentication.kubernetes.io/pod-name": ["p"]}
    return {
        "operation": "UPDATE",
        "name": name,
        "namespace": "" if resource == "nodes" else "team-a",
        "resource": {"group": "", "version": "v1", "resource": resource},
        "subResource": sub,
        "userInfo": user_info,
    }


def _node(name: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {}}


def _pod(node: str | None) -> Obj:
    spec: Obj = {"containers": [{"name": "main", "image": "cuda"}]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def test_policy_covers_the_writes_the_role_grants(policy: Policy) -> None:
    for resource in ("nodes", "nodes/status", "pods"):
        assert policy.matches(resource, "UPDATE")
    assert not policy.matches("events", "CREATE")


def test_own_node_allowed_other_node_refused(policy: Policy) -> None:
    own = _request("nodes", "gpu-1", nodes=["gpu-1"])
    assert policy.admit(own, _node("gpu-1"), _node("gpu-1")) == (True, "")
    assert policy.admit({**own, "subResource": "status"}, _node("gpu-1"), _node("gpu-1"))[0]
    other = _request("nodes", "gpu-2", nodes=["gpu-1"])
    allowed, message = policy.admit(other, _node("gpu-2"), _node("gpu-2"))
    assert not allowed
    assert message == (
        "the kube-vgpu node plugin on node gpu-1 may write only its own Node, pods bound to it and "
        "its ResourceSlices, not nodes gpu-2"
    )


def test_pods_bound_to_its_node_allowed_others_refused(policy: Policy) -> None:
    request = _request("pods", "p", nodes=["gpu-1"])
    assert policy.admit(request, _pod("gpu-1"), _pod("gpu-1")) == (True, "")
    for old, new in ((_pod("gpu-2"), _pod("gpu-2")), (_pod(None), _pod(None)), (_pod(None), _pod("gpu-1"))):
        allowed, message = policy.admit(request, old, new)
        assert not allowed and "not pods p" in message


def test_no_node_claim_refused(policy: Policy) -> None:
    for nodes in (None, [], ["gpu-1", "gpu-2"]):
        request = _request("nodes", "gpu-1", nodes=nodes)
        allowed, message = policy.admit(request, _node("gpu-1"), _node("gpu-1"))
        assert not allowed, nodes
        assert "token names no node" in message and "node.nodeBoundWrites=disabled" in message
    # Extra without the node claim (a token of a pod from before 1.30, or a user's credentials).
    request = _request("pods", "p", nodes=["gpu-1"])
    request["userInfo"]["extra"] = {"authentication.kubernetes.io/pod-name": ["p"]}
    assert not policy.admit(request, _pod("gpu-1"), _pod("gpu-1"))[0]


def test_other_accounts_are_not_this_policys_business(policy: Policy) -> None:
    request = _request("nodes", "gpu-2", user="system:serviceaccount:kube-system:volcano-scheduler")
    assert policy.admit(request, _node("gpu-2"), _node("gpu-2")) == (True, "not the node plugin")
    # The same name in another namespace is another account.
    request = _request("nodes", "gpu-2", user="system:serviceaccount:other:kube-vgpu-node")
    assert policy.admit(request, _node("gpu-2"), _node("gpu-2"))[0]
