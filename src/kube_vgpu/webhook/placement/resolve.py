"""Where a vGPU pod may go: its mode and GPU selectors resolved against the inventory.

Pure: selectors, the pod's request and the inventory in; node-affinity alternatives and the Volcano
type annotation out. A selector that matches no GPU today still constrains the pod, with a term that
names the asked model or UUID, so the pod waits for such a GPU instead of being left to Volcano's
substring match (under which `A10` picks an A100). A token that cannot be a label name gets a term no
node can ever satisfy, never a malformed one.

Every vGPU review resolves its placement (the validating phase twice: for the quota's GPU size and
its MIG slot), and almost every pod of a cluster asks the same few things, so placements are
memoised: a bounded LRU cache keyed by the selectors, the largest memory ask, the default mode, the
inventory and its `generation`, which every change of the inventory bumps. A node joining, leaving
or changing its GPUs is thus seen by the next review, as without the cache.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import product

from kube_vgpu.contract.models import gputype_item, gputype_items, model_label_name, token_matches_model
from kube_vgpu.contract.names import (
    HOSTNAME_LABEL,
    MODE_LABEL,
    MODEL_LABEL_PREFIX,
    NOUSE_GPUTYPE,
    USE_GPUTYPE,
    UUID_LABEL_PREFIX,
    Mode,
)
from kube_vgpu.contract.resources import PodRequest
from kube_vgpu.webhook.placement import affinity
from kube_vgpu.webhook.placement.inventory import GpuFilter, Inventory
from kube_vgpu.webhook.placement.selectors import ORIGINAL_NOUSE_GPUTYPE, ORIGINAL_USE_GPUTYPE, Selectors

# Above this many dashes a label's spellings (each `-` as `-` or a space) are not all written:
# 2^3 = 8 items per label at most (data-centre NVML names have 3 or fewer); longer names get the
# all-dash and the all-space form, which covers all-space names (`NVIDIA RTX 6000 Ada Generation`).
# This keeps `use-gputype` for the longest tokens the limits let through far below the
# apiserver's 256 KiB for all annotations.
_MAX_VARIANT_DASHES = 3
_NVIDIA_PREFIX = "NVIDIA-"
# The `use-gputype` item written for a token that can name no model: a substring of no TYPE.
UNMATCHABLE_ITEM = "[]"
# Placements kept (each a few requirements); a fleet has a handful of distinct selector sets and
# memory asks. Selectors longer than the bound in all are resolved each time, so a flood of pods
# with long, distinct selector lists cannot make the kept placements large.
_MEMO_SIZE = 256
_MEMO_MAX_CHARS = 1024


@dataclass(frozen=True)
class Placement:
    """Where a pod may go, resolved against the inventory."""

    mode: Mode
    filter: GpuFilter
    allowed_models: frozenset[str] | None
    alternatives: list[list[affinity.Requirement]]
    largest_gpu_mib: int | None
    matches_nothing: bool
    # Type tokens that can never name a model label (the pod got a term no node satisfies).
    unmatchable: tuple[str, ...] = ()
    # The affinity marker recording the requirements the alternatives add ("" when none), encoded
    # once per placement rather than once per review.
    marker: str = ""


def token_label(token: str) -> str | None:
    """The model label name `token` spells, or None if no label name can hold it.

    Nodes label a model by its NVML name with spaces as `-`. A token whose characters
    would have to be replaced or cut to fit a label name names no label a node publishes.
    """
    wanted = token.strip().replace(" ", "-")
    return wanted if wanted and model_label_name(wanted) == wanted else None


def token_labels(token: str) -> list[str]:
    """The model labels a GPU that joins later may carry for `token`: as written, and with `NVIDIA-`.

    Current NVML names start with `NVIDIA ` (`NVIDIA A10`), which users leave out; so `A10` waits for
    `NVIDIA-A10` too. Empty when the token cannot be a label name.
    """
    label = token_label(token)
    if label is None:
        return []
    prefixed = _NVIDIA_PREFIX + label
    if label.lower().startswith(_NVIDIA_PREFIX.lower()) or token_label(prefixed) != prefixed:
        return [label]
    return [label, prefixed]


def _spellings(label: str) -> list[str]:
    """The NVML names a label can stand for: each `-` written as `-` or as a space (at most 8)."""
    parts = label.split("-")
    if len(parts) - 1 > _MAX_VARIANT_DASHES:
        return list(dict.fromkeys(["-".join(parts), " ".join(parts)]))
    return [
        parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=True))
        for seps in product("- ", repeat=len(parts) - 1)
    ]


def future_type_items(token: str) -> list[str]:
    """`use-gputype` items that pick, under Volcano's substring rule, exactly the models `token` names.

    kube-vgpu registers TYPE as `NVIDIA-[<NVML name>]`, so a bracketed NVML name is a substring of
    that model's TYPE alone. Reference-form TYPEs carry no brackets, so nothing here matches them:
    the pod waits rather than risk another model. A token that can name no model gives `[]`.
    """
    labels = token_labels(token)
    if not labels:
        # No TYPE contains `[]` (register TYPEs cannot hold brackets); a constant, not the token, so
        # the rewritten annotation stays small however long the token was.
        return [UNMATCHABLE_ITEM]
    return list(dict.fromkeys(f"[{s}]" for label in labels for s in _spellings(label)))


def _uuid_alternatives(
    wanted: frozenset[str], allowed: frozenset[str] | None, inv: Inventory
) -> list[list[affinity.Requirement]]:
    """`Exists` on the `gpu-uuid.kube-vgpu.io/` label of the wanted GPUs, one alternative per node.

    One GPU's label already picks its node, and Volcano's own allowlist (exact:
    `pkg/scheduler/api/devices/nvidia/vgpu/type.go`) then
    picks among that node's GPUs, so a long list never gives more alternatives than nodes. UUIDs no
    node holds today multiply nothing: beside a known one they add nothing; alone, a single one is
    waited for by its label, and several by Volcano's exact allowlist (one alternative in all).
    """
    per_node: dict[str, str] = {}
    unknown: list[str] = []
    for uuid in sorted(wanted):
        gpu = inv.gpu(uuid)
        if gpu is None:
            unknown.append(uuid)
        elif allowed is None or gpu.model in allowed:
            per_node.setdefault(gpu.node, uuid)
        # A known GPU of a model the type selectors refuse can never be chosen: no term for it.
    if per_node:
        return [[affinity.exists(UUID_LABEL_PREFIX + uuid)] for uuid in sorted(per_node.values())]
    if len(unknown) == 1:
        return [[affinity.exists(UUID_LABEL_PREFIX + unknown[0])]]
    if unknown:
        return [[]]
    return [affinity.never()]


def _future_model_alternatives(sel: Selectors, inv: Inventory) -> list[list[affinity.Requirement]]:
    """Type selectors matching no model known today: wait for the model asked, never guess."""
    if sel.use_types is not None:
        alternatives: dict[str, list[affinity.Requirement]] = {}
        for token in sel.use_types:
            labels = token_labels(token)
            alts = [[affinity.exists(MODEL_LABEL_PREFIX + label)] for label in labels] or [affinity.never()]
            for alt in alts:
                alternatives.setdefault(affinity.canonical(alt), alt)
        return list(alternatives.values())
    # Only `nouse-gputype`, refusing every model known now: nodes with none of those models.
    refused = sorted(m for m in inv.models() if any(token_matches_model(t, m) for t in sel.nouse_types or ()))
    return [[affinity.does_not_exist(MODEL_LABEL_PREFIX + m) for m in refused]]


def resolve_placement(sel: Selectors, request: PodRequest, inv: Inventory, default_mode: Mode) -> Placement:
    """Resolve selectors and mode against the inventory into node requirements.

    The answer depends on the pod only through its selectors and its largest memory ask, so it is
    memoised by those, the mode and the inventory's state (see the module docstring). The Placement
    returned may be shared by many reviews: read it, never change it.
    """
    memory = 0
    for c in request.containers:  # a loop: a generator for `max` cost more than one or two containers
        if c.memory_mib is not None and c.memory_mib > memory:
            memory = c.memory_mib
    if _written_chars(sel) > _MEMO_MAX_CHARS:
        return _resolve(sel, memory, default_mode, inv)
    return _resolve_memoised(sel, memory, default_mode, inv, inv.generation)


def _written_chars(sel: Selectors) -> int:
    """The characters a Selectors holds (the user's text included): what a memoised key keeps."""
    chars = len(sel.use_types_text or "") + len(sel.nouse_types_text or "")
    for group in (sel.use_types, sel.nouse_types, sel.use_uuids, sel.nouse_uuids):
        if group:  # most pods select nothing: no generator built for an absent list
            chars += sum(map(len, group))
    return chars


@functools.lru_cache(maxsize=_MEMO_SIZE)
def _resolve_memoised(
    sel: Selectors, memory: int, default_mode: Mode, inv: Inventory, generation: int
) -> Placement:
    """`_resolve`, kept per inventory state: `generation` is only part of the key, so a changed
    inventory is a new key and a placement resolved before the change is never handed out after it."""
    del generation
    return _resolve(sel, memory, default_mode, inv)


def _resolve(sel: Selectors, memory: int, default_mode: Mode, inv: Inventory) -> Placement:
    allowed: frozenset[str] | None = None
    if sel.by_type:
        allowed = frozenset(
            model
            for model in inv.models()
            if (sel.use_types is None or any(token_matches_model(t, model) for t in sel.use_types))
            and not any(token_matches_model(t, model) for t in sel.nouse_types or ())
        )
    excluded = frozenset(sel.nouse_uuids or ())
    uuids = None if sel.use_uuids is None else frozenset(sel.use_uuids) - excluded
    by_selectors = GpuFilter(models=allowed, uuids=uuids, excluded=excluded)
    fits = GpuFilter(models=allowed, uuids=uuids, excluded=excluded, min_memory_mib=memory)
    mode: Mode
    if sel.mode is not None:
        mode = sel.mode
    else:
        offered = inv.offered_modes(fits)
        mode = next(iter(offered)) if len(offered) == 1 else default_mode
    selector_alternatives: list[list[affinity.Requirement]] = []
    if uuids is not None:
        selector_alternatives = _uuid_alternatives(uuids, allowed, inv)
    elif allowed:
        selector_alternatives = [[affinity.exists(MODEL_LABEL_PREFIX + m)] for m in sorted(allowed)]
    elif allowed is not None:
        selector_alternatives = _future_model_alternatives(sel, inv)
    common: list[affinity.Requirement] = [affinity.one_of(MODE_LABEL, [mode])]
    shared_tail: list[affinity.Requirement] = []
    hosts = inv.fully_excluded_hostnames(excluded)
    if hosts:
        shared_tail.append(affinity.none_of(HOSTNAME_LABEL, hosts))
    alternatives = [[*common, *alt, *shared_tail] for alt in selector_alternatives] or [
        [*common, *shared_tail]
    ]
    added = [r for alt in alternatives for r in alt]
    return Placement(
        mode=mode,
        filter=fits,
        allowed_models=allowed,
        alternatives=alternatives,
        largest_gpu_mib=inv.largest_memory(by_selectors, mode),
        matches_nothing=sel.any and not inv.any_gpu(by_selectors),
        unmatchable=tuple(t for t in sel.use_types or () if token_label(t) is None),
        marker=affinity.encode_marker(added) if added else "",
    )


def clip(text: str, limit: int = 120) -> str:
    """`text`, cut to `limit` characters: what a user wrote is quoted in messages, not echoed whole."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pending_warning(message: str, placement: Placement, sel: Selectors) -> str:
    """The admission warning for selectors that match no GPU now: whether and how the pod can start."""
    never = [affinity.never()[0] in alt for alt in placement.alternatives]
    if placement.unmatchable:
        tokens = clip(", ".join(repr(t) for t in placement.unmatchable))
        outcome = "so the pod can never be scheduled" if all(never) else "so those never match"
        return (
            f"{message}; {tokens} cannot be a GPU model label (letters, digits, '-', '_', '.', spaces; "
            f"at most 63), {outcome}: write the model as nodes label it, e.g. NVIDIA-A100-SXM4-80GB"
        )
    if never and all(never):
        return (
            f"{message}; the GPU selectors exclude each other (a GPU both allowed and refused, or of a "
            "model the type selectors refuse), so the pod can never be scheduled: drop one of them"
        )
    hint = ""
    if sel.use_types is not None:
        hint = (
            " (a model that has not joined yet is found by its full name as nodes label it, with or "
            "without NVIDIA-: A10, A100-SXM4-80GB)"
        )
    return f"{message}; the pod stays pending until such a GPU joins{hint}"


def _exact_refusal(allowed: frozenset[str], known: frozenset[str]) -> list[str] | None:
    """`nouse-gputype` items refusing exactly the TYPEs not allowed, or None when none exist."""
    refused = [gputype_item(type_field) for type_field in sorted(known - allowed)]
    if not refused or any(item.lower() in t.lower() for item in refused for t in allowed):
        return None
    return refused


def _keep_users_words(annotations: dict[str, str], sel: Selectors) -> None:
    annotations.pop(ORIGINAL_USE_GPUTYPE, None)
    annotations.pop(ORIGINAL_NOUSE_GPUTYPE, None)
    if sel.use_types_text is not None:
        annotations[ORIGINAL_USE_GPUTYPE] = sel.use_types_text
    if sel.nouse_types_text is not None:
        annotations[ORIGINAL_NOUSE_GPUTYPE] = sel.nouse_types_text


def _items_for_tokens(tokens: Iterable[str]) -> str:
    return ",".join(dict.fromkeys(item for token in tokens for item in future_type_items(token)))


def rewrite_gputype(
    annotations: dict[str, str], sel: Selectors, placement: Placement, inv: Inventory
) -> list[str]:
    """Write `use-gputype` as items Volcano's substring rule reads exactly; keep the user's words.

    Returns the warnings to give the user. Edits `annotations` in place.
    """
    if not sel.by_type:
        return []
    if not placement.allowed_models:
        if sel.use_types is None:
            # Only refusals, and they refuse every known model: Volcano's substring rule can only
            # refuse more than the segment rule, never place the pod on a refused model.
            return []
        _keep_users_words(annotations, sel)
        annotations[USE_GPUTYPE] = _items_for_tokens(sel.use_types)
        annotations.pop(NOUSE_GPUTYPE, None)  # Volcano ignores it once use-gputype is present
        return []
    allowed_types = inv.types_of(placement.allowed_models)
    if not allowed_types:
        # Labelled models whose register TYPE is not known yet: the bracketed NVML spellings of
        # their labels, as for a model that has not joined, never the user's raw tokens.
        _keep_users_words(annotations, sel)
        annotations[USE_GPUTYPE] = _items_for_tokens(sorted(placement.allowed_models))
        annotations.pop(NOUSE_GPUTYPE, None)
        return []
    known = inv.types()
    items = gputype_items(allowed_types, known)
    _keep_users_words(annotations, sel)
    refused = _exact_refusal(allowed_types, known) if items.inexact else None
    if refused is not None:
        # Reference-form TYPEs can be substrings of each other (NVIDIA-NVIDIA A10 in ...A100...);
        # naming the refused TYPEs is then exact where naming the allowed ones is not.
        annotations[NOUSE_GPUTYPE] = ",".join(refused)
        annotations.pop(USE_GPUTYPE, None)
        return []
    annotations[USE_GPUTYPE] = ",".join(items.items)
    annotations.pop(NOUSE_GPUTYPE, None)  # Volcano ignores it once use-gputype is present
    if items.inexact:
        return [
            f"GPU TYPE(s) {', '.join(items.inexact)} are registered in the reference plugin's form; "
            "Volcano may also place the pod on a GPU whose TYPE contains them"
        ]
    return []
