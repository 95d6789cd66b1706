"""Equality / Inequality (Thm 6): builder, ground truth, exhaustive == certificate, mutants."""

from __future__ import annotations

import copy
import itertools
from fractions import Fraction

import numpy as np
import pytest

from exactformer.constructions import registry
from exactformer.constructions.equality import (
    EqualityError,
    encode_arrays,
    equality,
    gram_scale,
    inequality,
    worst_case_row,
)
from exactformer.constructions.ir import CodeBlock, ExactTensor
from exactformer.constructions.position_codes import position_codes
from exactformer.precision import FixedPoint, Float64, parse_format
from exactformer.verify import certificates as vcert
from exactformer.verify import tasks as vtasks
from exactformer.verify.certify_two_layer import _dyadic_blocks, _gram_histograms, _rs_histograms, certify_two_layer
from exactformer.verify.executor import run
from exactformer.verify.tasks_boolean import TASKS_BOOLEAN
from exactformer.verify.verifier import verify
from mutants import shift_keys


def wire() -> None:
    """Register the Boolean constructions (until the lead wires them in registry/tasks/certificates)."""
    for name, builder in (("equality", "equality"), ("inequality", "inequality")):
        if name not in registry.names():
            registry.register(name, "exactformer.constructions.equality", builder)
    for name, builder in (("threshold", "threshold_features"), ("disjointness", "disjointness"), ("dnf", "k_dnf"),
                          ("cnf", "k_cnf")):
        if name not in registry.names():
            registry.register(name, "exactformer.constructions.thresholds", builder)
    for name, task in TASKS_BOOLEAN.items():
        vtasks.TASKS.setdefault(name, task)
        vcert.CERTIFIERS.setdefault(name, certify_two_layer)


wire()


def truth(x: np.ndarray, eq: bool) -> np.ndarray:
    h = x.shape[1] // 2
    t = np.array([all(r[i] == r[i + h] for i in range(h)) for r in x.tolist()], dtype=np.int64)
    return t if eq else 1 - t


def run_answers(model, fmt, x):
    return np.array(run(model, encode_arrays(model, np.asarray(x)), fmt).answers, dtype=object)


def confirm(model, fmt, cex, eq: bool) -> None:
    """A counterexample must be real: the executor answers it wrongly."""
    x = np.asarray([cex["input"]])
    assert cex["expected"] == int(truth(x, eq)[0])
    assert run_answers(model, fmt, x)[0] != cex["expected"]


def rs(n):
    return position_codes(n, family="reed-solomon")


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
    # default eta: the smallest grid value whose worst-case row is exactly one-hot
    eta, mu = m.params["eta"].value, m.params["mu"].value
    unit = fmt.step / gram_scale(m.code)
    assert worst_case_row(fmt, eta, mu, 64).one_hot
    assert eta == unit or not worst_case_row(fmt, eta - unit, mu, 64).one_hot
    eq = equality(64, positions="reed-solomon")
    assert eq.construction == "equality" and eq.W_U.num[3, 0] != 0 and m.W_U.num[3, 1] != 0


