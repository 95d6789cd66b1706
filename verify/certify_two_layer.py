"""All-inputs certificates for the two-layer Boolean constructions: Equality / Inequality
(Theorem 6) and thresholds of k-sparse features, Disjointness, k-DNF, k-CNF (Theorem 13).

The argument (docs/equality.md and docs/thresholds.md, "Certificate"), every step computed exactly
from the model's own weights with the format's own operations. What the model *should* compute
comes from the task (``model.task_params``; for DNF / CNF / Disjointness re-derived from the
clauses / N): for every position i and first-layer head h an intended partner t_h(i), a feature
f_i of the tokens at i and at its partners, and the answer [S > b] (negated for EQ), S = sum_i f_i.

1. **Preconditions on the weights.** Two blocks, bidirectional. In block 0 every head's queries
   and keys read only positional code blocks (the token embedding is zero there), one code per
   head, as one raw scale times a coordinate matching (code coordinate t -> the same head dim for
   Q and K), with zero biases on matched dims; the remaining dims contribute a constant c =
   sum r(b_Q b_K). So the logit of query position i at key position j is a function of the integer
   inner product I = <num(q(i)), num(kidx(j))> only (checked: the rounded products of +-1 (or
   0/1) entries are symmetric). Values, the MLPs, block 1 and the unembedding read no Q/K code
   column; block 1's queries (or keys) are identically zero, so its softmax is the uniform row.
2. **First-layer rows.** For every distinct (query code index, partner key index) the histogram of
   I over all T keys (Reed-Solomon codes: I = q * agreements(p XOR c), histograms from prefix sums
   over aligned dyadic blocks, O(q log T) per query; other codes: exact Gram rows), then the rounded
   softmax row exactly as ``fmt.softmax`` (row max subtracted, exp, exact sum saturated, divided):
   the partner's weight a_t and the stray weights per level. "One-hot" when a_t = 1 and every
   stray weight is 0.
3. **Head outputs.** Values depend on the token only. For a partner token tau,
   y_h in [min over rows of r(a_t V(tau)) + sum_levels count * min_tokens r(a_level V),  ... max ...]
   (exact, = V(tau) when every row is one-hot).
4. **Local views.** A position's layer-1 output depends on its token, its partners' tokens and its
   non-code positional columns (feature type signs). Positions are grouped by that shape; for every
   shape and every assignment of its tokens the boxes are propagated (monotone interval
   arithmetic, exact at points) through W_O, MLP 1 and block 1's W_V, giving for each intended
   feature value f in {0, 1} the box [V^(f)_lo, V^(f)_hi] of every layer-2 value with that feature
   (a single point V^(f) in the constructions as built).
5. **Finite logic.** Block 1's output at the last position then lies in
   z(S) in [sat(S r(a V1_lo) + (T - S) r(a V0_lo)), sat(S r(a V1_hi) + (T - S) r(a V0_hi))]
   with a = div(e(0), sat(T e(0))) (exactly z(S) when the boxes are points). For every
   assignment of the last position's view and every S in the range its features allow, the logits
   are propagated exactly (intervals where the view's box is not a point); the model is **proved**
   when the correct logit's lower bound exceeds the other's upper bound everywhere.

If any step fails, the certificate runs candidate inputs through the executor (the task's
adversarial and sampled inputs, inputs with the failing local view planted, inputs with the
failing feature counts) and returns the first wrong answer as a counterexample; if none is found
the result is "unproven" (a failure with the reason), never a pass.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.ir import CompiledModel
from exactformer.precision import Format
from exactformer.verify.certify_index_lookup import CertificateResult

GRAM_MAX_WORK = 1 << 34  # queries * keys * k above which the Gram path is refused (use a RS code)
CANDIDATES = 2048  # adversarial + sampled inputs tried when the proof fails
CANDIDATE_BUDGET = 1 << 27  # residual entries (inputs x T x d_model) the counterexample search may run


class Unproven(Exception):
    """A proof step failed; ``hint`` says which inputs to try."""

    def __init__(self, reason: str, hint: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint or {}


# ------------------------------------------------------------------------------------------------
# what the model should compute
# ------------------------------------------------------------------------------------------------


@dataclass
class Spec:
    """The intended computation (from the task, not from the weights)."""

    T: int
    allowed: list[tuple[int, ...]]  # token sets
    allowed_id: np.ndarray  # [T] index into ``allowed``
    targets: np.ndarray  # [H, T] intended partner position of every position, per head
    feature_class: np.ndarray  # [T] id of the feature function at each position
    feature: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]  # (pos [B], tok [B], tok_t [B, H]) -> [B]
    b: int
    negate: bool
    to_inputs: Callable[[np.ndarray], np.ndarray]  # token ids [B, T] -> natural inputs
    task: Any


def spec_for(model: CompiledModel) -> Spec:
    from exactformer.verify.tasks_boolean import TASKS_BOOLEAN, threshold_spec

    name = model.construction
    if name in ("equality", "inequality"):
        n, h = model.n, model.n // 2
        pos = np.arange(n)
        targets = np.where(pos < h, pos, pos - h)[None, :]

        def feat(p, tok, tt):
            return (tok != tt[:, 0]).astype(np.int64)

        return Spec(n, [(0, 1)], np.zeros(n, np.int64), targets, np.zeros(n, np.int64), feat, 0,
                    name == "equality", lambda t: 2 * t - 1, TASKS_BOOLEAN[name])
    if name in ("threshold", "disjointness", "dnf", "cnf"):
        from exactformer.constructions.thresholds import BOS, query_indices

        idx, ftype, types, b = threshold_spec(model)
        n, m = model.n, idx.shape[0]
        T = n + 1
        H = max(1, model.blocks[0].attn.n_heads)
        targets = np.stack([query_indices(np.pad(idx, ((0, 0), (0, max(0, H - idx.shape[1])))), n, h)
                            for h in range(H)])
        fclass = np.full(T, -1, dtype=np.int64)
        fclass[1 : m + 1] = ftype
        allowed_id = np.ones(T, dtype=np.int64)
        allowed_id[0] = 0
        tables = [np.asarray(t, dtype=np.int64) for _, t in types]
        arity = [a for a, _ in types]

        def feat(p, tok, tt):
            out = np.zeros(len(p), dtype=np.int64)
            fc = fclass[p]
            for t_id in np.unique(fc):
                if t_id < 0:
                    continue
                sel = fc == t_id
                code = np.zeros(int(sel.sum()), dtype=np.int64)
                for hh in range(arity[t_id]):
                    code = code * 2 + tt[sel, hh]
                out[sel] = tables[t_id][code]
            return out

        return Spec(T, [(BOS,), (0, 1)], allowed_id, targets, fclass, feat, b, False,
                    lambda t: t[:, 1:], TASKS_BOOLEAN[name])
    raise Unproven(f"no two-layer specification for construction {name!r}")


# ------------------------------------------------------------------------------------------------
# exact helpers on raw values
# ------------------------------------------------------------------------------------------------


def _r(fmt: Format, a, b) -> np.ndarray:
    return np.asarray(fmt.mul(np.asarray(a), np.asarray(b)))


def _clamp(fmt: Format, x) -> np.ndarray:
    x = np.asarray(x, dtype=object)
    x = np.where(x > fmt.max_raw, fmt.max_raw, x)
    x = np.where(x < fmt.min_raw, fmt.min_raw, x)
    return x.astype(np.int64)


def _imatmul(fmt: Format, lo: np.ndarray, hi: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact bounds of fmt.matmul(x, W) for x in the box [lo, hi] ([..., d_in]); W [d_in, d_out].
    Each rounded product r(x w) is monotone in x; the products are summed exactly, saturated once."""
    rows = np.flatnonzero(np.any(W != 0, axis=1))
    out_shape = lo.shape[:-1] + (W.shape[1],)
    if rows.size == 0:
        z = np.zeros(out_shape, dtype=np.int64)
        return z, z.copy()
    lo, hi, Wr = lo[..., rows], hi[..., rows], W[rows]
    p_lo = _r(fmt, lo[..., :, None], Wr)
    p_hi = _r(fmt, hi[..., :, None], Wr)
    wide = (max(abs(fmt.max_raw), abs(fmt.min_raw)) + 1) * (len(rows) + 1) >= 1 << 62
    a, b = np.minimum(p_lo, p_hi), np.maximum(p_lo, p_hi)
    if wide:
        a, b = a.astype(object), b.astype(object)
    return _clamp(fmt, a.sum(axis=-2)), _clamp(fmt, b.sum(axis=-2))


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(a, axis=0, return_inverse=True) for int arrays [R, C], via a mixed-radix int64 key
    (fast 1-D sort) when the columns' value ranges allow it."""
    a = np.asarray(a, dtype=np.int64)
    if a.ndim == 1:
        a = a[:, None]
    codes, radix = [], 1
    for c in range(a.shape[1]):
        u, inv = np.unique(a[:, c], return_inverse=True)
        codes.append((inv.reshape(-1), len(u)))
        radix *= max(1, len(u))
        if radix >= 1 << 62:
            u2, inv2 = np.unique(a, axis=0, return_inverse=True)
            return u2, inv2.reshape(-1)
    key = np.zeros(len(a), dtype=np.int64)
    for inv, size in codes:
        key = key * size + inv
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    return a[first], inv.reshape(-1)


