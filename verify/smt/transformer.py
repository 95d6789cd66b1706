"""A transformer's forward pass as symbolic values (:mod:`exactformer.verify.smt.sym`).

The model is read as it runs (docs/smt.md "What is encoded"): the token and positional embeddings
(tables and position-code blocks, through :meth:`Embedding.raw`), the input vectors of a
``VectorInput``, every weight and bias, each layer's causal flag, the answer positions, and the
format (scale, range, rounding, the rounded exp). Each step is the format's operation in the order
of :mod:`exactformer.verify.executor.forward` (TransformerLens order, docs/precision.md):

    x       = sat(E[tok] (+ vector) + W_pos[t])
    q, k, v = sat(sat(sum_i rnd(x_i W_id)) + b_d)                 (per head)
    s_ij    = sat(sum_d rnd(q_id k_jd))                           (j <= i when causal)
    a_ij    = softmax: d = sat(s - max), e = exp(d), Z = sat(sum e), a = sat(rnd(e S / Z))
    z_id    = sat(sum_j rnd(a_ij v_jd))
    x       = sat(x + sat(sat(sum rnd(z W_O)) + b_O));  MLP likewise with relu;  logits likewise

with rnd(p) = p / S rounded (floor or nearest-even) and sat the clip to [min_raw, max_raw]. Only
what a later step reads is computed: the last layer at the answer position asked for, earlier
layers at the positions the later ones attend to.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import z3

from exactformer.constructions.core.ir import CompiledModel
from exactformer.verify.smt.sym import (ZERO, Acc, Enc, NotCovered, Sym, Tab, Term, add, as_int, clip, const, is_zero, lookup,
                                        lookup_n, prod_rnd, rnd_arr, sub, width, wide)
from exactformer.verify.smt.vectors import CHUNK, Formats, Vec, add_vec, affine, bound, evaluator, relu_vec

QUOTIENT_TABLE = 1 << 12  # a softmax weight e S / Z whose (e, Z) pairs number at most this is a table


class NeedSplit(Exception):
    """An attention row depends on the tokens at a few positions only, and its weighted sum would
    read many more: splitting on those positions (one case per token) keeps the sum a table."""

    def __init__(self, positions: tuple[int, ...]):
        super().__init__(positions)
        self.positions = positions


class Weights:
    """The model's tensors as raw values of the format (checked exact by the IR), per layer."""

    def __init__(self, model: CompiledModel, fmt: Any):
        self.layers = []
        for b in model.blocks:
            a, m = b.attn, b.mlp
            H, dh = a.n_heads, a.d_head
            self.layers.append(dict(
                Q=a.W_Q.raw(fmt), K=a.W_K.raw(fmt), V=a.W_V.raw(fmt), bQ=a.b_Q.raw(fmt), bK=a.b_K.raw(fmt),
                bV=a.b_V.raw(fmt), O=a.W_O.raw(fmt).reshape(H * dh, -1), bO=a.b_O.raw(fmt), causal=bool(a.causal),
                W_in=m.W_in.raw(fmt), b_in=m.b_in.raw(fmt), W_out=m.W_out.raw(fmt), b_out=m.b_out.raw(fmt), H=H, dh=dh))
        self.W_U, self.b_U = model.W_U.raw(fmt), model.b_U.raw(fmt)
        self.embed = model.embed.raw_reader(fmt)
        self.pos = model.pos_embed.raw_reader(fmt)
        self.vector_input = model.vector_input


