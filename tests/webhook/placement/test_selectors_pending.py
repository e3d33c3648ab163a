"""Selectors that match no GPU today keep the pod pending (issue 10 item 4).

The pod gets a required term naming the asked model or UUID, so no node takes it now, Volcano's
substring rule never sees a raw token (Volcano's `nvidia/vgpu/type.go` matches substrings: `A10` picks an
A100), and the same
pod is placed, on exactly the asked GPU, once such a GPU joins. Checked on the pure decision, over
the real HTTPS webhook, and through the Volcano stand-in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.config import Config, ResourceNames, WebhookConfig
from kube_vgpu.contract.models import register_type
from kube_vgpu.contract.names import (
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    USE_GPUTYPE,
    USE_GPUUUID,
    UUID_LABEL_PREFIX,
)
from kube_vgpu.kubeapi.client import Kube
from kube_vgpu.standins.apiserver.selectors import LabelSelector, SelectorParseError
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.standins.volcano.scheduler import VolcanoBinding, VolcanoStandin, place
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import Verdict, decode_patch, parse_review
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.records import NodeRecord
from tests.support.admission_view import StaticView
from tests.support.records import as_node
from tests.support.webhook import (
    A10,
    A100,
    H100,
    ThreadedWebhook,
    apply,
    container,
    gpu_node,
    gpu_uuid,
    node_matches,
    pod,
    post,
    required_terms,
    review,
    volcano_type_allows,
    write_tls,
)

A100_SXM = "NVIDIA A100-SXM4-80GB"
READY = {"volcano.sh/vgpu-number": "10", "volcano.sh/vgpu-memory": "81920", "volcano.sh/vgpu-cores": "100"}


def ready(node: NodeRecord) -> NodeRecord:
    """The node as the kubelet reports it once the plugin runs: Volcano's readiness resources set."""
    return as_node({**node, "status": {"capacity": READY, "allocatable": READY}})


A100_NODE = ready(gpu_node("a100", "hami-core", [(A100, 40960)]))
H100_NODE = ready(gpu_node("h100", "mig", [(H100, 81920)]))
CLUSTER = (A100_NODE, H100_NODE)
# Joins later: an A10 beside an A100 on one node, where a substring rule would pick the A100.
MIXED_NODE = ready(gpu_node("mixed", "hami-core", [(A100, 40960), (A10, 24576)]))
SXM_NODE = ready(gpu_node("sxm", "hami-core", [(A100_SXM, 81920)]))


def admit(
    obj: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]] = CLUSTER, **webhook: Any
) -> tuple[Verdict, dict[str, Any]]:
    """Admit `obj` against `nodes`; return the verdict and patched pod, after checking idempotence."""
    inv = Inventory()
    for node in nodes:
        inv.upsert(as_node(node))
    admission = Admission(Config(webhook=WebhookConfig(**webhook)), StaticView(inv))
    verdict = admission.review(parse_review(json.dumps(review(obj)).encode()))
    patched = apply(obj, verdict.patch)
    if verdict.allowed:
        again = admission.review(parse_review(json.dumps(review(patched)).encode()))
        assert again.allowed and list(again.patch) == [], f"not idempotent: {again.patch}"
    return verdict, patched


def volcano(obj: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]) -> VolcanoBinding | str:
    """The Volcano stand-in's placement of `obj` on `nodes` (a string: why it fits none)."""
    return place(obj, nodes, [], ResourceNames())


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def label_keys(obj: Mapping[str, Any]) -> list[str]:
    return [e["key"] for t in required_terms(obj) for e in t.get("matchExpressions") or []]


def assert_valid_label_keys(obj: Mapping[str, Any]) -> None:
    """Every key is one the apiserver accepts (its selector grammar checks keys as validation does)."""
    for key in label_keys(obj):
        try:
            LabelSelector.parse(key)
        except SelectorParseError as exc:
            raise AssertionError(f"the apiserver would reject the pod: {exc}") from None


def gpu_pod(**annotations: str) -> dict[str, Any]:
    # 1024, not 1000: the quantity stays "1024" in canonical form, which every reader parses.
    return pod(container(memory=1024), annotations=annotations)


# --- model tokens --------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["A10", "NVIDIA-A10", "NVIDIA A10"])
def test_a_model_not_in_the_cluster_waits_and_never_takes_an_a100(token: str) -> None:
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: token}))
    assert verdict.allowed and len(verdict.warnings) == 1
    assert token in verdict.warnings[0] and "pending" in verdict.warnings[0]
    # No node takes it now: not by affinity, and Volcano's own type rule finds no GPU either.
    assert not any(node_matches(n, required_terms(patched)) for n in CLUSTER)
    assert token not in annotations_of(patched)[USE_GPUTYPE].split(",")
    assert isinstance(volcano(patched, CLUSTER), str)
    without_affinity = {**patched, "spec": {**patched["spec"], "affinity": {}}}
    assert isinstance(volcano(without_affinity, CLUSTER), str), "Volcano's substring rule took the A100"
    # The same pod, unchanged, is placed on the A10 once it joins, beside an A100 it never takes.
    assert node_matches(MIXED_NODE, required_terms(patched))
    placed = volcano(patched, [*CLUSTER, MIXED_NODE])
    assert isinstance(placed, VolcanoBinding) and placed.node == "mixed"
    assert placed.devices.startswith(gpu_uuid("mixed", 1) + ",")  # the A10, not the A100 (index 0)


