"""Recurrent models (P1 Sec. 2's RNN): the bounded Dyck RNN and its certificate for every length
(P1 App. E), the recurrent executor against the plain forward pass, exports, the API and the
command line on recurrent models, and broken models each verifier path rejects."""

from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

import exactformer as xf
from exactformer.cli.main import app
from exactformer.constructions.theorems.dyck import (DyckError, DyckTask, build_from_automaton, dyck_automaton,
                                                    dyck_member, hidden_units)
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.core.recurrent import SparseRows
from exactformer.constructions.core.spec import REJECT
from exactformer.constructions.export import ManifestError
from exactformer.constructions.theorems.index_lookup import IndexLookupTask
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.certify import recurrent as cert
from exactformer.verify.certify.composed import certify
from exactformer.verify.executor.exact import run
from exactformer.verify.executor.forward import forward_reference, forward_with_cache
from random_models import random_rnn


def all_strings(length: int, symbols: int) -> np.ndarray:
    return np.array(list(itertools.product(range(symbols), repeat=length)), dtype=np.int64).reshape(symbols**length, length)


def dyck(**kw) -> xf.Model:
    return xf.build("dyck-rnn", **kw)


# ------------------------------------------------------------------------------------------------
# the task and its automaton
# ------------------------------------------------------------------------------------------------


def test_the_paper_examples_and_the_api():
    m = dyck(types=2, depth=2)
    assert m("([])") is True and m("([)]") is False and m("((") is False
    assert m("([[]])") is False  # depth 3 (P1 App. E: "( [ [ ] ] ) has a depth of 3")
    assert m("([])[]") is True  # "( [ ] ) [ ]" has depth at most 2
    assert m(["()()", "(())", "))((", "[(])"]) == [True, True, False, False]
    assert m([0, 2, 3, 1]) is True  # token ids: open type i = 2i, close = 2i + 1
    assert repr(m) == "<exactformer.Model dyck-rnn n=16 layers=1 heads=0 width=12 precision=binary:int=1,frac=0>"


@pytest.mark.parametrize("types,depth,states,units", [(2, 2, 7, 12), (1, 3, 4, 6), (3, 1, 4, 6), (2, 3, 15, 28)])
def test_automaton_sizes(types, depth, states, units):
    """1 + k + ... + k^D live states (7 for Dyck-(2, 2): P1 App. E) and 2k(1 + ... + k^(D-1)) units."""
    assert dyck_automaton(types, depth).states == states
    assert hidden_units(types, depth) == units == dyck(types=types, depth=depth).width


@pytest.mark.parametrize("types,depth,max_len", [(2, 2, 9), (1, 3, 12), (3, 2, 7), (2, 1, 9)])
def test_the_automaton_is_the_definition(types, depth, max_len):
    """The specification (the automaton the certificate compares with) accepts exactly the strings
    the stack definition accepts, every string up to the length."""
    dfa = dyck_automaton(types, depth)
    for L in range(0, max_len + 1):
        s = all_strings(L, 2 * types)
        assert np.array_equal(dfa.evaluate(s), dyck_member(s, types, depth).astype(np.int64)), L


def test_the_empty_string_and_strings_of_several_lengths():
    """The empty string is a member of every Dyck language (it was refused: "a string of length >= 1"),
    read from h_0; one call may hold strings of several lengths (refused before), answered in order."""
    m = dyck(types=2, depth=2)
    strings = ["", "()", "([)]", "", "(())", "((()))", "[]()"]
    assert m("") is True and m([""]) == [True] and m([[]]) == [True]
    assert m(strings) == [bool(dyck_member(np.array([["()[]".index(c) for c in s]]).reshape(1, len(s)), 2, 2)[0])
                          for s in strings] == [True, True, False, True, True, False, True]
    res = m.run(strings)
    assert res.logits.shape == (len(strings), 1, 2) and [a[0] for a in res.answers] == m(strings)
    assert np.array_equal(res.logits[2], m.run(["([)]"]).logits[0])


