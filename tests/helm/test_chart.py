"""The Helm chart, rendered by the real Helm engine and checked against Kubernetes' own schemas.

Each values set is rendered once per module (a cached fixture) for the Kubernetes version it
targets; every object is validated strictly (unknown fields are errors) against that version's
OpenAPI schemas, and the properties that matter (who reaches the webhook, what each
ServiceAccount may do, what the program will read as its config) are checked on the objects.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import helm_python
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from kube_vgpu.contract import names
from kube_vgpu.contract.config import Config, NodeConfig, ResourceNames, WebhookConfig, parse_config
from kube_vgpu.standins.apiserver.selectors import expression_matches
from tests.support.helm_render import (
    CHART_DIR,
    NAMESPACE,
    RELEASE,
    Obj,
    Rendered,
    default_values,
    lint,
    render,
    validate_values,
)

OPT_OUT = {names.OPT_OUT_LABEL: names.OPT_OUT_VALUE}
HAMI_NAMES = {
    "count": "nvidia.com/gpu",
    "memory": "nvidia.com/gpumem",
    "memoryPercentage": "nvidia.com/gpumem-percentage",
    "cores": "nvidia.com/gpucores",
}
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
}
# The DRA driver's DeviceClass is named after the driver (claims name it), not the release.
DEVICE_CLASS = "vgpu.kube-vgpu.io"
CERT_MANAGER_KINDS = {"Issuer", "Certificate"}


@dataclass(frozen=True)
class Case:
    """One values set and the Kubernetes version it is rendered for."""

    kube_version: str
    values: Mapping[str, Any] = field(default_factory=dict)
    # The fullname prefix every object name starts with.
    prefix: str = RELEASE

    def merged(self) -> dict[str, Any]:
        return _merge(default_values(), self.values)

    @property
    def minor(self) -> int:
        return int(self.kube_version.lstrip("v").split(".")[1])


CASES: dict[str, Case] = {
    "defaults": Case("v1.31.0"),
    "k8s-1.25": Case("v1.25.0"),
    "k8s-1.27": Case("v1.27.4"),
    "k8s-1.29-auto": Case("v1.29.0"),
    "k8s-1.28-forced": Case("v1.28.2", {"webhook": {"matchConditions": "enabled"}}),
    "k8s-1.30": Case("v1.30.1"),
    "k8s-1.37": Case("v1.37.0"),
    "no-match-conditions": Case("v1.33.0", {"webhook": {"matchConditions": "disabled"}}),
    "cert-manager": Case("v1.31.0", {"certManager": {"enabled": True}}),
    "dra": Case("v1.36.0", {"dra": {"enabled": True}}),
    "ignore": Case("v1.32.0", {"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 10}}),
    "custom-names": Case(
        "v1.33.0",
        {
            "fullnameOverride": "gpu-share",
            "config": {
                "resourceNames": HAMI_NAMES,
                "webhook": {"schedulerName": "my-volcano", "otherSchedulers": "deny", "defaultMode": "mig"},
                "node": {
                    "deviceSplitCount": 4,
                    "hookPath": "/opt/hami",
                    "deviceConfigNamespace": "volcano-system",
                    "ignoredXids": [13, 79],
                    "recoveryQuietSeconds": 30.5,
                },
            },
            "webhook": {"excludedNamespaces": ["monitoring"], "tls": {"secretName": "gpu-share-tls"}},
        },
        prefix="gpu-share",
    ),
    "mig-group": Case(
        "v1.32.0",
        {
            "nameOverride": "gpushare",
            "node": {
                "runtimeClassName": "nvidia",
                "groups": [
                    {
                        "name": "default",
                        "mode": "hami-core",
                        "nodeSelector": {
                            "nvidia.com/gpu.present": "true",
                            "kube-vgpu.io/node-group": "slices",
                        },
                    },
                    {
                        "name": "mig",
                        "mode": "mig",
                        "nodeSelector": {"nvidia.com/gpu.present": "true", "kube-vgpu.io/node-group": "mig"},
                        "tolerations": [{"key": "mig", "operator": "Exists"}],
                    },
                ],
                "hamiCoreInstaller": {"enabled": True},
            },
            "volcanoDeviceConfig": {"create": True},
        },
        prefix=f"{RELEASE}-gpushare",
    ),
    "dra-group": Case(
        "v1.36.0",
        {
            "node": {
                "groups": [
                    {
                        "name": "default",
                        "mode": "hami-core",
                        "nodeSelector": {"kube-vgpu.io/node-group": "volcano"},
                    },
                    {
                        "name": "dra",
                        "mode": "hami-core",
                        "api": "dra",
                        "nodeSelector": {"kube-vgpu.io/node-group": "dra"},
                    },
                ],
                "dra": {"extendedResourceName": "kube-vgpu.io/gpu"},
            }
        },
    ),
}


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of maps: override wins, maps merge, lists replace."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@functools.cache
def _rendered(case_id: str) -> Rendered:
    case = CASES[case_id]
    return render(case.values, kube_version=case.kube_version)


@pytest.fixture(params=sorted(CASES), scope="module")
def case_id(request: pytest.FixtureRequest) -> str:
    param: str = request.param
    return param


@pytest.fixture(scope="module")
def case(case_id: str) -> Case:
    return CASES[case_id]


@pytest.fixture(scope="module")
def rendered(case_id: str) -> Rendered:
    return _rendered(case_id)


def _webhook(r: Rendered) -> Obj:
    (mwc,) = r.of_kind("MutatingWebhookConfiguration")
    (hook,) = mwc["webhooks"]
    hook_obj: Obj = hook
    return hook_obj


def _config(r: Rendered) -> Config:
    (cm,) = [c for c in r.of_kind("ConfigMap") if "config.yaml" in c.get("data", {})]
    return parse_config(cm["data"]["config.yaml"], source="rendered ConfigMap")


def _pod(template: Obj, namespace: str) -> Obj:
    """A pod as the API server would admit it from a workload's template."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**copy.deepcopy(template["metadata"]), "namespace": namespace},
        "spec": copy.deepcopy(template["spec"]),
    }


