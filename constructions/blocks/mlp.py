"""Threshold MLPs (bit, XOR, pattern) and the local certificate all MLP blocks share.

Blocks (each writes its own output slot; biases are exact grid values in every binary format with
at least one fraction bit):

* :class:`BitThreshold` (App. C.2, Theorem 1): per coordinate ``b = relu(2z - 1/2) - relu(2z - 3/2)``,
  exactly 0 for ``z <= 1/4`` and 1 for ``z >= 3/4``;
* :class:`XorMLP` (App. F.2, Theorem 6): ``m = 2 relu(d - 1/2) - 2 relu(d - 1) + 2 relu(-d - 1/2)
  - 2 relu(-d - 1)``, ``d = a - b``: 0 for ``|d| <= 1/2``, 1 for ``|d| >= 1``;
* :class:`PatternMLP` (App. F.3, Theorem 13): for a feature function of arity r and each input
  pattern u it accepts, ``relu(2t) - relu(2t - 1)`` with ``t = sum_h s_h y_h - (r - 1)`` (``s = 2u - 1``)
  [+ the feature type's sign column]: 1 iff the inputs match u (and the type matches), else 0.

Local certificate (:func:`mlp_image`): the exact image of the MLP over a view's boxes. Units whose
input weights are equal share one pre-activation sum ``P`` (the same rounded products of the same
inputs); an output column fed only by units of one such group is a function of ``P`` alone, and
when its output weights are multiples of the grid scale (exact products) it is piecewise linear in
``P`` with kinks where a unit's pre-activation crosses 0 or saturates, so its exact range is the
range over the interval's ends and the kinks inside. Other columns get the plain box image
(sound, exact at points).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, MLPBlock
from exactformer.constructions.core.views import unique_rows
from exactformer.precision.boxes import Arithmetic, Box, FloatArithmetic


@block
@dataclass(frozen=True)
class BitThreshold(MLPBlock):
    """Bits of ``inp`` thresholded at 1/2 into ``out`` (tolerates |z - bit| <= 1/4)."""

    inp: str
    out: str
    TOLERANCE = Fraction(1, 4)

    def emit(self, mb: Any, layer: int) -> None:
        m = mb.layout[self.inp].size
        W_in = np.zeros((m, 2 * m), dtype=np.int64)
        W_out = np.zeros((2 * m, m), dtype=np.int64)
        for j in range(m):
            W_in[j, 2 * j] = W_in[j, 2 * j + 1] = 2
            W_out[2 * j, j], W_out[2 * j + 1, j] = 1, -1
        b_in = (np.tile([-1, -3], m), 2)
        mb.mlp(self, layer, W_in=[(self.inp, W_in)], b_in=b_in, W_out=[(self.out, W_out)], n_units=2 * m)


@block
@dataclass(frozen=True)
class XorMLP(MLPBlock):
    """``out = [a != b]`` for a, b in {-1, 1} (tolerates |a - b| error <= 1/2 around 0 and 2)."""

    a: str
    b: str
    out: str
    TOLERANCE = Fraction(1, 2)

    def emit(self, mb: Any, layer: int) -> None:
        mb.mlp(self, layer, W_in=[(self.a, np.array([[1, 1, -1, -1]])), (self.b, np.array([[-1, -1, 1, 1]]))],
               b_in=(np.array([-1, -2, -1, -2]), 2), W_out=[(self.out, np.array([[2], [-2], [2], [-2]]))], n_units=4)


@block
@dataclass(frozen=True)
class PatternMLP(MLPBlock):
    """Feature values g(y_1 .. y_r) of several function types (thresholds of k-sparse features).

    ``inputs``: the slots y_1..y_k (+-1 values); ``types``: for each type its arity r and truth
    table (2^r bits, input bits read most significant first); ``type_slot``: a slot of +-1 signs,
    one column per type (only with two or more types), +1 in the column of a position's type."""

    inputs: tuple[str, ...]
    out: str
    arities: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]
    type_slot: str = ""

    @property
    def tolerance(self) -> Fraction:
        return Fraction(1, 2 * max(max(self.arities), 1))

    def emit(self, mb: Any, layer: int) -> None:
        k, G = len(self.inputs), len(self.arities)
        patterns = [(tau, r, [2 * v - 1 for v in ((code >> (r - 1 - h)) & 1 for h in range(r))])
                    for tau, (r, table) in enumerate(zip(self.arities, self.tables))
                    for code, v in enumerate(table) if v]
        U = 2 * len(patterns)
        if U == 0:
            return
        W_y = np.zeros((k, U), dtype=np.int64)
        W_t = np.zeros((G, U), dtype=np.int64)
        b_in = np.zeros(U, dtype=np.int64)
        W_out = np.tile(np.array([[1], [-1]], dtype=np.int64), (len(patterns), 1))
        for u, (tau, r, s) in enumerate(patterns):
            W_y[:r, 2 * u] = W_y[:r, 2 * u + 1] = 2 * np.asarray(s)
            bias = -2 * (r - 1)
            if G >= 2:
                W_t[tau, 2 * u] = W_t[tau, 2 * u + 1] = 2
                bias -= 2
            b_in[2 * u], b_in[2 * u + 1] = bias, bias - 1
        W_in = [(slot, W_y[h : h + 1]) for h, slot in enumerate(self.inputs)]
        if G >= 2:
            W_in.append((self.type_slot, W_t))
        mb.mlp(self, layer, W_in=W_in, b_in=b_in, W_out=[(self.out, W_out)], n_units=U)


