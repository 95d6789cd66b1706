"""RetrieveByPosition: one head that reads the value at the position whose key code matches the
query code (the attention of Lemma 2 / Theorem 1, App. C.2, and of the first layers of Theorems 6
and 13).

Weights (``k`` = the codes' width, signs stored, 1/k folded into W_Q)::

    Q = (eta * gram) * query code        (W_Q: query slot -> head dims 0..k-1)
    K = key code                          (W_K: key slot   -> head dims 0..k-1)
    [optional] Q_k = eta, K_k = offset    (b_Q, b_K on head dim k: a per-row constant)
    V = value slots -> head dims, O = head dims -> out slots (identity)

so the logit of query position i at key j is eta <T(q(i)), T(j)> + eta * offset: eta on the
matching key and at most eta * mu elsewhere (mu the code's largest off-diagonal inner product).

Guarantee (the sufficient condition, :meth:`RetrieveByPosition.worst_case`): the rounded weight on
the matching key is at least ``target`` and the other keys' weights sum to at most ``rest``, for
the worst row that the code's bound mu allows (every other key at eta * mu), computed with the
format's own operations; rounded softmax weights are monotone in every logit difference once the
target is the row maximum.

Local certificate (:meth:`RetrieveByPosition.certify_head`), from the model's own weights:

1. the head's dims are *code dims* (W_Q and W_K each read one column -- query-slot column i and
   key-slot column i -- with one common raw entry each, zero biases), *bias-only dims* or *dead
   dims* (one side identically zero); both slots are filled by position-code blocks of the
   embeddings (keys by the positional embedding only) whose +/- entries round symmetrically. Then
   every logit is ``sat(P * I + c)`` with I the integer inner product of the two code vectors
   (computed from the codes' generators) and P, c derived from the weights;
2. for every query (position, token) the histogram of I over all T keys; the target is the key
   holding the query's own code vector, required to be the only key at the top level and strictly
   above every other logit; the rounded row is computed once per class of equal (histogram,
   target level);
3. the head output at each query: the target weight times the target's value (a box per
   assignment of the target's view) plus, per level, count x (weight x any value of any key):
   summed exactly and saturated once, as the forward pass does.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import CertContext, ViewHead, Unproven
from exactformer.constructions.codes.products import CodeWorkError, histograms, pair_inner, resolve, same_generator
from exactformer.constructions.core.views import Box, Group, State, unique_rows
from exactformer.constructions.core.views_ops import import_target, value_tables


@dataclass(frozen=True)
class RetrieveByPosition(ViewHead):
    query: str
    key: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction
    gram: Fraction  # <T(i), T(j)> = gram * <num(i), num(j)>: 1/k for sign codes, 1 for one-hot
    offset: Fraction = Fraction(0)

    reads_codes = True  # its queries and keys are derived from code columns, not from views

    def emit(self, mb: Any, layer: int) -> int:
        k = mb.layout[self.query].size
        w = sum(mb.layout[s].size for s in self.value)
        extra = 1 if self.offset else 0
        dh = max(k + extra, w, 1)
        q = self.eta * self.gram
        Q = [(self.query, (np.eye(k, dh, dtype=np.int64) * q.numerator, q.denominator))]
        K = [(self.key, np.eye(k, dh, dtype=np.int64))]
        b_Q = b_K = None
        if extra:
            b_Q = np.array([Fraction(0)] * dh, dtype=object)
            b_K = np.array([Fraction(0)] * dh, dtype=object)
            b_Q[k], b_K[k] = self.eta, self.offset
        V, O, d0 = [], [], 0
        for s_in, s_out in zip(self.value, self.out):
            n = mb.layout[s_in].size
            V.append((s_in, np.eye(n, dh, d0, dtype=np.int64)))
            O.append((s_out, np.eye(dh, n, -d0, dtype=np.int64)))
            d0 += n
        return mb.head(self, layer, dh, Q=Q, K=K, V=V, O=O, b_Q=b_Q, b_K=b_K)

    # ---- the sufficient condition (builder side) ---------------------------------------------------
    @staticmethod
    def selects(ariths: Any, eta: Fraction, mu: Fraction, n_keys: int, gram: Fraction | None = None,
                offset: Fraction = Fraction(0), tol: Fraction = Fraction(1, 4)) -> bool:
        """The row bound of :meth:`worst_case` in every arithmetic of ``ariths``: the target keeps
        >= 1 - tol of the weight and the other keys <= tol together."""
        for arith in ariths:
            target, rest = RetrieveByPosition.worst_case(arith, eta, mu, n_keys, gram, offset)
            if not (target >= 1 - tol and rest <= tol):
                return False
        return True

    @staticmethod
    def worst_case(arith: Any, eta: Fraction, mu: Fraction, n_keys: int, gram: Fraction | None = None,
                   offset: Fraction = Fraction(0)) -> tuple[Fraction, Fraction]:
        """(lower bound on the target weight, upper bound on the other keys' total weight) for any
        row of ``n_keys`` keys whose target logit is eta and every other logit at most eta * mu,
        in ``arith``: exact grid values in fixed point (eta * gram on the grid); in float and real
        arithmetics the logits' enclosures of :meth:`code_logits` (k = 1/gram code dims and the
        per-row constant eta * offset in the dot product)."""
        if arith.exact:
            t = Box.point(arith.array([arith.const(eta)]))
            lv = Box.point(arith.array([[arith.const(eta * mu)]]))
        else:
            g = Fraction(gram) if gram is not None else Fraction(1)
            k = int(round(1 / g))
            P = arith.mul(Box.point(arith.array(arith.const(eta * g))), Box.point(arith.array(1.0)))
            c = Box.point(arith.array(arith.const(eta * offset)))
            both = arith.code_logits(P, np.array([k, mu * k], dtype=np.float64), c, k, k + (1 if offset else 0))
            t, lv = both[0:1], Box(np.asarray(both.lo)[None, 1:2], np.asarray(both.hi)[None, 1:2])
        if not np.asarray(t.lo)[0] > np.asarray(lv.hi)[0, 0]:
            return Fraction(0), Fraction(1)
        w_t, w_l = arith.row_weights(t, lv, np.array([[n_keys - 1]]))
        return Fraction(arith.to_fraction(w_t.lo[0])), (n_keys - 1) * Fraction(arith.to_fraction(w_l.hi[0, 0]))

    # ---- the local certificate ----------------------------------------------------------------------
    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        """The head's output z at every position of ``need``, as (group, table [*, dv]) pairs."""
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        qcols, kcols = ctx.slot(self.query), ctx.slot(self.key)
        if ctx.written and np.any(ctx.written[layer][np.concatenate([qcols, kcols])]):
            raise Unproven(f"{where}: an earlier layer writes into the query or key code columns")
        alpha, beta, const, n_dims = logit_form(ctx, hw, qcols, kcols, where)
        gens: list[Any] = []
        keys = CodeSource(ctx, kcols, "key", gens).keys(ctx.T)
        queries = CodeSource(ctx, qcols, "query", gens).queries(need, ctx.domains)
        P = unit_product(ctx, alpha, beta, queries.scale, keys.scale, where)
        rows = retrieval_rows(ctx, P, const, n_dims, gens, queries, keys, where)
        arith = ctx.arith
        ctx.details.setdefault("heads", []).append({
            "layer": layer, "head": head, "block": type(self).__name__, "row_classes": int(rows.w_t.lo.size),
            "min_target_weight": str(arith.to_fraction(np.min(rows.w_t.lo))),
            "max_stray_weight": str(arith.to_fraction(max(np.asarray(rows.w_l.hi).astype(object)[i] @ rows.counts[i]
                                                          for i in range(rows.counts.shape[0])))),
            "method": rows.method})
        V = value_tables(ctx, state, hw, where)
        return import_target(ctx, state, need, queries.t, queries.u, rows.target, rows.cls, rows.w_t, rows.w_l,
                             rows.counts, V)


