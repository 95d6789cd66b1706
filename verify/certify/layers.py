"""What both composed certificates (views: :mod:`exactformer.verify.certify.composed`, runs:
:mod:`exactformer.verify.certify.runs`) read from a transformer's weights, and the image of one
layer over a table of boxes.

* :func:`owners`: which block of the plan owns each head (a head without one must write nothing);
* :func:`written_before`: the residual columns earlier layers write;
* :func:`tracked_columns`: the columns some read needs from views;
* :func:`computes_all`: whether each layer must be computed at every position;
* :func:`layer_image`: residual + heads through W_O and the MLP, exactly over boxes;
* :func:`readout_table`: the logits' boxes over a view and the answer each assignment proves;
* :func:`task_answers`: the model's answer positions and labels against the task's (every engine's
  last step, and the recurrent certificate's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.blocks.mlp import mlp_image
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.task import same_answer
from exactformer.precision.boxes import Box


def weight(arith: Any, t: Any) -> np.ndarray:
    """``arith.weight`` of an exact tensor, entry by entry: for a mostly-zero tensor only its nonzero
    entries are converted (a zero weight is 0 in every arithmetic)."""
    num = t.num
    if num.dtype == object or num.size <= 1 << 16 or 4 * np.count_nonzero(num) >= num.size:
        return arith.weight(num, t.den)
    nz = np.flatnonzero(num)
    vals = arith.weight(num.reshape(-1)[nz], t.den)
    out = np.zeros(num.size, dtype=np.asarray(arith.weight(np.zeros(1, dtype=num.dtype), t.den)).dtype)
    out[nz] = vals
    return out.reshape(num.shape)


def owners(model: CompiledModel, W: dict) -> dict[int, dict[int, Any]]:
    """layer -> head -> owning block; a head without a block must write nothing."""
    out: dict[int, dict[int, Any]] = {}
    for p in model.plan:
        if p.kind == "head":
            out.setdefault(p.layer, {})[p.index] = p.block
    for li, heads in out.items():
        causal = model.blocks[li].attn.causal if 0 <= li < len(model.blocks) else None
        for h, block in heads.items():
            if causal not in block.masks:
                raise Unproven(f"blocks.{li}.attn head {h}: {type(block).__name__} is proved for "
                               f"{' or '.join('causal' if m else 'bidirectional' for m in block.masks)} attention, "
                               f"the layer is {'causal' if causal else 'bidirectional'}")
    for li, blk in enumerate(model.blocks):
        for h in range(blk.attn.n_heads):
            if h in out.get(li, {}):
                continue
            pre = f"blocks.{li}.attn."
            silent = not np.any(W[pre + "W_O"][h]) or (not np.any(W[pre + "W_V"][h]) and not np.any(W[pre + "b_V"][h]))
            if not silent:
                raise Unproven(f"blocks.{li}.attn head {h} writes to the residual stream but no block of the plan owns it")
    return out


def written_before(model: CompiledModel, W: dict) -> list[np.ndarray]:
    """For each layer, the residual columns some earlier layer writes (the rest still hold their
    embedding values)."""
    out, acc = [], np.zeros(model.d_model, dtype=bool)
    for li in range(len(model.blocks)):
        out.append(acc.copy())
        acc = acc | writes(W, li)
    return out


def writes(W: dict, li: int) -> np.ndarray:
    """The residual columns layer ``li`` writes (through W_O, b_O, W_out or b_out)."""
    pre = f"blocks.{li}."
    out = np.any(W[pre + "attn.W_O"] != 0, axis=(0, 1)) | (W[pre + "attn.b_O"] != 0)
    return out | np.any(W[pre + "mlp.W_out"] != 0, axis=0) | (W[pre + "mlp.b_out"] != 0)


def computes_all(W: dict, written: list[np.ndarray], nL: int) -> list[bool]:
    """Whether layer li must be computed at every position: a later key or value reads a column it
    or an earlier layer writes, or the next layer is computed everywhere (the executor's rule,
    verify/executor/exact.py); otherwise only at the answer positions."""
    full = [False] * nL
    for li in range(nL - 2, -1, -1):
        pre = f"blocks.{li + 1}.attn."
        kv = np.any(W[pre + "W_K"] != 0, axis=(0, 2)) | np.any(W[pre + "W_V"] != 0, axis=(0, 2))
        full[li] = bool(np.any(kv & written[li + 1]) or full[li + 1])
    return full


def tracked_columns(model: CompiledModel, W: dict, owners_: dict) -> np.ndarray:
    """Columns some read needs: read by a value, an MLP, the unembedding, or a query/key of a head
    whose block does not derive its logits from code columns. A block with ``view_columns`` derives
    everything its head reads from the weights, the codes and the task's precondition, except those
    columns, which it reads from views."""
    d = model.d_model
    read = np.any(W["unembed.W_U"] != 0, axis=1)
    for li, blk in enumerate(model.blocks):
        pre = f"blocks.{li}."
        read |= np.any(W[pre + "mlp.W_in"] != 0, axis=1)
        for h in range(blk.attn.n_heads):
            owner = owners_.get(li, {}).get(h)
            hw = {w: W[pre + "attn." + w][h] for w in ("W_Q", "W_K", "W_V")}
            if owner is not None:
                read |= owner.view_columns(model, hw)
            else:  # a head no block owns writes nothing (checked by owners), but its reads are tracked
                read |= np.any(hw["W_V"] != 0, axis=1) | np.any(hw["W_Q"] != 0, axis=1) | np.any(hw["W_K"] != 0, axis=1)
    return np.flatnonzero(read[:d]).astype(np.int64)


class SparseProducts:
    """``arith`` whose ``matmul``/``affine`` form only the products of each column's nonzero
    weights (a zero weight's product is exactly 0 and adds nothing): the same boxes as the dense
    image, held as [..., m, r] for at most r nonzero weights per column instead of [..., n, m]
    (views with many classes through a sparse W_O or MLP). Everything else is ``arith``'s."""

    def __init__(self, arith: Any):
        self._arith = arith

    def __getattr__(self, name: str) -> Any:
        return getattr(self._arith, name)

    def matmul(self, x: Box, W: np.ndarray) -> Box:
        W = np.asarray(W)
        nz = W != 0
        r = int(nz.sum(axis=0).max()) if W.size else 0
        if r == 0 or x.is_point() or 4 * r >= W.shape[0]:
            return self._arith.matmul(x, W)
        rows = np.argsort(~nz, axis=0, kind="stable")[:r].T  # [m, r]: each column's nonzero rows first
        vals = np.where(np.take_along_axis(nz, rows.T, axis=0).T, np.take_along_axis(W, rows.T, axis=0).T, 0)
        g = Box(np.asarray(x.lo)[..., rows], np.asarray(x.hi)[..., rows])
        prod = self._arith.mul(g, Box.point(vals.astype(W.dtype)))
        if r == 1:  # a sum of one rounded (and saturated) product is that product
            return Box(np.asarray(prod.lo)[..., 0], np.asarray(prod.hi)[..., 0])
        return self._arith.sum(prod, axis=-1)

    def affine(self, x: Box, W: np.ndarray, b: np.ndarray) -> Box:
        b = np.asarray(b)
        return self._arith.add(self.matmul(x, W), Box(b, b))


@dataclass
class LayerWeights:
    """One layer's weights as :func:`layer_image` reads them, on the tracked columns ``cols``:
    W_O's rows of the heads' nonzero value dims (in head order), b_O, the MLP's rows read (``ci``:
    their index among ``cols``) and its output columns."""

    W_heads: np.ndarray | None
    b_O: np.ndarray
    ci: np.ndarray
    W_in: np.ndarray
    b_in: np.ndarray
    W_out: np.ndarray
    b_out: np.ndarray

    @staticmethod
    def of(W: dict, li: int, heads: list[int], cols: np.ndarray, col_index: Any) -> "LayerWeights":
        pre = f"blocks.{li}."
        W_O = W[pre + "attn.W_O"]
        W_rows = [W_O[h][np.flatnonzero(np.any(W[pre + "attn.W_V"][h] != 0, axis=0) | (W[pre + "attn.b_V"][h] != 0))][:, cols]
                  for h in heads]
        rows = np.flatnonzero(np.any(W[pre + "mlp.W_in"] != 0, axis=1))
        return LayerWeights(np.concatenate(W_rows, axis=0) if W_rows else None, W[pre + "attn.b_O"][cols],
                            col_index(rows), W[pre + "mlp.W_in"][rows], W[pre + "mlp.b_in"],
                            W[pre + "mlp.W_out"][:, cols], W[pre + "mlp.b_out"][cols])


def layer_image(arith: Any, tables: list[Box], lw: LayerWeights) -> Box:
    """The layer's output over one view: ``tables[0]`` the residual [..., C], the rest the heads'
    outputs [..., dv_h] (broadcastable): x + W_O z + b_O, then + MLP(x), each exactly over boxes."""
    arith = SparseProducts(arith)
    x, zs = tables[0], tables[1:]
    shape = np.broadcast_shapes(*[np.shape(t.lo)[:-1] for t in tables])
    C = np.shape(x.lo)[-1]
    x = Box(np.broadcast_to(x.lo, shape + (C,)), np.broadcast_to(x.hi, shape + (C,)))
    if zs:
        zcat = Box(np.concatenate([np.broadcast_to(z.lo, shape + z.lo.shape[-1:]) for z in zs], axis=-1),
                   np.concatenate([np.broadcast_to(z.hi, shape + z.hi.shape[-1:]) for z in zs], axis=-1))
        attn = arith.affine(zcat, lw.W_heads, lw.b_O)
    else:
        attn = Box.point(np.broadcast_to(lw.b_O, shape + (C,)))
    x = arith.add(x, attn)
    out = arith.add(x, mlp_image(arith, x[..., lw.ci], lw.W_in, lw.b_in, lw.W_out, lw.b_out))
    check_numbers(out, "the layer's output")
    return out


def follows_through(lw: LayerWeights, residual: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """The code coordinate each output column of :func:`layer_image` follows (-1: none), given the
    coordinates the residual's columns [C] and the heads' value dims [dv, concatenated] follow
    (:class:`~exactformer.constructions.core.views.CodeAxis`), read from the weights' nonzero
    pattern: x = residual + W_O z, each MLP unit reads x through W_in, the output adds W_out's
    units. A column that would follow two coordinates is Unproven: the table then holds its value
    only for candidates whose two entries share a class. Where each output column reads at most
    one coordinate (a zero weight adds exactly 0 in fixed point), evaluating the layer on the
    table's two classes (every following input at the same class) gives each column's value for
    every candidate with that entry at its coordinate."""
    def combine(src: np.ndarray, M: np.ndarray, own: np.ndarray | None) -> np.ndarray:
        """Per column of M [R, C]: the one coordinate among ``src`` [R] of its nonzero rows (and
        ``own`` [C]), -1 for none, -2 for two or more."""
        nz = (M != 0) & (src[:, None] != -1)
        big = np.iinfo(np.int64).max
        lo = np.where(nz, src[:, None], big).min(axis=0, initial=big)
        hi = np.where(nz, src[:, None], -1).max(axis=0, initial=-1)
        if own is not None:
            lo = np.minimum(lo, np.where(own != -1, own, big))
            hi = np.maximum(hi, own)
        out = np.where(hi == -1, -1, hi)
        return np.where((lo < 0) | ((lo != big) & (lo != hi)), -2, out).astype(np.int64)

    x = residual.astype(np.int64) if lw.W_heads is None else combine(heads, lw.W_heads, residual)
    units = combine(x[lw.ci], lw.W_in, None)
    out = combine(units, lw.W_out, x)
    if np.any(out == -2):
        raise Unproven(f"a column of the layer's output depends on two coordinates of a code-held pointer "
                       f"(column index {int(np.flatnonzero(out == -2)[0])})")
    return out


def check_numbers(box: Box, what: str, hint: dict | None = None) -> None:
    """Unproven where a bound is NaN (inf - inf or inf * 0 upstream: an unbounded value): a NaN
    compares false with everything, so no later step may read it as a bound."""
    lo, hi = np.asarray(box.lo), np.asarray(box.hi)
    if lo.dtype.kind == "f" and (np.isnan(lo).any() or np.isnan(hi).any()):
        raise Unproven(f"{what} has a bound that is not a number (an unbounded value upstream)", hint or {})


def readout_table(arith: Any, table: Box, W_U: np.ndarray, b_U: np.ndarray, where: int) -> tuple[np.ndarray, Any]:
    """The answer proved for every assignment of a view (``table`` [..., rows of W_U read]) and the
    smallest margin (the correct logit's lower bound minus every other's upper bound); Unproven
    where an assignment's answer is not determined (``where``: the position, for the hint)."""
    check_numbers(table, f"at position {where} the residual stream", {"positions": [where]})
    logits = arith.affine(table, W_U, b_U)
    check_numbers(logits, f"at position {where} a logit", {"positions": [where]})
    lo, hi = np.asarray(logits.lo).astype(object), np.asarray(logits.hi).astype(object)
    V = lo.shape[-1]
    best = np.argmax(lo, axis=-1)
    ohi = np.where(np.arange(V) == best[..., None], arith.min_raw - 1, hi).max(axis=-1)
    mg = np.take_along_axis(lo, best[..., None], axis=-1)[..., 0] - ohi
    mn = np.min(mg) if mg.size else 0
    if mn <= 0:
        bad = np.argwhere(mg <= 0)[0]
        m = np.array(mn)
        shown = arith.to_fraction(m) if m.dtype == object or np.isfinite(m.astype(np.float64)) else float(m)  # -inf: a logit overflowed
        raise Unproven(f"at position {where} the answer is not determined for view assignment "
                       f"{bad.tolist()} (margin {shown})", {"positions": [where]})
    return best.astype(np.int64), mn


def task_answers(model: Any, spec: Any, T: int) -> np.ndarray:
    """What the last step of every certificate reads before it compares the proved answers with the
    specification: the model's answer positions (``answer_positions``, what the executor and the
    exports read the logits at) must be the specification's, in the same order; and the answer each
    logit stands for (``model.answers[i]``, the label the executor decodes to) is mapped to the
    specification's index of the same answer (``spec.values``, from the task's definition; -1 for a
    label that is no answer of the task). The proved answer indices go through this map, so a
    model whose labels or positions differ from the task's is compared as it runs."""
    got = np.asarray(model.answer_positions_for(T), dtype=np.int64)
    want = np.asarray(spec.positions(T), dtype=np.int64)
    if not np.array_equal(got, want):
        raise Unproven(f"the model reads its answers at positions {_few(got)}, the task at {_few(want)}",
                       {"positions": [int(p) for p in want[:4]]})
    return answer_map(spec.values, model.answers)


def answer_map(values: Any, labels: Any) -> np.ndarray:
    """For each of ``labels``, the index of the same answer in ``values`` (-1: none), answers compared
    as the verifier compares a model's answer with the truth (:func:`~exactformer.constructions.core.task.same_answer`)."""
    out = np.full(len(labels), -1, dtype=np.int64)
    for i, label in enumerate(labels):
        j = next((j for j, v in enumerate(values) if same_answer(label, v)), -1)
        out[i] = j
    return out


def _few(positions: np.ndarray) -> str:
    return str(positions.tolist()) if positions.size <= 6 else f"{positions[:4].tolist()[:-1]}... ({positions.size})"
