"""matmul: numpy semantics (1-D operands, broadcast batch dims), every exact path, large bounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactformer.precision import FixedPoint, PrecisionError, _matmul, parse_format
from exactformer.precision._xp import NP
from exactformer.precision.reference import Grid


def _ref(fmt, A, B, accumulate="rounded-products"):
    g = Grid.of(fmt)
    A, B = np.asarray(A), np.asarray(B)
    shape = np.broadcast_shapes(A.shape[:-2], B.shape[:-2])
    A = np.broadcast_to(A, shape + A.shape[-2:])
    B = np.broadcast_to(B, shape + B.shape[-2:])
    out = np.empty(shape + (A.shape[-2], B.shape[-1]), dtype=object)
    sat = und = 0
    for idx in np.ndindex(*shape):
        r, s, u = g.matmul(A[idx].tolist(), B[idx].tolist(), accumulate)
        out[idx] = np.array(r, dtype=object).reshape(A.shape[-2], B.shape[-1])
        sat += s
        und += u
    return out, sat, und


@pytest.mark.parametrize("force", [None, "indicator", "elementwise"])
@pytest.mark.parametrize("shapes", [((3, 4), (4, 2)), ((2, 3, 4), (4, 5)), ((4,), (4, 3)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 1, 3, 4), (5, 4, 2)), ((1, 4), (3, 4, 2))])
def test_shapes_and_broadcasting(shapes, force):
    fmt = FixedPoint.binary(4, 3)
    rng = np.random.default_rng(0)
    A = rng.integers(-40, 40, size=shapes[0])
    B = rng.integers(-40, 40, size=shapes[1])
    _matmul.FORCE_PATH = force
    try:
        fmt.reset_counts()
        got = fmt.matmul(A, B)
    finally:
        _matmul.FORCE_PATH = None
    A2 = A[None, :] if A.ndim == 1 else A
    B2 = B[:, None] if B.ndim == 1 else B
    ref, s, u = _ref(fmt, A2, B2)
    if A.ndim == 1:
        ref = ref[..., 0, :]
    if B.ndim == 1:
        ref = ref[..., 0]
    assert np.asarray(got).shape == np.matmul(A, B).shape
    assert np.array_equal(np.asarray(got, dtype=object), ref)
    assert (fmt.counts.saturations, fmt.counts.underflows) == (s, u)
    gt = fmt.matmul(torch.from_numpy(A), torch.from_numpy(B))
    assert np.array_equal(gt.numpy(), np.asarray(got))


def test_matmul_errors():
    fmt = FixedPoint.binary(4, 3)
    with pytest.raises(PrecisionError, match="inner dimensions"):
        fmt.matmul(np.zeros((2, 3), dtype=np.int64), np.zeros((4, 2), dtype=np.int64))
    with pytest.raises(PrecisionError, match="accumulate"):
        fmt.matmul(np.zeros((2, 3), dtype=np.int64), np.zeros((3, 2), dtype=np.int64), accumulate="fast")
    with pytest.raises(PrecisionError, match="dimension"):
        fmt.matmul(np.int64(3), np.zeros((1,), dtype=np.int64))


def test_rounded_products_differs_from_exact_accumulation():
    fmt = FixedPoint.binary(4, 2)  # step 1/4
    a = np.array([[1, 1, 1, 1]])  # 1/4 each
    b = np.array([[1], [1], [1], [1]])
    assert fmt.matmul(a, b).tolist() == [[0]]  # each product 1/16 floors to 0
    assert fmt.matmul(a, b, accumulate="exact").tolist() == [[1]]  # 4/16 = 1/4


def test_fast_path_is_one_integer_matmul():
    """One operand integer-valued: products are on the grid, result = (a/S) @ b exactly; large k and
    raw values force the k-chunked / limb-split BLAS path."""
    fmt = FixedPoint.binary(5, 40)
    S = fmt.scale
    rng = np.random.default_rng(1)
    a = rng.integers(-(2**44), 2**44, size=(3, 5000))
    b = rng.integers(-1, 2, size=(5000, 2)) * S
    fmt.reset_counts()
    got = fmt.matmul(a, b)
    exact = (a.astype(object) @ (b // S).astype(object))
    expect = np.clip(exact, fmt.min_raw, fmt.max_raw)
    assert np.array_equal(got.astype(object), expect)
    assert fmt.counts.saturations == int(np.count_nonzero(exact != expect))
    assert np.array_equal(fmt.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy(), got)


@pytest.mark.parametrize("ab, bb, k", [(1, 2**45, 1 << 14), (2**40, 2**40, 7), (2**60, 2**60, 3), (2**30, 3, 1 << 12),
                                        (2**52, 2**52, 64)])
def test_imatmul_exact(ab, bb, k):
    rng = np.random.default_rng(k)
    A = rng.integers(-ab, ab, size=(2, k), endpoint=True)
    B = rng.integers(-bb, bb, size=(k, 3), endpoint=True)
    A[0, 0], B[0, 0] = -ab, -bb
    C = _matmul.imatmul(A, B, ab, bb, NP)
    assert np.array_equal(np.asarray(C, dtype=object), A.astype(object) @ B.astype(object))
    if not (isinstance(C, np.ndarray) and C.dtype == object):
        from exactformer.precision._xp import torch_xp

        Ct = _matmul.imatmul(torch.from_numpy(A), torch.from_numpy(B), ab, bb, torch_xp("cpu"))
        assert np.array_equal(Ct.numpy(), C)


def test_indicator_path_large():
    """The cost model picks the indicator path for a big product with coarse weights."""
    fmt = FixedPoint.binary(5, 5)
    S = fmt.scale
    rng = np.random.default_rng(2)
    x = rng.integers(-4 * S, 4 * S, size=(300, 64))
    W = rng.choice([-S // 2, 0, S // 2, S // 4, S + 3], size=(64, 40))
    fmt.reset_counts()
    got = fmt.matmul(x, W)
    c = fmt.counts.as_dict()
    _matmul.FORCE_PATH = "elementwise"
    try:
        fmt.reset_counts()
        ref = fmt.matmul(x, W)
    finally:
        _matmul.FORCE_PATH = None
    assert np.array_equal(got, ref) and c == fmt.counts.as_dict()
    r, s, u = _ref(fmt, x[:5], W)
    assert np.array_equal(got[:5].astype(object), r)


def test_paper_decimal_scale_matmul():
    fmt = parse_format("paper:n=1000,kc=2")
    rng = np.random.default_rng(4)
    S = fmt.scale
    A = rng.integers(-3 * S, 3 * S, size=(2, 3, 6))
    B = rng.integers(-3 * S, 3 * S, size=(6, 2))
    for acc in ("rounded-products", "exact"):
        fmt.reset_counts()
        got = fmt.matmul(A, B, accumulate=acc)
        ref, s, u = _ref(fmt, A, B, acc)
        assert np.array_equal(got.astype(object), ref) and (fmt.counts.saturations, fmt.counts.underflows) == (s, u)


@pytest.mark.parametrize("force", [None, "indicator", "elementwise"])
def test_empty_shapes(force):
    f = FixedPoint.binary(4, 3)
    _matmul.FORCE_PATH = force
    try:
        for sa, sb in [((0, 3), (3, 2)), ((2, 0), (0, 3)), ((2, 3), (3, 0)), ((0, 2, 3), (3, 2))]:
            a, b = np.full(sa, 5, dtype=np.int64), np.full(sb, 3, dtype=np.int64)
            r = f.matmul(a, b)
            assert r.shape == np.matmul(a, b).shape and r.dtype == np.int64 and not r.any()
            assert np.array_equal(f.matmul(torch.from_numpy(a), torch.from_numpy(b)).numpy(), r)
    finally:
        _matmul.FORCE_PATH = None
    assert f.softmax(np.zeros((0, 3), dtype=np.int64)).shape == (0, 3)
    assert f.exp(np.zeros((0,), dtype=np.int64)).shape == (0,)