def test_a_full_model_name_with_dashes_finds_its_nvml_spelling_when_it_joins() -> None:
    _, patched = admit(gpu_pod(**{USE_GPUTYPE: "A100-SXM4-80GB"}))
    assert not any(node_matches(n, required_terms(patched)) for n in CLUSTER)
    assert MODEL_LABEL_PREFIX + "NVIDIA-A100-SXM4-80GB" in label_keys(patched)
    placed = volcano(patched, [*CLUSTER, SXM_NODE])
    assert isinstance(placed, VolcanoBinding) and placed.node == "sxm"


def test_strict_selectors_deny_what_matches_nothing() -> None:
    for selector in ({USE_GPUTYPE: "A10"}, {USE_GPUUUID: "GPU-not-in-the-cluster"}):
        verdict, _ = admit(gpu_pod(**selector), strict_selectors=True)
        assert not verdict.allowed and verdict.reason == "no-matching-gpu"
        assert next(iter(selector.values())) in verdict.message


@pytest.mark.parametrize(
    "token",
    ["A100/80GB", "x" * 64, "-A10", "A10.", "Ä100", "a\tb", "NVIDIA A100 (80GB)", "[A10]", "'A10'"],
)
def test_a_token_no_label_can_hold_gets_a_valid_term_no_node_satisfies(token: str) -> None:
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: token}))
    assert verdict.allowed and "never be scheduled" in verdict.warnings[0]
    assert_valid_label_keys(patched)
    # Volcano's rule gets an item no TYPE contains, not the token.
    assert annotations_of(patched)[USE_GPUTYPE] == "[]"
    assert not any(volcano_type_allows(annotations_of(patched), register_type(m)) for m in (A10, A100, H100))
    # Not even a node carrying every label the terms name (with the pod's mode) satisfies them.
    keys = set(label_keys(patched))
    adversary = ready(gpu_node("adversary", "hami-core", [(A10, 24576)]))
    adversary["metadata"]["labels"] |= {k: "true" for k in keys} | {MODE_LABEL: "hami-core"}
    assert not any(node_matches(n, required_terms(patched)) for n in [*CLUSTER, MIXED_NODE, adversary])


def test_an_unmatchable_token_beside_a_valid_one_leaves_the_valid_one_to_wait_for() -> None:
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: "A100/80GB,A10"}))
    assert verdict.allowed and "so those never match" in verdict.warnings[0]
    assert "never be scheduled" not in verdict.warnings[0]
    placed = volcano(patched, [*CLUSTER, MIXED_NODE])
    assert isinstance(placed, VolcanoBinding) and placed.devices.startswith(gpu_uuid("mixed", 1) + ",")


def test_a_huge_unmatchable_token_is_not_copied_into_the_volcano_annotation() -> None:
    token = "A100/" + "x" * 100_000
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: token}))
    assert verdict.allowed
    written = annotations_of(patched)
    assert written[USE_GPUTYPE] == "[]" and written["kube-vgpu.io/use-gputype"] == token
    assert sum(len(v) for v in written.values()) < len(token) + 4096
    # Messages quote the token, they do not echo it whole.
    assert "A100/xxx" in verdict.warnings[0] and len(verdict.warnings[0]) < 1024
    verdict, _ = admit(gpu_pod(**{USE_GPUTYPE: token}), strict_selectors=True)
    assert not verdict.allowed and "A100/xxx" in verdict.message and len(verdict.message) < 1024


@pytest.mark.parametrize("dashes", range(8))
def test_the_longest_tokens_at_the_list_limit_keep_annotations_under_the_apiservers_limit(
    dashes: int,
) -> None:
    # Tokens of 56 characters (63 with NVIDIA-), none in the cluster: each waits for 2 labels, so
    # the term limit lets half its number through.
    def token(i: int) -> str:
        body = "-".join(["x"] * dashes) + "-" if dashes else ""
        return (body + f"m{i:03d}").ljust(56, "y")

    tokens = [token(i) for i in range(WebhookConfig().max_affinity_terms // 2)]
    assert all(len(t) == 56 for t in tokens) and len(set(tokens)) == len(tokens)
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: ",".join(tokens)}))
    assert verdict.allowed
    total = sum(len(k) + len(v) for k, v in annotations_of(patched).items())
    assert total < 256 * 1024, total  # the apiserver refuses a pod whose annotations pass 256 KiB