# ------------------------------------------------------------------------------------------------
# step 1: the logit's form, the code sources, the unit product
# ------------------------------------------------------------------------------------------------


def logit_form(ctx: CertContext, hw: dict, qcols: np.ndarray, kcols: np.ndarray, where: str) -> tuple[Any, Any, Box, int]:
    """Checks the head's Q/K dims; returns (alpha, beta, c, dims): the W_Q and W_K entries of the
    code dims, the box of the bias-only dims' summed products, and the number of contributing dims."""
    W_Q, W_K, b_Q, b_K = hw["W_Q"], hw["W_K"], hw["b_Q"], hw["b_K"]
    k = qcols.size
    if kcols.size != k:
        raise Unproven(f"{where}: query slot width {k} != key slot width {kcols.size}")
    arith = ctx.arith
    coords, bias_terms, alpha, beta = [], [], None, None
    for d in range(W_Q.shape[1]):
        qr, kr = np.flatnonzero(W_Q[:, d]), np.flatnonzero(W_K[:, d])
        if qr.size == 0 and kr.size == 0:
            bias_terms.append(arith.mul(Box.point(arith.array(b_Q[d])), Box.point(arith.array(b_K[d]))))
            continue
        if (qr.size == 0 and b_Q[d] == 0) or (kr.size == 0 and b_K[d] == 0):
            continue  # one side is identically 0: the dim adds products that are exactly 0
        if qr.size != 1 or kr.size != 1 or b_Q[d] != 0 or b_K[d] != 0:
            raise Unproven(f"{where}: head dim {d} is neither a code dim (one query-code and one key-code "
                           "column, zero biases), a bias-only dim, nor dead")
        iq, ik = np.flatnonzero(qcols == qr[0]), np.flatnonzero(kcols == kr[0])
        if iq.size != 1 or ik.size != 1 or iq[0] != ik[0]:
            raise Unproven(f"{where}: head dim {d} does not pair query-code coordinate i with key-code coordinate i")
        a, b = W_Q[qr[0], d], W_K[kr[0], d]
        if (alpha is not None and a != alpha) or (beta is not None and b != beta):
            raise Unproven(f"{where}: the code dims have different scales")
        alpha, beta = a, b
        coords.append(int(iq[0]))
    if sorted(coords) != list(range(k)):
        raise Unproven(f"{where}: the head pairs {len(coords)} of the {k} code coordinates")
    if bias_terms:
        const = arith.sum(Box(np.stack([np.asarray(t.lo) for t in bias_terms]), np.stack([np.asarray(t.hi) for t in bias_terms])), axis=0)
    else:
        const = Box.point(arith.array(0))
    return alpha, beta, const, k + len(bias_terms)


