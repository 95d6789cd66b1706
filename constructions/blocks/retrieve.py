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

from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, copied_through, paired_slots, ViewHead
from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.codes.products import CodeWorkError, histograms, pair_inner, resolve, same_generator
from exactformer.constructions.codes.weights import CodeAlgebraError, RowCounts, algebra_of
from exactformer.constructions.core import runs
from exactformer.constructions.design.precision_search import arithmetics_for, smallest_grid_eta
from exactformer.constructions.core.views import Box, Group, State, unique_rows
from exactformer.constructions.core.views_ops import head_output, import_target, value_tables
from exactformer.precision import FixedPoint


@block
@dataclass(frozen=True)
class RetrieveByPosition(ViewHead):
    """The value at the position whose key code matches the query code (module docstring).

    ``query`` / ``key``: the code slots (filled by position-code blocks of the same code: the key's
    by the positional embedding); ``value`` -> ``out``: the slots copied (a slot name or a tuple of
    them, pairwise); ``eta``: the scale (None: the smallest grid value that meets the sufficient
    condition, chosen with the format at build, :meth:`design`); ``gram``: the codes' inner-product
    scale (None: the key code's); ``offset``: a per-row constant key bias."""

    query: str
    key: str
    value: tuple[str, ...]
    out: tuple[str, ...]
    eta: Fraction | None = None
    gram: Fraction | None = None  # <T(i), T(j)> = gram * <num(i), num(j)>: 1/k for sign codes, 1 for one-hot
    offset: Fraction = Fraction(0)

    reads_codes = True  # its queries and keys are derived from code columns, not from views
    #: what the value read may be off by (the tolerance of BitThreshold, which reads it in the constructions)
    TOLERANCE = Fraction(1, 4)

    def __post_init__(self) -> None:
        paired_slots(self)

    def emit(self, mb: Any, layer: int) -> int | None:
        k = mb.layout[self.query].size
        if mb.layout[self.key].size != k:
            raise ValueError(f"query slot {self.query!r} has width {k}, key slot {self.key!r} {mb.layout[self.key].size}")
        extra = 1 if self.offset else 0
        dh = max(k + extra, sum(mb.layout.width(s) for s in self.value), 1)
        V, O = copied_through(mb, self.value, self.out, dh)
        if self.eta is None or self.gram is None:
            return mb.defer(self, layer)  # placed by the build once the format (and eta) is chosen
        q = self.eta * self.gram
        Q = [(self.query, (np.eye(k, dh, dtype=np.int64) * q.numerator, q.denominator))]
        K = [(self.key, np.eye(k, dh, dtype=np.int64))]
        b_Q = b_K = None
        if extra:
            b_Q = np.array([Fraction(0)] * dh, dtype=object)
            b_K = np.array([Fraction(0)] * dh, dtype=object)
            b_Q[k], b_K[k] = self.eta, self.offset
        return mb.head(self, layer, dh, Q=Q, K=K, V=V, O=O, b_Q=b_Q, b_K=b_K)

    def design(self, fmt: Any, mb: Any) -> "RetrieveByPosition | None":
        """The retrieval for format ``fmt``: the sufficient condition (:meth:`selects`: the target keeps
        at least 1 - :data:`TOLERANCE` of the weight, the other keys at most :data:`TOLERANCE`, in
        every row of ``mb.n_ctx`` keys that the key code's bound mu allows) in the format and in real,
        float64 and float32 arithmetic, so the model is right wherever it runs; eta the smallest grid
        value that meets it (a given eta is checked), gram the key code's. None where none does."""
        code = mb.code_of(self.key)
        gram = Fraction(code.gram_scale) if self.gram is None else self.gram
        mu = Fraction(code.bound if code.bound is not None else (code.certificate or code.certify()).max_inner)
        ariths = arithmetics_for(fmt, True)

        def holds(e: Fraction) -> bool:
            return self.selects(ariths, e, mu, mb.n_ctx, gram, self.offset, tol=self.TOLERANCE)

        if self.eta is not None:
            return replace(self, gram=gram) if holds(self.eta) else None
        grid = fmt if fmt.is_exact else FixedPoint.binary(16, 16)
        eta = smallest_grid_eta(grid, grid.step / gram if fmt.is_exact else Fraction(1, 4), holds)
        return None if eta is None else replace(self, eta=eta, gram=gram)

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

    def _code_logits(self, ctx: Any, layer: int, head: int) -> tuple[str, dict, np.ndarray, np.ndarray, tuple]:
        """What both certificates read first: the head's name, weights, query and key code columns
        (which no earlier layer may write) and the logit form over them (:func:`logit_form`)."""
        where = f"blocks.{layer}.attn head {head}"
        hw = ctx.head_weights(layer, head)
        qcols, kcols = ctx.slot(self.query), ctx.slot(self.key)
        if ctx.written and np.any(ctx.written[layer][np.concatenate([qcols, kcols])]):
            raise Unproven(f"{where}: an earlier layer writes into the query or key code columns")
        return where, hw, qcols, kcols, logit_form(ctx, hw, qcols, kcols, where)

    # ---- the local certificate ----------------------------------------------------------------------
    def certify_head(self, ctx: CertContext, layer: int, head: int, state: State, need: np.ndarray) -> list[tuple[Group, Box]]:
        """The head's output z at every position of ``need``, as (group, table [*, dv]) pairs."""
        where, hw, qcols, kcols, (alpha, beta, const, n_dims) = self._code_logits(ctx, layer, head)
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


    # ---- the run certificate ---------------------------------------------------------------------
    def certify_runs(self, ctx: Any, layer: int, head: int, state: runs.RunState, need: list[tuple[int, int]]) -> list[runs.Segment]:
        """The head's output over the runs ``need`` (:mod:`exactformer.verify.certify.runs`): the facts
        of :meth:`certify_head` -- the logit form, code slots filled by code blocks whose entries
        round symmetrically, the target the unique key holding the query's vector and strictly
        above every other logit -- with every query's histogram from the code's weight distribution
        (:func:`~exactformer.constructions.codes.weights.classify`): the keys are runs of vector
        indices of one Reed--Solomon∘Hadamard code, and each piece of queries with one histogram
        gets one row."""
        where, hw, qcols, kcols, (alpha, beta, const, n_dims) = self._code_logits(ctx, layer, head)
        ksrc, qsrc = CodeSource(ctx, kcols, "key", []), CodeSource(ctx, qcols, "query", [])
        if any(name == "tok" for name, _ in ksrc.blocks):
            raise Unproven("the key code depends on the token (a token embedding block fills the key slot)")
        keys = key_runs(ksrc.code_runs("pos", ctx.T))
        algebra = code_algebra([r.gen for r in keys + qsrc.code_runs("pos", ctx.T) + qsrc.code_runs("tok", ctx.model.d_vocab)])
        P = unit_product(ctx, alpha, beta, qsrc.scale_of(("pos", "tok")), ksrc.scale_of(("pos",)), where)
        pieces = query_pieces(ctx, state, need, qsrc, algebra, [(r.start, r.start + r.count) for r in keys])
        rows = run_rows(ctx, P, const, n_dims, algebra, pieces, ctx.T - sum(r.count for r in keys), where)
        V = value_tables(ctx, state, hw, where)
        vtab = {id(g.table): t for g, t in zip(state.segments, V["tables"])}
        out: list[runs.Segment] = []
        for pc, r in zip(pieces, rows.index):
            target = keys[pc.row.target]
            shift = pc.delta + target.first - target.start  # target position = (slope 1 or 0) * x + shift
            if pc.kind == "tok":
                continue
            z = lambda tg: head_output(ctx.arith, rows.w_t[r], vtab[id(tg.table)], rows.w_l[r], rows.counts[r], V["hull"])  # noqa: E731
            if pc.kind == "pos":
                out += [runs.Segment(tg.start - shift, tg.stop - shift, [runs.shifted(v, 1, shift) for v in tg.vars], z(tg))
                        for tg in state.pieces(pc.lo + shift, pc.hi + shift)]
            else:
                (tg,) = state.pieces(shift, shift + 1)
                out.append(runs.Segment(pc.seg.start, pc.seg.stop, [runs.shifted(v, 0, shift) for v in tg.vars], z(tg)))
        out += pointer_segments(ctx, state, [(pc, r, keys[pc.row.target]) for pc, r in zip(pieces, rows.index) if pc.kind == "tok"],
                                rows, V, vtab)
        ctx.details.setdefault("heads", []).append({
            "layer": layer, "head": head, "block": type(self).__name__, "row_classes": int(rows.w_t.lo.size),
            "min_target_weight": str(ctx.arith.to_fraction(np.min(rows.w_t.lo))),
            "max_stray_weight": str(max(sum(ctx.arith.to_fraction(np.asarray(rows.w_l.hi[i]))[j] * int(rows.counts[i, j])
                                            for j in range(rows.counts.shape[1])) for i in range(rows.counts.shape[0]))),
            "method": "Reed-Solomon weight distribution"})
        return sorted(out, key=lambda g: g.start)


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

    def code_runs(self, which: str, limit: int) -> list[CodeRun]:
        """The slot's code blocks of embedding ``which`` ("pos" or "tok") as runs of rows below
        ``limit``: views followed to their generator (an identity view keeps the run, a constant view
        makes its slope 0; a table-indexed view follows no run: runs.Declined)."""
        out = []
        for name, b in self.blocks:
            count = min(b.count, limit - b.first_row)
            if name != which or count <= 0:
                continue
            code, start, slope = b.code, int(b.code_start), 1
            while hasattr(code, "base") and hasattr(code, "base_indices"):
                kind = getattr(code, "kind", None)
                if kind == "constant":
                    start, slope = int(code.data), 0
                elif kind != "identity":
                    raise runs.Declined(f"the {self.what} code is read through an index table")
                code = code.base
            if start < 0 or start + slope * (count - 1) >= int(code.n):
                raise Unproven(f"a {self.what} code block reads vectors beyond the code's {code.n}")
            out.append(CodeRun(int(b.first_row), int(count), start, slope, code))
        return out

    def scale_of(self, which: tuple[str, ...]) -> int:
        """The raw scale of the slot's code entries in the embeddings ``which`` (one, rounding symmetrically)."""
        return self._scale({Fraction(b.scale) for name, b in self.blocks if name in which})

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


