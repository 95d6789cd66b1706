"""Index Lookup (Thm 1): builder, executor, exhaustive/sampled verification, certificate, mutants."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.blocks import BitThreshold, RetrieveByPosition, SymbolReadout
from exactformer.constructions.theorems.index_lookup import (
    IndexLookupError,
    IndexLookupTask,
    index_lookup,
    paper_eta,
    retrieval_holds,
)
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.codes.positions import position_codes
from exactformer.precision import FixedPoint, Float64, parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.executor.exact import ExecutorError, run
from exactformer.verify.precision_scan import find_min_precision
from exactformer.verify.verifier import VerifyError, counterexample_runner, verify

TASK = IndexLookupTask()


def answers(model, fmt, symbols, p, device="cpu"):
    return run(model, TASK.encode_arrays(model, np.asarray(symbols), np.asarray(p)), fmt, device=device)


def confirm(model, fmt, cex):
    """A counterexample must be real: the executor answers it wrongly."""
    symbols, p = cex["input"]
    assert cex["expected"] == symbols[p - 1] != cex["got"]
    assert answers(model, fmt, [symbols], [p]).answers[0][0] != symbols[p - 1]


def grid_unit(model, fmt):
    """The builder's eta grid: W_Q's entry eta * gram must be a grid value."""
    return fmt.step / Fraction(model.position_code.gram_scale)


# ------------------------------------------------------------------------------------------------
# builder
# ------------------------------------------------------------------------------------------------


def test_shapes_params_and_plan():
    model = index_lookup(64, 8)
    k = model.params["k"].value
    assert model.d_model == 2 * 3 + 2 * k
    assert model.n_layers == 1 and model.n_heads == 1
    assert model.n_ctx == 65 and model.d_vocab == 8 + 64
    assert model.answers == list(range(8))
    assert model.params["eta"].value > 0
    assert abs(model.params["eta_paper"].value - 2 * np.log(3 * 64)) < 1e-5
    fmt = parse_format(model.precision)
    # every weight is exactly representable in the precision the model was built for
    for name, t in model.tensors().items():
        t.raw(fmt)
    assert model.layout == {"rho": [0, 3], "qcode": [3, k], "pcode": [3 + k, k], "bits": [3 + 2 * k, 3]}
    assert [type(p.block) for p in model.plan] == [RetrieveByPosition, BitThreshold, SymbolReadout]
    assert registry.task_of(model).count(model) == 8**64 * 64


def test_default_eta_is_smallest_on_grid():
    model = index_lookup(256, 4, positions="reed-solomon")
    fmt = parse_format(model.precision)
    mu, eta = model.params["mu"].value, model.params["eta"].value
    assert retrieval_holds(fmt, eta, mu, 256)
    below = eta - grid_unit(model, fmt)
    assert below <= 0 or not retrieval_holds(fmt, below, mu, 256)
    # the paper's sufficient scale is larger than the exact minimum
    assert float(eta) < paper_eta(256) + float(grid_unit(model, fmt))


@pytest.mark.parametrize("bad", [
    dict(n=1, alphabet=4), dict(n=16, alphabet=1), dict(n=16, alphabet=1 << 17), dict(n=2**31, alphabet=2),
    dict(n=16, alphabet=4, eta=-1), dict(n=16, alphabet=4, positions="nope"),
])
def test_bad_parameters(bad):
    with pytest.raises(ValueError) as e:
        index_lookup(**bad)
    assert any(word in str(e.value) for word in ("n", "alphabet", "eta", "family", "positions"))


def test_too_few_bits_names_the_smallest_precision():
    with pytest.raises(IndexLookupError, match="smallest precision that works is binary"):
        index_lookup(1024, 4, precision="binary:int=5,frac=1")


def test_encode_errors():
    model = xf.index_lookup(8, 4)
    assert model.encode(([0, 1, 2, 3, 0, 1, 2, 3], 3)).tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4 + 2]
    with pytest.raises(ValueError, match="p must lie in"):
        model.encode(([0] * 8, 9))
    with pytest.raises(ValueError, match="length N = 8"):
        model.encode(([0] * 7, 1))
    with pytest.raises(ValueError, match="symbols must lie"):
        model.encode(([5] * 8, 1))


def test_executor_rejects_bad_tokens():
    model = index_lookup(8, 4)
    fmt = parse_format(model.precision)
    with pytest.raises(ExecutorError, match="token ids"):
        run(model, np.full((1, 9), 99), fmt)
    with pytest.raises(ExecutorError, match="sequence length"):
        run(model, np.zeros((1, 10), np.int64), fmt)
    with pytest.raises(ExecutorError, match="device"):
        run(model, TASK.encode(model, ([0] * 8, 1)), fmt, device="tpu")


# ------------------------------------------------------------------------------------------------
# exhaustive == certificate on small cases, passing and failing
# ------------------------------------------------------------------------------------------------

SMALL = [
    (4, 2, "binary:int=5,frac=4"),
    (6, 3, "binary:int=5,frac=5"),
    (8, 2, "binary:int=6,frac=3"),
    (5, 4, "binary:int=6,frac=6"),
    (8, 3, "paper:n=8,kc=1"),
]


@pytest.mark.parametrize("n,S,prec", SMALL)
@pytest.mark.parametrize("eta_scale", [None, Fraction(1, 4)])
def test_certificate_agrees_with_exhaustive(n, S, prec, eta_scale):
    fmt = parse_format(prec)
    model = index_lookup(n, S, precision=fmt)
    if eta_scale is not None:  # a weakened model: eta far too small (still on the grid)
        unit = grid_unit(model, fmt)
        model = index_lookup(n, S, precision=fmt, eta=max(unit, model.params["eta"].value * eta_scale // unit * unit))
    if S**n * n > 300_000:
        pytest.skip("too many inputs for the exhaustive check")
    ex = verify(model, mode="exhaustive", fmt=fmt)
    ce = verify(model, mode="certify", fmt=fmt)
    assert ex.inputs_covered == S**n * n or not ex.passed
    assert ce.passed == ex.passed, (ce.reason, ex.reason)
    if ce.passed:
        assert ce.inputs_covered == "all" and ce.reason == "proved for all inputs"
    else:
        assert ce.counterexample is not None, ce.reason
        confirm(model, fmt, ce.counterexample)


def test_eta_too_small_is_rejected_with_counterexample():
    fmt = parse_format("binary:int=6,frac=8")
    model = index_lookup(64, 4, positions="reed-solomon", precision=fmt)
    weak = index_lookup(64, 4, positions="reed-solomon", precision=fmt, eta=grid_unit(model, fmt))
    rep = verify(weak, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
    confirm(weak, fmt, rep.counterexample)
    assert verify(model, mode="certify", fmt=fmt).passed


def test_precision_too_low_is_rejected():
    model = index_lookup(64, 4, positions="reed-solomon", precision="binary:int=6,frac=6")
    assert verify(model, mode="certify").passed
    # same weights, a coarser grid: eta * gram is not representable there (refused, not run)
    rep = verify(model, mode="certify", fmt=FixedPoint.binary(int_bits=6, frac_bits=2))
    assert not rep.passed and "not representable" in rep.reason and rep.counterexample is None
    # weights representable in both, but with 3 integer bits the logits saturate: the target's and
    # the other keys' logits tie at the maximum and the softmax loses the target
    big = index_lookup(64, 4, positions="reed-solomon", precision="binary:int=8,frac=6", eta=64)
    assert verify(big, mode="certify").passed
    low = FixedPoint.binary(int_bits=3, frac_bits=2)
    rep = verify(big, mode="certify", fmt=low)
    assert not rep.passed and rep.counterexample is not None and "strict maximum" in rep.reason
    confirm(big, low, rep.counterexample)
    assert not verify(big, mode="sample", fmt=low, samples=100, seed=0).passed


def test_perturbed_value_weight_is_rejected():
    model = index_lookup(32, 4)
    fmt = parse_format(model.precision)
    W_V = model.blocks[0].attn.W_V
    num = W_V.num.copy() * 2
    num[0, 0, 0] = 1  # the value of bit 0 becomes 1/2 instead of 1
    bad = model.replace_weight("blocks.0.attn.W_V", ExactTensor(num, 2 * W_V.den))
    rep = verify(bad, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
    confirm(bad, fmt, rep.counterexample)
    assert verify(bad, mode="sample", samples=100, seed=0).passed is False


class _DuplicatedCode:
    """A code whose vector 1 equals vector 0 (a broken position code)."""

    def __init__(self, code):
        self._c = code
        self.k, self.n, self.bound, self.family = code.k, code.n, code.bound, "broken"
        self.gram_scale, self.is_sign_code = code.gram_scale, True

    def numerators(self, idx):
        idx = np.asarray(idx)
        return self._c.numerators(np.where(idx == 1, 0, idx))

    signs = numerators

    def describe(self):
        return {"family": "broken"}


def test_code_with_two_equal_vectors_is_rejected():
    code = position_codes(16, family="reed-solomon")
    fmt = FixedPoint.binary(int_bits=6, frac_bits=6)
    model = index_lookup(16, 4, positions=_DuplicatedCode(code), precision=fmt)
    rep = verify(model, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
    assert rep.counterexample["input"][1] in (1, 2)
    confirm(model, fmt, rep.counterexample)


def test_unproven_without_a_runner_is_a_failure():
    """A failed proof step without a counterexample search is "unproven": a failure, never a pass."""
    code = position_codes(16, family="reed-solomon")
    fmt = FixedPoint.binary(int_bits=6, frac_bits=6)
    model = index_lookup(16, 4, positions=_DuplicatedCode(code), precision=fmt)
    res = certify(model, fmt, TASK)
    assert not res.passed and not res.proved and res.reason.startswith("unproven: ") and res.counterexample is None
    res = certify(model, fmt, TASK, run_candidates=counterexample_runner(fmt))
    assert not res.passed and res.counterexample is not None
    confirm(model, fmt, res.counterexample)


# ------------------------------------------------------------------------------------------------
# families, formats, sampled mode, min precision
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["reed-solomon", "random", "onehot"])
def test_every_family_certifies(family):
    model = index_lookup(128, 8, positions=family)
    rep = verify(model, mode="certify")
    assert rep.passed, rep.reason
    assert rep.inputs_covered == "all"
    samp = verify(model, mode="sample", samples=64, seed=3)
    assert samp.passed and samp.inputs_covered == 128 and samp.seed == 3


class _PlainCode:
    """The same vectors as a Reed-Solomon code, without its type: the certificate's exact Gram rows
    instead of the Reed-Solomon weight distribution."""

    def __init__(self, code):
        self._c = code
        self.k, self.n, self.bound, self.family = code.k, code.n, code.bound, "plain"
        self.gram_scale, self.is_sign_code = code.gram_scale, True

    def numerators(self, idx):
        return self._c.numerators(idx)

    signs = numerators

    def describe(self):
        return {"family": "plain"}


@pytest.mark.parametrize("weak", [False, True])
def test_reed_solomon_and_gram_rows_agree(weak):
    """The two ways of computing a query's inner products give the same certificate."""
    code = position_codes(256, family="reed-solomon")
    fmt = parse_format("binary:int=6,frac=12")
    model = index_lookup(256, 8, positions=code, precision=fmt)
    eta = grid_unit(model, fmt) * 4 if weak else None
    a = certify(index_lookup(256, 8, positions=code, precision=fmt, eta=eta), fmt, TASK)
    b = certify(index_lookup(256, 8, positions=_PlainCode(code), precision=fmt, eta=eta), fmt, TASK)
    assert a.passed == b.passed == (not weak) and a.min_margin == b.min_margin
    if not weak:
        (ha,), (hb,) = a.details["heads"], b.details["heads"]
        assert ha["method"] == "Reed-Solomon weight distribution" and hb["method"] == "exact Gram rows"
        assert {k: v for k, v in ha.items() if k != "method"} == {k: v for k, v in hb.items() if k != "method"}


