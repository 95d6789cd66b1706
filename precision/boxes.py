"""Sound images of arithmetic operations on boxes, for certificates.

A :class:`Box` is a pair of arrays ``(lo, hi)``: a set of values lies coordinatewise between them.
An :class:`Arithmetic` maps boxes of operands to a box that contains every result the forward pass
can compute from operands in those boxes. Its operations mirror the forward pass exactly:
``mul`` (one rounded product), ``sum`` (an exact sum of rounded terms, saturated once),
``matmul`` (rounded products summed exactly, saturated once), ``add``, ``sub``, ``relu``, ``exp``
and ``div``.

:class:`FixedArithmetic` is the arithmetic of a fixed-point format. Its images are *exact* (the
smallest boxes): every operation of the format is monotone in each argument once the sign of the
other argument is fixed (floor and nearest rounding, saturation and the exact exp are monotone), so
the extremes of ``op(a, b)`` over a box are attained at corners, and a ``sum``/``matmul`` of
independent coordinates attains the sums of the termwise extremes. Values are raw integers of the
format. The arithmetic runs on its own copy of the format, so certificates never touch the event
counts of a format that the caller runs models with.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from .base import Format
from .floats import GRIDS, round_via_float32
from .parse import parse_format

#: the float dtypes a :class:`FloatArithmetic` encloses (precision/floats.py's grids)
FLOAT_DTYPES = tuple(GRIDS)


@dataclass(frozen=True)
class Box:
    """Values between ``lo`` and ``hi`` (arrays of one shape)."""

    lo: np.ndarray
    hi: np.ndarray

    @staticmethod
    def point(x: Any) -> "Box":
        x = np.asarray(x)
        return Box(x, x)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.lo))

    def is_point(self) -> bool:
        return bool(np.array_equal(self.lo, self.hi))

    def __getitem__(self, idx: Any) -> "Box":
        return Box(np.asarray(self.lo)[idx], np.asarray(self.hi)[idx])

    def hull(self, other: "Box") -> "Box":
        return Box(np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi))

    def reshape(self, *shape: int) -> "Box":
        return Box(np.reshape(self.lo, shape), np.reshape(self.hi, shape))

    def min_over(self, axis: Any) -> "Box":
        """The hull over ``axis`` (the box containing every slice)."""
        return Box(np.min(self.lo, axis=axis), np.max(self.hi, axis=axis))


def _row_counts(counts: np.ndarray, optional: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A row's certain and optional key counts per level, as arrays of one shape."""
    counts = np.asarray(counts)
    return counts, np.zeros_like(counts) if optional is None else np.broadcast_to(np.asarray(optional), counts.shape)


class Arithmetic:
    """The interface certificates use (see the module docstring)."""

    name: str
    exact: bool

    def weight(self, num: np.ndarray, den: int) -> np.ndarray:
        """The values the forward pass uses for exact weights ``num/den`` (a point)."""
        raise NotImplementedError

    def const(self, v: Fraction) -> Any:
        raise NotImplementedError

    def to_fraction(self, x: Any) -> Any:
        raise NotImplementedError