@settings(max_examples=150, deadline=None)
@given(st.text(min_size=1, max_size=80).filter(lambda t: "," not in t and t.strip()))
def test_any_token_yields_a_pod_the_apiserver_accepts(token: str) -> None:
    verdict, patched = admit(gpu_pod(**{USE_GPUTYPE: token}))
    assert verdict.allowed
    assert_valid_label_keys(patched)
    # Volcano never reads the raw token (unless it already is an exact bracketed item).
    assert token not in annotations_of(patched)[USE_GPUTYPE].split(",") or token.startswith("[")


def test_nouse_refusing_every_known_model_waits_for_another_model() -> None:
    verdict, patched = admit(gpu_pod(**{NOUSE_GPUTYPE: "A100,H100"}))
    assert verdict.allowed and verdict.warnings
    assert not any(node_matches(n, required_terms(patched)) for n in CLUSTER)
    l4 = ready(gpu_node("l4", "hami-core", [("NVIDIA L4", 23034)]))
    assert node_matches(l4, required_terms(patched))
    placed = volcano(patched, [*CLUSTER, MIXED_NODE, l4])
    assert isinstance(placed, VolcanoBinding) and placed.node == "l4"


# --- UUIDs ---------------------------------------------------------------------------------------


def test_one_unknown_uuid_waits_for_that_gpu() -> None:
    joining = ready(gpu_node("later", "hami-core", [(A10, 24576)]))
    uuid = gpu_uuid("later", 0)
    verdict, patched = admit(gpu_pod(**{USE_GPUUUID: uuid}))
    assert (
        verdict.allowed
        and uuid in verdict.warnings[0]
        and "pending until such a GPU joins" in verdict.warnings[0]
    )
    assert label_keys(patched).count(UUID_LABEL_PREFIX + uuid) == 1
    assert isinstance(volcano(patched, CLUSTER), str)
    placed = volcano(patched, [*CLUSTER, joining])
    assert isinstance(placed, VolcanoBinding) and placed.devices.startswith(uuid + ",")


def test_several_unknown_uuids_add_one_alternative_and_volcano_keeps_the_pod_pending() -> None:
    unknown = [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(50)]
    _, patched = admit(gpu_pod(**{USE_GPUUUID: ",".join(unknown)}))
    assert len(required_terms(patched)) == 1
    assert not any(k.startswith(UUID_LABEL_PREFIX) for k in label_keys(patched))
    assert isinstance(volcano(patched, CLUSTER), str)  # Volcano's UUID allowlist is exact


@pytest.mark.parametrize(
    "selectors",
    [
        # A known A100 asked for, but only A10s allowed: a contradiction no joining GPU resolves.
        {USE_GPUUUID: gpu_uuid("a100", 0), USE_GPUTYPE: "A10"},
        # The same GPU allowed and refused.
        {USE_GPUUUID: gpu_uuid("a100", 0), NOUSE_GPUUUID: gpu_uuid("a100", 0)},
    ],
)
def test_contradictory_uuid_selectors_get_a_term_no_node_satisfies(selectors: dict[str, str]) -> None:
    verdict, patched = admit(gpu_pod(**selectors))
    assert verdict.allowed and "can never be scheduled" in verdict.warnings[0]
    assert_valid_label_keys(patched)
    assert not any(node_matches(n, required_terms(patched)) for n in [*CLUSTER, MIXED_NODE])
    assert isinstance(volcano(patched, [*CLUSTER, MIXED_NODE]), str)


# --- over HTTPS, then through the Volcano stand-in and the API --------------------------------------


def test_over_https_the_pod_stays_unscheduled_until_its_gpu_joins(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    for node in CLUSTER:
        apiserver.put(node)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    obj = gpu_pod(**{USE_GPUTYPE: "A10"})
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as webhook:
        conn = webhook.connect()
        status, answer = post(conn, review(obj))
        assert status == 200 and answer["response"]["allowed"]
        assert "A10" in answer["response"]["warnings"][0]
        patched = apply(obj, decode_patch(answer))
        status, again = post(conn, review(patched, uid="again"))
        assert status == 200 and "patch" not in again["response"]
    apiserver.put(patched)
    kube = Kube(apiserver.api_client())
    try:
        scheduler = VolcanoStandin(kube, ResourceNames())
        waiting = scheduler.schedule_once()["default/p"]
        assert isinstance(waiting, str) and "a100" in waiting
        stored = apiserver.get("Pod", "p", "default")
        assert stored is not None and not stored["spec"].get("nodeName")
        apiserver.put(MIXED_NODE)
        placed = scheduler.schedule_once()["default/p"]
        assert isinstance(placed, VolcanoBinding) and placed.devices.startswith(gpu_uuid("mixed", 1) + ",")
        bound = apiserver.get("Pod", "p", "default")
        assert bound is not None and bound["spec"]["nodeName"] == "mixed"
    finally:
        kube.close()
