"""MatchHead: an Exact-Match Attention (EMA) head lowered to one softmax head (P2 Sec. 3.2 and
4.1; docs/ema.md), and MatchIndicator, the MLP that reads its output as "some key matched".

Weights (b = the code width: query and key slots hold codes in {-1, +1}^b, a one-column
``default`` slot marks the BOS token; no 1/sqrt(d_head))::

    q     = eta * [code(query), 1]     (W_Q: query slot * eta -> head dims 0..b-1; b_Q[b] = eta)
    k     = [code(key), 0]             (W_K: key slot -> head dims 0..b-1)
    k_BOS = [0_b, b - 1]               (W_K: default column * (b - 1) -> head dim b)
    V = value slots -> head dims, O = head dims -> out slots (identity)

A real key scores eta (b - 2 Hamming(query, key)): a match eta b, BOS eta (b - 1), every other
key at most eta (b - 2); a position without a code (BOS as a query) scores 0 against real keys.

Guarantee (the sufficient condition, :meth:`MatchHead.conditions`; docs/ema.md "Lowering"): in a
fixed-point format of scale S, if round(e^-eta S) = 0 (eta > ln S under floor rounding), eta b and
b - 1 are representable, c_max S <= max_raw and S <= max_raw, then a row with c >= 1 matches puts
the raw weight round(S/c) (:func:`ema_weight`) on each match and 0 elsewhere, and a row without a
match puts weight 1 on BOS: the head computes fixed-point EMA bit for bit. S >= c_max keeps the
weights positive (else matches read as "no match").

Local certificate (:meth:`MatchHead.certify_head`), from the model's own weights:

1. queries and keys are exact functions of each position's own token (their views are points);
2. the head's dims are *code dims* (queries +-a or 0, keys +-kappa or 0, a row all nonzero or all
   zero there), one *default dim* (every query the same beta_q > 0; keys 0, or beta_k > 0 on rows
   that are 0 on the code dims) and *dead dims* (one side all 0); products of +- entries round
   symmetrically to +-p. So a query and a key at Hamming distance h score sat((b - 2h) p), the
   default key sat(mul(beta_q, beta_k)), a key or query without code 0;
3. the default key sits at exactly one position, for every token allowed there;
4. for every match count c in [0, n] (n = positions that can hold a real key) the rounded row,
   computed with the format's exp and div: every non-matching key (and BOS when c >= 1) gets
   weight exactly 0, each match the EMA weight round(S/c), BOS weight 1 when c = 0;
5. the output at every query: sat(c * mul(w_c, v)) over the values v of the real keys (BOS's value
   when c = 0) -- a table over (the query's own token, c). c becomes a ``match`` variable of the
   view; its meaning (the code id of every query and key token) is what the task's specification
   (:class:`~exactformer.constructions.core.spec.ExistsMatch`) compares with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np
from exactformer.constructions.blocks.base import block, MLPBlock, ViewHead
from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.ir import IRError
from exactformer.constructions.design.precision_search import smallest_grid_eta
from exactformer.constructions.core.views import (
    Box,
    Group,
    MatchCount,
    State,
    Var,
    unique_rows,
)
from exactformer.constructions.core.views_ops import value_tables
from exactformer.precision import Format
from exactformer.precision.boxes import FixedArithmetic

MAX_COUNT_CLASSES = 256  # more distinct outputs than this: counts share classes (boxes of outputs)


def ema_weight(fmt: Format, count: Any) -> Any:
    """The raw weight of each of ``count`` >= 1 matches in fixed-point EMA: sat(round(S / count))
    with the format's rounding (floor, or nearest-even); ``count`` an int or an int array."""
    S = int(fmt.scale)
    c = np.asarray(count, dtype=np.int64)
    q, r = S // c, S % c
    if getattr(fmt, "nearest", False):
        q = q + ((2 * r > c) | ((2 * r == c) & (q % 2 == 1)))
    w = np.minimum(q, int(fmt.max_raw))
    return int(w) if w.ndim == 0 else w