def test_a_wrong_answer_on_the_empty_string_is_refuted():
    """The certificate covers length 0: a model whose h_0 reads "reject" (every longer string still
    right) is refuted with the empty string; it was "proved for every string of every length"."""
    m = dyck(types=2, depth=2).compiled
    assert xf.verify(m, mode="certify").details["lengths"].startswith("every length >= 0")
    H = m.hidden  # one more unit: 1 in h_0 only (no input, weight or bias sets it), read as "reject"
    mutant = _with(m, W_hh=SparseRows.from_entries(
        np.repeat(np.arange(H), m.W_hh.width), m.W_hh.cols.reshape(-1), m.W_hh.vals.num.reshape(-1), (H + 1, H + 1)),
        W_ih=ExactTensor(np.r_[m.W_ih.num, np.zeros((1, 4), np.int64)], 1), b=ExactTensor(np.r_[m.b.num, 0], 1),
        h0=ExactTensor(np.r_[m.h0.num, 1], 1), W_U=ExactTensor(np.r_[m.W_U.num, [[1, -2]]], 1), layout={})
    fmt = parse_format(m.precision)
    s = all_strings(6, 4)
    assert np.array_equal(run(mutant, s, fmt).logits, run(m, s, fmt).logits)  # every nonempty string as before
    assert run(mutant, np.zeros((1, 0), np.int64), fmt).answers == [[False]]
    r = xf.verify(mutant, mode="certify")
    assert not r.passed and r.counterexample is not None and r.counterexample["input"] == []
    assert r.counterexample["expected"] == 1 and r.counterexample["got"] == 0


def test_bad_inputs_name_the_parameter():
    m = dyck(types=2, depth=2)
    for bad, msg in (("(a)", "s: a string over '\\(\\)\\[\\]', got the character 'a'"), ("{}", "character '\\{'"),
                     ([0, 9], "token ids")):
        with pytest.raises(DyckError, match=msg):
            m(bad)
    for kw, msg in ((dict(types=5), "types: an integer in \\[1, 4\\], got 5"),
                    (dict(types=4, depth=6), "depth: at most 5 for types=4"), (dict(n=0), "n: an integer in"),
                    (dict(precision="binary:int=0,frac=1"), "precision: a fixed-point format that holds the integers -1")):
        with pytest.raises(DyckError, match=msg):
            dyck(**kw)


# ------------------------------------------------------------------------------------------------
# the certificate for every length
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arithmetic", ["fixed", "real", "float64", "float32", "bfloat16"])
def test_certified_for_every_length_in_every_arithmetic(arithmetic):
    r = xf.verify(dyck(types=2, depth=2), mode="certify", arithmetic=arithmetic)
    assert r.passed and r.reason == "proved for every string of every length" and r.min_margin == "1"
    d = r.details
    assert d["one_hot_or_zero"] and d["each_state_one_automaton_state"]  # the invariant of P1 App. E's DFA
    assert (d["automaton_states"], d["reachable_hidden_states"]) == (7, 13)  # 12 one-hot states and zero


def test_certificate_equals_every_string_up_to_length_14():
    """Every string over ()[] of length 1 .. 14 (4^14 of the longest): the executor's answer equals
    the definition's. Strings are grouped by (the model's hidden state after the prefix, from the
    plain forward pass; the definition's stack): both continue alike from equal pairs, so one
    representative per group and the group's size cover every string (the sizes add up to 4^L)."""
    m = dyck(types=2, depth=2).compiled
    fmt = parse_format(m.precision)
    assert xf.verify(m, mode="certify").passed
    groups: dict = {(): 1}  # representative prefix -> number of strings it stands for
    for L in range(1, 15):
        reps = np.array([list(p) + [a] for p in groups for a in range(4)], dtype=np.int64)
        counts = np.repeat(np.array(list(groups.values()), dtype=object), 4)
        got = np.array([a[0] for a in run(m, reps, fmt).answers])
        assert np.array_equal(got, dyck_member(reps, 2, 2)), L
        _, cache = forward_with_cache(m, reps, fmt)
        h = cache.raw["rnn.hook_h"][:, -1]
        nxt: dict = {}
        for rep, hv, c in zip(reps, h, counts):
            key = (hv.tobytes(), _stack(rep))
            if key not in nxt:
                nxt[key] = (tuple(rep), 0)
            nxt[key] = (nxt[key][0], nxt[key][1] + c)
        groups = dict(nxt.values())
        assert sum(groups.values()) == 4**L


