"""Label and field selectors with the grammar and semantics of the Kubernetes API server.

Label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, `k>1`, `k<1`, joined by
commas (all must hold). Field selectors: `f=v`, `f==v`, `f!=v` over the fields a resource allows.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

LabelOp = Literal["=", "!=", "in", "notin", "exists", "!", ">", "<"]

_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
# Operator characters end an identifier, as in the real lexer.
_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|<|>|[^\s!=(),<>]+)")


class SelectorParseError(ValueError):
    """A selector string that does not parse; the message says what was expected."""


def _check_key(key: str) -> str:
    if len(key.rsplit("/", 1)[-1]) > 63 or not _LABEL_KEY.match(key):
        raise SelectorParseError(
            f'unable to parse requirement: key: Invalid value: "{key}": name part must consist of '
            "alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )
    return key


def _check_value(key: str, value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise SelectorParseError(
            f'unable to parse requirement: values[0][{key}]: Invalid value: "{value}": a valid label must be '
            "an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character"
        )
    return value


@dataclass(frozen=True)
class LabelRequirement:
    """One comma-separated term of a label selector."""

    key: str
    op: LabelOp
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label set satisfies this term."""
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        # Gt/Lt: the label must be there and be an integer, as in the real server.
        try:
            number, bound = int(value), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return present and (number > bound if self.op == ">" else number < bound)


# The operators of a `matchExpressions` entry (LabelSelector, NodeSelectorTerm) in the query grammar.
_EXPRESSION_OPS: dict[str, LabelOp] = {
    "In": "in",
    "NotIn": "notin",
    "Exists": "exists",
    "DoesNotExist": "!",
    "Gt": ">",
    "Lt": "<",
}


