"""The exact int64 kernels at their limits, against Python integers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.precision import _wide
from exactformer.precision._xp import NP, torch_xp

L62 = (1 << 62) - 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-L62, L62), st.integers(-L62, L62)), min_size=1, max_size=20))
def test_mul_wide(pairs):
    x = np.array([p[0] for p in pairs], dtype=np.int64)
    y = np.array([p[1] for p in pairs], dtype=np.int64)
    for xp, conv in ((NP, lambda a: a), (torch_xp("cpu"), torch.from_numpy)):
        hi, lo = _wide.mul_wide(conv(x), conv(y))
        for (a, b), h, l in zip(pairs, np.asarray(hi).tolist(), np.asarray(lo).tolist()):
            assert a * b == h * 2**62 + l and 0 <= l < 2**62


def _expect(x, y, d, nearest):
    p = x * y
    q = p // d
    if nearest:
        r = p - q * d
        if 2 * r > d or (2 * r == d and q % 2):
            q += 1
    if abs(q) >= 2**61:
        return None  # sentinel territory: only the sign matters
    return q


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**60), 2**60), st.integers(-(2**60), 2**60), st.integers(1, 2**60)),
                min_size=1, max_size=20), st.booleans(), st.sampled_from(["array", "pow2", "scalar"]))
def test_muldiv(triples, nearest, dkind):
    x = np.array([t[0] for t in triples], dtype=np.int64)
    y = np.array([t[1] for t in triples], dtype=np.int64)
    if dkind == "array":
        d = np.array([t[2] for t in triples], dtype=np.int64)
        ds = [t[2] for t in triples]
        dmax = max(ds)
    else:
        dv = 1 << (triples[0][2].bit_length() - 1) if dkind == "pow2" else triples[0][2]
        d, ds, dmax = dv, [dv] * len(triples), dv
    xb = max(abs(int(v)) for v in x)
    yb = max(abs(int(v)) for v in y)
    for xp, conv in ((NP, lambda a: a), (torch_xp("cpu"), lambda a: torch.from_numpy(a) if isinstance(a, np.ndarray) else a)):
        q = _wide.muldiv(conv(x), conv(y), conv(d), nearest, xp, xb, yb, dmax)
        for (a, b, _), dd, got in zip(triples, ds, np.asarray(q).tolist()):
            e = _expect(a, b, dd, nearest)
            if e is None:
                assert abs(got) >= 2**61 and (got > 0) == (a * b > 0)
            else:
                assert got == e


@pytest.mark.parametrize("bounds", [(2**20, 2**20), (2**40, 2**12), (2**31, 2**31), (2**60, 2**60), (2**60, 1)])
def test_muldiv_paths_by_bound(bounds):
    """Each bound regime (float-corrected, int64, shift, wide) is exact at the extremes."""
    xb, yb = bounds
    rng = np.random.default_rng(xb % 1000 + yb % 7)
    x = np.concatenate([rng.integers(-xb, xb, 50, endpoint=True), [xb, -xb, 0, 1, -1]]).astype(np.int64)
    y = np.concatenate([rng.integers(-yb, yb, 50, endpoint=True), [yb, -yb, 0, -1, 1]]).astype(np.int64)
    for d in (1, 3, 2**20, 10**9, 2**53 + 1, 2**60):
        for nearest in (False, True):
            q = _wide.muldiv(x, y, d, nearest, NP, xb, yb, d)
            for a, b, got in zip(x.tolist(), y.tolist(), q.tolist()):
                e = _expect(a, b, d, nearest)
                assert (abs(got) >= 2**61 and (got > 0) == (a * b > 0)) if e is None else got == e
