"""Induction heads and k-hop as weights (P2 Thms 5.4, 5.6; constructions/theorems/induction_heads.py).

* The API and the command line build them like every other construction; P2's worked examples.
* Layers and width as claimed: 2 layers for induction heads, floor(log2 k) + 3 for k-hop.
* The pointer certificate agrees with every input at small N, and the five-way differential check
  (truth, protocol, ideal program, fixed-point program, weights) passes every equality pattern.
* Wrong models -- an off-by-one pointer, a head reading the wrong slot, a clean-up that lets values
  through, a missing default -- and weight mutants are refuted with real counterexamples.
* The default builds are right in float32 and float64 (torch) and in TransformerLens.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import exactformer as xf
from exactformer.api import BuildError
from exactformer.cli.main import app
from exactformer.constructions.codes.positions import CodeView
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.mpc.applications import k_hop_truth, restricted_growth_strings
from exactformer.constructions.theorems.induction_heads import InductionHeadsError
from exactformer.precision import parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.executor.exact import run
from exactformer.verify.mpc import check as mpc_check
from exactformer.verify.verifier import VerifyError, task_of

W = [0, 0, 1, 2, 1, 0, 1, 2, 0]  # aabcbabca (P2 Sec. 5.2's example)


def _answers(model, w) -> np.ndarray:
    """The exact executor's answers, -1 for "no answer" (as k_hop_truth writes it)."""
    res = run(model.compiled, model.encode_batch(np.atleast_2d(w).tolist()), parse_format(model.precision))
    return np.array([[-1 if a is None else a for a in row] for row in res.answers])


# ------------------------------------------------------------------------------------------------
# building, answers, sizes
# ------------------------------------------------------------------------------------------------


def test_the_papers_examples():
    h = xf.build("k-hop", n=9, k=2, alphabet=3)
    assert h(W) == [None, 0, None, None, None, None, 1, 2, 0]  # the 2-hop at position 9 is a
    assert h([W, W]) == [h(W)] * 2 and xf.k_hop(9, 2, 3)(W) == h(W)
    ih = xf.build("induction-heads", n=9, alphabet=3)
    assert ih(W) == [None, 0, None, None, 2, 1, 0, 1, 1]  # sigma(w, 9) = 7, w_7 = b
    assert xf.verify(h).passed and xf.verify(ih).passed


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 64, 100])
def test_layers_and_width(k):
    m = xf.build("k-hop", n=32, k=k, alphabet=5)
    assert m.n_layers == (2 if k == 1 else k.bit_length() + 2) <= (k - 1).bit_length() + 3
    M, mm = m.params["M"].value, m.params["m"].value
    assert m.d_model == (4 * M + 4 * mm + 1 if k == 1 else 6 * M + 6 * mm + 1) and m.n_heads <= 2
    assert mm == 6 and M == 5  # ceil(log2 33), balanced words of 4 for 5 symbols plus the bottom bit
    assert m.d_mlp == 6 * (M + mm) * (1 if k & (k - 1) == 0 else 2)  # not in the width: 6 units per cleaned column
    assert m.width == m.d_model and (k > 1 or m.d_mlp > m.d_model)


def test_the_docstring_says_what_the_width_counts():
    """The module's docstring gives the width and the MLP units as built, and does not count the
    MLPs in the width (it said they were)."""
    from exactformer.constructions.theorems import induction_heads as ih

    doc = " ".join(ih.__doc__.split())
    assert "width (d_model) 4M + 4m + 1 (k = 1) or 6M + 6m + 1" in doc
    assert "6(M + m) in a layer that follows one pointer and 12(M + m) in one that follows two" in doc
    assert "not in the width" in doc and "counted in the width" not in doc


def test_bad_parameters_name_what_the_user_typed():
    with pytest.raises(InductionHeadsError, match=r"^k must be an integer in \[1, 2\^30\], got 0"):
        xf.build("k-hop", n=9, k=0)
    with pytest.raises(BuildError, match="hops"):
        xf.build("k-hop", n=9, hops=2)  # the protocol's name is not the builder's
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 3\)"):
        xf.build("k-hop", n=9, k=2, alphabet=3)([0, 0, 1, 2, 1, 0, 1, 2, 3])
    with pytest.raises(InductionHeadsError, match="precision must be a fixed-point format"):
        xf.build("induction-heads", n=8, precision="float32")
    with pytest.raises(InductionHeadsError, match="the smallest precision that works is binary:int="):
        xf.build("induction-heads", n=8, precision="binary:int=3,frac=2")