def expression_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether `labels` satisfy one `matchExpressions` entry; an unknown operator never matches."""
    op = _EXPRESSION_OPS.get(expression.get("operator", ""))
    if op is None:
        return False
    values = tuple(expression.get("values") or ())
    return LabelRequirement(expression.get("key", ""), op, values).matches(labels)


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[LabelRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse the `labelSelector` query parameter; raises SelectorParseError naming the problem."""
        tokens = [m.group(1) for m in _TOKEN.finditer(text)]
        if "".join(tokens) != re.sub(r"\s+", "", text):
            raise SelectorParseError(f"unable to parse requirement: unexpected characters in {text!r}")
        parser = _LabelParser(tokens, text)
        return cls(tuple(parser.parse()))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether a label set satisfies every term."""
        labels = labels or {}
        return all(req.matches(labels) for req in self.requirements)

    @property
    def empty(self) -> bool:
        """Whether this selector selects everything."""
        return not self.requirements


class _LabelParser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self._tokens = tokens
        self._pos = 0
        self._text = text

    def _peek(self) -> str | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self, expected: str) -> str:
        token = self._peek()
        if token is None:
            raise SelectorParseError(
                f"unable to parse requirement: found end of selector, expected: {expected}"
            )
        self._pos += 1
        return token

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        if self._peek() is None:
            return requirements
        while True:
            requirements.append(self._requirement())
            token = self._peek()
            if token is None:
                return requirements
            if token != ",":
                raise SelectorParseError(f"found '{token}', expected: ',' or 'end of string'")
            self._pos += 1

    def _identifier(self, what: str) -> str:
        token = self._take(what)
        if token in ("==", "!=", "=", "!", "(", ")", ",", "<", ">"):
            raise SelectorParseError(f"unable to parse requirement: found '{token}', expected: {what}")
        return token

    def _requirement(self) -> LabelRequirement:
        if self._peek() == "!":
            self._pos += 1
            return LabelRequirement(_check_key(self._identifier("identifier")), "!")
        key = _check_key(self._identifier("identifier"))
        op = self._peek()
        if op is None or op == ",":
            return LabelRequirement(key, "exists")
        self._pos += 1
        if op in ("=", "=="):
            return LabelRequirement(key, "=", (_check_value(key, self._value()),))
        if op == "!=":
            return LabelRequirement(key, "!=", (_check_value(key, self._value()),))
        if op in ("<", ">"):
            value = self._value()
            if not re.fullmatch(r"-?\d+", value):
                raise SelectorParseError(
                    f"unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer, "
                    f"got {value!r}"
                )
            return LabelRequirement(key, op, (value,))  # type: ignore[arg-type]
        if op in ("in", "notin"):
            return LabelRequirement(key, op, self._set(key))  # type: ignore[arg-type]
        raise SelectorParseError(
            f"unable to parse requirement: found '{op}', expected: in, notin, =, ==, !=, gt, lt"
        )

    def _value(self) -> str:
        token = self._peek()
        # `k=` selects the empty value; the next token is then a separator or the end.
        if token is None or token == ",":
            return ""
        return self._identifier("identifier")

    def _set(self, key: str) -> tuple[str, ...]:
        if self._take("'('") != "(":
            raise SelectorParseError("unable to parse requirement: expected '(' after set operator")
        values: list[str] = []
        while True:
            token = self._take("',' or ')'")
            if token == ")":
                break
            if token == ",":
                # An empty element, as in `k in (a,,b)` or `k in (,a)`: the empty value.
                values.append("")
                continue
            values.append(_check_value(key, token))
            token = self._take("',' or ')'")
            if token == ")":
                break
            if token != ",":
                raise SelectorParseError(f"unable to parse requirement: found '{token}', expected: ',', ')'")
        if not values:
            raise SelectorParseError(
                "unable to parse requirement: for 'in', 'notin' operators, values set can't be empty"
            )
        return tuple(values)


FieldOp = Literal["=", "!="]


@dataclass(frozen=True)
class FieldRequirement:
    """One term of a field selector."""

    field: str
    op: FieldOp
    value: str


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector; the empty selector matches everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str, allowed: Callable[[str], bool]) -> FieldSelector:
        """Parse the `fieldSelector` query parameter, refusing fields `allowed` rejects."""
        requirements: list[FieldRequirement] = []
        for term in _split_unescaped(text, ","):
            if not term.strip():
                continue
            requirements.append(_field_term(term, allowed))
        return cls(tuple(requirements))

    def matches(self, obj: Mapping[str, Any], value_of: Callable[[Mapping[str, Any], str], str]) -> bool:
        """Whether an object satisfies every term; `value_of` reads a field as a string."""
        for req in self.requirements:
            equal = value_of(obj, req.field) == req.value
            if equal != (req.op == "="):
                return False
        return True

    def exact(self, field: str) -> str | None:
        """The value an `=` term requires for `field`, if there is one (lets lookups skip a scan)."""
        for req in self.requirements:
            if req.field == field and req.op == "=":
                return req.value
        return None

    @property
    def empty(self) -> bool:
        """Whether this selector selects everything."""
        return not self.requirements


def _field_term(term: str, allowed: Callable[[str], bool]) -> FieldRequirement:
    for op_text, op in (("!=", "!="), ("==", "="), ("=", "=")):
        parts = _split_unescaped(term, op_text, limit=1)
        if len(parts) == 2:
            name, raw_value = parts[0].strip(), parts[1]
            if not allowed(name):
                raise SelectorParseError(
                    f'"{name}" is not a known field selector: field label not supported: {name}'
                )
            return FieldRequirement(name, op, _unescape(raw_value))  # type: ignore[arg-type]
    raise SelectorParseError(f"invalid selector: '{term}'; can't understand '{term}'")


def _split_unescaped(text: str, sep: str, limit: int = -1) -> list[str]:
    # Field values may contain `\,` `\=` and `\\`; split only on unescaped separators.
    parts: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if text.startswith(sep, i) and (limit < 0 or len(parts) < limit):
            # `!=` must not be read as `=` preceded by a `!` belonging to the name.
            if sep == "=" and i > 0 and text[i - 1] == "!":
                current.append(text[i])
                i += 1
                continue
            parts.append("".join(current))
            current = []
            i += len(sep)
            continue
        current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)
