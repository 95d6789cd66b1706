"""bfloat16, float16 and float8: the grids, what torch computes in them on the CPU (float32
accumulation, one rounding per stored result), the certificates' enclosures against torch, and
certified models checked against the torch module on every input, with mutants refuted."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import exactformer as xf
from exactformer.constructions.export.floats import ArithmeticWarning
from exactformer.precision import BFloat16, Float16, Float8E4M3, Float8E5M2
from exactformer.precision.boxes import Box, FloatArithmetic
from exactformer.precision.floats import GRIDS, REDUCED, round_via_float32

from mutants import shift_keys

TORCH = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FORMATS = {"bfloat16": BFloat16, "float16": Float16, "float8_e4m3": Float8E4M3, "float8_e5m2": Float8E5M2}


def _inside(value, box: Box) -> bool:
    v = np.asarray(value, dtype=np.float64)
    return bool(np.all(np.asarray(box.lo) <= v) and np.all(v <= np.asarray(box.hi)))


def _grid_values(name: str, rng: np.random.Generator, size: int, scale: float = 1.0) -> np.ndarray:
    return round_via_float32(rng.normal(size=size) * scale, GRIDS[name])


# ------------------------------------------------------------------------------------------------
# the grids
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REDUCED + ("float32",))
def test_rounding_is_torchs_conversion(name: str):
    """Round to nearest (ties to even), subnormals, overflow (inf, or float8_e4m3's clamp) and the
    double -> float32 -> dtype path: equal to torch's conversion on every value, ties included."""
    g = GRIDS[name]
    rng = np.random.default_rng(0)
    x = rng.normal(size=30000) * 10.0 ** rng.integers(-45, 39, 30000)
    grid = np.unique(round_via_float32(x, g))
    grid = grid[np.isfinite(grid)]
    ties = (grid[1:] + grid[:-1]) / 2  # exact midpoints (float64 holds them)
    edges = [g.max, g.overflow_threshold, np.nextafter(g.overflow_threshold, 0), g.tiny, g.tiny / 2, 3 * g.tiny / 2]
    x = np.concatenate([x, ties, edges, -np.array(edges), [0.0]])
    tdt = getattr(torch, g.torch_name)
    want = torch.as_tensor(x, dtype=torch.float64).to(tdt).double().numpy()
    assert np.array_equal(round_via_float32(x, g), want)
    with np.errstate(over="ignore"):  # beyond float32: inf, as torch converts it
        f = x.astype(np.float32).astype(np.float64)
    assert np.array_equal(g.round(f), torch.as_tensor(f, dtype=torch.float32).to(tdt).double().numpy())
    # directed rounding brackets the value (clamped where the format clamps) and lands on the grid
    down, up = g.round(x, "down"), g.round(x, "up")
    held = np.clip(x, -g.max, g.max) if g.overflow == "saturate" else x
    assert np.all(down <= held) and np.all(held <= up)
    fin = np.isfinite(down) & np.isfinite(up)
    assert np.array_equal(g.round(down[fin]), down[fin]) and np.array_equal(g.round(up[fin]), up[fin])


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_format_ops_are_torchs(name: str):
    """The formats' elementwise operations equal torch's on the CPU (float32, then one rounding)."""
    F, tdt = FORMATS[name], TORCH[name]
    rng = np.random.default_rng(1)
    a, b = _grid_values(name, rng, 5000, 30.0), _grid_values(name, rng, 5000, 30.0)
    ta, tb = torch.as_tensor(a).to(tdt), torch.as_tensor(b).to(tdt)
    for ours, theirs in ((F.add(a, b), ta + tb), (F.sub(a, b), ta - tb), (F.mul(a, b), ta * tb),
                         (F.relu(a), torch.relu(ta)), (F.exp(a / 16), torch.exp(ta / 16))):
        assert np.array_equal(np.asarray(ours, np.float64), theirs.double().numpy())
    assert F.quantize([Fraction(1, 3)]).tolist() == [float(torch.tensor(1 / 3, dtype=torch.float64).to(tdt))]
    assert F.represents(Fraction(1, 2)) and not F.represents(Fraction(1, 3))


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("K", [2, 16, 256, 1000, 4097])
def test_matrix_products_accumulate_in_float32(name: str, K: int):
    """The accumulation precision the certificates state: 1 + (K - 1) * u/2 summed in torch's
    matmul, einsum (as the module contracts q, k, v and W_O), bmm (pattern @ v) and softmax-free
    sums gives the float32 sum rounded once to the dtype, not the dtype's own running sum (which
    would stay at 1)."""
    tdt, t = TORCH[name], GRIDS[name].digits
    small = 2.0 ** -(t + 1)
    exact = 1 + (K - 1) * small
    once = float(torch.tensor(np.float32(exact)).to(tdt))
    assert once != 1.0 or K == 2
    a = torch.ones(3, K, dtype=tdt)
    w = torch.full((K, 5), small, dtype=tdt)
    w[0] = 1
    x = torch.ones(2, 4, K, dtype=tdt)
    W = w.T[None].expand(3, 5, K).transpose(1, 2).contiguous()  # [H, K, 5]
    z = torch.ones(2, 3, 4, K, dtype=tdt)
    WO = torch.full((3, K, 6), small, dtype=tdt)
    WO[0, 0] = 1
    p = torch.full((2, 3, 4, K), small, dtype=tdt)
    p[..., 0] = 1
    v = torch.ones(2, 3, K, 7, dtype=tdt)
    for out, value in (((a @ w), once), (torch.einsum("btd,hde->bhte", x, W), once), ((p @ v), once),
                       (torch.einsum("bhte,hed->btd", z, WO), float(torch.tensor(np.float32(1 + (3 * K - 1) * small)).to(tdt)))):
        assert torch.all(out.double() == value), (out.flatten()[:3], value)
    # the certificate's sum: the float32 sum rounded once lies in its box
    arith = FloatArithmetic(name)
    terms = np.r_[1.0, np.full(K - 1, small)]
    assert _inside(once, arith.sum(Box(terms, terms)))


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_softmax_runs_in_float32(name: str):
    """torch's CPU softmax in bfloat16/float16 computes in float32 and rounds the weights: equal to
    float32's softmax rounded, within one step, on rows where the dtype's own arithmetic is far off."""
    tdt = TORCH[name]
    s = torch.full((1, 1000), -3.0, dtype=tdt)
    s[0, 0] = 0
    ours = torch.softmax(s, -1)
    via32 = torch.softmax(s.float(), -1).to(tdt)
    assert torch.equal(ours, via32)


# ------------------------------------------------------------------------------------------------
# the enclosures
# ------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 64), st.integers(1, 12), st.integers(0, 2**31), st.sampled_from(["bfloat16", "float16"]))
def test_matmul_box_encloses_torch(n: int, m: int, seed: int, dtype: str):
    rng = np.random.default_rng(seed)
    arith, tdt = FloatArithmetic(dtype), TORCH[dtype]
    W = arith._cast(rng.integers(-8, 9, size=(n, m)) / 4)
    lo = arith._cast(rng.normal(size=(3, n)))
    hi = arith._cast(lo + np.abs(rng.normal(size=(3, n))) * 0.05)
    box = arith.matmul(Box(lo, hi), W)
    Wt = torch.as_tensor(W).to(tdt)
    for x in (lo, hi, arith._cast(lo + (hi - lo) * rng.random(size=lo.shape))):
        xt = torch.as_tensor(x).to(tdt)
        for out in (xt @ Wt, torch.einsum("bn,nm->bm", xt, Wt), torch.bmm(xt[None], Wt[None])[0]):
            assert _inside(out.double().numpy(), box)
    aff = arith.affine(Box(lo, lo), W, arith._cast(np.full(m, 0.3)))
    assert _inside((torch.as_tensor(lo).to(tdt) @ Wt + torch.as_tensor(np.full(m, 0.3)).to(tdt)).double().numpy(), aff)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 400), st.integers(0, 2**31), st.sampled_from(["bfloat16", "float16"]), st.floats(0.5, 30.0))