@pytest.mark.parametrize("bad,word", [
    (dict(n=7), "n must be an even integer"), (dict(n=0), "n must be an even integer"),
    (dict(n=1 << 26), "n must be an even integer"), (dict(n=True), "n must be an even integer"),
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
    m = equality(8, positions="reed-solomon")
    assert m.encode([-1, 1, 1, -1, -1, 1, 1, -1]).tolist() == [0, 1, 1, 0, 0, 1, 1, 0]
    assert m.encode_batch([[1] * 8, [-1] * 8]).shape == (2, 8)
    with pytest.raises(ValueError, match="length n = 8"):
        m.encode([1] * 7)
    with pytest.raises(ValueError, match=r"entries in \{-1, 1\}"):
        m.encode([0, 1, 1, 1, 1, 1, 1, 1])


# ------------------------------------------------------------------------------------------------
# ground truth and input sources
# ------------------------------------------------------------------------------------------------


def test_ground_truth_and_sources():
    m = equality(10, positions="reed-solomon")
    task = TASKS_BOOLEAN["equality"]
    xs = np.concatenate([b.arrays[0] for b in task.exhaustive(m, batch=300)])
    assert xs.shape == (1024, 10) and len({tuple(r) for r in xs.tolist()}) == 1024
    assert np.array_equal(task.truth(m, xs), truth(xs, True))
    assert np.array_equal(TASKS_BOOLEAN["inequality"].truth(m, xs), truth(xs, False))
    adv = np.concatenate([b.arrays[0] for b in task.adversarial(m, 22, seed=3)])
    base = adv[0]
    assert np.array_equal(base[:5], base[5:])
    flips = adv[1:11]
    assert all(np.sum(f != base) == 1 for f in flips)  # exactly one bit differs ...
    assert [int(np.flatnonzero(f != base)[0]) for f in flips] == list(range(10))  # ... at every position
    s = np.concatenate([b.arrays[0] for b in task.sample(m, 200, seed=5)])
    assert 0.2 < task.truth(m, s).mean() < 0.8  # both answers occur
    s2 = np.concatenate([b.arrays[0] for b in task.sample(m, 200, seed=5)])
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
    _reject(inequality(12, positions=code, precision=fmt, eta=fmt.step / gram_scale(code)), fmt)


def test_mutant_precision_too_low():
    code = rs(16)
    fmt = FixedPoint.binary(int_bits=5, frac_bits=4)
    m = inequality(16, positions=code, precision=fmt, eta=4)  # eta/k = 1/4: on the coarser grid too
    assert verify(m, mode="certify", fmt=fmt).passed
    low = FixedPoint.binary(int_bits=5, frac_bits=3)  # step 1/8 > 1/16: the uniform weight rounds to 0
    rep = _reject(m, low)
    assert "readout fails" in rep.reason




def test_mutant_wrong_key_offset():
    m = inequality(12, positions=rs(12))
    fmt = parse_format(m.precision)
    _reject(shift_keys(m, 1), fmt)
    _reject(shift_keys(equality(12, positions=rs(12)), 3), fmt, eq=True)


def test_key_bias_offset_is_a_row_constant():
    """The paper's -1/2 key entry only shifts every logit of a row: changing it keeps a proof."""
    m = inequality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    bK = m.blocks[0].attn.b_K
    num = bK.num.copy()
    num[0, -1] = 3 * bK.den  # -1/2 -> 3
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
    """b_in[2]: -1/2 -> 0 makes m = 2 on one kind of mismatch: still correct, and proved."""
    m = inequality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    b = m.blocks[0].mlp.b_in
    num = b.num.copy()
    num[2] += 1
    m2 = m.replace_weight("blocks.0.mlp.b_in", ExactTensor(num, b.den))
    rep = verify(m2, mode="certify", fmt=fmt)
    assert rep.passed and verify(m2, mode="exhaustive", fmt=fmt).passed
    assert rep.details["layer2_values"]["head0,f=1"] == ["1..2"]


def test_mutant_readout_weight():
    m = equality(10, positions=rs(10))
    fmt = parse_format(m.precision)
    num = m.b_U.num.copy()
    num[1] = -num[1]
    _reject(m.replace_weight("unembed.b_U", ExactTensor(num, m.b_U.den)), fmt, eq=True)


# ------------------------------------------------------------------------------------------------
# certificate internals, formats, scale
# ------------------------------------------------------------------------------------------------


def test_rs_histograms_match_gram():
    code = rs(100)
    q = np.array([0, 1, 5, 37, 63, 99])
    for start, T in ((0, 100), (0, 64), (3, 90), (1, 50)):
        keys = np.arange(start, start + T)
        lv_r, h_r = _rs_histograms(code, q, keys)
        lv_g, h_g = _gram_histograms(code, q, keys, "cpu")
        for i in range(len(q)):
            assert {int(l): int(c) for l, c in zip(lv_r, h_r[i]) if c} == {int(l): int(c) for l, c in zip(lv_g, h_g[i]) if c}
    assert _dyadic_blocks(3, 13) == [(3, 0), (4, 2), (8, 3)]


def test_unproven_is_a_failure_with_reason():
    m = inequality(8, positions=rs(8))
    res = certify_two_layer(m, Float64)
    assert not res.passed and "exact" in res.reason
    m2 = copy.copy(m)
    m2.blocks = [m.blocks[0], m.blocks[0]]  # block 1 is no longer a uniform average
    rep = verify(m2, mode="certify", fmt=parse_format(m.precision))
    assert not rep.passed and rep.reason


def test_float64_model_samples_correctly():
    m = inequality(32, positions="reed-solomon", precision="float64")
    rep = verify(m, mode="sample", samples=100, seed=1)
    assert rep.passed and rep.inputs_covered == 200


def test_sample_mode_and_large_certificate():
    m = inequality(4096, positions="reed-solomon")
    rep = verify(m, mode="certify")
    assert rep.passed and rep.details["one_hot"] and rep.details["row_method"].startswith("reed-solomon")
    assert rep.min_margin == "1/2"
    samp = verify(inequality(256, positions="reed-solomon"), mode="sample", samples=64, seed=2)
    assert samp.passed and samp.inputs_covered == 128


def test_non_power_of_two_n():
    m = equality(100, positions="reed-solomon")
    assert verify(m, mode="certify").passed
    assert verify(m, mode="sample", samples=100, seed=0).passed


def test_adversarial_flips_are_streamed_at_large_n():
    """Single-bit flips of a 2^16-bit input come in chunks (an N x N array would be 32 GiB)."""
    from exactformer.constructions.equality import inequality
    from exactformer.verify.tasks import TASKS

    m = inequality(1 << 16)
    batches = list(TASKS["inequality"].adversarial(m, 300, seed=0))
    x = np.concatenate([b.arrays[0] for b in batches])
    assert x.shape == (300, 1 << 16)
    base = x[0]
    assert np.array_equal(base[: 1 << 15], base[1 << 15 :])  # equal halves, then its flips
    assert all(np.sum(row != base) == 1 for row in x[1:])