class Forward:
    """One case's forward pass of a transformer (module docstring), memoised per (layer, position).

    ``shared``: a cache of what depends on one position only (the embedding and the first layer's
    projections), kept across cases; ``split``: whether a row may ask for a case split
    (:class:`NeedSplit`); ``vectors``: position -> the input vector's values (a ``VectorInput``)."""

    def __init__(self, model: CompiledModel, fm: Formats, w: Weights, enc: Enc, T: int, shared: dict,
                 split: bool, vectors: dict[int, list[Sym]] | None = None):
        self.model, self.fm, self.w, self.enc, self.T = model, fm, w, enc, T
        self.shared, self.split, self.vectors = shared, split, vectors or {}
        self.memo: dict[tuple, Vec] = {}

    # ---- the stream ------------------------------------------------------------------------------
    def logits(self, pos: int) -> list[Sym]:
        """The logits at position ``pos`` (raw values of the format)."""
        x = self.resid(len(self.w.layers), pos)
        return affine(self.enc, self.fm, x, self.w.W_U, self.w.b_U).syms

    def resid(self, layer: int, t: int) -> Vec:
        """The residual stream entering block ``layer`` at position t (layer = n_layers: the output)."""
        key = ("x", layer, t)
        if key in self.memo:
            return self.memo[key]
        if layer == 0:
            v = self._embed(t)
        else:
            L = self.w.layers[layer - 1]
            x = self.resid(layer - 1, t)
            heads = [self._head(layer - 1, L, h, t) for h in range(L["H"])]
            z = Vec([s for hv in heads for s in hv.syms]) if len(heads) > 1 else heads[0]
            x = add_vec(self.enc, self.fm, x, affine(self.enc, self.fm, z, L["O"], L["bO"]))
            hid = affine(self.enc, self.fm, x, L["W_in"], L["b_in"])
            hid = relu_vec(self.enc, hid)
            v = add_vec(self.enc, self.fm, x, affine(self.enc, self.fm, hid, L["W_out"], L["b_out"]))
        self.memo[key] = v
        return v

    def _fixed_key(self, t: int) -> int | None:
        """What of the case a value at position t alone depends on: the token fixed there, if any."""
        return self.enc.fixed.get(t)

    def _embed(self, t: int) -> Vec:
        key = ("embed", t, self._fixed_key(t))
        if key in self.shared and t not in self.vectors:
            return self.shared[key]
        enc, fm, w = self.enc, self.fm, self.w
        tok = enc.token(t)
        ids = tok.arr.reshape(-1)
        E = w.embed(ids)  # [cells, d_model]
        P = w.pos(np.array([t]))[0]
        x = np.clip(wide(E, bound(E) + bound(P)) + P, fm.lo, fm.hi)
        deps = tok.deps
        v = Vec(deps=deps, arr=as_int(x.reshape(tok.arr.shape + (E.shape[1],))))
        if t in self.vectors:  # hook_embed = add(W_E[tok], vector): saturated, then the position added
            vi = w.vector_input
            syms = list(v.syms)
            E_sym = Vec(deps=deps, arr=as_int(E.reshape(tok.arr.shape + (E.shape[1],)))).syms
            for c in range(E.shape[1]):
                if vi.col <= c < vi.col + vi.width:
                    e = clip(enc, add(enc, E_sym[c], self.vectors[t][c - vi.col]), fm.lo, fm.hi)
                    syms[c] = clip(enc, add(enc, e, const(int(P[c]))), fm.lo, fm.hi)
            return Vec(syms)
        self.shared[key] = v
        return v

    # ---- linear maps -----------------------------------------------------------------------------
    # ---- attention --------------------------------------------------------------------------------
    def _proj(self, layer: int, L: dict, h: int, kind: str, t: int) -> Vec:
        key = ("proj", layer, h, kind, t)
        if layer == 0 and t not in self.vectors:
            skey = key + (self._fixed_key(t),)
            if skey not in self.shared:
                self.shared[skey] = affine(self.enc, self.fm, self.resid(0, t), L[kind][h], L["b" + kind][h])
            return self.shared[skey]
        if key not in self.memo:
            self.memo[key] = affine(self.enc, self.fm, self.resid(layer, t), L[kind][h], L["b" + kind][h])
        return self.memo[key]

    def _head(self, layer: int, L: dict, h: int, i: int) -> Vec:
        """z at query position i of head h."""
        keys = list(range(i + 1)) if L["causal"] else list(range(self.T))
        q = self._proj(layer, L, h, "Q", i)
        ks = [self._proj(layer, L, h, "K", j) for j in keys]
        vs = [self._proj(layer, L, h, "V", j) for j in keys]
        s = self._scores(q, ks)
        a = self._softmax(s, vs)
        return self._mix(a, vs, L["dh"])

    def _scores(self, q: Vec, ks: list[Vec]) -> list[Sym]:
        """s_j = sat(sum_d rnd(q_d k_jd))."""
        enc, fm = self.enc, self.fm
        out: list[Sym | None] = [None] * len(ks)
        consts = [j for j, k in enumerate(ks) if k.block and not k.deps]
        if q.block and consts and enc.cells(q.deps) <= enc.tab_max:
            K = np.stack([ks[j].arr for j in consts], axis=0)  # [J, d]
            arr = _pair_dot(q.arr, K, fm.S, fm.nearest)  # [cells..., J]
            arr = as_int(np.clip(arr, fm.lo, fm.hi))
            for c, j in enumerate(consts):
                out[j] = Tab(q.deps, arr[..., c])
        for j, k in enumerate(ks):
            if out[j] is not None:
                continue
            if q.block and k.block and enc.cells(tuple(sorted(set(q.deps) | set(k.deps)))) <= enc.tab_max:
                deps, (x, y) = enc.align((Tab(q.deps, q.arr[..., 0]), Tab(k.deps, k.arr[..., 0])))
                xs = q.arr.reshape(x.shape + (q.arr.shape[-1],))
                ys = k.arr.reshape(y.shape + (k.arr.shape[-1],))
                p = rnd_arr(wide(xs, bound(q.arr) * bound(k.arr) * q.arr.shape[-1]) * ys, fm.S, fm.nearest).sum(axis=-1)
                out[j] = Tab(deps, as_int(np.clip(p, fm.lo, fm.hi)))
                continue
            acc = Acc(enc, 1)
            for a, b in zip(q.syms, k.syms):
                acc.add_sym(0, prod_rnd(enc, a, b, fm.S, fm.nearest))
            out[j] = clip(enc, acc.result()[0], fm.lo, fm.hi)
        return out  # type: ignore[return-value]

    def _softmax(self, s: list[Sym], vs: list[Vec]) -> list[Sym]:
        """The format's softmax of one row (App. D, docs/precision.md)."""
        enc, fm = self.enc, self.fm
        if all(isinstance(x, Tab) for x in s) and enc.union_cells(s) <= enc.tab_max:
            deps, arrs = enc.align(s)
            full = as_int(np.stack(np.broadcast_arrays(*arrs), axis=-1))
            a = _softmax_rows(full, fm)
            if deps and self.split:
                reads = set(deps)
                for j, v in enumerate(vs):
                    if np.any(a[..., j] != 0):
                        reads |= set(v.deps) if v.block else {p for x in v.syms if isinstance(x, Tab) for p in x.deps}
                        if not v.block and any(isinstance(x, Term) for x in v.syms):
                            reads |= set(range(len(enc.domains)))
                if enc.cells(tuple(sorted(reads))) > enc.tab_max:
                    raise NeedSplit(deps)
            return [Tab(deps, a[..., j]) for j in range(len(s))]
        return self._softmax_terms(s)

    def _softmax_terms(self, s: list[Sym]) -> list[Sym]:
        enc, fm = self.enc, self.fm
        lo, hi = max(x.lo for x in s), max(x.hi for x in s)
        w = width(min(x.lo for x in s), hi)
        m = enc.fresh("max", w)
        es = [enc.expr(x, w) for x in s]
        enc.side.append(z3.And([m >= e for e in es]))
        enc.side.append(z3.Or([m == e for e in es]))
        vals = None
        if all(x.vals() is not None for x in s):
            vals = tuple(sorted({int(v) for x in s for v in x.vals()}))
        mt = Term(m, lo, hi, vals)
        d0, _ = fm.exp_window
        ex = []
        for x in s:
            d = sub(enc, x, mt)
            if isinstance(d, Term):
                d = Term(d.expr, d.lo, min(d.hi, 0),
                         None if d.vals_ is None else tuple(v for v in d.vals_ if v <= 0) or (0,))
            d = clip(enc, d, fm.lo, 0)
            ex.append(lookup(enc, fm.exp, d, window=(d0, 0)))
        acc = Acc(enc, 1)
        for e in ex:
            acc.add_sym(0, e)
        Z = clip(enc, acc.result()[0], 1, fm.hi)  # Z >= 1: the maximum's e is exp(0)
        return [self._quotient(e, Z) for e in ex]

    def _quotient(self, e: Sym, Z: Sym) -> Sym:
        """sat(rnd(e S / Z)) for 0 <= e, 1 <= Z."""
        enc, fm = self.enc, self.fm
        if is_zero(e):
            return ZERO
        ev, zv = e.vals(), Z.vals()
        if ev is not None and zv is not None and ev.size * zv.size <= QUOTIENT_TABLE:  # a table, not a division
            return lookup_n(enc, lambda x, z: np.minimum(_div(wide(np.asarray(x), e.hi * fm.S) * fm.S, np.asarray(z),
                                                              fm.nearest), fm.hi), [e, Z])
        num_hi = e.hi * fm.S
        w = max(width(0, num_hi), width(Z.lo, Z.hi)) + 1
        n = enc.expr(e, w) * z3.BitVecVal(fm.S, w)
        zz = enc.expr(Z, w)
        q = z3.UDiv(n, zz)
        if fm.nearest:
            r = z3.URem(n, zz)
            r2, zw = z3.ZeroExt(1, r) * 2, z3.ZeroExt(1, zz)
            up = z3.Or(z3.UGT(r2, zw), z3.And(r2 == zw, z3.Extract(0, 0, q) == 1))
            q = q + z3.If(up, z3.BitVecVal(1, w), z3.BitVecVal(0, w))
        top = num_hi // max(Z.lo, 1) + 1  # the quotient's bound (+1: rounding up)
        return clip(enc, Term(q, 0, top), 0, fm.hi)

    def _mix(self, a: list[Sym], vs: list[Vec], dv: int) -> Vec:
        """z_d = sat(sum_j rnd(a_j v_jd))."""
        enc, fm = self.enc, self.fm
        acc = Acc(enc, dv)
        for aj, v in zip(a, vs):
            if is_zero(aj):
                continue
            deps = tuple(sorted(set(aj.deps) | set(v.deps))) if isinstance(aj, Tab) and v.block else None
            if deps is not None and enc.cells(deps) <= enc.tab_max:
                shape = tuple(enc.size(p) for p in deps)
                x = aj.arr.reshape(tuple(enc.size(p) if p in aj.deps else 1 for p in deps) + (1,))
                y = v.arr.reshape(tuple(enc.size(p) if p in v.deps else 1 for p in deps) + (dv,))
                p = rnd_arr(wide(x, bound(aj.arr) * bound(v.arr)) * y, fm.S, fm.nearest)
                acc.add(deps, as_int(np.broadcast_to(p, shape + (dv,)).copy()))
                continue
            for d, vd in enumerate(v.syms):
                acc.add_sym(d, prod_rnd(enc, aj, vd, fm.S, fm.nearest))
        return Vec([clip(enc, x, fm.lo, fm.hi) for x in acc.result()])