def test_row_weights_enclose_torch_softmax(T: int, seed: int, dtype: str, gap: float):
    rng = np.random.default_rng(seed)
    arith, tdt = FloatArithmetic(dtype), TORCH[dtype]
    levels = arith._cast(np.sort(rng.uniform(-20, 0, size=4)))
    target = arith._cast(np.array(levels.max() + gap))
    idx = rng.integers(0, 4, size=T - 1)
    counts = np.bincount(idx, minlength=4)
    w_t, w_l = arith.row_weights(Box(target[None], target[None]), Box(levels[None], levels[None]), counts[None])
    row = np.concatenate([[target], levels[idx]])
    for perm in (np.arange(T), rng.permutation(T)):
        p = torch.softmax(torch.as_tensor(row[perm]).to(tdt), dim=-1).double().numpy()
        inv = np.argsort(perm)
        assert _inside(p[inv[0]], Box(np.asarray(w_t.lo)[0], np.asarray(w_t.hi)[0]))
        assert _inside(p[inv[1:]], Box(np.asarray(w_l.lo)[0][idx], np.asarray(w_l.hi)[0][idx]))
    # T equal logits: the uniform weight
    u = arith.uniform_weight(T)
    assert _inside(torch.softmax(torch.zeros(T, dtype=tdt), -1).double().numpy(), u)


