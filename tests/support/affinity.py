"""A pod's required node affinity rewritten in place, as the mutation's JSONPatch rewrites it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kube_vgpu.webhook.placement import affinity


def apply_required(
    pod: dict[str, Any],
    alternatives: Sequence[Sequence[affinity.Requirement]],
    previous: Sequence[affinity.Requirement],
) -> None:
    """Rewrite `pod`'s required node affinity in place, as the mutation's patch would."""
    after = affinity.required_with(pod, affinity.own_terms(pod, previous), alternatives, previous)
    spec = pod.setdefault("spec", {})
    if after is None:
        spec.pop("affinity", None)
    else:
        spec["affinity"] = after
