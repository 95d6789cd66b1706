"""The exp decision procedure: hard inputs (float64 exp within one ulp of a grid point), the exact
stage, the table path, and the library-accuracy assumption behind the float stage's error bound."""

from __future__ import annotations

from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch

from exactformer.precision import _exp, parse_format
from exactformer.precision.reference import Grid, exp_round

# Found by scanning random inputs: float64 exp(x/S) lies within one ulp of a grid point k/S, and the
# true e^(x/S)*S - k is the listed sign (negative: the float value rounds up onto the grid point while
# the true floor is k - 1). Columns: x, k, sign of (e^(x/S) S - k).
NEAR_ULP = {
    "binary:int=5,frac=40": [
        (-383957329437, 775427297185, -1), (-481825589060, 709388665782, +1),
        (-170744119764, 941364589152, -1), (-346948924251, 801971584996, -1),
        (-589564677042, 643174090795, +1), (-109776348140, 995037453778, +1),
        (2413226390344, 9871805084247, +1), (2632544960236, 12051050083309, -1),
        (2660589550699, 12362382673924, -1), (3078102216301, 18072361164303, -1),
    ],
    "paper:n=1024,kc=4": [  # S = 2^40, raw range 2^80: object mode
        (-144629726687, 963990476402, -1), (-430561514105, 743246661111, -1),
        (-1180363401210, 375811288790, +1), (-779726516703, 541024329767, +1),
        (-4207473831205, 23949470813, +1),
    ],
}


@pytest.mark.parametrize("spec", sorted(NEAR_ULP))
def test_exp_within_one_ulp_of_grid_point(spec):
    fmt = parse_format(spec)
    S = fmt.scale
    g = Grid.of(fmt)
    cases = NEAR_ULP[spec]
    xs = [c[0] for c in cases]
    for x, k, sign in cases:
        e = np.exp(np.float64(x) / float(S))
        assert abs(Fraction(float(e)) - Fraction(k, S)) <= 2 * Fraction(float(np.spacing(e)))  # the hard case
        mpmath.mp.prec = 200
        assert (mpmath.exp(mpmath.mpf(x) / S) * S - k > 0) == (sign > 0)
        assert g.exp(x)[0] == (k if sign > 0 else k - 1)
    before = _exp.STATS["exact_resolutions"]
    _exp._cache.clear()
    fmt.reset_counts()
    got = fmt.exp(np.array(xs, dtype=fmt.dtype))
    assert [int(v) for v in got] == [g.exp(x)[0] for x in xs]
    assert _exp.STATS["exact_resolutions"] - before >= len(xs)  # every one went through the exact stage
    if fmt.int64_mode:
        got_t = fmt.exp(torch.tensor(xs))
        assert got_t.tolist() == [int(v) for v in got]


def test_exp_nearest_even_large_scale():
    fmt = parse_format("binary:int=5,frac=40,rounding=nearest-even")
    g = Grid.of(fmt)
    rng = np.random.default_rng(5)
    xs = np.concatenate([rng.integers(-30 * fmt.scale, 3 * fmt.scale, 40), [c[0] for c in NEAR_ULP["binary:int=5,frac=40"]]])
    got = fmt.exp(xs)
    assert got.tolist() == [g.exp(int(x))[0] for x in xs]


def test_exact_stage_matches_rational_reference():
    rng = np.random.default_rng(0)
    for S, nearest in [(2**20, False), (10**9, True), (3**30, False), (2**57, True)]:
        cap = S * 2**3
        for x in rng.integers(-30 * S, 3 * S, 12).tolist():
            assert _exp.exact_exp_round(int(x), S, nearest, cap) == exp_round(Fraction(int(x), S), S, nearest, cap)


def test_exact_stage_ignores_mpmath_working_precision():
    """Regression: interval endpoints must be read exactly, not through mp.prec (53 bits)."""
    x, S = -86606632543888050, 2**57
    old = mpmath.mp.prec
    try:
        for prec in (53, 300):
            mpmath.mp.prec = prec
            _exp._cache.clear()
            assert _exp.exact_exp_round(x, S, True, 2**59) == 79016655740990377
    finally:
        mpmath.mp.prec = old


def test_exp_table_matches_float_stage():
    """Small scales use a per-format table built by the exact procedure; compare with the direct path."""
    for spec in ["binary:int=5,frac=5", "binary:int=3,frac=10,rounding=nearest-even", "paper:n=100,kc=1"]:
        fmt = parse_format(spec)
        tab = fmt._exp_table(_exp_np())
        assert tab is not None
        x_lo, table, W = tab
        xs = np.arange(max(fmt.min_raw, x_lo - 5), min(fmt.max_raw, x_lo + W + 5) + 1)
        direct = _exp.exp_int64(xs, fmt.scale, fmt.max_raw, fmt.nearest, _exp_np())
        fmt.reset_counts()
        assert np.array_equal(fmt._exp_raw(_exp_np(), xs), direct)
        g = Grid.of(fmt)
        sample = xs[:: max(1, len(xs) // 200)]
        assert [int(v) for v in fmt.exp(sample)] == [g.exp(int(x))[0] for x in sample]


def test_exp_table_shared_only_between_equal_formats_and_small_inputs_agree():
    """The exact table is cached by everything it depends on (scale, raw range, rounding): a format
    rebuilt from the same spec shares it, formats that differ in any of those do not, and a few
    values rounded without the table equal the same values looked up in it, in either order."""
    a, b = parse_format("binary:int=5,frac=6"), parse_format("binary:int=5,frac=6")
    assert a._exp_table(_exp_np())[1] is b._exp_table(_exp_np())[1]
    for other in ["binary:int=6,frac=6", "binary:int=5,frac=7", "binary:int=5,frac=6,rounding=nearest-even"]:
        assert parse_format(other)._exp_table(_exp_np())[1] is not a._exp_table(_exp_np())[1]
    xs = np.arange(a.min_raw, a.max_raw + 1)
    few = xs[:: max(1, len(xs) // 50)]
    fresh = parse_format("binary:int=5,frac=6")
    small_first = [int(v) for v in fresh.exp(few)]  # direct path: no table yet on this object
    assert "_exp_tables" not in fresh.__dict__
    full = fresh.exp(xs)  # table path
    assert small_first == [int(v) for v in full[:: max(1, len(xs) // 50)]] == [int(v) for v in fresh.exp(few)]


def _exp_np():
    from exactformer.precision._xp import NP

    return NP


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_library_exp_within_assumed_ulps(backend):
    """The float stage assumes the library exp is within 8 ulp; measure it (expect <= 1 ulp)."""
    rng = np.random.default_rng(1)
    t = np.concatenate([rng.uniform(-45, 0, 1500), rng.uniform(-1, 1, 300), rng.uniform(0, 30, 200)])
    e = np.exp(t) if backend == "numpy" else torch.exp(torch.from_numpy(t)).numpy()
    mpmath.mp.prec = 120
    worst = 0.0
    for ti, ei in zip(t.tolist(), e.tolist()):
        exact = mpmath.exp(mpmath.mpf(ti))
        worst = max(worst, float(abs(mpmath.mpf(ei) - exact) / float(np.spacing(ei))))
    assert worst <= 8.0, worst
