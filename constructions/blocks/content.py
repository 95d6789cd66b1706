"""Heads whose attention depends on the content of the input (Theorem 7, App. G.2 of P1): the first
layer of nearest neighbour and of associative recall, the second layer that follows an address the
first one wrote, and the MLP that turns the retrieved address into an exact code.

Blocks:

* :class:`RetrieveNearest` (Thm 7, layer 1): at query position L (an input token carrying x_L),
  ``logit(L, t) = eta <x_L, x_t> - eta c_self <C1(L), C1(t)> - eta c_label FL_t``; the value is
  ``2 sigma2(addr(t))``. Under the task's precondition (norms^2 <= rho^2, the nearest candidate
  ahead by margin gamma) the rounded row puts weight >= a on the nearest candidate j*.
* :class:`RetrieveByMatch` (MQAR, layer 1): ``logit(L, t) = eta <C(s_L), C(s_t)> - eta c_label FX_t``
  with a symbol code C read from the token embedding: under the task's precondition (exactly one
  candidate position holds the query's symbol) the row puts weight >= a on it. All logits exact.
* :class:`SignClip` (MLP): ``S = relu(u + 1) - relu(u - 1) - 1 = clip(u, -1, 1)``, exactly +-1 once
  |u| >= 1 (weights and biases +-1: exact in every format).
* :class:`RetrieveByAddress` (layer 2): :class:`RetrieveByPosition` whose query code is *written by an
  earlier layer*: its local certificate reads the query vectors from the views (they must be
  exact code vectors) and looks them up against the key code's generator.

Local certificates (fixed-point arithmetics; every fact read from the model's own weights):

1. *logit form* (:func:`_dims`): every head dim of Q/K is a vector dim (query and key read the same
   coordinate of the vector-input columns; one query scale alpha > 0, key scale exactly 1), a code
   dim (query and key read coordinate i of their code slots: the product of +-1 entries is +-P,
   symmetric in rounding), a flag dim (the query is a bias, the key reads table columns: the product
   is computed exactly for every (key position, token)), a bias-only dim or dead;
2. *rows*: for every query position L the bound on every other key's logit relative to the target
   (NN: by the margin, with the rounding of the vector products bounded by E1 = D(rho sqrt(d') + d')
   and E2 = D(2 rho sqrt(d') + d'), D the grid step; the code and flag terms exactly from the
   codes' generators and the embedding), the logits checked unsaturated; the rounded row from
   ``arith.row_weights`` (monotone in every logit difference once the target is the strict maximum);
3. *output*: for every candidate j, the head output ``head_output(w_t, value(j), w_l, counts, hull)`` with the
   values read from the value slot's position code (no views: ``view_columns`` is empty); the
   query's view gains a content variable (``Var("content")``) over the candidates, whose meaning
   (:class:`~exactformer.constructions.core.views.ContentRule`) the task's specification checks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from exactformer.constructions.blocks.base import block, MLPBlock, ViewHead
from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.blocks.retrieve import (RetrieveByPosition, CodeSource, CodeSide, key_runs, logit_form, retrieval_rows,
                                                      unit_product)
from exactformer.constructions.codes.products import CodeWorkError, histograms, pair_inner, same_generator
from exactformer.constructions.codes.weights import CodeAlgebraError, ReedSolomonAlgebra, algebra_of, block_counts
from exactformer.constructions.core import runs
from exactformer.constructions.core.views import Box, CodeAxis, ContentRule, Group, State, Var, unique_rows
from exactformer.constructions.core.views_ops import head_output, value_tables

#: content pointers whose values are a Reed--Solomon∘Hadamard code are held by their code (two
#: classes) rather than listed per candidate; False lists them (the regression tests compare both)
CODE_AXIS = True


# ------------------------------------------------------------------------------------------------
# the blocks
# ------------------------------------------------------------------------------------------------


@block
@dataclass(frozen=True)
class SignClip(MLPBlock):
    """``out = clip(inp, -1, 1)`` per coordinate: exactly the sign for |inp| >= 1 (P1 App. G.2's sigma)."""

    inp: str
    out: str

    def emit(self, mb: Any, layer: int) -> None:
        k = mb.layout[self.inp].size
        W_in = np.repeat(np.eye(k, dtype=np.int64), 2, axis=1)  # units 2l, 2l+1 read u_l
        W_out = np.zeros((2 * k, k), dtype=np.int64)
        W_out[2 * np.arange(k), np.arange(k)], W_out[2 * np.arange(k) + 1, np.arange(k)] = 1, -1
        mb.mlp(self, layer, W_in=[(self.inp, W_in)], b_in=np.tile([1, -1], k), W_out=[(self.out, W_out)], n_units=2 * k)
        mb.b_out(layer, self.out, -np.ones(k, dtype=np.int64))


@dataclass(frozen=True)
class _DerivedHead(ViewHead):
    """A head whose queries, keys and values the local certificate derives from the weights, the
    codes' generators and the task's precondition: it reads no views (``view_columns`` is empty).
    Its certificate works on raw fixed-point values (:class:`_Form`)."""

    fixed_point_only: ClassVar[bool] = True
    masks: ClassVar[tuple[bool, ...]] = (False, True)  # the rows are bounded over the keys the layer's flag lets in

    def view_columns(self, model: Any, head_weights: dict[str, np.ndarray]) -> np.ndarray:
        return np.zeros(model.d_model, dtype=bool)


@block
@dataclass(frozen=True)
class RetrieveNearest(_DerivedHead):
    """Theorem 7's first layer (P1 App. G.2, reconstructed in docs/nearest-neighbor.md)::

        Q = eta x (vec) | -eta c_self gram C1 (code) | b_Q = -eta c_label
        K =     x (vec) |                  C1 (code) | FL (flag)
        V = value_scale * value (the address code), O = identity into ``out``; causal

    ``value_scale``: 2 for a +-1 address code (then |out| >= 1 with the right sign once the target
    weight is >= 3/4 and the rest <= 1/4: :class:`SignClip` makes it exact), 1 for a 0/1 code (then
    every coordinate is within 1/4 of the code: a BitThreshold makes it exact)."""

    vec: str
    code: str
    flag: str
    value: str
    out: str
    eta: Fraction
    c_self: Fraction
    c_label: Fraction
    gram: Fraction
    value_scale: int = 2

    def emit(self, mb: Any, layer: int) -> int:
        d, k1, k2 = (mb.layout[s].size for s in (self.vec, self.code, self.value))
        dh = max(d + k1 + 1, k2)
        cq = -self.eta * self.c_self * self.gram
        b_Q = np.array([Fraction(0)] * dh, dtype=object)
        b_Q[d + k1] = -self.eta * self.c_label
        Q = [(self.vec, _eye(d, dh, 0, self.eta)), (self.code, _eye(k1, dh, d, cq))]
        K = [(self.vec, np.eye(d, dh, dtype=np.int64)), (self.code, np.eye(k1, dh, d, dtype=np.int64)),
             (self.flag, np.eye(1, dh, d + k1, dtype=np.int64))]
        return mb.head(self, layer, dh, Q=Q, K=K, V=[(self.value, self.value_scale * np.eye(k2, dh, dtype=np.int64))],
                       O=[(self.out, np.eye(dh, k2, dtype=np.int64))], b_Q=b_Q, causal=True)

    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        where = f"blocks.{layer}.attn head {head}"
        form = _Form(ctx, layer, head, where, vec=ctx.slot(self.vec), code=(ctx.slot(self.code), ctx.slot(self.code)))
        pre = ctx.domains.precondition
        if pre is None or getattr(pre, "margin", None) is None:
            raise Unproven(f"{where}: the task states no margin precondition on its input vectors")
        vals = _Values(ctx, layer, form.hw, ctx.slot(self.value), where)
        out = []
        for L in need:
            out.append(self._query(ctx, form, vals, int(L), Fraction(pre.margin), Fraction(pre.max_norm_sq), where))
        return out

    def _query(self, ctx: CertContext, form: "_Form", vals: "_Values", L: int, gamma: Fraction, rho2: Fraction,
               where: str) -> tuple[Group, Box]:
        arith = ctx.arith
        keys = form.visible(L)
        tok_L = ctx.domains[L]
        if not np.all(form.carries(tok_L)):
            raise Unproven(f"{where}: the query at position {L} does not carry an input vector", {"positions": [L]})
        t, u = _pairs(ctx, keys)
        vec = form.carries(u)
        cand_mask = vec & (t != L)
        C = np.unique(t[cand_mask])
        if np.any(np.isin(t[~vec], C)) or C.size == 0:
            raise Unproven(f"{where}: query {L}: candidate positions must carry a vector for every token "
                           "(and there must be one)", {"positions": [L]})
        S = arith.const(Fraction(1))  # raw units per 1
        alpha = Fraction(form.alpha, S)
        if alpha <= 0:
            raise Unproven(f"{where}: the query's vector scale {alpha} is not positive")
        code = form.code_terms(L, t, u)  # [pairs] exact raw code products (P * I)
        rest = code + form.flag_terms(t, u)  # [pairs] exact raw code + flag (+ bias-only) terms
        kinds = {"candidates": cand_mask, "self": vec & (t == L), "other": ~vec}
        tops, counts = {}, {}
        for name, mask in kinds.items():
            n = np.unique(t[mask]).size - (1 if name == "candidates" else 0)
            if n > 0:
                tops[name], counts[name] = Fraction(int(np.max(rest[mask])), S), n
        upper, span = nearest_bounds(Fraction(1, S), alpha, gamma, rho2, form.vec_dims.size,
                                     Fraction(int(np.min(rest[cand_mask])), S), tops, Fraction(int(np.max(np.abs(rest))), S))
        if span * S > arith.max_raw or -span * S < arith.min_raw:
            raise Unproven(f"{where}: query {L}: logits may saturate (|logit| <= {float(span):.4g})", {"positions": [L]})
        upper = [math.floor(upper[k] * S) for k in tops]  # raw: the computed differences are integers
        counts = [counts[k] for k in tops]
        if any(U >= 0 for U in upper):
            raise Unproven(f"{where}: query {L}: the nearest candidate is not provably the strict row maximum "
                           f"(relative bounds {[str(Fraction(U, S)) for U in upper]})", {"positions": [L]})
        row = row_from_levels(arith, upper, counts)
        return _output(ctx, vals, L, C, row, ContentRule("nearest", L, tuple(int(c) for c in C), gamma, rho2),
                       where, {"upper": upper, "counts": counts})


@block
@dataclass(frozen=True)
class RetrieveByMatch(_DerivedHead):
    """Associative recall's first layer (the lean MQAR construction, docs/nearest-neighbor.md)::

        Q = eta gram C(s) (sym) | b_Q = -eta c_label
        K =          C(s) (sym) | FX (flag: label tokens and second-half inputs)
        V = value_scale * value (the address code, see RetrieveNearest), O = identity into ``out``; causal
    """

    sym: str
    flag: str
    value: str
    out: str
    eta: Fraction
    c_label: Fraction
    gram: Fraction
    value_scale: int = 2

    def emit(self, mb: Any, layer: int) -> int:
        ks, k2 = mb.layout[self.sym].size, mb.layout[self.value].size
        dh = max(ks + 1, k2)
        b_Q = np.array([Fraction(0)] * dh, dtype=object)
        b_Q[ks] = -self.eta * self.c_label
        K = [(self.sym, np.eye(ks, dh, dtype=np.int64)), (self.flag, np.eye(1, dh, ks, dtype=np.int64))]
        return mb.head(self, layer, dh, Q=[(self.sym, _eye(ks, dh, 0, self.eta * self.gram))], K=K,
                       V=[(self.value, self.value_scale * np.eye(k2, dh, dtype=np.int64))],
                       O=[(self.out, np.eye(dh, k2, dtype=np.int64))],
                       b_Q=b_Q, causal=True)

    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        where = f"blocks.{layer}.attn head {head}"
        cols = ctx.slot(self.sym)
        form = _Form(ctx, layer, head, where, vec=np.zeros(0, dtype=np.int64), code=(cols, cols))
        vals = _Values(ctx, layer, form.hw, ctx.slot(self.value), where)
        groups = _key_groups(ctx, form)
        return [self._query(ctx, form, vals, groups, int(L), where) for L in need]

    def _query(self, ctx: CertContext, form: "_Form", vals: "_Values", groups: list, L: int, where: str) -> tuple[Group, Box]:
        """Key positions fall into groups of equal domain and flag terms (first-half inputs,
        second-half inputs, labels); per query token s and group: the target level P I(s, s) + F(s)
        where s is allowed, and the largest level of any other token, from the code's histograms."""
        arith = ctx.arith
        S_tok = np.asarray(ctx.domains[L])
        vis = []
        for pos, toks, F in groups:
            p = pos[pos <= L] if form.causal else pos  # the query's own position is a key too (its level: "own")
            if p.size:
                vis.append((p, toks, F))
        top = np.full(S_tok.size, arith.min_raw - 1, dtype=object)  # the best level any key reaches, per s
        levels = []  # per group: (own level [S] or None, best other level [S])
        for p, toks, F in vis:
            own, other = form.token_levels(S_tok, toks, F)
            levels.append((own, other))
            top = np.maximum(top, other) if own is None else np.maximum(np.maximum(top, other), own)
        cand = [g for g, (own, _) in enumerate(levels) if own is not None and np.all(own == top)]
        C = np.sort(np.concatenate([vis[g][0] for g in cand])) if cand else np.zeros(0, np.int64)
        if len(cand) != 1:
            raise Unproven(f"{where}: query {L}: the query's own symbol reaches the top logit in {len(cand)} groups of "
                           "key positions (one is needed)", {"positions": [L]})
        gi = cand[0]
        target_lo = int(np.min(levels[gi][0]))
        n_c, n_o = C.size - 1, sum(vis[g][0].size for g in range(len(vis)) if g != gi)
        hi_c = int(np.max(levels[gi][1]))
        hi_o = max([int(np.max(np.maximum(lv[1], lv[0]) if lv[0] is not None else lv[1]))
                    for g, lv in enumerate(levels) if g != gi], default=arith.min_raw)
        upper = [h - target_lo for h, n in ((hi_c, n_c), (hi_o, n_o)) if n > 0]
        counts = [n for n in (n_c, n_o) if n > 0]
        if any(U >= 0 for U in upper):
            raise Unproven(f"{where}: query {L}: the matching position is not the strict row maximum", {"positions": [L]})
        row = row_from_levels(arith, upper, counts)
        return _output(ctx, vals, L, C, row, ContentRule("equal", L, tuple(int(c) for c in C)), where,
                       {"upper": upper, "counts": counts})


@block
@dataclass(frozen=True)
class RetrieveByAddress(RetrieveByPosition):
    """:class:`RetrieveByPosition` whose query code an earlier layer wrote (Theorem 7's second layer:
    the query is sigma2(addr(j*)), the keys the positional code C2). Same weights; the local
    certificate reads each query vector from the views (every entry +-s exactly), looks it up among
    the keys' code vectors and bounds the causal row of keys 0..L exactly as RetrieveByPosition does;
    the output is a pointer variable based on the view variable the query vector depends on. A query
    held by a content pointer's code (:class:`~exactformer.constructions.core.views.CodeAxis`) is
    looked up by the code's algebra instead, once for every candidate (:meth:`_query_held`)."""

    reads_code_axis: ClassVar[bool] = True
    masks: ClassVar[tuple[bool, ...]] = (False, True)  # the rows are bounded over the keys the layer's flag lets in

    def view_columns(self, model: Any, head_weights: dict[str, np.ndarray]) -> np.ndarray:
        """The query code (written by an earlier layer) and the values are read from views."""
        read = np.zeros(model.d_model, dtype=bool)
        for s in (self.query, *self.value):
            start, width = model.layout[s]
            read[start:start + width] = True
        return read

    def emit(self, mb: Any, layer: int) -> int:
        h = super().emit(mb, layer)
        mb.layers[layer].causal = True
        return h

    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        qcols, kcols = ctx.slot(self.query), ctx.slot(self.key)
        if ctx.written and np.any(ctx.written[layer][kcols]):
            raise Unproven(f"{where}: an earlier layer writes into the key code columns")
        form = logit_form(ctx, hw, qcols, kcols, where)
        alpha, beta, const, n_dims = form
        gens: list[Any] = []
        ksrc = CodeSource(ctx, kcols, "key", gens)
        V = value_tables(ctx, state, hw, where)
        causal = ctx.model.blocks[layer].attn.causal
        g_of, m_of = state.group_of(np.asarray(need, dtype=np.int64))
        if np.any(g_of < 0):
            raise Unproven(f"{where}: no view of position {int(np.asarray(need)[g_of < 0][0])}")
        views = [state.groups[int(g)].take(np.array([m])) for g, m in zip(g_of, m_of)]
        held = [G.follows_any(state.col_index(qcols)) for G in views]
        if not all(held):  # queries listed per class: every key's vector indexed
            keys = ksrc.keys(ctx.T)
            kg = np.unique(keys.gen[keys.gen >= 0])
            if kg.size != 1:
                raise Unproven(f"{where}: the key slot must hold vectors of one code")
            kgen = gens[int(kg[0])]
            lookup = _VectorIndex(kgen, keys.idx[keys.gen >= 0])
        out = []
        for p, G, h in zip(need, views, held):
            if h:
                out.append(self._query_held(ctx, state, int(p), G, qcols, ksrc, alpha, beta, const, n_dims, V, causal, where))
            else:
                out.append(self._query(ctx, state, int(p), G, qcols, keys, kgen, lookup, gens, alpha, beta, const, n_dims,
                                       V, causal, where))
        return out

    def _query_held(self, ctx: CertContext, state: State, p: int, G: Group, qcols: np.ndarray, ksrc: CodeSource,
                    alpha: Any, beta: Any, const: Box, n_dims: int, V: dict, causal: bool, where: str) -> tuple[Group, Box]:
        """The row at query p whose query code is held by a content pointer J (:class:`CodeAxis`):
        the query columns must follow the code's coordinates 0..k-1 in order with the exact values
        -sq / +sq for the entry classes, so the query vector is sq * code(J + offset) for every
        candidate J; the target is the key holding that vector (the key code's runs, the same
        generator); every other visible key is an *optional* key of the whole code's weight
        distribution (the keys' indices lie in an aligned block [0, 2^b), whose histogram from any
        of its vectors is ``block_counts``) or of the keys without a code vector (inner product 0):
        a causal prefix holds a sub-multiset of it (docs/positions.md, causal rows). The output is a
        pointer variable based on J."""
        arith = ctx.arith
        if not arith.exact:
            raise Unproven(f"{where}: a code-held query is certified in fixed-point arithmetic only")
        held = [i for i, v in enumerate(G.vars) if v.code is not None and v.uid in G.follows]
        qi = state.col_index(qcols)
        if len(held) != 1 or any(np.any(f[qi] >= 0) for u, f in G.follows.items() if u != G.vars[held[0]].uid):
            raise Unproven(f"{where}: the query code at position {p} depends on {len(held)} code-held pointers (one is needed)",
                           {"positions": [p]})
        b = held[0]
        bv = G.vars[b]
        k = qcols.size
        if not np.array_equal(G.follows[bv.uid][qi], np.arange(k)):
            raise Unproven(f"{where}: the query columns at position {p} do not follow the chosen candidate's code "
                           "coordinate by coordinate", {"positions": [p]})
        lo = np.moveaxis(np.asarray(G.table.lo)[..., qi], b, 0)
        hi = np.moveaxis(np.asarray(G.table.hi)[..., qi], b, 0)
        sq = int(lo[1].reshape(-1)[0]) if lo.size else 0
        if lo.shape[0] != 2 or not np.array_equal(lo, hi) or sq <= 0 or np.any(lo[0] != -sq) or np.any(lo[1] != sq):
            raise Unproven(f"{where}: the query code at position {p} is not exactly -s / +s for the code's two entries",
                           {"positions": [p]})
        gen, off = bv.code.gen, int(bv.code.offset)
        try:
            key_runs_ = key_runs(ksrc.code_runs("pos", ctx.T))
            algebra = ReedSolomonAlgebra(gen)
        except (runs.Declined, CodeAlgebraError) as e:
            raise Unproven(f"{where}: {e}") from e
        if any(name == "tok" for name, _ in ksrc.blocks) or not key_runs_:
            raise Unproven(f"{where}: the key slot must hold position code vectors only")
        if any(not same_generator(r.gen, gen) for r in key_runs_) or any(r.slope != 1 and r.count > 1 for r in key_runs_):
            raise Unproven(f"{where}: the keys are not runs of the query's code", {"positions": [p]})
        n_vis = p + 1 if causal else ctx.T
        spans = sorted((r.start, r.start + r.count, r.first) for r in key_runs_)
        if any(a1 > b0 for (_, a1, _), (b0, _, _) in zip(spans, spans[1:])):
            raise Unproven(f"{where}: two key positions hold the same code vector")
        idx = np.asarray(bv.domain, dtype=np.int64) + off  # the query's vector index for every candidate
        tg = np.full(idx.size, -1, dtype=np.int64)
        for s0, s1, first in spans:
            sel = (idx >= s0) & (idx < s1)
            tg[sel] = idx[sel] - s0 + first
        if np.any(tg < 0) or np.any(tg >= n_vis):
            c = int(bv.domain[np.flatnonzero((tg < 0) | (tg >= n_vis))[0]])
            raise Unproven(f"{where}: candidate {c}'s code vector is held by no key position visible from {p}",
                           {"positions": [p, c]})
        top = max(s1 for _, s1, _ in spans)
        bits = max(1, int(top - 1).bit_length())
        m, q = int(gen.m), int(gen.q)
        try:
            hist = np.array(block_counts(m, bits), dtype=np.int64)  # agreements a = 0 .. q over [0, 2^bits)
        except CodeAlgebraError as e:
            raise Unproven(f"{where}: {e}") from e
        hist[q] -= 1  # the query's own vector (the target)
        keyed = sum(min(r.count, max(0, n_vis - r.first)) for r in key_runs_)
        hist[0] += n_vis - keyed  # visible keys without a code vector: inner product 0
        P = unit_product(ctx, alpha, beta, sq, ksrc.scale_of(("pos",)), where)
        logit = arith.code_logits(P, algebra.levels, const, int(gen.k), n_dims)  # [q + 1]
        opt = hist[None, :]
        t_lo = np.asarray(logit.lo)[q]
        if np.any((opt[0] > 0) & ~(np.asarray(logit.hi) < t_lo)):
            raise Unproven(f"{where}: at position {p} the target's logit is not above every other key's", {"positions": [p]})
        levels = Box(np.asarray(logit.lo)[None, :], np.asarray(logit.hi)[None, :])
        w_t, w_l = arith.row_weights(logit[q:q + 1], levels, np.zeros_like(opt), opt)
        ref, t_tab = _retrieved_values(state, V, tg, p, where)
        z = head_output(arith, w_t[0], t_tab, w_l[0], opt[0], V["hull"])  # [target classes, dv]
        shape = (bv.ncls,) + np.shape(z.lo)  # [the pointer's classes (the same row for each), target classes, dv]
        z = Box(np.broadcast_to(np.asarray(z.lo), shape), np.broadcast_to(np.asarray(z.hi), shape))
        ptr = Var("ptr", tg[None, :], ref.vars[0].domain, ref.vars[0].cls, base=0)
        ctx.details.setdefault("heads", []).append({
            "block": type(self).__name__, "position": p, "row_classes": 1, "query": "held by code",
            "min_target_weight": str(arith.to_fraction(np.asarray(w_t.lo)[0])),
            "method": "Reed-Solomon weight distribution (a causal prefix: optional keys)"})
        return Group(np.array([p]), [bv, ptr], z), z

    def _query(self, ctx, state, p, G, qcols, keys, kgen, lookup, gens, alpha, beta, const, n_dims, V, causal, where):
        arith = ctx.arith
        tab = G.table[..., state.col_index(qcols)]
        lo, hi = np.asarray(tab.lo).reshape(-1, qcols.size), np.asarray(tab.hi).reshape(-1, qcols.size)
        if not np.array_equal(lo, hi):
            raise Unproven(f"{where}: the query code at position {p} is not exact in its view", {"positions": [p]})
        sq = int(np.max(lo)) if lo.size else 0
        if sq <= 0 or not np.all((lo == 0) | (lo == sq) | (lo == -sq)) or np.any(np.all(lo == 0, axis=1)):
            raise Unproven(f"{where}: the query code at position {p} is not a vector of entries in {{-s, 0, s}}",
                           {"positions": [p]})
        code_idx = lookup.find(np.sign(lo.astype(np.int64)))  # [classes] code index, -1 if none
        if np.any(code_idx < 0):
            raise Unproven(f"{where}: a query vector at position {p} is no key code vector", {"positions": [p]})
        P = unit_product(ctx, alpha, beta, sq, keys.scale, where)
        n_vis = p + 1 if causal else ctx.T
        vis = CodeSide(keys.gen[:n_vis], keys.idx[:n_vis], keys.scale)
        q = CodeSide(np.zeros(code_idx.size, dtype=np.int64), code_idx, sq, np.full(code_idx.size, p), np.zeros(code_idx.size, np.int64))
        gens_q = [kgen]
        rows = retrieval_rows(dataclasses.replace(ctx, T=n_vis), P, const, n_dims, gens_q, q, vis, where)
        target = rows.target.reshape(np.shape(tab.lo)[:-1])  # per class assignment of G's variables
        varies = [a for a in range(target.ndim) if np.any(np.ptp(target, axis=a) != 0)]
        if len(varies) != 1:
            raise Unproven(f"{where}: the retrieved position at {p} depends on {len(varies)} variables of the view "
                           "(a pointer needs exactly one)", {"positions": [p]})
        b = varies[0]
        bv = G.vars[b]
        cls = rows.cls.reshape(target.shape)
        first = tuple(0 if a != b else slice(None) for a in range(target.ndim))
        tgt_of_cls, row_of_cls = target[first], cls[first]  # [ncls of the base variable]
        tg = tgt_of_cls[bv.cls]  # target position of each value of the base variable
        ref, t_tab = _retrieved_values(state, V, tg, p, where)
        ur, inv = np.unique(row_of_cls, return_inverse=True)  # few row classes: one output table each
        zs = [head_output(arith, rows.w_t[int(r)], t_tab, rows.w_l[int(r)], rows.counts[int(r)], V["hull"]) for r in ur]
        z = Box(np.stack([np.asarray(x.lo) for x in zs])[inv.reshape(-1)], np.stack([np.asarray(x.hi) for x in zs])[inv.reshape(-1)])
        ptr = Var("ptr", tg[None, :].astype(np.int64), ref.vars[0].domain, ref.vars[0].cls, base=0)
        ctx.details.setdefault("heads", []).append({
            "block": type(self).__name__, "position": p,
            "row_classes": int(rows.w_t.lo.size), "min_target_weight": str(arith.to_fraction(np.min(rows.w_t.lo))),
            "method": rows.method})
        return Group(np.array([p]), [bv, ptr], z), z


# ------------------------------------------------------------------------------------------------
# shared pieces
# ------------------------------------------------------------------------------------------------


def _retrieved_values(state: State, V: dict, tg: np.ndarray, p: int, where: str) -> tuple[Group, Box]:
    """(a view of the retrieved positions ``tg``, their value table): every retrieved position's view
    must be its own token alone, with the same classes and value table (so one table serves every
    candidate of a pointer)."""
    tgroups = np.unique(state.group_of(tg)[0])
    if np.any(tgroups < 0):
        raise Unproven(f"{where}: a retrieved position has no view", {"positions": [p]})
    ref = state.groups[int(tgroups[0])]
    for gi in tgroups:
        T_g = state.groups[int(gi)]
        if (len(T_g.vars) != 1 or T_g.vars[0].kind != "tok" or not np.array_equal(T_g.vars[0].domain, ref.vars[0].domain)
                or not np.array_equal(T_g.vars[0].cls, ref.vars[0].cls)
                or not np.array_equal(V["tables"][gi].lo, V["tables"][tgroups[0]].lo)
                or not np.array_equal(V["tables"][gi].hi, V["tables"][tgroups[0]].hi)):
            raise Unproven(f"{where}: the retrieved positions do not all hold the same kind of value", {"positions": [p]})
    return ref, V["tables"][int(tgroups[0])]


def _eye(n: int, dh: int, offset: int, scale: Fraction) -> tuple[np.ndarray, int]:
    """``scale`` times an identity block [n, dh] starting at head dim ``offset``, exactly."""
    s = Fraction(scale)
    return np.eye(n, dh, offset, dtype=np.int64) * s.numerator, s.denominator


def nearest_bounds(step: Fraction, alpha: Fraction, gamma: Fraction, rho2: Fraction, d: int, target_min: Fraction,
                   tops: dict[str, Fraction], abs_max: Fraction) -> tuple[dict[str, Fraction], Fraction]:
    """Upper bounds on ``logit(t) - logit(j*)`` for the keys of each kind of a nearest-neighbour row,
    and a bound on every |logit| (all in value units), from the margin precondition.

    ``alpha``: the query's vector scale (keys' scale 1); ``gamma``, ``rho2``: the margin and the
    bound on squared norms; ``d``: the vector dims; ``step``: the grid step (every rounding errs by
    less than one step); ``target_min``: the least code + flag term a candidate can have;
    ``tops[kind]``: the largest code + flag term among keys of that kind ("candidates": other
    candidates, "self": the query's own key, "other": keys without a vector); ``abs_max``: the
    largest |code + flag term|. The vector part of logit(L, t) is S_x(t) = sum_i round(q_i x_ti),
    q_i = round(alpha x_Li); with E1 = step (rho sqrt(d) + d), E2 = step (2 rho sqrt(d) + d):
    |S_x(t) - alpha <x_L, x_t>| <= E1 and S_x(t) - S_x(j*) <= alpha (<x_L, x_t> - <x_L, x_j*>) + E2;
    <x_L, x_t> - <x_L, x_j*> <= -gamma (candidates), <= 2 rho^2 (self), and S_x = 0 for keys
    without a vector."""
    rho = _sqrt_up(rho2)
    sqd = math.isqrt(d) + (math.isqrt(d) ** 2 != d)
    E1, E2 = step * (rho * sqd + d), step * (2 * rho * sqd + d)
    xs = {"candidates": -alpha * gamma + E2, "self": 2 * alpha * rho2 + E2, "other": alpha * rho2 + E1}
    return {k: xs[k] + top - target_min for k, top in tops.items()}, alpha * rho2 + E1 + abs_max


def _sqrt_up(x: Fraction) -> Fraction:
    """A rational >= sqrt(x) (exact when x is a square of a rational with a square denominator)."""
    num, den = x.numerator, x.denominator
    r, s = math.isqrt(num), math.isqrt(den)
    if r * r == num and s * s == den:
        return Fraction(r, s)
    return Fraction(math.isqrt(num * den * 4**20) + 1, den * 2**20)


def _pairs(ctx: CertContext, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every (key position, token) the task's domains allow at ``positions``."""
    return ctx.domains.pairs(np.asarray(positions, dtype=np.int64))


class _Form:
    """The head's Q/K dims, classified (module docstring, step 1), and the exact code and flag
    terms of its logits."""

    def __init__(self, ctx: CertContext, layer: int, head: int, where: str, vec: np.ndarray,
                 code: tuple[np.ndarray, np.ndarray]):
        if not ctx.arith.exact:
            raise Unproven(f"{where}: content-dependent heads are certified in fixed-point arithmetic only")
        self.ctx, self.where, self.layer = ctx, where, layer
        self.causal = ctx.model.blocks[layer].attn.causal
        hw = self.hw = ctx.head_weights(layer, head)
        W_Q, W_K, b_Q, b_K = hw["W_Q"], hw["W_K"], hw["b_Q"], hw["b_K"]
        m = ctx.model
        vi = m.vector_input
        vcols = np.zeros(0, dtype=np.int64) if vi is None else np.asarray(vi.cols)
        qc, kc = code
        vec_d, vec_i, code_d, code_i, flag_d, const = [], [], [], [], [], 0
        alpha = beta = ca = cb = None
        for d in range(W_Q.shape[1]):
            qr, kr = np.flatnonzero(W_Q[:, d]), np.flatnonzero(W_K[:, d])
            if (qr.size == 0 and b_Q[d] == 0) or (kr.size == 0 and b_K[d] == 0):
                continue  # one side identically 0
            if qr.size == 0 and kr.size == 0:
                const += int(ctx.arith.mul(Box.point(b_Q[d]), Box.point(b_K[d])).lo)
                continue
            if qr.size == 0:
                flag_d.append(d)
                continue
            if qr.size != 1 or kr.size != 1 or b_Q[d] != 0 or b_K[d] != 0:
                raise Unproven(f"{where}: head dim {d} is neither a vector, code, flag nor bias-only dim")
            if vec.size and qr[0] in vec and kr[0] == qr[0]:
                a, b = int(W_Q[qr[0], d]), int(W_K[kr[0], d])
                if (alpha is not None and a != alpha) or (beta is not None and b != beta):
                    raise Unproven(f"{where}: the vector dims have different scales")
                alpha, beta = a, b
                vec_d.append(d)
                vec_i.append(int(np.flatnonzero(vec == qr[0])[0]))
                continue
            iq, ik = np.flatnonzero(qc == qr[0]), np.flatnonzero(kc == kr[0])
            if iq.size != 1 or ik.size != 1 or iq[0] != ik[0]:
                raise Unproven(f"{where}: head dim {d} pairs no vector or code coordinates")
            a, b = int(W_Q[qr[0], d]), int(W_K[kr[0], d])
            if (ca is not None and a != ca) or (cb is not None and b != cb):
                raise Unproven(f"{where}: the code dims have different scales")
            ca, cb = a, b
            code_d.append(d)
            code_i.append(int(iq[0]))
        if vec.size:
            if vi is None or not np.array_equal(np.sort(vec), np.sort(vcols)):
                raise Unproven(f"{where}: the vector slot is not the model's vector input")
            if sorted(vec_i) != list(range(vec.size)):
                raise Unproven(f"{where}: the head pairs {len(vec_i)} of the {vec.size} vector coordinates")
            if beta != ctx.arith.const(Fraction(1)):
                raise Unproven(f"{where}: the keys' vector scale must be exactly 1")
            for name, emb in (("token", m.embed), ("positional", m.pos_embed)):
                if np.any(emb.nonzero_columns()[vcols]):
                    raise Unproven(f"{where}: the {name} embedding writes into the vector-input columns")
            if ctx.written and np.any(ctx.written[layer][vcols]):
                raise Unproven(f"{where}: an earlier layer writes into the vector-input columns")
        if code_d and sorted(code_i) != list(range(qc.size)):
            raise Unproven(f"{where}: the head pairs {len(code_i)} of the {qc.size} code coordinates")
        if ctx.written and np.any(ctx.written[layer][np.concatenate([qc, kc])]):
            raise Unproven(f"{where}: an earlier layer writes into the code columns")
        self.alpha, self.vec_dims = alpha, np.array(vec_d, dtype=np.int64)
        self.flag_dims, self.const = np.array(flag_d, dtype=np.int64), const
        self.has_code = bool(code_d)
        if code_d:
            self.gens: list[Any] = []
            self.qsrc = CodeSource(ctx, qc, "query", self.gens)
            self.ksrc = CodeSource(ctx, kc, "key", self.gens)
            self.ca, self.cb = ca, cb

    def carries(self, tokens: np.ndarray) -> np.ndarray:
        vi = self.ctx.model.vector_input
        return np.zeros(np.shape(tokens), bool) if vi is None else np.isin(tokens, np.asarray(vi.tokens))

    def visible(self, L: int) -> np.ndarray:
        return np.arange(L + 1 if self.causal else self.ctx.T)

    def flag_terms(self, t: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Raw sum over the flag and bias-only dims of the rounded products q_d k_d at every key
        (position t, token u): q_d is the query's bias, k_d the key projection of the embedding."""
        ctx, arith = self.ctx, self.ctx.arith
        out = np.full(t.size, self.const, dtype=object)
        if self.flag_dims.size == 0:
            return out
        W_K, b_K, b_Q = self.hw["W_K"], self.hw["b_K"], self.hw["b_Q"]
        rows = np.flatnonzero(np.any(W_K[:, self.flag_dims] != 0, axis=1))
        if ctx.written and np.any(ctx.written[self.layer][rows]):
            raise Unproven(f"{self.where}: a flag dim's key reads a column an earlier layer writes")
        vi = ctx.model.vector_input
        if vi is not None and np.any(np.isin(rows, np.asarray(vi.cols))):
            raise Unproven(f"{self.where}: a flag dim's key reads the vector-input columns")
        fmt = arith.fmt
        x = np.asarray(fmt.add(ctx.model.embed.raw(u, fmt, rows), ctx.model.pos_embed.raw(t, fmt, rows)))
        k = arith.affine(Box.point(x), W_K[np.ix_(rows, self.flag_dims)], b_K[self.flag_dims])
        prod = arith.mul(Box.point(np.broadcast_to(b_Q[self.flag_dims], k.lo.shape)), k)
        return out + np.sum(np.asarray(prod.lo).astype(object), axis=-1)

    def code_terms(self, L: int, t: np.ndarray, u: np.ndarray, query_token: int | None = None) -> np.ndarray:
        """Raw P * I at every key (t, u): I the integer inner product of the query's code vector
        (position L, token ``query_token`` or the position's only token) with the key's."""
        if not self.has_code:
            return np.zeros(t.size, dtype=object)
        tok = int(np.asarray(self.ctx.domains[L])[0]) if query_token is None else query_token
        gp, ip, sp = self.qsrc._lookup("pos", np.array([L]))
        gt, it, st = self.qsrc._lookup("tok", np.array([tok]))
        if gp[0] >= 0 and gt[0] >= 0:
            raise Unproven(f"{self.where}: both embeddings fill the query code slot at position {L}")
        qg, qi = (gp[0], ip[0]) if gp[0] >= 0 else (gt[0], it[0])
        kgp, kip, ksp = self.ksrc._lookup("pos", t)
        kgt, kit, kst = self.ksrc._lookup("tok", u)
        if np.any((kgp >= 0) & (kgt >= 0)):
            raise Unproven(f"{self.where}: both embeddings fill the key code slot at some key")
        kg, ki = np.where(kgp >= 0, kgp, kgt), np.where(kgp >= 0, kip, kit)
        P = int(np.asarray(unit_product(self.ctx, self.ca, self.cb, self.qsrc._scale(sp | st), self.ksrc._scale(ksp | kst), self.where).lo))
        I = np.zeros(t.size, dtype=np.int64)
        if qg >= 0:
            for g in np.unique(kg[kg >= 0]):
                sel = kg == g
                if not same_generator(self.gens[int(g)], self.gens[int(qg)]):
                    raise Unproven(f"{self.where}: query and key code vectors come from different codes")
                I[sel] = pair_inner(self.gens[int(qg)], np.full(int(sel.sum()), qi), self.gens[int(g)], ki[sel])
        return P * I.astype(object)

    def token_levels(self, S_tok: np.ndarray, toks: np.ndarray, F: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """For query tokens S_tok and a key group holding tokens ``toks`` with flag terms F (raw):
        (the logit of the key holding s itself, or None where s is not allowed there; the largest
        logit of a key holding any other token), both exact: sat(P I(C(s), C(u)) + F(u)). Token
        codes only (read from the token embedding on both sides)."""
        arith = self.ctx.arith
        gq, iq, sq = self.qsrc._lookup("tok", S_tok)
        gk, ik, sk = self.ksrc._lookup("tok", toks)
        if self.qsrc._lookup("pos", np.arange(self.ctx.T))[0].max(initial=-1) >= 0 or \
                self.ksrc._lookup("pos", np.arange(self.ctx.T))[0].max(initial=-1) >= 0:
            raise Unproven(f"{self.where}: the symbol code slot holds positional codes")
        if np.any(gq < 0):
            raise Unproven(f"{self.where}: a query token holds no code vector")
        P = int(np.asarray(unit_product(self.ctx, self.ca, self.cb, self.qsrc._scale(sq), self.ksrc._scale(sk), self.where).lo))
        gens = np.unique(np.concatenate([gq, gk[gk >= 0]]))
        if any(not same_generator(self.gens[int(g)], self.gens[int(gens[0])]) for g in gens):
            raise Unproven(f"{self.where}: query and key code vectors come from different codes")
        gen = self.gens[int(gens[0])]
        coded = gk >= 0
        # per distinct flag value: the largest code product among tokens with that flag, excluding s
        other = np.full(S_tok.size, arith.min_raw - 1, dtype=object)
        for f in np.unique(F):
            sel = F == f
            if np.any(sel & ~coded):  # tokens without a code vector: product 0
                other = np.maximum(other, np.asarray(arith.saturate(np.full(S_tok.size, int(f), dtype=object))))
            kj = ik[sel & coded]
            if kj.size == 0:
                continue
            own_here = np.isin(S_tok, toks[sel & coded])
            best = best_other_level(gen, iq, kj) if np.all(own_here) else None
            if best is None:
                try:
                    lv, hist = histograms(gen, iq, gen, kj, self.ctx.device)
                except CodeWorkError as e:
                    raise Unproven(f"{self.where}: {e}") from e
                self_I = pair_inner(gen, iq, gen, iq)
                at = np.searchsorted(lv, self_I)
                hist = hist.copy()
                rows = np.flatnonzero(own_here & (at < lv.size))
                hist[rows, at[rows]] -= 1  # the key holding s itself is not an "other" key
                best = np.where(hist > 0, lv[None, :], np.iinfo(np.int64).min).max(axis=1)
            val = np.asarray(arith.saturate(P * best.astype(object) + int(f)))
            other = np.maximum(other, np.where(best == np.iinfo(np.int64).min, arith.min_raw - 1, val))
        allowed = np.isin(S_tok, toks)
        if not np.any(allowed):
            return None, other
        if not np.all(allowed) or not np.all(coded[np.searchsorted(toks, S_tok)]):
            raise Unproven(f"{self.where}: some query tokens are allowed at a key position and some are not")
        F_s = F[np.searchsorted(toks, S_tok)]
        own = np.asarray(arith.saturate(P * pair_inner(gen, iq, gen, iq).astype(object) + F_s.astype(object)))
        return own, other


def best_other_level(gen: Any, iq: np.ndarray, kj: np.ndarray) -> np.ndarray | None:
    """For each query vector index ``iq``: the largest inner product of a key vector of ``kj`` other
    than the query's own, from the Reed--Solomon∘Hadamard algebra (:func:`~exactformer.constructions.codes.weights.classify`:
    O(log) pieces of queries with one histogram each, a partial shell's keys bounded at its highest
    levels) when the keys are one increasing run of consecutive indices holding every query's own
    vector; ``np.iinfo(np.int64).min`` where there is no other key. None where that does not hold
    (the caller counts histograms from the generator: O(|alphabet|) work and memory)."""
    alg = algebra_of(gen)
    kj, iq = np.asarray(kj, dtype=np.int64), np.asarray(iq, dtype=np.int64)
    if not isinstance(alg, ReedSolomonAlgebra) or kj.size == 0 or iq.size == 0:
        return None
    k0, k1 = int(kj[0]), int(kj[-1]) + 1
    if np.any(np.diff(kj) != 1) or iq.min() < k0 or iq.max() >= k1:  # one increasing run of distinct indices
        return None
    pieces = alg.classify([(k0, k1)], int(iq.min()), int(iq.max()) + 1)
    if any(row is None for _, _, row in pieces):
        return None
    none = np.iinfo(np.int64).min
    top = np.array([max((a for a in range(len(row.exact)) if row.exact[a] + row.optional[a] > 0), default=-1)
                    for _, _, row in pieces], dtype=np.int64)
    level = np.where(top >= 0, alg.levels[np.maximum(top, 0)], none)
    starts = np.array([c0 for c0, _, _ in pieces], dtype=np.int64)
    return level[np.searchsorted(starts, iq, side="right") - 1]


def _key_groups(ctx: CertContext, form: "_Form") -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Key positions grouped by (domain, flag terms of every token of the domain): (positions,
    tokens, raw flag term per token). The flag terms depend on the position only through its
    positional row on the flag columns, so each group's terms are computed at one position."""
    T = ctx.T
    key = np.stack([ctx.domains.of[:T], np.zeros(T, dtype=np.int64)], axis=1)
    if form.flag_dims.size:
        rows = np.flatnonzero(np.any(form.hw["W_K"][:, form.flag_dims] != 0, axis=1))
        key = np.concatenate([key, np.asarray(ctx.model.pos_embed.raw(np.arange(T), ctx.arith.fmt, rows))], axis=1)
    ukey, inv = unique_rows(key)
    out = []
    for g in range(ukey.shape[0]):
        pos = np.flatnonzero(inv == g)
        toks = np.asarray(ctx.domains[int(pos[0])])
        out.append((pos, toks, form.flag_terms(np.full(toks.size, pos[0]), toks)))
    return out


class _Values:
    """The head's values, derived from the value slot's position code (no views): every value dim
    reads one column of the slot (or none: its bias); the slot is filled only by positional code
    blocks and no earlier layer writes it."""

    def __init__(self, ctx: CertContext, layer: int, hw: dict, cols: np.ndarray, where: str):
        W_V, b_V = hw["W_V"], hw["b_V"]
        self.vdims = np.flatnonzero(np.any(W_V != 0, axis=0) | (b_V != 0))
        rows = np.flatnonzero(np.any(W_V != 0, axis=1))
        if np.setdiff1d(rows, cols).size:
            raise Unproven(f"{where}: the values read columns outside the value code slot")
        if ctx.written and np.any(ctx.written[layer][cols]):
            raise Unproven(f"{where}: an earlier layer writes into the value code slot")
        Wv = W_V[:, self.vdims]
        if np.any(np.count_nonzero(Wv, axis=0) > 1):
            raise Unproven(f"{where}: a value dim reads more than one column")
        self.src_col = np.where(np.any(Wv != 0, axis=0), np.argmax(Wv != 0, axis=0), -1)  # global column per dim
        self.w = Wv[np.maximum(self.src_col, 0), np.arange(self.vdims.size)]
        self.b = b_V[self.vdims]
        self.slot = cols
        gens: list[Any] = []
        self.src = CodeSource(ctx, cols, "value", gens)
        if any(name == "tok" for name, _ in self.src.blocks):
            raise Unproven(f"{where}: the value code depends on the token")
        self.ctx, self.gens = ctx, gens
        s = self.src._scale({Fraction(b.scale) for _, b in self.src.blocks})
        self.s = int(s)
        # hull over every key: the slot's entries are +-s (sign codes), 0 or s (0/1 codes), 0 (uncovered rows)
        entries = {0} if sum(b.count for _, b in self.src.blocks) < ctx.T else set()
        for _, b in self.src.blocks:
            entries |= {-self.s, self.s} if getattr(b.code, "is_sign_code", True) else {0, self.s}
        cand = np.array(sorted(entries), dtype=np.int64)[:, None]
        vals = self._apply(np.broadcast_to(cand, (cand.size, self.vdims.size)))
        self.hull = Box(np.asarray(vals.lo).min(axis=0), np.asarray(vals.hi).max(axis=0))

    def _apply(self, entries: np.ndarray) -> Box:
        """Values for slot entries ``entries`` [n, dv] (the entry each dim reads): add(mul(e, w), b)."""
        arith = self.ctx.arith
        e = np.where(self.src_col >= 0, entries, 0)
        return arith.add(arith.mul(Box.point(arith.array(e)), Box.point(self.w)), Box.point(self.b))

    def code_axis(self, C: np.ndarray) -> tuple[CodeAxis, np.ndarray] | None:
        """The candidates' values held by their code (:class:`CodeAxis`): (axis, coordinate each
        value dim follows) where every candidate's value vector is vector ``C + offset`` of one
        Reed--Solomon∘Hadamard +-1 code whose algebra checks (one offset for all: identity code
        runs, read from the value slot's code blocks); None otherwise (the values are then listed
        per candidate)."""
        try:
            code_runs = self.src.code_runs("pos", self.ctx.T)
        except runs.Declined:
            return None
        offsets = set()
        covered = np.zeros(C.size, dtype=bool)
        for r in code_runs:
            inside = (C >= r.first) & (C < r.first + r.count)
            if np.any(inside):
                if r.slope != 1 or not isinstance(algebra_of(r.gen), ReedSolomonAlgebra) \
                        or not same_generator(r.gen, code_runs[0].gen):
                    return None
                offsets.add(r.start - r.first)
                covered |= inside
        if len(offsets) != 1 or not np.all(covered):
            return None
        coord = np.where(self.src_col >= 0, np.searchsorted(self.slot, np.maximum(self.src_col, 0)), -1)
        return CodeAxis(code_runs[0].gen, offsets.pop()), coord.astype(np.int64)

    def entry_classes(self) -> Box:
        """The values [2, dv] where every slot entry is -s (class 0) or +s (class 1)."""
        return self._apply(np.array([[-self.s] * self.vdims.size, [self.s] * self.vdims.size], dtype=np.int64))

    def at(self, positions: np.ndarray) -> Box:
        """Exact values [len(positions), dv] at key positions."""
        gid, idx, _ = self.src._lookup("pos", np.asarray(positions, dtype=np.int64))
        nums = np.zeros((positions.size, self.slot.size), dtype=np.int64)
        for g in np.unique(gid[gid >= 0]):
            sel = gid == g
            nums[sel] = np.asarray(self.gens[int(g)].numerators(idx[sel]), dtype=np.int64)
        col = np.searchsorted(self.slot, np.maximum(self.src_col, 0))
        return self._apply(nums[:, col] * self.s)


def row_from_levels(arith: Any, upper: list[int], counts: list[int]) -> tuple[Box, Box, np.ndarray]:
    """(target weight [1], per-key weight at each level [1, L], counts [1, L]) of a row whose target
    is the strict maximum and whose other keys lie ``upper`` (raw, relative) below it or lower."""
    L = len(upper)
    cnt = np.array([counts], dtype=np.int64)
    if L == 0:
        cnt = np.zeros((1, 1), dtype=np.int64)
        upper, L = [arith.min_raw], 1
    lv = Box(arith.array(np.full((1, L), arith.min_raw)), arith.array(np.array([upper])))
    w_t, w_l = arith.row_weights(Box.point(arith.array([0])), lv, cnt)
    return w_t, w_l, cnt


def _output(ctx: CertContext, vals: _Values, L: int, C: np.ndarray, row: tuple, rule: ContentRule, where: str,
            info: dict) -> tuple[Group, Box]:
    """The head output at query L as a table over a content variable whose domain is the candidates C:
    held by its code (two classes, each value dim following its code coordinate) where the values
    are a Reed--Solomon∘Hadamard code of the candidate (:meth:`_Values.code_axis`), else one class
    per candidate."""
    arith = ctx.arith
    w_t, w_l, cnt = row
    held = vals.code_axis(C) if CODE_AXIS else None
    if held is not None:
        axis, follows = held
        z = head_output(arith, w_t[0], vals.entry_classes(), w_l[0], cnt[0], vals.hull)  # [2, dv]
        var = Var("content", np.array([L], dtype=np.int64), C.astype(np.int64), np.arange(2, dtype=np.int64),
                  content=rule, code=axis)
        group = Group(np.array([L], dtype=np.int64), [var], z, {var.uid: follows})
    else:
        z = head_output(arith, w_t[0], vals.at(C), w_l[0], cnt[0], vals.hull)  # [|C|, dv]
        var = Var("content", np.array([L], dtype=np.int64), C.astype(np.int64), np.arange(C.size, dtype=np.int64), content=rule)
        group = Group(np.array([L], dtype=np.int64), [var], z)
    ctx.details.setdefault("heads", []).append({
        "block": rule.rule, "position": L, "candidates": int(C.size), "held_by": "code" if held else "candidate",
        "min_target_weight": str(arith.to_fraction(np.asarray(w_t.lo)[0])),
        "max_stray_weight": str(sum(Fraction(arith.to_fraction(np.asarray(w_l.hi)[0, i])) * int(c)
                                    for i, c in enumerate(cnt[0]))),
        "relative_bounds": [str(Fraction(int(u)) * Fraction(arith.to_fraction(np.array(1)))) for u in info["upper"]]})
    return group, z


class _VectorIndex:
    """Which code index holds a given numerator vector, among the key code vectors ``idx`` of ``gen``
    (hashing the packed rows: exact)."""

    def __init__(self, gen: Any, idx: np.ndarray):
        self.gen = gen
        idx = np.unique(np.asarray(idx, dtype=np.int64))
        rows = np.asarray(gen.numerators(idx), dtype=np.int64)
        keys = self._keys(rows)
        order = np.argsort(keys, kind="stable")
        self.keys, self.idx = keys[order], idx[order]
        if np.any(self.keys[1:] == self.keys[:-1]):
            raise Unproven("two key positions hold the same code vector")

    @staticmethod
    def _keys(rows: np.ndarray) -> np.ndarray:
        packed = np.packbits((rows > 0).astype(np.uint8), axis=1)
        neg = np.packbits((rows < 0).astype(np.uint8), axis=1)
        both = np.ascontiguousarray(np.concatenate([packed, neg], axis=1))
        return both.view(np.dtype((np.void, both.shape[1]))).reshape(-1)

    def find(self, signs: np.ndarray) -> np.ndarray:
        k = self._keys(np.asarray(signs))
        at = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        return np.where(self.keys[at] == k, self.idx[at], -1)
