"""LOCAL STAND-IN for Kubernetes' `resource.Quantity`: parse, canonical text, and `Value()`.

The kube-apiserver parses every resource quantity it decodes and serialises it again in canonical form
before any webhook, scheduler or device plugin sees it (`3000` is
read back as `3k`). This restates `k8s.io/apimachinery/pkg/api/resource` (`parseQuantityString`,
`ParseQuantity`, `CanonicalizeBytes`, `Value`) for the stand-in API server and the Volcano stand-in.
It deliberately shares nothing with kube-vgpu's own parser (`contract.quantity`), so an end-to-end
test that passes through both says something about a real cluster.
"""

from __future__ import annotations

import decimal
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_BY_EXPONENT = {e: s for s, e in _BINARY_SUFFIXES.items()}
# What the real server's decoder says of text it cannot parse.
REGEX_MESSAGE = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
# sign, whole digits, fraction digits, suffix (checked against the tables above, or an exponent)
_SHAPE = re.compile(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*[-+]?[0-9]*)$")
_EXPONENT = re.compile(r"^[eE][-+]?[0-9]+$")
_MAX_INT64 = 2**63 - 1
_NANO = Decimal("1e-9")
# Exact arithmetic for any quantity the server would take (Go uses arbitrary precision too).
_CONTEXT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


class BadQuantity(ValueError):
    """Text that the real server's decoder refuses."""


@dataclass(frozen=True)
class Quantity:
    """A parsed quantity: its exact value and the format its canonical text keeps."""

    amount: Decimal
    format: Format
    cached: str | None = None  # Go keeps the text as written when it is already canonical

    def value(self) -> int:
        """`Quantity.Value()`: the value rounded up to a whole number (Volcano reads it this way).

        Go answers with an int64; past its range the answer is not pinned by the facts, so it is
        clamped here rather than grown without bound.
        """
        clamped = max(min(self.amount, Decimal(_MAX_INT64)), Decimal(-_MAX_INT64 - 1))
        return int(clamped.to_integral_value(rounding=decimal.ROUND_UP, context=_CONTEXT))  # away from 0

    def canonical(self) -> str:
        """The text the server stores and every later reader sees."""
        return self.cached if self.cached is not None else _canonicalize(self.amount, self.format)


def parse(text: str) -> Quantity:
    """`resource.ParseQuantity`; raises BadQuantity for text the server refuses."""
    if not text:
        raise BadQuantity(REGEX_MESSAGE)
    if text == "0":
        return Quantity(Decimal(0), "DecimalSI", "0")
    match = _SHAPE.match(text)
    if match is None or not (match.group(2) or match.group(3) is not None):
        raise BadQuantity(REGEX_MESSAGE)
    sign, whole, fraction, suffix = match.group(1), match.group(2), match.group(3) or "", match.group(4)
    number = whole.lstrip("0") or "0"
    if suffix in _BINARY_SUFFIXES:
        base_format: Format = "BinarySI"
        amount = Decimal(f"{number}.{fraction or '0'}", context=_CONTEXT) * (2 ** _BINARY_SUFFIXES[suffix])
    elif suffix in _DECIMAL_SUFFIXES:
        base_format = "DecimalSI"
        amount = Decimal(f"{number}.{fraction or '0'}e{_DECIMAL_SUFFIXES[suffix]}", context=_CONTEXT)
    elif _EXPONENT.match(suffix):
        base_format = "DecimalExponent"
        amount = Decimal(f"{number}.{fraction or '0'}e{int(suffix[1:])}", context=_CONTEXT)
    else:
        raise BadQuantity("unable to parse quantity's suffix")
    amount = _CONTEXT.multiply(amount, Decimal(-1 if sign == "-" else 1))
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -9:
        # Go rounds anything below nano precision up (away from zero), so asking for some gives some.
        amount = amount.quantize(_NANO, rounding=decimal.ROUND_UP, context=_CONTEXT)
    fmt: Format = base_format
    if fmt == "BinarySI":
        amount = max(min(amount, Decimal(_MAX_INT64)), Decimal(-_MAX_INT64))
        if 0 < abs(amount) < 1:
            fmt = "DecimalSI"
    return Quantity(amount.normalize(context=_CONTEXT), fmt, _cached_text(text, fmt, whole, fraction, suffix))


def _cached_text(text: str, fmt: Format, whole: str, fraction: str, suffix: str) -> str | None:
    """The text as written when Go's fast path keeps it (ParseQuantity: "reuse the string")."""
    number = whole.lstrip("0") or "0"
    shifted = number + fraction
    if len(shifted) > 18:
        return None  # past the int64 fast path; Go rebuilds the text
    if fmt == "BinarySI":
        exponent = _BINARY_SUFFIXES.get(suffix, 0)
        # Go's binary fast path: precision = 15 - len(num) - exponent*3/10 - 1 must stay >= 0
        precision = 15 - len(number) - int(exponent * 3 / 10) - 1
        keep = precision >= 0 and not fraction and exponent % 10 == 0 and int(shifted) & 0x07 != 0
    else:
        exponent = int(suffix[1:]) if _EXPONENT.match(suffix) else _DECIMAL_SUFFIXES.get(suffix, 0)
        scale = exponent - len(fraction)
        keep = scale >= -9 and scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"
    return text if keep else None


def _canonicalize(amount: Decimal, fmt: Format) -> str:
    """`Quantity.CanonicalizeBytes`."""
    if amount == 0:
        return "0"
    if fmt == "BinarySI" and (abs(amount) < 1024 or amount != amount.to_integral_value()):
        fmt = "DecimalSI"  # small or inexact binary values are shown in decimal, never rounded
    if fmt == "BinarySI":
        whole, power = int(amount), 0
        while whole % 1024 == 0 and power < 60:
            whole //= 1024
            power += 10
        return f"{whole}{_BINARY_BY_EXPONENT.get(power, '')}"
    sign, digits, raw_exponent = amount.as_tuple()
    assert isinstance(raw_exponent, int)  # finite: parse() builds no NaN or infinity
    exponent = raw_exponent
    mantissa = int("".join(map(str, digits)))
    while mantissa % 10 == 0:
        mantissa //= 10
        exponent += 1
    while exponent % 3 != 0:
        mantissa *= 10
        exponent -= 1
    number = f"{'-' if sign else ''}{mantissa}"
    if fmt == "DecimalSI" and exponent in _DECIMAL_BY_EXPONENT:
        return number + _DECIMAL_BY_EXPONENT[exponent]
    # DecimalExponent, or a decimal value past the SI table (not pinned by the facts)
    return number if exponent == 0 else f"{number}e{exponent}"


def canonical(text: str) -> str:
    """The canonical text of `text` (raises BadQuantity)."""
    return parse(text).canonical()


def from_json(raw: object) -> str:
    """The canonical text of a quantity as JSON carries it (`Quantity.UnmarshalJSON`): a string, trimmed
    of spaces, or a bare number; null is zero. Raises BadQuantity for anything else."""
    if raw is None:
        return "0"
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise BadQuantity(REGEX_MESSAGE)
    return canonical(str(raw).strip() if isinstance(raw, str) else json_number(raw))


def json_number(raw: int | float) -> str:
    """A JSON number's text, as the decoder hands it to ParseQuantity."""
    return str(raw) if isinstance(raw, int) else repr(raw)


def value(text: str) -> int:
    """Volcano's reading of `text`: `resource.MustParse(text).Value()` (raises BadQuantity)."""
    return parse(text).value()
