"""docs/dra.md's tenant Role is a valid Role granting `create` on what a pod's claims need."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml

DRA = (Path(__file__).resolve().parents[2] / "docs" / "dra.md").read_text(encoding="utf-8")


def test_the_tenant_role_validates_and_grants_claim_creation() -> None:
    section = DRA[DRA.index("## What tenants need") :]
    (block,) = re.findall(r"```yaml\n(.*?)```", section[: section.index("\n## ", 1)], re.S)
    role, binding = yaml.safe_load_all(block)
    for obj in (role, binding):
        kubernetes_validate.validate(obj, "1.34.0", strict=True)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    granted = {
        (resource, verb)
        for rule in role["rules"]
        if rule["apiGroups"] == ["resource.k8s.io"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert {("resourceclaimtemplates", "create"), ("resourceclaims", "create")} <= granted
    # Nothing that would let a tenant touch the cluster-scoped side or other drivers' slices.
    assert not {r for r, _ in granted} & {"deviceclasses", "resourceslices"}