# --- label selectors, evaluated as the (stand-in) API server does ---------------------------


def _selects(selector: Obj, labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items()) and all(
        expression_matches(expr, labels) for expr in selector.get("matchExpressions", [])
    )


def _namespace_labels(name: str, **extra: str) -> dict[str, str]:
    # The API server sets kubernetes.io/metadata.name on every namespace (GA since 1.22).
    return {"kubernetes.io/metadata.name": name, **extra}


# --- CEL (matchConditions) evaluated with a real CEL implementation -------------------------


def _cel_conditions(hook: Obj) -> dict[str, Callable[[Obj], bool]]:
    env = celpy.Environment()
    out: dict[str, Callable[[Obj], bool]] = {}
    for cond in hook.get("matchConditions", []):
        program = env.program(env.compile(cond["expression"]))

        def evaluate(pod: Obj, program: Any = program) -> bool:
            result = program.evaluate({"object": json_to_cel(pod)})
            # An error or a non-bool would count as a webhook failure under failurePolicy Fail.
            assert isinstance(result, celpy.celtypes.BoolType), f"matchCondition evaluated to {result!r}"
            return bool(result)

        out[cond["name"]] = evaluate
    return out


def _reaches_webhook(r: Rendered, pod: Obj, namespace_labels: Mapping[str, str]) -> bool:
    """Would the API server call the webhook for this pod CREATE?"""
    hook = _webhook(r)
    if not _selects(hook["namespaceSelector"], namespace_labels):
        return False
    return all(cond(pod) for cond in _cel_conditions(hook).values())


def _gpu_pod(resources: Obj, *, init: bool = False, labels: Mapping[str, str] | None = None) -> Obj:
    container = {"name": "main", "image": "cuda", "resources": resources}
    spec: Obj = {"containers": [{"name": "plain", "image": "busybox"}]}
    if init:
        spec["initContainers"] = [container]
    else:
        spec["containers"].append(container)
    return {"metadata": {"name": "p", "labels": dict(labels or {})}, "spec": spec}


# === rendering, lint and schema validation ==================================================


def test_lint_is_clean(case: Case) -> None:
    report = lint(case.values, kube_version=case.kube_version)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


