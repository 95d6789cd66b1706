"""The smt mode (verify/smt, docs/smt.md): a second prover that must agree with certify and exhaustive.

* every task encoding gives the task's own truth on its inputs, and admits exactly its inputs;
* small builds get the same verdict from smt, certify and exhaustive, and so do their weight,
  causal-flag, label and answer-position mutants; every smt counterexample is answered wrong by the
  executor, and its recorded torch replay is what the float64 torch module answers;
* a time-out is "unknown", a failure; the refusals (no z3, floats, what is not encoded) are one line.

The full sweep (every weight construction at N = 4, 6, 8 and all their mutants) is marked slow.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from typer.testing import CliRunner

import exactformer as xf
from exactformer.cli.main import app
from exactformer.verify.executor.exact import run
from exactformer.verify.executor.torch_run import run_torch
from exactformer.verify.smt import ESTIMATE_LIMIT, estimate
from exactformer.verify.smt.prover import label
from exactformer.verify.smt.sym import Enc
from exactformer.verify.smt.truth import truth_of
from exactformer.verify.verifier import VerifyError, check_batches, task_of
from mutants import shift_keys, weight_mutants
from registered import small_kwargs, weight_constructions

#: builds small enough for the solver where the registered example is not: nearest neighbour's input
#: vectors are unknowns of the problem (one dimension on a coarse grid)
TINY = {"nearest-neighbor": dict(d_in=1, input_frac_bits=1)}
#: the N of the mutant sweep where N = 4 has too many inputs to run each mutant's every input (Match2: 37^4)
MUTANT_N = {"match2": 2}


def build(name: str, n: int):
    return xf.build(name, **(small_kwargs(name) | TINY.get(name, {}) | {"n": n})).compiled


def model_scale(model) -> int:
    return int(xf.parse_format(model.precision).scale)


def exhaustive_passes(model) -> bool:
    return xf.verify(model, mode="exhaustive").passed


def check_counterexample(model, report) -> None:
    """The smt counterexample is answered wrong by the executor, and its torch replay is the torch module's."""
    cex = report.counterexample
    assert cex is not None, report.reason
    task = task_of(model)
    tokens = task.encode_batch(model, [cex["input"]])
    T = np.shape(getattr(tokens, "tokens", tokens))[1]
    a = 0 if cex["answer_position"] is None else list(model.answer_positions_for(T)).index(cex["answer_position"])
    truth = np.asarray(task.truth(model, *task.to_arrays(model, [cex["input"]]))).reshape(-1)[a]
    assert label(truth.item()) == cex["expected"]
    got = run(model, tokens, xf.parse_format(model.precision)).answers[0][a]
    # wrong: another answer, or a tie (None: never right, whatever the truth)
    assert got is None or label(got) != cex["expected"], f"the executor answers {cex['input']} right"
    assert cex["got"] == (None if got is None else label(got))
    torch = cex["torch_float64"]
    got_torch = run_torch(model, tokens, "float64").answers[0][a]
    assert torch["ran"] and torch["wrong"] == (got_torch is None or label(got_torch) != cex["expected"]), (cex, got_torch)


# ------------------------------------------------------------------------------------------------
# the tasks' truth
# ------------------------------------------------------------------------------------------------


def _code(truth, row: np.ndarray, vectors: dict[int, np.ndarray], a: int):
    fixed = {}
    for p, d in enumerate(truth.domains):
        i = int(np.searchsorted(d, row[p]))
        assert i < d.size and d[i] == row[p], f"token {row[p]} at position {p} is outside the encoding's domain"
        fixed[p] = i
    enc = Enc(truth.domains, fixed, vectors=truth.vectors, fixed_vectors=vectors)
    assert all(c.value() for c in truth.constraints(enc)), f"a task input fails the encoding's constraints: {row}"
    return truth.values[truth.code(enc, a).value()]