class FixedArithmetic(Arithmetic):
    """Exact box images under the fixed-point format ``fmt`` (values are raw integers)."""

    exact = True

    def __init__(self, fmt: Format):
        if not fmt.is_exact:
            raise ValueError(f"FixedArithmetic needs a fixed-point format, got {fmt.name}")
        self.fmt = parse_format(fmt.name)  # a private copy: its event counts are the certificate's
        self.name = fmt.name
        self.min_raw, self.max_raw = int(self.fmt.min_raw), int(self.fmt.max_raw)
        self.wide = not getattr(self.fmt, "int64_mode", True)

    # ---- values --------------------------------------------------------------------------------
    def weight(self, num: np.ndarray, den: int) -> np.ndarray:
        num = np.asarray(num)
        uniq, inv = np.unique(num, return_inverse=True)
        vals = [Fraction(int(v), int(den)) for v in uniq]
        bad = [v for v in vals if not self.fmt.represents(v)]
        if bad:
            raise ValueError(f"weight value {bad[0]} is not exactly representable in {self.name}")
        raw = np.asarray(self.fmt.quantize(np.array(vals, dtype=object)))
        return raw[inv.reshape(-1)].reshape(num.shape)

    def const(self, v: Fraction) -> int:
        """The raw value of ``v`` rounded as the format rounds (no representability check)."""
        return int(np.asarray(self.fmt.quantize(np.array([Fraction(v)], dtype=object)))[0])

    def to_fraction(self, x: Any) -> Any:
        arr = np.asarray(x)
        if arr.ndim == 0:
            return Fraction(int(arr)) * self.fmt.step
        return np.asarray(self.fmt.to_fraction(arr.astype(object) if self.wide else arr.astype(np.int64)))

    def one(self) -> int:
        return self.const(Fraction(1))

    def array(self, values: Any) -> np.ndarray:
        """Raw values as an array of the right dtype (Python ints beyond int64 stay exact)."""
        return np.asarray(values, dtype=object if self.wide else np.int64)

    # ---- helpers -------------------------------------------------------------------------------
    def _arr(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype == object and not self.wide:
            return x.astype(np.int64)
        return x

    def saturate(self, x: np.ndarray) -> np.ndarray:
        """Exact integers (int64 or object) clipped to the range, as the format saturates."""
        x = np.asarray(x)
        if x.dtype == object:
            x = np.where(x > self.max_raw, self.max_raw, np.where(x < self.min_raw, self.min_raw, x))
            return x if self.wide else x.astype(np.int64)
        return np.clip(x, self.min_raw, self.max_raw)

    def _wide_needed(self, n_terms: int) -> bool:
        return self.wide or (max(abs(self.min_raw), abs(self.max_raw)) + 1) * (n_terms + 1) >= 1 << 62

    # ---- box operations -------------------------------------------------------------------------
    def add(self, a: Box, b: Box) -> Box:
        f = self.fmt
        return Box(self._arr(f.add(a.lo, b.lo)), self._arr(f.add(a.hi, b.hi)))

    def sub(self, a: Box, b: Box) -> Box:
        f = self.fmt
        return Box(self._arr(f.sub(a.lo, b.hi)), self._arr(f.sub(a.hi, b.lo)))

    def relu(self, a: Box) -> Box:
        return Box(np.maximum(a.lo, 0), np.maximum(a.hi, 0))

    def exp(self, a: Box) -> Box:
        f = self.fmt
        return Box(self._arr(f.exp(a.lo)), self._arr(f.exp(a.hi)))

    def mul(self, a: Box, b: Box) -> Box:
        """Rounded products, elementwise with broadcasting (extremes at the four corners)."""
        f = self.fmt
        if a.is_point() and b.is_point():
            r = self._arr(f.mul(a.lo, b.lo))
            return Box(r, r)
        c = [self._arr(f.mul(x, y)) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return Box(np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3])),
                   np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3])))

    def div(self, a: Box, b: Box) -> Box:
        """Rounded quotients for positive divisors (b.lo > 0)."""
        f = self.fmt
        if np.any(np.asarray(b.lo) <= 0):
            raise ValueError("div: divisor boxes must be positive")
        c = [self._arr(f.div(x, y)) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return Box(np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3])),
                   np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3])))

    def sum(self, terms: Box, axis: int = -1, counts: np.ndarray | None = None) -> Box:
        """The exact sum of rounded terms along ``axis`` (each taken ``counts`` times), saturated
        once; the terms' coordinates are independent, so the extremes are the sums of extremes."""
        lo, hi = np.asarray(terms.lo), np.asarray(terms.hi)
        n = lo.shape[axis] if counts is None else int(np.sum(counts))
        if self._wide_needed(max(1, n)):
            lo, hi = lo.astype(object), hi.astype(object)
        if counts is not None:
            c = np.asarray(counts).astype(lo.dtype)
            lo, hi = lo * c, hi * c
        return Box(self.saturate(np.sum(lo, axis=axis)), self.saturate(np.sum(hi, axis=axis)))

    def matmul(self, x: Box, W: np.ndarray) -> Box:
        """Image of ``fmt.matmul(x, W)`` for x in the box ([..., n]) and point weights W [n, m]."""
        W = np.asarray(W)
        n, m = W.shape
        lead = x.shape[:-1]
        if n == 0:
            z = np.zeros(lead + (m,), dtype=np.int64)
            return Box(z, z)
        if x.is_point():
            r = self._arr(self.fmt.matmul(np.asarray(x.lo), W))
            return Box(r, r)
        rows = np.flatnonzero(np.any(W != 0, axis=1))
        lo, hi = np.asarray(x.lo)[..., rows], np.asarray(x.hi)[..., rows]
        Wr = W[rows]
        p1 = self._arr(self.fmt.mul(lo[..., :, None], Wr))
        p2 = self._arr(self.fmt.mul(hi[..., :, None], Wr))
        return self.sum(Box(np.minimum(p1, p2), np.maximum(p1, p2)), axis=-2)

    def affine(self, x: Box, W: np.ndarray, b: np.ndarray) -> Box:
        """add(matmul(x, W), b)."""
        b = np.asarray(b)
        return self.add(self.matmul(x, W), Box(b, b))

    # ---- attention rows --------------------------------------------------------------------------
    def row_weights(self, target: Box, levels: Box, counts: np.ndarray,
                    optional: np.ndarray | None = None, tied: np.ndarray | None = None) -> tuple[Box, Box]:
        """Softmax weights of rows given by a target logit and, per level, ``counts`` other keys
        with logits in ``levels`` ([R] and [R, L] boxes), and ``optional`` ([R, L], default none)
        further keys each of which may be absent (a row over any subset of them). Requires the
        target to be the strict row maximum (``target.lo > levels.hi`` wherever keys may be), so
        that the forward pass subtracts the target's logit: then every weight is monotone in every
        logit difference, and a missing key only lowers the sum. A level marked ``tied`` ([R, L]
        bool) holds keys whose logit is computed exactly as the target's (the same products of the
        same values: its box is the target's) and is exempt: they share the maximum. Returns (target
        weight [R], weight of each key at each level [R, L]) as boxes; a level with optional keys has
        lower bound 0."""
        counts, optional = _row_counts(counts, optional)
        present = (counts + optional) > 0
        free = present if tied is None else present & ~np.broadcast_to(np.asarray(tied, dtype=bool), present.shape)
        if np.any(free & ~(np.asarray(target.lo)[:, None] > np.asarray(levels.hi))):
            raise ValueError("row_weights: the target is not the strict maximum of every row")
        zero = np.zeros_like(np.asarray(target.lo))
        d = self.sub(levels, Box(np.asarray(target.lo)[:, None], np.asarray(target.hi)[:, None]))
        e = self.exp(d)
        e0 = self.exp(Box(zero, zero))
        lo = self.saturate(np.asarray(e0.lo).astype(object) + (np.where(counts > 0, e.lo, 0).astype(object) * counts).sum(axis=1))
        hi = self.saturate(np.asarray(e0.hi).astype(object)
                           + (np.where(present, e.hi, 0).astype(object) * (counts + optional)).sum(axis=1))
        Z = Box(self._arr(lo), self._arr(hi))
        w_t = self.div(e0, Z)
        w_l = self.div(e, Box(np.asarray(Z.lo)[:, None], np.asarray(Z.hi)[:, None]))
        w_l = Box(np.where(present & (optional == 0), w_l.lo, 0), np.where(present, w_l.hi, 0))
        return w_t, w_l

    def uniform_weight(self, T: int) -> Box:
        """The weight every key gets in a row of T equal logits: div(e(0), sat(T e(0)))."""
        e0 = self._arr(self.fmt.exp(np.zeros(1, dtype=np.int64)))
        Z = self.saturate(np.array([int(e0[0]) * T], dtype=object))
        w = self.array(self._arr(self.fmt.div(e0, Z))[0])
        return Box(w, w)

    def code_logits(self, P: Box, I: np.ndarray, c: Box, k: int, n_dims: int) -> Box:
        """Logits of a head whose k code dims each contribute +-P (or 0) and whose bias-only dims
        contribute c in total, for integer code inner products I: exactly sat(P * I + c)."""
        v = self.saturate(int(np.asarray(P.lo)) * np.asarray(I).astype(object) + int(np.asarray(c.lo)))
        v = self.array(v)
        return Box(v, v)


