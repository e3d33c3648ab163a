"""A node group with `api: dra`, rendered by the real Helm engine: the DaemonSet's folders (only the
kubelet's plugin registry and the driver's folder, the CDI folders and HAMi-core's), its flags, the
DeviceClass `vgpu.kube-vgpu.io` with its optional extendedResourceName (Kubernetes 1.36+), each
validated against Kubernetes' own schemas, and the refusals."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.helm.test_node_security import ACCOUNT, NODE_CLAIM, Policy
from tests.support.helm_render import Obj, Rendered, render

DRA_GROUP = {
    "name": "dra",
    "mode": "hami-core",
    "api": "dra",
    "nodeSelector": {"kube-vgpu.io/node-group": "dra"},
}
VOLCANO_GROUP = {
    "name": "default",
    "mode": "hami-core",
    "nodeSelector": {"kube-vgpu.io/node-group": "volcano"},
}


def _render(version: str = "v1.36.0", groups: list[dict[str, Any]] | None = None, **node: Any) -> Rendered:
    return render({"node": {"groups": groups or [VOLCANO_GROUP, DRA_GROUP], **node}}, kube_version=version)


def _daemonset(r: Rendered, group: str) -> Obj:
    (ds,) = [d for d in r.of_kind("DaemonSet") if d["metadata"]["labels"]["kube-vgpu.io/node-group"] == group]
    return ds


def _host_mounts(ds: Obj) -> dict[str, tuple[str, bool]]:
    """host path -> (mount path, read-only) for every hostPath volume of the plugin container."""
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            out[volume["hostPath"]["path"]] = (mount["mountPath"], bool(mount.get("readOnly")))
    assert len(out) == len([v for v in volumes.values() if "hostPath" in v]), "a host path mounted nowhere"
    return out


def test_dra_group_mounts_the_kubelets_plugin_folders_and_cdi_only() -> None:
    ds = _daemonset(_render(), "dra")
    assert _host_mounts(ds) == {
        "/var/lib/kubelet/plugins_registry": ("/var/lib/kubelet/plugins_registry", False),
        "/var/lib/kubelet/plugins/vgpu.kube-vgpu.io": ("/var/lib/kubelet/plugins/vgpu.kube-vgpu.io", False),
        "/var/run/cdi": ("/var/run/cdi", False),
        "/etc/cdi": ("/etc/cdi", True),
        "/usr/local/vgpu": ("/usr/local/vgpu", False),
        "/tmp/vgpulock": ("/tmp/vgpulock", False),
    }
    # The Volcano group beside it keeps the device-plugin folder and nothing of DRA.
    volcano = _host_mounts(_daemonset(_render(), "default"))
    assert "/var/lib/kubelet/device-plugins" in volcano
    assert not {"/var/run/cdi", "/etc/cdi", "/var/lib/kubelet/plugins_registry"} & set(volcano)


def test_dra_group_flags_and_variables() -> None:
    ds = _daemonset(_render(), "dra")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["args"] == [
        "node",
        "--node-name=$(KUBE_VGPU_NODE_NAME)",
        "--mode=hami-core",
        "--api=dra",
        "--kubelet-root-dir=/var/lib/kubelet",
        "--cdi-dir=/var/run/cdi",
        "--gpu-cdi-dirs=/etc/cdi,/var/run/cdi",
        "--config=/etc/kube-vgpu/config/config.yaml",
    ]
    assert ds["metadata"]["labels"]["kube-vgpu.io/node-api"] == "dra"
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["allowPrivilegeEscalation"] is False
    # The HAMi-core installer runs on DRA groups too: prepare hands containers the same library.
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]] == ["install-hami-core"]


def test_custom_folders_follow_the_values() -> None:
    ds = _daemonset(
        _render(kubeletRootDir="/data/kubelet", cdiDir="/etc/cdi", gpuCdiDirs=["/etc/cdi"]), "dra"
    )
    mounts = _host_mounts(ds)
    assert mounts["/data/kubelet/plugins_registry"] == ("/data/kubelet/plugins_registry", False)
    assert mounts["/data/kubelet/plugins/vgpu.kube-vgpu.io"] == (
        "/data/kubelet/plugins/vgpu.kube-vgpu.io",
        False,
    )
    # The claim folder listed among the GPU spec folders is mounted once, writable.
    assert mounts["/etc/cdi"] == ("/etc/cdi", False)
    assert "/var/run/cdi" not in mounts


def test_device_class_only_with_a_dra_group_and_valid_on_1_34_to_1_36() -> None:
    assert _render(groups=[VOLCANO_GROUP]).of_kind("DeviceClass") == []
    for version in ("v1.34.0", "v1.35.0", "v1.36.0"):
        (device_class,) = _render(version).of_kind("DeviceClass")
        assert device_class["metadata"]["name"] == "vgpu.kube-vgpu.io"
        assert device_class["spec"] == {
            "selectors": [{"cel": {"expression": 'device.driver == "vgpu.kube-vgpu.io"'}}]
        }
        kubernetes_validate.validate(device_class, version.lstrip("v"), strict=True)


def test_extended_resource_name_on_1_36_and_refused_before() -> None:
    (device_class,) = _render(dra={"extendedResourceName": "kube-vgpu.io/gpu"}).of_kind("DeviceClass")
    assert device_class["spec"]["extendedResourceName"] == "kube-vgpu.io/gpu"
    kubernetes_validate.validate(device_class, "1.36.0", strict=True)
    with pytest.raises(
        helm_python.HelmError, match=r"node.dra.extendedResourceName needs Kubernetes >= 1.36.*v1.35.0"
    ):
        _render("v1.35.0", dra={"extendedResourceName": "kube-vgpu.io/gpu"})


def test_dra_with_mig_is_refused_naming_the_group() -> None:
    with pytest.raises(helm_python.HelmError, match=r'group "dra" asks for api dra with mode mig'):
        _render(groups=[{**DRA_GROUP, "mode": "mig"}])


@pytest.mark.parametrize(
    "node",
    [
        {"groups": [{**DRA_GROUP, "api": "dra,deviceplugin"}]},
        {"groups": [{**DRA_GROUP, "api": "both"}]},
        {"groups": [DRA_GROUP], "cdiDir": "relative/cdi"},
        {"groups": [DRA_GROUP], "gpuCdiDirs": []},
        {"groups": [DRA_GROUP], "gpuCdiDirs": ["/etc/cdi,/var/run/cdi"]},
        {"groups": [DRA_GROUP], "dra": {"extendedResourceName": "not a name"}},
    ],
)
def test_values_schema_refuses(node: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError, match="values don't meet the specifications of the schema"):
        render({"node": node}, kube_version="v1.36.0")


def test_one_api_per_node_two_groups_on_the_same_nodes_refused() -> None:
    same = {"kube-vgpu.io/node-group": "gpu"}
    with pytest.raises(helm_python.HelmError, match="select the same nodes"):
        _render(groups=[{**VOLCANO_GROUP, "nodeSelector": same}, {**DRA_GROUP, "nodeSelector": same}])


# --- the node-bound writes policy over ResourceSlices --------------------------------------------


def _slice_request(operation: str, name: str, node: str = "gpu-1") -> Obj:
    return {
        "operation": operation,
        "name": name,
        "namespace": "",
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "subResource": "",
        "userInfo": {"username": ACCOUNT, "extra": {NODE_CLAIM: [node]}},
    }


def _slice(node: str | None) -> Obj:
    spec: Obj = {
        "driver": "vgpu.kube-vgpu.io",
        "pool": {"name": node or "x", "generation": 1, "resourceSliceCount": 1},
    }
    if node is not None:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s"},
        "spec": spec,
    }


@pytest.fixture(scope="module")
def slice_policy() -> Policy:
    (policy,) = _render("v1.36.0").of_kind("ValidatingAdmissionPolicy")
    kubernetes_validate.validate(policy, "1.36.0", strict=True)
    return Policy(policy)


def test_the_policy_covers_every_slice_write_the_role_grants(slice_policy: Policy) -> None:
    for operation in ("CREATE", "UPDATE", "DELETE"):
        assert slice_policy.matches("resourceslices", operation)
    assert not slice_policy.matches("resourceclaims", "CREATE")


def test_own_nodes_slices_written_others_refused(slice_policy: Policy) -> None:
    assert slice_policy.admit(_slice_request("CREATE", "gpu-1-vgpu-0"), None, _slice("gpu-1")) == (True, "")
    assert slice_policy.admit(_slice_request("UPDATE", "gpu-1-vgpu-0"), _slice("gpu-1"), _slice("gpu-1"))[0]
    assert slice_policy.admit(_slice_request("DELETE", "gpu-1-vgpu-0"), _slice("gpu-1"), None)[0]
    refused = [
        ("CREATE", None, _slice("gpu-2")),
        ("CREATE", None, _slice(None)),  # allNodes: a pool every node would offer
        ("UPDATE", _slice("gpu-2"), _slice("gpu-2")),
        ("UPDATE", _slice("gpu-2"), _slice("gpu-1")),  # taking another node's slice over
        ("UPDATE", _slice("gpu-1"), _slice("gpu-2")),  # handing its own slice to another node
        ("DELETE", _slice("gpu-2"), None),
    ]
    for operation, old, new in refused:
        allowed, message = slice_policy.admit(_slice_request(operation, "s"), old, new)
        assert not allowed, (operation, old, new)
        assert message.endswith("its ResourceSlices, not resourceslices s"), message


def test_the_notes_say_what_a_dra_group_installed_and_how_to_ask_for_a_slice() -> None:
    notes = _render(dra={"extendedResourceName": "kube-vgpu.io/gpu"}).notes
    assert "Node groups: default (hami-core), dra (hami-core, DRA)" in notes
    assert "DRA node groups: dra: driver vgpu.kube-vgpu.io" in notes
    assert "The class serves kube-vgpu.io/gpu: a pod asking kube-vgpu.io/gpu: 1" in notes
    # The claim fragment and the pod side that uses it.
    assert 'capacity: {requests: {memory: 20Gi, cores: "30"}}' in notes
    assert "resourceClaims: [{name: gpu, resourceClaimTemplateName: <template name>}]" in notes
    assert "resources: {claims: [{name: gpu}]}" in notes
    assert "Volcano node groups: default." in notes and "deviceshare.VGPUEnable" in notes
    # Shared slices: 1.36, or 1.34/1.35 with the gate on (as docs/dra.md says); only older
    # clusters are told they get whole GPUs.
    assert "need Kubernetes 1.36, or 1.34 and 1.35 with the DRAConsumableCapacity" in notes
    assert "This cluster is" not in notes
    assert "This cluster is v1.34.0: whole GPUs unless that gate is on." in _render("v1.34.0").notes
    # Other GPU device plugins on the DRA nodes.
    assert "nvidia.com/gpu.deploy.device-plugin=false" in notes
    # With DRA, pods with claims and claim CREATEs reach the webhook too.
    assert (
        "only pods naming a vGPU resource, pods with spec.resourceClaims and ResourceClaim CREATEs "
        "naming vgpu.kube-vgpu.io reach the webhook"
    ) in notes
    only_dra = _render(groups=[DRA_GROUP]).notes
    assert "DRA node groups: dra:" in only_dra and "DeviceClass vgpu.kube-vgpu.io." in only_dra
    assert "The class serves" not in only_dra
    assert "deviceshare.VGPUEnable" not in only_dra  # no Volcano group: no Volcano to set up
    volcano_only = _render(groups=[VOLCANO_GROUP]).notes
    assert "DRA node groups" not in volcano_only and "deviceshare.VGPUEnable" in volcano_only
    assert "resourceClaims" not in volcano_only


def _check_commands(notes: str) -> list[str]:
    """The commands under the notes' closing "Check:" line."""
    tail = notes[notes.index("\nCheck:\n") :].splitlines()[2:]
    return [line.strip() for line in tail if line.startswith("  kubectl")]