@dataclass
class CodeSide:
    """Code vectors of one side: generator id (-1: the zero vector) and index into it."""

    gen: np.ndarray
    idx: np.ndarray
    scale: int  # raw value of the code blocks' +scale entries (0 when no block)
    t: np.ndarray | None = None  # queries: position of each (position, token) pair
    u: np.ndarray | None = None  # queries: token


class CodeSource:
    """Which code vector fills a slot at each position / token, read from the embeddings' code
    blocks (the table must be zero on the slot; a block must cover the slot exactly)."""

    def __init__(self, ctx: CertContext, cols: np.ndarray, what: str, gens: list[Any]):
        self.ctx, self.what, self.gens = ctx, what, gens
        self.blocks: list[tuple[str, Any]] = []
        m = ctx.model
        for name, emb in (("pos", m.pos_embed), ("tok", m.embed)):
            if emb.table.shape[0] and np.any(emb.table.num[:, cols] != 0):
                raise Unproven(f"the {what} code slot holds table entries in the {name} embedding")
            for b in emb.blocks:
                bcols = np.arange(b.col, b.col + b.code.k)
                if np.intersect1d(bcols, cols).size and not np.array_equal(bcols, cols):
                    raise Unproven(f"a {name} code block overlaps the {what} code slot without covering it exactly")
                if np.array_equal(bcols, cols):
                    self.blocks.append((name, b))

    def _gen_id(self, base: Any) -> int:
        for i, g in enumerate(self.gens):
            if g is base or same_generator(g, base):
                return i
        self.gens.append(base)
        return len(self.gens) - 1

    def _lookup(self, which: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, set]:
        gid = np.full(rows.size, -1, dtype=np.int64)
        idx = np.zeros(rows.size, dtype=np.int64)
        scales: set = set()
        for name, b in self.blocks:
            if name != which:
                continue
            sel = (rows >= b.first_row) & (rows < b.first_row + b.count)
            if not np.any(sel):
                continue
            if np.any(sel & (gid >= 0)):
                raise Unproven(f"two code blocks fill the {self.what} slot of one row")
            base, bi = resolve(b.code, rows[sel] - b.first_row + b.code_start)
            gid[sel], idx[sel] = self._gen_id(base), bi
            scales.add(Fraction(b.scale))
        return gid, idx, scales

    def _scale(self, scales: set) -> int:
        if len(scales) > 1:
            raise Unproven(f"the {self.what} code blocks have different scales {sorted(scales)}")
        if not scales:
            return 0
        s = scales.pop()
        r_pos, r_neg = self.ctx.arith.const(s), self.ctx.arith.const(-s)
        if r_pos != -r_neg:
            raise Unproven(f"{self.what} code entries +-{s} do not round symmetrically in {self.ctx.arith.name}")
        return r_pos

    def keys(self, T: int) -> CodeSide:
        if any(name == "tok" for name, _ in self.blocks):
            raise Unproven("the key code depends on the token (a token embedding block fills the key slot)")
        gid, idx, scales = self._lookup("pos", np.arange(T))
        return CodeSide(gid, idx, self._scale(scales))

    def queries(self, need: np.ndarray, domains: Any) -> CodeSide:
        t, u = domains.pairs(need)
        gp, ip, sp = self._lookup("pos", t)
        gt, it, st = self._lookup("tok", u)
        if np.any((gp >= 0) & (gt >= 0)):
            raise Unproven("both embeddings fill the query code slot at some (position, token)")
        return CodeSide(np.where(gp >= 0, gp, gt), np.where(gp >= 0, ip, it), self._scale(sp | st), t, u)