@pytest.mark.parametrize("name", sorted(weight_constructions()))
def test_every_task_encoding_is_the_tasks_truth(name):
    """On every input (at most 300 of them: all at N = 4 where that is few, else sampled and
    adversarial), the encoded truth is the task's own."""
    model = build(name, 4)
    task, truth = task_of(model), truth_of(task_of(build(name, 4)), model)
    batches = task.exhaustive(model) if task.count(model) <= 300 else iter(
        [*task.adversarial(model, 150, 1), *task.sample(model, 150, 2)])
    seen = 0
    for b in batches:
        want = np.asarray(b.truth).reshape(len(b), -1)
        ids, vecs = np.asarray(getattr(b.tokens, "tokens", b.tokens)), getattr(b.tokens, "vectors", None)
        for i in range(len(b)):
            vectors = {p: vecs.num[i, p] * (model_scale(model) // vecs.den) for p in truth.vectors} if vecs else {}
            for a in range(want.shape[1]):
                assert label(_code(truth, ids[i], vectors, a)) == label(want[i, a].item()), (name, b.example(i), a)
        seen += len(b)
    assert seen and want.shape[1] == truth.answers


@pytest.mark.parametrize("name,n", [("mqar", 4), ("mqar", 6), ("mqar-rnn", 4)])
def test_constraints_admit_exactly_the_tasks_inputs(name, n):
    """MQAR's inputs are not every combination of its positions' tokens: the encoding's constraints
    (distinct keys, the second half a permutation) hold on exactly the task's count of them."""
    model = build(name, n)
    task = task_of(model)
    truth = truth_of(task, model)
    enc = Enc(truth.domains, tab_max=1 << 22)
    cons = truth.constraints(enc)
    deps = sorted({p for c in cons for p in c.deps})
    deps_all, arrs = enc.align(cons)
    ok = np.ones([enc.size(p) for p in deps_all], dtype=bool)
    for arr in arrs:
        ok = ok & arr
    free = [p for p in range(len(truth.domains)) if enc.free(p) and p not in deps]
    assert deps == list(deps_all)
    assert int(ok.sum()) * math.prod(enc.size(p) for p in free) == task.count(model)


# ------------------------------------------------------------------------------------------------
# verdicts: smt, certify and exhaustive agree
# ------------------------------------------------------------------------------------------------

SMALL = [("index-lookup", 4), ("equality", 4), ("threshold", 4), ("equality-rnn", 4), ("dyck-rnn", 4), ("k-hop", 4),
         ("nearest-neighbor", 4)]


@pytest.mark.parametrize("name,n", SMALL)
def test_smt_certify_and_exhaustive_agree(name, n):
    model = build(name, n)
    smt = xf.verify(model, mode="smt")
    assert smt.passed and smt.inputs_covered == "all" and smt.mode == "smt", smt.reason
    if task_of(model).count(model) <= 1 << 22:
        assert exhaustive_passes(model)
    if "certify" in task_of(model).modes:
        assert xf.verify(model, mode="certify").passed


@pytest.mark.parametrize("name,n,picks", [("equality", 4, 12), ("index-lookup", 4, 12), ("equality-rnn", 4, 12),
                                          ("dyck-rnn", 4, 12)])
def test_mutants_get_the_exhaustive_verdict(name, n, picks):
    """A seeded handful of each model's mutants (tests/mutants.py): smt's verdict is exhaustive's,
    and certify never proves one that exhaustive refutes."""
    model = build(name, n)
    mutants = list(weight_mutants(model, seed=3))
    rng = np.random.default_rng(0)
    chosen = [mutants[i] for i in rng.choice(len(mutants), size=min(picks, len(mutants)), replace=False)]
    chosen += [m for m in mutants if m[0].startswith("answer")]  # labels swapped, answer positions shifted
    refuted = 0
    for what, mutant in chosen:
        try:
            exh = xf.verify(mutant, mode="exhaustive")
        except VerifyError:
            continue
        if exh.reason.startswith("weights not representable"):
            continue
        smt = xf.verify(mutant, mode="smt")
        assert smt.passed == exh.passed, (what, smt.reason, smt.counterexample, exh.counterexample)
        if not smt.passed:
            refuted += 1
            check_counterexample(mutant, smt)
    assert refuted  # the handful has wrong mutants: a test that cannot fail is no test


def test_a_shifted_position_code_is_refuted_with_the_executors_counterexample():
    model = build("equality", 8)
    bad = shift_keys(model)  # each position compared with the wrong partner
    r = xf.verify(bad, mode="smt")
    assert not r.passed and not exhaustive_passes(bad) and not xf.verify(bad).passed
    check_counterexample(bad, r)
    assert r.counterexample["torch_float64"]["wrong"]


def test_the_architecture_pages_construction_by_its_tasks_table(monkeypatch):
    """A user's task that changes the encoding (index first) has no encoding of its own: its truth is
    tabulated from the task (small N), and smt agrees with certify and exhaustive."""
    from test_blocks import DECORATOR, IndexFirstTask, index_first
    from exactformer.constructions.core import registry
    from exactformer.constructions.core.ir import ExactTensor

    names = {"construction": registry.construction, "IndexFirstTask": IndexFirstTask,
             "Claim": registry.Claim, "SizeRows": registry.SizeRows}
    eval(DECORATOR.removeprefix("@"), names)(index_first)
    try:
        m = xf.build("test-index-first", n=4, alphabet=4).compiled
        r = xf.verify(m, mode="smt")
        assert r.passed and "tabulated from IndexFirstTask.truth" in r.reason
        b_U = m.b_U
        weak = m.replace_weight("unembed.b_U", ExactTensor(b_U.num + np.array([3, 0, 0, 0]) * b_U.den, b_U.den))
        r = xf.verify(weak, mode="smt")
        assert not r.passed and not exhaustive_passes(weak)
        check_counterexample(weak, r)
    finally:
        registry._REGISTRY.pop("test-index-first")


# ------------------------------------------------------------------------------------------------
# time-outs, refusals, the default choice, the command line
# ------------------------------------------------------------------------------------------------


def test_a_time_out_is_unknown_and_fails():
    r = xf.verify(build("match2", 4), mode="smt", smt_timeout=0.01)
    assert not r.passed and r.reason.startswith("unknown: ") and r.inputs_covered == 0


def test_refusals_are_one_line(monkeypatch):
    m = build("equality", 4)
    with pytest.raises(VerifyError, match=r"^mode: smt covers fixed-point formats only, not float32"):
        xf.verify(m, mode="smt", arithmetic="float32")
    with pytest.raises(VerifyError, match=r"^mode: smt: MQAR's nn variant .* has no smt encoding"):
        xf.verify(xf.build("mqar", n=4, variant="nn"), mode="smt")
    with pytest.raises(VerifyError, match=r"^smt_timeout: only with mode smt"):
        xf.verify(m, mode="certify", smt_timeout=5)
    for bad in (0, -1, float("inf"), "5", True):
        with pytest.raises(VerifyError, match=r"^smt_timeout: must be a number of seconds > 0"):
            xf.verify(m, mode="smt", smt_timeout=bad)
    monkeypatch.setattr("exactformer.verify.smt.available", lambda: False)
    with pytest.raises(VerifyError, match=r"^mode: smt needs z3, which is not installed: pip install -e '\.\[smt\]'$"):
        xf.verify(m, mode="smt")
    r = CliRunner().invoke(app, ["verify", "equality", "--n", "4", "--mode", "smt"])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: --mode: smt needs z3, which is not installed: pip install -e '.[smt]'"]


def test_the_command_line_runs_smt_with_progress_and_a_budget():
    r = CliRunner().invoke(app, ["verify", "index-lookup", "--n", "16", "--mode", "smt", "--smt-timeout", "120"])
    assert r.exit_code == 0 and "PASS" in r.stdout and "(smt)" in r.stdout
    for args, message in ((["--smt-timeout", "x"], "--smt-timeout: must be a number of seconds > 0, got 'x'"),
                          (["--smt-timeout", "0"], "--smt-timeout: must be a number of seconds > 0, got '0'"),
                          (["--mode", "sample", "--smt-timeout", "3"], "--smt-timeout: only with mode smt")):
        r = CliRunner().invoke(app, ["verify", "equality", "--n", "4", *args])
        assert r.exit_code == 2 and message in r.output, r.output
    r = CliRunner().invoke(app, ["verify", "match2", "--n", "4", "--mode", "smt", "--smt-timeout", "0.01"])
    assert r.exit_code == 1 and "FAIL" in r.stdout and "unknown" in r.stdout


def test_the_default_runs_smt_where_it_is_small_enough_and_says_why():
    m = build("equality-rnn", 32)  # no certificate, 2^32 inputs: above the exhaustive limit
    assert estimate(m, task_of(m)) <= ESTIMATE_LIMIT
    r = xf.verify(m)
    assert r.passed and r.mode == "smt" and r.inputs_covered == "all"
    assert "above the exhaustive limit" in r.mode_reason and "smt: a proof for every input" in r.mode_reason
    r = xf.verify(m, samples=10)  # sampling asked for: sampled
    assert r.passed and r.mode == "sample"
    big = build("prefix-sums", 8)  # six attention layers: too large an estimate for the default
    r = xf.verify(big)
    assert r.mode == "sample" and "smt: its size estimate" in r.mode_reason and "above the default's limit" in r.mode_reason


# ------------------------------------------------------------------------------------------------
# the full sweep
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(weight_constructions()))
def test_every_construction_and_its_mutants_small_n(name):
    """At N = 4, 6, 8: smt, certify and exhaustive agree on the construction (where exhaustive fits
    its limit; else smt and certify); at N = 4 (Match2: 2) on every mutant of tests/mutants.py, smt agrees with
    exhaustive (nearest neighbour, whose inputs no enumeration covers: smt's proofs survive 2000
    sampled inputs) and certify never proves what exhaustive refutes; every
    counterexample replays."""
    for n in (4, 6, 8):
        model = build(name, n)
        smt = xf.verify(model, mode="smt")
        assert smt.passed, (n, smt.reason, smt.counterexample)
        if task_of(model).count(model) <= 1 << 22:
            assert exhaustive_passes(model), n
        if "certify" in task_of(model).modes:
            assert xf.verify(model, mode="certify").passed, n
    model = build(name, MUTANT_N.get(name, 4))
    fmt = xf.parse_format(model.precision)
    for what, mutant in weight_mutants(model, seed=1):
        if name in TINY:  # 2000 sampled inputs
            try:
                cex = check_batches(mutant, fmt, task_of(mutant).sample(mutant, 2000, 5))[1]
            except ValueError:  # weights the format cannot hold; answer positions whose inputs the task cannot draw
                continue
            smt = xf.verify(mutant, mode="smt")
            assert cex is None or not smt.passed, (what, smt.reason, cex)  # sampling can miss what smt finds
            if not smt.passed:
                check_counterexample(mutant, smt)
            continue
        exh = xf.verify(mutant, mode="exhaustive")
        if exh.reason.startswith("weights not representable"):
            continue
        smt = xf.verify(mutant, mode="smt")
        assert smt.passed == exh.passed, (what, smt.reason, smt.counterexample, exh.counterexample)
        if not smt.passed:
            check_counterexample(mutant, smt)
        if "certify" in task_of(mutant).modes:  # weights, causal flags, labels and answer positions alike
            cert = xf.verify(mutant, mode="certify")
            assert not (cert.passed and not exh.passed), (what, cert.reason)


def test_the_pages_examples_run():
    """docs/smt.md's examples as written: its python block, and its exactformer commands."""
    import re
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "smt.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        exec(compile(block, "docs/smt.md", "exec"), {})
    commands = [line.split("#")[0].strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S)
                for line in block.splitlines() if line.startswith("exactformer ")]
    assert len(commands) == 2
    for c in commands:
        r = CliRunner().invoke(app, shlex.split(c)[1:])
        assert r.exit_code == 0 and "PASS" in r.stdout, (c, r.output)


