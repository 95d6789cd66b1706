"""Equality / Inequality (Thm 6): builder, ground truth, exhaustive == certificate, mutants."""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.codes import products as code_products
from exactformer.constructions.core import registry
from exactformer.constructions.blocks import RetrieveByPosition, ThresholdReadout, UniformAverage, XorMLP
from exactformer.constructions.theorems.equality import EqualityError, equality, inequality
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.codes.positions import position_codes
from exactformer.precision import FixedPoint, parse_format
from exactformer.precision.boxes import FixedArithmetic
from exactformer.verify.certify.composed import certify
from exactformer.verify.executor.exact import run
from exactformer.verify.verifier import verify
from mutants import shift_keys

EQ, INEQ = registry.get("equality").task, registry.get("inequality").task


def truth(x: np.ndarray, eq: bool) -> np.ndarray:
    h = x.shape[1] // 2
    t = np.array([all(r[i] == r[i + h] for i in range(h)) for r in x.tolist()], dtype=np.int64)
    return t if eq else 1 - t


def run_answers(model, fmt, x):
    return np.array(run(model, EQ.encode_arrays(model, np.asarray(x)), fmt).answers, dtype=object)


def confirm(model, fmt, cex, eq: bool) -> None:
    """A counterexample must be real: the executor answers it wrongly."""
    x = np.asarray([cex["input"]])
    assert cex["expected"] == int(truth(x, eq)[0])
    assert run_answers(model, fmt, x)[0] != cex["expected"]


def rs(n):
    return position_codes(n, family="reed-solomon")


def one_hot(fmt, eta, mu, n_keys) -> bool:
    """The worst-case row (every other key at mu) is exactly one-hot under the format."""
    return RetrieveByPosition.worst_case(FixedArithmetic(fmt), eta, mu, n_keys) == (1, 0)


# ------------------------------------------------------------------------------------------------
# builder
# ------------------------------------------------------------------------------------------------


def test_shapes_params_and_formulas():
    m = inequality(64, positions="reed-solomon")
    k = m.params["k"].value
    assert m.d_model == 4 + 2 * k and m.n_layers == 2 and m.n_heads == 1 and m.n_ctx == 64 and m.d_vocab == 2
    assert m.answers == [0, 1] and m.construction == "inequality" and m.task_params["answer"] == "INEQ"
    for key in ("eta", "eta_one_hot", "eta_threshold", "eta_paper", "Kc", "uniform_weight", "readout_gain",
                "precision", "precision_bits", "size_bits", "d_model", "d_head", "d_mlp", "layers", "heads"):
        assert key in m.params and m.params[key].formula, key
    fmt = parse_format(m.precision)
    for t in m.tensors().values():
        t.raw(fmt)  # every weight is exactly representable
    assert m.params["uniform_weight"].value == Fraction(1, 64)
    assert m.params["size_bits"].value == m.size_bits(fmt.bits)
    assert [type(p.block) for p in m.plan] == [RetrieveByPosition, XorMLP, UniformAverage, ThresholdReadout]
    # eta_one_hot: the smallest grid value whose worst-case row is exactly one-hot in the format;
    # the default eta makes every worst-case row one-hot too
    eta, mu, eta_1h = m.params["eta"].value, m.params["mu"].value, m.params["eta_one_hot"].value
    unit = fmt.step / Fraction(m.position_code.gram_scale)
    assert one_hot(fmt, eta_1h, mu, 64) and (eta_1h == unit or not one_hot(fmt, eta_1h - unit, mu, 64))
    assert eta >= eta_1h and one_hot(fmt, eta, mu, 64)
    eq = equality(64, positions="reed-solomon")
    z = m.layout["z"][0]
    assert eq.construction == "equality" and eq.W_U.num[z, 0] != 0 and m.W_U.num[z, 1] != 0


@pytest.mark.parametrize("bad,word", [
    (dict(n=7), "n must be an even integer"), (dict(n=0), "n must be an even integer"),
    (dict(n=1 << 31), "n must be an even integer"), (dict(n=True), "n must be an even integer"),
    (dict(n=16, eta=-1), "eta must be > 0"), (dict(n=16, eta="huge"), "eta must be"),
    (dict(n=16, positions="nope"), "family"),
])
def test_bad_parameters(bad, word):
    with pytest.raises(ValueError, match=word):
        equality(**bad)


def test_too_few_bits_names_the_smallest_precision():
    with pytest.raises(EqualityError, match="smallest precision that works is binary"):
        equality(64, positions="reed-solomon", precision="binary:int=8,frac=4")