@block
@dataclass(frozen=True)
class MatchHead(ViewHead):
    """One softmax head computing EMA over the codes in slots ``query`` / ``key`` (see the module
    docstring); ``default`` is the one-column slot that is 1 at the BOS token only. Its certificate
    works on int64 fixed-point raw values."""

    fixed_point_only: ClassVar[bool] = True

    query: str
    key: str
    default: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction


    def emit(self, mb: Any, layer: int) -> int:
        b = mb.layout[self.query].size
        if mb.layout[self.key].size != b or mb.layout[self.default].size != 1 or b < 2:
            raise IRError(f"MatchHead: query and key slots need one width b >= 2 and the default slot width 1, got "
                          f"{b}, {mb.layout[self.key].size}, {mb.layout[self.default].size}")
        widths = [mb.layout[s].size for s in self.value]
        dh = max(b + 1, sum(widths))
        e = Fraction(self.eta)
        b_Q = np.array([Fraction(0)] * dh, dtype=object)
        b_Q[b] = e
        Q = [(self.query, (np.eye(b, dh, dtype=np.int64) * e.numerator, e.denominator))]
        K = [(self.key, np.eye(b, dh, dtype=np.int64)), (self.default, (b - 1) * np.eye(1, dh, b, dtype=np.int64))]
        starts = np.cumsum([0] + widths)
        V = [(s, np.eye(w, dh, d0, dtype=np.int64)) for s, w, d0 in zip(self.value, widths, starts)]
        O = [(s, np.eye(dh, w, -d0, dtype=np.int64)) for s, w, d0 in zip(self.out, widths, starts)]
        return mb.head(self, layer, dh, Q=Q, K=K, V=V, O=O, b_Q=b_Q)

    # ---- the sufficient condition (builder side) ---------------------------------------------------
    @staticmethod
    def smallest_eta(fmt: Format) -> Fraction | None:
        """The smallest grid eta with round(e^-eta S) = 0 under the format's exact exp (just above
        ln S under floor rounding, ln 2S under nearest-even), or None when none is representable."""
        f = FixedArithmetic(fmt).fmt
        S, top = int(f.scale), int(f.max_raw)
        guess = int(S * math.log(S * (2 if getattr(f, "nearest", False) else 1)))
        raw = np.arange(max(1, guess - 4), min(top, guess + 4) + 1, dtype=np.int64)
        if raw.size:
            zero = np.asarray(f.exp(-raw)) == 0
            if zero[-1] and (not zero[0] or raw[0] == 1):  # the boundary lies in the window
                return Fraction(int(raw[np.argmax(zero)]), S)
        # exact fallback: bisection (the condition is monotone in eta)
        return smallest_grid_eta(f, f.step, lambda e: int(np.asarray(f.exp(np.array([-int(e * S)])))[0]) == 0)

    @staticmethod
    def conditions(fmt: Format, eta: Fraction, bits: int, max_count: int) -> dict[str, bool]:
        """When the App. D softmax of the lowered head equals fixed-point EMA (module docstring):
        ``exp_minus_eta_is_zero`` round(e^-eta S) = 0 by the format's exact exp; ``sum_in_range``
        max_count * min(S, max_raw) <= max_raw; ``logits_in_range`` eta b and b - 1 representable;
        ``weights_positive`` round(S / max_count) >= 1; ``one_representable`` S <= max_raw; ``ok``
        all of them. ``eta`` must be a grid value of ``fmt``."""
        f = FixedArithmetic(fmt).fmt  # a private copy: the caller's event counts stay untouched
        S, top = int(f.scale), int(f.max_raw)
        e = int(Fraction(eta) * S)
        out = {
            "exp_minus_eta_is_zero": int(np.asarray(f.exp(np.array([-e], dtype=np.int64)))[0]) == 0,
            "sum_in_range": max_count * min(S, top) <= top,
            "logits_in_range": e * bits <= top and (bits - 1) * S <= top,
            "weights_positive": max_count == 0 or ema_weight(f, max_count) >= 1,
            "one_representable": S <= top,
        }
        out["ok"] = all(out.values())
        return out

    # ---- the local certificate ----------------------------------------------------------------------
    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        """The head's output at every position of ``need``, as (group, table [tok, c, dv]) pairs."""
        where = f"blocks.{layer}.attn head {head}"
        arith = ctx.arith
        if not isinstance(arith, FixedArithmetic) or arith.wide:
            raise Unproven(f"{where}: the match head's certificate needs a fixed-point format with int64 raw values")
        hw = ctx.head_weights(layer, head)
        g_of, _ = state.group_of(need)
        qgroups = [int(g) for g in np.unique(g_of)]
        if np.any(g_of < 0):
            raise Unproven(f"{where}: a query position has no view")
        Q = {g: _projection(ctx, state, g, hw["W_Q"], hw["b_Q"], "query", where) for g in qgroups}
        K = [_projection(ctx, state, g, hw["W_K"], hw["b_K"], "key", where) for g in range(len(state.groups))]
        form = _form(arith, [Q[g] for g in qgroups], K, where)
        n_real = _census(state, form, where)
        rows = _rows(arith, form, n_real, where)
        V = value_tables(ctx, state, hw, where)
        v_real = _hull([V["tables"][g][form.key_kind[g] == REAL] for g in range(len(state.groups))])
        v_bos = _hull([V["tables"][g][form.key_kind[g] == DEFAULT] for g in range(len(state.groups))])
        z = _outputs(arith, rows, v_real, v_bos)  # [n + 1, dv]
        zc, zcls = _count_classes(z)
        counts = np.arange(n_real + 1, dtype=np.int64)
        c0 = int(zcls[0])
        out = []
        for qi, g in enumerate(qgroups):
            G = state.groups[g]
            members = np.flatnonzero(np.isin(G.pos, need))
            tok = G.vars[0].take(members)
            qid = form.query_ids[qi]  # per class of the group's tok variable
            real = qid >= 0
            idx = np.where(real[:, None], np.arange(zc.lo.shape[0])[None, :], c0)  # [tok classes, c classes]
            table = Box(np.asarray(zc.lo)[idx], np.asarray(zc.hi)[idx])
            meaning = MatchCount(tok.domain, qid[tok.cls], [g.pos for g in state.groups],
                                 [g.vars[0].domain for g in state.groups],
                                 [form.key_ids[j][state.groups[j].vars[0].cls] for j in range(len(state.groups))])
            var = Var("match", G.pos[members], counts, zcls.astype(np.int64), match=meaning)
            out.append((Group(G.pos[members], [tok, var], table), table))
        ctx.details.setdefault("heads", []).append({
            "layer": layer, "head": head, "block": type(self).__name__, "code_width": form.b,
            "max_count": n_real, "count_classes": int(np.asarray(zc.lo).shape[0]),
            "logit_gap": str(arith.to_fraction(np.array(form.top - form.bos))),
            "min_match_weight": str(arith.to_fraction(np.array(min(rows[1:], default=0))))})
        return out


