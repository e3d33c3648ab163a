"""Bounded work per review: limits on selector lists and on the affinity they build.

The affinity rewrite multiplies the pod's own `nodeSelectorTerms` by the selectors' alternatives.
Unchecked, one small pod (100 terms x 1,000 UUIDs) kept the event loop busy for seconds and built
a patch of tens of MB while every other review waited. Each check here runs before the work it
bounds, costs time linear in what the pod wrote, and names the limit, the value and what to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kube_vgpu.contract.config import WebhookConfig
from kube_vgpu.contract.names import NOUSE_GPUTYPE, NOUSE_GPUUUID, USE_GPUTYPE, USE_GPUUUID
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.selectors import Selectors


class LimitExceeded(ValueError):
    """A pod asks for more work than the configured limits allow; `str()` is the user's message."""


@dataclass(frozen=True)
class SelectorBounds:
    """The three limits, as configured."""

    selector_items: int
    affinity_terms: int
    affinity_expressions: int

    @classmethod
    def of(cls, config: WebhookConfig) -> SelectorBounds:
        """The limits a webhook configuration sets."""
        return cls(config.max_selector_items, config.max_affinity_terms, config.max_affinity_expressions)


def check_selectors(sel: Selectors, limits: SelectorBounds) -> None:
    """Refuse a selector list longer than `webhook.maxSelectorItems` (items as written, duplicates too)."""
    if not sel.any:
        return  # no list at all, as on most pods
    for key, items, hint in (
        (USE_GPUTYPE, sel.use_types, "name fewer models; a token such as A100 already matches every A100"),
        (NOUSE_GPUTYPE, sel.nouse_types, "name fewer models, or list the ones to use in " + USE_GPUTYPE),
        (USE_GPUUUID, sel.use_uuids, "list fewer GPUs, or select them by model with " + USE_GPUTYPE),
        (NOUSE_GPUUUID, sel.nouse_uuids, "list fewer GPUs, or exclude them by model with " + NOUSE_GPUTYPE),
    ):
        if items is not None and len(items) > limits.selector_items:
            raise LimitExceeded(
                f"annotation {key} lists {len(items)} items; the limit is {limits.selector_items} "
                f"(webhook.maxSelectorItems): {hint}"
            )


def check_affinity(
    own_terms: Sequence[affinity.Term] | None,
    alternatives: Sequence[Sequence[affinity.Requirement]],
    limits: SelectorBounds,
) -> None:
    """Refuse a rewrite whose required node affinity would pass `maxAffinityTerms` or `...Expressions`."""
    size = affinity.combined_size(own_terms, alternatives)
    own = len(own_terms or ())
    if size.terms > limits.affinity_terms:
        raise LimitExceeded(
            f"the required node affinity would have {size.terms} nodeSelectorTerms (the pod's own {own} "
            f"x {len(alternatives)} GPU alternative(s) from its selectors); the limit is "
            f"{limits.affinity_terms} (webhook.maxAffinityTerms): write fewer nodeSelectorTerms, or "
            "select fewer GPU models"
        )
    if size.expressions > limits.affinity_expressions:
        raise LimitExceeded(
            f"the required node affinity would hold {size.expressions} requirements and values (the "
            f"pod's own {own} nodeSelectorTerms x {len(alternatives)} GPU alternative(s)); the limit is "
            f"{limits.affinity_expressions} (webhook.maxAffinityExpressions): write fewer or shorter "
            "nodeSelectorTerms"
        )