def test_encode_and_errors():
    m = xf.equality(8, positions="reed-solomon")
    assert m.encode([-1, 1, 1, -1, -1, 1, 1, -1]).tolist() == [0, 1, 1, 0, 0, 1, 1, 0]
    assert m.encode_batch([[1] * 8, [-1] * 8]).shape == (2, 8)
    with pytest.raises(ValueError, match="list of N = 8 values"):
        m.encode([1] * 7)
    with pytest.raises(ValueError, match="integers -1 or 1"):
        m.encode([0, 1, 1, 1, 1, 1, 1, 1])
    assert m([[1, -1, 1, -1, 1, -1, 1, -1], [1, -1, 1, -1, 1, -1, 1, 1]]) == [1, 0]


# ------------------------------------------------------------------------------------------------
# ground truth and input sources
# ------------------------------------------------------------------------------------------------


def test_ground_truth_and_sources():
    m = equality(10, positions="reed-solomon")
    xs = np.concatenate([b.arrays[0] for b in EQ.exhaustive(m, batch=300)])
    assert xs.shape == (1024, 10) and len({tuple(r) for r in xs.tolist()}) == 1024
    assert np.array_equal(EQ.truth(m, xs), truth(xs, True))
    assert np.array_equal(INEQ.truth(m, xs), truth(xs, False))
    # the specification the certificate compares with says the same on every input
    assert np.array_equal(EQ.spec(m).evaluate(EQ.encode_arrays(m, xs), [np.array([0, 1])] * 10), truth(xs, True))
    assert np.array_equal(INEQ.spec(m).evaluate(EQ.encode_arrays(m, xs), [np.array([0, 1])] * 10), truth(xs, False))
    adv = np.concatenate([b.arrays[0] for b in EQ.adversarial(m, 22, seed=3)])
    base = adv[0]
    assert np.array_equal(base[:5], base[5:])
    flips = adv[1:11]
    assert all(np.sum(f != base) == 1 for f in flips)  # exactly one bit differs ...
    assert [int(np.flatnonzero(f != base)[0]) for f in flips] == list(range(10))  # ... at every position
    s = np.concatenate([b.arrays[0] for b in EQ.sample(m, 200, seed=5)])
    assert 0.2 < EQ.truth(m, s).mean() < 0.8  # both answers occur
    s2 = np.concatenate([b.arrays[0] for b in EQ.sample(m, 200, seed=5)])
    assert np.array_equal(s, s2)


# ------------------------------------------------------------------------------------------------
# certificate == exhaustive on small cases, passing and failing
# ------------------------------------------------------------------------------------------------

CASES = [(2, "auto", None), (4, "auto", None), (6, "reed-solomon", None), (8, "random", None),
         (10, "reed-solomon", None), (10, "reed-solomon", "threshold"), (10, "reed-solomon", 1),
         (12, "reed-solomon", 1), (12, "reed-solomon", 2), (12, "auto", None), (8, "reed-solomon", "paper"),
         (12, "reed-solomon", "saturated"), (10, "reed-solomon", "saturated")]


@pytest.mark.parametrize("n,family,eta", CASES)
@pytest.mark.parametrize("eq", [True, False])
def test_certificate_agrees_with_exhaustive(n, family, eta, eq):
    build = equality if eq else inequality
    kw = {}
    if eta == "paper":
        kw["precision"] = f"paper:n={n},kc=2"
    elif eta == "saturated":  # the layer-2 softmax sum N e(0) saturates at the format's maximum 8 - 1/16
        kw["precision"] = "binary:int=3,frac=4"
    elif eta is not None:
        kw["eta"] = eta
    if isinstance(eta, int):
        kw["precision"] = "binary:int=5,frac=4"
    m = build(n, positions=family, **kw)
    fmt = parse_format(m.precision)
    ex = verify(m, mode="exhaustive", fmt=fmt)
    ce = verify(m, mode="certify", fmt=fmt)
    assert ex.inputs_covered == 2**n or not ex.passed
    assert ce.passed == ex.passed, (ce.reason, ex.reason)
    if ce.passed:
        assert ce.inputs_covered == "all" and "proved" in ce.reason
    else:
        assert ce.counterexample is not None
        confirm(m, fmt, ce.counterexample, eq)


# ------------------------------------------------------------------------------------------------
# mutants: each rejected with a counterexample the executor confirms (and exhaustive agrees)
# ------------------------------------------------------------------------------------------------