# ------------------------------------------------------------------------------------------------
# the shared local certificate
# ------------------------------------------------------------------------------------------------


def mlp_image(arith: Arithmetic, x: Box, W_in: np.ndarray, b_in: np.ndarray, W_out: np.ndarray,
              b_out: np.ndarray) -> Box:
    """The box of ``add(matmul(relu(add(matmul(x, W_in), b_in)), W_out), b_out)`` over x in the
    box ``x`` [..., n] (see the module docstring). W_in [n, U], W_out [U, m]."""
    pre = arith.affine(x, W_in, b_in)
    out = arith.affine(arith.relu(pre), W_out, b_out)
    if x.is_point():
        return out
    lo, hi = np.array(out.lo, copy=True), np.array(out.hi, copy=True)
    # units whose input weights are +- one vector read one pre-activation P (or -P)
    Wt = np.asarray(W_in).T
    first = np.array([row[np.flatnonzero(row)[0]] if np.any(row) else 1 for row in Wt])
    sign = np.where(np.asarray(first > 0), 1, -1)
    _, group = unique_rows(Wt * sign[:, None])
    exact = getattr(arith, "exact", False)
    S = arith.const(Fraction(1))
    for c in range(W_out.shape[1]):
        units = np.flatnonzero(W_out[:, c])
        if units.size == 0:
            continue
        parts = []
        for g in np.unique(group[units]):
            gu = units[group[units] == g]
            w_vec = Wt[gu[0]] * sign[gu[0]]
            if exact and (np.any(W_out[gu, c] % S != 0) or (np.any(sign[gu] < 0) and np.any(w_vec % S != 0))):
                parts = None  # -P, or the products, would round: no exact refinement
                break
            parts.append((w_vec, gu))
        if parts is None:
            continue
        r = (_exact_column if exact else _float_column)(arith, x, parts, sign, b_in, W_out[:, c], b_out[c])
        lo[..., c], hi[..., c] = np.maximum(r.lo, lo[..., c]), np.minimum(r.hi, hi[..., c])
    return Box(lo, hi)


def _pl_candidates(Plo: np.ndarray, Phi: np.ndarray, kinks: np.ndarray, dtype: Any) -> np.ndarray:
    """Every point where a piecewise linear function of P on [Plo, Phi] can have an extreme:
    the ends and the kinks inside (clipped to the interval)."""
    cands = [Plo, Phi] + [np.clip(np.full(np.shape(Plo), k, dtype=dtype), Plo, Phi) for k in kinks]
    return np.stack([np.asarray(c, dtype=dtype) for c in cands], axis=-1)


def _exact_column(arith: Any, x: Box, parts: list, sign: np.ndarray, b_in: np.ndarray, w_out: np.ndarray,
                  b_out: Any) -> Box:
    """Fixed point: column = add(sat(sum_u mul(relu(add(s_u P_g, b_u)), w_u)), b_out) with exact
    products (w_u multiples of the scale): each group's part is a piecewise linear function of its
    P_g (kinks where a pre-activation crosses 0 or saturates), exact at its ends and kinks; the
    parts of different groups add (each part's extremes are attained independently of the other
    groups' only when the groups read disjoint inputs, so the sum of ranges is sound, not always
    tight)."""
    wide = getattr(arith, "wide", False)
    tot_lo = tot_hi = 0
    for w_vec, gu in parts:
        P = arith.matmul(x, np.asarray(w_vec)[:, None])
        Plo, Phi = np.asarray(P.lo)[..., 0], np.asarray(P.hi)[..., 0]
        s_, b = sign[gu], np.asarray(b_in)[gu]
        kinks = np.unique(np.concatenate([-s_ * b, s_ * (arith.max_raw - b), s_ * (arith.min_raw - b)]).astype(object))
        C = _pl_candidates(Plo, Phi, kinks, object if wide else Plo.dtype)
        pre = arith.add(Box.point(C[..., None] * s_), Box.point(b))  # [..., n_cand, units]
        prod = arith.mul(arith.relu(pre), Box.point(np.asarray(w_out)[gu]))
        part = np.sum(np.asarray(prod.lo).astype(object), axis=-1)  # exact, unsaturated
        tot_lo = tot_lo + np.min(part, axis=-1)
        tot_hi = tot_hi + np.max(part, axis=-1)
    b = Box.point(arith.array(b_out))
    return arith.add(Box(arith.saturate(tot_lo), arith.saturate(tot_hi)), b)


