"""Float64 / Float32: plain float semantics through the same interface."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from exactformer.precision import Float32, Float64, PrecisionError, RawTypeError


def test_float64_ops_match_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    F = Float64
    assert np.array_equal(F.add(a, a), a + a) and np.array_equal(F.mul(a, a), a * a)
    assert np.array_equal(F.exp(a), np.exp(a)) and np.array_equal(F.relu(a), np.maximum(a, 0))
    assert np.array_equal(F.matmul(a, b), a @ b) and np.array_equal(F.sum(a, axis=-1), a.sum(-1))
    s = F.softmax(a)
    e = np.exp(a - a.max(-1, keepdims=True))
    assert np.array_equal(s, e / e.sum(-1, keepdims=True))
    t = F.softmax(torch.from_numpy(a))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    assert np.allclose(t.numpy(), s)
    assert F.quantize([Fraction(1, 3)]).tolist() == [1 / 3]
    assert F.to_fraction(np.array([0.5])).tolist() == [Fraction(1, 2)]
    assert F.quantize(3) == 3.0


def test_float32_dtype_and_counts():
    F = Float32
    r = F.mul(np.array([1e30, 1e-30], dtype=np.float32), np.array([1e30, 1e-30], dtype=np.float32))
    assert r.dtype == np.float32
    F.reset_counts()
    F.mul(np.array([1e30, 1e-30], dtype=np.float32), np.array([1e30, 1e-30], dtype=np.float32))
    assert F.counts.as_dict() == {"saturations": 1, "underflows": 1}
    F.reset_counts()
    F.exp(np.array([-200.0, 0.0]))
    assert F.counts.underflows == 1
    F.reset_counts()


def test_float_bad_input():
    with pytest.raises(PrecisionError, match="finite"):
        Float64.quantize([np.nan])
    with pytest.raises(PrecisionError, match="finite"):
        Float32.quantize([1e300])  # overflows float32
    with pytest.raises(RawTypeError):
        Float64.add(np.array(["x"]), 1)
    with pytest.raises(PrecisionError, match="accumulate"):
        Float64.matmul(np.ones((1, 1)), np.ones((1, 1)), accumulate="bogus")
    with pytest.raises(PrecisionError, match="division by zero"):
        Float64.div(np.ones(2), np.array([1.0, 0.0]))
