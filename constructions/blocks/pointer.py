"""Heads that follow pointers, the MLP that makes their output exact, and a readout of token codes:
the blocks of P2's induction heads and k-hop as weights (docs/mpc.md, "Weights").

* :class:`FollowPointer` (one head): the query slot holds the position code of a position a <= p
  (exactly, written by an earlier layer or the positional embedding), the key slot the position
  code of every position; the head copies ``value_scale`` x the value slots at the key whose code
  is the query's. With +-1 codes of width m distinct codewords agree in at most m - 2 entries, so
  the target's logit is ``eta m`` and every other at most ``eta (m - 2)``.
* :class:`LatestMatch` (one head, P2's sigma): the query is the token code of the token at p, the
  keys are token codes of the tokens at key(j) (key(j) = j - 1: the previous token, written by a
  :class:`FollowPointer` head), plus an *order* on the keys read from their position code (weights
  lam 2^(b-1) on bit b: lam j up to a constant) and a *default* key at the BOS position (bonus
  kappa)::

      logit(p, j) = eta <code(w_p), code(w_key(j))> + lam j + kappa [j = 0]

  A match scores eta M + lam j, a non-match at most eta (M - 4) + lam j (balanced token codes,
  :mod:`exactformer.constructions.codes.tokens`), the default eta (-1) + kappa: with
  2 eta > lam N + margin and kappa = eta M the latest match wins by lam over every earlier match and
  by 2 eta - lam N over every non-match, and without a match the default wins.
* :class:`CleanCode` (MLP, in place): ``out <- clip(raw, -1, 1)`` and ``raw <- 0`` with ReLUs of
  weight +-1: exactly the sign once |raw| >= 1 (a head output within 1/2 of 2 x a +-1 entry).
* :class:`CodeReadout`: logits <code(answer), x> over the token codes: M for the token whose code x
  is, at most M - 2 for every other.

Local certificates (:class:`~exactformer.constructions.blocks.base.PointerHead`; the MLPs and the
readout are certified from their weights by the pointer certificate,
:mod:`exactformer.verify.certify.pointer`): every fact is read from the model's own weights and
the facts of the columns the head reads (:mod:`exactformer.constructions.core.pointers`); the rows
are bounded by monotonicity (a weight only grows as the other logits fall) over the worst row the
facts allow, computed with the arithmetic's own operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from exactformer.constructions.blocks.base import block, MLPBlock, PointerHead, ReadoutBlock
from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.blocks.retrieve import unit_product
from exactformer.constructions.codes.tokens import max_other_inner, token_code
from exactformer.constructions.core.pointers import (Copy, Latest, Noisy, PointerContext, Shift, Source, backward,
                                                     code_runs, compose, lookup_shift)
from exactformer.constructions.core.views_ops import head_output
from exactformer.precision.boxes import Arithmetic, Box

#: the clean-up needs the target's weight >= 3/4 and the rest's sum <= 1/4 (:func:`_settles`)


# ------------------------------------------------------------------------------------------------
# the blocks
# ------------------------------------------------------------------------------------------------


@block
@dataclass(frozen=True)
class FollowPointer(PointerHead):
    #: the row is bounded over all T - 1 other keys, and the followed position is never after the query
    masks: ClassVar[tuple[bool, ...]] = (False, True)

    query: str
    key: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction
    value_scale: int = 2

    def emit(self, mb: Any, layer: int) -> int:
        m = mb.layout[self.query].size
        widths = [mb.layout[s].size for s in self.value]
        dh = max(m, sum(widths))
        V, O, at = [], [], 0
        for v, o, w in zip(self.value, self.out, widths):
            V.append((v, self.value_scale * np.eye(w, dh, at, dtype=np.int64)))
            O.append((o, np.eye(dh, w, -at, dtype=np.int64)))
            at += w
        return mb.head(self, layer, dh, Q=[(self.query, self.eta * np.eye(m, dh, dtype=object))],
                       K=[(self.key, np.eye(m, dh, dtype=np.int64))], V=V, O=O, causal=True)

    @staticmethod
    def holds(arith: Arithmetic, eta: Fraction, m: int, n_keys: int) -> bool:
        """The sufficient condition: in the worst row (n_keys - 1 other keys, each agreeing in m - 2
        entries of the +-1 codes) the target's weight is >= 3/4 and the others' sum <= 1/4."""
        P = arith.const(eta)
        return _settles(arith, Box.point(arith.array(P * m)), Box.point(arith.array([P * (m - 2)])), [n_keys - 1])

    def certify_pointer(self, ctx: PointerContext, layer: int, head: int, facts: dict) -> dict:
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        dims = _dims(ctx.arith, hw, where)
        if dims.side:
            raise Unproven(f"{where}: a pointer head's logits read codes only")
        q_src, q_ptr = ctx.copies(dims.q, facts, "query", where)
        k_src, k_ptr = ctx.copies(dims.k, facts, "key", where)
        if k_ptr != () or any(s.table != "pos" for s in (*q_src, *k_src)):
            raise Unproven(f"{where}: the keys must be the positional embedding's code, the query a copy of one")
        order = np.argsort([s.col for s in q_src])
        q_cols = np.array([q_src[i].col for i in order])
        k_cols = np.array([k_src[i].col for i in order])
        if np.any(np.diff(k_cols) != 1) or np.any(np.diff(q_cols) != 1):
            raise Unproven(f"{where}: the head does not pair code coordinate i with code coordinate i")
        q_runs = code_runs(ctx.model.pos_embed, q_cols, where + " (query code)")
        k_runs = code_runs(ctx.model.pos_embed, k_cols, where + " (key code)")
        follow = compose((lookup_shift(q_runs, k_runs, where),), q_ptr)
        if not backward(follow):
            raise Unproven(f"{where}: the pointer it follows can point after the query position")
        code, m = k_runs[0].code, len(k_cols)
        sq, sk = (int(ctx.values(Source("pos", int(c)))[-1]) for c in (q_cols[0], k_cols[0]))
        P = unit_product(ctx, dims.alpha, dims.beta, sq, sk, where)
        top = ctx.arith.code_logits(P, np.array(m), dims.const, m, dims.n)
        other = ctx.arith.code_logits(P, np.array([code.max_distinct_dot()]), dims.const, m, dims.n)
        counts = np.array([[ctx.T - 1]])
        if not _settles(ctx.arith, top, Box(np.asarray(other.lo).reshape(1), np.asarray(other.hi).reshape(1)), [ctx.T - 1]):
            raise Unproven(f"{where}: the worst row does not put weight >= 3/4 on the followed position")
        w_t, w_l = ctx.arith.row_weights(Box(np.asarray(top.lo).reshape(1), np.asarray(top.hi).reshape(1)),
                                         Box(np.asarray(other.lo).reshape(1, 1), np.asarray(other.hi).reshape(1, 1)),
                                         counts)
        _note(ctx, layer, head, type(self).__name__, w_t, w_l, counts)
        return _outputs(ctx, hw, facts, w_t, w_l, counts, follow, where)


@block
@dataclass(frozen=True)
class LatestMatch(PointerHead):
    #: "the latest earlier match": the later keys must be masked (a later match would win otherwise)
    masks: ClassVar[tuple[bool, ...]] = (True,)

    query: str
    key: str
    order: str
    default: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction
    lam: Fraction
    value_scale: int = 2

    def emit(self, mb: Any, layer: int) -> int:
        M, m = mb.layout[self.query].size, mb.layout[self.order].size
        widths = [mb.layout[s].size for s in self.value]
        dh = max(M + m + 1, sum(widths))
        b_Q = np.array([Fraction(0)] * dh, dtype=object)
        b_Q[M:M + m] = [self.lam * 2 ** b / 2 for b in range(m)]  # lam j + const from the bits of j
        b_Q[M + m] = self.eta
        K = [(self.key, np.eye(M, dh, dtype=np.int64)), (self.order, np.eye(m, dh, M, dtype=np.int64)),
             (self.default, M * np.eye(1, dh, M + m, dtype=np.int64))]
        V, O, at = [], [], 0
        for v, o, w in zip(self.value, self.out, widths):
            V.append((v, self.value_scale * np.eye(w, dh, at, dtype=np.int64)))
            O.append((o, np.eye(dh, w, -at, dtype=np.int64)))
            at += w
        return mb.head(self, layer, dh, Q=[(self.query, self.eta * np.eye(M, dh, dtype=object))], K=K, V=V, O=O,
                       b_Q=b_Q, causal=True)

    @staticmethod
    def holds(arith: Arithmetic, eta: Fraction, lam: Fraction, M: int, m: int, n_keys: int) -> bool:
        """The sufficient condition for the builder, in the arithmetic: the rows of
        :meth:`certify_pointer` with the construction's own numbers (token codes: a match M, a
        non-match at most M - 4, the default -1 + M; order steps lam, span lam (2^m - 1))."""
        P, step = arith.const(eta), arith.const(lam)
        return _latest_rows_hold(arith, P * M, P * (M - 4), P * (M - 1), step, step * ((1 << m) - 1), n_keys)

    @staticmethod
    def order_holds(arith: Arithmetic, lam: Fraction, n_keys: int) -> bool:
        """The part of the condition that lambda alone decides (monotone in it): a row whose other keys
        are earlier matches only, d lam below the latest for d = 1, 2, ..."""
        step = arith.const(lam)
        levels = [-step * d for d in range(1, GEOMETRIC + 1)] + [-step * (GEOMETRIC + 1)]
        return _settles(arith, Box.point(arith.array(0)), Box.point(arith.array(levels)), [1] * GEOMETRIC + [n_keys])

    def certify_pointer(self, ctx: PointerContext, layer: int, head: int, facts: dict) -> dict:
        if not ctx.arith.exact:
            raise Unproven("the pointer certificate covers fixed-point arithmetic only")
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        dims = _dims(ctx.arith, hw, where)
        q_src, q_ptr = ctx.copies(dims.q, facts, "query", where)
        k_src, k_ptr = ctx.copies(dims.k, facts, "key", where)
        if q_ptr != () or any(s.table != "tok" for s in (*q_src, *k_src)) or [s.col for s in q_src] != [s.col for s in k_src]:
            raise Unproven(f"{where}: the query must be the token's own code and the keys the same code of other tokens")
        # the token code: entries +-s, rows distinct
        C = ctx.tok_raw(np.array([s.col for s in q_src]))
        s = int(np.abs(C).max())
        if np.any(np.abs(C) != s):
            raise Unproven(f"{where}: the token code's entries are not +-{s}")
        P = int(np.asarray(unit_product(ctx, dims.alpha, dims.beta, s, s, where).lo))
        M = C.shape[1]
        signs = np.sign(C).astype(np.int64)
        if np.unique(signs, axis=0).shape[0] != signs.shape[0]:
            raise Unproven(f"{where}: two tokens share a code")
        # the order: lam j + const from the bits of the keys' position code; the default: a flag
        order = [d for d in dims.side if isinstance(facts.get(d[0]), Copy) and facts[d[0]].source.table == "pos"]
        flags = [d for d in dims.side if d not in order]
        o_src, o_ptr = ctx.copies(np.array([c for c, _, _ in order]), facts, "order", where)
        runs = code_runs(ctx.model.pos_embed, np.array([x.col for x in o_src]), where + " (order)")
        if o_ptr != () or len(runs) != 1 or runs[0].code.family != "binary" or runs[0].offset != 0:
            raise Unproven(f"{where}: the order must read the binary code of every position")
        step, span, o0 = _order(ctx, order, [x.col for x in o_src], where)
        kappa, d0 = _default(ctx, flags, facts, where)
        if d0 != 0:
            raise Unproven(f"{where}: the default key must sit at position 0")
        of = np.asarray(ctx.domains.of)
        query_tokens = np.unique(np.concatenate([np.asarray(ctx.domains.values[d]) for d in np.unique(of[1:])]))
        I_nonmatch = max_other_inner(signs, query_tokens, np.arange(ctx.model.d_vocab))
        I_def = signs[query_tokens] @ signs[_key_tokens_at(ctx, k_ptr, d0)].T
        c = int(np.asarray(dims.const.lo))
        highest = P * M + c + span + kappa + abs(o0)
        if highest > ctx.arith.max_raw or -highest < ctx.arith.min_raw:
            raise Unproven(f"{where}: the logits may saturate (up to {highest} raw)")
        rows = (P * M, P * I_nonmatch, P * int(I_def.min()) + kappa, step, span, ctx.T)
        if not _latest_rows_hold(ctx.arith, *rows, default_top=P * int(I_def.max()) + kappa):
            raise Unproven(f"{where}: a row of the latest-match head does not settle (weight >= 3/4 on the latest "
                           "match, or on the default key without one)", {"kinds": ["all-equal", "no-repeats"]})
        w_t, w_l, counts = _latest_rows(ctx.arith, *rows, default_top=P * int(I_def.max()) + kappa)
        _note(ctx, layer, head, type(self).__name__, w_t, w_l, counts)
        sigma = Latest(key=k_ptr, first=1, default=d0)
        return _outputs(ctx, hw, facts, w_t, w_l, counts, (sigma,), where)


@block
@dataclass(frozen=True)
class CleanCode(MLPBlock):
    """In place: ``out += clip(raw, -1, 1) - out``, ``raw -= raw`` (ReLUs of weight +-1)."""

    raw: str
    out: str

    def emit(self, mb: Any, layer: int) -> None:
        w = mb.layout[self.raw].size
        I, Z = np.eye(w, dtype=np.int64), np.zeros((w, w), dtype=np.int64)
        # units: relu(u + 1), relu(u - 1), relu(u), relu(-u), relu(o), relu(-o)
        W_in = [(self.raw, np.hstack([I, I, I, -I, Z, Z])), (self.out, np.hstack([Z, Z, Z, Z, I, -I]))]
        b_in = np.r_[np.ones(w, np.int64), -np.ones(w, np.int64), np.zeros(4 * w, np.int64)]
        W_out = [(self.out, np.vstack([I, -I, Z, Z, -I, I])), (self.raw, np.vstack([Z, Z, -I, I, Z, Z]))]
        mb.mlp(self, layer, W_in=W_in, b_in=b_in, W_out=W_out, n_units=6 * w)
        mb.b_out(layer, self.out, -np.ones(w, np.int64))


@block
@dataclass(frozen=True)
class CodeReadout(ReadoutBlock):
    """Logits <code(answer), x> on ``slot`` for the token code of ``alphabet`` symbols and bottom."""

    slot: str
    alphabet: int

    def emit(self, mb: Any) -> None:
        codes = token_code(self.alphabet).astype(np.int64)
        mb.unembed(self, W_U=[(self.slot, codes.T)], b_U=np.zeros(codes.shape[0], dtype=np.int64))


# ------------------------------------------------------------------------------------------------
# the logits' form
# ------------------------------------------------------------------------------------------------


@dataclass
class _Dims:
    q: np.ndarray  # query columns of the code dims
    k: np.ndarray  # key columns of the code dims
    alpha: Any  # W_Q entry of the code dims
    beta: Any  # W_K entry of the code dims
    side: list  # (key column, b_Q, W_K entry) of the dims whose query is a bias and key a column
    const: Box  # the summed products of the dims both of whose sides are biases
    n: int  # dims that contribute


def _dims(arith: Arithmetic, hw: dict, where: str) -> _Dims:
    """The head's Q/K dims: code dims (query column i with key column i, one W_Q and one W_K entry),
    bias-times-column dims, bias-only dims and dead dims; anything else is refused."""
    W_Q, W_K, b_Q, b_K = hw["W_Q"], hw["W_K"], hw["b_Q"], hw["b_K"]
    q, k, side, const, alpha, beta = [], [], [], [], None, None
    for d in range(W_Q.shape[1]):
        qr, kr = np.flatnonzero(W_Q[:, d]), np.flatnonzero(W_K[:, d])
        if qr.size == 0 and kr.size == 0:
            if b_Q[d] != 0 and b_K[d] != 0:
                const.append((b_Q[d], b_K[d]))
            continue
        if (qr.size == 0 and b_Q[d] == 0) or (kr.size == 0 and b_K[d] == 0):
            continue  # one side identically 0
        if qr.size == 1 and kr.size == 1 and b_Q[d] == 0 and b_K[d] == 0:
            a, b = W_Q[qr[0], d], W_K[kr[0], d]
            if (alpha is not None and a != alpha) or (beta is not None and b != beta):
                raise Unproven(f"{where}: the code dims have different scales")
            alpha, beta = a, b
            q.append(int(qr[0]))
            k.append(int(kr[0]))
        elif qr.size == 0 and kr.size == 1 and b_K[d] == 0:
            side.append((int(kr[0]), b_Q[d], W_K[kr[0], d]))
        else:
            raise Unproven(f"{where}: head dim {d} is neither a code dim, a bias-times-column dim nor dead")
    return _Dims(np.array(q, dtype=np.int64), np.array(k, dtype=np.int64), alpha, beta, side, _const(arith, const),
                 len(q) + len(side) + len(const))


def _const(arith: Arithmetic, terms: list) -> Box:
    if not terms:
        return Box.point(arith.array(0))
    prods = [arith.mul(Box.point(arith.array(a)), Box.point(arith.array(b))) for a, b in terms]
    return arith.sum(Box(np.stack([np.asarray(p.lo) for p in prods]), np.stack([np.asarray(p.hi) for p in prods])), axis=0)


# ------------------------------------------------------------------------------------------------
# rows
# ------------------------------------------------------------------------------------------------


def _settles(arith: Arithmetic, top: Box, levels: Box, counts: list[int]) -> bool:
    """Whether a row with the target at ``top`` and ``counts`` other keys at each of ``levels`` puts
    weight >= 3/4 on the target and <= 1/4 on the rest (row_weights: monotone in every logit)."""
    if not np.all(np.asarray(levels.hi) < np.asarray(top.lo)):
        return False
    values = np.concatenate([np.ravel(top.hi), np.ravel(top.lo), np.ravel(levels.lo), np.ravel(levels.hi)])
    if arith.exact and (values.max() > arith.max_raw or values.min() < arith.min_raw):
        return False  # the logits would saturate
    w_t, w_l = arith.row_weights(Box(np.asarray(top.lo)[None], np.asarray(top.hi)[None]),
                                 Box(np.asarray(levels.lo)[None], np.asarray(levels.hi)[None]), np.array([counts]))
    hi = np.asarray(w_l.hi)[0]
    if arith.exact:  # raw integers: exact comparisons
        one = arith.one()
        rest = sum(int(h) * int(c) for h, c in zip(hi, counts))
        return 4 * int(np.asarray(w_t.lo)[0]) >= 3 * one and 4 * rest <= one
    # floats: the correctly rounded sum below 1/4 bounds the exact one (rounding is monotone, 1/4 a float)
    return float(np.asarray(w_t.lo)[0]) >= 0.75 and math.fsum(float(h) * c for h, c in zip(hi, counts)) < 0.25


#: earlier matches at distance d <= GEOMETRIC are bounded one by one (d lam below), the rest together
GEOMETRIC = 32


def _latest_levels(match: Any, nonmatch: Any, default: Any, step: Any, span: Any, T: int,
                   default_top: Any = None) -> list[tuple[Any, list[Any], list[int]]]:
    """The two row classes of a latest-match head as (target, levels, counts), logits relative to
    nothing (targets absolute): a match at s (earlier matches d steps below for d = 1 .. GEOMETRIC,
    the rest lower, non-matches at most ``nonmatch + span``, the default key at most ``default_top``)
    and no match (the default key at least ``default``, every candidate a non-match)."""
    dt = default if default_top is None else default_top
    matched = (match, [match - step * d for d in range(1, GEOMETRIC + 1)] + [match - step * (GEOMETRIC + 1),
                                                                          nonmatch + span, dt - step],
               [1] * GEOMETRIC + [T, T, 1])
    unmatched = (default, [nonmatch + span], [T])
    return [matched, unmatched]


def _latest_rows_hold(arith: Arithmetic, match: Any, nonmatch: Any, default: Any, step: Any, span: Any, T: int,
                      default_top: Any = None) -> bool:
    A = arith.array
    return all(_settles(arith, Box.point(A(top)), Box.point(A(levels)), counts)
               for top, levels, counts in _latest_levels(match, nonmatch, default, step, span, T, default_top))


def _latest_rows(arith: Arithmetic, match: Any, nonmatch: Any, default: Any, step: Any, span: Any, T: int,
                 default_top: Any = None) -> tuple[Box, Box, np.ndarray]:
    """The worst of the two row classes: the smallest target weight, the largest weight per other key."""
    A = arith.array
    w_t, w_l, counts = None, [], []
    for top, levels, cnt in _latest_levels(match, nonmatch, default, step, span, T, default_top):
        t, l_ = arith.row_weights(Box.point(A([top])), Box.point(A([levels])), np.array([cnt]))
        w_t = t if w_t is None else Box(np.minimum(w_t.lo, t.lo), np.minimum(w_t.hi, t.hi))
        w_l.append(l_)
        counts += cnt
    lo = np.concatenate([np.asarray(x.lo)[0] for x in w_l])
    hi = np.concatenate([np.asarray(x.hi)[0] for x in w_l])
    return w_t, Box(lo[None], hi[None]), np.array([counts])


def _tokens_at(ctx: PointerContext, position: int) -> np.ndarray:
    return np.asarray(ctx.domains[position])


def _key_tokens_at(ctx: PointerContext, ptr: tuple, position: int) -> np.ndarray:
    """The tokens that can sit at ptr(position): exactly where ptr is made of shifts, else any."""
    if all(isinstance(a, Shift) for a in ptr):
        for a in reversed(ptr):
            position = int(a.apply(np.array([position]))[0])
        return _tokens_at(ctx, position)
    return np.arange(ctx.model.d_vocab)


def _order(ctx: PointerContext, dims: list, src_cols: list[int], where: str) -> tuple[int, int, int]:
    """(smallest step o(j+1) - o(j), span o(max) - o(min), o(0)) of the order term o(j) = sum_b
    round(b_Q round(x_b W_K)) over the bits x_b = +-s of j's binary code, from the weights."""
    A, arith = ctx.arith.array, ctx.arith
    s = int(ctx.values(Source("pos", src_cols[0]))[-1])
    up, down = [], []
    for (col, bq, wk), _ in zip(dims, src_cols):
        k_pos, k_neg = (arith.mul(Box.point(A(v)), Box.point(A(wk))) for v in (s, -s))
        up.append(int(np.asarray(arith.mul(Box.point(A(bq)), k_pos).lo)))
        down.append(int(np.asarray(arith.mul(Box.point(A(bq)), k_neg).lo)))
    gain = [u - d for u, d in zip(up, down)]  # what setting bit b adds
    step = min(gain[b] - sum(gain[:b]) for b in range(len(gain)))
    if step <= 0:
        raise Unproven(f"{where}: the order term is not strictly increasing in the position")
    return step, sum(gain), sum(down)


