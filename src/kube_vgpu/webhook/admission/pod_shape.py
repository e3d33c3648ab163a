"""The shape of the Pod fields admission reads, checked once so no rule meets a wrong type.

The API server always sends well-typed pods; anyone else who can reach the webhook may not. A pod
whose fields have the wrong JSON types is refused (`allowed: false`, naming the field and what to
write there) before any rule runs, so the rules can read with `.get()` and never raise on a
caller's input. Only the fields some rule reads are described; everything else passes unread.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
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


# -- the quick yes ------------------------------------------------------------------------------
#
# The checker above calls a closure per object, list, map and field; for a pod as the API server
# sends it that is most of its cost, not the reading. So the shape is also written out as one
# straight-line function (generated below, once, at import) that only answers "no problem" or "look
# closer": every text an ASCII string (which holds no lone surrogate), every value of its exact JSON
# type, nulls only where they stand for absent. Whatever it does not pass (a null text, non-ASCII
# text, a dict subclass, a real problem) is walked by `_compile`'s checker, which alone words a
# problem, so every message, and which problem of several is named, stay exactly its own.


def _each_short(values: Iterable[str], max_chars: int) -> bool:
    """Whether every string is at most `max_chars` long (asked only when their sum is longer)."""
    return all(len(v) <= max_chars for v in values)


def _plain_text(value: str, shape: Text) -> bool:
    """Whether a string that is present passes `shape` without a closer look."""
    return (
        value.isascii()
        and (shape.max_chars is None or len(value) <= shape.max_chars)
        and (not shape.dns_label or not value or is_namespace_name(value))
    )


class _QuickWriter:
    """Writes the quick check of a shape as Python source, one statement a line."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.constants: dict[str, object] = {}
        self._names = 0

    def name(self) -> str:
        self._names += 1
        return f"v{self._names}"

    def constant(self, value: object) -> str:
        name = f"c{len(self.constants)}"
        self.constants[name] = value
        return name

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def plain_texts(self, values: str, max_chars: int | None, depth: int) -> None:
        """Statements that `return False` unless every one of `values` (an expression) is an ASCII
        string of at most `max_chars`: joined and tested in C, not one statement per value."""
        joined = self.name()
        self.emit(depth, "try:")
        self.emit(depth + 1, f'{joined} = "".join({values})')
        self.emit(depth, "except TypeError:  # a value that is not a string")
        self.emit(depth + 1, "return False")
        self.emit(depth, f"if not {joined}.isascii():")
        self.emit(depth + 1, "return False")
        if max_chars is not None:
            # Short in all means short each (quantities are a few characters).
            self.emit(depth, f"if len({joined}) > {max_chars} and not _each_short({values}, {max_chars}):")
            self.emit(depth + 1, "return False")

    def present(self, var: str, shape: Shape, depth: int) -> None:
        """Statements that `return False` unless `var`, a value that is there (null included), passes."""
        if isinstance(shape, Text):
            test = f"type({var}) is str and {var}.isascii()"
            if shape != TEXT:  # a length limit or a namespace name: the general test
                test = f"type({var}) is str and _plain_text({var}, {self.constant(shape)})"
            self.emit(depth, f"if not ({test}):")
            self.emit(depth + 1, "return False")
        elif isinstance(shape, Flag):
            self.emit(depth, f"if type({var}) is not bool:")
            self.emit(depth + 1, "return False")
        elif isinstance(shape, ListOf):
            if isinstance(shape.item, Text) and not shape.item.dns_label:
                self.emit(depth, f"if type({var}) is not list:")
                self.emit(depth + 1, "return False")
                self.plain_texts(var, shape.item.max_chars, depth)
                return
            self.emit(depth, f"if type({var}) is not list:")
            self.emit(depth + 1, "return False")
            item = self.name()
            self.emit(depth, f"for {item} in {var}:")
            self.present(item, shape.item, depth + 1)
        elif isinstance(shape, MapOf):
            self.emit(depth, f"if type({var}) is not dict:")
            self.emit(depth + 1, "return False")
            self.plain_texts(var, None, depth)  # the keys
            if isinstance(shape.value, Text) and not shape.value.dns_label:
                self.plain_texts(f"{var}.values()", shape.value.max_chars, depth)
                return
            item = self.name()
            self.emit(depth, f"for {item} in {var}.values():")
            self.present(item, shape.value, depth + 1)
        else:
            self.emit(depth, f"if type({var}) is not dict:")
            self.emit(depth + 1, "return False")
            for key, field_shape in shape.fields.items():
                field = self.name()
                if isinstance(field_shape, Text | Flag):  # null stands for absent
                    self.emit(depth, f"{field} = {var}.get({key!r})")
                    self.emit(depth, f"if {field} is not None:")
                else:  # null is a problem here, named by the exact checker
                    self.emit(depth, f"{field} = {var}.get({key!r}, _ABSENT)")
                    self.emit(depth, f"if {field} is not _ABSENT:")
                self.present(field, field_shape, depth + 1)


def _compile_quick(shape: Shape) -> Callable[[Any], bool]:
    """A function that is True only for values `_compile(shape)` finds no problem in (see above)."""
    writer = _QuickWriter()
    writer.emit(0, "def accepts(v0):")
    writer.present("v0", shape, 1)
    writer.emit(1, "return True")
    scope: dict[str, Any] = {
        "_ABSENT": object(),
        "_each_short": _each_short,
        "_plain_text": _plain_text,
        **writer.constants,
    }
    exec(compile("\n".join(writer.lines), f"<quick check of {type(shape).__name__}>", "exec"), scope)
    accepts: Callable[[Any], bool] = scope["accepts"]
    return accepts


_POD_ACCEPTS = _compile_quick(POD)


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of a pod's admission-relevant fields, or None when nothing is."""
    if _POD_ACCEPTS(pod):
        return None
    problem = _POD_CHECK(pod)
    if problem is None:
        return None
    parts, rest = problem
    return "".join(reversed(parts)) + rest
