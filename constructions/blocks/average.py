"""UniformAverage: a head whose every row is uniform, so its output is the average of a value over
all positions (the second layers of Theorems 6 and 13: "OR / threshold by averaging").

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

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, ViewHead
from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.views import Box, Count, Group, State, Var, unique_rows
from exactformer.constructions.core import runs
from exactformer.constructions.core.views_ops import value_tables


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
        arith = ctx.arith
        a = arith.uniform_weight(ctx.T)
        V = value_tables(ctx, state, hw, where)
        weighted = [arith.mul(a, t) for t in V["tables"]]
        dv = V["vdims"].size
        rows_of = [np.concatenate([np.asarray(w.lo).reshape(-1, dv), np.asarray(w.hi).reshape(-1, dv)], axis=1)
                   for w in weighted]
        boxes = unique_rows(np.concatenate(rows_of))[0]
        cluster, hulls = two_clusters(boxes, dv)
        ctx.details.setdefault("heads", []).append({"layer": layer, "head": head, "block": type(self).__name__,
                                                    "uniform_weight": str(arith.to_fraction(np.asarray(a.lo))),
                                                    "value_boxes": int(boxes.shape[0]), "value_classes": int(hulls.shape[0])})
        features = []
        for w, rows in zip(weighted, rows_of):
            klass = cluster[np.all(rows[:, None, :] == boxes[None, :, :], axis=2).argmax(axis=1)]
            one = (klass == hulls.shape[0] - 1) & (hulls.shape[0] == 2)
            features.append(one.reshape(np.asarray(w.lo).shape[:-1]).astype(np.int64))
        return features, hulls[0], hulls[-1]  # the feature is 1 on the upper class


def count_sums(arith: Any, lo_box: np.ndarray, hi_box: np.ndarray, T: int, S1: np.ndarray, S2: np.ndarray) -> Box:
    """The sums of T weighted values (summed as the forward pass sums) when S of them lie in the
    upper box ``hi_box`` and the rest in ``lo_box`` (rows ``[lo | hi]``), for every S in [S1, S2]
    (arrays): S1 terms in the upper box, T - S2 in the lower, S2 - S1 in their hull."""
    dv = lo_box.size // 2
    hull = np.concatenate([np.minimum(lo_box[:dv], hi_box[:dv]), np.maximum(lo_box[dv:], hi_box[dv:])])
    terms = Box(np.stack([hi_box[:dv], lo_box[:dv], hull[:dv]])[None], np.stack([hi_box[dv:], lo_box[dv:], hull[dv:]])[None])
    return arith.sum(terms, axis=-2, counts=np.stack([S1, T - S2, S2 - S1], axis=1)[:, :, None])


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