def _default(ctx: PointerContext, flags: list, facts: dict, where: str) -> tuple[int, int]:
    """The default key's bonus kappa and its position: the one position whose token carries a flag."""
    A, arith = ctx.arith.array, ctx.arith
    if len(flags) != 1:
        raise Unproven(f"{where}: one default dim expected, found {len(flags)}")
    col, bq, wk = flags[0]
    src, ptr = ctx.copies(np.array([col]), facts, "default", where)
    if ptr != () or src[0].table != "tok":
        raise Unproven(f"{where}: the default flag must be the key position's own token")
    raw = ctx.tok_raw(np.array([src[0].col]))[:, 0]
    vals, inv = np.unique(raw, return_inverse=True)
    per_value = np.asarray(arith.mul(Box.point(A(bq)), arith.mul(Box.point(A(vals)), Box.point(A(wk)))).lo)
    bonus = per_value[inv.reshape(-1)]
    flagged = np.array([np.any(bonus[np.asarray(v)] != 0) for v in ctx.domains.values])
    where_flag = np.flatnonzero(flagged[np.asarray(ctx.domains.of)])
    if where_flag.size != 1 or np.unique(bonus[_tokens_at(ctx, int(where_flag[0]))]).size != 1:
        raise Unproven(f"{where}: the default flag must sit at exactly one position, with one value")
    return int(bonus[_tokens_at(ctx, int(where_flag[0]))][0]), int(where_flag[0])


