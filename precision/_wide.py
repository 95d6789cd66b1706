"""Exact integer kernels on int64 arrays (numpy or torch) for values up to 2^62.

All raw values of an *int64-mode* format satisfy |raw| <= 2^60 (see ``FixedPoint.int64_mode``).
The kernels below compute exact results of ``round(x*y/d)`` (floor, or nearest with ties to even)
without ever overflowing int64:

* ``mul_wide(x, y)`` splits both factors into 31-bit limbs and returns the exact 124-bit product as
  two int64 limbs ``(hi, lo)`` with ``x*y = hi*2^62 + lo`` and ``0 <= lo < 2^62``. Every
  intermediate is bounded below 2^63 (bounds in the comments).
* ``muldiv(x, y, d)`` picks, from static bounds on |x|, |y| and d, the cheapest exact method:
  a float64 quotient corrected by one exact integer comparison (|x*y| < 2^53), an int64 floor
  division (|x*y| < 2^63), a shift of the wide product (d a power of two), or a three-step
  refinement of a float64 estimate against the exact wide remainder (general d <= 2^60).

Results whose magnitude is at least 2^61 are returned as the sentinel ``+-BIG`` (2^62); callers
saturate them (every int64-mode range lies inside [-2^60, 2^60]).
Object arrays (Python ints) take the same formulas with unbounded integers.
"""

from __future__ import annotations

import numpy as np

M31 = (1 << 31) - 1
M62 = (1 << 62) - 1
TWO62 = 1 << 62
BIG = 1 << 62
QLIM = float(1 << 61)
F53 = 1 << 53
F63 = 1 << 63


def is_pow2(d) -> bool:
    return isinstance(d, int) and d > 0 and d & (d - 1) == 0


def mul_wide(a, b):
    """Exact product of int64 values |a|, |b| < 2^62 as ``(hi, lo)``: a*b = hi*2^62 + lo, 0 <= lo < 2^62."""
    a0 = a & M31  # [0, 2^31)
    a1 = a >> 31  # |a1| <= 2^31
    b0 = b & M31
    b1 = b >> 31
    mid = a1 * b0 + a0 * b1  # each term |.| < 2^62, sum |.| < 2^63
    m0 = mid & M31
    m1 = mid >> 31  # |m1| <= 2^32
    lo_t = m0 * (1 << 31) + a0 * b0  # < 2^62 + 2^62 = 2^63
    hi = a1 * b1 + m1 + (lo_t >> 62)  # |.| <= 2^62 + 2^32 + 1
    lo = lo_t & M62
    return hi, lo


def _round_up(q, r, d, xp):
    """Nearest-even correction of a floor quotient q with remainder 0 <= r < d (2r < 2^61)."""
    twice = r * 2
    up = (twice > d) | ((twice == d) & ((q & 1) == 1))
    return xp.where(up, q + 1, q)


def _sub_mask(q, m, xp, by=1):
    """q - by*m for a boolean mask m (in place on numpy)."""
    if xp.torch:
        return q - m.to(q.dtype) * by
    if isinstance(by, int) and by == 1:
        return np.subtract(q, m, out=q, casting="unsafe")
    return q - m * by


def div_exact_int(p, d, nearest: bool, xp, pbound: int, dmax: int, obj: bool = False):
    """round(p/d) for exact integers p (|p| <= pbound < 2^63 or object) and d > 0 (scalar or array)."""
    if obj:
        q = p // d
        r = p - q * d
    elif is_pow2(d):
        f = d.bit_length() - 1
        q = p >> f
        r = p & (d - 1)
    elif pbound < F53 and dmax <= F53:
        # fl(p/d) is monotone in p/d and integers below 2^53 are floats, so floor(fl(p/d)) is the
        # floor q or q + 1; one exact comparison q*d > p (|q*d| <= |p| + d < 2^54) decides.
        df = float(d) if isinstance(d, int) else xp.f64(d)
        q = xp.i64(xp.floor(xp.f64(p) / df))
        qd = q * d
        over = qd > p
        if not nearest:
            return _sub_mask(q, over, xp)
        q = _sub_mask(q, over, xp)
        r = p - _sub_mask(qd, over, xp, d)
    else:
        q = p // d
        r = p - q * d
    if nearest:
        q = _round_up(q, r, d, xp)
    return q