# ------------------------------------------------------------------------------------------------
# the run certificate's steps
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeRun:
    """Rows [first, first + count) of an embedding hold vector ``start + (row - first)`` (slope 1)
    or vector ``start`` (slope 0) of the generating code ``gen``."""

    first: int
    count: int
    start: int
    slope: int
    gen: Any


def key_runs(runs: list[CodeRun]) -> list[CodeRun]:
    """The key code's runs, each row filled once and each vector at one position."""
    runs = sorted(runs, key=lambda r: r.first)
    for a, b in zip(runs, runs[1:]):
        if b.first < a.first + a.count:
            raise Unproven("two code blocks fill the key slot of one row")
    if any(r.slope == 0 and r.count > 1 for r in runs):
        raise runs.Declined("one key vector at several positions")
    return runs


def code_algebra(gens: list[Any]) -> Any:
    """The closed-form histograms of the one code generating every vector of the head
    (:func:`~exactformer.constructions.codes.weights.algebra_of`, its algebra checked on the code's
    tables); several codes, or a code without a closed form (or whose tables lack the algebra):
    Declined."""
    if not gens:
        raise Unproven("no code block fills the key slot")
    code = gens[0]
    if any(not same_generator(g, code) for g in gens):
        raise runs.Declined("the head's vectors do not all come from one code")
    try:
        algebra = algebra_of(code)
    except CodeAlgebraError as e:  # the view certificate decides it from the generator's Gram rows
        raise runs.Declined(f"the code has no closed-form histograms: {e}") from e
    if algebra is None:
        raise runs.Declined(f"a {type(code).__name__} has no closed-form histograms")
    return algebra