def test_non_power_of_two_n():
    model = index_lookup(100, 5, positions="reed-solomon")
    assert verify(model, mode="certify").passed
    assert verify(model, mode="sample", samples=100, seed=0).passed


def test_float64_run_agrees():
    model = index_lookup(32, 4, precision="float64", positions="reed-solomon")  # eta = paper's 2 ln(3N)
    rng = np.random.default_rng(0)
    sy, p = rng.integers(0, 4, (50, 32)), rng.integers(1, 33, 50)
    exact = answers(model, parse_format("binary:int=6,frac=12"), sy, p)
    flt = answers(model, Float64(), sy, p)
    assert exact.answers == flt.answers == [[s] for s in sy[np.arange(50), p - 1].tolist()]


def test_sample_mode_is_reproducible_and_counts():
    model = index_lookup(64, 4)
    a = verify(model, mode="sample", samples=50, seed=7)
    b = verify(model, mode="sample", samples=50, seed=7)
    assert a.passed and a.inputs_covered == 100 and a.min_margin == b.min_margin and a.seed == 7
    assert "50 sampled with seed 7" in a.reason
    sa = np.concatenate([bt.tokens for bt in TASK.sample(model, 50, seed=7)])
    assert np.array_equal(sa, np.concatenate([bt.tokens for bt in TASK.sample(model, 50, seed=7)]))
    assert not np.array_equal(sa, np.concatenate([bt.tokens for bt in TASK.sample(model, 50, seed=8)]))
    with pytest.raises(VerifyError, match="samples"):
        verify(model, mode="sample", samples=0)
    with pytest.raises(VerifyError, match="mode"):
        verify(model, mode="prove")
    with pytest.raises(VerifyError, match="exhaustive"):
        verify(model, mode="exhaustive")


