"""docs/security.md counts the annotations the chart's UPDATE condition guards as the chart does."""

from __future__ import annotations

import re
from pathlib import Path

from kube_vgpu.contract.names import PLACEMENT_ANNOTATIONS, SCHEDULER_OWNED_ANNOTATIONS
from tests.support.helm_render import render

SECURITY = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
WORDS = {"six": 6, "eight": 8, "nine": 9}


def guarded_by_the_chart() -> set[str]:
    rendered = render(None, kube_version="v1.32.0")
    (hook,) = rendered.of_kind("ValidatingWebhookConfiguration")
    (condition,) = [
        c["expression"]
        for w in hook["webhooks"]
        for c in w.get("matchConditions", [])
        if "UPDATE" in c["expression"]
    ]
    return set(re.findall(r"'([a-z0-9.-]+/[a-z0-9.-]+)'", condition))


def test_the_update_condition_count_is_the_charts() -> None:
    guarded = guarded_by_the_chart()
    assert guarded == {*SCHEDULER_OWNED_ANNOTATIONS, *PLACEMENT_ANNOTATIONS}
    text = " ".join(SECURITY.split())
    stated = re.findall(r"touch one of the (\w+) annotations it guards: the (\w+) scheduler-owned ones", text)
    assert stated, "docs/security.md no longer says how many annotations the UPDATE condition guards"
    for total, owned in stated:
        assert int(total) == len(guarded)
        assert WORDS[owned] == len(SCHEDULER_OWNED_ANNOTATIONS)
    placement = re.findall(r"and the (\w+) mode, GPU selector and charge annotations", text)
    assert [WORDS[n] for n in placement] == [len(PLACEMENT_ANNOTATIONS)]


def _english(verbs: list[str]) -> str:
    quoted = [f"`{v}`" for v in verbs]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} and {quoted[-1]}"


def test_the_node_plugins_dra_verbs_are_the_charts() -> None:
    """The sentence on the node plugin's DRA grants lists the verbs of its ClusterRole, in order."""
    rendered = render(None, kube_version="v1.32.0")
    (role,) = [r for r in rendered.of_kind("ClusterRole") if r["metadata"]["name"].endswith("-node")]
    granted = {
        resource: rule["verbs"]
        for rule in role["rules"]
        if rule["apiGroups"] == ["resource.k8s.io"]
        for resource in rule["resources"]
    }
    assert set(granted) == {"resourceslices", "resourceclaims"}
    text = " ".join(SECURITY.split())
    expected = (
        f"It also grants, for DRA groups, {_english(granted['resourceslices'])} on `resourceslices` "
        f"and {_english(granted['resourceclaims'])} on `resourceclaims` (`resource.k8s.io`)."
    )
    assert expected in text
