"""Exact-Match Attention (verify/attention/ema.py): the sort-based fast path against the dense definition,
numpy against torch, fixed point against the App. D softmax of the lowered head (B.6)."""

from __future__ import annotations

import hashlib
import itertools
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.precision import FixedPoint
from exactformer.verify.attention.ema import (
    EMAError,
    EMAOverflowError,
    ema_dense_reference,
    exact_ids,
    exact_match_attention,
    lowered_head_logits,
    lowering_conditions,
)
from exactformer.precision._xp import NP

F44 = FixedPoint.binary(4, 4)  # S = 16, max_raw = 255
F84 = FixedPoint.binary(8, 4)
F64N = FixedPoint.binary(6, 4, rounding="nearest-even")


def _np(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def assert_matches_reference(res, ref, fmt=None):
    """The fast result equals the dense reference exactly (count, total, weight)."""
    count = _np(res.count).reshape(ref.count.shape)
    total = _np(res.total).reshape(ref.total.shape)
    assert count.tolist() == ref.count.tolist()
    assert total.tolist() == ref.total.tolist()
    if fmt is None:
        assert res.weight is None
    else:
        assert _np(res.weight).reshape(ref.count.shape).tolist() == ref.weight.tolist()


def _run_both(q, k, v, **kw):
    """numpy and CPU torch results, checked bit-identical to each other."""
    a = exact_match_attention(q, k, v, **kw)
    tkw = {key: (torch.from_numpy(val) if isinstance(val, np.ndarray) else val) for key, val in kw.items()}
    b = exact_match_attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), **tkw)
    assert isinstance(b.total, torch.Tensor) and isinstance(b.count, torch.Tensor)
    assert b.total.dtype == torch.int64 and b.count.dtype == torch.int64
    assert np.array_equal(_np(a.count), _np(b.count)) and np.array_equal(_np(a.total), _np(b.total))
    assert (a.weight is None) == (b.weight is None)
    if a.weight is not None:
        assert np.array_equal(_np(a.weight), _np(b.weight))
    assert a.preconditions == b.preconditions
    return a


# ------------------------------------------------------------------------------------------------
# exhaustive small key patterns
# ------------------------------------------------------------------------------------------------


def _all_patterns(alphabet: int, nq: int, nk: int):
    """Every (queries, keys) pair over the alphabet, one batch row each: includes no-match rows,
    all-match rows and every multiset of duplicate keys."""
    pats = list(itertools.product(range(alphabet), repeat=nq + nk))
    a = np.array(pats, dtype=np.int64)
    return a[:, :nq, None], a[:, nq:, None]


@pytest.mark.parametrize("fmt", [None, F44, F64N], ids=["ideal", "binary44", "nearest"])
def test_exhaustive_patterns(fmt):
    q, k = _all_patterns(3, 3, 4)  # 3^7 = 2187 inputs
    rng = np.random.default_rng(0)
    v = rng.integers(-15, 16, size=(q.shape[0], 4, 2))
    if fmt is not None:
        v = v * fmt.scale  # integer payloads
    res = _run_both(q, k, v, fmt=fmt)
    ref = ema_dense_reference(q, k, v, fmt=fmt)
    assert_matches_reference(res, ref, fmt)
    c = ref.count
    assert (c == 0).any() and (c == 4).any() and (c == 2).any()  # no-match, all-match, duplicates
    assert res.preconditions.ok and res.preconditions.max_count == 4


