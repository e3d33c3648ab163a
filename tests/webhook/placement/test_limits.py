"""Bounded work per review (SPEC §2.1 step 3; issue 12): selector lists and the affinity they multiply into.

The hostile pods of issue 12 (100 of their own nodeSelectorTerms x 1,000 UUIDs, unknown ones
included) are refused with a message naming the limit and the value, or answered with a small
patch; pods at each limit pass. Sizes and counts are asserted, never times.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.config import Config, WebhookConfig, parse_config
from kube_vgpu.contract.names import NOUSE_GPUTYPE, NOUSE_GPUUUID, USE_GPUTYPE, USE_GPUUUID
from kube_vgpu.standins.apiserver.server import ApiServerStandin
from kube_vgpu.webhook.admission.mutation import Admission
from kube_vgpu.webhook.admission.review import Verdict, decode_patch, parse_review
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.inventory import Inventory
from tests.support.admission_view import StaticView
from tests.support.webhook import (
    A100,
    H100,
    ThreadedWebhook,
    apply,
    container,
    gpu_node,
    gpu_uuid,
    pod,
    post,
    required_terms,
    review,
    write_tls,
)

# Two hami-core nodes of eight A100s each, and one mig node of H100s.
NODES = (
    gpu_node("a", "hami-core", [(A100, 40960)] * 8),
    gpu_node("b", "hami-core", [(A100, 40960)] * 8),
    gpu_node("h", "mig", [(H100, 81920)] * 8),
)
DEFAULTS = WebhookConfig()


def own_terms(count: int, expressions: int = 1) -> dict[str, Any]:
    """A required node affinity of `count` terms, each with `expressions` requirements of its own."""
    terms = [
        {"matchExpressions": [{"key": f"zone-{i}-{j}", "operator": "Exists"} for j in range(expressions)]}
        for i in range(count)
    ]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def hostile_uuids(count: int) -> list[str]:
    """`count` UUIDs: every GPU of nodes a and b, then ones no node holds."""
    known = [gpu_uuid(n, i) for n in ("a", "b") for i in range(8)]
    unknown = [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(count)]
    return (known + unknown)[:count]


def admit(obj: Mapping[str, Any], webhook: WebhookConfig = DEFAULTS) -> tuple[Verdict, dict[str, Any], int]:
    """Admit `obj`; the verdict, the patched pod and the patch's size in bytes (idempotence checked)."""
    inv = Inventory()
    for node in NODES:
        inv.upsert(node)
    admission = Admission(Config(webhook=webhook), StaticView(inv))
    verdict = admission.review(parse_review(json.dumps(review(obj)).encode()))
    patched = apply(obj, verdict.patch)
    if verdict.allowed:
        again = admission.review(parse_review(json.dumps(review(patched)).encode()))
        assert again.allowed and list(again.patch) == [], "not idempotent"
    return verdict, patched, len(json.dumps(list(verdict.patch)))


def gpu_pod(annotations: Mapping[str, str], affinity_: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"affinity": affinity_} if affinity_ else {}
    return pod(container(memory=1024), annotations=annotations, **spec)


# --- issue 12's hostile pods ---------------------------------------------------------------------------


def test_100_terms_times_1000_uuids_is_refused_naming_the_limit_and_the_value() -> None:
    obj = gpu_pod({USE_GPUUUID: ",".join(hostile_uuids(1000))}, own_terms(100))
    verdict, _, size = admit(obj)
    assert not verdict.allowed and verdict.reason == "over-limit"
    assert USE_GPUUUID in verdict.message and "1000" in verdict.message
    assert "maxSelectorItems" in verdict.message and str(DEFAULTS.max_selector_items) in verdict.message
    assert size <= 2  # no patch at all


def test_unknown_uuids_multiply_nothing_and_the_patch_stays_small() -> None:
    """100 own terms x 128 UUIDs, all unknown: one alternative, so 100 terms, not 12,800."""
    unknown = [f"GPU-00000000-0000-0000-0000-{i:012d}" for i in range(DEFAULTS.max_selector_items)]
    obj = gpu_pod({USE_GPUUUID: ",".join(unknown)}, own_terms(100))
    verdict, patched, size = admit(obj)
    assert verdict.allowed
    assert len(required_terms(patched)) == 100
    assert size < 40_000, size  # the hostile version built 47 MB


def test_known_uuids_give_one_alternative_per_node_not_per_gpu() -> None:
    """60 own terms x (16 known GPUs on 2 nodes + 112 unknown): 120 terms."""
    obj = gpu_pod({USE_GPUUUID: ",".join(hostile_uuids(128))}, own_terms(60))
    verdict, patched, size = admit(obj)
    assert verdict.allowed and len(required_terms(patched)) == 120
    assert size < 100_000, size  # the hostile version built 47 MB


def test_a_repeated_uuid_counts_once_in_the_affinity() -> None:
    verdict, patched, _ = admit(gpu_pod({USE_GPUUUID: ",".join([gpu_uuid("a", 0)] * 128)}, own_terms(10)))
    assert verdict.allowed and len(required_terms(patched)) == 10