def test_every_object_validates_against_its_kubernetes_version(rendered: Rendered, case: Case) -> None:
    assert rendered.objects
    for obj in rendered.objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CERT_MANAGER_KINDS:
            # cert-manager's CRDs are not in Kubernetes' schemas; checked by hand below.
            assert obj["apiVersion"] == "cert-manager.io/v1", where
            assert case.merged()["certManager"]["enabled"], where
            continue
        try:
            kubernetes_validate.validate(obj, case.kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{where} is invalid for Kubernetes {case.kube_version} at {path}: {exc.message}")


def test_objects_are_named_uniquely_with_the_fullname_and_namespaced_explicitly(
    rendered: Rendered, case: Case
) -> None:
    seen: set[tuple[str, str, str]] = set()
    device_config = case.merged()["config"]["node"]
    for obj in rendered.objects:
        meta = obj["metadata"]
        key = (obj["kind"], meta.get("namespace", ""), meta["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)
        for value in meta.get("labels", {}).values():
            assert len(str(value)) <= 63, f"{key}: label value {value!r} too long"
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, key
        else:
            assert meta.get("namespace"), f"{key} has no namespace"
        # Only Volcano's fixed device ConfigMap and the Role that reads it are named by Volcano.
        if meta["name"] not in (device_config["deviceConfigName"], DEVICE_CLASS):
            assert meta["name"].startswith(case.prefix), f"{key} is not named after {case.prefix}"
        if meta.get("namespace") and meta["namespace"] != rendered.namespace:
            assert meta["namespace"] == device_config["deviceConfigNamespace"], key


def test_notes_render(rendered: Rendered) -> None:
    assert "kube-vgpu" in rendered.notes and "deviceshare.VGPUEnable" in rendered.notes


# === the MutatingWebhookConfiguration ======================================================


def test_webhook_configuration_settings(rendered: Rendered, case: Case) -> None:
    values = case.merged()["webhook"]
    hook = _webhook(rendered)
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["failurePolicy"] == values["failurePolicy"]
    assert hook["timeoutSeconds"] == values["timeoutSeconds"]
    # The client config reaches the webhook container through the Service.
    service_ref = hook["clientConfig"]["service"]
    service = rendered.one("Service", service_ref["name"])
    assert service_ref["namespace"] == service["metadata"]["namespace"] == rendered.namespace
    assert service_ref["path"] == "/mutate"
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == "https"]
    assert port["port"] == service_ref["port"] == 443
    deployment = rendered.one("Deployment")
    assert _selects(
        {"matchLabels": service["spec"]["selector"]}, deployment["spec"]["template"]["metadata"]["labels"]
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[port["targetPort"]] == values["port"] == 8443


def test_defaults_fail_closed_with_a_five_second_timeout() -> None:
    hook = _webhook(_rendered("defaults"))
    assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Fail", 5)
    assert _webhook(_rendered("ignore"))["failurePolicy"] == "Ignore"


def test_namespace_selector_excludes_kube_system_the_release_namespace_and_opted_out_namespaces(
    rendered: Rendered, case: Case
) -> None:
    selector = _webhook(rendered)["namespaceSelector"]
    assert not _selects(selector, _namespace_labels("kube-system"))
    assert not _selects(selector, _namespace_labels(rendered.namespace))
    assert not _selects(selector, _namespace_labels("team-a", **OPT_OUT))
    assert _selects(selector, _namespace_labels("team-a"))
    assert _selects(selector, _namespace_labels("team-a", **{names.OPT_OUT_LABEL: "yes-please"}))
    for extra in case.merged()["webhook"]["excludedNamespaces"]:
        assert not _selects(selector, _namespace_labels(extra))


def test_match_conditions_follow_the_cluster_version(rendered: Rendered, case: Case) -> None:
    mode = case.merged()["webhook"]["matchConditions"]
    expected = (mode == "auto" and case.minor >= 30) or (mode == "enabled" and case.minor >= 28)
    hook = _webhook(rendered)
    assert ("matchConditions" in hook) == expected
    if expected:
        assert {c["name"] for c in hook["matchConditions"]} == {"requests-vgpu"}


def test_forcing_match_conditions_below_1_28_fails_with_a_clear_message() -> None:
    with pytest.raises(
        helm_python.HelmError, match=r"webhook\.matchConditions=enabled needs Kubernetes >= 1\.28"
    ):
        render({"webhook": {"matchConditions": "enabled"}}, kube_version="v1.27.0")


def test_match_conditions_would_be_rejected_by_kubernetes_1_26() -> None:
    # Why they are version-gated: the 1.26 schema has no such field.
    mwc = copy.deepcopy(_rendered("defaults").one("MutatingWebhookConfiguration"))
    with pytest.raises(kubernetes_validate.ValidationError, match="matchConditions"):
        kubernetes_validate.validate(mwc, "1.26", strict=True)


@pytest.mark.parametrize("case_id", ["defaults", "custom-names", "k8s-1.28-forced"])
def test_match_conditions_name_exactly_the_configured_resource_names(case_id: str) -> None:
    r = _rendered(case_id)
    configured = set(_config(r).resource_names.all())
    (cond,) = [c for c in _webhook(r)["matchConditions"] if c["name"] == "requests-vgpu"]
    literals = set(re.findall(r"'([^']*)'", cond["expression"]))
    assert literals == configured


@pytest.mark.parametrize("case_id", ["defaults", "custom-names"])
def test_only_pods_naming_a_vgpu_resource_reach_the_webhook(case_id: str) -> None:
    r = _rendered(case_id)
    rn = _config(r).resource_names
    ns = _namespace_labels("team-a")
    for name in rn.all():
        assert _reaches_webhook(r, _gpu_pod({"limits": {name: "1"}}), ns), name
        assert _reaches_webhook(r, _gpu_pod({"requests": {name: "1"}}), ns), name
        assert _reaches_webhook(r, _gpu_pod({"limits": {name: "1"}}, init=True), ns), name
    other = "example.com/fpga"
    assert not _reaches_webhook(r, _gpu_pod({"limits": {other: "1", "cpu": "1"}}), ns)
    assert not _reaches_webhook(r, _gpu_pod({}), ns)
    assert not _reaches_webhook(
        r, {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "c"}]}}, ns
    )
    # A GPU pod labelled with the opt-out label is still sent (its labels are its author's);
    # one in an excluded namespace is not.
    assert _reaches_webhook(r, _gpu_pod({"limits": {rn.count: "1"}}, labels=OPT_OUT), ns)
    assert not _reaches_webhook(r, _gpu_pod({"limits": {rn.count: "1"}}), _namespace_labels("kube-system"))
    # The other naming scheme is not ours in this release.
    foreign = "volcano.sh/vgpu-number" if rn.count != "volcano.sh/vgpu-number" else "nvidia.com/gpu"
    assert not _reaches_webhook(r, _gpu_pod({"limits": {foreign: "1"}}), ns)