@block
@dataclass(frozen=True)
class MatchIndicator(MLPBlock):
    """``out = relu(2z) - relu(2z - 1)`` on the one-column slot ``inp``: 0 for z <= 0, 1 for
    z >= 1/2 -- a match head's output is 0 without a match and c round(S/c)/S >= 1/2 with
    1 <= c <= S matches (floor: c floor(S/c) > S - c and >= c; nearest: >= S - c/2)."""

    inp: str
    out: str

    def emit(self, mb: Any, layer: int) -> None:
        mb.mlp(self, layer, W_in=[(self.inp, np.array([[2, 2]]))], b_in=np.array([0, -1]),
               W_out=[(self.out, np.array([[1], [-1]]))], n_units=2)


# ------------------------------------------------------------------------------------------------
# step 1-2: projections and the logits' form
# ------------------------------------------------------------------------------------------------

REAL, DEFAULT, SILENT, NONE = 0, 1, 2, 3  # kinds of key rows (NONE: a query without code)


def _projection(ctx: CertContext, state: State, g: int, W: np.ndarray, b: np.ndarray, what: str, where: str) -> np.ndarray:
    """The exact query or key vector of every class of group ``g`` [ncls, d_head] (raw values)."""
    G = state.groups[g]
    if len(G.vars) != 1 or G.vars[0].kind != "tok" or not np.array_equal(G.vars[0].at, G.pos):
        raise Unproven(f"{where}: the {what}s at positions {G.pos[:4].tolist()} are not functions of their own "
                       "tokens alone")
    rows = np.flatnonzero(np.any(W != 0, axis=1))
    try:
        ci = state.col_index(rows)
    except KeyError as e:
        raise Unproven(f"{where}: the {what}s read untracked columns ({e})") from None
    ncls = G.vars[0].ncls
    x = G.table[..., ci]
    p = ctx.arith.affine(x, W[rows], b) if rows.size else Box.point(np.broadcast_to(np.asarray(b), (ncls, b.size)))
    if not p.is_point():
        raise Unproven(f"{where}: the {what}s at positions {G.pos[:4].tolist()} are not exact (their views are boxes)")
    return np.asarray(p.lo)