# ================================================================================================
# floating point and exact reals
# ================================================================================================

#: torch's elementwise exp is within this many units in the last place of e^x (CUDA expf: 2 ulp,
#: CUDA C++ Programming Guide, "Mathematical Functions"; glibc exp/expf: 1 ulp, glibc manual
#: "Known Maximum Errors in Math Functions"; PyTorch's vectorised CPU kernels use SLEEF's u10
#: functions, 1.0 ulp). Certificates assume twice the largest documented bound; tests/test_float_arithmetics.py
#: measures torch's exp against exact values on many arguments.
EXP_ULPS = 4


class FloatArithmetic(Arithmetic):
    """Enclosures of what a float forward pass computes (``dtype`` one of :data:`FLOAT_DTYPES`, as
    torch runs the exported model on the CPU), or of the exact real forward pass (``dtype=None``).

    Values are float64 arrays; every operation returns a box containing the computed result for
    every input in the operand boxes, whatever the summation order and whether or not products are
    fused: a single rounding is monotone, so ``fl(op(a, b))`` lies in
    ``[RD(min op), RU(max op)]`` (RD/RU: rounding down/up to the dtype's grid); a dot product or sum
    of n terms satisfies ``|fl(sum) - sum| <= gamma_n * sum |terms|`` with ``gamma_n = n u / (1 - n u)``
    for any order (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Thm 3.1 and
    §3.1), and also ``<= (1 + 2 gamma_n) * (sum |terms| - max |term|)`` (each rounded addition of
    two floats errs by at most the smaller operand; see :meth:`sum`), and exp is within :data:`EXP_ULPS` ulps. The real values themselves are enclosed by
    computing in float64 with the same bounds (u = 2^-53). Weights are the values torch uses: the
    correctly rounded float64 of the exact weight, then converted to the dtype (the reduced dtypes
    through float32; ``dtype=None``: the exact weight, enclosed with a relative slack of 2^-53 when it
    is not a float64 value).

    **Storage and accumulation.** For the reduced dtypes (bfloat16, float16, float8) torch's CPU
    kernels compute in float32 and round each stored tensor once to the dtype: a matrix product or
    sum accumulates in float32 (``u_acc = 2^-24``) and its result is rounded to the dtype
    (``u``); a softmax runs in float32 (max, exp, sum, division) and rounds the weights; an
    elementwise add rounds the float32 result. So ``sum``, ``matmul`` and ``code_logits`` take
    their summation error with ``u_acc`` and round the result to the dtype, ``row_weights`` and
    ``uniform_weight`` are float32's rounded to the dtype, and ``add``/``sub``/``mul``/``div``
    round to the dtype (a float32 result rounded again lies in the same [RD, RU]: the dtype's grid
    is part of float32's). For float32 and float64 the two are the same."""

    exact = False

    def __init__(self, dtype: str | None):
        if dtype is not None and dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(FLOAT_DTYPES)} or None (exact reals), got {dtype!r}")
        self.dtype = dtype
        self.name = dtype or "real"
        self.grid = GRIDS[dtype] if dtype else None
        self.acc_grid = GRIDS[self.grid.compute] if dtype else None
        self.u = self.grid.u if dtype else 0.0
        self.u_acc = self.acc_grid.u if dtype else 0.0
        self.u64 = 2.0**-53
        self.tiny = self.grid.tiny if dtype else 0.0
        self.tiny_acc = self.acc_grid.tiny if dtype else 0.0
        #: the arithmetic of the compute dtype (float32) that softmax rows run in, or None
        self.inner = FloatArithmetic(self.grid.compute) if dtype and self.grid.compute != dtype else None
        self.min_raw, self.max_raw = -np.inf, np.inf
        self.wide = False
        self.slack = 0.0  # relative enclosure error of the weights (reals: 2^-53 when any is inexact)

    # ---- values --------------------------------------------------------------------------------
    def _cast(self, x: np.ndarray) -> np.ndarray:
        """float64 values as torch holds them in the dtype (float64 results)."""
        return round_via_float32(x, self.grid) if self.dtype else np.asarray(x, np.float64)

    def weight(self, num: np.ndarray, den: int) -> np.ndarray:
        num = np.asarray(num)
        uniq, inv = np.unique(num, return_inverse=True)
        exact = [Fraction(int(v), int(den)) for v in uniq]
        w64 = np.array([float(f) for f in exact], dtype=np.float64)
        if self.dtype is None and any(Fraction(float(f)) != f for f in exact):
            self.slack = 2.0**-53
        return self._cast(w64)[inv.reshape(-1)].reshape(num.shape)

    def const(self, v: Fraction) -> float:
        return float(self._cast(np.array([float(Fraction(v))]))[0])

    def to_fraction(self, x: Any) -> Any:
        arr = np.asarray(x, dtype=np.float64)
        if arr.ndim == 0:
            return Fraction(float(arr))
        return np.array([Fraction(float(v)) for v in arr.reshape(-1)], dtype=object).reshape(arr.shape)

    def one(self) -> float:
        return 1.0

    def array(self, values: Any) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def saturate(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64)

    # ---- rounding --------------------------------------------------------------------------------
    def _down(self, x: np.ndarray, acc: bool = False) -> np.ndarray:
        """A value <= every rounding of the real numbers >= x (x a float64 lower bound) to the
        dtype's grid (``acc``: the accumulation grid); beyond the range, as the dtype overflows."""
        grid = self.acc_grid if acc else self.grid
        return np.asarray(x, np.float64) if grid is None else grid.round(x, "down")

    def _up(self, x: np.ndarray, acc: bool = False) -> np.ndarray:
        grid = self.acc_grid if acc else self.grid
        return np.asarray(x, np.float64) if grid is None else grid.round(x, "up")

    def _out(self, lo: np.ndarray, hi: np.ndarray, zero: Any = False, acc: bool = False) -> Box:
        """A box around one rounded operation whose exact result lies in [lo, hi] (lo, hi computed
        in float64 with round-to-nearest: widened by one float64 ulp first), rounded to the dtype
        (``acc``: to the accumulation grid). Where ``zero`` (a mask)
        the result is known to be exactly 0 (an operation with an exact-zero operand: x * 0, x + 0
        and a sum of zeros are exact in IEEE arithmetic) and is returned as the point 0."""
        lo = np.nextafter(np.asarray(lo, np.float64), -np.inf)
        hi = np.nextafter(np.asarray(hi, np.float64), np.inf)
        lo, hi = np.where(np.isnan(lo), -np.inf, lo), np.where(np.isnan(hi), np.inf, hi)  # inf - inf: unbounded
        lo, hi = self._down(lo, acc), self._up(hi, acc)
        if np.any(zero):
            lo, hi = np.where(zero, 0.0, lo), np.where(zero, 0.0, hi)
        return Box(lo, hi)

    def _stored(self, b: Box) -> Box:
        """A box of values of the accumulation grid, rounded once more to the dtype (the result of a
        float32 computation stored in a reduced dtype); unchanged for float32, float64 and reals."""
        if self.inner is None:
            return b
        return Box(self._down(b.lo), self._up(b.hi))

    @staticmethod
    def _is_zero(a: Box) -> np.ndarray:
        """Where the box is exactly the point 0."""
        return (np.asarray(a.lo) == 0) & (np.asarray(a.hi) == 0)

    def _gamma(self, n: Any, u: float) -> Any:
        n = np.asarray(n, dtype=np.float64)
        return n * u / np.maximum(1.0 - n * u, 1e-300)

    # ---- box operations ------------------------------------------------------------------------
    def add(self, a: Box, b: Box) -> Box:
        za, zb = self._is_zero(a), self._is_zero(b)
        out = self._out(np.asarray(a.lo) + np.asarray(b.lo), np.asarray(a.hi) + np.asarray(b.hi), za & zb)
        if not (np.any(za) or np.any(zb)):
            return out
        # x + 0 = x exactly: keep the other operand's box (itself an enclosure of a dtype value)
        lo = np.where(zb, np.asarray(a.lo), np.where(za, np.asarray(b.lo), out.lo))
        hi = np.where(zb, np.asarray(a.hi), np.where(za, np.asarray(b.hi), out.hi))
        return Box(lo, hi)

    def sub(self, a: Box, b: Box) -> Box:
        return self._out(np.asarray(a.lo) - np.asarray(b.hi), np.asarray(a.hi) - np.asarray(b.lo))

    def relu(self, a: Box) -> Box:
        return Box(np.maximum(a.lo, 0.0), np.maximum(a.hi, 0.0))

    def _corners(self, a: Box, b: Box, op) -> tuple[np.ndarray, np.ndarray]:
        """The smallest and largest of op at the four corners; 0 * inf is 0 (an unbounded side is a
        bound on finite values, and a finite value times 0 is 0)."""
        with np.errstate(invalid="ignore"):
            c = [np.nan_to_num(op(np.asarray(x, np.float64), np.asarray(y, np.float64)), nan=0.0, posinf=np.inf,
                               neginf=-np.inf) for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
        return np.minimum(np.minimum(c[0], c[1]), np.minimum(c[2], c[3])), np.maximum(np.maximum(c[0], c[1]), np.maximum(c[2], c[3]))

    def mul(self, a: Box, b: Box, acc: bool = False) -> Box:
        """Rounded products (``acc``: rounded to the accumulation grid, as the products inside a
        matrix product are; exact there for the reduced dtypes' operands)."""
        lo, hi = self._corners(a, b, np.multiply)
        if self.slack:
            m = np.maximum(np.abs(lo), np.abs(hi)) * self.slack
            lo, hi = lo - m, hi + m
        return self._out(lo, hi, self._is_zero(a) | self._is_zero(b), acc)

    def div(self, a: Box, b: Box) -> Box:
        if np.any(np.asarray(b.lo) <= 0):
            raise ValueError("div: divisor boxes must be positive")
        lo, hi = self._corners(a, b, np.divide)
        return self._out(lo, hi)

    def exp(self, a: Box) -> Box:
        """exp within EXP_ULPS ulps (reduced dtypes: float32's exp, rounded to the dtype)."""
        if self.inner is not None:
            return self._stored(self.inner.exp(a))
        rel = (2 ** (EXP_ULPS + 1)) * max(self.u, self.u64) if self.dtype else 4 * self.u64
        lo = np.exp(np.asarray(a.lo, np.float64)) * (1 - rel)
        hi = np.exp(np.asarray(a.hi, np.float64)) * (1 + rel)
        return Box(self._down(np.maximum(lo - self.tiny, 0.0)), self._up(hi + self.tiny))

    def sum(self, terms: Box, axis: int = -1, counts: np.ndarray | None = None) -> Box:
        """A sum of (already rounded) terms, each taken ``counts`` times, in any order: the exact
        sum's enclosure widened by gamma_n * sum |terms|, n the number of terms that are not exactly
        0 (adding an exact 0 is exact, so only the other terms' additions round; a sum of zeros is 0).
        The sum accumulates with ``u_acc`` (float32 for the reduced dtypes) and is then rounded to
        the dtype."""
        lo, hi = np.asarray(terms.lo, np.float64), np.asarray(terms.hi, np.float64)
        c = np.ones(1) if counts is None else np.asarray(counts, dtype=np.float64)
        shape = np.broadcast_shapes(lo.shape, c.shape)
        lo, hi, c = np.broadcast_to(lo, shape), np.broadcast_to(hi, shape), np.broadcast_to(c, shape)
        mag_j = np.maximum(np.abs(lo), np.abs(hi))
        n = np.sum(c * (mag_j > 0), axis=axis)
        slo, shi = np.sum(lo * c, axis=axis), np.sum(hi * c, axis=axis)
        mag = np.sum(mag_j * c, axis=axis)
        # every rounded addition fl(A + B) of floats is within min(u |A + B|, |A|, |B|) of A + B (A and B
        # are floats themselves); along the path of the largest term each error is at most its side
        # branch's magnitude, elsewhere u times its result: the error is also <= (1 + 2 gamma_n) times
        # the sum of the terms other than the largest (a softmax normaliser 1 + tiny terms: ~ the tiny sum)
        least = np.where(lo > 0, lo, np.where(hi < 0, -hi, 0.0))
        big = np.max(np.where(c > 0, least, 0.0), axis=axis)
        g = self._gamma(n, self.u_acc)
        with np.errstate(over="ignore", invalid="ignore"):  # n u >= 1: no bound (inf / nan), read as such
            rounding = np.minimum(g * mag, (1 + 2 * g) * np.maximum(mag - big, 0.0))
        err = rounding + self._gamma(n + 1, self.u64) * mag + n * self.tiny_acc
        return self._out(slo - err, shi + err, n == 0)

    def matmul(self, x: Box, W: np.ndarray) -> Box:
        W = np.asarray(W, dtype=np.float64)
        n, m = W.shape
        lead = x.shape[:-1]
        if n == 0:
            z = np.zeros(lead + (m,))
            return Box(z, z)
        rows = np.flatnonzero(np.any(W != 0, axis=1))
        if rows.size == 0:
            z = np.zeros(lead + (m,))
            return Box(z, z)
        lo, hi = np.asarray(x.lo)[..., rows, None], np.asarray(x.hi)[..., rows, None]
        p = self.mul(Box(lo, hi), Box.point(W[rows]), acc=True)
        return self.sum(p, axis=-2, counts=None)

    def affine(self, x: Box, W: np.ndarray, b: np.ndarray) -> Box:
        b = np.asarray(b, dtype=np.float64)
        return self.add(self.matmul(x, W), Box(b, b))

    # ---- attention rows --------------------------------------------------------------------------
    def row_weights(self, target: Box, levels: Box, counts: np.ndarray,
                    optional: np.ndarray | None = None, tied: np.ndarray | None = None) -> tuple[Box, Box]:
        """As :meth:`FixedArithmetic.row_weights`, for torch's softmax: m = max (the target),
        e_j = exp(l_j - m) rounded, Z = sum e (any order), w_j = e_j / Z rounded; an optional key's
        term lies in [0, e_j] (absent, or present). A tied level's keys lie in the target's box, so
        l_j - m lies in [lo - hi, 0] (the maximum is one of them, its term exactly 1). Reduced dtypes:
        all of it in float32 (torch's CPU softmax kernel), the weights rounded to the dtype."""
        if self.inner is not None:
            w_t, w_l = self.inner.row_weights(target, levels, counts, optional, tied)
            return self._stored(w_t), self._stored(w_l)
        counts, optional = _row_counts(counts, optional)
        present = (counts + optional) > 0
        free = present if tied is None else present & ~np.broadcast_to(np.asarray(tied, dtype=bool), present.shape)
        if np.any(free & ~(np.asarray(target.lo)[:, None] > np.asarray(levels.hi))):
            raise ValueError("row_weights: the target is not the strict maximum of every row")
        d = self.sub(levels, Box(np.asarray(target.hi)[:, None], np.asarray(target.lo)[:, None]))
        d = Box(np.minimum(d.lo, 0.0), np.minimum(d.hi, 0.0))  # l_j - m <= 0 and it rounds to <= 0
        e = self.exp(d)
        one = np.ones(counts.shape[0])
        held, maybe = np.where(counts > 0, e.hi, 0.0), np.where(optional > 0, e.hi, 0.0)
        terms = Box(np.concatenate([one[:, None], np.where(counts > 0, e.lo, 0.0), np.zeros_like(maybe)], axis=1),
                    np.concatenate([one[:, None], held, maybe], axis=1))
        Z = self.sum(terms, axis=1, counts=np.concatenate([one[:, None], counts, optional], axis=1))
        e = Box(np.where(present & (optional == 0), e.lo, 0.0), np.where(present, e.hi, 0.0))
        if not np.all(np.asarray(Z.lo) > 0):  # the a-priori summation bound is vacuous (n u >= 1)
            return Box(np.zeros_like(one), one), Box(np.zeros(present.shape), present.astype(np.float64))
        # torch divides by Z, or multiplies by a rounded 1/Z (its vectorised CPU kernel): two roundings
        r = self.div(Box(one, one), Z)
        w_t = self.mul(Box(one, one), r)
        w_l = self.mul(e, Box(np.asarray(r.lo)[:, None], np.asarray(r.hi)[:, None]))
        return Box(np.minimum(w_t.lo, 1.0), np.minimum(w_t.hi, 1.0)), Box(np.where(present, w_l.lo, 0.0), np.where(present, w_l.hi, 0.0))

    def uniform_weight(self, T: int) -> Box:
        """A row of T equal logits: e = exp(0) = 1, Z = T (exact while T < 2^24 for float32), w = 1/T
        (reduced dtypes: float32's, rounded to the dtype)."""
        if self.inner is not None:
            return self._stored(self.inner.uniform_weight(T))
        return self.div(Box.point(np.array(1.0)), Box.point(np.array(float(T))))

    def code_logits(self, P: Box, I: np.ndarray, c: Box, k: int, n_dims: int) -> Box:
        """Logits sum_d q_d k_d over n_dims head dims, k of which contribute +-P and the rest c in
        total: the real value P * I + c, and the rounding of a dot product of n_dims terms (accumulated
        with ``u_acc``, then rounded to the dtype), plus 4u relative for TransformerLens' bridge (it
        multiplies W_Q by sqrt(d_head), rounded, and divides the scores by it again)."""
        I = np.asarray(I, dtype=np.float64)
        lo, hi = self._corners(Box(P.lo, P.hi), Box(I, I), np.multiply)
        mag = k * max(abs(float(np.asarray(P.lo))), abs(float(np.asarray(P.hi)))) + \
            max(abs(float(np.asarray(c.lo))), abs(float(np.asarray(c.hi))))
        err = (self._gamma(n_dims, self.u_acc) + self._gamma(n_dims + 2, self.u64) + 4 * self.u) * mag + n_dims * self.tiny_acc
        return self._out(lo + float(np.asarray(c.lo)) - err, hi + float(np.asarray(c.hi)) + err)


def arithmetic(name: str, fmt: Format | None = None) -> Arithmetic:
    """"fixed" (the fixed-point format ``fmt``), "real", or a float dtype of :data:`FLOAT_DTYPES`."""
    if name == "fixed":
        if fmt is None or not fmt.is_exact:
            raise ValueError("the fixed arithmetic needs a fixed-point format")
        return FixedArithmetic(fmt)
    if name in FLOAT_DTYPES:
        return FloatArithmetic(name)
    if name == "real":
        return FloatArithmetic(None)
    raise ValueError(f"arithmetic must be one of fixed, real, {', '.join(FLOAT_DTYPES)}; got {name!r}")