def _reject(model, fmt, eq=False):
    rep = verify(model, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None, rep.reason
    assert set(rep.counterexample) >= {"input", "expected", "got"}
    confirm(model, fmt, rep.counterexample, eq)
    if model.n <= 12:
        assert not verify(model, mode="exhaustive", fmt=fmt).passed
    return rep


def test_mutant_eta_too_small():
    code = rs(12)
    good = inequality(12, positions=code)
    fmt = parse_format(good.precision)
    assert verify(good, mode="certify").passed
    _reject(inequality(12, positions=code, precision=fmt, eta=fmt.step / Fraction(code.gram_scale)), fmt)


def test_mutant_precision_too_low():
    code = rs(16)
    fmt = FixedPoint.binary(int_bits=5, frac_bits=4)
    m = inequality(16, positions=code, precision=fmt, eta=4)  # eta/k = 1/4: on the coarser grid too
    assert verify(m, mode="certify", fmt=fmt).passed
    low = FixedPoint.binary(int_bits=5, frac_bits=3)  # step 1/8 > 1/16: the uniform weight rounds to 0
    rep = _reject(m, low)
    assert [h["uniform_weight"] for h in rep.details["heads"] if h["block"] == "UniformAverage"] == ["0"]


def test_mutant_wrong_key_offset():
    m = inequality(12, positions=rs(12))
    fmt = parse_format(m.precision)
    _reject(shift_keys(m, 1), fmt)
    _reject(shift_keys(equality(12, positions=rs(12)), 3), fmt, eq=True)


@pytest.mark.parametrize("offset", [Fraction(0), Fraction(1, 2)])
def test_key_bias_offset_is_a_row_constant(offset):
    """The paper's -1/2 key entry only shifts every logit of a row: changing it (within the range
    the builder kept unsaturated, |offset| <= 1/2) keeps a proof."""
    m = inequality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    bK = m.blocks[0].attn.b_K
    assert Fraction(int(bK.num[0, -1]), bK.den) == Fraction(-1, 2)
    num = bK.num.copy()
    num[0, -1] = int(offset * bK.den)
    m2 = m.replace_weight("blocks.0.attn.b_K", ExactTensor(num, bK.den))
    assert verify(m2, mode="certify", fmt=fmt).passed and verify(m2, mode="exhaustive", fmt=fmt).passed


@pytest.mark.parametrize("unit,delta", [(0, -2), (1, 1), (3, 1)])
def test_mutant_perturbed_mlp_weight(unit, delta):
    m = inequality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    b = m.blocks[0].mlp.b_in
    num = b.num.copy()
    num[unit] += delta  # in halves: -1/2 -> -3/2 (m = -1 on a mismatch), -1 -> -1/2 (m = 0 on a mismatch)
    _reject(m.replace_weight("blocks.0.mlp.b_in", ExactTensor(num, b.den)), fmt)


def test_harmless_perturbation_is_proved():
    """b_in[2]: -1/2 -> 0 makes m = 2 on one kind of mismatch: still correct, and proved (the
    uniform average splits the values {0, 1, 2} into {0} and {1, 2})."""
    m = inequality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    b = m.blocks[0].mlp.b_in
    num = b.num.copy()
    num[2] += 1
    m2 = m.replace_weight("blocks.0.mlp.b_in", ExactTensor(num, b.den))
    assert verify(m2, mode="exhaustive", fmt=fmt).passed
    rep = verify(m2, mode="certify", fmt=fmt)
    assert rep.passed, rep.reason


def test_mutant_readout_weight():
    m = equality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    num = m.b_U.num.copy()
    num[1] = -num[1]
    _reject(m.replace_weight("unembed.b_U", ExactTensor(num, m.b_U.den)), fmt, eq=True)


# ------------------------------------------------------------------------------------------------
# code inner products, formats, scale
# ------------------------------------------------------------------------------------------------


class _Plain:
    """A Reed-Solomon code's vectors without its type (so histograms take the exact Gram path)."""

    def __init__(self, code):
        self._c, self.k, self.n = code, code.k, code.n

    def numerators(self, idx):
        return self._c.numerators(idx)


def test_rs_histograms_match_gram():
    code = rs(100)
    plain = _Plain(code)
    q = np.array([0, 1, 5, 37, 63, 99])
    for start, T in ((0, 100), (0, 64), (3, 90), (1, 50)):
        keys = np.arange(start, start + T)
        lv_r, h_r = code_products.histograms(code, q, code, keys)
        lv_g, h_g = code_products.histograms(plain, q, plain, keys)
        assert h_r.sum() == h_g.sum() == len(q) * T
        for i in range(len(q)):
            assert {int(l): int(c) for l, c in zip(lv_r, h_r[i]) if c} == {int(l): int(c) for l, c in zip(lv_g, h_g[i]) if c}
        # a key multiset that is not contiguous also agrees
        sparse = keys[::3]
        lv_r, h_r = code_products.histograms(code, q, code, sparse)
        lv_g, h_g = code_products.histograms(plain, q, plain, sparse)
        assert [dict(zip(lv_r.tolist(), r.tolist())) for r in h_r] == [dict(zip(lv_g.tolist(), r.tolist())) for r in h_g]
    assert np.array_equal(code_products.pair_inner(code, q, code, q[::-1]), code_products.pair_inner(plain, q, plain, q[::-1]))
    assert code_products._dyadic_blocks(3, 13) == [(3, 0), (4, 2), (8, 3)]


def test_unproven_is_a_failure_with_reason():
    m = inequality(8, positions=rs(8))
    m2 = copy.copy(m)
    m2.blocks = [m.blocks[0], m.blocks[0]]  # block 1 is no longer a uniform average
    rep = verify(m2, mode="certify", fmt=parse_format(m.precision))
    assert not rep.passed and rep.reason
    if rep.counterexample is not None:
        confirm(m2, parse_format(m.precision), rep.counterexample, False)
    else:
        assert rep.reason.startswith("unproven")
    res = certify(m2, parse_format(m.precision), INEQ)  # no runner: no counterexample search
    assert not res.passed and not res.proved and res.counterexample is None and res.reason.startswith("unproven: ")


def test_float64_model_samples_correctly():
    m = inequality(32, positions="reed-solomon", precision="float64")
    rep = verify(m, mode="sample", samples=100, seed=1)
    assert rep.passed and rep.inputs_covered == 200


def test_sample_mode_and_large_certificate():
    m = inequality(4096, positions="reed-solomon")
    rep = verify(m, mode="certify")
    assert rep.passed, rep.reason
    first, second = rep.details["heads"]
    assert first["method"] == "Reed-Solomon weight distribution" and rep.details["engine"] == "runs"
    assert (first["min_target_weight"], first["max_stray_weight"]) == ("1", "0")  # one-hot rows
    assert second["uniform_weight"] == "1/4096"
    assert rep.min_margin == "1/2"
    samp = verify(inequality(256, positions="reed-solomon"), mode="sample", samples=64, seed=2)
    assert samp.passed and samp.inputs_covered == 128


def test_non_power_of_two_n():
    m = equality(100, positions="reed-solomon")
    assert verify(m, mode="certify").passed
    assert verify(m, mode="sample", samples=100, seed=0).passed


def test_adversarial_flips_are_streamed_at_large_n():
    """Single-bit flips of a 2^16-bit input come in chunks (an N x N array would be 32 GiB)."""
    m = inequality(1 << 16, precision="float64")  # the inputs do not depend on the format (no eta search)
    batches = list(INEQ.adversarial(m, 300, seed=0))
    x = np.concatenate([b.arrays[0] for b in batches])
    assert x.shape == (300, 1 << 16)
    base = x[0]
    assert np.array_equal(base[: 1 << 15], base[1 << 15 :])  # equal halves, then its flips
    assert all(np.sum(row != base) == 1 for row in x[1:])


def test_paper_grid_wider_than_int64_certifies():
    """P1's own grid at N = 2^16 (kc = 2: step 2^-32, raw values beyond int64) runs the
    certificate in object arithmetic end to end; it used to stop with an internal error (np.unique
    over object rows, a 0-d wide product) and then hang in the counterexample search."""
    m = xf.build("equality", n=1 << 16, precision="paper:n=65536,kc=2")
    r = xf.verify(m, mode="certify")
    assert r.passed, r.reason


def test_unique_rows_of_object_arrays_match_numpy():
    from exactformer.constructions.core.views import unique_rows

    def _unique_rows(a):
        return unique_rows(a)[0]

    rng = np.random.default_rng(0)
    a = rng.integers(-3, 3, size=(40, 3))
    assert np.array_equal(_unique_rows(a.astype(object)).astype(np.int64), np.unique(a, axis=0))
    big = np.array([[1 << 70, 1], [1 << 70, 1], [-(1 << 70), 2]], dtype=object)
    assert _unique_rows(big).tolist() == [[-(1 << 70), 2], [1 << 70, 1]]
    assert _unique_rows(np.empty((0, 2), dtype=object)).shape == (0, 2)