@dataclass
class _Form:
    b: int  # code dims
    p: int  # raw logit of one unit of code agreement
    top: int  # raw logit of a match: sat(b p)
    near: int  # largest raw logit of a non-matching real key: sat((b - 2) p)
    bos: int  # raw logit of the default key: sat(mul(beta_q, beta_k))
    query_ids: list[np.ndarray]  # per query group: id per class (-1: no code)
    key_ids: list[np.ndarray]  # per key group: id per class (-1: not a real key)
    key_kind: list[np.ndarray]  # per key group: REAL / DEFAULT / SILENT per class


def _form(arith: FixedArithmetic, Q: list[np.ndarray], K: list[np.ndarray], where: str) -> _Form:
    Qa, Ka = np.concatenate(Q), np.concatenate(K)
    live = np.any(Qa != 0, axis=0) & np.any(Ka != 0, axis=0)
    dims = np.flatnonzero(live)

    def is_default(d: int) -> bool:
        others = dims[dims != d]
        marked = Ka[:, d] != 0
        return bool(Qa[0, d] > 0 and np.all(Qa[:, d] == Qa[0, d]) and np.all(Ka[:, d] >= 0)
                    and not np.any(Ka[np.ix_(marked, others)]))

    cand = [int(d) for d in dims if is_default(int(d))]
    if len(cand) != 1:
        raise Unproven(f"{where}: no single default dim (every query the same positive value; keys 0 except on rows "
                       "without code)")
    dd = cand[0]
    code = dims[dims != dd]
    b = code.size
    if b < 2:
        raise Unproven(f"{where}: the head has {b} code dims (at least 2 keep the default key below a match)")
    a = _magnitude(Qa[:, code], "query", where)
    kappa = _magnitude(Ka[:, code], "key", where)
    beta_k = np.unique(Ka[Ka[:, dd] != 0, dd])
    if beta_k.size != 1:
        raise Unproven(f"{where}: the default key takes {beta_k.size} values on the default dim (exactly one needed)")
    # products of +- entries, every sign combination (the format's rounding must be symmetric)
    A = arith.array
    pr = np.asarray(arith.mul(Box.point(A([a, a, -a, -a])), Box.point(A([kappa, -kappa, kappa, -kappa]))).lo)
    if not (pr[0] == pr[3] == -pr[1] == -pr[2]) or pr[0] <= 0:
        raise Unproven(f"{where}: products of +- code entries do not round symmetrically to +-p with p > 0")
    p = int(pr[0])
    bos = int(np.asarray(arith.mul(Box.point(A([Qa[0, dd]])), Box.point(A([int(beta_k[0])]))).lo)[0])
    top = int(arith.saturate(np.array([b * p], dtype=object))[0])
    near = int(arith.saturate(np.array([(b - 2) * p], dtype=object))[0])
    # code ids: equal sign patterns, one id space for queries and keys
    qcode = [np.sign(q[:, code]) for q in Q]
    kcode = [np.sign(k[:, code]) for k in K]
    allc = np.concatenate(qcode + kcode)
    _, ids = unique_rows(allc.astype(np.int64))
    coded = np.all(allc != 0, axis=1)
    ids = np.where(coded, ids, -1)
    cuts = np.cumsum([0] + [len(x) for x in qcode + kcode])
    split = [ids[cuts[i]:cuts[i + 1]] for i in range(len(cuts) - 1)]
    kinds = []
    for k, kid in zip(K, split[len(Q):]):
        kind = np.where(kid >= 0, REAL, np.where(k[:, dd] != 0, DEFAULT, SILENT))
        if np.any((kind == REAL) & (k[:, dd] != 0)):
            raise Unproven(f"{where}: a key with a code is nonzero on the default dim")
        if np.any((kind == SILENT) & np.any(k[:, dims] != 0, axis=1)):
            raise Unproven(f"{where}: a key row is neither a code, the default key, nor zero")
        kinds.append(kind)
    return _Form(b, p, top, near, bos, split[:len(Q)], [np.where(kk == REAL, i, -1) for kk, i in
                                                        zip(kinds, split[len(Q):])], kinds)