@pytest.mark.parametrize("name", REDUCED)
def test_sum_box_encloses_float32_accumulation(name: str):
    """A sum of dtype values accumulated in float32 in several orders, rounded once to the dtype
    (float8: the emulated forward pass), lies in the sum box."""
    rng = np.random.default_rng(2)
    arith, g = FloatArithmetic(name), GRIDS[name]
    for n in (1, 7, 100, 3000):
        terms = _grid_values(name, rng, n, 4.0)
        box = arith.sum(Box(terms, terms))
        t32 = terms.astype(np.float32)
        for order in (np.arange(n), np.arange(n)[::-1], rng.permutation(n)):
            acc = np.float32(0)
            for v in t32[order]:
                acc = np.float32(acc + v)
            assert _inside(g.round(np.float64(acc)), box)
        assert _inside(g.round(np.float64(np.sum(t32))), box)


# ------------------------------------------------------------------------------------------------
# models
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name,kw", [("index-lookup", dict(n=5, alphabet=3)), ("equality", dict(n=8)),
                                     ("inequality", dict(n=8))])
def test_certified_builds_are_right_in_torch_on_every_input(name: str, kw: dict, dtype: str):
    """Designed for the dtype, certified in it, and the torch module in that dtype answers every
    one of the inputs right (the certificate's claim, checked by enumeration)."""
    m = xf.build(name, **kw, arithmetics=dtype)
    assert dtype in m.params["arithmetics"].value
    r = xf.verify(m, mode="certify", arithmetic=dtype)
    assert r.passed and r.precision == dtype and r.precision_bits == 16, r.reason
    e = xf.verify(m, mode="exhaustive", arithmetic=dtype)
    assert e.passed and e.inputs_covered == m.task.count(m.compiled), e.counterexample


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mutant_is_rejected_by_every_mode(dtype: str):
    """A model whose keys read the wrong position (each position compared with the wrong partner):
    the certificate finds a counterexample that torch in the dtype gets wrong, and exhaustive and
    sample runs fail."""
    m = xf.build("equality", n=8, arithmetics=dtype)
    bad = shift_keys(m.compiled)
    for mode, kw in (("certify", {}), ("exhaustive", {}), ("sample", dict(samples=50, seed=1))):
        r = xf.verify(bad, mode=mode, arithmetic=dtype, **kw)
        assert not r.passed and r.counterexample is not None and r.counterexample["arithmetic"] == dtype, (mode, r.reason)


def test_fixed_point_only_eta_is_refuted_in_bfloat16_by_torch():
    """eta "minimal" relies on the format's exp rounding small weights to 0; bfloat16 keeps them:
    the bfloat16 certificate's counterexample is answered wrong by the torch bfloat16 module."""
    m = xf.build("index-lookup", n=64, eta="minimal")
    assert xf.verify(m, mode="certify").passed
    r = xf.verify(m, mode="certify", arithmetic="bfloat16")
    assert not r.passed and r.counterexample is not None
    tokens = m.encode(tuple(r.counterexample["input"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArithmeticWarning)
        module = m.to_torch(torch.bfloat16)
    with torch.no_grad():
        logits = module(torch.as_tensor(tokens[None]))[0, -1]
    assert m.answers[int(logits.float().argmax())] != r.counterexample["expected"]