def _stack(s: np.ndarray) -> tuple:
    """The definition's state after ``s``: the open brackets (unbounded), or 'bad' once invalid."""
    stack: list[int] = []
    for t in s.tolist():
        if t % 2 == 0:
            stack.append(t // 2)
            if len(stack) > 2:
                return ("bad",)
        elif not stack or stack.pop() != t // 2:
            return ("bad",)
    return tuple(stack)


@pytest.mark.slow
def test_exhaustive_at_length_11_agrees():
    r = xf.verify(dyck(n=11, types=2, depth=2), mode="exhaustive")
    assert r.passed and r.inputs_covered == 4**11


def _with(model, **fields):
    return dataclasses.replace(model, **fields)


def _mutant_automaton(kind: str):
    dfa = dyck_automaton(2, 2)
    delta = dfa.delta.copy()
    if kind == "wrong transition":  # "(" then "]" leads back to the empty stack
        delta[1, 3] = 0
    else:  # no reject state: a bracket that would reject leaves the state unchanged
        live = np.arange(dfa.states)[:, None]
        delta = np.where(delta == REJECT, np.broadcast_to(live, delta.shape), delta)
    return dataclasses.replace(dfa, delta=delta)


@pytest.mark.parametrize("kind,string", [("wrong transition", "(]"), ("missing reject state", ")")])
def test_wrong_automata_are_refuted_with_their_shortest_string(kind, string):
    wrong = build_from_automaton(_mutant_automaton(kind), 8, 2, 2, FixedPoint.binary(1, 0), "dyck-rnn", "mutant")
    r = xf.verify(wrong, mode="certify")
    assert not r.passed and r.counterexample is not None
    cex = r.counterexample
    assert "".join("()[]"[t] for t in cex["input"]) == string and cex["expected"] == 0 and cex["got"] == 1


def test_weight_mutants_are_refuted():
    m = dyck(types=2, depth=2).compiled
    hh = m.W_hh.vals.num.copy()
    hh[2, 0] = 0  # one transition's weight removed
    h0 = np.zeros_like(m.h0.num)
    h0[3] = 1  # the start is another state
    bU = m.b_U.num.copy()
    bU[0] = 0  # the empty state no longer rejects by default
    for mutant in (_with(m, W_hh=SparseRows(m.W_hh.cols, ExactTensor(hh, 1), m.W_hh.n_cols)),
                   _with(m, h0=ExactTensor(h0, 1)), _with(m, b_U=ExactTensor(bU, 1))):
        r = xf.verify(mutant, mode="certify")
        assert not r.passed and r.counterexample is not None, r.reason
        s = np.asarray([r.counterexample["input"]])
        assert run(mutant, s, parse_format(m.precision)).answers[0][0] != dyck_member(s, 2, 2)[0]


def test_states_that_do_not_close_are_unproven(monkeypatch):
    """A unit counting the input (h = h + 1, never bounded in exact integers) makes the product of
    states infinite: unproven, never passed; in the fixed format it saturates and closes."""
    m = dyck(types=2, depth=2).compiled
    H = m.hidden
    grow = _with(m, W_hh=SparseRows.from_entries(
        np.r_[np.repeat(np.arange(H), m.W_hh.width), H], np.r_[m.W_hh.cols.reshape(-1), H], np.r_[m.W_hh.vals.num.reshape(-1), 1],
        (H + 1, H + 1)), W_ih=ExactTensor(np.r_[m.W_ih.num, np.zeros((1, 4), np.int64)], 1),
        b=ExactTensor(np.r_[m.b.num, 1], 1), h0=ExactTensor(np.r_[m.h0.num, 0], 1),
        W_U=ExactTensor(np.r_[m.W_U.num, np.zeros((1, 2), np.int64)], 1), layout={})
    monkeypatch.setattr(cert, "MAX_PAIRS", 200)
    r = xf.verify(grow, mode="certify", arithmetic="real")
    assert not r.passed and r.counterexample is None and "more than 200 pairs" in r.reason
    assert xf.verify(grow, mode="certify").passed  # binary:int=1,frac=0 saturates the counter at 1


def test_float_arithmetic_needs_exact_steps():
    """A unit whose pre-activation is 2^25 (it changes no answer) is not exact in float32: unproven
    there, proved in float64 and the reals."""
    m = dyck(types=2, depth=2).compiled
    H = m.hidden
    big = _with(m, W_hh=SparseRows(np.r_[m.W_hh.cols, np.zeros((1, m.W_hh.width), np.int64)],
                                   ExactTensor(np.r_[m.W_hh.vals.num, np.zeros((1, m.W_hh.width), np.int64)], 1), H + 1),
                W_ih=ExactTensor(np.r_[m.W_ih.num, np.zeros((1, 4), np.int64)], 1), b=ExactTensor(np.r_[m.b.num, 1 << 25], 1),
                h0=ExactTensor(np.r_[m.h0.num, 0], 1), W_U=ExactTensor(np.r_[m.W_U.num, np.zeros((1, 2), np.int64)], 1))
    r = xf.verify(big, mode="certify", arithmetic="float32")
    assert not r.passed and "not exact in float32" in r.reason
    assert xf.verify(big, mode="certify", arithmetic="float64").passed
    assert xf.verify(big, mode="certify", arithmetic="real").passed


def test_a_task_without_an_automaton_is_unproven():
    m = dyck(types=2, depth=2).compiled
    m.task_params = {**m.task_params, "alphabet": 2}  # what Index Lookup's specification reads
    r = certify(m, parse_format(m.precision), IndexLookupTask())
    assert not r.passed and "specification is a Select" in r.reason


# ------------------------------------------------------------------------------------------------
# the executor, the forward pass, torch
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,den,fmt", [(0, 4, "binary:int=3,frac=2"), (1, 1, "binary:int=3,frac=2"),
                                          (2, 2, "binary:int=2,frac=1"), (3, 1, "binary:int=2,frac=0")])
