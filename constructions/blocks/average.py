"""UniformAverage: a head whose every row is uniform, so its output is the average of a value over
all positions (the second layers of Theorems 6 and 13: "OR / threshold by averaging").

Weights: W_Q = W_K = 0 (all logits 0), V = value slot -> head dim 0, O = head dim 0 -> out slot.

Guarantee: every key gets the rounded weight ``a = div(e(0), sat(T e(0)))`` (exactly 1/T when T is
a power of two and the step is at most 1/T), so the output is ``sat(sum_j mul(a, v_j))``.

Local certificate (:meth:`UniformAverage.certify_head`): checks that every logit of the head is the
same constant (W_K = 0, or W_Q = 0 and b_Q = 0); then, if the weighted value ``mul(a, v_j)`` of
every position takes one of at most two boxes over all views, the output is a function of the
number S of positions in the upper box: ``sat(S * hi_box + (T - S) * lo_box)``. S becomes a count
variable of the view, whose meaning (which positions, which feature of their views) is recorded
for the comparison with the task's specification.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import Block, CertContext, Unproven, register
from exactformer.constructions.views import Box, Count, Group, State, Var
from exactformer.constructions.views_ops import value_tables


@register
@dataclass(frozen=True)
class UniformAverage(Block):
    value: str
    out: str
    kind = "head"

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
        weighted = [arith.mul(Box.point(arith.array(a)), t) for t in V["tables"]]
        dv = V["vdims"].size
        boxes = np.unique(np.concatenate([np.concatenate([np.asarray(w.lo).reshape(-1, dv), np.asarray(w.hi).reshape(-1, dv)],
                                                         axis=1) for w in weighted]), axis=0)
        if boxes.shape[0] > 2:
            raise Unproven(f"{where}: the averaged values take {boxes.shape[0]} distinct boxes (at most 2 are supported)")
        ctx.details.setdefault("heads", []).append({"layer": layer, "head": head, "block": type(self).__name__,
                                                    "uniform_weight": str(arith.to_fraction(arith.array(a))),
                                                    "value_boxes": int(boxes.shape[0])})
        lo_box, hi_box = boxes[0], boxes[-1]  # the feature is 1 on the upper box (rows are sorted)
        g_of, m_of = state.group_of(np.arange(ctx.T))
        features = []
        for w in weighted:
            rows = np.concatenate([np.asarray(w.lo).reshape(-1, dv), np.asarray(w.hi).reshape(-1, dv)], axis=1)
            one = np.all(rows == hi_box, axis=1) & (boxes.shape[0] == 2)
            features.append(one.reshape(np.asarray(w.lo).shape[:-1]).astype(np.int64))
        count = Count(np.arange(ctx.T), g_of, m_of, list(state.groups), features)
        forced = sum(int(np.all(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        possible = sum(int(np.any(f == 1)) * g.pos.size for f, g in zip(features, state.groups))
        S = np.arange(forced, possible + 1, dtype=np.int64)
        T = ctx.T
        Sx, Tx = S[:, None].astype(object), (T - S)[:, None].astype(object)
        lo = arith.saturate(Sx * hi_box[:dv][None, :] + Tx * lo_box[:dv][None, :])
        hi = arith.saturate(Sx * hi_box[dv:][None, :] + Tx * lo_box[dv:][None, :])
        var = Var("count", None, S, np.arange(S.size, dtype=np.int64), count=count)
        z = Box(lo, hi)
        return [(Group(need, [var], z), z)]