def _pair_dot(q: np.ndarray, K: np.ndarray, S: int, nearest: bool) -> np.ndarray:
    """sum_d rnd(q[..., d] K[j, d]) -> [cells..., J]."""
    lead = q.shape[:-1]
    qf = q.reshape(-1, q.shape[-1])
    big = bound(q) * bound(K) * q.shape[-1]
    if K.dtype != object and q.dtype != object and not np.any(K % S) and big < 1 << 53:
        return (qf.astype(np.float64) @ (K // S).T.astype(np.float64)).astype(np.int64).reshape(lead + (K.shape[0],))
    qf = wide(qf, big)
    J = K.shape[0]
    out = np.zeros((qf.shape[0], J), dtype=qf.dtype if qf.dtype == object else np.int64)
    rows = max(1, CHUNK // max(1, qf.shape[0] * q.shape[-1]))
    for j0 in range(0, J, rows):
        blk = qf[:, None, :] * K[None, j0 : j0 + rows, :]
        out[:, j0 : j0 + rows] = rnd_arr(blk, S, nearest).sum(axis=-1)
    return out.reshape(lead + (J,))


def _softmax_rows(s: np.ndarray, fm: Formats) -> np.ndarray:
    """The format's softmax along the last axis of exact raw logits (every step saturated)."""
    m = np.max(s, axis=-1, keepdims=True)
    d = np.maximum(wide(s, 1 << 63) - m, fm.lo)
    e = fm.exp(as_int(d))
    Z = np.minimum(np.sum(wide(e, bound(e) * s.shape[-1]), axis=-1, keepdims=True), fm.hi)
    return as_int(np.minimum(_div(wide(e, bound(e) * fm.S) * fm.S, Z, fm.nearest), fm.hi))


def _div(num: np.ndarray, den: np.ndarray, nearest: bool) -> np.ndarray:
    """num / den rounded (floor, or nearest with ties to even), den > 0, elementwise."""
    q, r = np.divmod(num, den)
    if nearest:
        q = q + ((2 * r > den) | ((2 * r == den) & (q % 2 == 1))).astype(np.int64)
    return q


@evaluator.register
def _transformer(model: CompiledModel, fmt: Any, T: int):
    fm, w = Formats(fmt), Weights(model, fmt)

    def make(enc: Enc, shared: dict, split: bool):
        vi = model.vector_input
        if (vi is None) != (not enc.vectors) or any(width != vi.width for width, _, _ in enc.vectors.values()):
            raise NotCovered("smt: the model's input vectors (VectorInput) are not the ones its task's encoding gives")
        return Forward(model, fm, w, enc, T, shared, split, {p: enc.vector(p) for p in enc.vectors}).logits

    return make