def unit_product(ctx: CertContext, alpha: Any, beta: Any, sq: Any, sk: Any, where: str) -> Box:
    """P: the product q_d k_d of two code dims whose code entries agree in sign (the opposite
    signs give -P, zero entries 0). In fixed point every sign combination is checked (floor
    rounding is not symmetric in general); IEEE rounding is symmetric."""
    arith = ctx.arith
    A = arith.array
    qv = arith.mul(Box.point(A([sq, -sq])), Box.point(A([alpha, alpha])))
    kv = arith.mul(Box.point(A([sk, -sk])), Box.point(A([beta, beta])))
    if arith.exact:
        q, k_ = qv.lo, kv.lo
        if q[0] != -q[1] or k_[0] != -k_[1]:
            raise Unproven(f"{where}: the projections of +- code entries are not symmetric")
        pr = arith.mul(Box.point(A([q[0], q[0], q[1], q[1]])), Box.point(A([k_[0], k_[1], k_[0], k_[1]]))).lo
        if not (pr[0] == pr[3] == -pr[1] == -pr[2]):
            raise Unproven(f"{where}: products of +- projected code entries are not symmetric")
        return Box.point(A(pr[0]))
    return arith.mul(qv[0:1], kv[0:1])[0]


# ------------------------------------------------------------------------------------------------
# step 2: rows
# ------------------------------------------------------------------------------------------------


@dataclass
class RetrievalRows:
    target: np.ndarray  # [n_queries] target key position of each (position, token) query
    cls: np.ndarray  # [n_queries] row class
    w_t: Box  # [C] target weight
    w_l: Box  # [C, L] weight of one key at each level
    counts: np.ndarray  # [C, L] number of other keys at each level
    method: str


