"""An all-inputs certificate for Index Lookup models (Theorem 1).

The argument (docs/index-lookup.md, "Certificate") in five steps, each checked or computed exactly
from the model's own weights under the format's own operations:

1. Preconditions, checked on the weights: keys read only the positional code block, queries only
   the index token's code block, both as one scale times a coordinate matching of the code, with
   zero biases and +/- entries that round symmetrically; values read neither code block; the MLP
   and the unembedding read neither code block. Then the query-key logit of query p and position
   i depends only on the integer inner product <signs(p), signs(i)>, the query's own logit is 0,
   the value of position i depends only on its symbol, and everything after attention depends only
   on the attention output z.
2. For every query p, the multiset of inner products against the other positions (a histogram
   over levels). Reed-Solomon codes: <signs(p), signs(i)> = q * agreements(p XOR i), so the
   histogram over i in [0, n) is a sum of O(log n) prefix-sum differences over aligned dyadic
   blocks; queries with equal histograms share everything below. Other codes: blocked Gram rows.
3. Per histogram class, the rounded softmax row exactly as ``fmt.softmax`` computes it (row max
   subtracted, exp rounded, exact sum saturated once, each weight divided and rounded).
4. For every symbol s_p at p, the exact range of each coordinate of z over all symbols at the other
   positions: r(a_p, V(s_p)) + r(a_q, V(query)) + sum_levels count * r(a_level, min_t V(t)) (resp.
   max), using that a rounded product r(a, v) = round(a*v) is monotone in v for a >= 0.
5. Interval propagation of those ranges through W_O, the MLP and the unembedding with the exact
   monotone semantics of each op, giving for every (class, s_p) a lower bound on the logit of s_p
   and an upper bound on every other logit. The model is proved correct on every input when the
   lower bound exceeds every upper bound. Otherwise the certificate builds the inputs that attain
   step 4's extremes (s_p at p, one symbol s at every other position, for each s) and runs them
   through the executor: a wrong answer is returned as a counterexample; if none is wrong, the
   result is "unproven" (passed = False, reason given), never a pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.ir import CompiledModel
from exactformer.precision import Format


@dataclass
class CertificateResult:
    passed: bool
    proved: bool  # True when passed by proof
    reason: str
    min_margin: Fraction | None  # smallest (lower bound of correct logit - upper bound of others)
    classes: int  # distinct attention rows examined
    counterexample: dict | None = None
    details: dict = field(default_factory=dict)
    seconds: float = 0.0


class PreconditionFailed(Exception):
    pass


# ------------------------------------------------------------------------------------------------
# helpers on raw values
# ------------------------------------------------------------------------------------------------


def _r(fmt: Format, a, b) -> np.ndarray:
    """Rounded products (the format's mul), elementwise, numpy raw."""
    return np.asarray(fmt.mul(np.asarray(a), np.asarray(b)))


def _clamp(fmt: Format, x):
    return np.clip(x, fmt.min_raw, fmt.max_raw) if not isinstance(x, int) else min(max(x, fmt.min_raw), fmt.max_raw)


def _interval_matmul(fmt: Format, lo: np.ndarray, hi: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact bounds of matmul(x, W) (products rounded, exact sum, saturated once) for x in the box
    [lo, hi] (raw, [..., d_in]); W raw [d_in, d_out]. Each rounded product is monotone in x."""
    rows = np.flatnonzero(np.any(W != 0, axis=1))
    lo, hi, W = lo[..., rows], hi[..., rows], W[rows]
    p_lo = _r(fmt, lo[..., :, None], W[None, :, :] if lo.ndim > 1 else W)
    p_hi = _r(fmt, hi[..., :, None], W[None, :, :] if lo.ndim > 1 else W)
    wide = object if (max(abs(fmt.max_raw), abs(fmt.min_raw)) + 1) * (len(rows) + 1) >= 2**62 else np.int64
    lo_sum = np.minimum(p_lo, p_hi).astype(wide).sum(axis=-2)
    hi_sum = np.maximum(p_lo, p_hi).astype(wide).sum(axis=-2)
    return _clamp_obj(fmt, lo_sum), _clamp_obj(fmt, hi_sum)


def _clamp_obj(fmt: Format, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=object)
    x = np.where(x > fmt.max_raw, fmt.max_raw, x)
    x = np.where(x < fmt.min_raw, fmt.min_raw, x)
    return x.astype(np.int64)


def _interval_add(fmt: Format, lo, hi, b) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(fmt.add(lo, b)), np.asarray(fmt.add(hi, b))


# ------------------------------------------------------------------------------------------------
# step 1: preconditions
# ------------------------------------------------------------------------------------------------


@dataclass
class _Layout:
    code: Any
    k: int
    S: int
    n: int
    q_cols: np.ndarray  # residual columns of the query code block, in code-coordinate order
    p_cols: np.ndarray
    dims: np.ndarray  # head dims matched to code coordinates
    alpha: int  # raw W_Q entry
    beta: int  # raw W_K entry
    sigma_q: Fraction
    sigma_p: Fraction


def _layout(model: CompiledModel, fmt: Format, W: dict[str, np.ndarray]) -> _Layout:
    if len(model.blocks) != 1 or model.blocks[0].attn.n_heads != 1:
        raise PreconditionFailed("the model must have one block with one head")
    if model.blocks[0].attn.causal:
        raise PreconditionFailed("attention must be bidirectional")
    S, n = len(model.answers), model.n
    pb = [b for b in model.pos_embed.blocks if b.first_row == 0 and b.count == n]
    qb = [b for b in model.embed.blocks if b.first_row == S and b.count == n]
    if len(pb) != 1 or len(qb) != 1 or len(model.pos_embed.blocks) != 1 or len(model.embed.blocks) != 1:
        raise PreconditionFailed("expected one positional code block (rows 0..n-1) and one index-token code block")
    pb, qb = pb[0], qb[0]
    if pb.code is not qb.code or pb.code_start != qb.code_start:
        raise PreconditionFailed("index tokens and positions must use the same code with the same indexing")
    if model.pos_embed.table.shape[0] != 0 or model.embed.table_first_row != 0 or model.embed.table.shape[0] != S:
        raise PreconditionFailed("positional rows must come from the code only; the table must hold exactly the symbols")
    k = pb.code.k
    q_cols, p_cols = np.arange(qb.col, qb.col + k), np.arange(pb.col, pb.col + k)
    if np.any(model.embed.table.num[:, np.r_[q_cols, p_cols]] != 0):
        raise PreconditionFailed("symbol embeddings must be zero on the code columns")
    W_Q, W_K, W_V = W["blocks.0.attn.W_Q"][0], W["blocks.0.attn.W_K"][0], W["blocks.0.attn.W_V"][0]
    if np.any(W["blocks.0.attn.b_Q"]) or np.any(W["blocks.0.attn.b_K"]):
        raise PreconditionFailed("query and key biases must be zero")
    K_other = np.delete(W_K, p_cols, axis=0)
    if np.any(K_other != 0):
        raise PreconditionFailed("W_K must read only the positional code columns")
    dims_k, alpha, dims_q, beta = [], None, [], None
    for t in range(k):
        rk, rq = W_K[p_cols[t]], W_Q[q_cols[t]]
        nk, nq = np.flatnonzero(rk), np.flatnonzero(rq)
        if len(nk) != 1 or len(nq) != 1 or nk[0] != nq[0]:
            raise PreconditionFailed(f"code coordinate {t}: W_Q and W_K must map it to one common head dim")
        dims_k.append(nk[0])
        if beta is None:
            beta, alpha = int(rk[nk[0]]), int(rq[nq[0]])
        if int(rk[nk[0]]) != beta or int(rq[nq[0]]) != alpha:
            raise PreconditionFailed("W_Q (resp. W_K) must use one scale on the code block")
    dims = np.asarray(dims_k)
    if len(set(dims.tolist())) != k:
        raise PreconditionFailed("code coordinates must map to distinct head dims")
    if np.any(W_V[np.r_[q_cols, p_cols]] != 0):
        raise PreconditionFailed("W_V must not read the code columns")
    for name in ("blocks.0.mlp.W_in", "unembed.W_U"):
        if np.any(W[name][q_cols] != 0) or np.any(W[name][p_cols] != 0):
            raise PreconditionFailed(f"{name} must not read the code columns")
    # +/- code entries must round symmetrically so the logit depends on the inner product only
    sq, sp = (np.asarray(fmt.quantize(np.array([b.scale, -b.scale], dtype=object))) for b in (qb, pb))
    u = _r(fmt, sq, np.array([alpha, alpha]))
    v = _r(fmt, sp, np.array([beta, beta]))
    if getattr(pb.code, "is_sign_code", True) and (u[0] != -u[1] or v[0] != -v[1]):
        raise PreconditionFailed("+/- code entries round asymmetrically under this format")
    return _Layout(pb.code, k, S, n, q_cols, p_cols, dims, alpha, beta, qb.scale, pb.scale)


# ------------------------------------------------------------------------------------------------
# step 2: inner-product histograms per query
# ------------------------------------------------------------------------------------------------


def level_histograms(code: Any, n: int, device: str = "cpu") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Histograms of <signs(p), signs(i)> over i in [0, n), i != p, for every p in [0, n).

    Returns ``levels`` (integer inner products, [L]), ``hist`` ([C, L] counts for each distinct
    histogram class) and ``cls`` ([n], the class of each p).
    """
    k = int(code.k)
    if getattr(code, "family", None) == "onehot":  # orthogonal: every other position at level 0
        return np.array([0]), np.array([[n - 1]]), np.zeros(n, dtype=np.int64)
    if getattr(code, "family", None) == "reed-solomon":
        q = int(code.q)
        M = 1 << max(0, (n - 1).bit_length())
        ag = np.asarray(code.agreements(np.arange(M, dtype=np.int64)), dtype=np.int64)
        ag[0] = -1  # self, removed below
        levels_ag = np.arange(int(code.d))  # 0 .. d-1 agreements
        onehot = (ag[:, None] == levels_ag[None, :]).astype(np.int32)
        prefix = np.zeros((M + 1, len(levels_ag)), dtype=np.int64)
        np.cumsum(onehot, axis=0, out=prefix[1:])
        p = np.arange(n, dtype=np.int64)
        hist = np.zeros((n, len(levels_ag)), dtype=np.int64)
        start = 0
        for b in range(n.bit_length() - 1, -1, -1):
            if not (n >> b) & 1:
                continue
            size = 1 << b
            begin = ((start ^ p) >> b) << b
            hist += prefix[begin + size] - prefix[begin]
            start += size
        levels = q * levels_ag
    else:
        hist_full = np.zeros((n, 2 * k + 1), dtype=np.int64)
        block = max(1, min(n, (1 << 24) // max(n, 1)))
        all_signs = _signs_block(code, np.arange(n), device)
        for s in range(0, n, block):
            rows = np.arange(s, min(n, s + block))
            G = _gram(_signs_block(code, rows, device), all_signs, device)  # [b, n] ints
            G[np.arange(len(rows)), rows] = -k - 1  # drop self (sentinel below the range)
            off = (G + k) + (np.arange(len(rows)) * (2 * k + 1))[:, None]
            off = off[G >= -k]
            hist_full[rows] = np.bincount(off, minlength=len(rows) * (2 * k + 1)).reshape(len(rows), 2 * k + 1)
        used = np.flatnonzero(hist_full.sum(axis=0))
        hist, levels = hist_full[:, used], used - k
    uniq, cls = np.unique(hist, axis=0, return_inverse=True)
    return np.asarray(levels, dtype=np.int64), uniq, cls.reshape(-1)


def _signs_block(code, rows, device):
    if device == "cuda":
        import torch

        return torch.as_tensor(np.asarray(code.numerators(rows)), device=device)
    return np.asarray(code.numerators(rows), dtype=np.float32)


def _gram(a, b, device) -> np.ndarray:
    if device == "cuda":
        import torch

        return (a.to(torch.float32) @ b.to(torch.float32).T).round().to(torch.int64).cpu().numpy()
    return np.rint(a @ b.T).astype(np.int64)  # exact: entries are +/-1 and k < 2^24


# ------------------------------------------------------------------------------------------------
# steps 3-5
# ------------------------------------------------------------------------------------------------


def certify_index_lookup(model: CompiledModel, fmt: Format, device: str = "cpu", run_fn=None,
                         method: str = "auto") -> CertificateResult:
    """Prove ``model`` answers IdxL correctly on all |Sigma|^N * N inputs under ``fmt``, or return a
    counterexample, or say why it cannot (see the module docstring).

    ``method``: "histogram" (step 2 as described; CPU), "rows" (every query's rounded attention
    row streamed in blocks with torch, on ``device``; needs integer-valued value vectors) or "auto"
    (rows for codes without algebraic structure when the values are integers, else histograms).
    """
    t0 = time.perf_counter()
    if method not in ("auto", "histogram", "rows"):
        raise ValueError(f"method must be 'auto', 'histogram' or 'rows', got {method!r}")
    if not fmt.is_exact:
        return CertificateResult(False, False, "certificates need an exact fixed-point format", None, 0, seconds=0.0)
    W = model.weights_raw(fmt)
    try:
        lay = _layout(model, fmt, W)
    except PreconditionFailed as e:
        return CertificateResult(False, False, f"precondition failed: {e}", None, 0,
                                 seconds=time.perf_counter() - t0)
    k = lay.k

    # step 3: logits per level (sum of rounded products, saturated once), then the softmax row
    u = int(_r(fmt, np.asarray(fmt.quantize(np.array([lay.sigma_q], dtype=object))), np.array([lay.alpha]))[0])
    v = int(_r(fmt, np.asarray(fmt.quantize(np.array([lay.sigma_p], dtype=object))), np.array([lay.beta]))[0])
    same, cross = int(_r(fmt, np.array([u]), np.array([v]))[0]), int(_r(fmt, np.array([u]), np.array([-v]))[0])

    sign_code = getattr(lay.code, "is_sign_code", True)
    kappa = int(1 / Fraction(getattr(lay.code, "gram_scale", Fraction(1, k))))  # <num(p), num(p)>

    def logit(I: np.ndarray) -> np.ndarray:
        if sign_code:  # +-1 entries: agreeing coordinates give `same`, the others `cross`
            agree = (k + I) // 2
            return np.clip(agree * same + (k - agree) * cross, fmt.min_raw, fmt.max_raw)
        return np.clip(I * same, fmt.min_raw, fmt.max_raw)  # 0/1 entries: I coordinates are both 1

    l_target = int(logit(np.array([kappa]))[0])
    l_query = 0

    # step 4 (inputs): V(t) for symbols (token-only), V(query) = b_V
    syms = model.embed.raw(np.arange(lay.S), fmt)
    W_V, b_V = W["blocks.0.attn.W_V"][0], W["blocks.0.attn.b_V"][0]
    V = np.asarray(fmt.add(fmt.matmul(syms, W_V), b_V))  # [S, dh]
    Vq = b_V
    vmin, vmax = V.min(axis=0), V.max(axis=0)
    if np.any(V < 0) or np.any(Vq < 0):
        return CertificateResult(False, False, "precondition failed: value vectors must be >= 0", None, 0,
                                 seconds=time.perf_counter() - t0)

    integer_values = not (np.any(V % fmt.scale) or np.any(Vq % fmt.scale))
    use_rows = method == "rows" or (method == "auto" and integer_values
                                    and getattr(lay.code, "family", None) not in ("reed-solomon", "onehot"))
    if use_rows:
        # step 2-3 without histograms: exact rounded rows streamed per block of queries
        if np.any(V % fmt.scale) or np.any(Vq % fmt.scale):
            return CertificateResult(False, False, "precondition failed: the row method needs integer values", None, 0,
                                     seconds=time.perf_counter() - t0)
        table = logit(np.arange(-k, k + 1))
        a_t_rows, a_q_rows, sum_rows = row_stats(lay.code, lay.n, table, l_target, fmt, device)
        stats = np.stack([a_t_rows, a_q_rows, sum_rows], axis=1)
        uniq, cls = np.unique(stats, axis=0, return_inverse=True)
        cls = cls.reshape(-1)
        a_t, a_q, sum_a = (uniq[:, i] for i in range(3))
        C = len(uniq)
        rest_lo = sum_a.astype(object)[:, None] * (vmin // fmt.scale).astype(object)[None, :]
        rest_hi = sum_a.astype(object)[:, None] * (vmax // fmt.scale).astype(object)[None, :]
        details_extra = {"method": "rows", "device": device}
        rest_weight_max = int(sum_a.max())
    else:
        levels, hist, cls = level_histograms(lay.code, lay.n, device)
        l_levels = logit(levels)
        C = hist.shape[0]
        present = hist > 0
        lmax = np.maximum(np.max(np.where(present, l_levels[None, :], fmt.min_raw), axis=1), max(l_target, l_query))
        e_lv = np.asarray(fmt.exp(fmt.sub(np.broadcast_to(l_levels, (C, len(levels))).copy(), lmax[:, None])))
        e_t = np.asarray(fmt.exp(fmt.sub(np.full(C, l_target), lmax)))
        e_q = np.asarray(fmt.exp(fmt.sub(np.full(C, l_query), lmax)))
        Z = (hist.astype(object) * e_lv.astype(object)).sum(axis=1) + e_t.astype(object) + e_q.astype(object)
        Z = _clamp_obj(fmt, Z)
        a_lv = np.asarray(fmt.div(e_lv, Z[:, None]))
        a_t = np.asarray(fmt.div(e_t, Z))
        a_q = np.asarray(fmt.div(e_q, Z))

        # sum over other positions of r(a_level, v), exact ints [C, dh]
        def others(vvec):
            prods = _r(fmt, a_lv[:, :, None], vvec[None, None, :])  # [C, L, dh]
            return (hist[:, :, None].astype(object) * prods.astype(object)).sum(axis=1)

        rest_lo, rest_hi = others(vmin), others(vmax)
        details_extra = {"method": "histogram", "levels": levels.tolist() if len(levels) <= 16 else len(levels)}
        rest_weight_max = int((hist.astype(object) * a_lv.astype(object)).sum(axis=1).max())

    own = _r(fmt, a_t[:, None, None], V[None, :, :]).astype(object)  # [C, S, dh]
    qv = _r(fmt, a_q[:, None], Vq[None, :]).astype(object)  # [C, dh]
    z_lo = _clamp_obj(fmt, own + (qv + rest_lo)[:, None, :])
    z_hi = _clamp_obj(fmt, own + (qv + rest_hi)[:, None, :])

    # step 5: the post-attention map, tabulated exactly per value coordinate over its range
    S = lay.S
    try:
        margin = _post_attention_margins(model, fmt, W, z_lo, z_hi, S)
    except PreconditionFailed as e:
        return CertificateResult(False, False, f"precondition failed: {e}", None, C,
                                 seconds=time.perf_counter() - t0)
    min_margin = Fraction(int(margin.min())) * fmt.step
    details = {
        "k": k,
        "classes": C,
        "eta_logit": str(fmt.to_fraction(l_target)),
        "min_target_weight": str(fmt.to_fraction(int(a_t.min()))),
        "max_rest_weight": str(fmt.to_fraction(rest_weight_max)),
        **details_extra,
    }
    if min_margin > 0:
        return CertificateResult(True, True, "proved for all inputs", min_margin, C, None, details,
                                 time.perf_counter() - t0)

    # candidates attaining the extremes: s_p at p, one symbol s everywhere else
    bad = np.argwhere(margin <= 0)
    cand_sym, cand_p = [], []
    for c, sp in bad[:64]:
        p0 = int(np.flatnonzero(cls == c)[0]) + 1  # 1-based index of a representative query
        for s in range(S):
            if s == sp:
                continue
            sy = np.full(lay.n, s, dtype=np.int64)
            sy[p0 - 1] = sp
            cand_sym.append(sy)
            cand_p.append(p0)
    cex = None
    if run_fn is not None and cand_sym:
        cex = run_fn(model, np.asarray(cand_sym), np.asarray(cand_p))
    if cex is not None:
        return CertificateResult(False, False, "counterexample found", min_margin, C, cex, details,
                                 time.perf_counter() - t0)
    return CertificateResult(False, False,
                             "unproven: the worst-case bound fails but no attaining input was found wrong",
                             min_margin, C, None, details, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------
# step 5: exact post-attention margins
# ------------------------------------------------------------------------------------------------

MAX_GRID_POINTS = 1 << 22  # per value coordinate; beyond this the certificate declines


def _owners(W: dict[str, np.ndarray], jcols: np.ndarray) -> tuple[list[set], list[set], list[set]]:
    """Which value coordinates each attention-output column and each final residual column
    depend on (through W_O, then W_in/W_out)."""
    W_O = W["blocks.0.attn.W_O"][0]
    W_in, W_out = W["blocks.0.mlp.W_in"], W["blocks.0.mlp.W_out"]
    d = W_O.shape[1]
    mid = [set(int(j) for j in jcols if W_O[j, c] != 0) for c in range(d)]
    hid = [set().union(*[mid[c] for c in np.flatnonzero(W_in[:, h])]) for h in range(W_in.shape[1])]
    fin = [mid[c].union(*[hid[h] for h in np.flatnonzero(W_out[:, c])]) for c in range(d)]
    return mid, hid, fin


def _post_attention(fmt: Format, W: dict[str, np.ndarray], z: np.ndarray) -> np.ndarray:
    """The query's final residual stream [B, d_model] for attention outputs z [B, d_head] (raw),
    exactly as the executor computes it (the query's residual is zero off the code columns, which
    nothing after attention reads)."""
    attn = fmt.add(fmt.matmul(z, W["blocks.0.attn.W_O"][0]), W["blocks.0.attn.b_O"])
    pre = fmt.add(fmt.matmul(attn, W["blocks.0.mlp.W_in"]), W["blocks.0.mlp.b_in"])
    out = fmt.add(fmt.matmul(fmt.relu(pre), W["blocks.0.mlp.W_out"]), W["blocks.0.mlp.b_out"])
    return np.asarray(fmt.add(attn, out))


def _post_attention_margins(model, fmt: Format, W: dict[str, np.ndarray], z_lo: np.ndarray, z_hi: np.ndarray,
                            S: int) -> np.ndarray:
    """min over z in the box [z_lo, z_hi] of logit_{s_p} - max_{s != s_p} logit_s, per class and s_p
    ([C, S] raw), exact when no logit sum can saturate and a sound lower bound otherwise.

    Separability (checked): every final residual column depends on at most one value coordinate j,
    so logit_s = sat(sat(sum_j g_{s,j}(z_j) + K_s) + b_U[s]), where g_{s,j} sums the rounded
    unembedding products of the columns owned by j. Each g_{.,j} is tabulated on every grid point of
    coordinate j's range; the minimum over a box of a separable sum is the sum of the minima.
    """
    C = z_lo.shape[0]
    W_U = W["unembed.W_U"]
    jcols = np.flatnonzero(np.any(z_hi != 0, axis=(0, 1)) | np.any(z_lo != 0, axis=(0, 1)))
    mid, hid, fin = _owners(W, np.arange(z_lo.shape[2]))
    if any(len(o) > 1 for o in fin):
        raise PreconditionFailed("the post-attention map mixes value coordinates (not separable)")
    dh = z_lo.shape[2]
    x0 = _post_attention(fmt, W, np.zeros((1, dh), dtype=np.int64))[0]
    unowned = np.array([len(o) == 0 for o in fin])
    K = np.asarray(fmt.mul(x0[unowned][:, None], W_U[unowned])).astype(object).sum(axis=0)  # [S]
    lo_tot = np.broadcast_to(K, (C, S, S)).astype(object).copy()  # [C, s_p, s]: sum lower bounds
    hi_tot = lo_tot.copy()
    diff_min = np.zeros((C, S, S), dtype=object)  # min over box of sum_j (g_{s_p} - g_s)
    for j in jcols:
        cols = np.flatnonzero([o == {int(j)} for o in fin])
        boxes = np.stack([z_lo[:, :, j], z_hi[:, :, j]], axis=-1).reshape(-1, 2)
        ubox, inv = np.unique(boxes, axis=0, return_inverse=True)
        inv = inv.reshape(C, S)
        points = int((ubox[:, 1] - ubox[:, 0] + 1).sum())
        if points > MAX_GRID_POINTS:
            raise PreconditionFailed(f"value coordinate {j}: its ranges hold {points} grid points (limit {MAX_GRID_POINTS})")
        members = np.split(np.argsort(inv.ravel(), kind="stable"), np.cumsum(np.bincount(inv.ravel(), minlength=len(ubox)))[:-1])
        # the map z_j -> final columns owned by j only involves these rows and columns
        cm = np.flatnonzero([o <= {int(j)} for o in mid])
        H = np.flatnonzero([o <= {int(j)} for o in hid])
        pos_out = np.searchsorted(cm, cols)
        W_O_j = W["blocks.0.attn.W_O"][0][[j]][:, cm]
        W_in_j = W["blocks.0.mlp.W_in"][cm][:, H]
        W_out_j = W["blocks.0.mlp.W_out"][H][:, cols]
        b_O, b_in, b_out = W["blocks.0.attn.b_O"][cm], W["blocks.0.mlp.b_in"][H], W["blocks.0.mlp.b_out"][cols]
        W_U_j = W_U[cols]
        for b, (lo_b, hi_b) in enumerate(ubox):
            grid = np.arange(lo_b, hi_b + 1, dtype=np.int64)
            table = np.zeros((grid.size, S), dtype=np.int64)
            for s0 in range(0, grid.size if cols.size else 0, 1 << 16):
                zj = grid[s0 : s0 + (1 << 16)][:, None]
                attn = fmt.add(fmt.matmul(zj, W_O_j), b_O)
                out = fmt.add(fmt.matmul(fmt.relu(fmt.add(fmt.matmul(attn, W_in_j), b_in)), W_out_j), b_out)
                xf = np.asarray(fmt.add(np.asarray(attn)[:, pos_out], out))
                table[s0 : s0 + len(zj)] = np.asarray(fmt.mul(xf[:, :, None], W_U_j[None])).sum(axis=1)
            # distinct contribution rows: the table is piecewise constant, so dedupe runs first
            change = np.ones(len(table), dtype=bool)
            change[1:] = np.any(table[1:] != table[:-1], axis=1)
            rows = np.unique(table[change], axis=0).astype(object)  # [U, S]
            for c, sp in zip(*np.divmod(members[b], S)):
                d = (rows[:, sp][:, None] - rows).min(axis=0)
                diff_min[c, sp] += d
                lo_tot[c, sp] += rows.min(axis=0)
                hi_tot[c, sp] += rows.max(axis=0)
    bU = W["unembed.b_U"].astype(object)
    sat = lambda x: np.clip(x, fmt.min_raw, fmt.max_raw)  # noqa: E731
    lo_log, hi_log = sat(sat(lo_tot) + bU), sat(sat(hi_tot) + bU)
    exact = np.all((lo_tot >= fmt.min_raw) & (hi_tot <= fmt.max_raw)
                   & (lo_tot + bU >= fmt.min_raw) & (hi_tot + bU <= fmt.max_raw), axis=2)
    margin = np.empty((C, S), dtype=object)
    for sp in range(S):
        others = [s for s in range(S) if s != sp]
        exact_m = (diff_min[:, sp, :] + (bU[sp] - bU)[None, :])[:, others].min(axis=1)
        loose_m = (lo_log[:, sp, sp][:, None] - hi_log[:, sp, :][:, others]).min(axis=1)
        margin[:, sp] = np.where(exact[:, sp], exact_m, loose_m)
    return margin


# ------------------------------------------------------------------------------------------------
# step 2-3, streamed: exact rounded attention rows for every query (torch, CPU or CUDA)
# ------------------------------------------------------------------------------------------------


def row_stats(code: Any, n: int, logit_table: np.ndarray, l_target: int, fmt: Format, device: str = "cpu",
              block: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every query p: the rounded weight on its target, on the query itself, and the exact sum
    of the rounded weights on the other n-1 positions (raw values of ``fmt``), each as numpy [n].

    ``logit_table[I + k]`` is the logit for integer inner product I. Rows are computed in blocks:
    Gram block (exact: +-1 entries, fp32 accumulation, k < 2^24) -> logits by table lookup ->
    rounded exponentials by table lookup (``fmt.exp`` of every level, relative to the row max) ->
    exact int64 sum Z -> per-row table of ``fmt.div(e_level, Z)`` -> gather and exact sum. Rows
    whose maximum is not the target (a repeated code vector) use their own row maximum.
    """
    import torch

    k = int(code.k)
    dev = torch.device(device)
    lt = np.asarray(logit_table, dtype=np.int64)
    if np.any(np.diff(lt) < 0):
        raise PreconditionFailed("logits must be non-decreasing in the inner product")
    block = block or max(1, min(n, (1 << 29) // n if device == "cuda" else (1 << 24) // n))
    nums = np.asarray(code.numerators(np.arange(n)), dtype=np.int8)
    small = fmt.max_raw < 2**31 and fmt.min_raw > -(2**31)
    tdt = torch.int32 if small else torch.int64
    if dev.type == "cuda":  # int8 tensor cores, int32 accumulation: exact; pad k and rows to multiples of 8
        kp = -(-k // 8) * 8
        all_num = torch.zeros((n, kp), dtype=torch.int8, device=dev)
        all_num[:, :k] = torch.as_tensor(nums, device=dev)
        all_t = all_num.T  # [kp, n], column-major: the layout _int_mm wants for its second operand

        def gram(rows: np.ndarray):
            a = all_num[torch.as_tensor(rows, device=dev)]
            pad = (-len(rows)) % 8 + (16 if len(rows) <= 16 else 0)
            if pad:
                a = torch.cat([a, torch.zeros((pad, kp), dtype=torch.int8, device=dev)])
            return torch._int_mm(a, all_t)[: len(rows)]
    else:
        all_num = torch.as_tensor(nums, device=dev).to(torch.float32)

        def gram(rows: np.ndarray):  # fp32 accumulation of +-1 products is exact for k < 2^24
            return (all_num[torch.as_tensor(rows, device=dev)] @ all_num.T).round_().to(torch.int32)
    a_t_out, a_q_out, sum_out = (np.zeros(n, dtype=np.int64) for _ in range(3))
    cache: dict[int, tuple] = {}

    def tables(lmax: int):
        if lmax not in cache:
            e_lv = np.asarray(fmt.exp(fmt.sub(lt, np.int64(lmax))))
            e_t = int(np.asarray(fmt.exp(fmt.sub(np.array([l_target]), np.int64(lmax))))[0])
            e_q = int(np.asarray(fmt.exp(fmt.sub(np.array([0]), np.int64(lmax))))[0])
            cache[lmax] = (torch.as_tensor(e_lv, device=dev).to(tdt), e_lv, e_t, e_q)
        return cache[lmax]

    for s in range(0, n, block):
        rows = np.arange(s, min(n, s + block))
        G = gram(rows)  # [b, n] int32, exact
        r_idx = torch.as_tensor(rows, device=dev)
        G[torch.arange(len(rows), device=dev), r_idx] = -k - 1  # self: excluded below
        rowmax = G.max(dim=1).values.cpu().numpy()
        lmax_rows = np.maximum(lt[np.clip(rowmax, -k, k) + k], max(l_target, 0))
        for lmax in np.unique(lmax_rows):
            sel = np.flatnonzero(lmax_rows == lmax)
            e_dev, e_lv, e_t, e_q = tables(int(lmax))
            Gs = G if len(sel) == len(rows) else G[torch.as_tensor(sel, device=dev)]
            valid = Gs >= -k
            idx = (Gs + k).clamp_(min=0).to(torch.int64)
            e = torch.where(valid, e_dev[idx], torch.zeros((), dtype=tdt, device=dev))
            Z = e.sum(dim=1, dtype=torch.int64).cpu().numpy().astype(object) + e_t + e_q
            Z = _clamp_obj(fmt, Z)
            a_tab = np.asarray(fmt.div(np.broadcast_to(e_lv, (len(sel), len(e_lv))).copy(), Z[:, None]))
            a_tab_dev = torch.as_tensor(a_tab, device=dev).to(tdt)
            a = torch.gather(a_tab_dev, 1, idx)
            sums = torch.where(valid, a, torch.zeros((), dtype=tdt, device=dev)).sum(dim=1, dtype=torch.int64).cpu().numpy()
            a_t_out[rows[sel]] = np.asarray(fmt.div(np.full(len(sel), e_t), Z))
            a_q_out[rows[sel]] = np.asarray(fmt.div(np.full(len(sel), e_q), Z))
            sum_out[rows[sel]] = sums
    return a_t_out, a_q_out, sum_out
