"""Constructions of one's own (docs/your-construction.md): the tutorial's three constructions, the
declarative specifications, the public surface, user modules on the command line and in saved files,
and the errors a construction author meets.

* the tutorial's constructions (docs/examples/tutorial/: a copy, a two-head sum with a readout block of
  its own, a mean over a set with SetAverage) build at several N, certify in fixed point, float64 and
  float32, agree with every input at the small N, pass the field-coverage test, and are saved, loaded
  and verified from the command line in a fresh process (--trust-code; refused without it);
* their files import public names only (exactformer.construct) and the copy is at most 40 lines;
* the rules TokenAt, FunctionOf, TokenAtPointer, CountOver derive their tables from the truth, and a
  truth that disagrees with the rule is refused before any certificate passes, naming the input;
* every error met while writing them names the slot, block, parameter or field, in one line;
* the counterexample search is bounded in time and says what it ran.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
import exactformer.construct as public
from exactformer.constructions.blocks import BLOCKS, BlockError
from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import IRError
from exactformer.constructions.core.sequence import RuleError
from test_field_coverage import _first_of_each_field, _run
from tutorial import MODULES, ROOT, SIZES, TUTORIAL, registered

CLI = [sys.executable, "-m", "exactformer.cli.main"]


@pytest.fixture(scope="module")
def tutorial():
    with registered() as names:
        yield names


def _one_line(e: BaseException) -> str:
    text = str(e)
    assert "\n" not in text, text
    return text


# ------------------------------------------------------------------------------------------------
# the tutorial's constructions
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODULES.values()))
def test_certified_at_several_n_in_every_arithmetic(tutorial, name):
    entry = registry.get(name)
    for kw in [entry.example] + SIZES[name]:
        m = xf.build(name, **kw)
        for arithmetic in ("fixed", "float64", "float32"):
            r = m.verify(arithmetic=arithmetic)
            assert r.passed and r.mode == "certify", (name, kw, arithmetic, r.reason)
    small = xf.build(name, **entry.example)
    assert small.verify(mode="exhaustive").passed


@pytest.mark.parametrize("name", list(MODULES.values()))
def test_every_field_of_the_tutorial_constructions_mutated(tutorial, name):
    _run(name, _first_of_each_field)


def test_saved_loaded_and_verified_in_a_fresh_process(tutorial, tmp_path):
    """Saved (from the command line with --module for the sum, whose readout block is its own; the
    copy and the mean from the command line in docs/your-construction.md's blocks), then ``verify
    DIR`` in a fresh process: refused without --trust-code (exit 2, one line naming the module and
    the option), proved with it; in a process that imported the module itself, xf.load needs no trust."""
    for module, name in MODULES.items():
        out = tmp_path / name
        kw = SIZES[name][0]
        if name == "sum-of-two":
            args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
            built = subprocess.run(CLI + ["build", "--module", str(TUTORIAL / f"{module}.py"), name, *args, "--out",
                                          str(out), "--json"], capture_output=True, text=True, timeout=300)
            assert built.returncode == 0, built.stderr
            assert json.loads(built.stdout)["certified_arithmetics"]["not_certified"] == []
            refused = subprocess.run(CLI + ["verify", str(out)], capture_output=True, text=True, timeout=300)
            assert refused.returncode == 2
            line = refused.stderr.strip().splitlines()[-1]
            assert line.startswith("error:") and f"module {module!r}" in line and "--trust-code" in line, line
        else:
            xf.save(xf.build(name, **kw), out)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["code"][0]["module"] == module and f"construction {name}" in manifest["code"][0]["defines"]
        assert manifest["certified_arithmetics"]["not_certified"] == []
        trusted = subprocess.run(CLI + ["verify", str(out), "--trust-code", "--json"], capture_output=True, text=True,
                                 timeout=300)
        assert trusted.returncode == 0, trusted.stderr
        report = json.loads(trusted.stdout)
        assert report["passed"] and report["mode"] == "certify" and report["inputs_covered"] == "all"
        m = xf.load(out)  # this process imported the module: nothing to trust
        assert m.construction == name and m.verify().passed


def test_untrusted_code_is_refused_in_python(tutorial, tmp_path):
    out = xf.save(xf.build("sum-of-two", n=6, a=1, b=4), tmp_path / "sum", certify=False)
    code = ("import exactformer as xf, sys\n"
            "try:\n    xf.load(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "m = xf.load(sys.argv[1], trust_code=True)\nprint(m([1, 2, 0, 3, 1, 0]), m.verify().passed)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()
    assert first.startswith("UntrustedCode") and "'sum_of_two'" in first and "trust_code=True" in first
    assert "block SumReadout" in first
    assert second == "3 True"  # x_1 + x_4 = 2 + 1
    with pytest.raises(xf.VerifyError, match="trust_code: must be True or False"):
        xf.load(out, trust_code="yes")


def test_the_tutorial_runs_in_transformer_lens(tutorial):
    pytest.importorskip("transformer_lens")
    import torch

    for name in MODULES.values():
        m = xf.build(name, **SIZES[name][0])
        bridge = m.to_transformer_lens()
        task = m.task
        batch = next(task.sample(m.compiled, 64, seed=5))
        logits = bridge(torch.as_tensor(batch.tokens, dtype=torch.long))
        got = [m.answers[i] for i in logits[:, -1].argmax(-1).tolist()]
        assert got == list(batch.truth), name


# ------------------------------------------------------------------------------------------------
# the public surface
# ------------------------------------------------------------------------------------------------


def test_the_tutorial_imports_public_names_only():
    allowed = {"exactformer.construct", "numpy", "dataclasses", "fractions", "typing", "__future__"}
    for module in MODULES:
        tree = ast.parse((TUTORIAL / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module in allowed, (module, node.module)
                if node.module == "exactformer.construct":
                    assert {a.name for a in node.names} <= set(public.__all__), module
            elif isinstance(node, ast.Import):
                assert {a.name for a in node.names} <= allowed, module


def test_a_one_layer_construction_in_at_most_40_lines():
    lines = [line for line in (TUTORIAL / "copy_token.py").read_text().splitlines() if line.strip()]
    assert len(lines) <= 40, len(lines)


def test_every_public_name_is_there():
    for name in public.__all__:
        assert getattr(public, name) is not None, name


# ------------------------------------------------------------------------------------------------
# specifications from the truth
# ------------------------------------------------------------------------------------------------


class _IndexFirst(public.SequenceTask):
    """Index Lookup with the index token first: tokens p (ids S .. S+N-1), then N symbols; the answer,
    read at position 0, is the p-th symbol."""

    def domains(self, model):
        S, n = model.task_params["alphabet"], model.n
        return public.Domains([np.arange(S, S + n), np.arange(S)], np.r_[0, np.ones(n, np.int64)])

    def length(self, model):
        return model.n + 1

    def truth(self, model, x):
        return x[np.arange(len(x)), x[:, 0] - model.task_params["alphabet"] + 1]

    def rule(self, model):
        S = model.task_params["alphabet"]
        return public.TokenAtPointer(0, lambda u: u - S + 1, at=0)


def _index_first(n: int, alphabet: int = 3):
    """Index Lookup, the index first.

    Parameters
    ----------
    n : int >= 2. N.
    alphabet : int >= 2. |Sigma|.
    """
    S, code, m = alphabet, public.position_codes(n), public.SymbolReadout.width(alphabet)
    mb = public.ModelBuilder(public.Layout(rho=m, q=code.k, k=code.k, got=m, bits=m), n_layers=1, d_vocab=S + n, n_ctx=n + 1)
    mb.token_rows(range(S), "rho", public.SymbolReadout.rows(S))
    mb.token_code("q", S, n, code)  # index token p carries T(p)
    mb.position_code("k", 1, n, code)  # the symbols sit at 1 .. N
    public.RetrieveByPosition("q", "k", "rho", "got").emit(mb, 0)
    public.BitThreshold("got", "bits").emit(mb, 0)
    public.SymbolReadout("bits", S).emit(mb)
    return mb.build(answers=list(range(S)), n=n, answer_positions=(0,), task_params={"alphabet": S})


@pytest.fixture
def index_first():
    registry.names()
    public.construction("test-index-first-rule", task=_IndexFirst(), theorem="a test",
                        claim=registry.Claim("a test", "1", "1", "O(log N)", "O(log N)", "O(1)"),
                        sizes=public.NoRows("index-lookup", "a test"), example=dict(n=4, alphabet=3))(_index_first)
    yield "test-index-first-rule"
    registry._REGISTRY.pop("test-index-first-rule")


def test_a_pointer_rule_is_certified(index_first):
    for n in (4, 16):
        m = xf.build(index_first, n=n)
        r = m.verify()
        assert r.passed and r.mode == "certify", r.reason
        assert m([4, 2, 1, 0] + [0] * (n - 3)) == 1  # index token 4 = S + p - 1: p = 2, the second symbol
    assert xf.build(index_first, n=4).verify(mode="exhaustive").passed
    spec = _IndexFirst().spec(xf.build(index_first, n=4).compiled)
    assert isinstance(spec, public.Select) and spec.values == (0, 1, 2)


def test_a_truth_that_disagrees_with_its_rule_is_refused(tutorial):
    """The truth depends on more than the rule says (the copy's truth reads position j + 1 too):
    no certificate passes; the report names the first input where the specification and the truth
    differ."""
    task = registry.get("copy-token").task

    class Wrong(type(task)):
        def truth(self, model, x):
            return (x[:, model.task_params["j"]] + x[:, model.task_params["j"] + 1]) % model.task_params["alphabet"]

    original = registry.get("copy-token").task
    registry._REGISTRY["copy-token"].task = Wrong()
    try:
        r = xf.build("copy-token", n=6, j=1).verify(mode="certify")
    finally:
        registry._REGISTRY["copy-token"].task = original
    assert not r.passed
    assert "specification disagrees with its truth" in r.reason and "on input" in r.reason, r.reason


def test_rules_name_what_is_wrong(tutorial):
    m = xf.build("copy-token", n=6, j=1).compiled
    with pytest.raises(RuleError, match=r"position 9 must be a position in \[-6, 6\)"):
        public.TokenAt(9).resolve(registry.get("copy-token").task, m)
    mean = xf.build("mean-over-set", n=6, positions=[0, 2]).compiled
    with pytest.raises(RuleError, match="position 1 allows tokens 0 .. 1, none of which have the feature"):
        public.CountOver([1], feature={5}).resolve(registry.get("mean-over-set").task, mean)


def test_specifications_derived_from_the_truth(tutorial):
    s = registry.get("sum-of-two").task.spec(xf.build("sum-of-two", n=5, a=0, b=3, alphabet=3).compiled)
    assert isinstance(s, public.Reads) and s.reads == (("tok", 0), ("tok", 3)) and s.values == (0, 1, 2, 3, 4)
    assert s.table.tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    c = registry.get("mean-over-set").task.spec(xf.build("mean-over-set", n=6, positions=[0, 2, 3]).compiled)
    assert isinstance(c, public.CountOf) and c.values == tuple(Fraction(k, 3) for k in range(4))


# ------------------------------------------------------------------------------------------------
# errors that name things
# ------------------------------------------------------------------------------------------------


def test_a_missing_slot_lists_the_slots(tutorial):
    mb = public.ModelBuilder(public.Layout(token=2, key=4), n_layers=1, d_vocab=4, n_ctx=4)
    with pytest.raises(IRError) as e:
        public.RetrieveByPosition("query", "key", "token", "copied").emit(mb, 0)
    assert _one_line(e.value) == "RetrieveByPosition in layer 0: no slot 'query' in the layout; its slots: token, key"


def test_a_wrong_shape_names_the_slot_the_block_and_the_shape(tutorial):
    mb = public.ModelBuilder(public.Layout(token=2, bits=2), n_layers=1, d_vocab=4, n_ctx=4)
    with pytest.raises(IRError) as e:
        mb.token_rows(range(4), "token", np.ones((4, 3), dtype=np.int64))
    assert _one_line(e.value) == "token_rows values on slot 'token' has shape (4, 3), expected (4, 2) [rows, slot width]"
    readout = sys.modules["sum_of_two"].SumReadout("bits", "bits", 4)
    readout.emit(mb)
    with pytest.raises(IRError) as e:
        mb.build(answers=list(range(5)), precision="binary:int=8,frac=1")  # 7 answers emitted, 5 given
    assert _one_line(e.value) == ("block SumReadout: W_U on slot 'bits' has shape (2, 7), expected (2, 5) "
                                  "[slot width, answers]")
    with pytest.raises(IRError) as e:
        public.BitThreshold("token", "bits").emit(mb, 3)
    assert _one_line(e.value) == "BitThreshold in layer 3: layer must be in [0, 1) (n_layers = 1), got 3"


def test_a_weight_the_format_cannot_hold_fails_at_build(tutorial):
    """The issue's case: a readout's weights outside the format failed at run time ("weight value 8
    is not exactly representable"); now the build fails, naming the weight, its block and the
    smallest format -- and without a precision the search takes every weight into account."""
    module = sys.modules["sum_of_two"]
    with pytest.raises(IRError) as e:
        _sum_with_precision(module, "binary:int=4,frac=1")
    text = _one_line(e.value)
    assert text.startswith("weight unembed.") and "(block SumReadout" in text, text
    assert "is not a grid value of binary:int=4,frac=1" in text
    assert "the smallest binary format holding every weight is binary:int=6,frac=0" in text
    assert xf.build("sum-of-two", n=6, a=1, b=4).precision == "binary:int=7,frac=1"  # holds 2 (2 (S-1))^2 = 72


def _sum_with_precision(module, precision):
    m = public.SymbolReadout.width(4)
    mb = public.ModelBuilder(public.Layout(token=m, bits_a=m, bits_b=m), n_layers=1, d_vocab=4, n_ctx=6)
    module.SumReadout("bits_a", "bits_b", 4).emit(mb)
    return mb.build(answers=list(range(7)), precision=precision, construction="sum-of-two", theorem="t", n=6)


def test_a_code_vector_beyond_the_code_is_named(tutorial):
    with pytest.raises(IRError) as e:
        xf.build("copy-token", n=6, j=6)
    assert _one_line(e.value) == ("position_code: code_start + count = 6 + 1 must be at most the code's 6 vectors "
                                  "(code_start >= 0)")


def test_the_search_reports_its_progress():
    """A slow runner: the search reports at 1, 2, 4 ... seconds and stops at its budget."""
    import time

    from exactformer.constructions.core.task import Batch
    from exactformer.verify.certify import composed

    batch = Batch((np.zeros((256, 2), np.int64),), np.zeros((256, 2), np.int64), np.zeros(256, np.int64), "sampled")

    def slow(model, b):
        time.sleep(0.4)

    calls = []
    found, said = composed._search(None, None, {}, slow, candidates=[batch] * 20, seconds=2.5, progress=calls.append)
    assert found is None and said.startswith("no counterexample among ") and "(sampled " in said
    assert "the search stopped at its time budget of 2.5 s" in said
    assert len(calls) >= 2 and all(c.startswith("counterexample search: ") and c.endswith("(budget 2.5 s)") for c in calls)


def test_registrations_name_their_conflicts(tutorial):
    with pytest.raises(registry.RegistryError, match="construction 'copy-token' is already registered by copy_token"):
        public.construction("copy-token", task=registry.get("copy-token").task, theorem="x",
                            claim=registry.Claim("x", "1", "1", "1", "1", "1"), sizes=public.NoRows("x", "x"))(_index_first)
    with pytest.raises(BlockError, match="a block named 'SymbolReadout' is already registered by exactformer"):
        from dataclasses import dataclass

        @public.block
        @dataclass(frozen=True)
        class SymbolReadout(public.ReadoutBlock):
            def emit(self, mb):
                pass
    with pytest.raises(BlockError, match="must be a frozen dataclass"):
        @public.block
        class Loose(public.ReadoutBlock):
            def emit(self, mb):
                pass
    assert "SumReadout" in BLOCKS


def test_a_module_that_does_not_import_is_named():
    proc = subprocess.run(CLI + ["build", "--module", "no_such_module_xyz", "index-lookup", "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: exactformer build: Invalid value for '--module': module 'no_such_module_xyz' "
                                   "cannot be imported: No module named 'no_such_module_xyz'")


# ------------------------------------------------------------------------------------------------
# user constructions on the command line: entry points
# ------------------------------------------------------------------------------------------------


def test_an_installed_package_registers_through_the_entry_point_group(tmp_path):
    """A distribution whose entry points name a module in the group exactformer.constructions: its
    constructions are commands without --module."""
    dist = tmp_path / "tutorial_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tutorial-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[exactformer.constructions]\ncopy = copy_token\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(TUTORIAL), str(ROOT / "tests")]))
    proc = subprocess.run(CLI + ["verify", "copy-token", "--n", "8", "--j", "5", "--json"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"]


# ------------------------------------------------------------------------------------------------
# bounded searches and exact counterexamples
# ------------------------------------------------------------------------------------------------


def _wrong_mean(positions_model, positions_task):
    """A mean-over-set model built for one set, registered with a task that reads another: the
    certificate cannot prove it, and wrong answers exist."""
    m = xf.build("mean-over-set", n=8, positions=positions_model)
    m.compiled.task_params = dict(m.compiled.task_params, positions=positions_task)
    return m


def test_counterexamples_print_answers_exactly(tutorial):
    """An average of 1/2 is printed as "1/2" (it was printed as 0: int())."""
    r = _wrong_mean([0, 2], [0, 3]).verify(mode="certify")
    assert not r.passed and r.counterexample is not None, r.reason
    cex = r.counterexample
    assert {cex["expected"], cex["got"]} <= {0, "1/2", 1} and cex["expected"] != cex["got"], cex
    assert "1/2" in (cex["expected"], cex["got"])
    assert "found among" in r.details["counterexample_search"]


def _causal(m):
    """``m`` with its layer made causal: the answer position (the last) still sees every key, so the
    answers stay right, but SetAverage proves bidirectional heads only: no proof, no counterexample."""
    import copy
    import dataclasses

    c = copy.copy(m.compiled)
    c.blocks = [dataclasses.replace(b, attn=dataclasses.replace(b.attn, causal=True)) for b in c.blocks]
    return xf.Model(c)


def test_the_search_is_bounded_and_says_what_it_ran(tutorial):
    m = _causal(xf.build("mean-over-set", n=12, positions=[0, 2, 7]))
    r = m.verify(mode="certify", search_seconds=0)
    assert not r.passed and r.reason.endswith("no counterexample search (search_seconds is 0)"), r.reason
    assert "SetAverage is proved for bidirectional attention" in r.reason
    r = m.verify(mode="certify", search_seconds=1e-9)
    assert not r.passed and r.counterexample is None
    assert "the search stopped at its time budget of 1e-09 s" in r.reason, r.reason
    assert "no counterexample among 256 candidate inputs (constant, alternating 256) in " in r.reason
    calls = []
    r = m.verify(mode="certify", phase=calls.append)
    assert "no counterexample among 4096 candidate inputs (constant, alternating 2048, sample 2048) in " in r.reason
    assert m.verify(mode="exhaustive").passed  # right, not proved: the search found nothing wrong
    with pytest.raises(xf.VerifyError, match="search_seconds: must be a number of seconds >= 0"):
        m.verify(mode="certify", search_seconds=-1)
    with pytest.raises(xf.VerifyError, match="search_seconds: only with mode certify"):
        m.verify(mode="exhaustive", search_seconds=3)


def test_the_search_budget_on_the_command_line(tutorial, tmp_path):
    out = xf.save(_causal(xf.build("mean-over-set", n=12, positions=[0, 2, 7])), tmp_path / "causal", certify=False)
    proc = subprocess.run(CLI + ["verify", str(out), "--trust-code", "--search-seconds", "0.000001", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "the search stopped at its time budget of 1e-06 s" in json.loads(proc.stdout)["reason"]
    bad = subprocess.run(CLI + ["verify", str(out), "--trust-code", "--search-seconds", "soon"], capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --search-seconds: must be a number of seconds >= 0, got 'soon'"
