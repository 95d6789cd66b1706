"""Averaging heads: :class:`UniformAverage` averages a value over all positions (the second
layers of Theorems 6 and 13: "OR / threshold by averaging"); :class:`SetAverage` over a chosen set
of positions, given by a 0/1 membership column of the positional embedding.

UniformAverage.

Weights: W_Q = W_K = 0 (all logits 0), V = value slot -> head dim 0, O = head dim 0 -> out slot.

Guarantee: every key gets the rounded weight ``a = div(e(0), sat(T e(0)))`` (exactly 1/T when T is
a power of two and the step is at most 1/T), so the output is ``sat(sum_j mul(a, v_j))``.

Local certificate (:meth:`UniformAverage.certify_head`): checks that every logit of the head is the
same constant (W_K = 0, or W_Q = 0 and b_Q = 0); then the weighted values ``mul(a, v_j)`` of
all positions over all views are grouped into two classes of boxes and the output is a function of the
number S of positions in the upper class: ``sat(S * hi_box + (T - S) * lo_box)``. Under float
arithmetic one ideal value appears as several nearby boxes; they are grouped into two classes and
each class is bounded by its hull (:func:`two_clusters`). S becomes a count
variable of the view, whose meaning (which positions, which feature of their views) is recorded
for the comparison with the task's specification.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, copied_through, paired_slots, ViewHead
from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.views import Box, Count, Group, State, Var, unique_rows
from exactformer.constructions.core import runs
from exactformer.constructions.core.views_ops import value_tables
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.design.precision_search import arithmetics_for, smallest_grid_eta
from exactformer.precision import FixedPoint


@block
@dataclass(frozen=True)
class UniformAverage(ViewHead):
    value: str
    out: str

    def emit(self, mb: Any, layer: int) -> int:
        w = mb.layout[self.value].size
        return mb.head(self, layer, max(w, 1), V=[(self.value, np.eye(w, dtype=np.int64))],
                       O=[(self.out, np.eye(w, dtype=np.int64))])

    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        features, lo_box, hi_box = self._features(ctx, layer, head, state)
        g_of, m_of = state.group_of(np.arange(ctx.T))
        count = Count(np.arange(ctx.T), g_of, m_of, list(state.groups), features)
        forced = sum(int(np.all(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        possible = sum(int(np.any(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        S = np.arange(forced, possible + 1, dtype=np.int64)
        z = count_sums(ctx.arith, lo_box, hi_box, ctx.T, S, S)
        var = Var("count", None, S, np.arange(S.size, dtype=np.int64), count=count)
        return [(Group(need, [var], z), z)]

    def certify_runs(self, ctx: Any, layer: int, head: int, state: runs.RunState, need: list[tuple[int, int]]) -> list[runs.Segment]:
        """The output over runs (:mod:`exactformer.verify.certify.runs`): the same split of the
        weighted values as :meth:`certify_head`; the count S ranges over intervals (split where
        ``ctx.count_breaks`` asks), each bounded as a whole: S1 terms in the upper class, T - S2 in
        the lower and S2 - S1 in either."""
        features, lo_box, hi_box = self._features(ctx, layer, head, state)
        sources = tuple(runs.FeatureSource(g.start, g.stop, tuple(g.vars), f)
                        for g, f in zip(state.segments, features) if np.any(f == 1))
        forced = sum(int(np.all(f == 1)) * g.length for f, g in zip(features, state.segments))
        possible = sum(int(np.any(f == 1)) * g.length for f, g in zip(features, state.segments))
        edges = [forced] + sorted({x for x in ctx.count_breaks(sources) if forced < x <= possible}) + [possible + 1]
        starts, stops = np.array(edges[:-1], np.int64), np.array(edges[1:], np.int64)
        z = count_sums(ctx.arith, lo_box, hi_box, ctx.T, starts, stops - 1)
        var = runs.CountVar(runs.Classes(starts, stops, np.arange(starts.size, dtype=np.int64)), sources)
        return [runs.Segment(a, b, [var], z) for a, b in need]

    def _features(self, ctx: CertContext, layer: int, head: int, state: Any) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
        """The checks on the head's weights; the weighted values split into two classes (per group
        of ``state``, its 0/1 feature table over its classes: 1 in the upper class) and the classes'
        hulls ``[lo | hi]`` (lower, upper)."""
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        if not (not np.any(hw["W_K"]) or (not np.any(hw["W_Q"]) and not np.any(hw["b_Q"]))):
            raise Unproven(f"{where}: the logits are not constant (W_K must be 0, or W_Q and b_Q)")
        a = ctx.arith.uniform_weight(ctx.T)
        V = value_tables(ctx, state, hw, where)
        features, lo_box, hi_box, info = split_values(ctx.arith, a, V["tables"], V["vdims"].size)
        ctx.details.setdefault("heads", []).append({"layer": layer, "head": head, "block": type(self).__name__,
                                                    "uniform_weight": str(ctx.arith.to_fraction(np.asarray(a.lo))), **info})
        return features, lo_box, hi_box


@block
@dataclass(frozen=True)
class SetAverage(ViewHead):
    """One head averaging ``value`` uniformly over a set S of positions into ``out``: the set is
    given by the one-column slot ``member`` of the positional embedding (1 at the positions of S,
    0 elsewhere).

    Weights: W_Q = 0, b_Q = eta on head dim 0, W_K = 1 from ``member`` to dim 0 (the logit is eta
    at S and 0 elsewhere, the same for every query); V = value slots -> head dims, O = head dims
    -> out slots (identity).

    Guarantee (:meth:`weights`; the sufficient condition of :meth:`design`): with m = |S| among T
    positions, every member gets the weight a = div(e(0), sat(m e(0) + (T - m) e(-eta))) and every
    other position w0 = div(e(-eta), ...). In fixed point a is *exactly* 1/m where m divides 2^f
    (f the format's fraction bits) and e(-eta) rounds to 0: the output is the average over S
    exactly. Otherwise the output is the average within the stated margin ``m |a - 1/m| + (T - m)
    w0`` (values in [-1, 1]); :meth:`design` chooses the smallest eta, and the build the fewest-bit
    format, with margin <= TOLERANCE / m^2 = 1/(8 m^2) in the format and in real, float64 and
    float32 arithmetic: what :class:`~exactformer.constructions.blocks.readout.AverageReadout`
    needs to be *proved* right (the certificate bounds its logits one by one).

    Local certificate (:meth:`certify_head`), from the model's weights: W_Q = 0 (the query is b_Q,
    the same at every position); every dim where b_Q is nonzero reads through W_K only the member
    column (one such dim, with b_K = 0) or nothing (a bias-only dim); the member column is written
    by the positional table alone (no token row, code block or earlier layer) and holds exactly 0
    or 1 at every position. Then every member's logit is the same rounded product of the same
    numbers (equal bit for bit in every arithmetic: the members tie for the maximum) and every
    other position's the same constant below it; the row's weights follow from the softmax in the
    arithmetic (:meth:`~exactformer.precision.boxes.FixedArithmetic.row_weights` with a tied
    level). The members' weighted values split into two classes (as :class:`UniformAverage`'s) and
    the output is a function of the number S of members in the upper class, plus the other
    positions' weighted values (exactly 0 where their weight rounds to 0). S is a count variable of
    the view over the members' features, compared with the task's
    (:class:`~exactformer.constructions.core.spec.CountOf`). Bidirectional attention only."""

    member: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction | None = None

    #: the designed margin: the output is the average over S within TOLERANCE / m^2
    TOLERANCE = Fraction(1, 8)

    def __post_init__(self) -> None:
        paired_slots(self)

    def emit(self, mb: Any, layer: int) -> int | None:
        if mb.layout.width(self.member) != 1:
            raise ValueError(f"member slot {self.member!r} must have width 1, has {mb.layout.width(self.member)}")
        dh = max(1, sum(mb.layout.width(v) for v in self.value))
        V, O = copied_through(mb, self.value, self.out, dh)
        if self.eta is None:
            return mb.defer(self, layer)  # placed by the build once the format (and eta) is chosen
        b_Q = np.array([Fraction(0)] * dh, dtype=object)
        b_Q[0] = Fraction(self.eta)
        return mb.head(self, layer, dh, K=[(self.member, np.eye(1, dh, dtype=np.int64))], V=V, O=O, b_Q=b_Q)

    # ---- the sufficient condition (builder side) ---------------------------------------------------
    def members(self, mb: Any) -> int:
        """m = |S|: the positions whose member entry is 1 (the positional rows on the member slot;
        IRError where an entry is not 0 or 1, or a token row or code writes the slot)."""
        if any(slot == self.member for _, slot, _ in mb.tok_rows) or any(c[0] == self.member for c in mb.tok_codes + mb.pos_codes):
            raise ValueError(f"member slot {self.member!r} must be written by position_rows alone")
        m = 0
        for rows, slot, values in mb.pos_rows:
            if slot == self.member:
                v = ExactTensor.from_values(np.asarray(values, dtype=object)) if np.asarray(values).dtype == object else None
                vals = np.asarray(values if v is None else v.num, dtype=np.int64).reshape(-1)
                den = 1 if v is None else v.den
                if not np.all((vals == 0) | (vals == den)):
                    raise ValueError(f"member slot {self.member!r}: position_rows entries must be 0 or 1")
                m += int(np.count_nonzero(vals))
        if m == 0:
            raise ValueError(f"member slot {self.member!r} holds no 1: the set is empty")
        return m

    @staticmethod
    def weights(arith: Any, P: Box, c: Box, m: int, T: int, n_dims: int) -> tuple[Box, Box]:
        """(member weight, weight of each other position) in ``arith`` of a row of m members among
        T positions, the members' logit P + c and the others' c (ValueError where the members'
        logit is not strictly above)."""
        logits = arith.code_logits(P, np.array([1, 0]), c, 1, n_dims)
        top, low = logits[0:1], Box(np.asarray(logits.lo)[None, 1:2], np.asarray(logits.hi)[None, 1:2])
        if m < T and not np.asarray(top.lo)[0] > np.asarray(low.hi)[0, 0]:
            raise ValueError("the members' logit is not strictly above the other positions'")
        levels = Box(np.concatenate([np.asarray(top.lo)[None, :], np.asarray(low.lo)], axis=1),
                     np.concatenate([np.asarray(top.hi)[None, :], np.asarray(low.hi)], axis=1))
        w_t, w_l = arith.row_weights(top, levels, np.array([[m - 1, T - m]]), tied=np.array([[True, False]]))
        lo, hi = np.asarray(w_t.lo)[0], np.asarray(w_t.hi)[0]
        if m > 1:  # the maximum is one of the tied members: any member's weight is in the hull
            lo, hi = min(lo, np.asarray(w_l.lo)[0, 0]), max(hi, np.asarray(w_l.hi)[0, 0])
        return Box(np.asarray(lo), np.asarray(hi)), w_l[0, 1]

    def design(self, fmt: Any, mb: Any) -> "SetAverage | None":
        """The block for format ``fmt`` (class docstring): eta the smallest grid value (multiple of
        1/4 for a float format) with the margin in every arithmetic checked; a given eta is checked."""
        m, T = self.members(mb), mb.n_ctx
        dh = max(1, sum(mb.layout.width(v) for v in self.value))
        ariths = arithmetics_for(fmt, True)

        def holds(e: Fraction) -> bool:
            for A in ariths:
                P = A.mul(Box.point(A.array(A.const(e))), Box.point(A.array(A.const(Fraction(1)))))
                try:
                    wm, w0 = SetAverage.weights(A, P, Box.point(A.array(0)), m, T, dh)
                except ValueError:
                    return False
                lo, hi, other = (Fraction(A.to_fraction(np.asarray(x))) for x in (wm.lo, wm.hi, w0.hi))
                if m * max(abs(lo - Fraction(1, m)), abs(hi - Fraction(1, m))) + (T - m) * other > self.TOLERANCE / m**2:
                    return False
            return True

        if self.eta is not None:
            return self if holds(Fraction(self.eta)) else None
        grid = fmt if fmt.is_exact else FixedPoint.binary(16, 16)
        eta = smallest_grid_eta(grid, grid.step if fmt.is_exact else Fraction(1, 4), holds)
        return None if eta is None else replace(self, eta=eta)

    # ---- the local certificate ----------------------------------------------------------------------
    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        arith = ctx.arith
        member = self._member_column(ctx, layer, hw, where)
        P, c, n_dims = self._logit_form(ctx, hw, member, where)
        inside = self._inside(ctx, member)
        m, T = int(inside.sum()), ctx.T
        try:
            wm, w0 = self.weights(arith, P, c, m, T, n_dims)
        except ValueError as e:
            raise Unproven(f"{where}: {e}") from None
        V = value_tables(ctx, state, hw, where)
        sub, tables, g_of, m_of = [], [], {}, {}
        for gi, g in enumerate(state.groups):  # the groups restricted to the members of S
            idx = np.flatnonzero(inside[g.pos])
            if idx.size:
                for k, q in enumerate(g.pos[idx].tolist()):
                    g_of[q], m_of[q] = len(sub), k
                sub.append(g.take(idx))
                tables.append(V["tables"][gi])
        features, lo_box, hi_box, info = split_values(arith, wm, tables, V["vdims"].size)
        stray, others = None, T - m
        if others:
            outside = [V["tables"][gi] for gi, g in enumerate(state.groups) if np.any(~inside[g.pos])]
            lo = np.min(np.stack([np.asarray(t.lo).reshape(-1, V["vdims"].size).min(axis=0) for t in outside]), axis=0)
            hi = np.max(np.stack([np.asarray(t.hi).reshape(-1, V["vdims"].size).max(axis=0) for t in outside]), axis=0)
            stray = arith.mul(w0, Box(lo, hi))
        S_pos = np.flatnonzero(inside)
        count = Count(S_pos, np.array([g_of[q] for q in S_pos.tolist()], dtype=np.int64),
                      np.array([m_of[q] for q in S_pos.tolist()], dtype=np.int64), sub, features)
        forced = sum(int(np.all(f == 1)) * g.pos.size for f, g in zip(features, sub))
        possible = sum(int(np.any(f == 1)) * g.pos.size for f, g in zip(features, sub))
        S = np.arange(forced, possible + 1, dtype=np.int64)
        z = count_sums(arith, lo_box, hi_box, m, S, S, stray, others)
        ctx.details.setdefault("heads", []).append({
            "layer": layer, "head": head, "block": type(self).__name__, "members": m,
            "member_weight": [str(arith.to_fraction(np.asarray(wm.lo).reshape(-1)[0])),
                              str(arith.to_fraction(np.asarray(wm.hi).reshape(-1)[0]))],
            "other_weight": str(arith.to_fraction(np.asarray(w0.hi))) if others else "0", **info})
        var = Var("count", None, S, np.arange(S.size, dtype=np.int64), count=count)
        return [(Group(need, [var], z), z)]

    def _member_column(self, ctx: CertContext, layer: int, hw: dict, where: str) -> int:
        """The one column the head's keys read through its active dims (module docstring)."""
        if np.any(hw["W_Q"]):
            raise Unproven(f"{where}: W_Q must be 0 (the same query at every position)")
        active = np.flatnonzero(hw["b_Q"] != 0)
        reads = np.flatnonzero(np.any(hw["W_K"][:, active] != 0, axis=1))
        if reads.size != 1:
            raise Unproven(f"{where}: the keys must read exactly one column (the member column), they read {reads.size}")
        col = int(reads[0])
        if ctx.written and ctx.written[layer][col]:
            raise Unproven(f"{where}: an earlier layer writes into the member column")
        m = ctx.model
        if m.embed.table.shape[0] and np.any(m.embed.table.num[:, col] != 0):
            raise Unproven(f"{where}: the token embedding writes into the member column (the set must not depend on the input)")
        for emb in (m.embed, m.pos_embed):
            if any(b.col <= col < b.col + b.code.k for b in emb.blocks):
                raise Unproven(f"{where}: a code block fills the member column")
        return col

    def _logit_form(self, ctx: CertContext, hw: dict, col: int, where: str) -> tuple[Box, Box, int]:
        """(P, c, dims): the member dim's product b_Q W_K (the logit of a member, less c), the
        bias-only dims' summed products c, and the number of dims that contribute."""
        arith = ctx.arith
        active = np.flatnonzero(hw["b_Q"] != 0)
        key = [d for d in active if hw["W_K"][col, d] != 0]
        if len(key) != 1 or hw["b_K"][key[0]] != 0:
            raise Unproven(f"{where}: exactly one head dim must read the member column, with b_K = 0 there")
        d0 = key[0]
        P = arith.mul(Box.point(arith.array(hw["b_Q"][d0])), Box.point(arith.array(hw["W_K"][col, d0])))
        terms = [arith.mul(Box.point(arith.array(hw["b_Q"][d])), Box.point(arith.array(hw["b_K"][d])))
                 for d in active if d != d0 and hw["b_K"][d] != 0]
        c = arith.sum(Box(np.stack([np.asarray(t.lo) for t in terms]), np.stack([np.asarray(t.hi) for t in terms])), axis=0) \
            if terms else Box.point(arith.array(0))
        return P, c, 1 + len(terms)

    def _inside(self, ctx: CertContext, col: int) -> np.ndarray:
        """[T] bool: the positions whose member entry is exactly 1 (Unproven for any other value than 0)."""
        emb = ctx.model.pos_embed
        vals = emb.values(np.arange(ctx.T))
        entry = np.asarray(vals.num[:, col], dtype=object)
        one, zero = entry == vals.den, entry == 0
        if not np.all(one | zero):
            p = int(np.flatnonzero(~(one | zero))[0])
            raise Unproven(f"the member column holds {Fraction(int(entry[p]), vals.den)} at position {p}, not 0 or 1",
                           {"positions": [p]})
        if not one.any():
            raise Unproven("the member column holds no 1: the set is empty")
        return one.astype(bool)