def test_the_command_line(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["verify", "k-hop", "--n", "9", "--k", "2", "--alphabet", "3", "--json"])
    assert r.exit_code == 0 and '"mode": "certify"' in r.stdout and '"passed": true' in r.stdout
    r = runner.invoke(app, ["build", "k-hop", "--n", "9", "--k", "3", "--alphabet", "3", "--out", str(tmp_path / "m")])
    assert r.exit_code == 0 and xf.verify(xf.load(tmp_path / "m")).passed
    r = runner.invoke(app, ["verify", "k-hop", "--n", "8", "--k", "0"])
    assert r.exit_code == 2 and "k must be an integer in [1, 2^30]" in r.output


# ------------------------------------------------------------------------------------------------
# the certificate against every input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,k,S", [
    (5, 1, 3), (5, 2, 3), (4, 5, 4),
    # slow: k = 2 at n = 5 and the deeper k = 5 (4 + 1 hops) are checked by the cases above
    pytest.param(6, 3, 3, marks=pytest.mark.slow), pytest.param(7, 2, 2, marks=pytest.mark.slow),
])
def test_certificate_agrees_with_every_input(n, k, S):
    m = xf.build("k-hop", n=n, k=k, alphabet=S)
    cert, exh = xf.verify(m, mode="certify"), xf.verify(m, mode="exhaustive")
    assert cert.passed and cert.inputs_covered == "all" and exh.passed and exh.inputs_covered == S**n


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.slow
def test_five_levels_agree_on_every_equality_pattern(k):
    """Truth, protocol, ideal and fixed-point program, and the weights, on every restricted growth
    string of length 8 (every string over every alphabet, up to renaming: 4140 of them)."""
    r = mpc_check.check(mpc_check.build("k-hop", 8, hops=k, alphabet=8), "exhaustive")
    assert r.passed and r.inputs == 4140 and r.levels[-2].startswith("softmax binary:"), r.reason


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3])
def test_every_equality_pattern_up_to_ten(k):
    for n in range(2, 11):
        m = xf.build("k-hop", n=n, k=k, alphabet=n)
        for x in restricted_growth_strings(n, n, 1 << 15):
            assert np.array_equal(_answers(m, x), k_hop_truth(x, k)), (n, k)


# ------------------------------------------------------------------------------------------------
# wrong models
# ------------------------------------------------------------------------------------------------


def _refuted(model):
    """The certificate fails with a counterexample the executor answers wrong."""
    r = xf.verify(model)
    assert not r.passed and r.counterexample is not None, r.reason
    w = r.counterexample["input"]
    assert not np.array_equal(_answers(model, w), k_hop_truth(np.atleast_2d(w), model.params["k"].value))
    return r


def _slot_cols(model, name):
    start, width = model.compiled.layout[name]
    return np.arange(start, start + width)


def _with_blocks(model, blocks):
    pe = model.compiled.pos_embed
    return xf.Model(dataclasses.replace(model.compiled, pos_embed=dataclasses.replace(pe, blocks=blocks)))


def test_off_by_one_pointer_is_refuted():
    """qprev holds the code of p - 2: the previous-token head reads two tokens back."""
    m = xf.build("k-hop", n=7, k=2, alphabet=3)
    col = int(_slot_cols(m, "qprev")[0])
    kept = tuple(b for b in m.compiled.pos_embed.blocks if b.col != col)
    code = kept[0].code
    wrong = dataclasses.replace(kept[0], code=CodeView(code, "table", np.maximum(np.arange(code.n) - 2, 0)), col=col)
    _refuted(_with_blocks(m, kept + (wrong,)))


def test_a_head_reading_the_wrong_slot_is_refuted():
    """The doubling head's query reads the position's own code (pcode) instead of the pointer P."""
    m = xf.build("k-hop", n=7, k=2, alphabet=3)
    c = m.compiled
    W_Q = c.blocks[2].attn.W_Q
    num = W_Q.num.copy()
    P, pcode = _slot_cols(m, "P"), _slot_cols(m, "pcode")
    num[0][pcode], num[0][P] = num[0][P], 0
    _refuted(xf.Model(c.replace_weight("blocks.2.attn.W_Q", ExactTensor(num, W_Q.den))))


def test_a_clean_up_that_lets_values_through_is_refuted():
    """sigma's clean-up writes clip(u, -1/2, 1/2): the codes of sigma(p) reach the next layers at half
    size, the doubling heads' rows do not settle, and answers go wrong."""
    m = xf.build("k-hop", n=6, k=2, alphabet=3)
    c = m.compiled
    mlp = c.blocks[1].mlp
    W_out, b_out = mlp.W_out.num.copy(), mlp.b_out.num.copy()
    den = mlp.W_out.den
    P = _slot_cols(m, "P")
    W_out[:, P] //= 2  # every unit writing P at half weight: the clip and the cancellation both halved
    b_out[P] //= 2
    broken = c.replace_weight("blocks.1.mlp.W_out", ExactTensor(W_out, den))
    broken = broken.replace_weight("blocks.1.mlp.b_out", ExactTensor(b_out, mlp.b_out.den))
    r = xf.verify(broken)
    assert not r.passed
    if r.counterexample is not None:  # a real one
        _refuted(xf.Model(broken))
    else:  # no input is answered wrong: it says so, and never passes
        assert xf.verify(broken, mode="exhaustive").passed and r.reason.startswith("unproven")


