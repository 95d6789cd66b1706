"""Prepared right operands give exactly fmt.matmul, with the same event counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from exactformer.precision import FixedPoint, Prepared


CASES = [  # (format, b entries are multiples of S?, max |a| raw)
    (FixedPoint.binary(int_bits=5, frac_bits=5), True, 40),     # float32 path
    (FixedPoint.binary(int_bits=20, frac_bits=8), True, 1 << 20),  # float64 path
    (FixedPoint.binary(int_bits=5, frac_bits=5), False, 40),    # off the integer grid: fmt.matmul
    (FixedPoint.binary(int_bits=30, frac_bits=30), True, 1 << 50),  # beyond 2^53: fmt.matmul
]


@pytest.mark.parametrize("fmt,on_grid,amax", CASES)
@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_prepared_equals_matmul(fmt, on_grid, amax, backend):
    rng = np.random.default_rng(0)
    S = int(fmt.scale)
    hmax = max(1, min(fmt.max_raw // S, 3))
    b = rng.integers(-hmax, hmax + 1, (17, 9)) * (S if on_grid else 1) + (0 if on_grid else rng.integers(0, S, (17, 9)))
    b = np.clip(b, fmt.min_raw, fmt.max_raw)
    a = rng.integers(-amax, amax + 1, (2, 5, 17))
    if backend == "torch":
        a, b = torch.as_tensor(a), torch.as_tensor(b)
    fmt.reset_counts()
    want = fmt.matmul(a, b)
    c_want = fmt.counts.as_dict()
    prep = Prepared(fmt, b)
    fmt.reset_counts()
    got = prep.matmul(a)
    assert fmt.counts.as_dict() == c_want
    assert np.array_equal(np.asarray(got), np.asarray(want))
    assert (prep.h is not None) == on_grid


def test_saturation_is_counted():
    fmt = FixedPoint.binary(int_bits=3, frac_bits=2)
    b = np.full((4, 3), 7 * 4)  # 7.0
    a = np.full((1, 4), 7 * 4)
    fmt.reset_counts()
    want = fmt.matmul(a, b)
    c = fmt.counts.as_dict()
    fmt.reset_counts()
    assert np.array_equal(Prepared(fmt, b).matmul(a), want) and fmt.counts.as_dict() == c and c["saturations"] == 3