def _magnitude(M: np.ndarray, what: str, where: str) -> int:
    """The common magnitude of the code entries: every row all nonzero (+-m) or all zero."""
    nz = M != 0
    if np.any(np.any(nz, axis=1) & ~np.all(nz, axis=1)):
        raise Unproven(f"{where}: a {what} row is zero on some code dims but not all")
    mags = np.unique(np.abs(M[nz]))
    if mags.size != 1:
        raise Unproven(f"{where}: the {what} code entries take {mags.size} magnitudes (one +-m needed)")
    return int(mags[0])


# ------------------------------------------------------------------------------------------------
# step 3-5: the default key, the rows per count, the output
# ------------------------------------------------------------------------------------------------


def _census(state: State, form: _Form, where: str) -> int:
    """The number of positions that can hold a real key, after checking that the default key sits
    at exactly one position, whatever the token there."""
    default_pos, n_real = [], 0
    for G, kind in zip(state.groups, form.key_kind):
        tok_kind = kind[G.vars[0].cls]
        if np.any(tok_kind == DEFAULT):
            if not np.all(tok_kind == DEFAULT):
                raise Unproven(f"{where}: at positions {G.pos[:4].tolist()} the default key depends on the token",
                               {"positions": G.pos[:4].tolist()})
            default_pos.extend(G.pos.tolist())
        elif np.any(tok_kind == REAL):
            n_real += G.pos.size
    if len(default_pos) != 1:
        raise Unproven(f"{where}: the default (BOS) key sits at {len(default_pos)} positions (exactly one needed)",
                       {"positions": default_pos[:4]})
    return n_real


