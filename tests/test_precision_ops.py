"""Every operation on random grid values equals the Fraction reference, counts included.

The reference (exactformer.precision.reference) is written independently from the definitions with
Python ints and Fractions only; its exponential comes from rational Taylor bounds (no floats, no
mpmath). Formats cover floor and nearest-even, power-of-two and decimal scales, int64 mode near its
limit (|raw| <= 2^60, products up to 2^120) and object mode (paper grid n = 2^20, kc = 2: 2^80 steps).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.precision import FixedPoint, _matmul, parse_format
from exactformer.precision.reference import Grid

SPECS = [
    "binary:int=5,frac=5",
    "binary:int=3,frac=4,rounding=nearest-even",
    "binary:int=0,frac=6",
    "binary:int=5,frac=40",
    "binary:int=30,frac=30",
    "binary:int=2,frac=57,rounding=nearest-even",
    "binary:int=58,frac=2,rounding=nearest-even",
    "binary:int=60,frac=0",
    "paper:n=10,kc=2",
    "paper:n=1000,kc=3",
    "paper:n=1048576,kc=2",  # object mode: raw range 2^80
    "binary:int=30,frac=35,rounding=nearest-even",  # object mode
]
FORMATS = [parse_format(s) for s in SPECS]


def raws(fmt, n_min=1, n_max=12):
    lo, hi, S = fmt.min_raw, fmt.max_raw, fmt.scale
    clip = lambda v: min(max(v, lo), hi)  # noqa: E731
    edge = sorted({clip(v) for v in (lo, hi, 0, 1, -1, S, -S, S // 2, -S // 2, S + 1, hi - 1, lo + 1)})
    one = st.one_of(
        st.integers(lo, hi),
        st.sampled_from(edge),
        st.integers(-4 * S, 4 * S).map(clip),
        st.integers(-S, S).map(clip),
    )
    return st.lists(one, min_size=n_min, max_size=n_max)


def arr(fmt, xs, shape=None):
    a = np.array(xs, dtype=fmt.dtype) if fmt.int64_mode else np.array([int(x) for x in xs] + [0], dtype=object)[:-1]
    return a.reshape(shape) if shape is not None else a


def check(fmt, got, ref):
    vals = [r[0] for r in ref]
    assert [int(v) for v in np.asarray(got).reshape(-1)] == vals
    assert fmt.counts.saturations == sum(r[1] for r in ref)
    assert fmt.counts.underflows == sum(r[2] for r in ref)


fmt_idx = st.integers(0, len(FORMATS) - 1)


@settings(max_examples=80, deadline=None)
@given(st.data(), fmt_idx, st.sampled_from(["add", "sub", "mul", "div"]))
def test_binary_ops(data, i, op):
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    a = data.draw(raws(fmt))
    b = data.draw(raws(fmt, len(a), len(a)))
    if op == "div":
        b = [x if x != 0 else 1 for x in b]
    fmt.reset_counts()
    got = getattr(fmt, op)(arr(fmt, a), arr(fmt, b))
    check(fmt, got, [getattr(g, op)(x, y) for x, y in zip(a, b)])


@settings(max_examples=80, deadline=None)
@given(st.data(), fmt_idx, st.sampled_from(["exp", "relu", "neg"]))
def test_unary_ops(data, i, op):
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    a = data.draw(raws(fmt))
    fmt.reset_counts()
    got = getattr(fmt, op)(arr(fmt, a))
    if op == "neg":
        ref = [g.sub(0, x) for x in a]
    else:
        ref = [getattr(g, op)(x) for x in a]
    check(fmt, got, ref)


@settings(max_examples=50, deadline=None)
@given(st.data(), fmt_idx)
def test_exp_near_zero(data, i):
    """Small |x| (the softmax range): results are neither 0 nor saturated, the floor is delicate."""
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    S = fmt.scale
    a = data.draw(st.lists(st.integers(max(fmt.min_raw, -20 * S), min(fmt.max_raw, 3 * S)), min_size=1, max_size=10))
    fmt.reset_counts()
    check(fmt, fmt.exp(arr(fmt, a)), [g.exp(x) for x in a])


@settings(max_examples=50, deadline=None)
@given(st.data(), fmt_idx)
def test_sum(data, i):
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    rows = data.draw(st.integers(1, 3))
    cols = data.draw(st.integers(1, 6))
    a = data.draw(raws(fmt, rows * cols, rows * cols))
    A = arr(fmt, a, (rows, cols))
    fmt.reset_counts()
    got = fmt.sum(A, axis=-1)
    check(fmt, got, [g.sum(a[r * cols:(r + 1) * cols]) for r in range(rows)])
    fmt.reset_counts()
    got = fmt.sum(A, axis=0)
    check(fmt, got, [g.sum([a[r * cols + c] for r in range(rows)]) for c in range(cols)])


@settings(max_examples=70, deadline=None)
@given(st.data(), fmt_idx, st.sampled_from(["rounded-products", "exact"]),
       st.sampled_from([None, "indicator", "elementwise"]))
def test_matmul(data, i, accumulate, force):
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    m, k, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 3))
    a = data.draw(raws(fmt, m * k, m * k))
    kind = data.draw(st.sampled_from(["general", "grid", "coarse"]))
    if kind == "grid":  # integer-valued b: the fast path
        b = [min(max(fmt.scale * v, fmt.min_raw), fmt.max_raw) for v in data.draw(st.lists(st.integers(-3, 3), min_size=k * n, max_size=k * n))]
    elif kind == "coarse":  # few distinct residues: the indicator path
        S = fmt.scale
        b = [min(max(v, fmt.min_raw), fmt.max_raw) for v in data.draw(st.lists(st.sampled_from([0, S, -S, S // 2, -(S // 4), 3 * S // 8 + S]), min_size=k * n, max_size=k * n))]
    else:
        b = data.draw(raws(fmt, k * n, k * n))
    A2 = [a[r * k:(r + 1) * k] for r in range(m)]
    B2 = [b[r * n:(r + 1) * n] for r in range(k)]
    fmt.reset_counts()
    _matmul.FORCE_PATH = force
    try:
        got = fmt.matmul(arr(fmt, a, (m, k)), arr(fmt, b, (k, n)), accumulate=accumulate)
    finally:
        _matmul.FORCE_PATH = None
    ref, s, u = g.matmul(A2, B2, accumulate)
    assert [[int(v) for v in row] for row in np.asarray(got)] == ref
    assert (fmt.counts.saturations, fmt.counts.underflows) == (s, u)


@settings(max_examples=60, deadline=None)
@given(st.data(), fmt_idx)
def test_softmax(data, i):
    fmt = FORMATS[i]
    g = Grid.of(fmt)
    S = fmt.scale
    rows = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, 7))
    near = st.integers(-8 * S, 8 * S).map(lambda v: min(max(v, fmt.min_raw), fmt.max_raw))
    xs = data.draw(st.lists(st.one_of(near, st.integers(fmt.min_raw, fmt.max_raw)), min_size=rows * T, max_size=rows * T))
    fmt.reset_counts()
    got = fmt.softmax(arr(fmt, xs, (rows, T)), axis=-1)
    ref_rows = [g.softmax(xs[r * T:(r + 1) * T]) for r in range(rows)]
    assert [[int(v) for v in row] for row in np.asarray(got)] == [r[0] for r in ref_rows]
    assert fmt.counts.saturations == sum(r[1] for r in ref_rows)
    assert fmt.counts.underflows == sum(r[2] for r in ref_rows)
    # the same along axis 0 of the transpose
    fmt.reset_counts()
    got0 = fmt.softmax(arr(fmt, xs, (rows, T)).T, axis=0)
    assert np.array_equal(np.asarray(got0).T, np.asarray(got))


# ---- fixed edge cases ----------------------------------------------------------------------------------


def test_range_ends_and_saturation():
    f = FixedPoint.binary(2, 3)  # raw [-32, 31]
    f.reset_counts()
    assert f.add(np.array([31, -32, 31]), np.array([1, -1, 0])).tolist() == [31, -32, 31]
    assert f.counts.as_dict() == {"saturations": 2, "underflows": 0}
    f.reset_counts()
    assert f.neg(np.array([-32, 31])).tolist() == [31, -31]  # -(-4) = 4 is not representable
    assert f.counts.saturations == 1
    f.reset_counts()
    assert f.mul(np.array([31, -32, -32]), np.array([31, 31, -32])).tolist() == [31, -32, 31]
    assert f.counts.saturations == 3


def test_nearest_even_ties():
    f = FixedPoint.binary(4, 2, rounding="nearest-even")  # step 1/4
    # 1/2 * 1/4 = 1/8: halfway between 0 and 1/4 -> 0 (even); 3/2 * 1/4 = 3/8 -> 1/2 (raw 2, even)
    assert f.mul(np.array([2, 6, -2, -6, 10]), np.array([1, 1, 1, 1, 1])).tolist() == [0, 2, 0, -2, 2]
    assert f.div(np.array([1, 3, -1]), np.array([8, 8, 8])).tolist() == [0, 2, 0]  # 1/8, 3/8, -1/8
    g = FixedPoint.binary(4, 2)  # floor
    assert g.mul(np.array([2, 6, -2, -6]), np.array([1, 1, 1, 1])).tolist() == [0, 1, -1, -2]


def test_underflow_counting():
    f = FixedPoint.binary(4, 3)  # step 1/8
    f.reset_counts()
    assert f.mul(np.array([1, -1, 1, 0]), np.array([1, 1, 8, 5])).tolist() == [0, -1, 1, 0]
    assert f.counts.underflows == 1  # only the positive 1/64 floors to 0; -1/64 floors to -1/8
    f.reset_counts()
    f.matmul(np.array([[1, 1, -1]]), np.array([[1], [2], [-3]]))  # products 1/64, 2/64, 3/64
    assert f.counts.underflows == 3


def test_div_by_zero_is_an_error():
    f = FixedPoint.binary(5, 5)
    with pytest.raises(ValueError, match="division by zero"):
        f.div(np.array([1, 2]), np.array([1, 0]))


def test_exp_zero_and_very_negative():
    for spec in ["binary:int=5,frac=5", "paper:n=1000,kc=3", "binary:int=5,frac=40", "paper:n=1048576,kc=2",
                 "binary:int=2,frac=57,rounding=nearest-even"]:
        f = parse_format(spec)
        f.reset_counts()
        assert int(f.exp(np.array([0], dtype=f.dtype))[0]) == f.scale  # e^0 = 1 exactly
        assert f.counts.as_dict() == {"saturations": 0, "underflows": 0}
        xs = [f.min_raw, max(f.min_raw, -f.scale * 200), max(f.min_raw, -f.scale * 30)]
        r = f.exp(np.array(xs, dtype=f.dtype))
        ref = [Grid.of(f).exp(x)[0] for x in xs]
        assert [int(v) for v in r] == ref
        assert f.counts.underflows == ref.count(0)
        if f.scale < 2**50:
            assert ref[:2] == [0, 0]  # e^-200 * S < 1
        f.reset_counts()
        assert int(f.exp(np.array([f.max_raw], dtype=f.dtype))[0]) == f.max_raw
        assert f.counts.saturations == 1
    g = FixedPoint.binary(0, 5)  # 1 is not representable: exp(0) saturates to 31/32
    g.reset_counts()
    assert g.exp(np.array([0])).tolist() == [31] and g.counts.saturations == 1


def test_softmax_degenerate_rows():
    f = FixedPoint.binary(5, 5)
    r = f.softmax(np.zeros((2, 4), dtype=np.int64))
    assert r.tolist() == [[8, 8, 8, 8]] * 2  # 1/4 each
    r = f.softmax(np.array([[7]]))
    assert r.tolist() == [[32]]
    with pytest.raises(ValueError, match="length 0"):
        f.softmax(np.zeros((2, 0), dtype=np.int64))
    with pytest.raises(ValueError, match="axis"):
        f.softmax(np.zeros((2, 3), dtype=np.int64), axis=2)


def test_softmax_saturated_sum():
    """Z saturates at max_raw (binary:int=2 holds values < 4): the division uses the saturated Z."""
    f = FixedPoint.binary(2, 4)
    g = Grid.of(f)
    x = [0] * 9
    f.reset_counts()
    got = f.softmax(np.array([x]))
    ref, s, u = g.softmax(x)
    assert got[0].tolist() == ref and (f.counts.saturations, f.counts.underflows) == (s, u)
    assert s == 1 and ref[0] == 16 * 16 // 63  # e = 1 each, Z = min(9, 63/16)


def test_paper_grid_beyond_int64():
    """n = 2^20, kc = 2: 2^80 raw steps per side, still exact (object arrays of Python ints)."""
    f = FixedPoint.paper(n=2**20, kc=2)
    g = Grid.of(f)
    S = f.scale
    a = [S * 2**39 + 12345, -(S * 2**39) - 7, S // 3, -S // 7, f.max_raw, f.min_raw]
    b = [S // 5 + 1, 3 * S + 1, -S * 2**20 - 3, S // 2 + 17, 1, -1]
    A, B = arr(f, a), arr(f, b)
    for op in ("add", "sub", "mul", "div"):
        f.reset_counts()
        check(f, getattr(f, op)(A, B), [getattr(g, op)(x, y) for x, y in zip(a, b)])
    f.reset_counts()
    check(f, f.exp(arr(f, [S // 3, -S * 5 - 1, S * 30])), [g.exp(x) for x in [S // 3, -S * 5 - 1, S * 30]])
    M = np.array([[S // 3, -S // 9], [S * 1000, 5]], dtype=object)
    f.reset_counts()
    got = f.matmul(M, M)
    ref, s, u = g.matmul(M.tolist(), M.tolist())
    assert got.tolist() == ref and (f.counts.saturations, f.counts.underflows) == (s, u)


def test_object_format_add_sub_saturate_exactly_and_skip_scans_only_inside_the_range():
    """Formats wider than int64 (object arrays): add/sub saturate and count exactly whether the
    operands' bounds put the result inside the range (no scan) or not; min/max of object arrays
    agree whether or not every value fits int64."""
    from exactformer.precision import parse_format
    from exactformer.precision.fixed_point import _object_minmax

    f = parse_format("paper:n=1024,kc=4")  # raw values up to ~2^80
    top = f.max_raw
    a = np.array([top - 1, 5, -3, top], dtype=object)
    b = np.array([2, 1, -1, 0], dtype=object)
    f.reset_counts()
    r = f.add(a, b)
    assert [int(v) for v in r] == [top, 6, -4, top] and f.counts.as_dict()["saturations"] == 1
    f.reset_counts()
    r = f.sub(np.array([1, 2], dtype=object), np.array([1, -3], dtype=object))
    assert [int(v) for v in r] == [0, 5] and f.counts.as_dict()["saturations"] == 0
    assert _object_minmax(np.array([3, -(1 << 70), 1 << 71], dtype=object)) == (-(1 << 70), 1 << 71)
    assert _object_minmax(np.array([[3, -7], [2, 9]], dtype=object)) == (-7, 9)
