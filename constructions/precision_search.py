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