def test_the_notes_check_commands_follow_the_groups() -> None:
    node_check = "kubectl -n gpu-system exec <node plugin pod> -- kube-vgpu node check"
    pods = "kubectl -n gpu-system get pods -l app.kubernetes.io/instance=kube-vgpu"
    volcano = (
        "kubectl get nodes -o custom-columns=NAME:.metadata.name,"
        "VGPU:.status.allocatable.volcano\\.sh/vgpu-number"
    )
    dra = [
        "kubectl get deviceclass vgpu.kube-vgpu.io",
        "kubectl get resourceslices --field-selector spec.driver=vgpu.kube-vgpu.io",
    ]
    both = _render().notes
    assert _check_commands(both) == [pods, node_check, volcano, *dra]
    # The node check hint is printed once, not once per section.
    assert both.count("kube-vgpu node check") == 1
    assert "(on DRA nodes also the DRA sockets, the published ResourceSlice and the CDI folder)" in both
    assert _check_commands(_render(groups=[DRA_GROUP]).notes) == [pods, node_check, *dra]
    volcano_only = _render(groups=[VOLCANO_GROUP]).notes
    assert _check_commands(volcano_only) == [pods, node_check, volcano]
    assert "on DRA nodes" not in volcano_only


def test_the_notes_keep_a_blank_line_after_the_open_port_warning() -> None:
    # Rendered offline the API server's addresses are unknown: the warning is printed, and the
    # section after it starts after a blank line instead of running on from its last line.
    notes = _render().notes
    assert "--set 'webhook.networkPolicy.controlPlaneCIDRs={<address>/32}'\n\nVolcano node groups" in notes


