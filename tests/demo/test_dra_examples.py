"""The example ResourceClaimTemplates in examples/dra/ (shown in docs/dra.md): every object validates
against Kubernetes 1.36's schema, and each claim, made from its template as the resource claim
controller makes it, allocates on the scheduler stand-in from a pool kube-vgpu's own builder makes:
the slice (20 GiB at 30% on an A100 or H100, on neither elsewhere), the whole GPU, the two slices on
distinct GPUs; and on Kubernetes 1.35's defaults (no consumable capacity) the slice gets a whole GPU."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kube_vgpu.demo.dra import device_class
from kube_vgpu.node.dra.attributes import GpuFacts
from kube_vgpu.node.dra.slices import PoolSpec, SliceOptions, build_devices, build_slices
from kube_vgpu.standins.apiserver.dra import FeatureGates
from kube_vgpu.standins.apiserver.errors import StatusError
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.dra.scheduler import DraScheduler, Unschedulable

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "dra"
NODE = "gpu-node-1"
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
V100 = "Tesla V100-SXM2-32GB"
SHARED = SliceOptions()


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def template(name: str) -> dict[str, Any]:
    (found,) = [d for d in documents(name) if d["kind"] == "ResourceClaimTemplate"]
    return found


def gpus(model: str, memory_mib: int, count: int = 2, first: int = 0) -> list[GpuFacts]:
    return [
        GpuFacts(i, i, f"GPU-{i:08d}-0000-0000-0000-000000000000", model, memory_mib)
        for i in range(first, first + count)
    ]


def cluster(api: ApiServerStandin, facts: list[GpuFacts], options: SliceOptions = SHARED) -> DraScheduler:
    api.put(device_class())
    for s in build_slices(PoolSpec(NODE, "uid", 1, build_devices(facts, {}, options))):
        api.put(s)
    return DraScheduler(api)


def claim_from(api: ApiServerStandin, name: str) -> str:
    """The claim the resource claim controller makes from the example's template."""
    body = template(name)
    claim_name = f"pod-{body['metadata']['name']}"
    api.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim_name, "namespace": "default"},
            "spec": body["spec"]["spec"],
        }
    )
    return claim_name


def results(stored: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = stored["status"]["allocation"]["devices"]["results"]
    return found


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_object_validates_against_kubernetes_1_36(name: str) -> None:
    docs = documents(name)
    assert {d["kind"] for d in docs} == {"ResourceClaimTemplate", "Pod"}
    for doc in docs:
        kubernetes_validate.validate(doc, "1.36.0", strict=True)


@pytest.mark.parametrize("model", [A100, H100])
def test_the_slice_takes_20gib_at_30_percent_of_an_a100_or_h100(
    apiserver: ApiServerStandin, model: str
) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(model, 81920))
    (result,) = results(scheduler.allocate("default", claim_from(apiserver, "slice-20gi-30pct.yaml"), NODE))
    assert result["consumedCapacity"] == {"memory": "20Gi", "cores": "30"}
    assert result["shareID"]


def test_the_slice_selects_no_other_model(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(V100, 32768) + gpus("NVIDIA A10", 24576, first=2))
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", claim_from(apiserver, "slice-20gi-30pct.yaml"), NODE)


def test_four_slices_share_one_80gib_card_and_a_fifth_takes_the_other(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(A100, 81920))
    body = template("slice-20gi-30pct.yaml")
    devices = []
    for k in range(4):
        apiserver.put(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"c{k}", "namespace": "default"},
                "spec": body["spec"]["spec"],
            }
        )
        devices += [r["device"] for r in results(scheduler.allocate("default", f"c{k}", NODE))]
    # 30% cores each: three fit a card's 100, the fourth goes to the other card.
    assert sorted(devices) == ["gpu-0", "gpu-0", "gpu-0", "gpu-1"]


def test_the_whole_gpu_takes_all_its_memory_and_cores(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(H100, 81559, count=1))
    (result,) = results(scheduler.allocate("default", claim_from(apiserver, "whole-gpu.yaml"), NODE))
    assert result["device"] == "gpu-0"
    assert result["consumedCapacity"] == {"memory": "81559Mi", "cores": "100"}
    # Nothing else fits beside it.
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", claim_from(apiserver, "slice-20gi-30pct.yaml"), NODE)


def test_the_two_slices_land_on_distinct_gpus(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(A100, 81920))
    found = results(
        scheduler.allocate("default", claim_from(apiserver, "two-slices-distinct-gpus.yaml"), NODE)
    )
    assert sorted((r["request"], r["device"]) for r in found) == [("gpus", "gpu-0"), ("gpus", "gpu-1")]
    assert all(r["consumedCapacity"] == {"memory": "10Gi", "cores": "50"} for r in found)


