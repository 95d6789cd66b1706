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
each class is bounded by its hull (:func:`_two_clusters`). S becomes a count
variable of the view, whose meaning (which positions, which feature of their views) is recorded
for the comparison with the task's specification.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import CertContext, ViewHead, Unproven
from exactformer.constructions.core.views import Box, Count, Group, State, Var, unique_rows
from exactformer.constructions.core.views_ops import value_tables


@dataclass(frozen=True)
class UniformAverage(ViewHead):
    value: str
    out: str

    def emit(self, mb: Any, layer: int) -> int:
        w = mb.layout[self.value].size
        return mb.head(self, layer, max(w, 1), V=[(self.value, np.eye(w, dtype=np.int64))],
                       O=[(self.out, np.eye(w, dtype=np.int64))])

    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        if not (not np.any(hw["W_K"]) or (not np.any(hw["W_Q"]) and not np.any(hw["b_Q"]))):
            raise Unproven(f"{where}: the logits are not constant (W_K must be 0, or W_Q and b_Q)")
        if ctx.model.blocks[layer].attn.causal:
            raise Unproven(f"{where}: a causal uniform average is not supported")
        arith = ctx.arith
        a = arith.uniform_weight(ctx.T)
        V = value_tables(ctx, state, hw, where)
        weighted = [arith.mul(a, t) for t in V["tables"]]
        dv = V["vdims"].size
        rows_of = [np.concatenate([np.asarray(w.lo).reshape(-1, dv), np.asarray(w.hi).reshape(-1, dv)], axis=1)
                   for w in weighted]
        boxes = unique_rows(np.concatenate(rows_of))[0]
        cluster, hulls = _two_clusters(boxes, dv)
        ctx.details.setdefault("heads", []).append({"layer": layer, "head": head, "block": type(self).__name__,
                                                    "uniform_weight": str(arith.to_fraction(np.asarray(a.lo))),
                                                    "value_boxes": int(boxes.shape[0]), "value_classes": int(hulls.shape[0])})
        lo_box, hi_box = hulls[0], hulls[-1]  # the feature is 1 on the upper class
        g_of, m_of = state.group_of(np.arange(ctx.T))
        features = []
        for w, rows in zip(weighted, rows_of):
            klass = cluster[np.all(rows[:, None, :] == boxes[None, :, :], axis=2).argmax(axis=1)]
            one = (klass == hulls.shape[0] - 1) & (hulls.shape[0] == 2)
            features.append(one.reshape(np.asarray(w.lo).shape[:-1]).astype(np.int64))
        count = Count(np.arange(ctx.T), g_of, m_of, list(state.groups), features)
        forced = sum(int(np.all(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        possible = sum(int(np.any(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        S = np.arange(forced, possible + 1, dtype=np.int64)
        T = ctx.T
        # z(S) = the sum of T weighted values, S of them in the upper box (summed as the forward pass does)
        terms = Box(np.stack([hi_box[:dv], lo_box[:dv]])[None], np.stack([hi_box[dv:], lo_box[dv:]])[None])
        z_S = arith.sum(terms, axis=-2, counts=np.stack([S, T - S], axis=1)[:, :, None])
        lo, hi = z_S.lo, z_S.hi
        var = Var("count", None, S, np.arange(S.size, dtype=np.int64), count=count)
        z = Box(lo, hi)
        return [(Group(need, [var], z), z)]


def _two_clusters(boxes: np.ndarray, dv: int) -> tuple[np.ndarray, np.ndarray]:
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

