"""Slow exact reference semantics of the fixed-point formats, with ``fractions.Fraction`` only.

This module shares no code with the fast implementation (it does not import it): a format is
described by a :class:`Grid` (scale S, raw range, rounding) and every operation is written directly
from the definitions in docs/precision.md on Python ints and Fractions. The exponential is computed
from rational Taylor bounds with outward-rounded squaring (no floats, no mpmath), refined until the
rounded result is decided. The tests compare the fast paths against this module element by element.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Grid:
    scale: int
    min_raw: int
    max_raw: int
    nearest: bool = False

    @staticmethod
    def of(fmt) -> "Grid":
        """Read the four numbers off a FixedPoint (only its public attributes)."""
        return Grid(fmt.scale, fmt.min_raw, fmt.max_raw, fmt.rounding == "nearest-even")

    # ---- rounding -------------------------------------------------------------------------------
    def round_raw(self, v: Fraction) -> int:
        """The raw value (unsaturated) of the exact value v, rounded to the grid."""
        q = Fraction(v) * self.scale
        f = q.numerator // q.denominator
        if self.nearest:
            r = q - f
            if r > Fraction(1, 2) or (r == Fraction(1, 2) and f % 2 == 1):
                f += 1
        return f

    def sat(self, r: int) -> tuple[int, int]:
        if r > self.max_raw:
            return self.max_raw, 1
        if r < self.min_raw:
            return self.min_raw, 1
        return r, 0

    def value(self, raw: int) -> Fraction:
        return Fraction(raw, self.scale)

    def finish(self, v: Fraction) -> tuple[int, int, int]:
        """(raw, saturated?, underflowed?) of the exact value v."""
        r = self.round_raw(v)
        und = int(r == 0 and v != 0)
        r, s = self.sat(r)
        return r, s, und

    # ---- ops on raw ints, returning (raw, saturations, underflows) -----------------------------
    def add(self, a: int, b: int):
        return self.finish(self.value(a) + self.value(b))

    def sub(self, a: int, b: int):
        return self.finish(self.value(a) - self.value(b))

    def mul(self, a: int, b: int):
        return self.finish(self.value(a) * self.value(b))

    def div(self, a: int, b: int):
        return self.finish(self.value(a) / self.value(b))

    def relu(self, a: int):
        return (max(a, 0), 0, 0)

    def exp(self, a: int):
        r = exp_round(Fraction(a, self.scale), self.scale, self.nearest, self.max_raw + 1)
        und = int(r == 0)
        r, s = self.sat(r)
        return r, s, und

    def sum(self, xs: list[int]):
        r, s = self.sat(sum(xs))
        return r, s, 0

    def dot(self, xs: list[int], ys: list[int], accumulate: str = "rounded-products"):
        if accumulate == "exact":
            return self.finish(sum((self.value(x) * self.value(y) for x, y in zip(xs, ys)), Fraction(0)))
        tot, und = 0, 0
        for x, y in zip(xs, ys):
            p = self.value(x) * self.value(y)
            r = self.round_raw(p)
            und += int(r == 0 and p != 0)
            tot += r
        r, s = self.sat(tot)
        return r, s, und

    def matmul(self, A: list[list[int]], B: list[list[int]], accumulate: str = "rounded-products"):
        m, k, n = len(A), len(B), len(B[0]) if B else 0
        out, S, U = [], 0, 0
        for i in range(m):
            row = []
            for j in range(n):
                r, s, u = self.dot(A[i], [B[t][j] for t in range(k)], accumulate)
                row.append(r)
                S += s
                U += u
            out.append(row)
        return out, S, U

    def softmax(self, xs: list[int]):
        """App. D: subtract the max (exact, saturated), exp (rounded), sum (exact, saturated),
        divide (rounded), saturate."""
        m = max(xs)
        S = U = 0
        es = []
        for x in xs:
            d, s = self.sat(x - m)
            S += s
            e, s, u = self.exp(d)
            S += s
            U += u
            es.append(e)
        Z, s = self.sat(sum(es))
        S += s
        out = []
        for e in es:
            r, s, u = self.finish(self.value(e) / self.value(Z))
            S += s
            U += u
            out.append(r)
        return out, S, U


# ---- exact exponential from rational bounds ------------------------------------------------------


def _floor_to(x: Fraction, K: int) -> Fraction:
    return Fraction((x.numerator << K) // x.denominator, 1 << K)


def _ceil_to(x: Fraction, K: int) -> Fraction:
    return Fraction(-((-x.numerator << K) // x.denominator), 1 << K)


def exp_bounds(q: Fraction, K: int) -> tuple[Fraction, Fraction]:
    """Rationals L <= e^q <= U, about K bits wide."""
    a = abs(q)
    j = 0
    while a / (1 << j) > Fraction(1, 2):
        j += 1
    r = a / (1 << j)  # 0 <= r <= 1/2
    term, s, i = Fraction(1), Fraction(0), 0
    # Taylor: e^r = sum r^i/i!, remainder <= 2 r^(N+1)/(N+1)! for r <= 1/2
    while True:
        s += term
        i += 1
        term = term * r / i
        if term * 2 < Fraction(1, 1 << (K + 8)):
            break
    lo, hi = _floor_to(s, K + 8), _ceil_to(s + 2 * term, K + 8)
    for _ in range(j):
        lo, hi = _floor_to(lo * lo, K + 8), _ceil_to(hi * hi, K + 8)
    if q < 0:
        lo, hi = 1 / hi, 1 / lo
    return lo, hi


def exp_round(q: Fraction, S: int, nearest: bool, cap: int) -> int:
    """round(e^q * S) (floor or nearest; ties cannot occur for q != 0), or ``cap`` if >= cap."""
    if q == 0:
        return min(S, cap)
    off = Fraction(1, 2) if nearest else Fraction(0)
    # shortcuts that avoid astronomically large intermediate numbers: e >= 2
    if q < 0:
        fq = (-q).numerator // (-q).denominator  # e^q <= 2^-floor(|q|)
        if Fraction(S, 1 << min(fq, 1 << 20)) + off < 1 and fq > 0:
            return 0
    else:
        fq = q.numerator // q.denominator  # e^q >= 2^floor(q)
        if fq.bit_length() > 20 or S * (1 << fq) >= cap:
            return cap
    K = 64 + S.bit_length() + cap.bit_length()
    while True:
        lo, hi = exp_bounds(q, K)
        a, b = lo * S + off, hi * S + off
        fa = a.numerator // a.denominator
        if fa >= cap:
            return cap
        fb = b.numerator // b.denominator
        if fa == fb:
            return fa
        K *= 2