def test_the_two_slices_never_share_a_single_gpu(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(A100, 81920, count=1))
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", claim_from(apiserver, "two-slices-distinct-gpus.yaml"), NODE)


def test_on_1_35_defaults_the_slice_gets_a_whole_gpu(apiserver: ApiServerStandin) -> None:
    apiserver.feature_gates = FeatureGates.of_release(35)
    scheduler = cluster(apiserver, gpus(A100, 81920), SliceOptions(consumable_capacity=False))
    (result,) = results(scheduler.allocate("default", claim_from(apiserver, "slice-20gi-30pct.yaml"), NODE))
    assert "consumedCapacity" not in result and "shareID" not in result
    # The card is the claim's alone: a second slice goes to the other card, a third finds none.
    second = results(
        scheduler.allocate("default", claim_from_named(apiserver, "slice-20gi-30pct.yaml", "b"), NODE)
    )
    assert {result["device"], second[0]["device"]} == {"gpu-0", "gpu-1"}
    with pytest.raises(Unschedulable):
        scheduler.allocate("default", claim_from_named(apiserver, "slice-20gi-30pct.yaml", "c"), NODE)


def test_on_1_35_defaults_the_two_slices_example_is_refused(apiserver: ApiServerStandin) -> None:
    """Kubernetes 1.34 and 1.35 drop distinctAttribute with DRAConsumableCapacity off, and then
    refuse the constraint left with no attribute: the example needs 1.36 or the gate."""
    apiserver.feature_gates = FeatureGates.of_release(35)
    with pytest.raises(StatusError, match=r"spec\.devices\.constraints\[0\]\.matchAttribute: Required value"):
        claim_from(apiserver, "two-slices-distinct-gpus.yaml")
    body = template("two-slices-distinct-gpus.yaml")
    with pytest.raises(StatusError, match=r"spec\.spec\.devices\.constraints\[0\]\.matchAttribute"):
        apiserver.put({**body, "metadata": {**body["metadata"], "namespace": "default"}})
    # The other two examples are accepted on 1.35's defaults.
    claim_from(apiserver, "slice-20gi-30pct.yaml")
    claim_from(apiserver, "whole-gpu.yaml")


def claim_from_named(api: ApiServerStandin, name: str, claim_name: str) -> str:
    api.put(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim_name, "namespace": "default"},
            "spec": template(name)["spec"]["spec"],
        }
    )
    return claim_name


def test_docs_show_the_examples_as_they_are() -> None:
    page = (ROOT / "docs" / "dra.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    shown = [
        d
        for block in blocks
        for d in yaml.safe_load_all(block)
        if d and d.get("kind") == "ResourceClaimTemplate"
    ]
    assert shown, "docs/dra.md shows no ResourceClaimTemplate"
    examples = {p.name: template(p.name) for p in EXAMPLES.glob("*.yaml")}
    for doc in shown:
        assert doc in examples.values(), (
            f"{doc['metadata']['name']} in docs/dra.md differs from examples/dra/"
        )
    assert {d["metadata"]["name"] for d in shown} == {t["metadata"]["name"] for t in examples.values()}


def admin_docs() -> list[dict[str, Any]]:
    """The namespace and claim docs/dra.md shows for admin access."""
    page = (ROOT / "docs" / "dra.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.DOTALL)
    (found,) = [b for b in blocks if "adminAccess: true" in b]
    return [d for d in yaml.safe_load_all(found) if d]


def test_the_documented_admin_claim_validates_and_reaches_every_busy_gpu(apiserver: ApiServerStandin) -> None:
    """The admin claim of docs/dra.md: valid for 1.36; in its labelled namespace it gets both GPUs of
    a node beside two 20 GiB slices; the same claim in an unlabelled namespace is refused."""
    namespace, admin = admin_docs()
    for doc in (namespace, admin):
        kubernetes_validate.validate(doc, "1.36.0", strict=True)
    apiserver.feature_gates = FeatureGates.of_release(36)
    scheduler = cluster(apiserver, gpus(A100, 81920))
    for i in range(2):
        apiserver.put(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": f"slice-{i}", "namespace": "default"},
                "spec": template("slice-20gi-30pct.yaml")["spec"]["spec"],
            }
        )
        assert scheduler.allocate("default", f"slice-{i}", NODE)["status"]["allocation"]
    apiserver.put(namespace)
    apiserver.put(admin)
    stored = scheduler.allocate("gpu-ops", admin["metadata"]["name"], NODE)
    results = stored["status"]["allocation"]["devices"]["results"]
    assert [(r["device"], r["adminAccess"]) for r in results] == [("gpu-0", True), ("gpu-1", True)]
    with pytest.raises(StatusError, match="admin-access: true` label on the containing namespace"):
        apiserver.put({**admin, "metadata": {**admin["metadata"], "namespace": "default"}})