def _iadd(fmt, lo, hi, b):
    return np.asarray(fmt.add(lo, b)), np.asarray(fmt.add(hi, b))


def _irelu(fmt, lo, hi):
    return np.asarray(fmt.relu(lo)), np.asarray(fmt.relu(hi))


def _raw1(fmt: Format, v: Fraction) -> int:
    return int(np.asarray(fmt.quantize(np.array([v], dtype=object)))[0])


# ------------------------------------------------------------------------------------------------
# step 1: preconditions and the first layer's logit function
# ------------------------------------------------------------------------------------------------


@dataclass
class HeadLayout:
    qcode: Any  # code (numerators) of the queries
    kcode: Any  # code of the keys (the same object for code blocks of one code)
    qidx: np.ndarray  # [T] query code index of every position
    kidx: np.ndarray  # [T] key code index of every position
    q_cols: np.ndarray
    k_cols: np.ndarray
    logit: Callable[[np.ndarray], np.ndarray]  # integer inner product I -> raw logit
    sign: bool  # entries +-1 (else 0/1)

    @property
    def code(self) -> Any:
        return self.qcode


class _TableCode:
    """Columns of a dense positional table read as a code: vector i = sign(table row i) on ``cols``
    (every nonzero entry of those columns must be +-s for one s)."""

    family = "table"

    def __init__(self, emb: Any, cols: np.ndarray, T: int, what: str):
        if emb.table_first_row != 0 or emb.table.shape[0] < T:
            raise Unproven(f"{what}: the positional table does not cover every position")
        block = emb.table.num[:T][:, cols]
        mags = np.unique(np.abs(block[block != 0]))
        if len(mags) != 1:
            raise Unproven(f"{what}: the positional columns it reads are not +-s for one s")
        self.scale = Fraction(int(mags[0]), emb.table.den)
        self.rows = np.sign(block).astype(np.int8)
        self.k, self.n = len(cols), T
        self.is_sign_code = bool(np.all(self.rows != 0))
        if not self.is_sign_code and np.any(self.rows < 0):
            raise Unproven(f"{what}: table entries must be +-s everywhere or in {{0, s}}")
        self.bound = None

    def numerators(self, idx) -> np.ndarray:
        return self.rows[np.asarray(idx, dtype=np.int64)]


def _code_indices(model: CompiledModel, cols: np.ndarray, T: int, what: str) -> tuple[Any, np.ndarray, np.ndarray, Fraction]:
    """The code, per-position code indices, the columns (code coordinate order) and the scale of
    the positional entries that ``cols`` reads: one column range of code blocks, or columns of a
    dense positional table."""
    from exactformer.constructions.equality import CodeView

    blocks = [b for b in model.pos_embed.blocks if np.any((cols >= b.col) & (cols < b.col + b.code.k))]
    if not blocks:
        if model.pos_embed.table.shape[0] and np.any(model.pos_embed.table.num[:, cols] != 0):
            tc = _TableCode(model.pos_embed, cols, T, what)
            return tc, np.arange(T, dtype=np.int64), np.asarray(cols), Fraction(1) * tc.scale
        raise Unproven(f"{what} reads no positional code block")
    col, k = blocks[0].col, blocks[0].code.k
    base0 = blocks[0].code.base if isinstance(blocks[0].code, CodeView) else blocks[0].code
    scale = blocks[0].scale
    idx = np.full(T, -1, dtype=np.int64)
    for b in blocks:
        base = b.code.base if isinstance(b.code, CodeView) else b.code
        if b.col != col or b.code.k != k or base is not base0 or b.scale != scale:
            raise Unproven(f"{what}: the code blocks it reads differ in columns, code or scale")
        rows = np.arange(b.first_row, min(T, b.first_row + b.count))
        local = rows - b.first_row + b.code_start
        ids = b.code.base_indices(local) if isinstance(b.code, CodeView) else local
        if np.any(idx[rows] >= 0):
            raise Unproven(f"{what}: two code blocks cover the same position")
        idx[rows] = ids
    if np.any(idx < 0):
        raise Unproven(f"{what}: some positions have no code vector")
    if not set(cols.tolist()) <= set(range(col, col + k)):
        raise Unproven(f"{what} reads columns outside one code block")
    if model.pos_embed.table.shape[0] and np.any(model.pos_embed.table.num[:, col : col + k] != 0):
        raise Unproven(f"{what}: the positional table is nonzero on the code columns")
    return base0, idx, np.arange(col, col + k), scale