def test_executor_equals_the_plain_forward_pass(seed, den, fmt):
    """Both paths of the executor (integer weights: exact sums; other weights: the format's matmul
    over stored entries) equal the plain pass with dense matrices, bit for bit, saturations included."""
    m = random_rnn(seed, den=den)
    f = parse_format(fmt)
    t = np.random.default_rng(seed).integers(0, m.d_vocab, size=(64, 9))
    res = run(m, t, f)
    assert np.array_equal(res.logits, forward_reference(m, t, f))
    assert res.counts["saturations"] > 0 or seed == 3


@pytest.mark.parametrize("name,kw", [("dyck-rnn", dict(n=9)), ("index-lookup-rnn", dict(n=7, alphabet=5)),
                                     ("equality-rnn", dict(n=8)), ("mqar-rnn", dict(n=6, labels=3))])
def test_every_recurrent_build_runs_alike_everywhere(name, kw):
    """The executor, the plain forward pass and the exported torch.nn.RNN (float64) agree on seeded
    inputs of every recurrent construction."""
    m = xf.build(name, **kw)
    c = m.compiled
    b = next(m.task.sample(c, 64, 0))
    fmt = parse_format(c.precision)
    res = run(c, b.tokens, fmt)
    assert np.array_equal(res.logits, forward_reference(c, b.tokens, fmt))
    from exactformer.verify.executor.torch_run import run_torch

    flt = run_torch(c, b.tokens, "float64")
    assert flt.answers == res.answers and np.array_equal(flt.logits, res.logits.astype(np.float64))


def test_run_with_cache_names_the_recurrent_hooks():
    logits, cache = dyck(types=2, depth=2).run_with_cache(["([])", "(]()"])
    assert list(cache) == ["hook_embed", "rnn.hook_pre", "rnn.hook_h", "unembed.hook_logits"]
    h = cache["rnn.hook_h"].num
    assert h.shape == (2, 4, 12) and set(np.unique(h)) <= {0, 1} and np.all(h.sum(axis=2) <= 1)
    assert logits.shape == (2, 4, 2) and (h[1, 1:].sum() == 0)  # "(]" rejects: the zero state from then on


