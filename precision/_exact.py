"""Exact values of the numbers a format is given: int, Fraction, float (its exact binary value),
Decimal, sympy numbers. Used by ``quantize`` and ``represents`` of every format."""

from __future__ import annotations

import decimal
import math
import numbers
from fractions import Fraction
from typing import Any

import numpy as np

from .errors import PrecisionError, RawTypeError


def sympy_module():
    import sympy

    return sympy


def exact_value(v: Any, op: str = "quantize", pname: str = "x"):
    """v as a Fraction, or ('sympy', expr) for an irrational sympy expression."""
    if isinstance(v, Fraction):
        return v
    if isinstance(v, (bool, np.bool_)):
        return Fraction(int(v))
    if isinstance(v, (int, np.integer)):
        return Fraction(int(v))
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if not math.isfinite(f):
            raise PrecisionError(f"{op}: {pname} contains {f!r}; only finite values are allowed")
        return Fraction(f)  # exact binary value, never via decimal
    if isinstance(v, decimal.Decimal):
        if not v.is_finite():
            raise PrecisionError(f"{op}: {pname} contains {v!r}; only finite values are allowed")
        return Fraction(v)
    if type(v).__module__.startswith("sympy"):
        sp = sympy_module()
        v = sp.sympify(v)
        if v.is_Rational:
            return Fraction(int(v.p), int(v.q))
        if v.is_Float:
            if not v.is_finite:
                raise PrecisionError(f"{op}: {pname} contains {v}; only finite values are allowed")
            sign, man, exp, _ = v._mpf_
            fr = Fraction(int(man)) * (Fraction(2) ** int(exp))
            return -fr if sign else fr
        if v.is_real is False or v.is_finite is False or v.has(sp.nan, sp.zoo, sp.oo, -sp.oo):
            raise PrecisionError(f"{op}: {pname} contains {v}; only finite real values are allowed")
        return ("sympy", v)
    if isinstance(v, numbers.Rational):
        return Fraction(int(v.numerator), int(v.denominator))
    raise RawTypeError(
        f"{op}: {pname} contains a value of type {type(v).__name__}; allowed: int, Fraction, float, "
        "Decimal, sympy numbers, or arrays of these"
    )


def rational_or_none(x) -> Fraction | None:
    """x as an exact Fraction, or None when it is not a finite rational (for ``represents``)."""
    try:
        v = exact_value(x, "represents")
    except PrecisionError:
        return None
    return None if isinstance(v, tuple) else v  # a tuple marks an irrational value


def round_fraction(q: Fraction, nearest: bool) -> int:
    n, d = q.numerator, q.denominator
    f = n // d
    if nearest:
        r = n - f * d
        if 2 * r > d or (2 * r == d and f % 2 == 1):
            f += 1
    return f