# --- DRA needs resource.k8s.io/v1: Kubernetes 1.34 ------------------------------------------------


@pytest.mark.parametrize("version", ["v1.30.0", "v1.33.9"])
def test_a_dra_group_below_1_34_is_refused_naming_the_group_and_the_version(version: str) -> None:
    with pytest.raises(
        helm_python.HelmError,
        match=rf"node.groups dra \(api: dra\) needs Kubernetes >= 1.34 .*this cluster is {version}",
    ):
        _render(version)
    with pytest.raises(
        helm_python.HelmError, match=rf"dra.enabled needs Kubernetes >= 1.34 .*this cluster is {version}"
    ):
        render({"dra": {"enabled": True}}, kube_version=version)


def test_dra_on_1_34_renders_and_without_dra_1_33_still_does() -> None:
    for r in (_render("v1.34.0"), render({"dra": {"enabled": True}}, kube_version="v1.34.0")):
        assert r.of_kind("ValidatingWebhookConfiguration")
    assert _render("v1.34.0").of_kind("DeviceClass")
    volcano = _render("v1.33.9", groups=[VOLCANO_GROUP])
    assert volcano.of_kind("DeviceClass") == [] and volcano.of_kind("DaemonSet")


# --- docs/install.md's DRA-only cluster ---------------------------------------------------------