@dataclass
class QueryPiece:
    """Queries with one histogram: positions [lo, hi) of ``seg`` whose vector is p + delta ("pos")
    or delta ("fixed"), or the tokens [lo, hi) of ``seg``'s own token whose vector is u + delta ("tok")."""

    seg: runs.Segment
    kind: str
    lo: int
    hi: int
    delta: int
    row: RowCounts


def query_pieces(ctx: Any, state: runs.RunState, need: list[tuple[int, int]], qsrc: CodeSource, algebra: Any,
                 ranges: list[tuple[int, int]]) -> list[QueryPiece]:
    """Every needed query split into pieces of one histogram against the keys' vector ``ranges``."""
    pos_runs, tok_runs = qsrc.code_runs("pos", ctx.T), qsrc.code_runs("tok", ctx.model.d_vocab)
    out: list[QueryPiece] = []

    def pieces(c0: int, c1: int, at: int) -> list[tuple[int, int, RowCounts]]:
        try:
            found = algebra.classify(ranges, c0, c1)
        except CodeAlgebraError as e:
            raise Unproven(f"{e}", {"positions": [at]}) from e
        for a, _, row in found:
            if row is None:
                raise Unproven(f"the query at position {at} holds a vector (index {a}) that no key holds",
                               {"positions": [at]})
        return found

    for a, b in need:
        for g in state.pieces(a, b):
            cuts = sorted({g.start, g.stop} | {x for r in pos_runs for x in (r.first, r.first + r.count)
                                                if g.start < x < g.stop})
            for s, e in zip(cuts, cuts[1:]):
                run = next((r for r in pos_runs if r.first <= s < r.first + r.count), None)
                seg = g.piece(s, e)
                own = next((v for v in seg.vars if isinstance(v, runs.TokVar) and (v.slope, v.offset) == (1, 0)), None)
                if run is not None:
                    if own is not None and any(_overlap(own.classes, r) for r in tok_runs):
                        raise Unproven("both embeddings fill the query code slot at some (position, token)",
                                       {"positions": [s]})
                    delta = run.start - run.first
                    if run.slope == 0:
                        out += [QueryPiece(seg, "fixed", s, e, run.start, row) for _, _, row in pieces(run.start, run.start + 1, s)]
                    else:
                        out += [QueryPiece(seg, "pos", c0 - delta, c1 - delta, delta, row)
                                for c0, c1, row in pieces(s + delta, e + delta, s)]
                    continue
                if own is None:
                    raise Unproven(f"the query at position {s} depends on a token its view has no variable for")
                dom = own.classes.merged()
                tcuts = dom.split(np.array([x for r in tok_runs for x in (r.first, r.first + r.count)]))
                for u0, u1 in zip(tcuts.starts.tolist(), tcuts.stops.tolist()):
                    run = next((r for r in tok_runs if r.first <= u0 < r.first + r.count), None)
                    if run is None:
                        raise Unproven(f"the query at position {s} holds no code vector (token {u0})", {"positions": [s]})
                    if run.slope == 0 and u1 - u0 > 1:
                        raise runs.Declined("one query vector for several tokens")
                    delta = run.start - run.first
                    out += [QueryPiece(seg, "tok", c0 - delta, c1 - delta, delta, row) for c0, c1, row in pieces(u0 + delta, u1 + delta, s)]
    return out