def test_find_min_precision():
    code = position_codes(64, family="reed-solomon")
    res = find_min_precision(lambda fmt: index_lookup(64, 4, positions=code, precision=fmt), kind="binary",
                             int_bits=6, max_value=10)
    assert res.value is not None and res.value in res.passing
    assert res.format == FixedPoint.binary(int_bits=6, frac_bits=res.value).name
    assert all(v in res.passing for v in range(res.value, res.checked_up_to + 1))
    assert res.checked_up_to >= res.value + 4
    assert res.scanned == f"frac bits 1..{res.checked_up_to} at int=6"
    # one bit fewer does not certify (or cannot be built)
    if res.value > 1:
        fmt = FixedPoint.binary(int_bits=6, frac_bits=res.value - 1)
        assert not res.results[res.value - 1]["passed"]
        try:
            m = index_lookup(64, 4, positions=code, precision=fmt)
        except ValueError:
            return
        assert not certify(m, fmt, TASK).passed


# ------------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------------


def _need_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.cuda
def test_certificate_on_cuda():
    _need_cuda()
    fmt = parse_format("binary:int=6,frac=10")
    model = index_lookup(1024, 8, positions="random", precision=fmt)
    a, b = certify(model, fmt, TASK), certify(model, fmt, TASK, device="cuda")
    assert a.passed and b.passed and a.min_margin == b.min_margin and a.details == b.details
    weak = index_lookup(1024, 8, positions=model.position_code, precision=fmt, eta=grid_unit(model, fmt) * 4)
    rep = verify(weak, mode="certify", fmt=fmt, device="cuda")
    assert rep.passed is False and rep.counterexample is not None
    confirm(weak, fmt, rep.counterexample)


@pytest.mark.cuda
def test_executor_cuda_matches_cpu():
    _need_cuda()
    model = index_lookup(512, 16, positions="reed-solomon")
    fmt = parse_format(model.precision)
    rng = np.random.default_rng(0)
    sy, p = rng.integers(0, 16, (64, 512)), rng.integers(1, 513, 64)
    a, b = answers(model, fmt, sy, p), answers(model, fmt, sy, p, device="cuda")
    assert np.array_equal(a.logits, b.logits) and a.counts == b.counts