INSTALL = Path(__file__).resolve().parents[2] / "docs" / "install.md"


def _dra_only_values() -> dict[str, Any]:
    """The values file docs/install.md's "A DRA-only cluster" section writes."""
    text = INSTALL.read_text(encoding="utf-8")
    section = text[text.index("## A DRA-only cluster") :]
    section = section[: section.index("\n## ", 1)]
    (block,) = re.findall(r"cat > kube-vgpu-values.yaml <<'EOF'\n(.*?)\nEOF\n", section, re.S)
    values: dict[str, Any] = yaml.safe_load(block)
    return values


@pytest.mark.parametrize("version", ["v1.34.0", "v1.36.0"])
def test_the_dra_only_values_of_the_install_guide_render_one_dra_group_and_no_volcano(version: str) -> None:
    values = _dra_only_values()
    assert values["node"]["groups"] == [
        {
            "name": "dra",
            "mode": "hami-core",
            "api": "dra",
            "nodeSelector": {"nvidia.com/gpu.present": "true", "kube-vgpu.io/node-group": "dra"},
        }
    ]
    r = render(values, kube_version=version)
    (ds,) = r.of_kind("DaemonSet")
    assert ds["metadata"]["labels"]["kube-vgpu.io/node-api"] == "dra"
    assert [d["metadata"]["name"] for d in r.of_kind("DeviceClass")] == ["vgpu.kube-vgpu.io"]
    assert r.of_kind("ConfigMap") and not [
        c for c in r.of_kind("ConfigMap") if c["metadata"]["name"] == "volcano-vgpu-device-config"
    ]
    assert "Volcano node groups" not in r.notes and "deviceshare" not in r.notes
    assert "kubectl get resourceslices --field-selector spec.driver=vgpu.kube-vgpu.io" in r.notes
    for obj in r.objects:
        kubernetes_validate.validate(obj, version.lstrip("v"), strict=True)
    with pytest.raises(helm_python.HelmError, match=r"needs Kubernetes >= 1\.34"):
        render(values, kube_version="v1.33.0")


def test_a_bare_dra_group_renders_alone_and_is_refused_beside_the_default_group() -> None:
    bare = {"name": "dra", "mode": "hami-core", "api": "dra"}
    (ds,) = render({"node": {"groups": [bare]}}, kube_version="v1.34.0").of_kind("DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    with pytest.raises(helm_python.HelmError, match="select the same nodes"):
        render({"node": {"groups": [{"name": "default", "mode": "hami-core"}, bare]}}, kube_version="v1.34.0")
