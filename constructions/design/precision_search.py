"""Choosing eta and the number format from the blocks' sufficient conditions.

Both searches evaluate the conditions with the formats' own exact operations:

* :func:`smallest_grid_eta`: the smallest eta on the grid of multiples of ``unit`` for which a
  monotone condition holds (the blocks' worst-case rows are monotone in eta: every rounded
  exponential is non-increasing in it), by bisection;
* :func:`fewest_bits`: the binary fixed-point format with the fewest bits for which a check
  succeeds (ties: the smallest value the check returns, then the fewest fraction bits). Passing is
  not monotone in the number of bits at very low precision, so every split of each total is tried.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

from exactformer.precision import FixedPoint, Format
from exactformer.precision.boxes import Arithmetic, FixedArithmetic, FloatArithmetic

#: the arithmetics a robust build is designed for besides its fixed-point format
FLOAT_ARITHMETICS = ("real", "float64", "float32")
_FLOATS = {name: FloatArithmetic(None if name == "real" else name) for name in FLOAT_ARITHMETICS}


#: a robust build's float arithmetics, then the fallbacks when no format up to 48 bits allows them
#: (the a-priori float32 summation bound, for one, is vacuous from 2^24 terms on)
FLOAT_FALLBACKS = (FLOAT_ARITHMETICS, ("real", "float64"), ("real",), ())


def float_set(robust: bool | tuple[str, ...]) -> tuple[str, ...]:
    """The float arithmetics a build is checked in: True -> all of FLOAT_ARITHMETICS, False -> none,
    or a sub-tuple of them (a robust build that had to drop float32, say)."""
    if isinstance(robust, bool):
        return FLOAT_ARITHMETICS if robust else ()
    return tuple(a for a in FLOAT_ARITHMETICS if a in robust)


def arithmetics_for(fmt: Format, robust: bool | tuple[str, ...]) -> list[Arithmetic]:
    """The fixed-point format's arithmetic, then the float and real ones of ``robust`` (see
    :func:`float_set`; a float format is always checked in all of them)."""
    out: list[Arithmetic] = [FixedArithmetic(fmt)] if fmt.is_exact else []
    return out + [_FLOATS[n] for n in (float_set(robust) if fmt.is_exact else FLOAT_ARITHMETICS)]


def designed_for(fmt: Format, robust: bool | tuple[str, ...]) -> list[str]:
    """Names of the arithmetics a build's sufficient conditions were checked in."""
    return ([fmt.name] if fmt.is_exact else []) + list(float_set(robust) if fmt.is_exact else FLOAT_ARITHMETICS)


def float_arithmetic(name: str) -> FloatArithmetic:
    """The :class:`FloatArithmetic` of a name in FLOAT_ARITHMETICS."""
    return _FLOATS[name]


def given_eta(eta: Any, err: type[Exception]) -> Fraction:
    """An eta the user gave, as an exact Fraction > 0 (``err`` naming the parameter otherwise)."""
    try:
        value = Fraction(eta)
    except (TypeError, ValueError, ZeroDivisionError):
        raise err(f"eta must be a number > 0, got {eta!r}") from None
    if value <= 0:
        raise err(f"eta must be > 0, got {value}")
    return value


def smallest_grid_eta(fmt: Format, unit: Fraction, holds: Callable[[Fraction], bool],
                      top: Fraction | None = None) -> Fraction | None:
    """The smallest eta = unit * j (1 <= j, eta <= ``top``, default the format's maximum) with
    ``holds(eta)``, or None; ``holds`` must be monotone (false below some eta, true from it on)."""
    top = Fraction(fmt.max_value) if top is None and hasattr(fmt, "max_value") else top
    if top is None or unit <= 0:
        return None
    j_hi = int(top / unit)
    if j_hi < 1 or not holds(unit * j_hi):
        return None
    lo, hi = 0, j_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds(unit * mid):
            hi = mid
        else:
            lo = mid
    return unit * hi


def fewest_bits(check: Callable[[Format], Any], max_bits: int = 48, err: type[Exception] = ValueError,
                min_frac: int = 1) -> tuple[Format, Any]:
    """The binary format (1 sign + int + frac bits) with the fewest bits for which ``check(fmt)``
    is not None, and that value (ties: smallest value, then fewest fraction bits)."""
    for total in range(2 + min_frac, max_bits + 1):
        found = []
        for frac in range(min_frac, total - 1):
            fmt = FixedPoint.binary(int_bits=total - 1 - frac, frac_bits=frac)
            v = check(fmt)
            if v is not None:
                found.append((v, frac, fmt))
        if found:
            v, _, fmt = min(found, key=lambda t: (t[0], t[1]))
            return fmt, v
    raise err(f"no binary format with at most {max_bits} bits satisfies the sufficient condition")


def smallest_works(check: Callable[[Format], Any], err: type[Exception], **kw: Any) -> str:
    """For a "this precision does not work" message: the fewest-bit format that does (and what the
    check returned there, the eta), or that none up to 48 bits does."""
    try:
        fmt, found = fewest_bits(check, max_bits=48, err=err, **kw)
    except err:
        return "no binary format up to 48 bits works"
    shown = (", ".join(f"eta{i} = {v}" for i, v in enumerate(found, 1)) if isinstance(found, tuple)
             else f"eta = {found}")
    return f"the smallest precision that works is {fmt.name} ({shown})"
