"""The pure mutating pipeline: each rule with a pod that triggers it
and one that must not; every patch applied with jsonpatch and admitted again to check idempotence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    NOUSE_GPUUUID_ALIAS,
    USE_GPUTYPE,
    USE_GPUUUID,
    USE_GPUUUID_ALIAS,
    UUID_LABEL_PREFIX,
    VGPU_MODE,
    VGPU_MODE_ALIAS,
    VGPU_NODE,
)
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import Verdict, parse_review
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.selectors import ORIGINAL_USE_GPUTYPE
from tests.support.admission_view import StaticView
from tests.support.records import as_node
from tests.support.webhook import (
    A10,
    A100,
    H100,
    NUMBER,
    apply,
    container,
    gpu_node,
    gpu_uuid,
    node_matches,
    pod,
    required_terms,
    review,
    volcano_type_allows,
)

MIXED = gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)])
H100_MIG = gpu_node("h100", "mig", [(H100, 81920), (H100, 81920)])
A100_ONLY = gpu_node("a100", "hami-core", [(A100, 40960)], hostname="a100-host")
NODES = (MIXED, H100_MIG, A100_ONLY)


def inventory(nodes: Sequence[Mapping[str, Any]] = NODES) -> Inventory:
    inv = Inventory()
    for node in nodes:
        inv.upsert(as_node(node))
    return inv


def admit(
    obj: Mapping[str, Any],
    *,
    nodes: Sequence[Mapping[str, Any]] = NODES,
    webhook: WebhookConfig | None = None,
    namespaces: Mapping[str, Mapping[str, str]] | None = None,
    operation: str = "CREATE",
    kind: str = "Pod",
) -> tuple[Verdict, dict[str, Any]]:
    """Admit `obj`; return the verdict and the patched pod, after checking re-admission is a no-op."""
    config = Config(webhook=webhook or WebhookConfig())
    admission = Admission(config, StaticView(inventory(nodes), namespaces))
    verdict = admission.review(parse_review_dict(review(obj, operation=operation, kind=kind)))
    patched = apply(obj, verdict.patch)
    if verdict.allowed:
        again = admission.review(parse_review_dict(review(patched, operation=operation, kind=kind)))
        assert again.allowed and list(again.patch) == [], f"not idempotent: {again.patch}"
    return verdict, patched


def parse_review_dict(doc: Mapping[str, Any]) -> Any:
    import json

    return parse_review(json.dumps(doc).encode())


def annots(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def landing_nodes(obj: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] = NODES) -> list[str]:
    terms = required_terms(obj)
    return sorted(n["metadata"]["name"] for n in nodes if node_matches(n, terms))


# --- pass-through -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "obj",
    [
        pod(container("cpu")),
        pod({"name": "c", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}),
        pod(annotations={USE_GPUTYPE: "A10", VGPU_MODE: "bogus"}),
    ],
)
def test_pod_without_vgpu_request_passes_untouched(obj: dict[str, Any]) -> None:
    verdict, _ = admit(obj)
    assert verdict.allowed and list(verdict.patch) == [] and not verdict.warnings


@pytest.mark.parametrize(
    ("operation", "kind"), [("UPDATE", "Pod"), ("CREATE", "ConfigMap"), ("DELETE", "Pod")]
)
def test_other_kinds_and_operations_pass_untouched(operation: str, kind: str) -> None:
    verdict, _ = admit(pod(container(memory=1000)), operation=operation, kind=kind)
    assert verdict.allowed and list(verdict.patch) == []


def test_opt_out_label_on_a_namespace_passes_untouched_but_not_on_a_pod() -> None:
    forged = {VGPU_NODE: "x"}
    opted = pod(container(memory=100), annotations=forged, labels={"kube-vgpu.io/webhook": "ignore"})
    # A pod's labels are its author's: the label exempts nothing.
    verdict, _ = admit(opted)
    assert not verdict.allowed and verdict.reason == "forged-annotation"
    in_ns = pod(container(memory=100), namespace="batch")
    verdict, _ = admit(in_ns, namespaces={"batch": {"kube-vgpu.io/webhook": "ignore"}})
    assert verdict == Verdict(allowed=True)
    # A different label value does not opt out.
    verdict, _ = admit(in_ns, namespaces={"batch": {"kube-vgpu.io/webhook": "yes"}})
    assert verdict.allowed and verdict.patch


# --- step 0: defaults ---------------------------------------------------------------------------


@pytest.mark.parametrize("amounts", [{"memory": 1000}, {"percent": 50}, {"cores": 30}])
def test_container_without_number_gets_one_in_limits_and_requests(amounts: dict[str, int]) -> None:
    _, patched = admit(pod(container(**amounts), container("side")))
    main, side = patched["spec"]["containers"]
    assert main["resources"]["limits"][NUMBER] == "1" and main["resources"]["requests"][NUMBER] == "1"
    assert "resources" not in side or NUMBER not in (side["resources"].get("limits") or {})


def test_container_with_a_number_keeps_it() -> None:
    _, patched = admit(pod(container(number=2, memory=1000)))
    resources = patched["spec"]["containers"][0]["resources"]
    assert resources["limits"][NUMBER] == "2" and "requests" not in resources


# --- step 1: scheduler --------------------------------------------------------------------------


@pytest.mark.parametrize("given", [None, "", "default-scheduler"])
def test_default_scheduler_becomes_volcano(given: str | None) -> None:
    spec: dict[str, Any] = {} if given is None else {"schedulerName": given}
    _, patched = admit(pod(container(memory=1000), **spec))
    assert patched["spec"]["schedulerName"] == "volcano"


def test_other_scheduler_is_left_or_denied_by_configuration() -> None:
    obj = pod(container(memory=1000), schedulerName="my-volcano")
    verdict, patched = admit(obj)
    assert verdict.allowed and patched["spec"]["schedulerName"] == "my-volcano"
    verdict, _ = admit(obj, webhook=WebhookConfig(other_schedulers="deny"))
    assert not verdict.allowed and verdict.reason == "other-scheduler" and "my-volcano" in verdict.message
    ours = pod(container(memory=1000), schedulerName="volcano")
    assert admit(ours, webhook=WebhookConfig(other_schedulers="deny"))[0].allowed


# --- step 2: mode -------------------------------------------------------------------------------


def test_unknown_mode_is_denied_naming_the_valid_values() -> None:
    for key in (VGPU_MODE, VGPU_MODE_ALIAS):
        verdict, _ = admit(pod(container(memory=1000), annotations={key: "mps"}))
        assert not verdict.allowed and verdict.reason == "invalid-annotation"
        assert key in verdict.message and "'mps'" in verdict.message
        assert "hami-core, mig" in verdict.message


def test_mode_resolves_to_the_only_mode_that_fits() -> None:
    # Only the H100s (mig) hold 60000 MiB.
    _, patched = admit(pod(container(memory=60000)))
    assert annots(patched)[VGPU_MODE] == "mig"
    assert landing_nodes(patched) == ["h100"]
    # Only hami-core nodes have an A10.
    _, patched = admit(pod(container(memory=1000), annotations={USE_GPUTYPE: "A10"}))
    assert annots(patched)[VGPU_MODE] == "hami-core"


def test_mode_offered_by_both_resolves_to_the_configured_default() -> None:
    _, patched = admit(pod(container(memory=1000)))
    assert annots(patched)[VGPU_MODE] == "hami-core"
    _, patched = admit(pod(container(memory=1000)), webhook=WebhookConfig(default_mode="mig"))
    assert annots(patched)[VGPU_MODE] == "mig"
    expression = {"key": MODE_LABEL, "operator": "In", "values": ["mig"]}
    assert all(expression in t["matchExpressions"] for t in required_terms(patched))


def test_explicit_mode_and_alias_are_kept_and_copied() -> None:
    _, patched = admit(pod(container(memory=1000), annotations={VGPU_MODE_ALIAS: "mig"}))
    assert annots(patched)[VGPU_MODE] == "mig" and landing_nodes(patched) == ["h100"]
    verdict, _ = admit(
        pod(container(memory=1000), annotations={VGPU_MODE_ALIAS: "mig", VGPU_MODE: "hami-core"})
    )
    assert not verdict.allowed and "disagrees" in verdict.message


# --- step 3: type selectors ---------------------------------------------------------------------


def _types_volcano_allows(obj: Mapping[str, Any], node: Mapping[str, Any]) -> set[str]:
    from kube_vgpu.contract.register import decode_register

    records = decode_register(node["metadata"]["annotations"]["volcano.sh/node-vgpu-register"])
    return {r.type for r in records if volcano_type_allows(annots(obj), r.type)}


@pytest.mark.parametrize("reference_form", [False, True])
def test_a10_never_lands_on_the_a100_and_a100_never_on_the_a10(reference_form: bool) -> None:
    mixed = gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)], reference_form=reference_form)
    for token, wanted in (("A10", A10), ("a100", A100)):
        verdict, patched = admit(pod(container(memory=1000), annotations={USE_GPUTYPE: token}), nodes=[mixed])
        assert verdict.allowed and not verdict.warnings
        # Volcano's substring rule, applied to the patched annotation, picks exactly the wanted GPU.
        assert [t for t in _types_volcano_allows(patched, mixed)] == [
            f"NVIDIA-{wanted}" if reference_form else f"NVIDIA-[{wanted}]"
        ]
        assert annots(patched)[ORIGINAL_USE_GPUTYPE] == token
        assert (USE_GPUTYPE in annots(patched)) != (NOUSE_GPUTYPE in annots(patched))
        model_terms = [e["key"] for t in required_terms(patched) for e in t["matchExpressions"]]
        assert MODEL_LABEL_PREFIX + wanted.replace(" ", "-") in model_terms


def test_reference_form_types_that_cannot_be_told_apart_warn() -> None:
    # "NVIDIA-NVIDIA A1" is inside "NVIDIA-NVIDIA A10", which is inside "...A100...": no exact items.
    node = gpu_node("ref", "hami-core", [(A10, 1), (A100, 1), ("NVIDIA A1", 1)], reference_form=True)
    verdict, patched = admit(pod(container(memory=1), annotations={USE_GPUTYPE: "A10"}), nodes=[node])
    assert verdict.allowed and "reference plugin's form" in verdict.warnings[0]
    assert annots(patched)[USE_GPUTYPE] == f"NVIDIA-{A10}"


def test_type_selector_ors_every_matching_model_and_nouse_excludes() -> None:
    obj = pod(container(memory=1000), annotations={USE_GPUTYPE: "A100,H100"})
    _, patched = admit(obj)
    keys = sorted(
        e["key"] for t in required_terms(patched) for e in t["matchExpressions"] if "gpu-model" in e["key"]
    )
    assert keys == [
        MODEL_LABEL_PREFIX + "NVIDIA-A100-PCIE-40GB",
        MODEL_LABEL_PREFIX + "NVIDIA-H100-80GB-HBM3",
    ]
    assert len(required_terms(patched)) == 2  # one term per alternative model

    _, patched = admit(pod(container(memory=1000), annotations={NOUSE_GPUTYPE: "A100"}))
    assert NOUSE_GPUTYPE not in annots(patched)
    assert annots(patched)["kube-vgpu.io/nouse-gputype"] == "A100"
    assert _types_volcano_allows(patched, MIXED) == {f"NVIDIA-[{A10}]"}
    assert landing_nodes(patched) == ["mixed"]  # hami-core is the default; h100 is mig


def test_selector_matching_nothing_warns_or_is_denied_when_strict() -> None:
    obj = pod(container(memory=1000), annotations={USE_GPUTYPE: "V100"})
    verdict, patched = admit(obj)
    assert verdict.allowed and len(verdict.warnings) == 1 and "V100" in verdict.warnings[0]
    # Never left to Volcano's substring match: a term for the asked model keeps it pending.
    assert "V100" not in annots(patched)[USE_GPUTYPE].split(",")
    assert landing_nodes(patched) == []
    assert MODEL_LABEL_PREFIX + "NVIDIA-V100" in str(required_terms(patched))
    verdict, _ = admit(obj, webhook=WebhookConfig(strict_selectors=True))
    assert not verdict.allowed and verdict.reason == "no-matching-gpu" and "V100" in verdict.message
    # Matching selectors never warn, strict or not.
    ok = pod(container(memory=1000), annotations={USE_GPUTYPE: "A10"})
    verdict, _ = admit(ok, webhook=WebhookConfig(strict_selectors=True))
    assert verdict.allowed and not verdict.warnings


# --- step 3: UUID selectors ---------------------------------------------------------------------


def test_use_gpuuuid_becomes_uuid_terms_and_alias_is_copied() -> None:
    first, second = gpu_uuid("h100", 0), gpu_uuid("a100", 0)
    _, patched = admit(pod(container(memory=1000), annotations={USE_GPUUUID_ALIAS: f"{first}, {second}"}))
    assert annots(patched)[USE_GPUUUID] == f"{first}, {second}"
    keys = {e["key"] for t in required_terms(patched) for e in t["matchExpressions"]}
    assert {UUID_LABEL_PREFIX + first, UUID_LABEL_PREFIX + second} <= keys
    # Both modes are offered by the chosen GPUs: the default mode wins, so only the A100 node fits.
    assert landing_nodes(patched) == ["a100"]


def test_nouse_gpuuuid_excludes_only_nodes_whose_every_gpu_is_excluded() -> None:
    excluded = f"{gpu_uuid('a100', 0)},{gpu_uuid('mixed', 0)}"
    _, patched = admit(pod(container(memory=1000), annotations={NOUSE_GPUUUID_ALIAS: excluded}))
    assert annots(patched)[NOUSE_GPUUUID] == excluded
    hostname_terms = [
        e for t in required_terms(patched) for e in t["matchExpressions"] if e["key"] == HOSTNAME_LABEL
    ]
    assert hostname_terms and all(
        e == {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": ["a100-host"]} for e in hostname_terms
    )
    assert landing_nodes(patched) == ["mixed"]
    # Nothing excluded entirely: no hostname requirement.
    _, patched = admit(pod(container(memory=1000), annotations={NOUSE_GPUUUID: gpu_uuid("mixed", 1)}))
    assert HOSTNAME_LABEL not in str(required_terms(patched))


def test_empty_uuid_item_is_denied_naming_key_and_value() -> None:
    verdict, _ = admit(pod(container(memory=1000), annotations={USE_GPUUUID: "GPU-a,,GPU-b"}))
    assert not verdict.allowed and USE_GPUUUID in verdict.message and "'GPU-a,,GPU-b'" in verdict.message


# --- affinity merging ---------------------------------------------------------------------------


def test_user_terms_and_match_fields_survive_as_a_cross_product() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["mixed", "h100"]}]},
    ]
    preferred = [{"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}]
    obj = pod(
        container(memory=1000),
        annotations={USE_GPUTYPE: "A100,H100", VGPU_MODE: "hami-core"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms},
                "preferredDuringSchedulingIgnoredDuringExecution": preferred,
            }
        },
    )
    _, patched = admit(obj)
    terms = required_terms(patched)
    assert len(terms) == 4  # 2 user terms x 2 models
    for term in terms:
        assert term.get("matchFields") in (None, user_terms[1]["matchFields"])
        assert {"key": MODE_LABEL, "operator": "In", "values": ["hami-core"]} in term["matchExpressions"]
    zone_terms = [t for t in terms if "matchFields" not in t]
    assert all(t["matchExpressions"][0] == user_terms[0]["matchExpressions"][0] for t in zone_terms)
    assert (
        patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        == preferred
    )
    # matchFields restrict to mixed/h100; hami-core + A100 -> only mixed.
    assert landing_nodes(patched) == ["mixed"]


# --- step 5: safety -----------------------------------------------------------------------------


def test_forged_scheduler_annotations_are_denied() -> None:
    verdict, _ = admit(pod(container(memory=1000), annotations={VGPU_NODE: "mixed"}))
    assert not verdict.allowed and verdict.reason == "forged-annotation" and VGPU_NODE in verdict.message
    assert admit(pod(container(memory=1000), annotations={"volcano.sh/other": "x"}))[0].allowed


def test_vgpu_pod_placed_by_hand_is_denied_and_plain_pod_is_not() -> None:
    placed = pod(container(memory=1000))
    placed["spec"]["nodeName"] = "mixed"
    verdict, _ = admit(placed)
    assert not verdict.allowed and verdict.reason == "bypasses-scheduler" and "mixed" in verdict.message
    plain = pod({"name": "web"})
    plain["spec"]["nodeName"] = "mixed"
    assert admit(plain)[0].allowed


def test_privileged_vgpu_container_is_denied_unless_configured() -> None:
    privileged = container(memory=1000) | {"securityContext": {"privileged": True}}
    verdict, _ = admit(pod(privileged))
    assert not verdict.allowed and verdict.reason == "privileged" and "'main'" in verdict.message
    assert admit(pod(privileged), webhook=WebhookConfig(deny_privileged=False))[0].allowed
    # A privileged sidecar in a vGPU pod sees every GPU of the node: refused too.
    sidecar = {"name": "side", "securityContext": {"privileged": True}}
    verdict, _ = admit(pod(container(memory=1000), sidecar))
    assert not verdict.allowed and verdict.reason == "privileged" and "'side'" in verdict.message
    # A pod that asks no vGPU is not this rule's business.
    assert admit(pod(sidecar))[0].allowed


@pytest.mark.parametrize("capability", ["SYS_ADMIN", "CAP_SYS_ADMIN", "sys_admin", "ALL"])
def test_capabilities_that_undo_the_preload_mount_are_denied_in_any_container(capability: str) -> None:
    sidecar = {"name": "side", "securityContext": {"capabilities": {"add": ["NET_RAW", capability]}}}
    verdict, _ = admit(pod(container(memory=1000), sidecar))
    assert not verdict.allowed and verdict.reason == "privileged" and capability in verdict.message
    harmless = {"name": "side", "securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}}}
    assert admit(pod(container(memory=1000), harmless))[0].allowed


# --- malformed values ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("amounts", "expected"),
    [
        ({"memory": "3Gi"}, "write 3072, not 3Gi"),
        ({"memory": "4294967296"}, "larger than 2147483647"),
        ({"percent": "150"}, "1 to 100"),
        ({"memory": "10", "percent": "10"}, "not both"),
    ],
)
def test_malformed_values_are_denied_naming_container_key_and_value(
    amounts: dict[str, str], expected: str
) -> None:
    verdict, _ = admit(pod(container("trainer", **amounts)))
    assert not verdict.allowed and verdict.reason == "malformed-value"
    assert (
        "'trainer'" in verdict.message
        and expected in verdict.message
        and "volcano.sh/vgpu-" in verdict.message
    )
