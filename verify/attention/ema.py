"""Exact-Match Attention (EMA): P2's r = 0, c -> infinity case of ANNA (Def. 3.3; Sec. 3.2 and 4.1).

P2 defines EMA only in its unavailable App. B; the definition used here (docs/ema.md, "EMA") is::

    M_i       = { j : key_mask_j and k_j = q_i }      (no query, query_mask_i = False: M_i = {})
    c_i       = |M_i|
    EMA(X)_i  = (1/c_i) * sum_{j in M_i} v_j          if c_i >= 1
              = 0, with matched_i = False             if c_i = 0   (Def. 3.3 has no empty case)

Keys and queries are vectors of ``kw`` int64 words compared exactly (no hashing); values are int64.

*Ideal semantics* (``fmt=None``): ``total_i = sum_{j in M_i} v_j`` as an exact integer and
``count_i = c_i``; the mean is the exact rational ``total_i / count_i`` (:meth:`EMAResult.mean`).

*Fixed-point semantics* (``fmt`` a :class:`~exactformer.precision.FixedPoint` of scale S = 1/step;
values are raw values of ``fmt``): every match of query i gets the raw weight

    w_i = sat(round(S / c_i))      (round = the format's rounding: floor, or nearest-even)

and ``total_i = sat( sum_{j in M_i} fmt.mul(w_i, v_j) )`` -- each product rounded as ``fmt.mul``,
the exact sum saturated once. This is what the App. D softmax of the lowered head (B.6,
:func:`lowered_head_logits`) followed by ``fmt.matmul`` computes, bit for bit, under the conditions
of :func:`lowering_conditions`. Preconditions for the fixed-point result to *be* EMA (reported in
:class:`EMAPreconditions`, never silently ignored): S >= max c_i (else w_i = 0 and a match reads
as "no match"), w_i not saturated (S <= max_raw), integer payloads (v_j multiples of S: then
every product is exact).

Execution is sort based (O(N log N), no N x N tensor): the rows of all keys and queries are mapped
to exact int64 ids (words packed into disjoint bit fields while they fit, dense ranks otherwise),
one sort groups equal ids, each key group's values are summed once per group size class, and
every query gathers its group's sum. numpy and torch (any device) run the same algorithm; the
result is exact, hence identical across backends.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.match import MatchHead, ema_weight
from exactformer.precision import FixedPoint, Format
from exactformer.precision._xp import NP, is_torch, torch_xp

INT64_MAX = (1 << 63) - 1
ID_BITS = 62  # packed ids stay below 2^62
MAX_ROWS = 1 << 31  # ranks of at most 2^31 rows fit 31 bits, two of them one id
THREADS = max(1, min(8, os.cpu_count() or 1))  # numpy row gathers run in this many threads
PARALLEL_ROWS = 1 << 15  # ... when they move at least this many rows
_POOL: list[ThreadPoolExecutor] = []


class EMAError(ValueError):
    """Bad arguments to an EMA function (the message names the parameter and the allowed range)."""


class EMAOverflowError(EMAError):
    """An exact integer sum of the ideal semantics could exceed int64."""


# ================================================================================================
# backend helpers (numpy / torch); the shared ones come from precision._xp
# ================================================================================================


def cat(xp, arrs):
    return xp.t.cat(arrs) if xp.torch else np.concatenate(arrs)


def _argsort(xp, x):
    return xp.t.argsort(x) if xp.torch else np.argsort(x)


def _cumsum(xp, x):
    return xp.t.cumsum(x, 0) if xp.torch else np.cumsum(x)


def _bincount(xp, x, n: int):
    return xp.t.bincount(x, minlength=n) if xp.torch else np.bincount(x, minlength=n).astype(np.int64)


def arange(xp, n: int):
    return xp.t.arange(n, device=xp.device) if xp.torch else np.arange(n, dtype=np.int64)


def _nonzero(xp, m):
    return xp.flatnonzero(m)


def _rank(xp, x):
    """Dense ranks of x (equal values, equal ranks) and their bit width."""
    if xp.torch:
        u, inv = xp.t.unique(x, sorted=True, return_inverse=True)
        n = int(u.shape[0])
    else:
        u, inv = np.unique(x, return_inverse=True)
        n = int(u.shape[0])
        inv = inv.reshape(-1).astype(np.int64)
    return inv, max(n - 1, 0).bit_length()


def _take_rows(xp, x, idx):
    return xp.t.index_select(x, 0, idx) if xp.torch else np.take(x, idx, axis=0, mode="clip")


def _in_threads(fn, n: int) -> None:
    """fn(a, b) over THREADS disjoint slices of range(n), in a thread pool (numpy releases the GIL)."""
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(THREADS))
    cuts = [n * t // THREADS for t in range(THREADS + 1)]
    for f in [_POOL[0].submit(fn, a, b) for a, b in zip(cuts[:-1], cuts[1:])]:
        f.result()


def _gather_rows(xp, x, idx):
    """x[idx] (rows); numpy gathers of many rows are split over THREADS threads."""
    n = int(idx.shape[0])
    if xp.torch or THREADS == 1 or n < PARALLEL_ROWS:
        return _take_rows(xp, x, idx)
    out = np.empty((n,) + x.shape[1:], dtype=x.dtype)
    _in_threads(lambda a, b: np.take(x, idx[a:b], axis=0, out=out[a:b], mode="clip"), n)
    return out


def _scatter_rows(xp, dst, rows, x, idx) -> None:
    """dst[rows] = x[idx] (rows; ``rows`` distinct), split over threads like :func:`_gather_rows`."""
    n = int(rows.shape[0])
    if xp.torch or THREADS == 1 or n < PARALLEL_ROWS:
        dst[rows] = _take_rows(xp, x, idx)
        return

    def part(a, b):
        dst[rows[a:b]] = np.take(x, idx[a:b], axis=0, mode="clip")
    _in_threads(part, n)


def exact_ids(xp, words, batch=None, batch_size: int = 1):
    """int64 ids [n], equal iff the rows of ``words`` [n, kw] (and ``batch`` [n]) are equal, and their
    bit width: 0 <= ids < 2^bits, or bits = 64 when one raw int64 word is the id.

    Columns are packed into disjoint bit fields (word - min) while the total stays <= 62 bits;
    a column that does not fit is first replaced by its dense rank, and so is the accumulated id
    (ranks of n <= 2^31 rows take <= 31 bits). Every step is injective, so ids never collide."""
    n, kw = int(words.shape[0]), int(words.shape[1])
    if n > MAX_ROWS:
        raise EMAError(f"queries/keys: at most {MAX_ROWS} rows in all are supported, got {n}")
    acc, bits = None, 0
    if batch is not None and batch_size > 1:
        acc, bits = batch, (batch_size - 1).bit_length()
    for t in range(kw):
        col = words[:, t]
        lo, hi = xp.minmax(col)
        b = (hi - lo).bit_length()
        if acc is None:
            if b <= ID_BITS:
                acc, bits = col - lo, b
            else:
                acc, bits = col, 64  # raw words are injective; ranked when a column follows
            continue
        if bits + b > ID_BITS:
            acc, bits = _rank(xp, acc)
        if bits + b > ID_BITS:
            col, b = _rank(xp, col)
        else:
            col = col - lo
        acc = (acc << b) | col
        bits += b
    if acc is None:
        acc = xp.zeros((n,))
    return acc, bits


def sort_groups(xp, ids, bits: int):
    """Sort ``ids`` [n]: returns (perm, group [n] of each sorted position, G).

    perm sorts ids (ties in any order); group numbers the distinct ids 0..G-1 in increasing order.
    When id and position fit one int64 together, one plain sort of (id << p | position) replaces
    an argsort and a gather."""
    n = int(ids.shape[0])
    p = max(n - 1, 0).bit_length()
    if bits + p <= 63:
        packed = (ids << p) | arange(xp, n)
        packed = xp.t.sort(packed).values if xp.torch else np.sort(packed)
        perm, s = packed & ((1 << p) - 1), packed >> p
    else:
        perm = _argsort(xp, ids)
        s = ids[perm]
    newg = xp.empty((n,))
    newg[:1] = 0
    newg[1:] = s[1:] != s[:-1]
    g = _cumsum(xp, newg)
    return perm, g, int(g[-1]) + 1 if n else 0


# ================================================================================================
# argument handling
# ================================================================================================


def backend(arrs: dict[str, Any], err: type[EMAError] = EMAError):
    dev, kinds = None, set()
    for name, a in arrs.items():
        if a is None:
            continue
        if is_torch(a):
            kinds.add("torch")
            if dev is not None and a.device != dev:
                raise err(f"{name}: all tensors must be on one device, got {dev} and {a.device}")
            dev = a.device
        else:
            kinds.add("numpy")
    if len(kinds) > 1:
        raise err("queries, keys, values and masks must all be numpy arrays or all torch tensors")
    return NP if dev is None else torch_xp(dev)


def int_array(xp, a, name: str, err: type[EMAError] = EMAError):
    """a as an int64 array of the backend; floats, bools and words outside int64 are errors."""
    if xp.torch:
        t = xp.t
        if a.is_floating_point() or a.is_complex() or a.dtype == t.bool:
            raise err(f"{name}: must hold integers (int64 words), got dtype {a.dtype}")
        if a.dtype == t.uint64 and a.numel() and int(a.max().item()) > INT64_MAX:
            raise err(f"{name}: words must lie in the int64 range [-2^63, 2^63 - 1]")
        return a.to(t.int64)
    arr = np.asarray(a)
    k = arr.dtype.kind
    if k == "O":
        flat = arr.reshape(-1).tolist()
        for v in flat:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise err(f"{name}: must hold integers (int64 words), got {type(v).__name__} {v!r}")
            if not -(1 << 63) <= int(v) <= INT64_MAX:
                raise err(f"{name}: words must lie in the int64 range [-2^63, 2^63 - 1], got {v}")
        return np.array(flat, dtype=np.int64).reshape(arr.shape)
    if k not in "iu":
        raise err(f"{name}: must hold integers (int64 words), got dtype {arr.dtype}")
    if k == "u" and arr.dtype.itemsize == 8 and arr.size and int(arr.max()) > INT64_MAX:
        raise err(f"{name}: words must lie in the int64 range [-2^63, 2^63 - 1], got {int(arr.max())}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _bool_array(xp, a, name: str, shape: tuple[int, ...]):
    if xp.torch:
        if a.dtype != xp.t.bool:
            raise EMAError(f"{name}: must be a bool tensor of shape {shape}, got dtype {a.dtype}")
    else:
        a = np.asarray(a)
        if a.dtype != np.bool_:
            raise EMAError(f"{name}: must be a bool array of shape {shape}, got dtype {a.dtype}")
    if tuple(a.shape) != shape:
        raise EMAError(f"{name}: must have shape {shape}, got {tuple(a.shape)}")
    return a.reshape(-1)


@dataclass
class _Args:
    xp: Any
    batched: bool
    B: int
    Nq: int
    Nk: int
    kw: int
    dv: int
    q: Any  # [B*Nq, kw]
    k: Any  # [B*Nk, kw]
    v: Any  # [B*Nk, dv]
    qm: Any  # [B*Nq] bool or None
    km: Any  # [B*Nk] bool or None


def _normalize(queries, keys, values, query_mask, key_mask) -> _Args:
    xp = backend({"queries": queries, "keys": keys, "values": values, "query_mask": query_mask,
                   "key_mask": key_mask})
    q = int_array(xp, queries, "queries")
    k = int_array(xp, keys, "keys")
    v = int_array(xp, values, "values")
    if q.ndim not in (2, 3):
        raise EMAError(f"queries: must have shape [B, Nq, kw] or [Nq, kw], got {tuple(q.shape)}")
    batched = q.ndim == 3
    want = 3 if batched else 2
    form = "[B, Nk, kw]" if batched else "[Nk, kw]"
    if k.ndim != want:
        raise EMAError(f"keys: must have shape {form} like queries, got {tuple(k.shape)}")
    if v.ndim != want:
        raise EMAError(f"values: must have shape {'[B, Nk, dv]' if batched else '[Nk, dv]'}, got {tuple(v.shape)}")
    if not batched:
        q, k, v = q[None], k[None], v[None]
    B, Nq, kw = (int(s) for s in q.shape)
    if int(k.shape[0]) != B or int(v.shape[0]) != B:
        raise EMAError(f"keys/values: batch size must equal the queries' B = {B}, got {k.shape[0]} and {v.shape[0]}")
    Nk = int(k.shape[1])
    if int(k.shape[2]) != kw:
        raise EMAError(f"keys: must have kw = {kw} words like queries, got {k.shape[2]}")
    if kw < 1:
        raise EMAError("queries/keys: kw (words per key) must be >= 1, got 0")
    if int(v.shape[1]) != Nk:
        raise EMAError(f"values: must have Nk = {Nk} rows like keys, got {v.shape[1]}")
    dv = int(v.shape[2])
    lead = (B,) if batched else ()
    qm = None if query_mask is None else _bool_array(xp, query_mask, "query_mask", lead + (Nq,))
    km = None if key_mask is None else _bool_array(xp, key_mask, "key_mask", lead + (Nk,))
    return _Args(xp, batched, B, Nq, Nk, kw, dv, q.reshape(B * Nq, kw), k.reshape(B * Nk, kw),
                 v.reshape(B * Nk, dv), qm, km)


def check_fmt(fmt) -> FixedPoint | None:
    if fmt is None:
        return None
    if not isinstance(fmt, FixedPoint):
        raise EMAError(f"fmt: must be None (ideal semantics) or a FixedPoint format, got {fmt!r}")
    if not fmt.int64_mode:
        raise EMAError(f"fmt: {fmt.name} has raw values beyond 2^60; EMA needs an int64-mode FixedPoint format")
    return fmt


def _weights(xp, fmt: FixedPoint, c):
    """Raw weights sat(round(S/c)) for counts c (0 where c = 0), and the unsaturated values."""
    S = fmt.scale
    cc = xp.maximum(c, 1)
    w = S // cc
    if fmt.nearest:
        r = S - w * cc
        up = (2 * r > cc) | ((2 * r == cc) & (w % 2 == 1))
        w = w + up.to(xp.t.int64) if xp.torch else w + up.astype(np.int64)
    w = xp.where(c > 0, w, 0)
    return xp.minimum(w, fmt.max_raw), w


# ================================================================================================
# results
# ================================================================================================


@dataclass(frozen=True)
class EMAPreconditions:
    """What the fixed-point result needs to be EMA (all counts are over the queries of one call).

    ``max_count``: the largest match count c_i. ``lost_matches``: matched queries whose weight
    rounds to 0 (S < c_i under floor rounding) -- they read as "no match". ``weight_saturations``:
    matched queries whose exact weight round(S/c_i) exceeds max_raw (1 not representable).
    ``inexact_products``: products w_i * v_j / S that were rounded (v_j not an integer payload),
    counted once per (key, value component) of every key group some query matched.
    ``saturations``: output elements whose exact sum was clipped to the format's range.
    ``ok``: all of the above are 0. Ideal semantics: ``scale`` None and everything 0 / True."""

    max_count: int
    scale: int | None
    lost_matches: int
    weight_saturations: int
    inexact_products: int
    saturations: int

    @property
    def ok(self) -> bool:
        return not (self.lost_matches or self.weight_saturations or self.inexact_products or self.saturations)

    def as_dict(self) -> dict[str, Any]:
        return {"max_count": self.max_count, "scale": self.scale, "lost_matches": self.lost_matches,
                "weight_saturations": self.weight_saturations, "inexact_products": self.inexact_products,
                "saturations": self.saturations, "ok": self.ok}


@dataclass
class EMAResult:
    """Result of :func:`exact_match_attention` (arrays of the input's library and device).

    ``count`` [B, Nq] int64: c_i (0 when no key matches or there is no query).
    ``total`` [B, Nq, dv] int64: ideal -- the exact sum of the matched values; fixed point -- raw
    ``sat(sum_j fmt.mul(w_i, v_j))``. 0 where c_i = 0.
    ``weight`` [B, Nq] int64 raw ``sat(round(S/c_i))`` (0 where c_i = 0); None in ideal semantics.
    ``fmt``: the format (None: ideal). ``preconditions``: :class:`EMAPreconditions`.
    Unbatched inputs give [Nq] / [Nq, dv]."""

    count: Any
    total: Any
    weight: Any
    fmt: FixedPoint | None
    preconditions: EMAPreconditions

    @property
    def matched(self):
        """[B, Nq] bool: c_i > 0."""
        return self.count > 0

    def mean(self) -> np.ndarray:
        """Object array [B, Nq, dv] of exact Fractions: ideal -- total/count (0 with no match);
        fixed point -- the output values total/S (the fixed-point approximation of the mean)."""
        tot = to_numpy(self.total).astype(object)
        if self.fmt is not None:
            den = np.full(tot.shape, self.fmt.scale, dtype=object)
        else:
            den = np.broadcast_to(np.maximum(to_numpy(self.count), 1)[..., None], tot.shape).astype(object)
        return np.frompyfunc(Fraction, 2, 1)(tot, den).astype(object).reshape(tot.shape)


def to_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if is_torch(x) else np.asarray(x)


# ================================================================================================
# the fast path
# ================================================================================================


def _group_sums(xp, krow, kcount, qcount, V, fmt):
    """Sum the value rows of every key group that some query matched, per group-size class.

    ``krow`` [nk]: the value row of each active key, keys sorted by group (group g holds the
    kcount[g] keys from position sum(kcount[:g])); ``kcount``/``qcount`` [G]: keys/queries per
    group. Returns (direct [G]: the value row for groups whose output is one key's value
    unchanged, else -1; src [G]: the group's row of ``sums``, else -1; sums [n + 1, dv], whose last
    row is the zero row of "no match"; saturated elements per row of sums; inexact products)."""
    G = int(kcount.shape[0])
    dv = int(V.shape[1])
    direct = xp.full((G,), -1)
    src = xp.full((G,), -1)
    need = (kcount > 0) & (qcount > 0)
    groups = _nonzero(xp, need)
    if int(groups.shape[0]) == 0:
        return direct, src, xp.zeros((1, dv)), xp.zeros((1,)), 0
    kstart = _cumsum(xp, kcount) - kcount
    sizes = kcount[groups]
    hist = _bincount(xp, sizes, 0)
    classes = _nonzero(xp, hist)
    bounds = [0] + _cumsum(xp, hist[classes]).tolist()
    classes = classes.tolist()
    if len(classes) > 1:  # group the groups by size
        groups = groups[_argsort(xp, sizes)]
    one_is_exact = fmt is None or ema_weight(fmt, 1) == fmt.scale
    n_sums = bounds[-1] - (bounds[1] if classes[0] == 1 and one_is_exact else 0)
    sums = xp.empty((n_sums + 1, dv))
    sums[n_sums] = 0
    sat_rows = xp.zeros((n_sums + 1,))
    inexact, off, vmax = 0, 0, None
    for s, a, b in zip(classes, bounds[:-1], bounds[1:]):
        gs = groups[a:b]
        w = None if fmt is None else ema_weight(fmt, s)
        if s == 1 and one_is_exact:  # the weight is exactly 1: v_j itself
            direct[gs] = krow[kstart[gs]]
            continue
        pos = kstart[gs][:, None] + arange(xp, s)[None, :]
        X = _gather_rows(xp, V, krow[pos.reshape(-1)]).reshape(b - a, s, dv)
        rows = slice(off, off + b - a)
        if fmt is None:
            if vmax is None:
                lo, hi = xp.minmax(V)
                vmax = max(-lo, hi)
            if s * vmax > INT64_MAX:  # the bound over all values fails: this class's values decide
                lo, hi = xp.minmax(X)
                if s * max(-lo, hi) > INT64_MAX:
                    raise EMAOverflowError(
                        f"values: an exact sum of {s} matched values of magnitude up to {max(-lo, hi)} can "
                        "exceed int64 (2^63 - 1); use smaller values or fixed-point semantics")
            sums[rows] = X.sum(1)
        else:
            g = np.gcd(fmt.scale, w) if w else fmt.scale
            inexact += int(xp.count(X % (fmt.scale // g) != 0)) if w else 0
            t = fmt.mul(w, X).sum(1)  # |sum| <= s(|v| w/S + 1) <= 2|v| + s: no int64 overflow (|v| <= 2^60)
            sat_rows[rows] = ((t > fmt.max_raw) | (t < fmt.min_raw)).sum(1)
            sums[rows] = xp.clip(t, fmt.min_raw, fmt.max_raw)
        src[gs] = arange(xp, b - a) + off
        off += b - a
    return direct, src, sums, sat_rows, inexact


def match_sums(xp, kwords, qwords, batch, batch_size: int, krows, qrows, n_out: int, V, fmt=None):
    """The EMA core on flat rows (also used by ANNA's Alg. 1 for its bucket sums and counts).

    kwords [nk, kw] / qwords [nq, kw]: the words of the published keys and of the queries; batch
    [nk + nq] (keys first) or None: a batch index that must match too (< batch_size); krows [nk]:
    the value row of V [*, dv] of each key (None: 0..nk-1); qrows [nq]: the output row of each
    query (None: 0..nq-1), rows not listed get count 0 and total 0. Returns (count [n_out],
    total [n_out, dv], weight [n_out] or None, EMAPreconditions) with the semantics of
    :func:`exact_match_attention`."""
    nk, nq = int(kwords.shape[0]), int(qwords.shape[0])
    dv = int(V.shape[1])
    count = xp.zeros((n_out,))
    weight = None if fmt is None else xp.zeros((n_out,))
    pre = EMAPreconditions(0, None if fmt is None else fmt.scale, 0, 0, 0, 0)
    if not (nq and nk):
        return count, xp.zeros((n_out, dv)), weight, pre
    words = cat(xp, [kwords, qwords])
    perm, g, G = sort_groups(xp, *exact_ids(xp, words, batch, batch_size))
    iskey = perm < nk
    krow, qrow = perm[iskey], perm[~iskey] - nk
    if krows is not None:
        krow = krows[krow]
    if qrows is not None:
        qrow = qrows[qrow]
    qg = g[~iskey]
    kcount, qcount = _bincount(xp, g[iskey], G), _bincount(xp, qg, G)
    direct, src, sums, sat_rows, inexact = _group_sums(xp, krow, kcount, qcount, V, fmt)
    c = kcount[qg]
    count[qrow] = c
    # every query reads one row: of the values (a single key, weight exactly 1), of the group
    # sums, or the zero row of sums (no match). One gather in query order from the source most
    # queries use, then the other rows.
    zero_row = int(sums.shape[0]) - 1
    direct_q = xp.full((n_out,), -1)
    direct_q[qrow] = direct[qg]
    sums_q = xp.full((n_out,), zero_row)
    sums_q[qrow] = xp.where(src[qg] >= 0, src[qg], zero_row)
    is_direct = direct_q >= 0
    if 2 * int(xp.count(is_direct)) >= n_out:
        total = _gather_rows(xp, V, xp.maximum(direct_q, 0))
        rest = _nonzero(xp, ~is_direct)
        _scatter_rows(xp, total, rest, sums, sums_q[rest])
    else:
        total = _gather_rows(xp, sums, sums_q)
        rest = _nonzero(xp, is_direct)
        _scatter_rows(xp, total, rest, V, direct_q[rest])
    max_count = int(c.max())
    if fmt is None:
        return count, total, weight, EMAPreconditions(max_count, None, 0, 0, 0, 0)
    saturations = int(sat_rows[sums_q].sum())  # the zero row never saturates
    w, w_exact = _weights(xp, fmt, c)
    weight[qrow] = w
    fmt.counts.saturations += saturations
    pre = EMAPreconditions(max_count, fmt.scale, int(xp.count((c > 0) & (w == 0))),
                           int(xp.count(w_exact > fmt.max_raw)), inexact, saturations)
    return count, total, weight, pre


def exact_match_attention(queries, keys, values, *, query_mask=None, key_mask=None,
                          fmt: Format | None = None) -> EMAResult:
    """Exact-Match Attention (docs/ema.md; P2 Sec. 3.2 and 4.1), batched, in O(N log N) time and O(N(kw + dv))
    memory.

    queries [B, Nq, kw], keys [B, Nk, kw]: int64 words (numpy arrays or torch tensors, any device;
    [Nq, kw] / [Nk, kw] unbatched give B = 1, squeezed back); values [B, Nk, dv] int64 (raw values
    of ``fmt`` in fixed point). query_mask [B, Nq] bool (False: no query, "no match"); key_mask
    [B, Nk] bool (False: the key publishes nothing). ``fmt=None``: ideal semantics; a FixedPoint:
    fixed-point semantics (module docstring). Output arrays are of the input's library and device.

    Raises :class:`EMAError` (a ValueError) for bad arguments and :class:`EMAOverflowError` when an
    ideal sum could leave int64; values outside the format's range raise the format's
    PrecisionError. Saturations and underflows of the fixed-point products are counted in
    ``fmt.counts`` (underflows once per (key, component) product, output saturations once per
    query element)."""
    fmt = check_fmt(fmt)
    A = _normalize(queries, keys, values, query_mask, key_mask)
    xp, B, Nq, Nk, dv = A.xp, A.B, A.Nq, A.Nk, A.dv
    if fmt is not None and int(A.v.shape[0]) * dv:
        lo, hi = xp.minmax(A.v)
        if lo < fmt.min_raw or hi > fmt.max_raw:
            raise EMAError(f"values: raw values must lie in [{fmt.min_raw}, {fmt.max_raw}] (the range of "
                           f"{fmt.name}), got [{lo}, {hi}]")
    qpos = None if A.qm is None else _nonzero(xp, A.qm)
    kpos = None if A.km is None else _nonzero(xp, A.km)
    qwords = A.q if qpos is None else A.q[qpos]
    kwords = A.k if kpos is None else A.k[kpos]
    batch = None
    if B > 1:
        qb = arange(xp, B * Nq) if qpos is None else qpos
        kb = arange(xp, B * Nk) if kpos is None else kpos
        batch = cat(xp, [kb // max(Nk, 1), qb // max(Nq, 1)])
    count, total, weight, pre = match_sums(xp, kwords, qwords, batch, B, kpos, qpos, B * Nq, A.v, fmt)
    shape = (B, Nq) if A.batched else (Nq,)
    return EMAResult(count.reshape(shape), total.reshape(shape + (dv,)),
                     None if weight is None else weight.reshape(shape), fmt, pre)


# ================================================================================================
# the dense reference (tests and spot checks: O(Nq * Nk) per batch)
# ================================================================================================


@dataclass
class EMAReference:
    """Exact result of :func:`ema_dense_reference`, numpy, always batched.

    ``count`` [B, Nq] int64; ``total`` [B, Nq, dv] object (Python ints); ``weight`` [B, Nq] object
    raw weights (fixed point) or None; ``weights`` [B, Nq, Nk] object: the attention matrix --
    Fraction 1/c_i on matches (ideal) or raw weights (fixed point), 0 elsewhere -- or None when only
    some ``rows`` were computed; ``rows``: the (b, i) pairs computed (None: all)."""

    count: np.ndarray
    total: np.ndarray
    weight: np.ndarray | None
    weights: np.ndarray | None
    rows: list[tuple[int, int]] | None


def _reference_row(vals: np.ndarray, fmt: FixedPoint | None) -> tuple[list, Any]:
    """(total as a list of Python ints, the weight) for the value rows ``vals`` [c, dv] of one query's
    matches, straight from the definition: exact sums; in fixed point w = sat(round(S/c)) and
    products round(w * v / S) (floor: Python's //, nearest-even: divmod and the tie rule), each
    saturated, summed exactly and saturated once."""
    c, dv = vals.shape
    if c == 0:
        return [0] * dv, (Fraction(0) if fmt is None else 0)
    if fmt is None:
        cols = vals.sum(0) if c * int(np.abs(vals).max(initial=0)) < (1 << 62) else vals.astype(object).sum(0)
        return [int(x) for x in cols], Fraction(1, c)
    S = fmt.scale
    q, r = divmod(S, c)
    w = min(q + (fmt.nearest and (2 * r > c or (2 * r == c and q % 2 == 1))), fmt.max_raw)
    prod = vals.astype(object) * w
    q = prod // S
    if fmt.nearest:
        r = prod - q * S
        q = q + ((2 * r > S) | ((2 * r == S) & (q % 2 == 1))).astype(object)
    q = np.clip(q, fmt.min_raw, fmt.max_raw)
    return [min(max(int(x), fmt.min_raw), fmt.max_raw) for x in q.sum(0)], w


def ema_dense_reference(queries, keys, values, *, query_mask=None, key_mask=None, fmt: Format | None = None,
                        rows: list[tuple[int, int]] | None = None) -> EMAReference:
    """EMA computed from its definition by comparing every query with every key (docs/ema.md), with
    exact Python integers and Fractions: an oracle independent of the sort-based fast path.

    Arguments as :func:`exact_match_attention` (inputs are copied to the host). ``rows``: compute
    only these (b, i) queries (the others stay 0); the dense ``weights`` matrix is returned only
    when ``rows`` is None."""
    fmt = check_fmt(fmt)
    q, k, v, qm, km = (None if a is None else to_numpy(a) for a in (queries, keys, values, query_mask, key_mask))
    A = _normalize(q, k, v, qm, km)
    B, Nq, Nk, kw, dv = A.B, A.Nq, A.Nk, A.kw, A.dv
    Q, K, V = A.q.reshape(B, Nq, kw), A.k.reshape(B, Nk, kw), A.v.reshape(B, Nk, dv)
    QM = np.ones((B, Nq), bool) if A.qm is None else A.qm.reshape(B, Nq)
    KM = np.ones((B, Nk), bool) if A.km is None else A.km.reshape(B, Nk)
    if fmt is not None and V.size and (V.min() < fmt.min_raw or V.max() > fmt.max_raw):
        raise EMAError(f"values: raw values must lie in [{fmt.min_raw}, {fmt.max_raw}] (the range of {fmt.name})")
    count = np.zeros((B, Nq), np.int64)
    total = np.zeros((B, Nq, dv), dtype=object)
    weight = None if fmt is None else np.zeros((B, Nq), dtype=object)
    weights = np.zeros((B, Nq, Nk), dtype=object) if rows is None else None
    todo = [(b, i) for b in range(B) for i in range(Nq)] if rows is None else list(rows)
    memo: dict[tuple, tuple] = {}  # the result depends on (b, q_i) only
    for b, i in todo:
        if not QM[b, i]:
            continue
        key = (b, Q[b, i].tobytes())
        if key not in memo:
            hit = np.flatnonzero(np.all(K[b] == Q[b, i], axis=1) & KM[b])
            memo[key] = (hit,) + _reference_row(V[b, hit], fmt)
        hit, tot, w = memo[key]
        count[b, i] = len(hit)
        total[b, i] = tot
        if fmt is not None:
            weight[b, i] = w
        if weights is not None and len(hit):
            weights[b, i, hit] = w
    return EMAReference(count, total, weight, weights, None if rows is None else todo)


# ================================================================================================
# B.6: lowering an EMA head over b-bit integer keys to a softmax head
# ================================================================================================


def _lowering_keys(x, bits: int, name: str, mask, mask_name: str):
    a = int_array(NP, to_numpy(x), name)
    if a.ndim not in (1, 2):
        raise EMAError(f"{name}: must have shape [B, N] or [N] (one b-bit integer per token), got {a.shape}")
    batched = a.ndim == 2
    a = a if batched else a[None]
    if a.size and (a.min() < 0 or a.max() >= (1 << bits)):
        raise EMAError(f"{name}: keys must lie in [0, 2^bits) = [0, {1 << bits}), got [{a.min()}, {a.max()}]")
    m = np.ones(a.shape, bool) if mask is None else _bool_array(NP, to_numpy(mask), mask_name,
                                                                   tuple(a.shape) if batched else a.shape[1:])
    return a, m.reshape(a.shape), batched


def _code(a: np.ndarray, bits: int) -> np.ndarray:
    """code(x) in {-1, +1}^bits: bit t of x (t = 0 the least significant) -> +1 if set, else -1."""
    return 2 * ((a[..., None] >> np.arange(bits, dtype=np.int64)) & 1) - 1


def _eta_raw(fmt: FixedPoint, eta) -> int:
    try:
        ok = fmt.represents(eta)
    except ValueError:
        ok = False
    if not ok or Fraction(eta) <= 0:
        raise EMAError(f"eta: must be a positive grid value of {fmt.name} (a multiple of {fmt.step}), got {eta!r}")
    return int(Fraction(eta) * fmt.scale)


def lowered_head_vectors(query_keys, keys, *, bits: int, eta, fmt: Format, query_mask=None, key_mask=None):
    """B.6: the query and key vectors of the softmax head that lowers EMA over b-bit integer keys.

    q_i = eta * [code(query_i), 1]   (no query: eta * [0_b, 1]),
    k_0 = [0_b, b - 1]               (the BOS key, value 0),
    k_j = [code(key_j), 0]           (j = 1..Nk; a key that publishes nothing: [0_b, 0]),

    with code(x) in {-1, +1}^b. query_keys [B, Nq] / keys [B, Nk] integers in [0, 2^b) ([N] for
    B = 1); masks as in :func:`exact_match_attention`. Returns raw numpy int64 arrays
    Q [B, Nq, b + 1] and K [B, 1 + Nk, b + 1] of ``fmt`` (unbatched inputs: without B)."""
    fmt = check_fmt(fmt)
    if fmt is None:
        raise EMAError("fmt: the lowered head needs a FixedPoint format, got None")
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 62:
        raise EMAError(f"bits: must be an integer in [2, 62] (b = 1 lets the BOS key tie), got {bits!r}")
    bits = int(bits)
    e = _eta_raw(fmt, eta)
    S = fmt.scale
    qa, qm, batched = _lowering_keys(query_keys, bits, "query_keys", query_mask, "query_mask")
    ka, km, kb = _lowering_keys(keys, bits, "keys", key_mask, "key_mask")
    if kb != batched or qa.shape[0] != ka.shape[0]:
        raise EMAError(f"keys: must have the same batch layout as query_keys, got {ka.shape} and {qa.shape}")
    for name, x in (("eta * b", e * bits), ("b - 1", (bits - 1) * S)):
        if x > fmt.max_raw:
            raise EMAError(f"eta, bits: {name} must be representable in {fmt.name} (<= {fmt.max_value})")
    B, Nq, Nk = qa.shape[0], qa.shape[1], ka.shape[1]
    Q = np.zeros((B, Nq, bits + 1), np.int64)
    Q[..., :bits] = np.where(qm[..., None], e * _code(qa, bits), 0)
    Q[..., bits] = e
    K = np.zeros((B, 1 + Nk, bits + 1), np.int64)
    K[:, 0, bits] = (bits - 1) * S
    K[:, 1:, :bits] = np.where(km[..., None], S * _code(ka, bits), 0)
    return (Q, K) if batched else (Q[0], K[0])


def lowered_head_logits(query_keys, keys, *, bits: int, eta, fmt: Format, query_mask=None, key_mask=None):
    """Raw logits ``fmt.matmul(Q, K^T)`` [B, Nq, 1 + Nk] of the lowered head (column 0: BOS) -- see
    :func:`lowered_head_vectors`. A real key scores eta * (b - 2 * Hamming(query, key)), BOS
    eta * (b - 1). ``fmt.softmax`` of these logits puts raw weight sat(round(S/c_i)) on each of the
    c_i matches (1 on BOS when c_i = 0) iff :func:`lowering_conditions` holds."""
    Q, K = lowered_head_vectors(query_keys, keys, bits=bits, eta=eta, fmt=fmt, query_mask=query_mask,
                                key_mask=key_mask)
    return fmt.matmul(Q, np.swapaxes(K, -1, -2))


def lowering_conditions(fmt: Format, eta, bits: int, max_count: int) -> dict[str, bool]:
    """When the App. D softmax of the lowered head equals fixed-point EMA (docs/ema.md, "Lowering").

    ``exp_minus_eta_is_zero``: round(e^-eta * S) = 0, i.e. eta > ln S (floor) or eta > ln 2S
    (nearest-even) -- decided by the format's exact exp, so every key eta or more below the row
    maximum (BOS in a matched row; every non-matching key) gets weight exactly 0.
    ``sum_in_range``: max_count * min(S, max_raw) <= max_raw (the softmax denominator is not clipped).
    ``logits_in_range``: eta * b and b - 1 representable. ``weights_positive``: round(S/max_count)
    >= 1 (else matches read as "no match": the softmax still equals fixed-point EMA, but neither is
    EMA). ``one_representable``: S <= max_raw (else the single-match weight saturates).
    The condition is the block's (:meth:`~exactformer.constructions.blocks.match.MatchHead.conditions`);
    this function checks the arguments."""
    fmt = check_fmt(fmt)
    if fmt is None:
        raise EMAError("fmt: the lowered head needs a FixedPoint format, got None")
    _eta_raw(fmt, eta)
    return MatchHead.conditions(fmt, Fraction(eta), bits, max_count)