def test_a_missing_default_is_refuted():
    """Without the BOS bonus a row without an earlier occurrence points somewhere else."""
    m = xf.build("induction-heads", n=6, alphabet=3)
    c = m.compiled
    W_K = c.blocks[1].attn.W_K
    num = W_K.num.copy()
    num[0][_slot_cols(m, "bos")] = 0
    r = _refuted(xf.Model(c.replace_weight("blocks.1.attn.W_K", ExactTensor(num, W_K.den))))
    assert r.counterexample["expected"] is None or r.counterexample["got"] != r.counterexample["expected"]


@pytest.mark.parametrize("seed", range(12))
def test_weight_mutants_agree_with_every_input(seed):
    """A weight of the model moved by a grid step or doubled: the certificate passes only if every
    input is answered right, and fails with a real counterexample where one exists."""
    m = xf.build("k-hop", n=5, k=2, alphabet=3)
    rng = np.random.default_rng(seed)
    c = m.compiled
    names = [n for n, t in c.tensors().items() if np.any(t.num != 0)]
    name = names[int(rng.integers(len(names)))]
    t = c.tensors()[name]
    idx = tuple(np.argwhere(t.num != 0)[int(rng.integers(np.count_nonzero(t.num)))])
    num = t.num.copy()
    num[idx] = num[idx] * 2 if seed % 2 else num[idx] - np.sign(num[idx]) * max(1, abs(int(num[idx])) // 2)
    mutant = xf.Model(c.replace_weight(name, ExactTensor(num, t.den)))
    cert, exh = xf.verify(mutant), xf.verify(mutant, mode="exhaustive")
    assert not cert.passed or exh.passed, (name, idx)
    if not exh.passed:
        assert cert.counterexample is not None, (name, idx, cert.reason)
        _refuted(mutant)


# ------------------------------------------------------------------------------------------------
# right wherever it runs
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [
    ("induction-heads", dict(n=16, alphabet=4)),
    # slow: the same property for induction heads (the same builder module and exports) is checked by the case
    # above, k-hop sampled in float64 torch by test_the_certificate_covers_fixed_point_only
    pytest.param("k-hop", dict(n=16, k=5, alphabet=4), marks=pytest.mark.slow),
])
def test_default_builds_are_right_in_torch_and_transformer_lens(name, kw):
    m = xf.build(name, **kw)
    assert set(m.params["arithmetics"].value) == {m.precision, "real", "float64", "float32"}
    for dtype in ("float32", "float64"):
        r = xf.verify(m, mode="sample", samples=200, seed=1, arithmetic=dtype)
        assert r.passed, (dtype, r.reason)
    pytest.importorskip("transformer_lens")
    bridge = m.to_transformer_lens(torch.float32)
    task = m.task
    pos = torch.as_tensor(m.compiled.answer_positions_for(task.length(m.compiled)))
    for b in list(task.adversarial(m.compiled, 100, 3)) + list(task.sample(m.compiled, 100, 4)):
        with torch.no_grad():
            logits = bridge(torch.as_tensor(b.tokens))[:, pos]
        got = np.array([[-1 if m.answers[int(i)] is None else m.answers[int(i)] for i in row]
                        for row in logits.argmax(-1).numpy()])
        assert np.array_equal(got, b.truth)


def test_the_certificate_covers_fixed_point_only():
    """In floats the default mode is the strongest that applies (exhaustive here), asking for the
    certificate is a bad input, and the certificate itself still refuses (it never trusts the plan)."""
    m = xf.build("induction-heads", n=6, alphabet=3)
    r = xf.verify(m, arithmetic="float32")
    assert r.passed and r.mode == "exhaustive" and r.inputs_covered == 3**6, r.reason
    assert "certified in fixed point only" in r.mode_reason
    with pytest.raises(VerifyError, match="mode: no certificate for induction-heads in float32"):
        xf.verify(m, mode="certify", arithmetic="float32")
    task = task_of(m.compiled)
    res = certify(m.compiled, parse_format(m.precision), task, arithmetic="float32")
    assert not res.passed and "fixed-point arithmetic only" in res.reason
    assert Fraction(m.params["lambda"].value) > 0
    big = xf.build("k-hop", n=16, k=3, alphabet=4)  # 4^16 inputs: sampled
    r = xf.verify(big, arithmetic="float64", samples=20, seed=1)
    assert r.passed and r.mode == "sample" and r.seed == 1, r.reason
