"""Match2 lowered to one softmax head (P2 Thm 5.2, spec §B.6): the lowered head is fixed-point EMA
bit for bit, the certificate proves the model for all inputs (and agrees with exhaustive
enumeration), rejects lowerings with eta <= ln S or S below the match count with counterexamples,
reads every fact from the weights, and the model runs in TransformerLens."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
from exactformer.constructions.blocks.match import MAX_COUNT_CLASSES, MatchHead
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.theorems.match2 import (
    Match2Error,
    Match2Task,
    code_bits,
    codes,
    match2,
)
from exactformer.constructions.mpc.applications import match2_truth
from exactformer.precision import FixedPoint, Float64, parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.attention.ema import exact_match_attention, lowering_conditions
from exactformer.verify.executor.exact import run
from exactformer.verify.executor.forward import forward_with_cache
from exactformer.verify.mpc.check import build as build_program
from exactformer.verify.mpc.check import check_batches
from exactformer.verify.verifier import verify

import exactformer as xf


def below_ln_s(fmt) -> Fraction:
    """The largest grid eta with round(e^-eta S) != 0."""
    return MatchHead.smallest_eta(fmt) - fmt.step


def head_vs_ema(model, x: np.ndarray) -> None:
    """The lowered head's output at positions 1..N equals fixed-point EMA of the indicator value
    (queries (M - x) mod M, keys x) in the model's format, bit for bit."""
    fmt = parse_format(model.precision)
    M = model.task_params["modulus"]
    _, cache = forward_with_cache(model, Match2Task().encode_arrays(model, x), fmt)
    z = cache.raw["blocks.0.attn.hook_z"][:, 1:, 0, 0]
    ones = np.full(x.shape + (1,), fmt.scale, dtype=np.int64)
    ema = exact_match_attention(((M - x) % M)[..., None], x[..., None], ones, fmt=fmt)
    assert np.array_equal(z, ema.total[..., 0])
    pattern = cache.raw["blocks.0.attn.hook_pattern"][:, 0, 1:, :]  # [B, N, 1 + N]
    w = np.asarray(ema.weight)
    assert np.array_equal(pattern[..., 0], np.where(ema.count == 0, fmt.scale, 0))  # BOS: 1 iff no match
    match = (x[:, None, :] == ((M - x) % M)[:, :, None])
    assert np.array_equal(pattern[..., 1:], np.where(match, w[..., None], 0))


@pytest.mark.parametrize("frac", [3, 4, 6])
def test_lowered_head_is_fixed_point_ema_bit_for_bit(frac):
    """At the smallest grid eta above ln S (weights, BOS weight and output equal EMA's) for
    S = 2^3, 2^4, 2^6; at the largest grid eta below it they differ."""
    n, M = (1 << frac) - 1, 5
    fmt = FixedPoint.binary(int_bits=frac + 3, frac_bits=frac)
    eta = MatchHead.smallest_eta(fmt)
    assert eta > math.log(fmt.scale) > below_ln_s(fmt)
    model = match2(n, M, eta=eta, precision=fmt)
    assert lowering_conditions(fmt, eta, code_bits(M), n) == MatchHead.conditions(fmt, eta, code_bits(M), n)
    x = np.random.default_rng(frac).integers(0, M, size=(40, n))
    x[0] = 0  # c = N for every position
    head_vs_ema(model, x)
    with pytest.raises(AssertionError):
        head_vs_ema(match2(n, M, eta=below_ln_s(fmt), precision=fmt), x)


def test_lowered_head_is_ema_on_every_input_nearest_rounding():
    fmt = FixedPoint.binary(int_bits=5, frac_bits=3, rounding="nearest-even")
    model = match2(4, 5, precision=fmt)
    assert model.params["eta"].value > math.log(2 * fmt.scale)  # nearest-even: eta > ln 2S
    x = np.array(np.meshgrid(*[np.arange(5)] * 4, indexing="ij")).reshape(4, -1).T
    head_vs_ema(model, x)
    assert verify(model, "certify").passed


def test_spec_is_the_ground_truth_on_every_input():
    for n, M in ((4, 5), (3, 8), (5, 1)):
        model = match2(n, M)
        task = Match2Task()
        batch = next(task.exhaustive(model, batch=M**n))
        assert np.array_equal(task.spec(model).evaluate(batch.tokens)[:, 1:], batch.truth)
        assert np.array_equal(batch.truth, match2_truth(batch.arrays[0], M))


