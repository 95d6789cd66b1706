"""Exact rounded exponential: raw r -> round(e^(r/S) * S), floor or nearest (ties impossible).

Decision procedure (see docs/precision.md, "exp"):

1. Float stage, vectorised on the array's own backend. With t^ = fl(fl(r)/fl(S)) clipped to
   [t_lo, t_hi] (outside, the result is certainly 0 or certainly saturated), y^ = fl(fl(exp(t^)) * S)
   (+ 1/2 in nearest mode). Assuming the library exp is within 8 ulp (numpy, glibc, Sleef and CUDA
   document <= 1 ulp; tests measure it), |ln(y^/y)| <= 2.02u|t^| + 17.1u (u = 2^-53), so the true
   value lies in [y^ - E, y^ + E] with E = (y^ + 1)(4u|t^| + 40u) + 2^-900 (the extra margin also
   covers the rounding of y^ +- E). Where floor(y^ - E) == floor(y^ + E) that is the answer.
2. Exact stage for the remaining (ambiguous) entries: mpmath interval arithmetic (``mpmath.iv``,
   outward rounding) at doubling precision until the floor of both interval ends agree. This
   terminates for every r != 0: e^q is irrational for rational q != 0 (Lindemann), so e^q*S is
   never an integer (nor, in nearest mode, a half-integer). r == 0 is exact (e^0 = 1).
"""

from __future__ import annotations

import math
import threading

import numpy as np
from mpmath import iv
from mpmath.libmp import to_int

U = 2.0**-53
C1 = 4.0 * U
C0 = 40.0 * U
TINY = 2.0**-900

#: number of entries decided by the exact (mpmath) stage since import (for tests and tuning)
STATS = {"exact_resolutions": 0}

_lock = threading.Lock()
_cache: dict[tuple[int, int, bool, int], int] = {}
_CACHE_MAX = 1 << 16
_MAX_PREC = 1 << 16


def clip_bounds(S: int, max_raw: int) -> tuple[float, float]:
    """t_lo, t_hi: below t_lo e^t*S < e^-3 (result 0), above t_hi e^t*S > e^3 (max_raw+1) (saturated)."""
    lnS = math.log(S)
    return -(lnS + 3.0), math.log(max_raw + 1) - lnS + 3.0


def exact_exp_round(x: int, S: int, nearest: bool, cap: int) -> int:
    """round(e^(x/S) * S) exactly (floor or nearest), or ``cap`` if the result is >= cap."""
    if x == 0:
        return min(S, cap)
    key = (x, S, nearest, cap)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    prec = max(96, cap.bit_length() + 64, abs(x).bit_length() + 64)
    with _lock:
        old = iv.prec
        try:
            while True:
                iv.prec = prec
                y = iv.exp(iv.mpf(x) / S) * S
                if nearest:
                    y = y + iv.mpf(0.5)
                a, b = y._mpi_  # exact endpoints (mpf tuples); never convert through the mp context
                lo = to_int(a, "f")
                if lo >= cap:
                    res = cap
                    break
                hi = to_int(b, "f")
                if lo == hi:
                    res = max(lo, 0)
                    break
                prec *= 2
                if prec > _MAX_PREC:  # pragma: no cover - would need e^q within 2^-65536 of an integer
                    raise ArithmeticError(f"exp({x}/{S}): undecided at {prec // 2} bits")
        finally:
            iv.prec = old
    STATS["exact_resolutions"] += 1
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = res
    return res


def exp_int64(x, S: int, max_raw: int, nearest: bool, xp, nonpositive: bool = False):
    """Exact rounded exp of int64 raw values x (|x| <= 2^61). Returns int64 values in [0, max_raw + 1]
    where max_raw + 1 marks saturation (the caller clips and counts). ``nonpositive``: the caller
    guarantees x <= 0 (softmax), so y <= S and a single error bound serves the whole array."""
    cap = max_raw + 1
    t_lo, t_hi = clip_bounds(S, max_raw)
    Sf = float(S)  # exact: S <= 2^60 is a power of two or < 2^53 (checked by the format)
    xf = xp.f64(x)
    if _is_pow2(S):
        t = xf * (1.0 / Sf)  # exact scaling
    else:
        t = xf / Sf
    if nonpositive:
        t = xp.maximum(t, t_lo)
    else:
        t = xp.clip(t, t_lo, t_hi)
    y = xp.exp(t)
    y *= Sf
    if nearest:
        y += 0.5
    f = xp.floor(y)
    fr = y - f  # exact (f <= y < f + 1)
    if nonpositive:
        # |t| <= |t_lo| and y <= S + 1/2: one bound for all entries
        E = (Sf + 1.5) * (abs(t_lo) * C1 + C0) + TINY
        amb = (fr < E) | (fr > 1.0 - E)
    else:
        err = (y + 1.0) * (xp.abs(t) * C1 + C0) + TINY
        amb = (fr < err) | (fr + err > 1.0)
        capf = float(cap)
        if int(capf) < cap:
            capf = float(np.nextafter(capf, np.inf))
        # certainly saturated: y - err >= cap  (the rounding of y - err is covered by C0)
        amb = amb & ((y - err) < capf)
        f = xp.minimum(f, capf)
    res = xp.i64(f)
    if not nonpositive:
        res = xp.minimum(res, cap)
    if xp.any(amb):
        res = xp.contiguous(res)
        idx = xp.flatnonzero(amb)
        xs = xp.to_numpy(xp.take_flat(x, idx)).reshape(-1).tolist()
        keep = [i for i, v in enumerate(xs) if v != 0]  # e^0 = 1 exactly: y = S (+1/2) is exact
        if keep:
            idx = idx[keep] if not xp.torch else idx[xp.t.as_tensor(keep, device=idx.device)]
            vals = [exact_exp_round(int(xs[i]), S, nearest, cap) for i in keep]
            if not xp.torch and res.ndim == 0:
                res = np.asarray(vals[0], dtype=np.int64)
            else:
                res = xp.put_flat(res, idx, vals)
    return res


def _is_pow2(S: int) -> bool:
    return S & (S - 1) == 0


def exp_object(x: np.ndarray, S: int, max_raw: int, nearest: bool) -> np.ndarray:
    """Exact rounded exp of Python-int raw values (object array); results in [0, max_raw + 1]."""
    cap = max_raw + 1
    out = np.empty(x.shape, dtype=object)
    flat_in = x.reshape(-1)
    flat = out.reshape(-1)
    t_lo, t_hi = clip_bounds(S, max_raw)
    huge = cap.bit_length() > 1000 or S.bit_length() > 1000
    Sf = float(S) if not huge else 0.0
    for i, v in enumerate(flat_in.tolist()):
        v = int(v)
        if v == 0:
            flat[i] = min(S, cap)
            continue
        if huge:
            flat[i] = exact_exp_round(v, S, nearest, cap)
            continue
        try:
            t = v / S  # correctly rounded
        except OverflowError:
            t = math.inf if v > 0 else -math.inf
        t = min(max(t, t_lo), t_hi)
        y = math.exp(t) * Sf  # Sf may be rounded (relative error u, covered by C0)
        if nearest:
            y += 0.5
        err = (y + 1.0) * (abs(t) * C1 + C0) + TINY
        lo = min(max(math.floor(y - err), 0), cap)
        hi = min(max(math.floor(y + err), 0), cap)
        flat[i] = lo if lo == hi else exact_exp_round(v, S, nearest, cap)
    return out