def _float_column(arith: Any, x: Box, parts: list, sign: np.ndarray, b_in: np.ndarray, w_out: np.ndarray,
                  b_out: float) -> Box:
    """Float and real arithmetics: each group's units read +- the same real dot product
    P*_g = x . w_g (each computed separately, so each within e_P of it); the real part
    sum_u w_u relu(s_u P + b_u) is piecewise linear with kinks at -s_u b_u, so its range over P*_g's
    real range lies at the ends and kinks; the computed column differs from the real one by at most
    E = sum_u |w_u| (e_P + u (|P + b_u| + e_P))(1 + gamma_U) + gamma_U sum_u |w_u| |P + b_u| + u (|f| + |b_out|).
    Reduced dtypes (``arith.inner``: products accumulated with u_acc, each matrix product's result
    rounded to the dtype): e_P gains u (|P| + e_P) and the second product's result one more rounding."""
    real = FloatArithmetic(None)
    u = max(arith.u, arith.u64)
    reduced = getattr(arith, "inner", None) is not None
    n = np.asarray(x.lo).shape[-1]
    f_lo = f_hi = 0.0
    err = 0.0
    all_units = 0
    mags = []
    for w_vec, gu in parts:
        prods = real.mul(Box(np.asarray(x.lo)[..., :, None], np.asarray(x.hi)[..., :, None]),
                         Box.point(np.asarray(w_vec, dtype=np.float64)[:, None]))
        P = real.sum(prods, axis=-2)
        e_P = (arith._gamma(n, arith.u_acc) if arith.u_acc else 0.0) * np.sum(np.maximum(np.abs(prods.lo), np.abs(prods.hi)), axis=-2)[..., 0]
        Plo, Phi = np.asarray(P.lo)[..., 0], np.asarray(P.hi)[..., 0]
        if reduced:  # x @ W_in is stored in the dtype before b_in is added
            e_P = e_P + u * (np.maximum(np.abs(Plo), np.abs(Phi)) + e_P)
        sg = sign[gu].astype(np.float64)
        b = np.asarray(b_in, dtype=np.float64)[gu]
        w = np.asarray(w_out, dtype=np.float64)[gu]
        C = _pl_candidates(Plo, Phi, -sg * b, np.float64)
        f = np.sum(np.maximum(C[..., None] * sg + b, 0.0) * w, axis=-1)
        f_lo, f_hi = f_lo + np.min(f, axis=-1), f_hi + np.max(f, axis=-1)
        pmax = np.maximum(np.abs(Plo), np.abs(Phi))[..., None] + np.abs(b)
        err = err + np.sum(np.abs(w) * (e_P[..., None] + u * (pmax + e_P[..., None])), axis=-1)
        mags.append(np.sum(np.abs(w) * pmax, axis=-1))
        all_units += len(gu)
    mag = sum(mags)
    fmax = np.maximum(np.abs(f_lo), np.abs(f_hi))
    if reduced:  # accumulated in float32, stored in the dtype, then b_out added and stored again
        g = arith._gamma(all_units, max(arith.u_acc, arith.u64))
        E = err * (1 + g) + g * mag
        E = E + u * (fmax + E)
        E = E + u * (fmax + E + abs(float(b_out)))
        E = E + 4 * np.spacing(fmax + 1.0) + all_units * arith.tiny_acc
    else:
        g = arith._gamma(all_units + 1, u)
        E = err * (1 + g) + g * mag + u * (fmax + abs(float(b_out))) + 4 * np.spacing(fmax + 1.0) + all_units * arith.tiny
    return Box(f_lo + float(b_out) - E, f_hi + float(b_out) + E)