def test_the_charts_own_pods_never_reach_the_webhook(rendered: Rendered) -> None:
    for workload, template in rendered.pod_templates():
        pod = _pod(template, workload["metadata"]["namespace"])
        ns = _namespace_labels(workload["metadata"]["namespace"])
        assert not _reaches_webhook(rendered, pod, ns), workload["metadata"]["name"]


def test_hook_job_pods_need_no_exemption(rendered: Rendered) -> None:
    hook = _webhook(rendered)
    conditions = _cel_conditions(hook)
    for job in rendered.of_kind("Job"):
        pod = _pod(job["spec"]["template"], job["metadata"]["namespace"])
        # They run in the release namespace, which the namespaceSelector excludes, and ask no GPU,
        # so nothing a pod author could copy (a label, a name) is needed to keep them out.
        assert not _selects(hook["namespaceSelector"], _namespace_labels(pod["metadata"]["namespace"]))
        if conditions:
            assert conditions["requests-vgpu"](pod) is False


# === RBAC ===================================================================================

Grant = tuple[
    str, str, str, str, str
]  # (scope: "cluster" or a namespace, apiGroup, resource, verb, resourceName)


def _grants_by_service_account(r: Rendered) -> dict[str, set[Grant]]:
    roles = {("ClusterRole", "", o["metadata"]["name"]): o for o in r.of_kind("ClusterRole")}
    roles |= {("Role", o["metadata"]["namespace"], o["metadata"]["name"]): o for o in r.of_kind("Role")}
    out: dict[str, set[Grant]] = {sa["metadata"]["name"]: set() for sa in r.of_kind("ServiceAccount")}
    for binding in r.of_kind("ClusterRoleBinding") + r.of_kind("RoleBinding"):
        ref = binding["roleRef"]
        scope = binding["metadata"].get("namespace", "")
        role = roles.get((ref["kind"], scope if ref["kind"] == "Role" else "", ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} refers to a role the chart does not render"
        grant_scope = scope or "cluster"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == r.namespace, subject
            assert subject["name"] in out, f"binding to unknown ServiceAccount {subject['name']}"
            for rule in role["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            for name in rule.get("resourceNames") or ["*any*"]:
                                out[subject["name"]].add((grant_scope, group, resource, verb, name))
    return out


def _grants(
    scope: str, resources: list[str], verbs: list[str], name: str = "*any*", group: str = ""
) -> set[Grant]:
    return {(scope, group, res, verb, name) for res in resources for verb in verbs}


def test_rbac_has_no_wildcards_and_no_secrets_outside_the_certificate_jobs(rendered: Rendered) -> None:
    for role in rendered.of_kind("ClusterRole") + rendered.of_kind("Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            assert "nonResourceURLs" not in rule
    for sa, grants in _grants_by_service_account(rendered).items():
        if "-certs-" not in sa:
            assert not {g for g in grants if g[2] == "secrets"}, sa


def test_every_pod_runs_as_its_own_service_account(rendered: Rendered) -> None:
    accounts = {sa["metadata"]["name"] for sa in rendered.of_kind("ServiceAccount")}
    used: dict[str, str] = {}
    for workload, template in rendered.pod_templates():
        sa = template["spec"]["serviceAccountName"]
        assert sa in accounts
        component = workload["metadata"]["labels"]["app.kubernetes.io/component"]
        assert used.setdefault(sa, component) == component, f"{sa} shared by {used[sa]} and {component}"


def test_certificate_rbac_exists_before_its_job_runs(rendered: Rendered) -> None:
    jobs = rendered.of_kind("Job")
    phases = {}
    for job in jobs:
        ann = job["metadata"]["annotations"]
        phases[job["metadata"]["name"]] = (ann["helm.sh/hook"], int(ann["helm.sh/hook-weight"]))
        assert "before-hook-creation" in ann["helm.sh/hook-delete-policy"]
        assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    if not jobs:
        return
    prefix = rendered.one("ServiceAccount", next(iter(phases)))["metadata"]["name"].rsplit("-certs-", 1)[0]
    assert phases[f"{prefix}-certs-create"][0] == "pre-install,pre-upgrade"
    assert phases[f"{prefix}-certs-patch"][0] == "post-install,post-upgrade"
    for kind in ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"):
        for obj in rendered.of_kind(kind):
            name = obj["metadata"]["name"]
            if name not in phases:
                continue
            ann = obj["metadata"]["annotations"]
            hook, weight = phases[name]
            assert ann["helm.sh/hook"] == hook, (kind, name)
            assert int(ann["helm.sh/hook-weight"]) < weight, (kind, name)


# === the config file and what else reads it ================================================


def test_config_map_parses_with_the_programs_own_parser_and_carries_the_values(
    rendered: Rendered, case: Case
) -> None:
    cfg = case.merged()["config"]
    parsed = _config(rendered)
    expected = Config(
        resource_names=ResourceNames(**_snake(cfg["resourceNames"])),
        webhook=WebhookConfig(
            **{
                **_snake(cfg["webhook"]),
                # The chart adds the node plugin's service account to the configured writers.
                "annotation_writers": (*cfg["webhook"]["annotationWriters"], _node_account(rendered)),
                # dra.enabled, or a node group with `api: dra`, turns the listed DRA classes
                # (kube-vgpu's own when none) on; otherwise none.
                "dra_device_classes": tuple(
                    (cfg["webhook"]["draDeviceClasses"] or ["vgpu.kube-vgpu.io"])
                    if case.merged()["dra"]["enabled"]
                    or any(g.get("api") == "dra" for g in case.merged()["node"]["groups"])
                    else ()
                ),
            }
        ),
        node=NodeConfig(**{**_snake(cfg["node"]), "ignored_xids": tuple(cfg["node"]["ignoredXids"])}),
    )
    assert parsed == expected


def _node_account(r: Rendered) -> str:
    (daemonset, *_) = r.of_kind("DaemonSet")
    return (
        f"system:serviceaccount:{r.namespace}:{daemonset['spec']['template']['spec']['serviceAccountName']}"
    )


def test_default_values_are_the_programs_defaults() -> None:
    r = _rendered("defaults")
    defaults = Config()
    writers = (*defaults.webhook.annotation_writers, _node_account(r))
    assert _config(r) == dataclasses.replace(
        defaults, webhook=dataclasses.replace(defaults.webhook, annotation_writers=writers)
    )


def test_custom_values_reach_the_config() -> None:
    parsed = _config(_rendered("custom-names"))
    assert parsed.resource_names.all() == tuple(HAMI_NAMES.values())
    assert parsed.node.recovery_quiet_seconds == 30.5
    assert parsed.node.ignored_xids == (13, 79)
    assert parsed.webhook.other_schedulers == "deny"


def test_values_schema_config_keys_are_exactly_the_programs_keys() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    sections = schema["properties"]["config"]["properties"]
    for key, cls in (("resourceNames", ResourceNames), ("webhook", WebhookConfig), ("node", NodeConfig)):
        assert set(sections[key]["properties"]) == {_camel(f.name) for f in dataclasses.fields(cls)}, key
        assert sections[key]["additionalProperties"] is False
    assert set(default_values()["config"]) == set(sections)


def test_components_mount_the_config_and_use_its_paths(rendered: Rendered) -> None:
    cfg = _config(rendered)
    for workload, template in rendered.pod_templates():
        if workload["kind"] == "Job":
            continue
        spec = template["spec"]
        (container,) = spec["containers"]
        assert "--config=/etc/kube-vgpu/config/config.yaml" in container["args"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/etc/kube-vgpu/config"]]["configMap"]["name"].endswith("-config")
        assert template["metadata"]["annotations"]["checksum/config"]
    for ds in rendered.of_kind("DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
        mounted = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        if "--mode=hami-core" in container["args"]:
            assert host_paths["hami-core"] == mounted["hami-core"] == cfg.node.hook_path
            assert host_paths["vgpu-lock"] == mounted["vgpu-lock"] == "/tmp/vgpulock"
        if "--api=dra" in container["args"]:
            # tests/helm/test_node_dra.py checks a DRA group's folders.
            assert "device-plugins" not in host_paths
        else:
            folder = "/var/lib/kubelet/device-plugins"
            assert host_paths["device-plugins"] == mounted["device-plugins"] == folder
        assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == cfg.node.metrics_port


def test_volcano_device_config_matches_the_programs_config() -> None:
    assert not [c for c in _rendered("defaults").of_kind("ConfigMap") if "device-config.yaml" in c["data"]]
    r = _rendered("mig-group")
    cfg = _config(r)
    cm = r.one("ConfigMap", cfg.node.device_config_name)
    assert cm["metadata"]["namespace"] == cfg.node.device_config_namespace == "kube-system"
    nvidia = yaml.safe_load(cm["data"][names.DEVICE_CONFIG_KEY])["nvidia"]
    assert (
        nvidia["resourceCountName"],
        nvidia["resourceMemoryName"],
        nvidia["resourceMemoryPercentageName"],
        nvidia["resourceCoreName"],
    ) == cfg.resource_names.all()
    assert nvidia["deviceSplitCount"] == cfg.node.device_split_count
    assert nvidia["gpuMemoryFactor"] == 1
    groups = [g["group"] for m in nvidia["knownMigGeometries"] for g in m["allowedGeometries"]]
    assert groups and all("-" not in g for g in groups)


# === workloads ==============================================================================


def test_webhook_deployment_is_highly_available(rendered: Rendered, case: Case) -> None:
    values = case.merged()["webhook"]
    deployment = rendered.one("Deployment")
    template = deployment["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == values["replicas"] == 2
    assert _selects(deployment["spec"]["selector"], labels)
    (pdb,) = rendered.of_kind("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1 and _selects(pdb["spec"]["selector"], labels)
    spread = template["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    assert all(_selects(c["labelSelector"], labels) for c in spread)
    (container,) = template["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = container[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", "https")
    assert container["args"][0] == "webhook"
    tls = {v["name"]: v for v in template["spec"]["volumes"]}["tls"]["secret"]["secretName"]
    assert "--tls-cert-file=/etc/kube-vgpu/tls/tls.crt" in container["args"]
    assert "--tls-key-file=/etc/kube-vgpu/tls/tls.key" in container["args"]
    assert tls == (values["tls"]["secretName"] or f"{case.prefix}-webhook-tls")


def test_webhook_mounts_the_serving_pair_but_not_the_ca_key(rendered: Rendered) -> None:
    volumes = {v["name"]: v for v in rendered.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    items = volumes["tls"]["secret"]["items"]
    assert {i["key"]: i["path"] for i in items} == {"tls.crt": "tls.crt", "tls.key": "tls.key"}


def test_single_replica_gets_no_pod_disruption_budget() -> None:
    r = render({"webhook": {"replicas": 1}}, kube_version="v1.31.0")
    assert r.of_kind("PodDisruptionBudget") == []
    with pytest.raises(helm_python.HelmError, match="minAvailable"):
        render(
            {"webhook": {"replicas": 2, "podDisruptionBudget": {"minAvailable": 2}}}, kube_version="v1.31.0"
        )


def test_restricted_security_context_for_webhook_and_jobs(rendered: Rendered) -> None:
    uid = default_values()["nonRootUser"]["uid"]
    for workload, template in rendered.pod_templates():
        if workload["kind"] == "DaemonSet":
            continue
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"] + spec.get("initContainers", []):
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] == uid != 0
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert not sc.get("privileged")


def test_node_daemonsets_one_per_group(rendered: Rendered, case: Case) -> None:
    node = case.merged()["node"]
    daemonsets = rendered.of_kind("DaemonSet")
    assert len(daemonsets) == len(node["groups"])
    for group, ds in zip(node["groups"], daemonsets, strict=True):
        assert ds["metadata"]["name"] == f"{case.prefix}-node-{group['name']}"
        spec = ds["spec"]["template"]["spec"]
        assert _selects(ds["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"])
        assert spec["priorityClassName"] == "system-node-critical"
        # An empty node.nodeSelector stands for the GPU-node label, which the template supplies.
        default_selector = node["nodeSelector"] or {"nvidia.com/gpu.present": "true"}
        assert spec["nodeSelector"] == group.get("nodeSelector", default_selector)
        assert spec["tolerations"] == group.get("tolerations", node["tolerations"])
        assert spec.get("runtimeClassName", "") == node["runtimeClassName"]
        (container,) = spec["containers"]
        args = container["args"]
        assert args[0] == "node" and f"--mode={group['mode']}" in args
        env = {e["name"]: e for e in container["env"]}
        assert "--node-name=$(KUBE_VGPU_NODE_NAME)" in args
        assert env["KUBE_VGPU_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
        assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        if group["mode"] == "mig":
            assert env["NVIDIA_MIG_CONFIG_DEVICES"]["value"] == "all"
            assert sc["privileged"] is True
        else:
            assert "NVIDIA_MIG_CONFIG_DEVICES" not in env
            assert not sc.get("privileged")
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["hostPID"] is True  # usage metrics read host PIDs' /proc/<pid>/cgroup


def test_node_defaults_select_gpu_nodes_and_tolerate_the_gpu_taint() -> None:
    (ds,) = _rendered("defaults").of_kind("DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert "runtimeClassName" not in spec


def _installer(ds: Obj) -> Obj | None:
    inits = ds["spec"]["template"]["spec"].get("initContainers", [])
    assert [c["name"] for c in inits] in ([], ["install-hami-core"])
    return inits[0] if inits else None


def test_hami_core_is_installed_by_default() -> None:
    r = _rendered("defaults")
    (ds,) = r.of_kind("DaemonSet")
    init = _installer(ds)
    assert init is not None
    # A release of Volcano's vGPU device-plugin image, which keeps HAMi-core in /k8s-vgpu/lib/nvidia.
    assert init["image"] == "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"
    assert init["volumeMounts"] == [{"name": "hami-core", "mountPath": "/usr/local/vgpu"}]
    script = init["command"][-1]
    assert "for base in libvgpu.so ld.so.preload;" in script
    assert 'cp "/k8s-vgpu/lib/nvidia/$base" "/usr/local/vgpu/.$base.new"' in script
    assert 'chmod 0644 "/usr/local/vgpu/.$base.new"' in script  # containers run as any uid
    assert 'mv -f "/usr/local/vgpu/.$base.new" "/usr/local/vgpu/$base"' in script
    assert script.index("cp ") < script.index("chmod ") < script.index("mv -f")
    sc = init["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    # The hostPath the plugin checks is the one the installer fills.
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["hami-core"]["hostPath"] == {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}
    assert "HAMi-core: copied into /usr/local/vgpu" in r.notes


def test_hami_core_installer_only_on_hami_core_groups() -> None:
    r = _rendered("mig-group")
    by_mode = {
        ds["metadata"]["labels"]["kube-vgpu.io/node-group"]: _installer(ds) for ds in r.of_kind("DaemonSet")
    }
    assert by_mode["default"] is not None  # the hami-core group
    assert by_mode["mig"] is None  # MIG slices need no HAMi-core


def test_hami_core_installer_follows_the_hook_path_and_image_values() -> None:
    r = render(
        {
            "config": {"node": {"hookPath": "/opt/hami"}},
            "node": {"hamiCoreInstaller": {"image": {"repository": "registry.local/hami", "tag": "v9"}}},
        },
        kube_version="v1.31.0",
    )
    (ds,) = r.of_kind("DaemonSet")
    init = _installer(ds)
    assert init is not None and init["image"] == "registry.local/hami:v9"
    assert 'mv -f "/opt/hami/.$base.new" "/opt/hami/$base"' in init["command"][-1]
    assert init["volumeMounts"] == [{"name": "hami-core", "mountPath": "/opt/hami"}]


def test_hami_core_installer_can_be_turned_off() -> None:
    r = render({"node": {"hamiCoreInstaller": {"enabled": False}}}, kube_version="v1.31.0")
    (ds,) = r.of_kind("DaemonSet")
    assert _installer(ds) is None
    assert "initContainers" not in ds["spec"]["template"]["spec"]
    # The plugin still mounts the folder and checks it; the notes say what is then the admin's job.
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert {"name": "hami-core", "mountPath": "/usr/local/vgpu"} in container["volumeMounts"]
    assert "HAMi-core: NOT installed by the chart" in r.notes and "HAMiCoreMissing" in r.notes


def test_node_check_in_the_pod_sees_the_plugin_settings(rendered: Rendered, case: Case) -> None:
    # `kubectl exec <pod> -- kube-vgpu node check` gets no args: the variables carry them.
    node = case.merged()["node"]
    for group, ds in zip(node["groups"], rendered.of_kind("DaemonSet"), strict=True):
        (container,) = ds["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        args = container["args"]
        assert env["KUBE_VGPU_MODE"] == group["mode"] and f"--mode={group['mode']}" in args
        assert env["KUBE_VGPU_API"] == group.get("api", "deviceplugin")
        # Every flag the plugin gets, the check gets from its variable.
        for arg in args[1:]:
            flag, _, value = arg.partition("=")
            if flag != "--node-name":
                assert env["KUBE_VGPU_" + flag[2:].upper().replace("-", "_")] == value, arg


def test_node_groups_must_not_collide() -> None:
    with pytest.raises(helm_python.HelmError, match=r'group name "a" is used twice'):
        render(
            {"node": {"groups": [{"name": "a", "mode": "mig"}, {"name": "a", "mode": "hami-core"}]}},
            kube_version="v1.31.0",
        )
    with pytest.raises(helm_python.HelmError, match="select the same nodes"):
        render(
            {"node": {"groups": [{"name": "a", "mode": "mig"}, {"name": "b", "mode": "hami-core"}]}},
            kube_version="v1.31.0",
        )


def test_duplicate_resource_names_fail_the_render() -> None:
    with pytest.raises(helm_python.HelmError, match="the four names must differ"):
        render({"config": {"resourceNames": {"cores": "volcano.sh/vgpu-number"}}}, kube_version="v1.31.0")


# === certificates ===========================================================================


def test_certificate_jobs_run_the_cert_commands() -> None:
    r = _rendered("custom-names")
    create = r.one("Job", "gpu-share-certs-create")["spec"]["template"]["spec"]["containers"][0]["args"]
    patch = r.one("Job", "gpu-share-certs-patch")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert create == [
        "certs",
        "create",
        "--service=gpu-share-webhook",
        f"--namespace={NAMESPACE}",
        "--secret-name=gpu-share-tls",
        "--days=365",
    ]
    assert patch == [
        "certs",
        "patch",
        "--webhook-name=gpu-share",
        f"--namespace={NAMESPACE}",
        "--secret-name=gpu-share-tls",
    ]
    r.one("Service", "gpu-share-webhook")
    r.one("MutatingWebhookConfiguration", "gpu-share")


def test_cert_manager_replaces_the_jobs_with_a_ca_chain() -> None:
    r = _rendered("cert-manager")
    assert r.of_kind("Job") == []
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.of_kind("Issuer")}
    certs = {c["metadata"]["name"]: c["spec"] for c in r.of_kind("Certificate")}
    assert issuers[f"{RELEASE}-selfsigned"] == {"selfSigned": {}}
    ca = certs[f"{RELEASE}-ca"]
    assert ca["isCA"] is True and ca["issuerRef"]["name"] == f"{RELEASE}-selfsigned"
    assert issuers[f"{RELEASE}-ca"] == {"ca": {"secretName": ca["secretName"]}}
    serving_name = f"{RELEASE}-webhook"
    serving = certs[serving_name]
    assert serving["issuerRef"]["name"] == f"{RELEASE}-ca"
    assert serving["privateKey"]["algorithm"] == "ECDSA"
    assert serving["dnsNames"] == [
        serving_name,
        f"{serving_name}.{NAMESPACE}",
        f"{serving_name}.{NAMESPACE}.svc",
        f"{serving_name}.{NAMESPACE}.svc.cluster.local",
    ]
    volumes = {v["name"]: v for v in r.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == serving["secretName"]
    mwc = r.one("MutatingWebhookConfiguration")
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{serving_name}"
    for obj in r.of_kind("Issuer") + r.of_kind("Certificate"):
        assert obj["metadata"]["namespace"] == NAMESPACE
    assert "annotations" not in _rendered("defaults").one("MutatingWebhookConfiguration")["metadata"]


# === values schema ==========================================================================


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"webhook": {"failurePolicy": "Never"}}, "/webhook/failurePolicy"),
        ({"webhook": {"replicas": 0}}, "/webhook/replicas"),
        ({"webhook": {"timeoutSeconds": 0}}, "/webhook/timeoutSeconds"),
        ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds"),
        ({"webhook": {"matchConditions": "yes"}}, "/webhook/matchConditions"),
        ({"webhook": {"port": 443}}, "/webhook/port"),
        ({"node": {"groups": [{"name": "a", "mode": "mps"}]}}, "/node/groups/0/mode"),
        ({"node": {"groups": [{"name": "Bad_Name", "mode": "mig"}]}}, "/node/groups/0/name"),
        ({"node": {"groups": []}}, "/node/groups"),
        ({"config": {"webhook": {"defaultMode": "vgpu"}}}, "/config/webhook/defaultMode"),
        ({"config": {"webhook": {"schedulr": "volcano"}}}, "/config/webhook"),
        ({"config": {"node": {"deviceSplitCount": 2.5}}}, "/config/node/deviceSplitCount"),
        ({"config": {"node": {"hookPath": "usr/local/vgpu"}}}, "/config/node/hookPath"),
        ({"config": {"resourceNames": {"count": "vgpu-number"}}}, "/config/resourceNames/count"),
        ({"nonRootUser": {"uid": 0}}, "/nonRootUser/uid"),
        (
            {
                "volcanoDeviceConfig": {
                    "knownMigGeometries": [
                        {
                            "models": ["A30"],
                            "allowedGeometries": [
                                {
                                    "group": "group-1",
                                    "geometries": [{"name": "1g.6gb", "memory": 6144, "count": 4}],
                                }
                            ],
                        }
                    ]
                }
            },
            "/volcanoDeviceConfig/knownMigGeometries/0/allowedGeometries/0/group",
        ),
        ({"certManager": {"duration": "1 year"}}, "/certManager/duration"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(helm_python.HelmValuesError) as caught:
        validate_values(values)
    assert field in str(caught.value)
    with pytest.raises(helm_python.HelmValuesError):
        render(values, kube_version="v1.31.0")


def test_schema_accepts_every_case(case: Case) -> None:
    validate_values(dict(case.values))


# --- helpers ---------------------------------------------------------------------------------


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(section: Mapping[str, Any]) -> dict[str, Any]:
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in section.items()}


# === the chart speaks the program's command line ============================================


@pytest.mark.parametrize("case_id", ["custom-names", "mig-group"])
@pytest.mark.parametrize("command", ["webhook", "node", "certs"])
def test_container_args_parse_with_the_programs_own_parser(case_id: str, command: str) -> None:
    from kube_vgpu.cli.main import SUBCOMMANDS

    module_name, _ = SUBCOMMANDS[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        pytest.skip(f"{module_name} is not written yet")
    parser = argparse.ArgumentParser(prog="kube-vgpu", exit_on_error=False)
    sub = parser.add_subparsers(dest="command", required=True).add_parser(command)
    module.add_arguments(sub)
    r = _rendered(case_id)
    all_args = [
        template["spec"]["containers"][0]["args"]
        for _, template in r.pod_templates()
        if template["spec"]["containers"][0]["args"][0] == command
    ]
    assert all_args
    for args in all_args:
        try:
            parsed = parser.parse_args(args)
        except (argparse.ArgumentError, SystemExit) as exc:
            pytest.fail(f"kube-vgpu rejects the chart's arguments {args}: {exc}")
        assert parsed.command == command
