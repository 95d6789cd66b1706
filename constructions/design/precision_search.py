"""Choosing eta and the number format from the blocks' sufficient conditions.

Both searches evaluate the conditions with the formats' own exact operations:

* :func:`smallest_grid_eta`: the smallest eta on the grid of multiples of ``unit`` for which a
  monotone condition holds (the blocks' worst-case rows are monotone in eta: every rounded
  exponential is non-increasing in it), by bisection;
* :func:`fewest_bits`: the binary fixed-point format with the fewest bits for which a check
  succeeds (ties: the smallest value the check returns, then the fewest fraction bits). Passing is
  not monotone in the number of bits at very low precision, so every split of each total is tried.

Robust designs check the conditions in float arithmetics too: by default :data:`FLOAT_ARITHMETICS`
with :data:`FLOAT_FALLBACKS`; a builder's ``arithmetics`` argument (:func:`design_arithmetics`)
names exactly the ones to check, and a design that no format allows is refused with the largest
power-of-two N at which one does (:func:`refused`).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

from exactformer.precision import FixedPoint, Format
from exactformer.precision.boxes import Arithmetic, FixedArithmetic, FloatArithmetic

#: the arithmetics a robust build is designed for besides its fixed-point format
FLOAT_ARITHMETICS = ("real", "float64", "float32")
#: every arithmetic a design can check: a builder's ``arithmetics`` argument names some of them
DESIGN_ARITHMETICS = ("real", "float64", "float32", "float16", "bfloat16", "float8_e5m2", "float8_e4m3")
_FLOATS = {name: FloatArithmetic(None if name == "real" else name) for name in DESIGN_ARITHMETICS}


#: a robust build's float arithmetics, then the fallbacks when no format up to 48 bits allows them
#: (the a-priori float32 summation bound, for one, is vacuous from 2^24 terms on)
FLOAT_FALLBACKS = (FLOAT_ARITHMETICS, ("real", "float64"), ("real",), ())


def float_set(robust: bool | tuple[str, ...]) -> tuple[str, ...]:
    """The float arithmetics a build is checked in: True -> all of FLOAT_ARITHMETICS, False -> none,
    or a tuple of DESIGN_ARITHMETICS (a robust build that had to drop float32, say, or the
    ``arithmetics`` a builder was given), in DESIGN_ARITHMETICS' order."""
    if isinstance(robust, bool):
        return FLOAT_ARITHMETICS if robust else ()
    return tuple(a for a in DESIGN_ARITHMETICS if a in robust)


def design_arithmetics(value: str | tuple[str, ...] | list[str] | None, err: type[Exception]) -> tuple[str, ...] | None:
    """A builder's ``arithmetics`` argument: None (the default robust design), or the float
    arithmetics to design for, as a tuple or list of names or as text ``"bfloat16,float16"``; each a
    name of DESIGN_ARITHMETICS (``err`` naming the parameter and the allowed names otherwise)."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value)
    bad = [v for v in names if v not in DESIGN_ARITHMETICS]
    if not names or bad or not all(isinstance(v, str) for v in names):
        raise err(f"arithmetics must be a comma list of {', '.join(DESIGN_ARITHMETICS)}, got {value!r}")
    return float_set(tuple(names))


def fallbacks(arithmetics: tuple[str, ...] | None) -> tuple[tuple[str, ...], ...]:
    """What a robust design tries, in order: :data:`FLOAT_FALLBACKS` by default, exactly the given
    ``arithmetics`` (from :func:`design_arithmetics`) otherwise."""
    return FLOAT_FALLBACKS if arithmetics is None else (arithmetics,)


def largest_n(works: Callable[[int], bool], n: int) -> int | None:
    """The largest power of two N' < ``n`` (N' >= 2) for which ``works(N')`` (a design that gets
    harder with N: bisection over the exponent), or None when not even N' = 2 works."""
    hi = (n - 1).bit_length() - 1  # the largest exponent with 2^hi < n
    if hi < 1 or not works(2):
        return None
    lo = 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if works(1 << mid):
            lo = mid
        else:
            hi = mid - 1
    return 1 << lo


def refused(arithmetics: tuple[str, ...], n: int, works: Callable[[int], bool], what: str) -> str:
    """The refusal of a design for ``arithmetics`` at N = ``n`` that no format allows: ``what``
    failed, and the largest power-of-two N at which a format does (``works``)."""
    found = largest_n(works, n)
    return (f"arithmetics {', '.join(arithmetics)}: {what} at N = {n}; "
            + (f"the largest power of two N at which a format allows them is {found}" if found
               else "no N >= 2 allows them"))


def arithmetics_for(fmt: Format, robust: bool | tuple[str, ...]) -> list[Arithmetic]:
    """The fixed-point format's arithmetic, then the float and real ones of ``robust`` (see
    :func:`float_set`; a float format is always checked in all of them)."""
    out: list[Arithmetic] = [FixedArithmetic(fmt)] if fmt.is_exact else []
    return out + [_FLOATS[n] for n in (float_set(robust) if fmt.is_exact else FLOAT_ARITHMETICS)]


def designed_for(fmt: Format, robust: bool | tuple[str, ...]) -> list[str]:
    """Names of the arithmetics a build's sufficient conditions were checked in."""
    return ([fmt.name] if fmt.is_exact else []) + list(float_set(robust) if fmt.is_exact else FLOAT_ARITHMETICS)


def float_arithmetic(name: str) -> FloatArithmetic:
    """The :class:`FloatArithmetic` of a name in DESIGN_ARITHMETICS."""
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
