"""ANDing the webhook's node requirements into a pod's required node affinity, without losing the user's.

`nodeSelectorTerms` are ORed and the requirements inside one term are ANDed. The webhook's demands
come as alternatives (e.g. "has model A" OR "has model B"), each a list of requirements; ANDing them
into the pod's own terms is a cross product: every user term combined with every alternative. The
user's `matchFields` and requirements stay in every combined term.

Idempotence: the requirements the webhook added are recorded (see `selectors.AFFINITY_MARKER`) and,
on a second admission, taken off the end of every term before the product is built again.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, NamedTuple

Requirement = dict[str, Any]  # a NodeSelectorRequirement: key, operator, values
Term = dict[str, Any]  # a NodeSelectorTerm: matchExpressions, matchFields

# The key of the requirement pair no node can satisfy (see `never`).
UNMATCHABLE_KEY: Final = "kube-vgpu.io/unmatchable-gpu-selector"


def exists(key: str) -> Requirement:
    """`key` Exists."""
    return {"key": key, "operator": "Exists"}


def one_of(key: str, values: Iterable[str]) -> Requirement:
    """`key` In `values`."""
    return {"key": key, "operator": "In", "values": list(values)}


def none_of(key: str, values: Iterable[str]) -> Requirement:
    """`key` NotIn `values`."""
    return {"key": key, "operator": "NotIn", "values": list(values)}


def does_not_exist(key: str) -> Requirement:
    """`key` DoesNotExist."""
    return {"key": key, "operator": "DoesNotExist"}


def never() -> list[Requirement]:
    """Requirements no node satisfies: one key both present and absent.

    For a selector that can never name a GPU label (a token no label name can hold); unlike `In []`
    it is a valid NodeSelectorTerm, so the apiserver accepts the pod and it simply stays pending.
    """
    return [exists(UNMATCHABLE_KEY), does_not_exist(UNMATCHABLE_KEY)]


# `json.dumps(value, sort_keys=True, separators=(",", ":"))`, with the encoder built once rather than
# per call (json.dumps builds a new one for any non-default argument).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def canonical(value: Any) -> str:
    """A stable text form of a requirement or term, for comparing and deduplicating them."""
    return _CANONICAL.encode(value)


def encode_marker(requirements: Iterable[Requirement]) -> str:
    """The marker annotation value: the distinct added requirements, in a stable order."""
    return canonical(sorted({canonical(r): r for r in requirements}.values(), key=canonical))


def decode_marker(value: str | None) -> list[Requirement]:
    """The requirements a marker records; a damaged marker records nothing (then nothing is taken off)."""
    if not value:
        return []
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):  # the annotation is the pod author's: it may nest arbitrarily
        return []
    if not isinstance(decoded, list):
        return []
    return [r for r in decoded if _is_requirement(r)]


def _is_requirement(value: Any) -> bool:
    """Whether `value` has a NodeSelectorRequirement's shape (only those can be ours to take off)."""
    if not isinstance(value, dict) or set(value) - {"key", "operator", "values"}:
        return False
    values = value.get("values", [])
    return (
        isinstance(value.get("key"), str)
        and isinstance(value.get("operator"), str)
        and isinstance(values, list)
        and all(isinstance(v, str) for v in values)
    )


def _dedupe(terms: Iterable[Term]) -> list[Term]:
    terms = list(terms)
    if len(terms) < 2:
        return terms  # nothing to tell apart: no term needs its canonical text
    seen: dict[str, Term] = {}
    for term in terms:
        seen.setdefault(canonical(term), term)
    return list(seen.values())


def _is_empty(term: Term) -> bool:
    return not term.get("matchExpressions") and not term.get("matchFields")


def _strip(terms: Sequence[Term], added: Sequence[Requirement]) -> list[Term]:
    """Take the webhook's requirements off the end of each term; terms that were only those vanish."""
    if not added:
        return list(terms)
    ours = {canonical(r) for r in added}
    out: list[Term] = []
    for term in terms:
        expressions = list(term.get("matchExpressions") or [])
        if not expressions:
            out.append(term)
            continue
        while expressions and canonical(expressions[-1]) in ours:
            expressions.pop()
        stripped = {k: v for k, v in term.items() if k != "matchExpressions"}
        if expressions:
            stripped["matchExpressions"] = expressions
        if _is_empty(stripped):
            continue  # the whole term was the webhook's own
        out.append(stripped)
    return _dedupe(out)