# ------------------------------------------------------------------------------------------------
# the output
# ------------------------------------------------------------------------------------------------


def _outputs(ctx: PointerContext, hw: dict, facts: dict, w_t: Box, w_l: Box, counts: np.ndarray, follow: tuple,
             where: str) -> dict:
    """Per output column: the value column it copies (through one head dim), its values, and the
    head output box for each value at the target (:func:`head_output`), through W_O."""
    arith, A = ctx.arith, ctx.arith.array
    W_V, b_V, W_O = hw["W_V"], hw["b_V"], hw["W_O"]
    out = {}
    for d in np.flatnonzero(np.any(W_V != 0, axis=0)):
        rows, cols = np.flatnonzero(W_V[:, d]), np.flatnonzero(W_O[d])
        if rows.size != 1 or cols.size != 1 or b_V[d] != 0:
            raise Unproven(f"{where}: head dim {d} does not copy one value column into one output column")
        (src,), ptr = ctx.copies(rows, facts, "value", where)
        vals = ctx.values(src)
        v = arith.matmul(Box.point(A(vals.reshape(-1, 1))), W_V[rows][:, [d]])  # [n_vals, 1]
        hull = Box(np.asarray(v.lo).min(axis=0), np.asarray(v.hi).max(axis=0))
        z = head_output(arith, Box(np.asarray(w_t.lo)[0], np.asarray(w_t.hi)[0]), v,
                        Box(np.asarray(w_l.lo)[0], np.asarray(w_l.hi)[0]), np.asarray(counts)[0], hull)
        o = arith.matmul(z, W_O[[d]][:, cols])  # [n_vals, 1]
        out[int(cols[0])] = Noisy(Copy(src, compose(ptr, follow)),
                                  tuple((int(val), Box(np.asarray(o.lo)[i, 0], np.asarray(o.hi)[i, 0]))
                                        for i, val in enumerate(vals)))
    if np.any(np.any(W_O != 0, axis=1) & ~np.any(W_V != 0, axis=0)):
        raise Unproven(f"{where}: a head dim writes without a value")
    return out


def _note(ctx: PointerContext, layer: int, head: int, block: str, w_t: Box, w_l: Box, counts: Any) -> None:
    arith = ctx.arith
    ctx.details.setdefault("heads", []).append({
        "layer": layer, "head": head, "block": block,
        "min_target_weight": str(arith.to_fraction(np.asarray(w_t.lo).reshape(-1)[0])),
        "max_stray_weight": str(sum(arith.to_fraction(v) * int(c) for v, c in zip(np.asarray(w_l.hi).reshape(-1),
                                                                                    np.asarray(counts).reshape(-1))))})