CASES = [  # (n, M, builder keywords, expected verdict)
    (5, 6, {}, True),
    (6, 4, {}, True),  # even M: x = M/2 pairs with itself
    (4, 9, {"precision": FixedPoint.binary(5, 3, rounding="nearest-even")}, True),
    (5, 6, {"precision": "binary:int=4,frac=3", "eta": 1}, False),  # eta = 1 < ln 8: keys leak into rows without a match
    (6, 4, {"precision": "binary:int=5,frac=2", "eta": 2}, False),  # S = 4 < c = 6 on the all-equal input
]


@pytest.mark.parametrize("n,M,kw,expected", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_certificate_agrees_with_exhaustive(n, M, kw, expected):
    model = match2(n, M, **kw)
    cert, exh = verify(model, "certify"), verify(model, "exhaustive")
    assert exh.passed == expected and exh.inputs_covered == (M**n if expected else exh.inputs_covered)
    assert cert.passed == expected, cert.reason
    if not expected:
        assert cert.counterexample is not None and len(cert.counterexample["input"]) == n


def test_rows_that_are_not_ema_are_unproven_even_where_the_answers_hold():
    """The certificate proves the rows are EMA's, a stronger fact than the answers: eta = 2 < ln 8
    answers all 6^5 inputs right at N = 5, yet is not certified (no counterexample: "unproven")."""
    model = match2(5, 6, precision="binary:int=4,frac=3", eta=2)
    assert verify(model, "exhaustive").passed
    r = verify(model, "certify")
    assert not r.passed and r.counterexample is None and r.reason.startswith("unproven") and "not 0" in r.reason


def test_the_paper_setting_n32_m37():
    """P2 §5.3: N = 32, M = 37. One layer, one head, proved for all 37^32 inputs; the four-way
    check (truth, MPC, EMA program ideal and fixed, the softmax model) agrees, heads bit for bit."""
    m = xf.build("match2", n=32, modulus=37)
    c = m.compiled
    assert (c.n_layers, c.n_heads, c.d_model, c.d_head) == (1, 1, 2 * 6 + 4, 7)
    assert c.params["lowering_conditions"].value["ok"] and c.precision == "binary:int=6,frac=5"
    r = xf.verify(m)
    assert r.passed and r.inputs_covered == "all" and r.details["heads"][0]["max_count"] == 32
    assert m([0] * 31 + [5]) == [1] * 31 + [0]
    rep = build_program("match2", 32, modulus=37).verify("sample", samples=300, seed=7)
    assert rep.passed and rep.levels[-2] == "softmax binary:int=6,frac=5" and rep.heads_compared == rep.inputs


def test_counts_with_many_distinct_outputs_share_classes():
    """At N = 1024 the head takes 512 distinct outputs c round(S/c)/S: counts share boxed classes
    (at most 256) and the proof still holds; with S = 512 < c it fails (no runner: unproven)."""
    m = match2(1024, 37)
    r = verify(m, "certify")
    head = r.details["heads"][0]
    assert r.passed and head["max_count"] == 1024 and head["count_classes"] == MAX_COUNT_CLASSES
    bad = match2(1024, 37, precision="binary:int=12,frac=9", eta=7)
    res = certify(bad, parse_format(bad.precision), Match2Task())
    assert not res.passed and "not determined" in res.reason


def test_mutants_are_rejected_with_counterexamples():
    base = match2(32, 37)
    fmt = parse_format(base.precision)
    low = match2(32, 37, eta=below_ln_s(fmt))  # eta <= ln S
    r = verify(low, "certify")
    assert not r.passed and "rounds to 1/32, not 0" in r.reason and r.counterexample is not None
    small = match2(32, 37, precision="binary:int=8,frac=4", eta=4)  # S = 16 < c = 32
    r = verify(small, "certify")
    assert not r.passed and "matching keys the proved answer is 0" in r.reason
    assert r.counterexample["expected"][r.counterexample["answer_position"] - 1] == 1
    # the four-way check's L3 level catches the eta mutant too (a head output differs from EMA's)
    prog = build_program("match2", 32, modulus=37).compiled
    x = np.zeros((2, 32), dtype=np.int64)
    rep = check_batches(prog, [("sample", x)], [fmt], "sample", 0, True, low)
    assert not rep.passed and rep.counterexample.level == f"softmax {fmt.name}"


def _embed_mutant(model, fn):
    """The model with its token embedding table changed in place by ``fn(num, layout)``."""
    t = model.embed.table
    num = np.array(t.num, copy=True)
    fn(num, model.layout)
    return dataclasses.replace(model, embed=dataclasses.replace(model.embed, table=ExactTensor(num, t.den)))


def test_the_certificate_reads_the_weights():
    base = match2(6, 5)
    M = 5

    def swap_query(num, lay):  # the query code of each residue is its own code: not Match2
        s, w = lay["qcode"]
        num[:M, s:s + w] = codes(np.arange(M), w) * num[:M, s:s + w].max()

    def second_bos(num, lay):  # residue 0 also carries the default (BOS) marker
        num[0, lay["bos"][0]] = num[M, lay["bos"][0]]

    def uneven(num, lay):  # one query code entry doubled
        num[1, lay["qcode"][0]] *= 2

    wrong = _embed_mutant(base, swap_query)
    r = verify(wrong, "certify")
    assert not r.passed and r.counterexample is not None and not verify(wrong, "exhaustive").passed
    assert "the model counts the pair, the task does not" in r.reason  # the specification's relation check
    for fn, reason in ((second_bos, "default"), (uneven, "magnitudes")):
        r = verify(_embed_mutant(base, fn), "certify")
        assert not r.passed and reason in r.reason, (fn.__name__, r.reason)
    W_K = base.blocks[0].attn.W_K  # the BOS key at b (not b - 1): ties with a match
    num = np.array(W_K.num, copy=True)
    num[0, base.layout["bos"][0], code_bits(M)] += W_K.den
    r = verify(base.replace_weight("blocks.0.attn.W_K", ExactTensor(num, W_K.den)), "certify")
    assert not r.passed and "not ordered" in r.reason


def test_answers_are_stable_across_batches_and_calls():
    m = xf.build("match2", n=12, modulus=7)
    x = np.random.default_rng(1).integers(0, 7, size=(7, 12))
    full = m([list(r) for r in x])
    assert m([list(r) for r in x]) == full == match2_truth(x, 7).tolist()
    for size in (1, 2, 7):
        assert sum((m([list(r) for r in x[i:i + size]]) for i in range(0, 7, size)), []) == full
    code = ("import numpy as np, exactformer as xf; m = xf.build('match2', n=12, modulus=7); "
            "print(m([list(r) for r in np.random.default_rng(1).integers(0, 7, size=(7, 12))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(full)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(Match2Error, match="n must be an integer in"):
        match2(0)
    with pytest.raises(Match2Error, match="modulus must be"):
        match2(4, modulus=0)
    with pytest.raises(Match2Error, match="eta must be > 0"):
        match2(4, eta=-1)
    with pytest.raises(Match2Error, match="no grid eta satisfies the lowering condition.*smallest precision"):
        match2(32, precision="binary:int=8,frac=4")  # S = 16 < N = 32
    m = xf.build("match2", n=4, modulus=5)
    with pytest.raises(Match2Error, match=r"residues must lie in \[0, 5\)"):
        m([0, 1, 2, 5])


def test_runs_in_transformer_lens():
    pytest.importorskip("transformer_lens", reason="transformer_lens not installed (extra [lens])")
    import torch

    m = xf.build("match2", n=16, modulus=11)
    x = np.random.default_rng(2).integers(0, 11, size=(32, 16))
    x[0] = 0
    tokens = m.encode_batch([list(r) for r in x])
    with torch.no_grad():
        logits = m.to_transformer_lens()(torch.as_tensor(tokens)).double().numpy()
    ref = run(m.compiled, tokens, Float64).logits  # [B, N, 2] at the answer positions
    assert np.allclose(logits[:, 1:], ref, rtol=0, atol=1e-5 * max(1.0, np.abs(ref).max()))
    # eta >= ln(8(N + 1)) also makes the float model right (not only the fixed-point one)
    assert np.array_equal(logits[:, 1:].argmax(-1), match2_truth(x, 11))