def _layout(model: CompiledModel, fmt: Format, W: dict, T: int) -> list[HeadLayout]:
    a = model.blocks[0].attn
    if len(model.blocks) != 2:
        raise Unproven("the model must have exactly two blocks")
    if a.causal or model.blocks[1].attn.causal:
        raise Unproven("attention must be bidirectional")
    tok_cols = np.any(model.embed.table.num != 0, axis=0) if model.embed.table.shape[0] else np.zeros(model.d_model, bool)
    for b in model.embed.blocks:
        tok_cols[b.col : b.col + b.code.k] = True
    out = []
    for h in range(a.n_heads):
        WQ, WK = W["blocks.0.attn.W_Q"][h], W["blocks.0.attn.W_K"][h]
        bQ, bK = W["blocks.0.attn.b_Q"][h], W["blocks.0.attn.b_K"][h]
        rq, rk = np.flatnonzero(np.any(WQ != 0, axis=1)), np.flatnonzero(np.any(WK != 0, axis=1))
        if np.any(tok_cols[rq]) or np.any(tok_cols[rk]):
            raise Unproven(f"head {h}: queries and keys must read positional columns only")
        cq, qidx, q_cols, sq = _code_indices(model, rq, T, f"head {h} W_Q")
        ck, kidx, k_cols, sk = _code_indices(model, rk, T, f"head {h} W_K")
        if int(cq.k) != int(ck.k):
            raise Unproven(f"head {h}: query and key codes have different dimensions")
        if bool(getattr(cq, "is_sign_code", True)) != bool(getattr(ck, "is_sign_code", True)):
            raise Unproven(f"head {h}: query and key codes differ in kind (signs vs 0/1)")
        k = int(cq.k)
        dims, alpha, beta = [], None, None
        for t in range(k):
            nq, nk = np.flatnonzero(WQ[q_cols[t]]), np.flatnonzero(WK[k_cols[t]])
            if len(nq) != 1 or len(nk) != 1 or nq[0] != nk[0]:
                raise Unproven(f"head {h}, code coordinate {t}: W_Q and W_K must map it to one common head dim")
            if alpha is None:
                alpha, beta = int(WQ[q_cols[t], nq[0]]), int(WK[k_cols[t], nk[0]])
            if int(WQ[q_cols[t], nq[0]]) != alpha or int(WK[k_cols[t], nk[0]]) != beta:
                raise Unproven(f"head {h}: W_Q (resp. W_K) must use one scale on the code block")
            dims.append(int(nq[0]))
        dims_a = np.asarray(dims)
        if len(set(dims)) != k:
            raise Unproven(f"head {h}: code coordinates must map to distinct head dims")
        if np.any(bQ[dims_a] != 0) or np.any(bK[dims_a] != 0):
            raise Unproven(f"head {h}: query/key biases must be zero on the code dims")
        other = np.setdiff1d(np.arange(WQ.shape[1]), dims_a)
        c = int(np.sum(_r(fmt, bQ[other], bK[other]).astype(object))) if other.size else 0
        sign = bool(getattr(cq, "is_sign_code", True))
        vals = (1, -1) if sign else (1, 0)
        u = {e: int(fmt.add(_r(fmt, np.array([_raw1(fmt, e * sq)]), np.array([alpha])), np.array([0]))[0]) for e in vals}
        v = {e: int(fmt.add(_r(fmt, np.array([_raw1(fmt, e * sk)]), np.array([beta])), np.array([0]))[0]) for e in vals}
        P = {(x, y): int(_r(fmt, np.array([u[x]]), np.array([v[y]]))[0]) for x in vals for y in vals}
        if sign:
            if P[(1, 1)] != P[(-1, -1)] or P[(1, -1)] != P[(-1, 1)]:
                raise Unproven(f"head {h}: +-1 code entries round asymmetrically under this format")
            pp, pm = P[(1, 1)], P[(1, -1)]

            def logit(I, pp=pp, pm=pm, k=k, c=c):
                I = np.asarray(I, dtype=object)
                return _clamp(fmt, (k + I) // 2 * pp + (k - I) // 2 * pm + c)
        else:
            if P[(1, 0)] or P[(0, 1)] or P[(0, 0)]:
                raise Unproven(f"head {h}: products with 0 entries must round to 0")
            p11 = P[(1, 1)]

            def logit(I, p11=p11, c=c):
                return _clamp(fmt, np.asarray(I, dtype=object) * p11 + c)
        out.append(HeadLayout(cq, ck, qidx, kidx, q_cols, k_cols, logit, sign))
    return out


# ------------------------------------------------------------------------------------------------
# step 2: inner-product histograms and the rounded rows
# ------------------------------------------------------------------------------------------------


def _dyadic_blocks(start: int, count: int) -> list[tuple[int, int]]:
    """[start, start + count) as maximal aligned blocks (begin, log2 size)."""
    out = []
    s, e = start, start + count
    while s < e:
        m = (s & -s).bit_length() - 1 if s else (e - s).bit_length() - 1
        while (1 << m) > e - s:
            m -= 1
        out.append((s, m))
        s += 1 << m
    return out


def _rs_histograms(code: Any, queries: np.ndarray, kidx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a Reed-Solomon code and keys forming a contiguous index range: levels I = q * a
    (a = 0..q agreements) and hist [len(queries), q + 1] over all keys."""
    s, T = int(kidx[0]), len(kidx)
    q = int(code.q)
    M = 1 << int(max(int(queries.max()), s + T - 1)).bit_length()
    ag = np.asarray(code.agreements(np.arange(M, dtype=np.int64)), dtype=np.int64)
    hist = np.zeros((len(queries), q + 1), dtype=np.int64)
    blocks = _dyadic_blocks(s, T)
    for lv in range(q + 1):
        pref = np.zeros(M + 1, dtype=np.int64)
        np.cumsum(ag == lv, out=pref[1:])
        for b0, m in blocks:
            begin = ((queries ^ b0) >> m) << m
            hist[:, lv] += pref[begin + (1 << m)] - pref[begin]
    return q * np.arange(q + 1, dtype=np.int64), hist


def _gram_histograms(code: Any, queries: np.ndarray, kidx: np.ndarray, device: str,
                     kcode: Any = None) -> tuple[np.ndarray, np.ndarray]:
    kcode = code if kcode is None else kcode
    k = int(code.k)
    if len(queries) * len(kidx) * k > GRAM_MAX_WORK:
        raise Unproven(f"Gram rows for {len(queries)} queries x {len(kidx)} keys x k = {k} exceed the work limit; "
                       "use a Reed-Solomon code (positions='reed-solomon')")
    keys = np.asarray(kcode.numerators(kidx), dtype=np.float32)
    L = 2 * k + 1
    hist = np.zeros((len(queries), L), dtype=np.int64)
    step = max(1, (1 << 24) // max(len(kidx), 1))
    for s in range(0, len(queries), step):
        qs = np.asarray(code.numerators(queries[s : s + step]), dtype=np.float32)
        if device == "cuda":
            import torch

            G = (torch.as_tensor(qs, device="cuda") @ torch.as_tensor(keys, device="cuda").T).round().long().cpu().numpy()
        else:
            G = np.rint(qs @ keys.T).astype(np.int64)  # exact: entries in {-1, 0, 1}, k < 2^24
        off = (G + k) + (np.arange(G.shape[0]) * L)[:, None]
        hist[s : s + step] = np.bincount(off.reshape(-1), minlength=G.shape[0] * L).reshape(G.shape[0], L)
    return np.arange(-k, k + 1, dtype=np.int64), hist


def _pair_inner(code: Any, a: np.ndarray, b: np.ndarray, kcode: Any = None) -> np.ndarray:
    kcode = code if kcode is None else kcode
    if getattr(code, "family", None) == "reed-solomon" and kcode is code:
        return int(code.q) * np.asarray(code.agreements(a ^ b), dtype=np.int64)
    out = np.empty(len(a), dtype=np.int64)
    step = 1 << 14
    for s in range(0, len(a), step):
        x = np.asarray(code.numerators(a[s : s + step]), dtype=np.int64)
        y = np.asarray(kcode.numerators(b[s : s + step]), dtype=np.int64)
        out[s : s + step] = np.sum(x * y, axis=1)
    return out


@dataclass
class Rows:
    """The rounded first-layer rows of one head, per class (raw weights)."""

    cls: np.ndarray  # [T] class of each position's row
    a_t: np.ndarray  # [C] weight on the partner
    a_lv: np.ndarray  # [C, L] weight of a stray key at each level
    count: np.ndarray  # [C, L] number of stray keys at each level
    one_hot: bool
    method: str


def _rows(fmt: Format, lay: HeadLayout, targets: np.ndarray, device: str) -> Rows:
    T = len(lay.kidx)
    contiguous = bool(np.all(np.diff(lay.kidx) == 1))
    rs = getattr(lay.qcode, "family", None) == "reed-solomon" and lay.kcode is lay.qcode and contiguous and lay.sign
    kt = lay.kidx[targets]  # partner key index per position
    pairs, inv = _unique_rows(np.stack([lay.qidx, kt], axis=1))
    uq, qinv = np.unique(pairs[:, 0], return_inverse=True)
    qinv = qinv.reshape(-1)
    if rs:
        levels, hq = _rs_histograms(lay.qcode, uq, lay.kidx)
        method = "reed-solomon prefix sums"
    else:
        levels, hq = _gram_histograms(lay.qcode, uq, lay.kidx, device, lay.kcode)
        method = "exact Gram rows"
    hist = hq[qinv].copy()  # [P, L] all keys, per (query, partner) pair
    I_t = _pair_inner(lay.qcode, pairs[:, 0], pairs[:, 1], lay.kcode)
    li = np.searchsorted(levels, I_t)
    if np.any(levels[np.minimum(li, len(levels) - 1)] != I_t):
        raise Unproven("internal: a partner's inner product is not a histogram level")
    hist[np.arange(len(pairs)), li] -= 1  # remove the partner itself
    # classes of identical (stray histogram, partner level)
    key = np.concatenate([hist, li[:, None]], axis=1)
    ukey, cinv = _unique_rows(key)
    hist_c, li_c = ukey[:, :-1], ukey[:, -1]
    C, L = hist_c.shape
    l_lv = lay.logit(levels)  # [L]
    l_t = l_lv[li_c]  # [C]
    present = hist_c > 0
    lmax = np.maximum(np.max(np.where(present, l_lv[None, :], fmt.min_raw), axis=1), l_t)
    e_lv = np.asarray(fmt.exp(fmt.sub(np.broadcast_to(l_lv, (C, L)).copy(), lmax[:, None])))
    e_t = np.asarray(fmt.exp(fmt.sub(l_t.copy(), lmax)))
    Z = _clamp(fmt, (hist_c.astype(object) * e_lv.astype(object)).sum(axis=1) + e_t.astype(object))
    a_lv = np.asarray(fmt.div(e_lv, Z[:, None]))
    a_t = np.asarray(fmt.div(e_t, Z))
    one = _raw1(fmt, Fraction(1))
    one_hot = bool(np.all(a_t == one) and np.all(np.where(present, a_lv, 0) == 0))
    return Rows(cinv[inv], a_t, np.where(present, a_lv, 0), hist_c, one_hot, method)


# ------------------------------------------------------------------------------------------------
# the certificate
# ------------------------------------------------------------------------------------------------


@dataclass
class _State:
    details: dict = field(default_factory=dict)
    hint: dict = field(default_factory=dict)


def certify_two_layer(model: CompiledModel, fmt: Format, device: str = "cpu", run_fn=None) -> CertificateResult:
    """Prove ``model`` correct on all 2^N inputs under ``fmt``, or return a counterexample, or say
    why not (see the module docstring)."""
    t0 = time.perf_counter()
    if not fmt.is_exact:
        return CertificateResult(False, False, "certificates need an exact fixed-point format", None, 0, seconds=0.0)
    st = _State()
    try:
        spec = spec_for(model)
    except Unproven as e:
        return CertificateResult(False, False, str(e), None, 0, seconds=time.perf_counter() - t0)
    try:
        margin, classes = _prove(model, fmt, spec, device, st)
        return CertificateResult(True, True, "proved for all inputs", margin, classes, None, st.details,
                                 time.perf_counter() - t0)
    except Unproven as e:
        reason, st.hint = e.reason, {**st.hint, **e.hint}
    budget = CANDIDATE_BUDGET // max(1, spec.T * model.d_model)
    cex, searched = None, "no executor was given to search for a counterexample"
    if run_fn is not None and budget >= 4:
        n_cand = min(CANDIDATES, budget)
        cex = _search(model, fmt, spec, st.hint, run_fn, n_cand)
        searched = f"no candidate input (about {n_cand + n_cand // 2} adversarial, sampled and targeted) was answered wrongly"
    elif run_fn is not None:
        searched = (f"counterexample search skipped: inputs of length {spec.T} with d_model {model.d_model} are too "
                    "large to run in bulk")
    margin = st.details.get("min_margin_raw")
    margin = None if margin is None else Fraction(int(margin)) * fmt.step
    classes = int(st.details.get("row_classes", 0))
    if cex is not None:
        return CertificateResult(False, False, f"counterexample found ({reason})", margin, classes, cex, st.details,
                                 time.perf_counter() - t0)
    return CertificateResult(False, False, f"unproven: {reason}; {searched}",
                             margin, classes, None, st.details, time.perf_counter() - t0)


def _prove(model: CompiledModel, fmt: Format, spec: Spec, device: str, st: _State) -> tuple[Fraction, int]:
    W = model.weights_raw(fmt)
    T = spec.T
    if model.n_ctx < T:
        raise Unproven(f"the model has n_ctx = {model.n_ctx} < T = {T}")
    heads = _layout(model, fmt, W, T)
    H = len(heads)
    if spec.targets.shape[0] < H:
        spec.targets = np.concatenate([spec.targets, np.zeros((H - spec.targets.shape[0], T), np.int64)])
    code_cols = np.unique(np.concatenate([np.r_[hl.q_cols, hl.k_cols] for hl in heads]))
    work = np.setdiff1d(np.arange(model.d_model), code_cols)  # every column except the Q/K code blocks

    # ---- preconditions on what reads the code columns ---------------------------------------------
    readers = {"blocks.0.attn.W_V": W["blocks.0.attn.W_V"], "blocks.0.mlp.W_in": W["blocks.0.mlp.W_in"][None],
               "blocks.1.attn.W_V": W["blocks.1.attn.W_V"], "blocks.1.mlp.W_in": W["blocks.1.mlp.W_in"][None],
               "unembed.W_U": W["unembed.W_U"][None]}
    for name, M in readers.items():
        if np.any(M[:, code_cols, :] != 0):
            raise Unproven(f"{name} reads a query/key code column")
    pos_cols = model.pos_embed.nonzero_columns()
    if np.any(W["blocks.0.attn.W_V"][:, pos_cols, :] != 0):
        raise Unproven("blocks.0.attn.W_V must read token columns only (values must not depend on the position)")
    a2 = model.blocks[1].attn
    for h2 in range(a2.n_heads):
        q0 = not np.any(W["blocks.1.attn.W_Q"][h2]) and not np.any(W["blocks.1.attn.b_Q"][h2])
        k0 = not np.any(W["blocks.1.attn.W_K"][h2]) and not np.any(W["blocks.1.attn.b_K"][h2])
        if not (q0 or k0):
            raise Unproven(f"block 1 head {h2}: queries or keys must be identically zero (uniform attention)")

    # ---- step 2: rows ----------------------------------------------------------------------------
    rows = []
    for h, hl in enumerate(heads):
        rows.append(_rows(fmt, hl, spec.targets[h], device))
    st.details.update({
        "heads": H,
        "row_method": rows[0].method,
        "row_classes": int(sum(len(r.a_t) for r in rows)),
        "one_hot": all(r.one_hot for r in rows),
        "min_partner_weight": str(min(fmt.to_fraction(np.array([int(r.a_t.min())]))[0] for r in rows)),
        "max_stray_weight": str(max(fmt.to_fraction(np.array([int(
            (r.a_lv.astype(object) * r.count.astype(object)).sum(axis=1).max())]))[0] for r in rows)),
    })

    # ---- step 3: head outputs per partner token ---------------------------------------------------
    V_tok = model.embed.raw(np.arange(model.d_vocab), fmt)  # [V, d]; W_V reads token columns only
    ntok = model.d_vocab
    all_tokens = sorted({t for s in spec.allowed for t in s})
    y_lo, y_hi, vdims = [], [], []
    for h, (hl, rw) in enumerate(zip(heads, rows)):
        WV, bV = W["blocks.0.attn.W_V"][h], W["blocks.0.attn.b_V"][h]
        vd = np.flatnonzero(np.any(WV != 0, axis=0) | (bV != 0))
        vdims.append(vd)
        V = np.asarray(fmt.add(fmt.matmul(V_tok, WV), bV))[:, vd]  # [V, dv]
        Va = V[all_tokens]
        own = _r(fmt, rw.a_t[:, None, None], V[None, :, :]).astype(object)  # [C, V, dv]
        pl = _r(fmt, rw.a_lv[:, :, None, None], Va[None, None, :, :])  # [C, L, A, dv]
        s_lo = (rw.count[:, :, None].astype(object) * pl.min(axis=2).astype(object)).sum(axis=1)  # [C, dv]
        s_hi = (rw.count[:, :, None].astype(object) * pl.max(axis=2).astype(object)).sum(axis=1)
        lo = _clamp(fmt, own + s_lo[:, None, :]).min(axis=0)  # [V, dv]
        hi = _clamp(fmt, own + s_hi[:, None, :]).max(axis=0)
        y_lo.append(lo)
        y_hi.append(hi)
    W_O = np.concatenate([W["blocks.0.attn.W_O"][h][vdims[h]] for h in range(H)], axis=0)[:, work]
    b_O = W["blocks.0.attn.b_O"][work]

    # ---- step 4: local views ----------------------------------------------------------------------
    free = _free_rows(model, fmt, work, T)  # [T, |work|] positional entries outside the code blocks
    _, free_id = _unique_rows(free) if free.shape[1] else (None, np.zeros(T, dtype=np.int64))
    pos = np.arange(T)
    tg = spec.targets[:H]  # [H, T]
    self_mask = tg == pos[None, :]
    # slot of each head's partner: -1 self, else index among the distinct non-self partners
    slot = np.full((H, T), -1, dtype=np.int64)
    nslots = np.zeros(T, dtype=np.int64)
    for h in range(H):
        new = ~self_mask[h]
        for h2 in range(h):
            same = (tg[h] == tg[h2]) & new & (slot[h2] >= 0)
            slot[h, same] = slot[h2, same]
            new &= ~same
        slot[h, new] = nslots[new]
        nslots[new] += 1
    slot_allowed = np.full((H, T), -1, dtype=np.int64)
    for h in range(H):
        m_ = slot[h] >= 0
        slot_allowed[h, m_] = spec.allowed_id[tg[h, m_]]
    sig = np.concatenate([spec.allowed_id[:, None], free_id[:, None], spec.feature_class[:, None], slot.T,
                          slot_allowed.T], axis=1)
    usig, shape_of = _unique_rows(sig)
    rep = np.zeros(len(usig), dtype=np.int64)
    rep[shape_of[::-1]] = pos[::-1]  # first position of each shape
    st.details["shapes"] = int(len(usig))

    V2lo: dict = {}
    V2hi: dict = {}
    views: dict = {}  # (h2, f) -> list of (position, view, value) for hints
    shape_boxes = []
    fmin = np.zeros(len(usig), dtype=np.int64)
    fmax = np.zeros(len(usig), dtype=np.int64)
    b1 = model.blocks[1].attn
    W_V2 = [W["blocks.1.attn.W_V"][h2][work] for h2 in range(b1.n_heads)]
    b_V2 = [W["blocks.1.attn.b_V"][h2] for h2 in range(b1.n_heads)]
    for s_id, p in enumerate(rep):
        toks_self = spec.allowed[spec.allowed_id[p]]
        ns = int(nslots[p])
        slot_sets = [None] * ns
        for h in range(H):
            if slot[h, p] >= 0:
                slot_sets[slot[h, p]] = spec.allowed[spec.allowed_id[tg[h, p]]]
        assigns = list(itertools.product(toks_self, *slot_sets))
        A = np.asarray(assigns, dtype=np.int64).reshape(len(assigns), 1 + ns)
        tok_self = A[:, 0]
        tok_t = np.stack([tok_self if slot[h, p] < 0 else A[:, 1 + slot[h, p]] for h in range(H)], axis=1)
        f = spec.feature(np.full(len(A), p), tok_self, tok_t)
        fmin[s_id], fmax[s_id] = int(f.min()), int(f.max())
        x0 = np.asarray(fmt.add(V_tok[tok_self][:, work], free[p][None, :]))  # [A, |work|]
        z_lo = np.concatenate([y_lo[h][tok_t[:, h]] for h in range(H)], axis=1)
        z_hi = np.concatenate([y_hi[h][tok_t[:, h]] for h in range(H)], axis=1)
        lo, hi = _imatmul(fmt, z_lo, z_hi, W_O)
        lo, hi = _iadd(fmt, lo, hi, b_O)
        mid_lo, mid_hi = _iadd(fmt, lo, hi, x0)
        x1_lo, x1_hi = _mlp(fmt, W, 0, work, mid_lo, mid_hi)
        shape_boxes.append((A, tok_self, tok_t, f, x1_lo, x1_hi))
        for h2 in range(b1.n_heads):
            vlo, vhi = _imatmul(fmt, x1_lo, x1_hi, W_V2[h2])
            vlo, vhi = _iadd(fmt, vlo, vhi, b_V2[h2])
            for fv in (0, 1):
                sel = f == fv
                if not np.any(sel):
                    continue
                key = (h2, fv)
                lo_, hi_ = vlo[sel].min(axis=0), vhi[sel].max(axis=0)
                V2lo[key] = lo_ if key not in V2lo else np.minimum(V2lo[key], lo_)
                V2hi[key] = hi_ if key not in V2hi else np.maximum(V2hi[key], hi_)
                lst = views.setdefault(key, [])
                for ai in np.flatnonzero(sel)[:4]:
                    if len(lst) < 64:
                        lst.append((int(p), A[ai].tolist(), vlo[ai].tolist(), vhi[ai].tolist()))
    exact_values = all(np.array_equal(V2lo[k_], V2hi[k_]) for k_ in V2lo)
    st.details["layer2_values"] = {f"head{k_[0]},f={k_[1]}": [fmt.to_fraction(np.array([int(a)]))[0].__str__() + (
        "" if a == b else ".." + fmt.to_fraction(np.array([int(b)]))[0].__str__()) for a, b in zip(V2lo[k_], V2hi[k_])]
        for k_ in sorted(V2lo)}
    # views whose value is not the common one are the ones worth planting if the readout fails
    for k_, lst in views.items():
        for p, a_, lo_, hi_ in lst:
            if not (np.array_equal(lo_, V2lo[k_]) and np.array_equal(hi_, V2hi[k_])) or not exact_values:
                st.hint.setdefault("plant", []).append((p, a_))

    # ---- step 5: uniform average and readout ------------------------------------------------------
    e0 = np.asarray(fmt.exp(np.array([0])))
    Zu = _clamp(fmt, np.array([T * int(e0[0])], dtype=object))
    a2u = int(np.asarray(fmt.div(e0, Zu))[0])
    st.details["uniform_weight"] = str(fmt.to_fraction(np.array([a2u]))[0])
    w1lo, w1hi, w0lo, w0hi = [], [], [], []
    for h2 in range(b1.n_heads):
        dv = len(b_V2[h2])
        zero = np.zeros(dv, np.int64)
        av = np.full(dv, a2u)
        w1lo.append(_r(fmt, av, V2lo.get((h2, 1), zero)))
        w1hi.append(_r(fmt, av, V2hi.get((h2, 1), zero)))
        w0lo.append(_r(fmt, av, V2lo.get((h2, 0), zero)))
        w0hi.append(_r(fmt, av, V2hi.get((h2, 0), zero)))
    W_O2 = np.concatenate([W["blocks.1.attn.W_O"][h2] for h2 in range(b1.n_heads)], axis=0)[:, work]
    b_O2 = W["blocks.1.attn.b_O"][work]
    w1l, w1h = np.concatenate(w1lo).astype(object), np.concatenate(w1hi).astype(object)
    w0l, w0h = np.concatenate(w0lo).astype(object), np.concatenate(w0hi).astype(object)
    last = T - 1
    s_last = shape_of[last]
    A, _, _, f_last, xl_lo, xl_hi = shape_boxes[s_last]
    others_lo = int(fmin[shape_of].sum() - fmin[s_last])
    others_hi = int(fmax[shape_of].sum() - fmax[s_last])
    W_U, b_U = W["unembed.W_U"][work], W["unembed.b_U"]
    min_margin = None
    for ai in range(len(A)):
        S_all = np.arange(int(f_last[ai]) + others_lo, int(f_last[ai]) + others_hi + 1, dtype=np.int64)
        for s0 in range(0, len(S_all), 1 << 15):
            S = S_all[s0 : s0 + (1 << 15)]
            So, To = S[:, None].astype(object), (T - S)[:, None].astype(object)
            z_lo = _clamp(fmt, So * w1l[None, :] + To * w0l[None, :])
            z_hi = _clamp(fmt, So * w1h[None, :] + To * w0h[None, :])
            at_lo, at_hi = _imatmul(fmt, z_lo, z_hi, W_O2)
            at_lo, at_hi = _iadd(fmt, at_lo, at_hi, b_O2)
            m_lo, m_hi = np.asarray(fmt.add(at_lo, xl_lo[ai][None])), np.asarray(fmt.add(at_hi, xl_hi[ai][None]))
            x2_lo, x2_hi = _mlp(fmt, W, 1, work, m_lo, m_hi)
            lo, hi = _imatmul(fmt, x2_lo, x2_hi, W_U)
            lo, hi = _iadd(fmt, lo, hi, b_U)
            want = ((S > spec.b) != spec.negate).astype(np.int64)
            ans = np.asarray(model.answers)
            ci = np.array([int(np.flatnonzero(ans == w)[0]) for w in (0, 1)])[want]
            r_ = np.arange(len(S))
            other_hi = np.where(np.arange(lo.shape[1])[None, :] == ci[:, None], np.iinfo(np.int64).min, hi).max(axis=1)
            mg = lo[r_, ci].astype(object) - other_hi.astype(object)
            mm = int(mg.min())
            min_margin = mm if min_margin is None else min(min_margin, mm)
            if mm <= 0:
                bad = np.flatnonzero(mg <= 0)
                st.details["min_margin_raw"] = min_margin
                st.hint.setdefault("counts", []).extend(int(v) for v in S[bad[:8]])
                st.hint.setdefault("plant", []).append((last, A[ai].tolist()))
                raise Unproven(f"readout fails for S = {int(S[bad[0]])} true features with last view {A[ai].tolist()} "
                               f"(margin {Fraction(mm) * fmt.step})")
    st.details["min_margin_raw"] = min_margin
    st.details["S_range"] = [others_lo, others_hi + 1]
    return Fraction(int(min_margin)) * fmt.step, int(st.details["row_classes"])


def _mlp(fmt, W, l, work, lo, hi):
    Win, bin_ = W[f"blocks.{l}.mlp.W_in"][work], W[f"blocks.{l}.mlp.b_in"]
    Wout, bout = W[f"blocks.{l}.mlp.W_out"][:, work], W[f"blocks.{l}.mlp.b_out"][work]
    p_lo, p_hi = _imatmul(fmt, lo, hi, Win)
    p_lo, p_hi = _iadd(fmt, p_lo, p_hi, bin_)
    p_lo, p_hi = _irelu(fmt, p_lo, p_hi)
    o_lo, o_hi = _imatmul(fmt, p_lo, p_hi, Wout)
    o_lo, o_hi = _iadd(fmt, o_lo, o_hi, bout)
    return np.asarray(fmt.add(lo, o_lo)), np.asarray(fmt.add(hi, o_hi))


def _free_rows(model: CompiledModel, fmt: Format, work: np.ndarray, T: int) -> np.ndarray:
    """Raw positional entries [T, |work|] outside the Q/K code blocks (without materialising the
    code blocks)."""
    pe = model.pos_embed
    out = np.zeros((T, len(work)), dtype=np.int64)
    colpos = {int(c): i for i, c in enumerate(work)}
    if pe.table.shape[0]:
        raw = pe.table.raw(fmt)
        rows = np.arange(pe.table_first_row, min(T, pe.table_first_row + pe.table.shape[0]))
        out[rows] = raw[rows - pe.table_first_row][:, work]
    for b in pe.blocks:
        cols = [c for c in range(b.col, b.col + b.code.k) if c in colpos]
        if not cols:
            continue
        rows = np.arange(b.first_row, min(T, b.first_row + b.count))
        nums = np.asarray(b.code.numerators(rows - b.first_row + b.code_start))
        pos_r, neg_r = (int(v) for v in np.asarray(fmt.quantize(np.array([b.scale, -b.scale], dtype=object))))
        vals = np.where(nums > 0, pos_r, np.where(nums < 0, neg_r, 0))
        for c in cols:
            out[rows, colpos[c]] = vals[:, c - b.col]
    return out


# ------------------------------------------------------------------------------------------------
# counterexample search
# ------------------------------------------------------------------------------------------------


def _search(model: CompiledModel, fmt: Format, spec: Spec, hint: dict, run_fn, count: int = CANDIDATES) -> dict | None:
    """Run up to about ``count`` candidate inputs through the executor; the first wrong answer, or None."""
    task = spec.task
    batches = []
    rng = np.random.default_rng(12345)
    for b in task.adversarial(model, count, seed=1):
        batches.append(b.arrays[0])
    base = batches[0][:64] if batches else None
    if hint.get("counts") and hasattr(task, "with_count") and model.construction != "equality":
        x, ok = task.with_count(model, np.asarray(hint["counts"][:16]), rng)
        if ok.any():
            batches.insert(0, x[ok])
    if hint.get("counts") and isinstance(getattr(task, "complement", None), bool):
        batches.insert(0, _eq_with_counts(model, np.asarray(hint["counts"][:16]), rng))
    for p, assign in hint.get("plant", [])[:8]:
        if base is None:
            break
        batches.insert(0, _plant(model, spec, base, p, assign))
    for b in task.sample(model, max(1, count // 2), seed=2):
        batches.append(b.arrays[0])
    for x in batches:
        for s in range(0, len(x), 512):
            cex = run_fn(model, x[s : s + 512])
            if cex is not None:
                return cex
    return None


def _eq_with_counts(model: CompiledModel, counts: np.ndarray, rng) -> np.ndarray:
    """Equality inputs with exactly ``counts`` mismatched pairs (the last pair included or not)."""
    n, h = model.n, model.n // 2
    out = []
    for c in counts:
        for include_last in (True, False):
            x = rng.choice(np.array([-1, 1]), size=n)
            x[h:] = x[:h]
            pool = np.arange(h) if include_last else np.arange(h - 1)
            c_ = int(min(max(c, 0), len(pool)))
            sel = pool[-c_:] if (include_last and c_) else rng.choice(pool, size=c_, replace=False)
            x[h + sel] *= -1
            out.append(x)
    return np.asarray(out)


def _plant(model: CompiledModel, spec: Spec, base: np.ndarray, p: int, assign: list[int]) -> np.ndarray:
    """Base inputs with the view ``assign`` (tokens of position p and its partners) planted."""
    toks = spec.task._encode(model, base).copy()
    H = spec.targets.shape[0]
    toks[:, p] = assign[0]
    seen = {}
    for h in range(H):
        t = int(spec.targets[h, p])
        if t == p:
            continue
        if t not in seen:
            seen[t] = len(seen)
        if 1 + seen[t] < len(assign):
            toks[:, t] = assign[1 + seen[t]]
    return spec.to_inputs(toks)


# ------------------------------------------------------------------------------------------------
# searches built on the certificate
# ------------------------------------------------------------------------------------------------


def smallest_certified_eta(build: Callable[[Fraction], CompiledModel], fmt: Format, unit: Fraction, j_hi: int,
                           device: str = "cpu") -> tuple[Fraction | None, list[int]]:
    """The smallest eta = unit * j (j <= j_hi) whose model certifies, by bisection on j assuming
    monotonicity, then checked: returns (eta, the j values that were certified). Callers report
    whether j - 1 fails (it must) and j .. j_hi pass at the probed points."""
    ok: dict[int, bool] = {}

    def passes(j: int) -> bool:
        if j not in ok:
            try:
                m = build(unit * j)
                ok[j] = certify_two_layer(m, fmt, device=device).passed
            except (ValueError, Unproven):
                ok[j] = False
        return ok[j]

    if not passes(j_hi):
        return None, []
    lo, hi = 0, j_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    return unit * hi, sorted(j for j, v in ok.items() if v)


# ------------------------------------------------------------------------------------------------
# tables for docs/equality.md and docs/thresholds.md (python -m exactformer.verify.certify_two_layer)
# ------------------------------------------------------------------------------------------------


def _builders() -> dict[str, Callable[..., CompiledModel]]:
    from exactformer.constructions import equality as eqm
    from exactformer.constructions import thresholds as thm

    return {"equality": eqm.equality, "inequality": eqm.inequality, "disjointness": thm.disjointness,
            "dnf": thm.k_dnf, "cnf": thm.k_cnf, "threshold": thm.threshold_features}


def size_table(kind: str, lo: int, hi: int, certify_up_to: int = 20) -> str:
    """Markdown size table for N = 2^lo .. 2^hi (default builder settings), certified up to
    2^certify_up_to. Every number is computed here."""
    from exactformer.precision import parse_format

    build = _builders()[kind]
    head = ("| N | code (family, k) | mu | eta used | eta paper | Kc | precision | p (bits) | d_model | width | "
            "d_mlp | heads | parameters | size (bits) | certificate | build s | certify s |")
    rows = [head, "|" + "---|" * 17]
    for e in range(lo, hi + 1):
        n = 1 << e
        t0 = time.perf_counter()
        m = build(n)
        tb = time.perf_counter() - t0
        P = m.params
        fmt = parse_format(m.precision)
        cert, tc = "-", 0.0
        if e <= certify_up_to:
            t1 = time.perf_counter()
            r = certify_two_layer(m, fmt)
            tc = time.perf_counter() - t1
            cert = ("proved, one-hot" if r.details.get("one_hot") else "proved") if r.passed else "FAILED: " + r.reason
        heads = "+".join(str(b.attn.n_heads) for b in m.blocks)
        rows.append(f"| 2^{e} | {m.code.family}, {P['k'].value} | {P['mu'].value} | {P['eta'].value} (= {float(P['eta'].value):.4g}) | "
                    f"{P['eta_paper'].value:.4g} | {P['Kc'].value:.3g} | {m.precision} | {P['precision_bits'].value} | "
                    f"{m.d_model} | {m.width} | {m.d_mlp} | {heads} | {m.parameter_count()} | {P['size_bits'].value} | "
                    f"{cert} | {tb:.2f} | {tc:.2f} |")
    return "\n".join(rows)


def eta_precision_table(kind: str, lo: int, hi: int, positions: str = "reed-solomon") -> str:
    """Per N: the builder's eta (one-hot), the threshold-mode eta, the paper's eta, the smallest eta
    that certifies (in the default precision), and the fewest-bit binary format that certifies
    with the builder's own eta for that format."""
    from exactformer.constructions.equality import gram_scale
    from exactformer.constructions.position_codes import position_codes
    from exactformer.precision import FixedPoint, parse_format

    build = _builders()[kind]
    rows = ["| N | k | default precision | eta one-hot (default) | eta threshold | eta paper | smallest certified eta | "
            "checked | fewest-bit certified format | its eta | default bits |", "|" + "---|" * 11]
    for e in range(lo, hi + 1):
        n = 1 << e
        T = n + 1 if kind in ("disjointness", "dnf", "cnf", "threshold") else n
        code = position_codes(T, family=positions)
        m = build(n, positions=code)
        fmt = parse_format(m.precision)
        unit = fmt.step / gram_scale(code)
        j_hi = int(m.params["eta"].value / unit)
        if j_hi <= 256:  # full downward scan: smallest eta from which every larger grid eta certifies
            j_min, checked = j_hi, "full scan"
            for j in range(j_hi - 1, 0, -1):
                if not certify_two_layer(build(n, positions=code, precision=fmt, eta=unit * j), fmt).passed:
                    break
                j_min = j
            eta_min = unit * j_min
        else:
            eta_min, ok = smallest_certified_eta(lambda eta: build(n, positions=code, precision=fmt, eta=eta),
                                                 fmt, unit, j_hi)
            checked = "bisection"
        best = None
        for p in range(2, 64):
            for frac in range(1, p):
                f = FixedPoint.binary(int_bits=p - frac, frac_bits=frac)
                try:
                    mm = build(n, positions=code, precision=f)
                except ValueError:
                    continue
                if certify_two_layer(mm, f).passed:
                    best = (f, mm.params["eta"].value)
                    break
            if best:
                break
        rows.append(f"| 2^{e} | {code.k} | {m.precision} | {m.params['eta'].value} | {m.params['eta_threshold'].value} | "
                    f"{m.params['eta_paper'].value:.4g} | {eta_min} (= {float(eta_min):.4g}) | {checked} | "
                    f"{best[0].name if best else '-'} ({best[0].bits if best else '-'} bits) | {best[1] if best else '-'} | "
                    f"{fmt.bits} |")
    return "\n".join(rows)


def _write_block(path: str, tag: str, md: str) -> None:
    import re
    from pathlib import Path

    doc = Path(path)
    text = doc.read_text()
    block = f"<!-- TABLE:{tag} -->\n{md}\n<!-- /TABLE:{tag} -->"
    pat = re.compile(rf"<!-- TABLE:{re.escape(tag)} -->.*?<!-- /TABLE:{re.escape(tag)} -->", re.S)
    if not pat.search(text):
        raise SystemExit(f"{path}: no <!-- TABLE:{tag} --> ... <!-- /TABLE:{tag} --> markers")
    doc.write_text(pat.sub(lambda _: block, text))


def main(argv: list[str] | None = None) -> None:
    """python -m exactformer.verify.certify_two_layer {sizes,eta} KIND [--min-log-n 4] [--max-log-n 20]
    [--certify-up-to 20] [--write DOC]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m exactformer.verify.certify_two_layer")
    ap.add_argument("table", choices=["sizes", "eta"])
    ap.add_argument("kind", choices=sorted(_builders()))
    ap.add_argument("--min-log-n", type=int, default=4)
    ap.add_argument("--max-log-n", type=int, default=20)
    ap.add_argument("--certify-up-to", type=int, default=20)
    ap.add_argument("--write", default=None, help="replace the <!-- TABLE:{table}-{kind} --> block in this file")
    a = ap.parse_args(argv)
    if a.table == "sizes":
        md = size_table(a.kind, a.min_log_n, a.max_log_n, a.certify_up_to)
    else:
        md = eta_precision_table(a.kind, a.min_log_n, a.max_log_n)
    print(md)
    if a.write:
        _write_block(a.write, f"{a.table}-{a.kind}", md)


if __name__ == "__main__":
    main()
