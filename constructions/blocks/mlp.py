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

from exactformer.constructions.blocks.base import Block, register
from exactformer.constructions.views import unique_rows
from exactformer.precision.boxes import Arithmetic, Box


@register
@dataclass(frozen=True)
class BitThreshold(Block):
    """Bits of ``inp`` thresholded at 1/2 into ``out`` (tolerates |z - bit| <= 1/4)."""

    inp: str
    out: str
    kind = "mlp"
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


@register
@dataclass(frozen=True)
class XorMLP(Block):
    """``out = [a != b]`` for a, b in {-1, 1} (tolerates |a - b| error <= 1/2 around 0 and 2)."""

    a: str
    b: str
    out: str
    kind = "mlp"
    TOLERANCE = Fraction(1, 2)

    def emit(self, mb: Any, layer: int) -> None:
        mb.mlp(self, layer, W_in=[(self.a, np.array([[1, 1, -1, -1]])), (self.b, np.array([[-1, -1, 1, 1]]))],
               b_in=(np.array([-1, -2, -1, -2]), 2), W_out=[(self.out, np.array([[2], [-2], [2], [-2]]))], n_units=4)


@register
@dataclass(frozen=True)
class PatternMLP(Block):
    """Feature values g(y_1 .. y_r) of several function types (thresholds of k-sparse features).

    ``inputs``: the slots y_1..y_k (+-1 values); ``types``: for each type its arity r and truth
    table (2^r bits, input bits read most significant first); ``type_slot``: a slot of +-1 signs,
    one column per type (only with two or more types), +1 in the column of a position's type."""

    inputs: tuple[str, ...]
    out: str
    arities: tuple[int, ...]
    tables: tuple[tuple[int, ...], ...]
    type_slot: str = ""
    kind = "mlp"

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
    if x.is_point() or not getattr(arith, "exact", False):
        return out
    lo, hi = np.array(out.lo, copy=True), np.array(out.hi, copy=True)
    cols_u = [np.flatnonzero(W_out[:, c]) for c in range(W_out.shape[1])]
    _, group = unique_rows(np.asarray(W_in).T)
    S = arith.const(Fraction(1))
    for c, units in enumerate(cols_u):
        if units.size == 0 or np.unique(group[units]).size != 1 or np.any(W_out[units, c] % S != 0):
            continue
        g_units = np.flatnonzero(group == group[units[0]])
        P = arith.matmul(x, W_in[:, g_units[:1]])  # [..., 1] shared pre-activation sum (no bias)
        r = _univariate_range(arith, P, b_in[units], W_out[units, c], b_out[c])
        lo[..., c], hi[..., c] = r.lo, r.hi
    return Box(lo, hi)


def _univariate_range(arith: Any, P: Box, b: np.ndarray, w: np.ndarray, b_out: int) -> Box:
    """Exact range of f(P) = add(sum_u mul(relu(add(P, b_u)), w_u), b_out) over integer P in
    [P.lo, P.hi] (per entry), for w_u exact multiples of the scale: f is piecewise linear in P
    with kinks at -b_u and where add(P, b_u) saturates, so the extremes lie at the ends and kinks."""
    Plo, Phi = np.asarray(P.lo)[..., 0], np.asarray(P.hi)[..., 0]
    kinks = np.unique(np.concatenate([-b, arith.max_raw - b, arith.min_raw - b]).astype(object))
    cands = [Plo, Phi] + [np.clip(np.full(Plo.shape, int(k), dtype=object), Plo, Phi) for k in kinks]
    C = np.stack([np.asarray(c, dtype=Plo.dtype if not getattr(arith, "wide", False) else object) for c in cands], axis=-1)
    pre = arith.add(Box.point(C[..., None]), Box.point(np.asarray(b)))  # [..., n_cand, U]
    h = arith.relu(pre)
    prod = arith.mul(h, Box.point(np.asarray(w)))
    s = arith.sum(prod, axis=-1)
    f = arith.add(s, Box.point(np.asarray(b_out)))
    return Box(np.min(f.lo, axis=-1), np.max(f.hi, axis=-1))