def test_exhaustive_masks():
    """Every query/key mask on every pattern over a 2-letter alphabet."""
    q, k = _all_patterns(2, 2, 3)
    masks = np.array(list(itertools.product([False, True], repeat=5)), dtype=bool)
    B = q.shape[0] * masks.shape[0]
    q = np.repeat(q, masks.shape[0], axis=0)
    k = np.repeat(k, masks.shape[0], axis=0)
    qm = np.tile(masks[:, :2], (B // masks.shape[0], 1))
    km = np.tile(masks[:, 2:], (B // masks.shape[0], 1))
    v = np.random.default_rng(1).integers(-9, 9, size=(B, 3, 3))
    for fmt in (None, F84):
        vv = v if fmt is None else v * 16
        res = _run_both(q, k, vv, query_mask=qm, key_mask=km, fmt=fmt)
        ref = ema_dense_reference(q, k, vv, query_mask=qm, key_mask=km, fmt=fmt)
        assert_matches_reference(res, ref, fmt)
        assert not _np(res.count)[~qm].any()  # no query: no match


def test_mean_is_exact():
    q = np.array([[1], [2], [7]])
    k = np.array([[1], [1], [1], [2]])
    v = np.array([[1, 0], [2, 1], [4, 1], [5, -3]])
    res = exact_match_attention(q, k, v)
    assert res.mean().tolist() == [[Fraction(7, 3), Fraction(2, 3)], [Fraction(5), Fraction(-3)], [0, 0]]
    assert res.matched.tolist() == [True, True, False]
    res = exact_match_attention(q, k, v * 16, fmt=F84)
    assert res.weight.tolist() == [5, 16, 0]  # floor(16/3), floor(16/1)
    assert res.mean().tolist() == [[Fraction(35, 16), Fraction(10, 16)], [Fraction(5), Fraction(-3)], [0, 0]]


# ------------------------------------------------------------------------------------------------
# random cases, multi-word keys, numpy == torch
# ------------------------------------------------------------------------------------------------


@st.composite
def _cases(draw):
    B = draw(st.sampled_from([1, 2, 7]))
    nq, nk = draw(st.integers(0, 9)), draw(st.integers(0, 9))
    kw = draw(st.integers(1, 3))
    dv = draw(st.integers(0, 3))
    span = draw(st.sampled_from([2, 3, 1 << 40, 1 << 63]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lo = -(span // 2)
    words = rng.integers(lo, lo + span - 1, size=(B, nq + nk, kw), endpoint=True)
    if nk and nq:  # plant exact repeats
        words[:, :nq] = words[:, nq + rng.integers(0, nk, nq)] if draw(st.booleans()) else words[:, :nq]
    v = rng.integers(-50, 50, size=(B, nk, dv))
    qm = rng.random((B, nq)) < 0.8 if draw(st.booleans()) else None
    km = rng.random((B, nk)) < 0.8 if draw(st.booleans()) else None
    return words[:, :nq], words[:, nq:], v, qm, km


@settings(max_examples=60, deadline=None)
@given(_cases(), st.sampled_from([None, F84, F64N]))
def test_random_against_reference(case, fmt):
    q, k, v, qm, km = case
    if fmt is not None:
        v = v * 16
    res = _run_both(q, k, v, query_mask=qm, key_mask=km, fmt=fmt)
    assert_matches_reference(res, ema_dense_reference(q, k, v, query_mask=qm, key_mask=km, fmt=fmt), fmt)


def test_multiword_keys_never_collide():
    """Rows equal in every word but one, permuted words, and int64 extremes (forces dense ranks)."""
    big = np.iinfo(np.int64)
    k = np.array([[1, 2, 3], [2, 1, 3], [3, 2, 1], [1, 2, 4], [big.min, big.max, 0], [big.max, big.min, 0],
                  [1, 2, 3]], dtype=np.int64)
    q = np.concatenate([k, [[0, 0, 0], [big.min, big.min, big.min]]])
    v = np.arange(k.shape[0] * 2).reshape(-1, 2)
    res = _run_both(q, k, v)
    assert _np(res.count).tolist() == [2, 1, 1, 1, 1, 1, 2, 0, 0]
    assert_matches_reference(res, ema_dense_reference(q, k, v))
    # a lossy id (the sum of the words) would merge rows 0, 1 and 2
    assert len({int(x) for x in k[:3].sum(1)}) == 1


@pytest.mark.parametrize("kw,span", [(1, 1 << 63), (2, 1 << 40), (3, 1 << 63), (5, 3)])
def test_exact_ids_injective(kw, span):
    rng = np.random.default_rng(kw)
    base = rng.integers(-(span // 2), span // 2, size=(50, kw))
    words = base[rng.integers(0, 50, 400)]
    batch = rng.integers(0, 3, 400)
    ids, bits = exact_ids(NP, words, batch, 3)
    rows = [tuple(r) + (b,) for r, b in zip(words.tolist(), batch.tolist())]
    for i in range(0, 400, 7):
        same = [rows[j] == rows[i] for j in range(400)]
        assert ((ids == ids[i]) == np.array(same)).all()
    assert ids.min() >= 0 and (bits == 64 or int(ids.max()) < (1 << bits))


def test_batch_sizes_and_repeats():
    """Batches of 1, 2, 7 and the full 23 give the rows of single calls; repeated calls agree;
    unbatched input gives the squeezed B = 1 result."""
    rng = np.random.default_rng(5)
    q = rng.integers(0, 6, size=(23, 40, 2))
    k = rng.integers(0, 6, size=(23, 50, 2))
    v = rng.integers(-99, 99, size=(23, 50, 4)) * 16
    qm = rng.random((23, 40)) < 0.9
    for fmt in (None, F84):
        full = exact_match_attention(q, k, v, query_mask=qm, fmt=fmt)
        again = exact_match_attention(q, k, v, query_mask=qm, fmt=fmt)
        assert np.array_equal(full.total, again.total) and np.array_equal(full.count, again.count)
        for size in (1, 2, 7):
            for start in range(0, 23, size):
                sl = slice(start, start + size)
                part = exact_match_attention(q[sl], k[sl], v[sl], query_mask=qm[sl], fmt=fmt)
                assert np.array_equal(part.total, full.total[sl]) and np.array_equal(part.count, full.count[sl])
        one = exact_match_attention(q[3], k[3], v[3], query_mask=qm[3], fmt=fmt)
        assert one.count.shape == (40,) and one.total.shape == (40, 4)
        assert np.array_equal(one.total, full.total[3])


def test_fresh_process_same_result():
    code = (
        "import hashlib, numpy as np\n"
        "from exactformer.verify.attention.ema import exact_match_attention\n"
        "rng = np.random.default_rng(11)\n"
        "q = rng.integers(0, 50, (3, 500, 2)); k = rng.integers(0, 50, (3, 600, 2)); v = rng.integers(-9, 9, (3, 600, 5))\n"
        "r = exact_match_attention(q, k, v)\n"
        "print(hashlib.sha256(r.total.tobytes() + r.count.tobytes()).hexdigest())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    rng = np.random.default_rng(11)
    q = rng.integers(0, 50, (3, 500, 2))
    k = rng.integers(0, 50, (3, 600, 2))
    v = rng.integers(-9, 9, (3, 600, 5))
    r = exact_match_attention(q, k, v)
    assert out == hashlib.sha256(r.total.tobytes() + r.count.tobytes()).hexdigest()


def test_larger_patterns_spot_checked():
    """N = 4096 with unique, Poisson-duplicate and few-distinct keys: sampled rows by brute force."""
    rng = np.random.default_rng(2)
    N = 4096
    for keys in (rng.permutation(N), rng.integers(0, N, N), rng.integers(0, 5, N)):
        q = rng.integers(0, N, (N, 1))
        q[::3, 0] = keys[rng.integers(0, N, len(q[::3]))]
        k = keys[:, None]
        v = rng.integers(-(1 << 40), 1 << 40, (N, 3))
        res = _run_both(q, k, v)
        rows = [(0, int(i)) for i in rng.integers(0, N, 64)]
        ref = ema_dense_reference(q, k, v, rows=rows)
        for _, i in rows:
            assert int(res.count[i]) == int(ref.count[0, i])
            assert res.total[i].tolist() == ref.total[0, i].tolist()


# ------------------------------------------------------------------------------------------------
# fixed point: preconditions
# ------------------------------------------------------------------------------------------------


def test_lost_matches_when_scale_below_count():
    """S = 16 < c = 20: floor(16/20) = 0, the matches read as "no match" -- reported."""
    q = np.array([[7], [8]])
    k = np.array([[7]] * 20 + [[8]] * 3)
    v = np.full((23, 1), 16)
    res = exact_match_attention(q, k, v, fmt=F84)
    assert res.count.tolist() == [20, 3] and res.weight.tolist() == [0, 5]
    assert res.total.tolist() == [[0], [15 * 16 // 16]]
    p = res.preconditions
    assert p.lost_matches == 1 and p.max_count == 20 and not p.ok
    assert exact_match_attention(q[1:], k, v, fmt=F84).preconditions.ok


def test_weight_saturation_and_inexact_products():
    f0 = FixedPoint.binary(0, 4)  # max_raw = 15 < S = 16: the weight 1 is not representable
    q, k = np.array([[1]]), np.array([[1]])
    res = exact_match_attention(q, k, np.array([[8]]), fmt=f0)
    assert res.weight.tolist() == [15] and res.total.tolist() == [[7]]  # floor(15 * 8 / 16)
    assert res.preconditions.weight_saturations == 1 and not res.preconditions.ok
    res = exact_match_attention(np.array([[1]]), np.array([[1], [1], [1]]), np.array([[16], [17], [3]]), fmt=F84)
    assert res.weight.tolist() == [5] and res.total.tolist() == [[5 + 5 + 0]]  # floor(5*17/16) = 5, floor(15/16) = 0
    assert res.preconditions.inexact_products == 2


@pytest.mark.parametrize(
    "fmt,values,count,weight,total,saturations",
    [
        # floor(-16/3) = -6 per match: -18 < -16 -> clipped once per query element
        (FixedPoint(3, -16, 15), [-16, -16, -16], 3, 1, -16, 3),
        (FixedPoint(3, -16, 15), [-15, -15, -15], 3, 1, -15, 0),
        # nearest-even: w = round(7/2) = 4 > 7/2, round(4 * 15 / 7) = 9: 18 > 15 -> clipped
        (FixedPoint(7, -16, 15, "nearest-even"), [15, 15], 2, 4, 15, 2),
        (FixedPoint(7, -16, 15), [15, 15], 2, 3, 12, 0),  # floor: 2 * floor(45/7) = 12
    ],
)
def test_output_saturation(fmt, values, count, weight, total, saturations):
    fmt.reset_counts()
    q = np.ones((count, 1), np.int64)
    res = exact_match_attention(q, q, np.array(values)[:, None], fmt=fmt)
    assert res.count.tolist() == [count] * count and res.weight.tolist() == [weight] * count
    assert res.total.tolist() == [[total]] * count
    assert res.preconditions.saturations == saturations and fmt.counts.saturations == saturations
    assert not (saturations and res.preconditions.ok)
    ref = ema_dense_reference(q, q, np.array(values)[:, None], fmt=fmt)
    assert_matches_reference(res, ref, fmt)


# ------------------------------------------------------------------------------------------------
# exact integers: overflow guard
# ------------------------------------------------------------------------------------------------


def test_ideal_sum_overflow_is_an_error():
    big = (1 << 62) + 1
    q = np.array([[1]])
    assert exact_match_attention(q, np.array([[1]]), np.array([[big]])).total.tolist() == [[big]]
    assert exact_match_attention(q, np.array([[1], [1]]), np.array([[big // 2], [big // 2]])).total.tolist() == \
        [[2 * (big // 2)]]
    for lib in (np.asarray, torch.from_numpy):
        with pytest.raises(EMAOverflowError, match="values: an exact sum of 2 matched values"):
            exact_match_attention(lib(q), lib(np.array([[1], [1]])), lib(np.array([[big], [big]])))


# ------------------------------------------------------------------------------------------------
# bad arguments: one EMAError naming the parameter
# ------------------------------------------------------------------------------------------------

_Q, _K, _V = np.zeros((2, 1), np.int64), np.zeros((3, 1), np.int64), np.zeros((3, 2), np.int64)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(queries=_Q.astype(float)), "queries: must hold integers"),
        (dict(keys=_K.astype(bool)), "keys: must hold integers"),
        (dict(values=np.array([[0.5, 1]] * 3)), "values: must hold integers"),
        (dict(keys=np.array([[2**63]], dtype=np.uint64)), "keys: words must lie in the int64 range"),
        (dict(queries=np.array([[2**64], [0]], dtype=object)), "queries: words must lie in the int64 range"),
        (dict(queries=np.array([[Fraction(1, 2)], [0]], dtype=object)), "queries: must hold integers"),
        (dict(queries=np.zeros((2,), np.int64)), r"queries: must have shape \[B, Nq, kw\] or \[Nq, kw\]"),
        (dict(keys=np.zeros((1, 3, 1), np.int64)), r"keys: must have shape \[Nk, kw\]"),
        (dict(keys=np.zeros((3, 2), np.int64)), "keys: must have kw = 1 words"),
        (dict(values=np.zeros((4, 2), np.int64)), "values: must have Nk = 3 rows"),
        (dict(queries=np.zeros((2, 0), np.int64), keys=np.zeros((3, 0), np.int64)), "kw .* must be >= 1"),
        (dict(query_mask=np.ones(2, np.int64)), "query_mask: must be a bool array"),
        (dict(key_mask=np.ones(4, bool)), r"key_mask: must have shape \(3,\)"),
        (dict(keys=torch.zeros((3, 1), dtype=torch.int64)), "all be numpy arrays or all torch tensors"),
        (dict(fmt="binary:int=4,frac=4"), "fmt: must be None .* or a FixedPoint format"),
        (dict(fmt=FixedPoint.binary(4, 4), values=np.full((3, 2), 256)), r"values: raw values must lie in \[-256, 255\]"),
        (dict(fmt=FixedPoint.paper(1 << 20, 4)), "fmt: .* beyond 2\\^60"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(queries=_Q, keys=_K, values=_V) | kwargs
    fmt = args.pop("fmt", None)
    with pytest.raises(EMAError, match=match):
        exact_match_attention(args.pop("queries"), args.pop("keys"), args.pop("values"), fmt=fmt, **args)


def test_errors_are_value_errors():
    assert issubclass(EMAError, ValueError) and issubclass(EMAOverflowError, EMAError)


# ------------------------------------------------------------------------------------------------
# B.6: the lowered softmax head reproduces fixed-point EMA bit for bit iff eta > ln S
# ------------------------------------------------------------------------------------------------


def _eta_around(fmt, threshold: float):
    """The grid values just above and just below the threshold."""
    below = Fraction(math.floor(threshold * fmt.scale), fmt.scale)
    return below + fmt.step, below


def _lowered(fmt, qk, kk, V, eta, bits, qm=None, km=None):
    L = lowered_head_logits(qk, kk, bits=bits, eta=eta, fmt=fmt, query_mask=qm, key_mask=km)
    W = fmt.softmax(L)
    out = fmt.matmul(W, np.concatenate([np.zeros_like(V[:, :1]), V], axis=1))
    return W, out


def _lowering_data(seed, S, bits=3, B=40, nq=6, nk=10):
    rng = np.random.default_rng(seed)
    qk = rng.integers(0, 1 << bits, (B, nq))
    kk = rng.integers(0, 3, (B, nk))  # duplicates; some queries match nothing
    kk[0] = qk[0, 0]  # an all-match row
    V = rng.integers(-7, 8, (B, nk, 2)) * S
    qm = rng.random((B, nq)) < 0.9
    km = rng.random((B, nk)) < 0.9
    qm[0, 0] = km[0] = True
    return qk, kk, V, qm, km


@pytest.mark.parametrize("frac,rounding", [(3, "floor"), (4, "floor"), (6, "floor"), (4, "nearest-even")])
def test_lowered_softmax_equals_fixed_point_ema_iff_eta_above_ln_S(frac, rounding):
    nk = 8
    fmt = FixedPoint.binary(8, frac, rounding)
    S = fmt.scale
    qk, kk, V, qm, km = _lowering_data(frac, S, nk=nk)
    res = exact_match_attention(qk[..., None], kk[..., None], V, query_mask=qm, key_mask=km, fmt=fmt)
    ref = ema_dense_reference(qk[..., None], kk[..., None], V, query_mask=qm, key_mask=km, fmt=fmt)
    assert_matches_reference(res, ref, fmt)
    assert res.preconditions.max_count == nk and S >= nk
    threshold = math.log(S) if rounding == "floor" else math.log(2 * S)
    above, below = _eta_around(fmt, threshold)
    for eta, expect in ((above, True), (above + 3 * fmt.step, True), (below, False)):
        cond = lowering_conditions(fmt, eta, 3, res.preconditions.max_count)
        assert cond["exp_minus_eta_is_zero"] is expect and cond["ok"] is expect
        W, out = _lowered(fmt, qk, kk, V, eta, 3, qm, km)
        want = ref.weights.astype(np.int64)
        bos = np.where(ref.count == 0, min(S, fmt.max_raw), 0)
        same = np.array_equal(W[..., 1:], want) and np.array_equal(W[..., 0], bos)
        assert same is expect
        assert np.array_equal(out, res.total) is expect


def test_lowering_fails_when_scale_below_match_count():
    """S = 8 < c = 9 matches: the softmax still equals fixed-point EMA (both floor(8/9) = 0), but
    the matches are lost -- the precondition report and the lowering conditions say so."""
    fmt = FixedPoint.binary(8, 3)
    qk = np.array([[5, 1]])
    kk = np.array([[5] * 9 + [1] * 2])
    V = np.full((1, 11, 1), 8)
    res = exact_match_attention(qk[..., None], kk[..., None], V, fmt=fmt)
    above, _ = _eta_around(fmt, math.log(8))
    W, out = _lowered(fmt, qk, kk, V, above, 3)
    assert np.array_equal(out, res.total) and res.weight.tolist() == [[0, 4]]
    assert W[0, 0, 1:].tolist() == [0] * 11  # the nine matches get weight 0 and BOS too
    assert res.preconditions.lost_matches == 1 and not res.preconditions.ok
    cond = lowering_conditions(fmt, above, 3, res.preconditions.max_count)
    assert not cond["weights_positive"] and not cond["ok"]
    assert lowering_conditions(fmt, above, 3, 8)["ok"]


def test_lowering_fails_when_softmax_sum_saturates():
    """c * S > max_raw: the App. D denominator is clipped and the weights are no longer floor(S/c)."""
    fmt = FixedPoint.binary(3, 4)  # S = 16, max_raw = 127: c = 9 sums to 144, c = 7 to 112
    qk = np.array([[3, 2]])
    kk = np.array([[3] * 9 + [2] * 7])
    V = np.full((1, 16, 1), 16)
    res = exact_match_attention(qk[..., None], kk[..., None], V, fmt=fmt)
    above, _ = _eta_around(fmt, math.log(16))
    W, out = _lowered(fmt, qk, kk, V, above, 2)
    assert W[0, 1, 10:].tolist() == [int(res.weight[0, 1])] * 7  # c = 7: equal
    assert W[0, 0, 1:10].tolist() != [int(res.weight[0, 0])] * 9  # c = 9: clipped denominator
    assert not lowering_conditions(fmt, above, 2, 9)["sum_in_range"]
    assert lowering_conditions(fmt, above, 2, 7)["ok"]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(bits=1), r"bits: must be an integer in \[2, 62\]"),
        (dict(eta=Fraction(1, 3)), "eta: must be a positive grid value"),
        (dict(eta=0), "eta: must be a positive grid value"),
        (dict(keys=np.array([[8]])), r"keys: keys must lie in \[0, 2\^bits\)"),
        (dict(fmt=None), "fmt: the lowered head needs a FixedPoint format"),
        (dict(eta=200), "eta, bits: eta \\* b must be representable"),
    ],
)
def test_lowering_bad_arguments(kwargs, match):
    args = dict(query_keys=np.array([[1]]), keys=np.array([[2]]), bits=3, eta=Fraction(3), fmt=F84) | kwargs
    with pytest.raises(EMAError, match=match):
        lowered_head_logits(args.pop("query_keys"), args.pop("keys"), **args)


# ------------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_numpy():
    rng = np.random.default_rng(9)
    q = rng.integers(0, 300, (3, 5000, 2))
    k = rng.integers(0, 300, (3, 4000, 2))
    v = rng.integers(-50, 50, (3, 4000, 8)) * 16
    qm = rng.random((3, 5000)) < 0.9
    for fmt in (None, F84):
        a = exact_match_attention(q, k, v, query_mask=qm, fmt=fmt)
        dev = [torch.from_numpy(x).cuda() for x in (q, k, v, qm)]
        b = exact_match_attention(*dev[:3], query_mask=dev[3], fmt=fmt)
        assert b.total.device.type == "cuda"
        assert np.array_equal(a.total, _np(b.total)) and np.array_equal(a.count, _np(b.count))
        assert a.preconditions == b.preconditions


# ------------------------------------------------------------------------------------------------
# the `attention` CLI (registered on a throwaway app; exactformer/cli/main.py registers it for real)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cli_app():
    import typer

    from exactformer.cli.attention import attention

    app = typer.Typer()
    app.command("attention")(attention)

    @app.command("noop")
    def noop() -> None:  # a second command keeps "attention" a subcommand
        pass

    return app


def _cli(app, *args):
    from typer.testing import CliRunner

    res = CliRunner().invoke(app, ["attention", *args, "--json"])
    lines = [line for line in res.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    return res, __import__("json").loads(lines[0])


@pytest.mark.parametrize(
    "args,checked",
    [
        (["--kind", "ema", "--n", "600", "--d", "3", "--matches", "random"], 600),
        (["--kind", "ema", "--n", "5000", "--d", "2", "--matches", "few:4", "--key-words", "2", "--batch", "2",
          "--check-queries", "40"], 40),
        (["--kind", "ema", "--n", "300", "--d", "2", "--matches", "unique", "--precision", "binary:int=24,frac=12"],
         300),
        (["--kind", "ema", "--n", "200", "--d", "1", "--matches", "none"], 200),
        (["--kind", "dense", "--n", "300", "--d", "4", "--matches", "all"], 300),
        (["--kind", "anna", "--n", "300", "--d", "64", "--check-queries", "100"], 100),
    ],
)
def test_cli_runs_and_checks(cli_app, args, checked):
    res, out = _cli(cli_app, *args)
    assert res.exit_code == 0 and out["passed"] is True, out
    assert out["check"]["passed"] is True and out["check"]["queries_checked"] == checked
    assert out["seconds"] >= 0 and out["memory"]["peak_rss_mib"] > 0
    if out["kind"] == "ema":
        assert out["check"]["mismatches"] == 0 and out["preconditions"]["ok"] is True
    if out["kind"] == "anna":
        assert out["theorem"]["hashes"] == out["hashes"] and out["check"]["far_failures"] == 0


def test_cli_reports_failed_checks(cli_app):
    """Lost matches (S = 16 < c) and an ANNA with too few tables exit 1 with the failure reported."""
    res, out = _cli(cli_app, "--kind", "ema", "--n", "400", "--d", "1", "--matches", "all",
                    "--precision", "binary:int=20,frac=4")
    assert res.exit_code == 1 and out["check"]["passed"] and out["preconditions"]["lost_matches"] == 400
    res, out = _cli(cli_app, "--kind", "anna", "--n", "300", "--d", "64", "--family", "hyperplane",
                    "--tables", "2", "--hashes", "30")
    assert res.exit_code == 1 and out["check"]["near_failures"] > 0 and not out["passed"]


def test_cli_check_rejects_a_broken_layer(cli_app, monkeypatch):
    """A mutant EMA that drops the last key of every batch row is caught by the reference check."""
    import exactformer.cli.attention as cli_mod

    def broken(q, k, v, **kw):
        km = np.ones(k.shape[:2], bool)
        km[:, -1] = False
        return exact_match_attention(q, k, v, key_mask=km, **kw)

    monkeypatch.setattr(cli_mod, "exact_match_attention", broken)
    for n in ("500", "6000"):  # every query / sampled queries
        res, out = _cli(cli_app, "--kind", "ema", "--n", n, "--d", "2", "--matches", "few:3")
        assert res.exit_code == 1 and out["check"]["mismatches"] > 0 and not out["passed"]


@pytest.mark.parametrize(
    "args,match",
    [
        (["--kind", "flash", "--n", "10"], "--kind: must be one of ema | anna | dense"),
        (["--kind", "ema", "--n", "0"], r"--n: must be an integer in [1, 67108864]"),
        (["--kind", "ema", "--n", "ten"], "--n: must be an integer"),
        (["--kind", "ema", "--n", "10", "--tables", "3"], "--tables: only with --kind anna"),
        (["--kind", "anna", "--n", "10", "--matches", "all"], "--matches: only with --kind ema or dense"),
        (["--kind", "ema", "--n", "10", "--matches", "few:x"], "--matches: must be one of"),
        (["--kind", "ema", "--n", "10", "--precision", "float64"], "--precision: must be a fixed-point format"),
        (["--kind", "ema", "--n", "10", "--precision", "binary:int=x"], "--precision:"),
        (["--kind", "anna", "--n", "10", "--approx-c", "1"], "--approx-c: must be a number > 1"),
        (["--kind", "anna", "--n", "10", "--family", "minhash"], "--family: must be one of"),
        (["--kind", "ema", "--n", "10", "--device", "tpu"], "--device: must be one of cpu | cuda"),
        (["--kind", "dense", "--n", str((1 << 16) + 1)], "--n: dense attention needs N^2 scores"),
    ],
)
def test_cli_errors(cli_app, args, match):
    res, out = _cli(cli_app, *args)
    assert res.exit_code == 2
    assert match in out["error"] and f"error: {out['error']}" in res.stderr
    assert "Traceback" not in res.output
