"""Resource quantities as the apiserver hands them on, read as whole numbers.

The kube-apiserver rewrites every quantity in canonical form before any webhook, scheduler or device
plugin reads it (`3000` arrives as `3k`, `10000` as `10k`; k8s.io/apimachinery/pkg/api/resource/quantity.go).
Volcano reads them with `Quantity.Value()`; this module gives the same number for every form that names a
whole number (`3k`, `1M`, `1e3`, `4096`) and refuses the rest with a reason a user can act on:
fractions, values beyond a 32-bit integer (Volcano keeps them as int32), text that is no quantity.
Pure: no I/O. Parsed text is kept in a small LRU cache (`_parse_text`): the same few quantities
arrive with every review.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import Context, Decimal, InvalidOperation
from typing import Final

INT32_MAX: Final = 2**31 - 1
INT32_MIN: Final = -(2**31)
# A canonical quantity of any int32 is at most 11 characters; the bound keeps hostile text cheap.
MAX_TEXT: Final = 64
BINARY_SUFFIXES: Final = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
DECIMAL_SUFFIXES: Final = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Kubernetes' quantity grammar: sign, digits with an optional fraction, then one suffix: binary,
# decimal SI, or a decimal exponent (`e3`, `E-2`). `E` alone is exa; `E3` is an exponent.
# Exact for any text within MAX_TEXT: arithmetic never rounds what it reads.
_EXACT = Context(prec=4 * MAX_TEXT)
# Past this exponent a non-zero value is beyond int32 (or a fraction) whatever its digits.
_EXPONENT_BOUND = 2 * MAX_TEXT
_GRAMMAR = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?$"
)


class QuantityError(ValueError):
    """Not a whole number Volcano can read; `str()` says why."""


@dataclass(frozen=True)
class WholeQuantity:
    """A quantity that names a whole number within int32."""

    value: int
    binary: bool  # written with a binary suffix (Ki, Mi, Gi, ...)


def _exact(text: str) -> tuple[Decimal, bool]:
    """The exact value of quantity text, and whether it carries a binary suffix."""
    match = _GRAMMAR.match(text)
    if match is None:
        raise QuantityError("is not a Kubernetes quantity")
    number = Decimal(match["number"])
    if match["binary"]:
        return _EXACT.multiply(number, 1024 ** BINARY_SUFFIXES[match["binary"]]), True
    exponent = DECIMAL_SUFFIXES[match["decimal"]] if match["decimal"] else int(match["exponent"] or 0)
    if number and abs(exponent) > _EXPONENT_BOUND:
        # 1e999999999 or 1e-999999999: decided without building the number.
        return (Decimal(2 * INT32_MAX) if exponent > 0 else Decimal("0.5")).copy_sign(number), False
    return _EXACT.scaleb(number, exponent), False


def parse_whole(raw: object) -> WholeQuantity:
    """Read a quantity (text or an integer) as Volcano does; raises QuantityError when it is not a
    whole number within int32."""
    if type(raw) is str and len(raw) <= MAX_TEXT:
        return _parse_text(raw)  # what the API server sends (its canonical quantity text)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise QuantityError(f'must be a quantity such as "3000" or "3k", got a {type(raw).__name__}')
    if isinstance(raw, int):
        return _whole(Decimal(raw), binary=False)
    if len(raw) > MAX_TEXT:
        raise QuantityError(f"is longer than {MAX_TEXT} characters, which no 32-bit number needs")
    return _parse_text(raw)


@functools.lru_cache(maxsize=1024)
def _parse_text(raw: str) -> WholeQuantity:
    """`parse_whole` of text within MAX_TEXT: a fleet writes a few dozen distinct quantities, so the
    answers are kept (a bounded LRU of short strings; a refusal raises again each time, uncached)."""
    try:
        value, binary = _exact(raw)
    except InvalidOperation:  # pragma: no cover - the grammar admits only what Decimal reads
        raise QuantityError("is not a Kubernetes quantity") from None
    return _whole(value, binary=binary)


def _whole(value: Decimal, *, binary: bool) -> WholeQuantity:
    if not INT32_MIN <= value <= INT32_MAX:
        raise QuantityError(f"is larger than {INT32_MAX}, which Volcano would wrap to a wrong number")
    if value != value.to_integral_value():
        raise QuantityError("is a fraction; write a whole number")
    return WholeQuantity(int(value), binary)


def has_binary_suffix(raw: object) -> bool:
    """Whether quantity text ends in a binary suffix (`Ki`, `Mi`, `Gi`, ...)."""
    return isinstance(raw, str) and len(raw) <= MAX_TEXT and bool((m := _GRAMMAR.match(raw)) and m["binary"])


def mib_from_decimal(text: str) -> int | None:
    """The MiB to write for decimal-suffixed text that reads as bytes (`3G` meant 3 GB: 3000), when
    the suffix is G or larger and the result is a whole number; None otherwise."""
    match = _GRAMMAR.match(text) if len(text) <= MAX_TEXT else None
    if match is None or match["decimal"] not in ("G", "T", "P", "E"):
        return None
    mib = _EXACT.scaleb(Decimal(match["number"]), DECIMAL_SUFFIXES[match["decimal"]] - 6)
    return int(mib) if mib == mib.to_integral_value() and mib > 0 else None


def mib_from_binary(text: str) -> int | None:
    """The MiB that binary-suffixed text (`3Gi`) meant as bytes, when that is a whole number."""
    match = _GRAMMAR.match(text)
    if match is None or not match["binary"] or len(text) > MAX_TEXT:
        return None
    mib = _EXACT.divide(
        _EXACT.multiply(Decimal(match["number"]), 1024 ** BINARY_SUFFIXES[match["binary"]]), 1024**2
    )
    return int(mib) if mib == mib.to_integral_value() and mib > 0 else None