def _overlap(classes: Any, run: CodeRun) -> bool:
    m = classes.merged()
    return bool(np.any((m.starts < run.first + run.count) & (m.stops > run.first)))


@dataclass
class RunRows:
    """Rows of one run certificate head: ``index[i]`` the row of query piece i; per row the target
    weight, the weight of one key at each agreement level below the target's, and the keys there
    (certain plus optional)."""

    index: list[int]
    w_t: Box
    w_l: Box
    counts: np.ndarray


def run_rows(ctx: Any, P: Box, const: Box, n_dims: int, algebra: Any, pieces: list[QueryPiece], n_zero: int,
             where: str) -> RunRows:
    """The rounded row of every distinct histogram: the levels' integer inner products
    ``algebra.levels`` (keys without a code vector at inner product 0), the target at
    ``algebra.top``, strictly above every level that holds a key."""
    arith, top = ctx.arith, int(algebra.top)
    uniq: dict[RowCounts, int] = {}
    index = [uniq.setdefault(pc.row, len(uniq)) for pc in pieces]
    first: dict[int, int] = {}
    for pc, i in zip(pieces, index):
        first.setdefault(i, pc.seg.start)
    R, L = len(uniq), int(algebra.levels.size)
    exact = np.array([r.exact for r in uniq], dtype=np.int64).reshape(R, L)
    optional = np.array([r.optional for r in uniq], dtype=np.int64).reshape(R, L)
    exact[:, int(np.flatnonzero(algebra.levels == 0)[0])] += n_zero
    logit = arith.code_logits(P, algebra.levels, const, int(algebra.code.k), n_dims)
    lo, hi = np.asarray(logit.lo), np.asarray(logit.hi)
    others = np.flatnonzero(np.arange(L) != top)
    if np.any(optional) and (np.any(np.diff(lo[others]) < 0) or np.any(np.diff(hi[others]) < 0)):
        raise Unproven(f"{where}: the logits do not grow with the code inner product (optional keys sit at the top levels)")
    keys_at = (exact[:, others] + optional[:, others]) > 0
    highest = np.where(keys_at, hi[None, others], arith.min_raw - 1).max(axis=1)
    bad = [i for i in range(R) if not lo[top] > highest[i]]
    if bad:
        raise Unproven(f"{where}: the query at position {first[bad[0]]} has no key whose logit is a strict maximum",
                       {"positions": [int(first[bad[0]])]})
    t = Box(np.broadcast_to(lo[top:top + 1], (R,)).copy(), np.broadcast_to(hi[top:top + 1], (R,)).copy())
    levels = Box(np.broadcast_to(lo[None, others], (R, others.size)).copy(), np.broadcast_to(hi[None, others], (R, others.size)).copy())
    w_t, w_l = arith.row_weights(t, levels, exact[:, others], optional[:, others])
    return RunRows(index, w_t, w_l, exact[:, others] + optional[:, others])


