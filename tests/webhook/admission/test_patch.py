"""Property: the JSONPatch the rules write (`webhook.patch`) does what the diff of the pod before and after
did, on the fuzz corpus of pods, and admitting the webhook's own output again yields an empty patch.

The reference below is the mutating phase as it was before issue 14: deep-copy the pod, edit the copy
rule by rule, diff the two with `jsonpatch`. Only the patch construction changed, so the decisions
(placement, annotations) come from the same functions in both.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from kube_vgpu.contract.config import Config, WebhookConfig
from kube_vgpu.contract.resources import iter_containers, parse_pod
from kube_vgpu.webhook.admission.mutation import DEFAULT_SCHEDULER, Admission
from kube_vgpu.webhook.admission.patch import PatchBuilder, pointer
from kube_vgpu.webhook.admission.review import MalformedReview, Verdict, make_patch, parse_review
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.inventory import Inventory
from kube_vgpu.webhook.placement.resolve import resolve_placement, rewrite_gputype
from kube_vgpu.webhook.placement.selectors import AFFINITY_MARKER, canonical_annotations, parse_selectors
from tests.support.admission_view import StaticView
from tests.support.webhook import A10, A100, CORES, H100, MEMORY, container, gpu_node, pod, review
from tests.webhook.admission.test_fuzz import _pod as fuzz_pods

VGPU_MODE = "volcano.sh/vgpu-mode"


def _inventory() -> Inventory:
    inv = Inventory()
    inv.upsert(gpu_node("mixed", "hami-core", [(A10, 24576), (A100, 40960)]))
    inv.upsert(gpu_node("big", "mig", [(H100, 81920)]))
    return inv


INVENTORY = _inventory()


def _diff_reference(admission: Admission, obj: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The patch as the diff-based mutating phase made it (for an allowed vGPU pod)."""
    config = admission.config
    names = config.resource_names
    cores = config.webhook.default_cores
    pod_request = parse_pod(obj, names)
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    selectors = parse_selectors(annotations)
    after: dict[str, Any] = copy.deepcopy(dict(obj))
    for (item, _), parsed in zip(iter_containers(after), pod_request.containers, strict=True):
        assert isinstance(item, dict)
        for name, value, missing in (
            (names.count, "1", parsed.number is None),
            (names.cores, str(cores), cores != 0 and parsed.cores is None),
        ):
            if parsed.asks_vgpu and missing:
                resources = item.setdefault("resources", {})
                for part in ("limits", "requests"):
                    if not isinstance(resources.get(part), dict):
                        resources[part] = {}
                    resources[part][name] = value
    spec = after.setdefault("spec", {})
    if (spec.get("schedulerName") or "") in ("", DEFAULT_SCHEDULER):
        spec["schedulerName"] = config.webhook.scheduler_name
    placement = resolve_placement(selectors, pod_request, INVENTORY, config.webhook.default_mode)
    new_annotations = dict(canonical_annotations(annotations))
    new_annotations[VGPU_MODE] = placement.mode
    rewrite_gputype(new_annotations, selectors, placement, INVENTORY)
    affinity.apply_required(
        after, placement.alternatives, affinity.decode_marker(annotations.get(AFFINITY_MARKER))
    )
    added = [r for alt in placement.alternatives for r in alt]
    if added:
        new_annotations[AFFINITY_MARKER] = affinity.encode_marker(added)
    else:
        new_annotations.pop(AFFINITY_MARKER, None)
    after.setdefault("metadata", {})["annotations"] = new_annotations
    return make_patch(obj, after)


def _admit(admission: Admission, obj: Mapping[str, Any]) -> Verdict | None:
    """The verdict, or None for a body the parser refuses (the corpus holds such, e.g. infinities)."""
    try:
        return admission.review(parse_review(json.dumps(review(obj)).encode()))
    except MalformedReview:
        return None


_configs = st.builds(
    WebhookConfig, default_cores=st.sampled_from([0, 30]), strict_selectors=st.booleans()
).map(lambda webhook: Config(webhook=webhook))
# Pods that reach the patch: vGPU containers with and without resources, odd keys needing escapes.
_ODD = {"name": "odd", "resources": {"limits": {MEMORY: "1000", "a/b~c": "1"}}}


def _with_gpu_init_container(obj: dict[str, Any]) -> dict[str, Any]:
    return {**obj, "spec": {**obj["spec"], "initContainers": [container(memory=1000)]}}


_pods = st.one_of(
    fuzz_pods,
    fuzz_pods.map(_with_gpu_init_container),
    st.just(pod(_ODD, container("plain"), {"name": "bare", "resources": {}})),
    st.just(pod(container(memory=1000, cores=20), annotations={VGPU_MODE: "hami-core"})),
)


@settings(max_examples=400, deadline=None)
@given(obj=_pods, config=_configs)
def test_written_patch_does_what_the_diff_did_and_reinvocation_is_empty(
    obj: dict[str, Any], config: Config
) -> None:
    admission = Admission(config, StaticView(INVENTORY))
    verdict = _admit(admission, obj)
    if verdict is None or not verdict.allowed or not verdict.patch:
        return
    patched = jsonpatch.apply_patch(obj, list(verdict.patch))
    assert patched == jsonpatch.apply_patch(obj, _diff_reference(admission, obj))
    again = _admit(admission, patched)
    assert again is not None and again.allowed and list(again.patch) == [], again


def test_container_defaults_land_on_the_right_container_with_escaped_keys() -> None:
    config = Config(webhook=WebhookConfig(default_cores=25))
    obj = pod(container("plain"), container("gpu", memory=1000))
    verdict = _admit(Admission(config, StaticView(INVENTORY)), obj)
    assert verdict is not None
    paths = {op["path"] for op in verdict.patch}
    assert pointer("spec", "containers", 1, "resources", "limits", CORES) in paths
    assert "/spec/containers/1/resources/limits/volcano.sh~1vgpu-cores" in paths
    assert not any(p.startswith("/spec/containers/0/") for p in paths)


def test_builder_writes_nothing_the_pod_already_holds() -> None:
    patch = PatchBuilder()
    patch.set({"a": "1"}, ("x", "a"), "1")
    patch.remove({}, ("x", "b"))
    assert patch.operations == []
    patch.set({"a": "1"}, ("x", "a~/"), "2")
    patch.set({"a": "1"}, ("x", "a"), "2")
    assert patch.operations == [
        {"op": "add", "path": "/x/a~0~1", "value": "2"},
        {"op": "replace", "path": "/x/a", "value": "2"},
    ]
