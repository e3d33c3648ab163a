"""The pod annotations a user selects GPUs with (docs/usage.md), parsed and validated.

Alias keys are folded into the Volcano keys here (a disagreement between the two is refused), and
the type selectors are read from the webhook's own copy when the pod has been admitted before: the
webhook rewrites `nvidia.com/use-gputype` into exact items and keeps what the user wrote under the
`kube-vgpu.io/` keys, so a second admission resolves the user's words again, not its own output.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from kube_vgpu.contract.names import (
    ANNOTATION_ALIASES,
    MODES,
    NOUSE_GPUTYPE,
    NOUSE_GPUUUID,
    USE_GPUTYPE,
    USE_GPUUUID,
    VGPU_MODE,
    Mode,
)

# The user's own type selectors, kept when `nvidia.com/use-gputype` is rewritten (re-admission reads these).
ORIGINAL_USE_GPUTYPE: Final = "kube-vgpu.io/use-gputype"
ORIGINAL_NOUSE_GPUTYPE: Final = "kube-vgpu.io/nouse-gputype"
# The node-selector requirements the webhook added, so that a second admission can take them out first.
AFFINITY_MARKER: Final = "kube-vgpu.io/node-affinity"
# A UUID becomes the name part of a label key, so it must be a valid label name.
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector annotation is malformed; `str()` names the annotation, its value and the rule."""

    def __init__(self, key: str, value: str, reason: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"annotation {key}={value!r}: {reason}")


@dataclass(frozen=True)
class Selectors:
    """What the annotations ask for; None = the annotation is absent."""

    mode: Mode | None = None
    use_types: tuple[str, ...] | None = None
    nouse_types: tuple[str, ...] | None = None
    use_uuids: tuple[str, ...] | None = None
    nouse_uuids: tuple[str, ...] | None = None
    # The exact text the user wrote for the type selectors (kept under the kube-vgpu.io keys).
    use_types_text: str | None = None
    nouse_types_text: str | None = None

    @property
    def by_type(self) -> bool:
        """Whether a GPU type selector is given."""
        return self.use_types is not None or self.nouse_types is not None

    @property
    def any(self) -> bool:
        """Whether any GPU selector (type or UUID) is given."""
        return self.by_type or self.use_uuids is not None or self.nouse_uuids is not None


def canonical_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The annotations with every alias value copied to its Volcano key; refuses disagreeing pairs."""
    out = dict(annotations)
    for alias, key in ANNOTATION_ALIASES.items():
        if alias not in annotations:
            continue
        if key in annotations and annotations[key] != annotations[alias]:
            raise SelectorError(
                alias,
                annotations[alias],
                f"disagrees with {key}={annotations[key]!r}; set one of them, or both to the same value",
            )
        out[key] = annotations[alias]
    return out


def _items(key: str, value: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in value.split(","))
    if any(not item for item in items):
        raise SelectorError(
            key, value, "has an empty item; write a comma-separated list without empty entries"
        )
    return items


def _uuids(key: str, value: str) -> tuple[str, ...]:
    items = _items(key, value)
    for item in items:
        if not _LABEL_NAME.match(item):
            raise SelectorError(
                key, value, f"{item!r} is not a GPU UUID (letters, digits, '-', '_', '.'; at most 63)"
            )
    return items


# Every annotation `parse_selectors` reads: a pod with none of them (most pods) selects nothing.
_SELECTOR_KEYS: Final = frozenset(
    {
        *ANNOTATION_ALIASES,
        *ANNOTATION_ALIASES.values(),
        USE_GPUTYPE,
        NOUSE_GPUTYPE,
        ORIGINAL_USE_GPUTYPE,
        ORIGINAL_NOUSE_GPUTYPE,
    }
)
# The answers for the two commonest pods, built once: Selectors is frozen, so one instance serves
# every review (placements are memoised by it, which its equality and hash already allow).
NO_SELECTORS: Final = Selectors()
_MODE_ONLY: Final[dict[str, Selectors]] = {mode: Selectors(mode=mode) for mode in MODES}


def parse_selectors(raw_annotations: Mapping[str, str]) -> Selectors:
    """Parse the selector annotations of a pod; errors name the key the user wrote (alias or not)."""
    present = raw_annotations.keys() & _SELECTOR_KEYS
    if not present:
        return NO_SELECTORS
    if present == {VGPU_MODE}:
        # Only the mode, as on every pod the mutating phase has admitted without selectors.
        value = raw_annotations[VGPU_MODE]
        selected = _MODE_ONLY.get(value) if isinstance(value, str) else None
        if selected is not None:
            return selected
    annotations = canonical_annotations(raw_annotations)
    # Messages name the key the user actually wrote.
    written = {key: alias for alias, key in ANNOTATION_ALIASES.items() if alias in raw_annotations} | {
        key: key for key in ANNOTATION_ALIASES.values() if key in raw_annotations
    }
    mode: Mode | None = None
    if VGPU_MODE in annotations:
        value = annotations[VGPU_MODE]
        mode = next((m for m in MODES if m == value), None)
        if mode is None:
            raise SelectorError(
                written[VGPU_MODE], value, f"unknown mode; valid values are {', '.join(MODES)}"
            )
    if ORIGINAL_USE_GPUTYPE in annotations or ORIGINAL_NOUSE_GPUTYPE in annotations:
        use_key, nouse_key = ORIGINAL_USE_GPUTYPE, ORIGINAL_NOUSE_GPUTYPE
    else:
        use_key, nouse_key = USE_GPUTYPE, NOUSE_GPUTYPE
    use_text, nouse_text = annotations.get(use_key), annotations.get(nouse_key)
    return Selectors(
        mode=mode,
        use_types=None if use_text is None else _items(use_key, use_text),
        nouse_types=None if nouse_text is None else _items(nouse_key, nouse_text),
        use_uuids=(
            None if USE_GPUUUID not in annotations else _uuids(written[USE_GPUUUID], annotations[USE_GPUUUID])
        ),
        nouse_uuids=(
            None
            if NOUSE_GPUUUID not in annotations
            else _uuids(written[NOUSE_GPUUUID], annotations[NOUSE_GPUUUID])
        ),
        use_types_text=use_text,
        nouse_types_text=nouse_text,
    )