def split_values(arith: Any, a: Box, tables: list[Box], dv: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, dict]:
    """The weighted values ``mul(a, table)`` of every table split into a lower and an upper class
    (:func:`two_clusters`): per table its 0/1 feature (1 in the upper class), the classes' hulls
    ``[lo | hi]`` (lower, upper) and what the report says of them."""
    weighted = [arith.mul(a, t) for t in tables]
    rows_of = [np.concatenate([np.asarray(w.lo).reshape(-1, dv), np.asarray(w.hi).reshape(-1, dv)], axis=1)
               for w in weighted]
    boxes = unique_rows(np.concatenate(rows_of))[0]
    cluster, hulls = two_clusters(boxes, dv)
    features = []
    for w, rows in zip(weighted, rows_of):
        klass = cluster[np.all(rows[:, None, :] == boxes[None, :, :], axis=2).argmax(axis=1)]
        one = (klass == hulls.shape[0] - 1) & (hulls.shape[0] == 2)
        features.append(one.reshape(np.asarray(w.lo).shape[:-1]).astype(np.int64))
    return features, hulls[0], hulls[-1], {"value_boxes": int(boxes.shape[0]), "value_classes": int(hulls.shape[0])}


def count_sums(arith: Any, lo_box: np.ndarray, hi_box: np.ndarray, T: int, S1: np.ndarray, S2: np.ndarray,
               stray: Box | None = None, n_stray: int = 0) -> Box:
    """The sums of T weighted values (summed as the forward pass sums) when S of them lie in the
    upper box ``hi_box`` and the rest in ``lo_box`` (rows ``[lo | hi]``), for every S in [S1, S2]
    (arrays): S1 terms in the upper box, T - S2 in the lower, S2 - S1 in their hull; plus
    ``n_stray`` terms in the box ``stray`` [dv] (the keys outside an averaged set)."""
    dv = lo_box.size // 2
    hull = np.concatenate([np.minimum(lo_box[:dv], hi_box[:dv]), np.maximum(lo_box[dv:], hi_box[dv:])])
    extra = [] if stray is None else [stray]
    terms = Box(np.stack([hi_box[:dv], lo_box[:dv], hull[:dv]] + [np.asarray(b.lo) for b in extra])[None],
                np.stack([hi_box[dv:], lo_box[dv:], hull[dv:]] + [np.asarray(b.hi) for b in extra])[None])
    counts = [S1, T - S2, S2 - S1] + [np.full_like(S1, n_stray) for _ in extra]
    return arith.sum(terms, axis=-2, counts=np.stack(counts, axis=1)[:, :, None])