def test_the_product_over_the_term_limit_is_refused_and_at_the_limit_passes() -> None:
    limit = DEFAULTS.max_affinity_terms
    # A100 (hami-core) and H100 (mig): two model alternatives under the default mode.
    selectors = {USE_GPUTYPE: "A100,H100", "volcano.sh/vgpu-mode": "hami-core"}
    at_limit = gpu_pod(selectors, own_terms(limit // 2))
    verdict, patched, _ = admit(at_limit)
    assert verdict.allowed and len(required_terms(patched)) == limit
    over = gpu_pod(selectors, own_terms(limit // 2 + 1))
    verdict, _, _ = admit(over)
    assert not verdict.allowed and verdict.reason == "over-limit"
    assert f"{limit + 2} nodeSelectorTerms" in verdict.message and "maxAffinityTerms" in verdict.message
    assert f"own {limit // 2 + 1}" in verdict.message


def test_the_expression_limit_counts_requirements_and_values() -> None:
    limit = DEFAULTS.max_affinity_expressions
    # One own term of k requirements plus the mode requirement (1 + its one value): k + 2 in all.
    verdict, _, _ = admit(gpu_pod({}, own_terms(1, limit - 2)))
    assert verdict.allowed
    verdict, _, _ = admit(gpu_pod({}, own_terms(1, limit - 1)))
    assert not verdict.allowed and verdict.reason == "over-limit"
    assert str(limit + 1) in verdict.message and "maxAffinityExpressions" in verdict.message


@pytest.mark.parametrize("key", [USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID])
def test_each_selector_list_is_limited_as_written(key: str) -> None:
    limit = DEFAULTS.max_selector_items
    item = "A100" if "gputype" in key else gpu_uuid("a", 0)
    verdict, _, _ = admit(gpu_pod({key: ",".join([item] * limit)}))
    assert verdict.allowed
    verdict, _, _ = admit(gpu_pod({key: ",".join([item] * (limit + 1))}))
    assert not verdict.allowed and verdict.reason == "over-limit"
    assert key in verdict.message and f"{limit + 1} items" in verdict.message


def test_limits_come_from_the_config_file() -> None:
    config = parse_config("webhook:\n  maxSelectorItems: 2\n  maxAffinityTerms: 3\n")
    verdict, _, _ = admit(gpu_pod({USE_GPUTYPE: "A100,H100,L4"}), config.webhook)
    assert not verdict.allowed and "limit is 2" in verdict.message
    verdict, _, _ = admit(gpu_pod({USE_GPUTYPE: "A100,H100"}, own_terms(2)), config.webhook)
    assert not verdict.allowed and "limit is 3" in verdict.message


# --- the size is counted, not built ------------------------------------------------------------------

_requirement = st.builds(
    lambda key, values: (
        {"key": key, "operator": "In", "values": values} if values else {"key": key, "operator": "Exists"}
    ),
    st.sampled_from(["a", "b", "c", "d"]),
    st.lists(st.sampled_from(["x", "y", "z"]), max_size=3, unique=True),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(_requirement, max_size=3), max_size=5),
    st.lists(st.lists(_requirement, min_size=1, max_size=3), max_size=4),
)
def test_combined_size_bounds_what_combine_builds(
    terms: Sequence[Sequence[affinity.Requirement]], alternatives: Sequence[Sequence[affinity.Requirement]]
) -> None:
    own = [{"matchExpressions": list(t)} if t else {} for t in terms]
    built = affinity.combine(own, alternatives) or []
    size = affinity.combined_size(own, alternatives)
    weight = sum(1 + len(r.get("values") or []) for t in built for r in t.get("matchExpressions") or [])
    assert len(built) <= size.terms and weight <= size.expressions


# --- over HTTPS ----------------------------------------------------------------------------------------


def test_over_https_the_hostile_pod_is_refused_and_the_bounded_one_answered_small(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    for node in NODES:
        apiserver.put(node)
    hostile = gpu_pod({USE_GPUUUID: ",".join(hostile_uuids(1000))}, own_terms(100))
    bounded = gpu_pod({USE_GPUUUID: ",".join(hostile_uuids(128))}, own_terms(60))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    with ThreadedWebhook(kubeconfig, write_tls(tmp_path / "tls")) as webhook:
        conn = webhook.connect()
        status, answer = post(conn, review(hostile))
        assert status == 200 and not answer["response"]["allowed"]
        assert "maxSelectorItems" in answer["response"]["status"]["message"]
        status, answer = post(conn, review(bounded))
        assert status == 200 and answer["response"]["allowed"]
        assert len(answer["response"]["patch"]) < 140_000  # base64 of a JSONPatch under 100 kB
        assert len(required_terms(apply(bounded, decode_patch(answer)))) == 120
        assert 'kube_vgpu_webhook_denials_total{reason="over-limit"} 1.0' in webhook.metrics()