@pytest.mark.parametrize("S", [1, 2, 8, 9, 36, 1000])
@pytest.mark.parametrize("nearest", [False, True])
def test_term_arithmetic_is_the_tables(S, nearest):
    """The z3 side of every integer step (a term: a variable x in [lo, hi]) gives, at each value of
    x, what the Python side (a table of those values) gives: rounding by any scale (a power of two
    or not, floor or nearest-even), products, saturation, a lookup over a window, the softmax's
    quotient."""
    import z3

    from exactformer.verify.smt.sym import Tab, Term, clip, lookup, mul_const, rnd, variable, width
    from exactformer.verify.smt.transformer import Forward

    lo, hi = -5 * S - 7, 5 * S + 7
    x = variable(f"x_test_{S}", width(lo, hi))
    term, vals = Term(x, lo, hi), np.arange(lo, hi + 1, dtype=np.int64)
    table = Tab((0,), vals)
    enc = Enc([vals])  # position 0's token is the value itself: its table is the same function
    steps = [lambda s: rnd(enc, mul_const(enc, s, 3), S, nearest), lambda s: clip(enc, s, -S, 2 * S),
             lambda s: lookup(enc, lambda u: np.clip(u, -S, S) // 3 + (np.clip(u, -S, S) > 4), s, window=(-S, S))]
    for step in steps:
        want = step(table).arr
        got = step(term)
        for v, w in zip(vals[:: max(1, len(vals) // 31)], want[:: max(1, len(vals) // 31)]):
            e = z3.simplify(z3.substitute(enc.expr(got), (x, z3.BitVecVal(int(v), x.size()))))
            assert e.as_signed_long() == int(w), (S, nearest, int(v))
    fm = type("F", (), {"S": S, "hi": 6 * S, "nearest": nearest})()  # the quotient of a softmax weight
    q = Forward._quotient(type("P", (), {"enc": enc, "fm": fm})(), Term(x, 0, hi), Term(variable("z_test", 16), 1, 6 * S))
    for e_, z_ in [(0, 1), (S, S), (S, 3 * S), (hi, 2 * S + 1), (7, 2 * S + 3)]:
        sub = z3.substitute(enc.expr(q), (x, z3.BitVecVal(e_, x.size())), (variable("z_test", 16), z3.BitVecVal(z_, 16)))
        num, den = e_ * S, z_
        f, r = divmod(num, den)
        want = f + (nearest and (2 * r > den or (2 * r == den and f % 2 == 1)))
        assert z3.simplify(sub).as_signed_long() == min(want, 6 * S), (e_, z_)