def pointer_segments(ctx: Any, state: runs.RunState, items: list[tuple[QueryPiece, int, CodeRun]], rows: RunRows, V: dict,
                     vtab: dict) -> list[runs.Segment]:
    """Outputs of queries whose vector depends on their own token: the token at the target position
    u + offset, a pointer variable, over looked-up positions whose views are their own token's and
    alike; the own token's classes refined by row."""
    by_seg: dict[tuple[int, int], list] = {}
    for pc, r, target in items:
        by_seg.setdefault((pc.seg.start, pc.seg.stop), []).append((pc, r, pc.delta + target.first - target.start))
    out = []
    for (s, e), group in by_seg.items():
        g = group[0][0].seg
        own = next(v for v in g.vars if isinstance(v, runs.TokVar) and (v.slope, v.offset) == (1, 0))
        looked = [tg for pc, _, off in group for tg in state.pieces(pc.lo + off, pc.hi + off)]
        t0 = looked[0]
        for tg in looked:
            if len(tg.vars) != 1 or not isinstance(tg.vars[0], runs.TokVar) or (tg.vars[0].slope, tg.vars[0].offset) != (1, 0):
                raise Unproven(f"position {s}: a looked-up position's view depends on more than its own token")
            tv = tg.vars[0].classes
            if not (np.array_equal(tv.starts, t0.vars[0].classes.starts) and np.array_equal(tv.cls, t0.vars[0].classes.cls)
                    and np.array_equal(tv.stops, t0.vars[0].classes.stops)
                    and np.array_equal(vtab[id(tg.table)].lo, vtab[id(t0.table)].lo)
                    and np.array_equal(vtab[id(tg.table)].hi, vtab[id(t0.table)].hi)):
                raise Unproven(f"position {s}: the looked-up positions do not all hold the same kind of value")
        maps: list[list[int]] = []
        for pc, _, off in sorted(group, key=lambda x: x[0].lo):
            if maps and maps[-1][1] == pc.lo and maps[-1][2] == off:
                maps[-1][1] = pc.hi
            else:
                maps.append([pc.lo, pc.hi, off])
        bounds = np.array([x for pc, _, _ in group for x in (pc.lo, pc.hi)])
        split = own.classes.split(bounds)
        row_of = np.array([next(r for pc, r, _ in group if pc.lo <= u < pc.hi) for u in split.starts.tolist()], dtype=np.int64)
        base = split.with_classes(split.cls * int(rows.counts.shape[0]) + row_of)
        r_of_cls = np.zeros(base.ncls, dtype=np.int64)
        r_of_cls[base.cls] = row_of
        val = vtab[id(t0.table)]
        zs = [head_output(ctx.arith, rows.w_t[int(r)], val, rows.w_l[int(r)], rows.counts[int(r)], V["hull"]) for r in r_of_cls]
        z = Box(np.stack([np.asarray(x.lo) for x in zs]), np.stack([np.asarray(x.hi) for x in zs]))
        ptr = runs.PtrVar(own.key, tuple((int(a), int(b), int(o)) for a, b, o in maps), t0.vars[0].classes)
        out.append(runs.Segment(s, e, [runs.TokVar(1, 0, base), ptr], z))
    return out
