"""Index Lookup (Thm 1): builder, executor, exhaustive/sampled verification, certificate, mutants."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from exactformer.constructions.index_lookup import (
    IndexLookupError,
    index_lookup,
    paper_eta,
    smallest_eta,
    worst_case_attention,
)
from exactformer.constructions.ir import ExactTensor, IRError
from exactformer.constructions.position_codes import position_codes
from exactformer.precision import FixedPoint, Float64, parse_format
from exactformer.verify.certificates import certify, find_min_precision
from exactformer.verify.executor import ExecutorError, run
from exactformer.verify.verifier import VerifyError, verify


def brute_force_answers(model, fmt, symbols, p):
    from exactformer.constructions.index_lookup import encode_arrays

    return run(model, encode_arrays(model, symbols, p), fmt)


# ------------------------------------------------------------------------------------------------
# builder
# ------------------------------------------------------------------------------------------------


def test_shapes_and_params():
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


def test_default_eta_is_smallest_on_grid():
    model = index_lookup(256, 4, positions="reed-solomon")
    fmt = parse_format(model.precision)
    k, mu = model.params["k"].value, model.params["mu"].value
    eta = model.params["eta"].value
    assert worst_case_attention(fmt, eta, k, mu, 256).holds()
    below = eta - k * fmt.step
    assert below <= 0 or not worst_case_attention(fmt, below, k, mu, 256).holds()
    # the paper's sufficient scale is larger than the exact minimum
    assert float(eta) < paper_eta(256) + float(k * fmt.step)


@pytest.mark.parametrize("bad", [
    dict(n=1, alphabet=4), dict(n=16, alphabet=1), dict(n=16, alphabet=1 << 17), dict(n=2**25, alphabet=2),
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
    model = index_lookup(8, 4)
    with pytest.raises(ValueError, match="p must lie in"):
        model.encode(([0] * 8, 9))
    with pytest.raises(ValueError, match="length n"):
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
        run(model, model.encode(([0] * 8, 1)), fmt, device="tpu")


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
        k = model.params["k"].value
        eta = max(k * fmt.step, (model.params["eta"].value * eta_scale) // (k * fmt.step) * (k * fmt.step))
        model = index_lookup(n, S, precision=fmt, eta=eta)
    if S**n * n > 300_000:
        pytest.skip("too many inputs for the exhaustive check")
    ex = verify(model, mode="exhaustive", fmt=fmt)
    ce = verify(model, mode="certify", fmt=fmt)
    assert ex.inputs_covered == S**n * n or not ex.passed
    assert ce.passed == ex.passed, (ce.reason, ex.reason)
    if not ce.passed:
        assert ce.counterexample is not None
        symbols, p = ce.counterexample["input"]
        res = brute_force_answers(model, fmt, np.array([symbols]), np.array([p]))
        assert res.answers[0][0] != symbols[p - 1]


def test_eta_too_small_is_rejected_with_counterexample():
    fmt = parse_format("binary:int=6,frac=8")
    model = index_lookup(64, 4, positions="reed-solomon", precision=fmt)
    k = model.params["k"].value
    weak = index_lookup(64, 4, positions="reed-solomon", precision=fmt, eta=k * fmt.step)
    rep = verify(weak, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
    symbols, p = rep.counterexample["input"]
    assert rep.counterexample["expected"] == symbols[p - 1] != rep.counterexample["got"]
    assert verify(model, mode="certify", fmt=fmt).passed


def test_precision_too_low_is_rejected():
    model = index_lookup(64, 4, precision="binary:int=6,frac=6")
    assert verify(model, mode="certify").passed
    # same weights, coarser arithmetic: the rounded softmax loses the target
    low = parse_format("binary:int=6,frac=6")
    eta = model.params["eta"].value
    coarse = FixedPoint.binary(int_bits=6, frac_bits=2)
    k = model.params["k"].value
    if not coarse.represents(eta / k):
        rep = verify(model, mode="certify", fmt=coarse)
        assert not rep.passed and "not representable" in rep.reason
    weak = index_lookup(64, 4, precision=coarse, eta=Fraction(16)) if coarse.represents(Fraction(16, k)) else None
    if weak is not None:
        rep = verify(weak, mode="certify")
        ex = verify(weak, mode="sample", samples=200, seed=1)
        assert rep.passed == ex.passed or (not rep.passed)


def test_perturbed_value_weight_is_rejected():
    model = index_lookup(32, 4)
    fmt = parse_format(model.precision)
    W_V = model.blocks[0].attn.W_V
    num = W_V.num.copy() * 2
    num[0, 0, 0] = 1  # the value of bit 0 becomes 1/2 instead of 1
    bad = model.replace_weight("blocks.0.attn.W_V", ExactTensor(num, 2 * W_V.den))
    rep = verify(bad, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
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

    def signs_torch(self, idx, device):
        import torch

        return torch.as_tensor(self.signs(np.asarray(idx)), device=device)


def test_code_with_two_equal_vectors_is_rejected():
    code = position_codes(16, family="reed-solomon")
    fmt = FixedPoint.binary(int_bits=6, frac_bits=6)
    model = index_lookup(16, 4, positions=_DuplicatedCode(code), precision=fmt)
    rep = verify(model, mode="certify", fmt=fmt)
    assert not rep.passed and rep.counterexample is not None
    assert rep.counterexample["input"][1] in (1, 2)


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


def test_non_power_of_two_n():
    model = index_lookup(100, 5, positions="reed-solomon")
    assert verify(model, mode="certify").passed
    assert verify(model, mode="sample", samples=100, seed=0).passed


def test_float64_run_agrees():
    model = index_lookup(32, 4, precision="float64", positions="reed-solomon")  # eta = paper's 2 ln(3N)
    rng = np.random.default_rng(0)
    sy, p = rng.integers(0, 4, (50, 32)), rng.integers(1, 33, 50)
    exact = brute_force_answers(model, parse_format("binary:int=6,frac=12"), sy, p)
    flt = brute_force_answers(model, Float64(), sy, p)
    assert exact.answers == flt.answers == [[s] for s in sy[np.arange(50), p - 1].tolist()]


def test_sample_mode_is_reproducible_and_counts():
    model = index_lookup(64, 4)
    a = verify(model, mode="sample", samples=50, seed=7)
    b = verify(model, mode="sample", samples=50, seed=7)
    assert a.passed and a.inputs_covered == 100 and a.min_margin == b.min_margin
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
    assert all(v in res.passing for v in range(res.value, res.checked_up_to + 1))
    assert res.checked_up_to >= res.value + 4
    # one bit fewer does not certify (or cannot be built)
    if res.value > 1:
        fmt = FixedPoint.binary(int_bits=6, frac_bits=res.value - 1)
        try:
            m = index_lookup(64, 4, positions=code, precision=fmt)
        except ValueError:
            return
        assert not certify(m, fmt).passed


# ------------------------------------------------------------------------------------------------
# the streamed-rows method (the CUDA path for codes without algebraic structure) == histograms
# ------------------------------------------------------------------------------------------------

from exactformer.verify.certify_index_lookup import certify_index_lookup  # noqa: E402


@pytest.mark.parametrize("family,prec,eta", [
    ("random", "binary:int=6,frac=10", None),
    ("reed-solomon", "binary:int=6,frac=12", None),
    ("random", "binary:int=6,frac=10", "weak"),
])
def test_rows_method_agrees_with_histograms(family, prec, eta):
    fmt = parse_format(prec)
    n = 64 if eta == "weak" else 256
    model = index_lookup(n, 8, positions=family, precision=fmt)
    if eta == "weak":
        model = index_lookup(n, 8, positions=model.code, precision=fmt, eta=model.params["k"].value * fmt.step * 4)
    a = certify_index_lookup(model, fmt, method="histogram")
    b = certify_index_lookup(model, fmt, method="rows")
    assert a.passed == b.passed and a.min_margin == b.min_margin
    assert a.details["min_target_weight"] == b.details["min_target_weight"]
    assert a.details["max_rest_weight"] == b.details["max_rest_weight"]
    if eta == "weak":
        assert not a.passed


@pytest.mark.cuda
def test_rows_method_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    fmt = parse_format("binary:int=6,frac=10")
    model = index_lookup(1024, 8, positions="random", precision=fmt)
    a = certify_index_lookup(model, fmt, method="histogram")
    b = certify_index_lookup(model, fmt, method="rows", device="cuda")
    assert a.passed and b.passed and a.min_margin == b.min_margin
    weak = index_lookup(1024, 8, positions=model.code, precision=fmt, eta=model.params["k"].value * fmt.step * 4)
    assert certify_index_lookup(weak, fmt, method="rows", device="cuda").passed is False


@pytest.mark.cuda
def test_executor_cuda_matches_cpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    model = index_lookup(512, 16, positions="reed-solomon")
    fmt = parse_format(model.precision)
    rng = np.random.default_rng(0)
    sy, p = rng.integers(0, 16, (64, 512)), rng.integers(1, 513, 64)
    from exactformer.constructions.index_lookup import encode_arrays

    tok = encode_arrays(model, sy, p)
    a, b = run(model, tok, fmt), run(model, tok, fmt, device="cuda")
    assert np.array_equal(a.logits, b.logits) and a.counts == b.counts