def two_clusters(boxes: np.ndarray, dv: int) -> tuple[np.ndarray, np.ndarray]:
    """Split value boxes (rows ``[lo | hi]``) into a lower and an upper class, whose hulls bound the sum.

    Rounding makes one ideal value (say 1) appear as several nearby boxes; each term of the sum lies in
    its own box, hence in its class's hull, so any split is sound -- a poor one only loosens the bound
    (three genuinely different values are left to the readout, which decides or reports). The boxes
    are ordered by the sum of their centres and split where the gap between the classes' hulls (in
    the dimension that separates them most) is largest; ties go to the smallest lower class (the
    average counts the positions whose value is above the lowest one). Returns (class of each box,
    the two hulls, lower first); a single box is one class.
    """
    if len(boxes) == 1:
        return np.zeros(1, dtype=np.int64), boxes.copy()
    lo, hi = boxes[:, :dv].astype(np.float64), boxes[:, dv:].astype(np.float64)
    order = np.argsort((lo + hi).sum(axis=1), kind="stable")
    best = None
    for cut in range(1, len(boxes)):
        low, up = order[:cut], order[cut:]
        gap = float(np.max(lo[up].min(axis=0) - hi[low].max(axis=0)))
        if best is None or gap > best[0]:
            best = (gap, cut)
    low, up = order[: best[1]], order[best[1]:]
    cluster = np.zeros(len(boxes), dtype=np.int64)
    cluster[up] = 1
    hull = lambda idx: np.concatenate([boxes[idx, :dv].min(axis=0), boxes[idx, dv:].max(axis=0)])  # noqa: E731
    return cluster, np.stack([hull(low), hull(up)])

