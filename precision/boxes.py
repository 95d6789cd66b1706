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
from .parse import parse_format


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
    def row_weights(self, target: Box, levels: Box, counts: np.ndarray) -> tuple[Box, Box]:
        """Softmax weights of rows given by a target logit and, per level, ``counts`` other keys
        with logits in ``levels`` ([R] and [R, L] boxes). Requires the target to be the strict row
        maximum (``target.lo > levels.hi`` wherever counts > 0), so that the forward pass subtracts
        the target's logit: then every weight is monotone in every logit difference. Returns
        (target weight [R], weight of each key at each level [R, L]) as boxes."""
        counts = np.asarray(counts)
        present = counts > 0
        if np.any(present & ~(np.asarray(target.lo)[:, None] > np.asarray(levels.hi))):
            raise ValueError("row_weights: the target is not the strict maximum of every row")
        zero = np.zeros_like(np.asarray(target.lo))
        d = self.sub(levels, Box(np.asarray(target.lo)[:, None], np.asarray(target.hi)[:, None]))
        e = self.exp(d)
        e0 = self.exp(Box(zero, zero))
        lo = self.saturate(np.asarray(e0.lo).astype(object) + (np.where(present, e.lo, 0).astype(object) * counts).sum(axis=1))
        hi = self.saturate(np.asarray(e0.hi).astype(object) + (np.where(present, e.hi, 0).astype(object) * counts).sum(axis=1))
        Z = Box(self._arr(lo), self._arr(hi))
        w_t = self.div(e0, Z)
        w_l = self.div(e, Box(np.asarray(Z.lo)[:, None], np.asarray(Z.hi)[:, None]))
        w_l = Box(np.where(present, w_l.lo, 0), np.where(present, w_l.hi, 0))
        return w_t, w_l

    def uniform_weight(self, T: int) -> int:
        """The weight every key gets in a row of T equal logits: div(e(0), sat(T e(0)))."""
        e0 = self._arr(self.fmt.exp(np.zeros(1, dtype=np.int64)))
        Z = self.saturate(np.array([int(e0[0]) * T], dtype=object))
        return int(self._arr(self.fmt.div(e0, Z))[0])
