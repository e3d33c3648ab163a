"""The shape of the Pod fields admission reads, checked once so no rule meets a wrong type.

The API server always sends well-typed pods; anyone else who can reach the webhook may not. A pod
whose fields have the wrong JSON types is refused (`allowed: false`, naming the field and what to
write there) before any rule runs, so the rules can read with `.get()` and never raise on a
caller's input. Only the fields some rule reads are described; everything else passes unread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# A namespace name as the API server validates it (an RFC 1123 label).
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Text:
    """A JSON string that is Unicode text (no lone surrogates, which `\\udXXX` escapes can carry)."""

    dns_label: bool = False
    max_chars: int | None = None


@dataclass(frozen=True)
class Flag:
    """true or false."""


@dataclass(frozen=True)
class Obj:
    """A JSON object; the named fields have the given shapes; others are unread.

    null stands for absent in text and flag fields; objects and lists must not be null, since the
    rules write into them (the API server never sends a null there).
    """

    fields: Mapping[str, Shape]


@dataclass(frozen=True)
class ListOf:
    """A JSON array whose every item has the shape."""

    item: Shape


@dataclass(frozen=True)
class MapOf:
    """A JSON object from strings to values of the shape (labels, annotations, resource amounts)."""

    value: Shape


Shape = Text | Flag | Obj | ListOf | MapOf

TEXT = Text()
# Quantities are short ("4096", "3k", "1e3"); a long digit string would cost quadratic time to convert.
QUANTITY = Text(max_chars=64)
_REQUIREMENT = Obj({"key": TEXT, "operator": TEXT, "values": ListOf(TEXT)})
_CONTAINER = Obj(
    {
        "name": TEXT,
        "restartPolicy": TEXT,
        "resources": Obj({"limits": MapOf(QUANTITY), "requests": MapOf(QUANTITY)}),
        "securityContext": Obj({"privileged": Flag(), "capabilities": Obj({"add": ListOf(TEXT)})}),
        "env": ListOf(Obj({"name": TEXT, "value": TEXT})),
        "volumeMounts": ListOf(Obj({"name": TEXT, "mountPath": TEXT})),
        "volumeDevices": ListOf(Obj({"name": TEXT, "devicePath": TEXT})),
    }
)
POD = Obj(
    {
        "metadata": Obj(
            {
                "name": TEXT,
                "generateName": TEXT,
                "namespace": Text(dns_label=True),
                "uid": TEXT,
                "labels": MapOf(TEXT),
                "annotations": MapOf(TEXT),
            }
        ),
        "spec": Obj(
            {
                "nodeName": TEXT,
                "schedulerName": TEXT,
                "containers": ListOf(_CONTAINER),
                "initContainers": ListOf(_CONTAINER),
                "ephemeralContainers": ListOf(_CONTAINER),
                "volumes": ListOf(Obj({"name": TEXT, "hostPath": Obj({"path": TEXT})})),
                "affinity": Obj(
                    {
                        "nodeAffinity": Obj(
                            {
                                "requiredDuringSchedulingIgnoredDuringExecution": Obj(
                                    {
                                        "nodeSelectorTerms": ListOf(
                                            Obj(
                                                {
                                                    "matchExpressions": ListOf(_REQUIREMENT),
                                                    "matchFields": ListOf(_REQUIREMENT),
                                                }
                                            )
                                        )
                                    }
                                )
                            }
                        )
                    }
                ),
            }
        ),
    }
)

_EXPECTED = {Text: "a string", Flag: "true or false", Obj: "an object", ListOf: "a list", MapOf: "an object"}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def is_unicode_text(value: str) -> bool:
    """Whether `value` can be sent on as UTF-8 (JSON escapes can smuggle in lone surrogates)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_namespace_name(value: str) -> bool:
    """Whether `value` is a name the API server accepts for a namespace."""
    return _DNS_LABEL.fullmatch(value) is not None


# A problem found under some field: the parts of its path from the problem up (`.key`, `[0]`,
# `['key']`, the top-level field without its dot) and the message after the path. The path is
# joined only once a problem is found; a field that is fine costs no string work.
_Problem = tuple[list[str], str]
_Checker = Callable[[Any], _Problem | None]


def _wrong_type(expected: str, value: object) -> _Problem:
    return [], f" must be {expected}, got {_json_type(value)}"


def _compile(shape: Shape, *, top: bool = False) -> _Checker:
    """A checker for `shape`: the closures hold what the shape says, so a check reads no dataclass.

    Recursion is as deep as the shape, not the input: lists and maps are walked in loops.
    """
    expected = _EXPECTED[type(shape)]
    if isinstance(shape, Text):
        return _text_checker(shape)
    if isinstance(shape, Flag):
        return lambda value: None if isinstance(value, bool) else _wrong_type(expected, value)
    if isinstance(shape, ListOf):
        check_item = _compile(shape.item)

        def check_list(value: Any) -> _Problem | None:
            if not isinstance(value, list):
                return _wrong_type(expected, value)
            for index, item in enumerate(value):
                problem = check_item(item)
                if problem:
                    problem[0].append(f"[{index}]")
                    return problem
            return None

        return check_list
    if isinstance(shape, MapOf):
        check_value = _compile(shape.value)

        def check_map(value: Any) -> _Problem | None:
            if not isinstance(value, dict):
                return _wrong_type(expected, value)
            for key, item in value.items():
                if not key.isascii() and not is_unicode_text(key):
                    return [], " has a key holding a lone UTF-16 surrogate; write plain UTF-8 text"
                problem = check_value(item)
                if problem:
                    problem[0].append(f"[{key!r}]")
                    return problem
            return None

        return check_map
    # null stands for absent in text and flag fields, so those checkers are told apart here.
    fields = [
        (key, "" if top else ".", isinstance(field_shape, Text | Flag), _compile(field_shape))
        for key, field_shape in shape.fields.items()
    ]

    def check_object(value: Any) -> _Problem | None:
        if not isinstance(value, dict):
            return _wrong_type(expected, value)
        for key, dot, null_is_absent, check_field in fields:
            if key not in value:
                continue
            item = value[key]
            if item is None and null_is_absent:
                continue
            problem = check_field(item)
            if problem:
                problem[0].append(dot + key)
                return problem
        return None

    return check_object


def _text_checker(shape: Text) -> _Checker:
    expected = _EXPECTED[Text]
    max_chars = shape.max_chars
    dns_label = shape.dns_label

    def check_text(value: Any) -> _Problem | None:
        if not isinstance(value, str):
            return _wrong_type(expected, value)
        if not value.isascii() and not is_unicode_text(value):
            return [], " holds a lone UTF-16 surrogate, which is not text; write plain UTF-8 text"
        if dns_label and value and not is_namespace_name(value):
            return [], " is not a namespace name (lower-case letters, digits and '-', at most 63)"
        if max_chars is not None and len(value) > max_chars:
            return [], f" has {len(value)} characters; write a quantity of at most {max_chars}"
        return None

    return check_text


_POD_CHECK = _compile(POD, top=True)


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of a pod's admission-relevant fields, or None when nothing is."""
    problem = _POD_CHECK(pod)
    if problem is None:
        return None
    parts, rest = problem
    return "".join(reversed(parts)) + rest