# ------------------------------------------------------------------------------------------------
# files
# ------------------------------------------------------------------------------------------------


def test_save_load_and_torch_from_the_files_alone(tmp_path):
    import torch
    from safetensors.torch import load_file

    m = dyck(types=2, depth=2)
    path = xf.save(m, tmp_path / "d")
    man = json.loads((path / "manifest.json").read_text())
    assert man["architecture"] == "recurrent" and man["certified_arithmetics"]["not_certified"] == []
    assert man["torch"]["hidden_size"] == 12 and man["torch"]["nonlinearity"] == "relu"
    loaded = xf.load(path)
    assert loaded.compiled.fingerprint() == m.compiled.fingerprint() and loaded("[()]") is True
    # a torch.nn.RNN from model.safetensors and the manifest alone
    sd = load_file(str(path / "model.safetensors"))
    cfg = man["torch"]
    rnn = torch.nn.RNN(cfg["input_size"], cfg["hidden_size"], nonlinearity="relu", batch_first=True, dtype=torch.float64)
    rnn.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("rnn.")})
    s = all_strings(8, 4)
    x = sd["embed.weight"][torch.as_tensor(s)]
    out, _ = rnn(x, sd["h0"].expand(1, len(s), -1).contiguous())
    logits = out[:, -1] @ sd["readout.weight"].T + sd["readout.bias"]
    assert np.array_equal(logits.argmax(dim=1).numpy(), dyck_member(s, 2, 2).astype(np.int64))


def test_modified_files_are_refused(tmp_path):
    path = xf.save(dyck(types=2, depth=2), tmp_path / "d")
    man = json.loads((path / "manifest.json").read_text())
    man["task_params"]["depth"] = 3
    (path / "manifest.json").write_text(json.dumps(man))
    with pytest.raises(ManifestError, match="field task_params.depth was modified"):
        xf.load(path)


def test_transformer_lens_is_refused_with_the_reason():
    from exactformer.constructions.export import ExportError

    with pytest.raises(ExportError, match="not a transformer: TransformerLens runs transformers only"):
        dyck(types=2, depth=2).to_transformer_lens()


def test_the_command_line_builds_and_verifies(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["build", "dyck-rnn", "--types", "2", "--depth", "2", "--out", str(tmp_path / "d"), "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["verify", str(tmp_path / "d"), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["reason"] == "proved for every string of every length"
    r = runner.invoke(app, ["verify", "dyck-rnn", "--depth", "0"])
    assert r.exit_code == 2 and "depth: an integer in [1, 8], got 0" in r.output


def test_the_task_is_one_task():
    assert isinstance(xf.build("dyck-rnn").task, DyckTask)
    assert DyckTask.modes == ("certify", "exhaustive", "sample")


@pytest.mark.parametrize("name,kw,prefix", [("index-lookup-rnn", dict(n=12), 9), ("equality-rnn", dict(n=8), 8),
                                            ("dyck-rnn", dict(n=6), 3)])
def test_a_shared_prefix_runs_once_with_the_same_results(name, kw, prefix):
    """Inputs that share their first tokens (as an exhaustive enumeration's batches do) run those
    steps once: logits and saturation counts equal the plain pass and the run of each input alone."""
    m = xf.build(name, **kw).compiled
    fmt = parse_format(m.precision)
    t = np.concatenate([b.tokens for b in registry_task(m).sample(m, 64, 3)])
    t[:, :prefix] = t[0, :prefix]
    res = run(m, t, fmt)
    assert np.array_equal(res.logits, forward_reference(m, t, fmt))
    alone = [run(m, t[i : i + 1], fmt) for i in range(len(t))]
    assert res.counts["saturations"] == sum(r.counts["saturations"] for r in alone)
    assert res.answers == [r.answers[0] for r in alone]


def registry_task(model):
    from exactformer.constructions.core.registry import task_of

    return task_of(model)


def test_a_shared_prefix_counts_every_saturation():
    """A random integer model that saturates: the shared steps' saturations count once per input."""
    m = random_rnn(1, den=1)
    f = parse_format("binary:int=2,frac=0")
    t = np.random.default_rng(5).integers(0, m.d_vocab, size=(32, 9))
    t[:, :6] = t[0, :6]
    res = run(m, t, f)
    alone = [run(m, t[i : i + 1], f) for i in range(len(t))]
    assert np.array_equal(res.logits, forward_reference(m, t, f))
    assert res.counts["saturations"] == sum(r.counts["saturations"] for r in alone) > 0


# ------------------------------------------------------------------------------------------------
# the recurrent models meeting the lower bounds (verified by running them)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [("index-lookup-rnn", dict(n=7, alphabet=3)), ("index-lookup-rnn", dict(n=9)),
                                     ("equality-rnn", dict(n=10)), ("mqar-rnn", dict(n=6)),
                                     ("mqar-rnn", dict(n=4, labels=3, queries="last"))])
