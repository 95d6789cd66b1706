"""Backends agree bit for bit: numpy, torch CPU and (marked ``cuda``) torch CUDA, counts included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.precision import FixedPoint, _matmul, parse_format

SPECS = [
    "binary:int=5,frac=5",
    "binary:int=3,frac=4,rounding=nearest-even",
    "binary:int=5,frac=20",
    "binary:int=5,frac=40",
    "binary:int=30,frac=30",
    "binary:int=2,frac=57,rounding=nearest-even",
    "binary:int=60,frac=0",
    "paper:n=1000,kc=3",
    "paper:n=4096,kc=2",
]

OPS = ["add", "sub", "mul", "div", "exp", "relu", "neg", "sum", "softmax", "matmul", "matmul-exact",
       "matmul-batched"]


def _gen(fmt, rng, shape):
    lo, hi, S = fmt.min_raw, fmt.max_raw, fmt.scale
    a = rng.integers(lo, hi, size=shape, endpoint=True)
    b = np.clip(rng.integers(-4 * S, 4 * S, size=shape, endpoint=True), lo, hi)
    c = np.clip(rng.choice([0, S, -S, S // 2, 3 * S // 4], size=shape), lo, hi)
    pick = rng.integers(0, 3, size=shape)
    return np.where(pick == 0, a, np.where(pick == 1, b, c)).astype(np.int64)


def _call(fmt, op, args):
    if op == "matmul-exact":
        return fmt.matmul(*args, accumulate="exact")
    if op == "matmul-batched":
        return fmt.matmul(*args)
    return getattr(fmt, op)(*args)


def _args(fmt, op, rng):
    if op in ("matmul", "matmul-exact"):
        return (_gen(fmt, rng, (4, 6)), _gen(fmt, rng, (6, 3)))
    if op == "matmul-batched":
        return (_gen(fmt, rng, (2, 3, 5)), _gen(fmt, rng, (5, 2)))
    if op in ("add", "sub", "mul"):
        return (_gen(fmt, rng, (3, 5)), _gen(fmt, rng, (3, 5)))
    if op == "div":
        b = _gen(fmt, rng, (3, 5))
        return (_gen(fmt, rng, (3, 5)), np.where(b == 0, 1, b))
    return (_gen(fmt, rng, (3, 5)),)


def _compare(device, spec, op, seed, force=None):
    fmt = parse_format(spec)
    rng = np.random.default_rng(seed)
    args = _args(fmt, op, rng)
    _matmul.FORCE_PATH = force
    try:
        fmt.reset_counts()
        rn = _call(fmt, op, args)
        cn = fmt.counts.as_dict()
        fmt.reset_counts()
        rt = _call(fmt, op, [torch.from_numpy(a).to(device) for a in args])
        ct = fmt.counts.as_dict()
    finally:
        _matmul.FORCE_PATH = None
    assert isinstance(rt, torch.Tensor) and rt.dtype == torch.int64 and rt.device.type == torch.device(device).type
    assert np.array_equal(np.asarray(rn), rt.cpu().numpy()), (spec, op)
    assert cn == ct


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SPECS), st.sampled_from(OPS), st.integers(0, 2**31), st.sampled_from([None, "indicator", "elementwise"]))
def test_numpy_vs_torch_cpu(spec, op, seed, force):
    _compare("cpu", spec, op, seed, force)


def test_torch_returns_same_kind():
    f = FixedPoint.binary(5, 5)
    a = torch.tensor([[16, -40]], dtype=torch.int32)
    r = f.exp(a)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.int64 and r.shape == (1, 2)
    r = f.add(a, np.array([[1, 1]]))  # numpy operands join the tensor's device
    assert isinstance(r, torch.Tensor) and r.tolist() == [[17, -39]]
    assert isinstance(f.quantize(torch.tensor([0.5])), torch.Tensor)


def test_torch_object_fallback():
    """When an intermediate exceeds int64 on torch, the op runs through the numpy object path and
    comes back as an int64 tensor (exact, identical)."""
    f = FixedPoint.binary(60, 0)  # S = 1, raw up to 2^60: sums of products exceed int64
    a = np.full((2, 4), 2**30, dtype=np.int64)
    b = np.full((4, 2), 2**31, dtype=np.int64)
    f.reset_counts()
    rn = f.matmul(a, b, accumulate="exact")
    rt = f.matmul(torch.from_numpy(a), torch.from_numpy(b), accumulate="exact")
    assert rt.dtype == torch.int64 and np.array_equal(rn, rt.numpy())
    assert f.counts.saturations == 8 and int(rn[0, 0]) == f.max_raw


def test_large_softmax_rows_vectorised():
    """A (batch, n) softmax is one call; threads and chunks do not change the result."""
    from exactformer.precision import fixed_point

    f = FixedPoint.binary(5, 8)
    rng = np.random.default_rng(3)
    x = rng.integers(-6 * f.scale, 6 * f.scale, size=(40, 3001))
    f.reset_counts()
    r1 = f.softmax(x)
    c1 = f.counts.as_dict()
    old = fixed_point.THREADS, fixed_point.SOFTMAX_CHUNK
    try:
        fixed_point.THREADS, fixed_point.SOFTMAX_CHUNK = 1, 1 << 12
        f.reset_counts()
        r2 = f.softmax(x)
        c2 = f.counts.as_dict()
    finally:
        fixed_point.THREADS, fixed_point.SOFTMAX_CHUNK = old
    assert np.array_equal(r1, r2) and c1 == c2
    rt = f.softmax(torch.from_numpy(x))
    assert np.array_equal(r1, rt.numpy())
    for i in (0, 17, 39):  # rows equal the one-row computation
        assert np.array_equal(f.softmax(x[i]), r1[i])


# ---- CUDA ----------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize("spec", SPECS)
def test_numpy_vs_torch_cuda(spec):
    for op in OPS:
        for seed in range(3):
            _compare("cuda", spec, op, seed)
        if op.startswith("matmul") and "nearest" not in spec:
            _compare("cuda", spec, op, 7, force="indicator")
            _compare("cuda", spec, op, 7, force="elementwise")


@pytest.mark.cuda
@cuda
def test_cuda_large_softmax_and_matmul():
    f = FixedPoint.binary(5, 10)
    rng = np.random.default_rng(0)
    x = rng.integers(-8 * f.scale, 8 * f.scale, size=(64, 65537))
    assert np.array_equal(f.softmax(x), f.softmax(torch.from_numpy(x).cuda()).cpu().numpy())
    a = rng.integers(0, f.scale + 1, size=(8, 1, 65536))
    v = rng.integers(0, 2, size=(8, 65536, 8)) * f.scale
    assert np.array_equal(f.matmul(a, v), f.matmul(torch.from_numpy(a).cuda(), torch.from_numpy(v).cuda()).cpu().numpy())
    g = FixedPoint.paper(1000, 3)
    y = rng.integers(-20 * g.scale, 0, size=(16, 4097))
    assert np.array_equal(g.softmax(y), g.softmax(torch.from_numpy(y).cuda()).cpu().numpy())
