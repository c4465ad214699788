"""Kubernetes quantity strings, for extended resources (whole, non-negative units)."""

from __future__ import annotations

import re
from fractions import Fraction

# Matched whole (`fullmatch`): `$` would also match before a trailing newline, reading "1\n" as 1.
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Kubernetes keeps quantities within int64; anything past that is not a real quantity, and
# bounding the exponent keeps a hostile "1e999999999" from costing time or memory.
_MAX_UNITS = 2**63 - 1
_MAX_EXPONENT = 30
_MAX_LENGTH = 64


class QuantityError(ValueError):
    """A quantity string that is not a valid count of extended-resource units."""


def parse_quantity(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity string ("2", "1k", "2000m", "1Ki", "5e3")."""
    if len(text) > _MAX_LENGTH:
        raise QuantityError("quantity too long")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError("not a quantity")
    value = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        value *= _BINARY[suffix]
    else:
        exponent = (
            int(suffix[1:]) if suffix[:1] in ("e", "E") and len(suffix) > 1 else _DECIMAL[suffix]
        )
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError("exponent out of range")
        value *= Fraction(10) ** exponent
    return -value if match["sign"] == "-" else value


def parse_units(text: str) -> int:
    """Units of an extended resource: a whole, non-negative number within int64."""
    value = parse_quantity(text)
    if value.denominator != 1:
        raise QuantityError("extended resources are whole units")
    if value < 0:
        raise QuantityError("negative quantity")
    if value > _MAX_UNITS:
        raise QuantityError("quantity out of range")
    return int(value)