def _rows(arith: FixedArithmetic, form: _Form, n: int, where: str) -> np.ndarray:
    """Every row type, c = 0 .. n matches, computed with the format's exp and div (step 4): the raw
    weight of each match in a row with c >= 1 matches, at index c, and BOS's weight at c = 0."""
    f = arith.fmt
    rest = max(form.near, 0)  # every non-matching key scores at most this
    if not (form.top > form.bos > rest):
        raise Unproven(f"{where}: the logits are not ordered match > BOS > every other key "
                       f"({form.top}, {form.bos}, {rest} raw)", {"counts": [0, 1]})

    def e(d: int) -> int:  # exp of the saturated difference d (raw)
        return int(np.asarray(f.exp(arith.saturate(np.array([d], dtype=np.int64))))[0])

    e0 = e(0)
    leaks = {"BOS below a match": e(form.bos - form.top), "a key below a match": e(rest - form.top),
             "a key below BOS": e(rest - form.bos)}
    for what, val in leaks.items():
        if val:
            raise Unproven(f"{where}: the exponential of {what} rounds to {Fraction(val, int(f.scale))}, not 0 (eta too "
                           "small for the format: needs round(e^-eta S) = 0)", {"counts": [0, 1], "near": True})
    w0 = int(np.asarray(f.div(np.array([e0]), np.array([e0])))[0])  # c = 0: BOS alone
    if w0 != int(f.scale):
        raise Unproven(f"{where}: a row without a match gives BOS the weight {Fraction(w0, int(f.scale))}, not 1")
    c = np.arange(1, n + 1, dtype=np.int64)
    Z = arith.saturate(c.astype(object) * e0).astype(np.int64)
    wc = np.asarray(f.div(np.full(n, e0, dtype=np.int64), Z)).astype(np.int64)
    want = ema_weight(f, c)
    bad = np.flatnonzero(wc != want)
    if bad.size:
        cc = int(c[bad[0]])
        raise Unproven(f"{where}: with {cc} matches each gets the raw weight {int(wc[bad[0]])}, EMA's is "
                       f"{int(want[bad[0]])} (the softmax sum c e(0) saturates, or 1 is not representable)",
                       {"counts": [cc]})
    return np.concatenate([[w0], wc])


def _hull(tables: list[Box]) -> Box | None:
    parts = [t for t in tables if np.asarray(t.lo).size]
    if not parts:
        return None
    lo = np.min(np.concatenate([np.asarray(t.lo) for t in parts]), axis=0)
    hi = np.max(np.concatenate([np.asarray(t.hi) for t in parts]), axis=0)
    return Box(lo, hi)


def _outputs(arith: FixedArithmetic, w: np.ndarray, v_real: Box | None, v_bos: Box) -> Box:
    """z[c] = sat(c * mul(w_c, v)) over the real keys' values (c >= 1); z[0] = mul(w_0, v_BOS)."""
    z0 = arith.mul(Box.point(arith.array([w[0]])), v_bos)  # [dv]
    if w.size == 1:
        return Box(np.asarray(z0.lo)[None, :], np.asarray(z0.hi)[None, :])
    m = arith.mul(Box.point(arith.array(w[1:])[:, None]), Box(np.asarray(v_real.lo)[None, :], np.asarray(v_real.hi)[None, :]))
    c = np.arange(1, w.size, dtype=object)[:, None]
    lo = arith.saturate(c * np.asarray(m.lo).astype(object))
    hi = arith.saturate(c * np.asarray(m.hi).astype(object))
    return Box(np.concatenate([np.asarray(z0.lo)[None, :], lo]), np.concatenate([np.asarray(z0.hi)[None, :], hi]))


def _count_classes(z: Box) -> tuple[Box, np.ndarray]:
    """Classes of the counts c = 0..n: equal outputs share a class; when there are more than
    :data:`MAX_COUNT_CLASSES` distinct outputs, counts with neighbouring outputs (in sorted order)
    share one, its table entry the hull of theirs. c = 0 keeps a class of its own. Returns the
    table [classes, dv] and the class of each count."""
    rows = np.concatenate([np.asarray(z.lo), np.asarray(z.hi)], axis=1)
    urows, cls = unique_rows(rows)
    if urows.shape[0] <= MAX_COUNT_CLASSES:
        dv = rows.shape[1] // 2
        return Box(urows[:, :dv], urows[:, dv:]), cls
    order = np.lexsort(rows[1:].T[::-1]) + 1  # counts >= 1 by output
    bucket = np.empty(rows.shape[0], dtype=np.int64)
    bucket[0] = 0
    bucket[order] = 1 + np.arange(order.size) * (MAX_COUNT_CLASSES - 1) // order.size
    k = int(bucket.max()) + 1
    lo = np.stack([np.asarray(z.lo)[bucket == j].min(axis=0) for j in range(k)])
    hi = np.stack([np.asarray(z.hi)[bucket == j].max(axis=0) for j in range(k)])
    return Box(lo, hi), bucket