def retrieval_rows(ctx: CertContext, P: Box, const: Box, n_dims: int, gens: list[Any], q: CodeSide, k: CodeSide, where: str) -> RetrievalRows:
    arith = ctx.arith
    kg = np.unique(k.gen[k.gen >= 0])
    if kg.size != 1:
        raise Unproven(f"{where}: the key slot must hold vectors of one code (found {kg.size})")
    kgen = gens[int(kg[0])]
    kpos = np.flatnonzero(k.gen >= 0)
    order = np.argsort(k.idx[kpos], kind="stable")
    kidx, kposs = k.idx[kpos][order], kpos[order]
    n_zero = int(ctx.T - kpos.size)
    if np.any(q.gen < 0):
        t0 = int(q.t[np.flatnonzero(q.gen < 0)[0]])
        raise Unproven(f"{where}: the query at position {t0} holds no code vector", {"positions": [t0]})
    if any(not same_generator(gens[int(g)], kgen) for g in np.unique(q.gen)):
        raise Unproven(f"{where}: query and key vectors come from different codes")
    uq, qinv = np.unique(q.idx, return_inverse=True)
    qinv = qinv.reshape(-1)
    try:
        lv, hist = histograms(kgen, uq, kgen, kidx, ctx.device)
    except CodeWorkError as e:
        raise Unproven(f"{where}: {e}") from e
    method = "Reed-Solomon prefix sums" if type(kgen).__name__ == "ReedSolomonCode" else "exact Gram rows"
    if n_zero:  # keys without a code vector have inner product 0
        if not np.any(lv == 0):
            lv = np.append(lv, 0)
            hist = np.concatenate([hist, np.zeros((hist.shape[0], 1), dtype=np.int64)], axis=1)
            o = np.argsort(lv)
            lv, hist = lv[o], hist[:, o]
        hist[:, np.searchsorted(lv, 0)] += n_zero
    # the target: the key holding the query's own vector (checked below to be the unique maximum)
    at = np.minimum(np.searchsorted(kidx, uq), kidx.size - 1)
    has = kidx[at] == uq
    dup = (at + 1 < kidx.size) & (kidx[np.minimum(at + 1, kidx.size - 1)] == uq)
    target = np.where(has & ~dup, kposs[at], -1)
    I_t = np.full(uq.size, np.iinfo(np.int64).min, dtype=np.int64)
    I_t[target >= 0] = pair_inner(kgen, uq[target >= 0], kgen, uq[target >= 0])
    logit = arith.code_logits(P, lv, const, int(kgen.k), n_dims)  # [L] boxes
    t_level = np.searchsorted(lv, I_t)
    others = hist.copy()
    ok = target >= 0
    others[np.flatnonzero(ok), t_level[ok]] -= 1
    lo_t = np.asarray(logit.lo)[np.minimum(t_level, lv.size - 1)]
    other_max = np.where(others > 0, np.asarray(logit.hi)[None, :], arith.min_raw - 1).max(axis=1) if others.size else \
        np.full(uq.size, arith.min_raw - 1)
    above = ok & np.asarray(lo_t > other_max, dtype=bool)
    bad = np.flatnonzero(~above)
    if bad.size:
        t0 = int(q.t[np.flatnonzero(qinv == bad[0])[0]])
        raise Unproven(f"{where}: the query at position {t0} has no key whose logit is a strict maximum "
                       "(its code vector is missing among the keys, duplicated, or not above every other key)",
                       {"positions": [t0]})
    key = np.concatenate([others, t_level[:, None]], axis=1)
    ukey, cls_of_uq = unique_rows(key)
    counts, tl = ukey[:, :-1], ukey[:, -1]
    w_t, w_l = arith.row_weights(logit[tl], Box(np.broadcast_to(np.asarray(logit.lo)[None, :], counts.shape),
                                                 np.broadcast_to(np.asarray(logit.hi)[None, :], counts.shape)), counts)
    return RetrievalRows(target[qinv], cls_of_uq.reshape(-1)[qinv], w_t, w_l, counts, method)
