"""GPU model names: segment matching of user tokens, node label names, and the register TYPE form.

Users write model tokens (`A100`, `H100-80GB`); kube-vgpu matches them by whole segments. Volcano
matches `nvidia.com/use-gputype` items as case-insensitive substrings of the TYPE a node registers
(pkg/scheduler/api/devices/nvidia/vgpu/utils.go), so `A10` would also pick an A100. This module holds both
rules and the bridge between them: kube-vgpu registers TYPE as `NVIDIA-[<NVML name>]`, and the webhook writes
items of the form `[<NVML name>]`, which are substrings of exactly one model's TYPE.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_SEGMENT_SPLIT = re.compile(r"[-_ ]+")
_LABEL_BAD_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_LABEL_NAME_MAX = 63
_TYPE_PREFIX = "NVIDIA-"


def model_segments(name: str) -> tuple[str, ...]:
    """The lower-cased segments of a model name or token, split on `-`, `_` and spaces."""
    return tuple(part.lower() for part in _SEGMENT_SPLIT.split(name.strip()) if part)


def token_matches_model(token: str, model: str) -> bool:
    """Whether `token`'s segments appear as a contiguous run of `model`'s segments.

    `A100` matches `NVIDIA A100-SXM4-80GB`; `A10` does not; `H100-80GB` matches `NVIDIA H100 80GB HBM3`.
    An empty token matches nothing.
    """
    wanted = model_segments(token)
    have = model_segments(model)
    if not wanted or len(wanted) > len(have):
        return False
    return any(have[i : i + len(wanted)] == wanted for i in range(len(have) - len(wanted) + 1))


def model_label_name(model: str) -> str:
    """The name part of the `gpu-model.kube-vgpu.io/<model>` label: the NVML name with spaces as `-`.

    Characters a label name cannot hold also become `-`, and the name is cut to 63 characters, so
    every NVML name yields a valid label. Segments survive, so segment matching on the label name
    gives the same answer as on the NVML name.
    """
    name = _LABEL_BAD_CHARS.sub("-", model.strip())[:_LABEL_NAME_MAX]
    return name.strip("-_.") or "unknown"


def model_registrable(model: str) -> bool:
    """Whether an NVML name can stand in the register TYPE field (no , : [ ])."""
    return not any(c in model for c in ",:[]")


def register_type(model: str) -> str:
    """The TYPE field kube-vgpu's node plugin writes in the Volcano register annotation."""
    if not model_registrable(model):
        raise ValueError(f"GPU model name {model!r} holds a character the register annotation cannot carry")
    return f"{_TYPE_PREFIX}[{model}]"


@dataclass(frozen=True)
class RegisteredType:
    """A register TYPE field, decoded: the NVML model name and whether the TYPE is in kube-vgpu's form."""

    model: str
    delimited: bool


def parse_register_type(type_field: str) -> RegisteredType:
    """Decode TYPE in either form: kube-vgpu's `NVIDIA-[name]` or the reference plugin's `NVIDIA-name`."""
    if type_field.startswith(_TYPE_PREFIX + "[") and type_field.endswith("]"):
        return RegisteredType(type_field[len(_TYPE_PREFIX) + 1 : -1], True)
    if type_field.startswith(_TYPE_PREFIX):
        return RegisteredType(type_field[len(_TYPE_PREFIX) :], False)
    return RegisteredType(type_field, False)


def gputype_item(type_field: str) -> str:
    """The narrowest `use-gputype` item for a register TYPE: `[model]` in kube-vgpu's form, else the TYPE."""
    decoded = parse_register_type(type_field)
    return f"[{decoded.model}]" if decoded.delimited else type_field


@dataclass(frozen=True)
class GputypeItems:
    """What to write in `nvidia.com/use-gputype` so Volcano's substring rule picks exactly `allowed`.

    `items` is the comma list's content; `inexact` names the TYPEs for which no item exists that is a
    substring of that TYPE and of no other known TYPE (only possible with reference-form TYPEs).
    """

    items: tuple[str, ...]
    inexact: tuple[str, ...]


def gputype_items(allowed: Iterable[str], known: Iterable[str]) -> GputypeItems:
    """Items for Volcano's `use-gputype` that select the register TYPEs in `allowed` among `known`.

    Volcano tests each item as a case-insensitive substring of a GPU's TYPE. For kube-vgpu's own
    form the bracketed name `[model]` is such an item. For a reference-form TYPE the whole TYPE is the
    narrowest item; it is reported as inexact when it is also a substring of a TYPE not allowed.
    """
    allowed_set = set(allowed)
    others = [t.lower() for t in set(known) - allowed_set]
    items: list[str] = []
    inexact: list[str] = []
    for type_field in sorted(allowed_set):
        item = gputype_item(type_field)
        if any(item.lower() in other for other in others):
            inexact.append(type_field)
        if item not in items:
            items.append(item)
    return GputypeItems(tuple(items), tuple(inexact))