def muldiv(x, y, d, nearest: bool, xp, xbound: int, ybound: int, dmax: int, obj: bool = False):
    """Exact round(x*y/d): floor, or nearest with ties to even.

    x: int64 array (or object array when ``obj``); y: array or Python int; d: Python int >= 1 or
    int64 array >= 1 with d <= dmax <= 2^60. |x| <= xbound, |y| <= ybound, both < 2^62.
    Results with |q| >= 2^61 come back as +-BIG (only when the wide path is needed).
    """
    if obj:
        return div_exact_int(x * y, d, nearest, xp, 0, dmax, obj=True)
    pb = xbound * ybound
    if pb < F63:
        return div_exact_int(x * y, d, nearest, xp, pb, dmax)
    if is_pow2(d):
        return _mulshift(x, y, d.bit_length() - 1, nearest, xp)
    return _muldiv_wide(x, y, d, nearest, xp)


def _mulshift(x, y, f: int, nearest: bool, xp):
    """round(x*y / 2^f) for 0 <= f <= 60 via the wide product; +-BIG when |result| >= 2^61."""
    hi, lo = mul_wide(x, y)
    if f == 0:
        over = hi >= 1
        under = hi <= -2
        hc = xp.clip(hi, -1, 0)
        q = hc * TWO62 + lo  # exact for hi in {-1, 0}
        r = None
    else:
        cap = 1 << (f - 1)
        over = hi >= cap  # q >= cap*2^(62-f) = 2^61
        under = hi < -cap  # q < -2^61
        hc = xp.clip(hi, -cap, cap - 1)
        q = hc * (1 << (62 - f)) + (lo >> f)  # |.| <= 2^61
        r = lo & ((1 << f) - 1)
    if nearest and r is not None:
        q = _round_up(q, r, 1 << f, xp)
    return xp.where(over, BIG, xp.where(under, -BIG, q))


def _muldiv_wide(x, y, d, nearest: bool, xp):
    """round(x*y/d), |x|, |y| < 2^62, 1 <= d <= 2^60 (scalar or array), by refinement.

    q0 = floor(fl(fl(x) fl(y) / fl(d))) has |q0 - xy/d| <= 2^61 * 5.1u + 1 < 1310 (u = 2^-53) unless
    |fl quotient| >= 2^61 (then |xy/d| > 2^61 - 1: sentinel). The remainder r = xy - q0 d is exact
    from two wide products, |r| < 1310 d < 2^71; q1 = floor(fl(r)/d) is within 2^18.1/d + 2 of
    floor(r/d), so r2 = r - q1 d has |r2| < 2^19 + 3d < 2^62 and fits int64; q2 = r2 // d is exact.
    """
    scalar_d = isinstance(d, int)
    df = float(d) if scalar_d else xp.f64(d)
    qf = (xp.f64(x) * xp.f64(y)) / df
    over = qf >= QLIM
    under = qf <= -QLIM
    flag = over | under
    if xp.any(flag):
        x = xp.where(flag, 0, x)
        qf = xp.where(flag, 0.0, qf)
    q0 = xp.i64(xp.floor(qf))
    ph, pl = mul_wide(x, y)
    qh, ql = mul_wide(q0, d)
    rh = ph - qh  # true difference is tiny (|r| < 2^71)
    rl = pl - ql  # (-2^62, 2^62)
    rh = rh + (rl >> 62)
    rl = rl & M62  # r = rh*2^62 + rl, 0 <= rl < 2^62
    rf = xp.f64(rh) * float(TWO62) + xp.f64(rl)
    q1 = xp.i64(xp.floor(rf / df))
    sh, sl = mul_wide(q1, d)
    r2 = (rh - sh) * TWO62 + (rl - sl)  # rh - sh in {-1, 0, 1} since |r2| < 2^62
    q2 = r2 // d
    r3 = r2 - q2 * d
    q = q0 + q1 + q2
    if nearest:
        q = _round_up(q, r3, d, xp)
    return xp.where(over, BIG, xp.where(under, -BIG, q))


def _self_check() -> None:  # pragma: no cover - debugging helper
    from ._xp import NP

    rng = np.random.default_rng(0)
    x = rng.integers(-(1 << 61), 1 << 61, 1000)
    y = rng.integers(-(1 << 61), 1 << 61, 1000)
    hi, lo = mul_wide(x, y)
    for a, b, h, l in zip(x, y, hi, lo):
        assert int(a) * int(b) == int(h) * 2**62 + int(l)
    _ = NP