def _copy_requirement(requirement: Requirement) -> Requirement:
    """A deep copy of a requirement, so the pod written never shares a list with a placement that
    later reviews reuse. Ours hold strings and a list of strings, copied without `copy.deepcopy`'s
    general walk; anything else is deep-copied in full."""
    copied: Requirement = {}
    for key, value in requirement.items():
        if type(value) is str:
            copied[key] = value
        elif type(value) is list and all(type(item) is str for item in value):
            copied[key] = list(value)
        else:
            return copy.deepcopy(requirement)
    return copied


def _and(term: Term, alternative: Sequence[Requirement]) -> Term:
    combined = copy.deepcopy(term)
    expressions: list[Requirement] = combined.setdefault("matchExpressions", [])
    present = {canonical(e) for e in expressions}
    for requirement in alternative:
        if canonical(requirement) not in present:
            expressions.append(_copy_requirement(requirement))
            present.add(canonical(requirement))
    return combined


def combine(terms: Sequence[Term] | None, alternatives: Sequence[Sequence[Requirement]]) -> list[Term] | None:
    """The user's `terms` ANDed with the OR of `alternatives`; None means no required node affinity."""
    if not alternatives:
        return list(terms) if terms else None
    if not terms:
        return _dedupe([{"matchExpressions": [_copy_requirement(r) for r in alt]} for alt in alternatives])
    out: list[Term] = []
    for term in terms:
        if _is_empty(term):
            # An empty term matches no node; ANDing into it would widen what the user wrote.
            out.append(term)
            continue
        out.extend(_and(term, alt) for alt in alternatives)
    return _dedupe(out)


class Size(NamedTuple):
    """How large the rewritten required affinity would be (an upper bound: duplicates still count).

    A named tuple: built for every review, where a frozen dataclass's `__init__` cost more than the count.
    """

    terms: int
    # Requirements plus their values, over every term.
    expressions: int


def _weight(requirements: Any) -> int:
    if not isinstance(requirements, list):
        return 0
    total = 0
    for r in requirements:
        values = r.get("values") if isinstance(r, dict) else None  # JSON: a dict, cheaper than the ABC
        total += 1 + (len(values) if isinstance(values, list) else 0)
    return total


def combined_size(terms: Sequence[Term] | None, alternatives: Sequence[Sequence[Requirement]]) -> Size:
    """The size `combine(terms, alternatives)` would have, counted without building it."""
    alt_weight = sum(_weight(alt if isinstance(alt, list) else list(alt)) for alt in alternatives)
    if not alternatives:
        return Size(len(terms or ()), sum(_own_weight(t) for t in terms or ()))
    if not terms:
        return Size(len(alternatives), alt_weight)
    count = expressions = 0
    for term in terms:
        if _is_empty(term):
            count += 1
            continue
        count += len(alternatives)
        expressions += len(alternatives) * _own_weight(term) + alt_weight
    return Size(count, expressions)


def _own_weight(term: Term) -> int:
    return _weight(term.get("matchExpressions")) + _weight(term.get("matchFields"))


def _required(pod: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    spec = pod.get("spec") or {}
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return affinity, node_affinity, required


def own_terms(pod: Mapping[str, Any], previous: Sequence[Requirement]) -> list[Term] | None:
    """The pod's required `nodeSelectorTerms` with the webhook's earlier requirements taken off."""
    _, _, required = _required(pod)
    existing = required.get("nodeSelectorTerms")
    if not isinstance(existing, list):
        return None
    return _strip([t for t in existing if isinstance(t, dict)], previous)


def required_with(
    pod: Mapping[str, Any],
    own: list[Term] | None,
    alternatives: Sequence[Sequence[Requirement]],
    previous: Sequence[Requirement],
) -> Any:
    """`spec.affinity` once `previous` is taken off the required node affinity and `alternatives` ANDed
    in; None stands for no affinity at all, and the pod is not changed. `own` is
    `own_terms(pod, previous)`, which admission reads first to check its size."""
    spec = pod.get("spec") or {}
    affinity, node_affinity, required = _required(pod)
    terms = combine(own, alternatives)
    if terms is None:
        if "requiredDuringSchedulingIgnoredDuringExecution" in node_affinity and previous:
            # The required affinity was the webhook's alone; leave no empty shell behind.
            node_affinity = {
                k: v
                for k, v in node_affinity.items()
                if k != "requiredDuringSchedulingIgnoredDuringExecution"
            }
            affinity = (
                {**affinity, "nodeAffinity": node_affinity}
                if node_affinity
                else {k: v for k, v in affinity.items() if k != "nodeAffinity"}
            )
            return affinity or None
        return spec.get("affinity")
    return {
        **affinity,
        "nodeAffinity": {
            **node_affinity,
            "requiredDuringSchedulingIgnoredDuringExecution": {**required, "nodeSelectorTerms": terms},
        },
    }