def test_upper_bound_rnns_are_right_on_every_input(name, kw):
    m = xf.build(name, **kw)
    r = xf.verify(m)  # their strongest mode: exhaustive where the inputs fit
    assert r.passed and r.mode == "exhaustive" and r.inputs_covered == m.task.count(m.compiled)


def _drop_recurrent_entry(m, unit: int):
    """``m`` with the recurrent weights of hidden unit ``unit`` set to 0."""
    vals = m.W_hh.vals.num.copy()
    vals[unit] = 0
    return _with(m, W_hh=SparseRows(m.W_hh.cols, ExactTensor(vals, m.W_hh.vals.den), m.W_hh.n_cols))


@pytest.mark.parametrize("name,kw,unit", [("index-lookup-rnn", dict(n=6), 3),  # slot 3 forgets what slot 2 held
                                          ("equality-rnn", dict(n=8), 3),      # the last slot reads nothing
                                          ("mqar-rnn", dict(n=6), 10)])       # a stored label bit is not kept
@pytest.mark.parametrize("mode", ["exhaustive", "sample"])
def test_upper_bound_mutants_are_refuted(name, kw, unit, mode):
    m = xf.build(name, **kw).compiled
    wrong = _drop_recurrent_entry(m, unit)
    r = xf.verify(wrong, mode=mode, **({"samples": 400} if mode == "sample" else {}))
    assert not r.passed and r.counterexample is not None, r.reason
    task = xf.build(name, **kw).task
    batch = task.batch(wrong, *task.to_arrays(wrong, [r.counterexample["input"]]))
    got = run(wrong, batch.tokens, parse_format(m.precision)).answers[0]
    assert got != list(np.asarray(batch.truth).reshape(1, -1)[0])


@pytest.mark.parametrize("types,depth,max_len", [(1, 3, 10), (3, 1, 6), (2, 3, 7), (3, 2, 5)])
def test_other_bounds_certified_and_right_on_every_string(types, depth, max_len):
    """Dyck-(k, D) beyond (2, 2): the certificate proves it for every length, and the executor agrees
    with the stack definition on every string up to ``max_len``."""
    m = dyck(types=types, depth=depth).compiled
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["automaton_states"] == dyck_automaton(types, depth).states
    fmt = parse_format(m.precision)
    for L in range(0, max_len + 1):
        s = all_strings(L, 2 * types)
        got = np.array([a[0] for a in run(m, s, fmt).answers])
        assert np.array_equal(got, dyck_member(s, types, depth)), L


@pytest.mark.parametrize("mode", ["exhaustive", "sample"])
def test_every_mode_passes_the_dyck_rnn_and_refutes_a_wrong_automaton(mode):
    """The running modes agree with the certificate: the built model passes, a wrong transition
    ("(]" accepted as "()") is caught with a string the definition rejects."""
    kw = {"samples": 300, "seed": 1} if mode == "sample" else {}
    assert xf.verify(dyck(n=6), mode=mode, **kw).passed
    wrong = build_from_automaton(_mutant_automaton("wrong transition"), 6, 2, 2, FixedPoint.binary(1, 0), "dyck-rnn",
                                 "mutant")
    r = xf.verify(wrong, mode=mode, **kw)
    assert not r.passed and r.counterexample is not None
    s = np.asarray([r.counterexample["input"]])
    assert not dyck_member(s, 2, 2)[0] and run(wrong, s, parse_format(wrong.precision)).answers[0][0] is True
