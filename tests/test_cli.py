"""The exactformer CLI (docs/cli.md): options from the registry, every bad input as one line with
exit 2, JSON schemas, exit codes, progress, and the API's errors behind it."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.core.task import EXHAUSTIVE_LIMIT
from exactformer.constructions.theorems.index_lookup import IndexLookupTask
from exactformer.cli.commands import ALL_SAMPLES
from exactformer.cli.main import app
from exactformer.cli.options import builder_kwargs, parameter_docs
from exactformer.cli.output import Steps, cell_text, plain_table
from registered import TEST_CLAIM, NoCertificateTask, register_tiny, tiny_builder

runner = CliRunner()

REPORT_KEYS = {"construction", "theorem", "n", "mode", "passed", "inputs_covered", "seed", "precision",
               "precision_bits", "eta", "eta_paper", "k", "layers", "heads", "width", "size_bits", "seconds",
               "min_margin", "counts", "counterexample", "reason", "details"}


def invoke(*args: str):
    return runner.invoke(app, list(args))


def one_json(r) -> dict:
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0])


def bad(r, *words: str) -> str:
    """Exit 2 with one plain error line naming ``words``, no traceback."""
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), r.stderr
    assert "Traceback" not in r.output and "╭" not in r.output
    for w in words:
        assert w in lines[-1], (w, lines[-1])
    return lines[-1]


# ---- verify and build ------------------------------------------------------------------------------------------------


def test_verify_by_name_certify_json():
    r = invoke("verify", "index-lookup", "--n", "64", "--alphabet", "8", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and REPORT_KEYS <= set(d)
    assert d["passed"] is True and d["inputs_covered"] == "all" and d["mode"] == "certify" and d["seed"] is None


def test_verify_sample_exhaustive_and_failing_exit_code():
    r = invoke("verify", "index-lookup", "--n", "32", "--alphabet", "4", "--mode", "sample", "--samples", "20",
               "--seed", "5", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["passed"] and d["inputs_covered"] == 40 and d["seed"] == 5
    assert "not errors" in d["counts_meaning"]["underflows"]  # a count says what it means
    r = invoke("verify", "equality", "--n", "8", "--mode", "exhaustive", "--json")
    assert r.exit_code == 0 and one_json(r)["inputs_covered"] == 256
    # eta far too small: a counterexample, exit 1 (also in the table form)
    args = ["verify", "index-lookup", "--n", "64", "--alphabet", "4", "--eta", "1", "--precision", "binary:int=6,frac=8"]
    r = invoke(*args, "--json")
    d = one_json(r)
    assert r.exit_code == 1 and not d["passed"] and d["counterexample"] is not None
    r = invoke(*args)
    assert r.exit_code == 1 and "FAIL" in r.stdout and "counterexample" in r.stdout


def test_human_report_explains_counts():
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--mode", "sample", "--samples", "10")
    assert r.exit_code == 0 and "PASS" in r.stdout
    line = next(line for line in r.stdout.splitlines() if "underflows" in line)
    assert "not errors" in line or "rounded to 0" in line


def test_build_then_verify_dir(tmp_path: Path):
    out = tmp_path / "il"
    r = invoke("build", "index-lookup", "--n", "32", "--alphabet", "4", "--out", str(out), "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["out"] == str(out) and "manifest.json" in d["files"]
    assert {"construction", "n", "layers", "heads", "width", "precision", "params"} <= set(d)
    r = invoke("verify", str(out), "--json")
    assert r.exit_code == 0 and one_json(r)["passed"]
    r = invoke("verify", str(out), "--mode", "sample", "--samples", "5", "--json")
    assert r.exit_code == 0 and one_json(r)["inputs_covered"] == 10
    # a saved model's options are fixed: construction options are refused, not ignored
    bad(invoke("verify", str(out), "--n", "999", "--alphabet", "3"), "--n", "no such option", "--mode")
    # tampering with the weights is refused
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (out / "model.safetensors").write_bytes(bytes(data))
    r = invoke("verify", str(out), "--json")
    assert "sha256" in bad(r) and "sha256" in one_json(r)["error"]


def test_build_table_and_out_errors(tmp_path: Path):
    r = invoke("build", "equality", "--n", "8", "--out", str(tmp_path / "eq"), "--compact")
    assert r.exit_code == 0 and "eta" in r.stdout and not (tmp_path / "eq" / "model.safetensors").exists()
    f = tmp_path / "afile"
    f.write_text("x")
    bad(invoke("build", "equality", "--n", "12", "--out", str(f)), "--out", "not a directory")
    bad(invoke("build", "equality", "--n", "12"), "--out is required")
    bad(invoke("build", "nonsense", "--n", "12", "--out", str(tmp_path / "x")), "not a construction", "index-lookup")


# ---- issue 8 item 5: each bad input one line naming the parameter and the allowed values --------------------------------


@pytest.mark.parametrize("args,words", [
    (["verify", "k-hop", "--n", "8", "--mode", "certify", "--arithmetic", "float32"],
     ["--mode: no certificate for k-hop in float32", "fixed point only", "exhaustive | sample"]),
    (["verify", "dnf", "--n", "16", "--clauses", "a,b"], ["--clauses", "no such option", "--terms"]),
    (["verify", "dnf", "--n", "16", "--terms", "a,b"], ["--terms", "'1,-2;3,4'"]),
    (["verify", "cnf", "--n", "16", "--clauses", "1,2;;3"], ["--clauses", "'1,-2;3,4'", "1,2;;3"]),
    (["verify", "threshold", "--n", "16", "--clauses", "1,2"], ["--clauses", "no such option"]),
    (["verify", "/does/not/exist"], ["/does/not/exist", "no such construction or directory", "index-lookup"]),
    (["verify", "nonsense", "--n", "64"], ["nonsense", "no such construction or directory"]),
    (["verify", "threshold", "--n", "16", "--features", "nofile.json"], ["--features", "no such file", "nofile.json"]),
    (["verify", "threshold", "--n", "16", "--features", "[[1,2"], ["--features", "not valid JSON", "index set"]),
    (["verify", "threshold", "--n", "16", "--features", "[[1,2]]", "--g", "0x"], ["g must be a truth table"]),
    (["verify", "index-lookup", "--n", "16", "--eta", "1/0"], ["eta", "1/0", "number"]),
    (["verify", "equality", "--n", "16", "--features", "[[1]]"], ["--features", "no such option"]),
    (["verify", "equality", "--n", "16", "--alphabet", "8"], ["--alphabet", "no such option"]),
    (["verify", "equality", "--n", "7"], ["n must be an even integer in [2, 2^30]"]),
    (["verify", "equality", "--n", "x"], ["--n", "integer", "[2, 2^30]"]),
    (["verify", "equality"], ["--n is required", "[2, 2^30]"]),
    (["verify", "index-lookup", "--n", "1"], ["n must be an integer in [2, 2^30]"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "prove"], ["--mode", "certify | exhaustive | smt | sample"]),
    (["verify", "index-lookup", "--n", "64", "--device", "tpu"], ["--device", "cpu | cuda"]),
    (["verify", "index-lookup", "--n", "64", "--precision", "binary:int=-1,frac=3"], ["--precision"]),
    (["verify", "index-lookup", "--n", "64", "--samples", "9"], ["--samples", "only with mode sample", "certify"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "exhaustive", "--seed", "9"], ["--seed", "only with mode sample"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "sample", "--seed", "-3"], ["--seed", ">= 0"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "sample", "--samples", "0"], ["--samples", ">= 1"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "sample", "--samples", "x"], ["--samples", "integer"]),
    (["verify", "index-lookup", "--n", "64", "--mode", "exhaustive"], ["exhaustive", "limit"]),
    (["verify", "index-lookup", "--n", "64", "--find-min-precision", "--mode", "sample"], ["--find-min-precision", "--mode"]),
    (["verify", "index-lookup", "--n", "64", "--scan", "paper"], ["--scan", "only with --find-min-precision"]),
    (["verify", "all", "--n", "64", "--mode", "exhaustive"], ["--mode: exhaustive", "at N = 64 has 2^", "inputs, above the limit of 2^22"]),
    (["verify", "all", "--n", "64", "--alphabet", "4"], ["--alphabet", "no such option"]),
    (["verify", "all", "--n", "64", "--mode", "certify", "--samples", "3"], ["--samples", "only with mode sample"]),
    (["positions", "--n", "2^40", "--certify"], ["--certify", "hours", "--force"]),
    (["positions", "--n", "100", "--force"], ["--force", "only with --certify"]),
])
def test_bad_input_is_one_line_with_exit_2(args, words):
    bad(invoke(*args), *words)
    r = invoke(*args, "--json")  # under --json: {"error": ...} on stdout, exit 2
    assert r.exit_code == 2 and set(one_json(r)) == {"error"}


def test_json_errors_of_the_other_commands():
    for args in (["sizes", "--n-min", "1", "--json"], ["attention", "--kind", "nope", "--n", "8", "--json"]):
        r = invoke(*args)
        assert r.exit_code == 2 and set(one_json(r)) == {"error"} and r.stderr.startswith("error: ")


def test_help_shows_docstring_ranges_without_markup():
    r = invoke("verify", "threshold", "--help")
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    for phrase in ("int in [0, m]", "[index set, truth table]", "int in [2, 2^30]", "--code-seed",
                   "--find-min-precision", "--mode", "--samples", "--seed", "--device", "--json"):
        assert phrase in text, phrase
    assert "<bool>" not in r.stdout and "<int>" not in r.stdout
    # every option of every command has help
    from typer.main import get_command

    root = get_command(app)
    ctx = root.make_context("exactformer", ["verify", "threshold"], resilient_parsing=True)
    for group, names in (("build", registry.names()), ("verify", [*registry.names(), "all"])):
        g = root.get_command(ctx, group)
        for name in names:
            cmd = g.get_command(ctx, name)
            for p in cmd.params:
                if p.param_type_name == "option":
                    assert p.help, (group, name, p.name)


def test_every_builder_parameter_is_documented_and_an_option():
    for name in registry.names():
        docs = parameter_docs(registry.get(name).builder)
        r = invoke("verify", name, "--help")
        for p in registry.get(name).parameters:
            assert p in docs, (name, p)
            flag = "--code-seed" if p == "seed" else "--" + p.replace("_", "-")
            assert flag in r.stdout, (name, flag)


def test_option_conversions():
    kw = builder_kwargs(registry.get("cnf"), {"n": "2^4", "clauses": "1,-2;3", "max_inner": "0.25", "eta": "one-hot",
                                "precision": "paper:kc=2", "code_seed": "3"})
    assert kw == {"n": 16, "clauses": [[1, -2], [3]], "max_inner": Fraction(1, 4), "eta": "one-hot",
                  "precision": xf.parse_format("paper:n=16,kc=2"), "seed": 3}
    assert builder_kwargs(registry.get("equality"), {"n": "8", "eta": "3/2"})["eta"] == Fraction(3, 2)
    assert builder_kwargs(registry.get("threshold"), {"n": "8", "features": "[[1, 2]]", "g": "0110"})["features"] == [[1, 2]]


def test_find_min_precision_table_and_json():
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--find-min-precision", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["passed"] and d["min_value"] in d["passing"] and d["precision"].startswith("binary:")
    assert {"construction", "n", "mode", "kind", "checked_up_to", "results"} <= set(d)
    assert all({"value", "precision", "passed", "reason"} == set(x) for x in d["results"])
    # it scans the frac bits at int=6 and says so (it reported "the smallest precision")
    assert d["scanned"] == f"frac bits 1..{d['checked_up_to']} at int=6"
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--find-min-precision")
    assert r.stdout.splitlines()[0].startswith("smallest frac bits at int=6 that certifies index-lookup n=16 (scanned "
                                                "frac bits 1..")
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--find-min-precision", "--scan", "paper")
    assert r.exit_code == 0 and "paper:n=16,kc=" in r.stdout and "{'" not in r.stdout
    assert r.stdout.startswith("smallest kc that certifies index-lookup n=16 (scanned kc 1..")


# ---- verify all ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_verify_all_small():
    r = invoke("verify", "all", "--n", "8", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["passed"] and d["n"] == 8 and d["mode"] is None and d["samples"] == ALL_SAMPLES
    assert [x["name"] for x in d["reports"]] == registry.names()
    # every row in the strongest mode its construction declares: a certificate where there is one, else
    # exhaustive where the inputs fit (the recurrent Index Lookup and Equality at N = 8), else sampled
    # (prefix-sums, the MPC simulation, and the recurrent MQAR have no certificate)
    for x in d["reports"]:
        assert REPORT_KEYS <= set(x) and x["precision"] and x["note"] is None, x["name"]
        if "certify" in registry.get(x["name"]).task.modes:
            assert x["mode"] == "certify" and x["mode_reason"].startswith("certify"), x["name"]
            assert (x["samples"], x["seed"]) == (None, None)
        elif _fits(x):
            assert x["mode"] == "exhaustive" and "no certificate" in x["mode_reason"], x
            assert x["inputs_covered"] == _inputs(x) and (x["samples"], x["seed"]) == (None, None)
        else:
            assert x["mode"] == "sample" and "no certificate" in x["mode_reason"], x
            assert (x["samples"], x["seed"]) == (ALL_SAMPLES, 0)
    r = invoke("verify", "all", "--n", "8", "--mode", "sample", "--samples", "4", "--seed", "2", "--json")
    d = one_json(r)  # the mode is honoured, not ignored
    assert r.exit_code == 0 and all(x["mode"] == "sample" and x["seed"] == 2 and x["samples"] == 4 for x in d["reports"])
    r = invoke("verify", "all", "--n", "8")  # the table (at n = 8: the exhaustive rows are cheaper)
    assert r.exit_code == 0 and all(name in r.stdout for name in registry.names())
    # the table says which mode and how many inputs, with the seed of sampled rows
    assert "all 2^51" in next(line for line in r.stdout.splitlines() if line.startswith("index-lookup "))
    r = invoke("verify", "all", "--n", "8", "--mode", "sample", "--samples", "4")
    row = next(line for line in r.stdout.splitlines() if line.startswith("k-hop "))
    assert " sample " in row and "of 8^8 (4 random, seed 0" in row


def _inputs(report: dict) -> int:
    """How many inputs a row of ``verify all`` has (its model built again at the row's N with the
    construction's defaults, as verify all builds it)."""
    c = registry.get(report["name"])
    return c.task.count(c.builder(report["n"]))


def _fits(report: dict) -> bool:
    """Whether the inputs of a row of ``verify all`` fit the exhaustive limit."""
    return _inputs(report) <= EXHAUSTIVE_LIMIT


@pytest.mark.slow
def test_verify_all_samples_without_a_sampled_row(monkeypatch):
    """--samples where no row of the table is sampled is a bad input, not an ignored option."""
    for name in registry.names():
        if "certify" not in registry.get(name).task.modes:
            monkeypatch.delitem(registry._REGISTRY, name)
    bad(invoke("verify", "all", "--n", "8", "--samples", "3"), "--samples", "no row is sampled")
    r = invoke("verify", "all", "--n", "8", "--samples", "3", "--json")
    assert r.exit_code == 2


@pytest.fixture
def uncertified():
    yield from register_tiny("tiny-no-certificate", NoCertificateTask())


@pytest.mark.slow
def test_verify_all_with_a_mode_some_rows_lack(uncertified):
    """--mode certify: a construction without a certificate runs in its strongest mode and its row
    says so (the stated fallback of docs/cli.md), never a failure for a missing mode."""
    r = invoke("verify", "all", "--n", "8", "--mode", "certify", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["passed"] and d["mode"] == "certify"
    for x in d["reports"]:
        if x["name"] == uncertified:
            assert x["mode"] == "exhaustive" and "no certificate for" in x["note"] and x["inputs_covered"] == 2**8 * 8
        elif "certify" not in registry.get(x["name"]).task.modes:
            assert x["mode"] == ("exhaustive" if _fits(x) else "sample") and "no certificate for" in x["note"], x
        else:
            assert x["mode"] == "certify" and x["note"] is None and x["mode_reason"] is None


def test_a_new_construction_needs_no_cli_edit(monkeypatch):
    """A construction registered outside the package gets its options and its declared modes; verify
    all runs each row in its strongest declared mode: a certificate that does not prove its model is
    followed by the exhaustive run where every input fits (never by sampling), else it is a FAIL; a
    construction declaring none runs exhaustively where it fits."""
    registry.names()
    monkeypatch.setitem(registry._REGISTRY, "tiny-lookup",
                        registry.Construction("tiny-lookup", tiny_builder("tiny-lookup"), NoCertificateTask(), "test",
                                              TEST_CLAIM))
    monkeypatch.setitem(registry._REGISTRY, "tiny-uncertified",
                        registry.Construction("tiny-uncertified", tiny_builder("tiny-uncertified"), IndexLookupTask(),
                                              "test", TEST_CLAIM))
    r = invoke("verify", "tiny-lookup", "--help")
    assert r.exit_code == 0 and "int in [2, 4]" in r.stdout and "--wide / --no-wide" in r.stdout
    r = invoke("verify", "tiny-lookup", "--n", "8", "--wide", "--mode", "sample", "--samples", "5", "--json")
    assert r.exit_code == 0 and one_json(r)["passed"]
    d = one_json(invoke("verify", "tiny-lookup", "--n", "8", "--json"))  # no --mode: its strongest, exhaustive
    assert d["passed"] and d["mode"] == "exhaustive" and d["inputs_covered"] == 2**8 * 8 == int(d["input_count"])
    assert d["mode_reason"] == "no certificate for tiny-lookup; exhaustive: every input run"
    bad(invoke("verify", "tiny-lookup", "--n", "8", "--mode", "certify"), "--mode", "no certificate for tiny-lookup",
        "exhaustive | sample")
    r = invoke("verify", "all", "--n", "8", "--json")
    rows = {x["name"]: x for x in one_json(r)["reports"]}
    assert r.exit_code == 0 and rows["tiny-lookup"]["passed"] and rows["tiny-lookup"]["mode"] == "exhaustive"
    # every row passes: the default suite's run of `verify all` over every registered construction
    # (README's `verify all --n 64` and test_verify_all_small are in the slow suite); tiny-uncertified's
    # certificate fails and its 2^8 x 8 inputs are all run instead
    assert set(rows) == set(registry.names()) and all(x["passed"] for x in rows.values())
    ran = rows["tiny-uncertified"]
    assert ran["mode"] == "exhaustive" and ran["inputs_covered"] == 2**8 * 8
    assert ran["mode_reason"].startswith("certify: ") and "; unproven: " in ran["mode_reason"] \
        and ran["mode_reason"].endswith("exhaustive: every input run")
    # asked for, the certificate's failure is the report (never another mode); and by default where the
    # inputs do not fit the exhaustive limit (2^32 x 32 at N = 32)
    for args in (["--n", "8", "--mode", "certify"], ["--n", "32"]):
        r = invoke("verify", "tiny-uncertified", *args, "--json")
        failed = one_json(r)
        assert r.exit_code == 1 and not failed["passed"] and failed["mode"] == "certify", args
        assert failed["counterexample"] is None and failed["reason"].startswith("unproven") and failed.get("note") is None


def test_a_default_run_does_not_fail_a_right_model_its_certificate_cannot_prove():
    """Nearest neighbour at N = 2 (one candidate: the pointer has no variable, the certificate's step
    fails): without a mode its 512 inputs are run and it passes, the reason naming the failed step;
    asked for, certify is the FAIL it is; a wrong model still fails by default (its counterexample)."""
    m = xf.build("nearest-neighbor", n=2)
    r = xf.verify(m)
    assert r.passed and r.mode == "exhaustive" and r.inputs_covered == 512
    assert "; unproven: " in r.mode_reason and r.mode_reason.endswith("exhaustive: every input run")
    asked = xf.verify(m, mode="certify")
    assert not asked.passed and asked.mode == "certify" and asked.reason.startswith("unproven")
    d = one_json(invoke("verify", "nearest-neighbor", "--n", "2", "--json"))
    assert d["passed"] and d["mode"] == "exhaustive"
    from exactformer.constructions.core.ir import ExactTensor

    c = m.compiled
    wrong = c.replace_weight("unembed.b_U", ExactTensor(c.b_U.num + np.arange(len(c.answers)) * 64 * c.b_U.den, c.b_U.den))
    w = xf.verify(wrong)
    assert not w.passed and w.counterexample is not None


def test_the_command_line_starts_without_torch():
    """`exactformer --help` waited seconds for torch, imported by the positions command's module."""
    code = "import sys\nfrom exactformer.cli.main import app\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"


# ---- progress (issue 8 item 6) --------------------------------------------------------------------------------------------


def test_progress_without_a_terminal_is_one_line_per_step():
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--mode", "sample", "--samples", "500")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 0 and "\r" not in r.stderr and len(lines) == 3
    assert lines[0].startswith("build index-lookup n=16: ") and lines[2].startswith("sample index-lookup n=16: ")
    assert lines[1].startswith("estimate: 1000 inputs of 17 tokens, about ")  # before the run: its memory
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4", "--json")
    assert r.stderr == ""  # nothing beside the JSON
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4")
    assert any(line.startswith("certify index-lookup n=16: layer 0: ") for line in r.stderr.splitlines())


def test_progress_on_a_terminal_shows_total_and_eta():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with Steps(tty=True, console=console) as steps:
        steps.step("exhaustive equality n=8")
        advance = steps.bar(256, "inputs")
        advance(128)
        steps._live.refresh()
        text = buf.getvalue()
    assert "exhaustive equality n=8 (inputs)" in text and "128/256" in text and "ETA" in text


def test_a_step_without_a_total_shows_a_spinner_not_an_empty_bar():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    with Steps(tty=True, console=console) as steps:
        steps.step("build equality n=4096")
        steps._live.refresh()
        text = buf.getvalue()
    assert "build equality n=4096" in text and "0:00:00" in text  # the step and its elapsed time
    assert "/?" not in text and "ETA" not in text and "━" not in text  # no empty bar "0/? ... ETA" (before)


# ---- tables in files and pipes: sized to the content, plain cells ------------------------------------------------------


def test_tables_without_a_terminal_are_plain_and_sized_to_the_content():
    r = invoke("verify", "k-hop", "--n", "9", "--k", "2", "--alphabet", "3")
    lines = r.stdout.splitlines()
    assert r.exit_code == 0 and lines[0] == "verify k-hop n=9 (certify)" and lines[1].split() == ["field", "value"]
    assert all(line == line.rstrip() for line in lines)  # no padding (200-243 columns before)
    assert "{'" not in r.stdout and "['" not in r.stdout  # no Python reprs
    cells = dict((re.split(r"\s{2,}", line, maxsplit=1) + [""])[:2] for line in lines[3:])
    assert cells["details: heads"].startswith("(layer=0, head=0, block=FollowPointer, min_target_weight=")
    assert cells["eta_paper"] == "" and cells["inputs"] == "all 19683"
    r = invoke("verify", "index-lookup", "--n", "16", "--alphabet", "4")
    lines = r.stdout.splitlines()
    assert r.exit_code == 0 and all(line == line.rstrip() for line in lines) and max(map(len, lines)) < 200
    assert "all 4^16*16" in r.stdout


def test_cell_text_and_plain_table():
    assert cell_text({"a": 1, "b": [1, 2], "c": {"d": None}}) == "a=1, b=1, 2, c=d="
    assert cell_text([[1, 2], {"x": 3}, "s"]) == "(1, 2), (x=3), s" and cell_text(None) == ""
    assert plain_table("t", ["a", "bb"], [["xyz", "1"], ["", ""]]) == "t\na    bb\n-    --\nxyz  1\n\n"


# ---- the API's errors behind the CLI: one ValueError naming the parameter ------------------------------------------------


def test_api_errors_are_value_errors_naming_the_parameter():
    il = xf.build("index-lookup", n=8, alphabet=4)
    eq = xf.build("equality", n=4)
    cases = [
        (lambda: xf.verify("notamodel"), "model: must be"),
        (lambda: il.encode([0] * 64), "(symbols, p)"),
        (lambda: il.encode((5, 1)), "symbols must be a list"),
        (lambda: il.encode(([0] * 8, 1.5)), "p must be an integer in [1, 8]"),
        (lambda: il.encode_batch([([0] * 8, 1), ([0] * 7, 1)]), "symbols must have length N = 8"),
        (lambda: eq.encode([0.5, 1, 1, 1]), "-1 or 1"),
        (lambda: eq.encode_batch([[1, 1, 1, 1], [1, 1, 1]]), "N = 4"),
        (lambda: xf.build("equality", n=4, alphabet=8), "alphabet"),
        (lambda: xf.build("equality"), "'n'"),
        (lambda: xf.build("nope", n=4), "construction must be one of"),
    ]
    for fn, words in cases:
        with pytest.raises(ValueError) as e:
            fn()
        assert words in str(e.value), (words, str(e.value))
    assert il.encode(([0] * 7 + [3], np.int64(8))).tolist()[-1] == 4 + 7


def test_docs_cli_md_lists_the_builders_options():
    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| (`[a-z-]+`(?:, `[a-z-]+`)*) \| (`--[^|]*`) \|$", text, re.M)
    assert rows
    for names, opts in rows:
        for name in re.findall(r"`([a-z-]+)`", names):
            want = ["--code-seed" if p == "seed" else "--" + p.replace("_", "-")
                    for p in registry.get(name).parameters if p != "n"]
            assert opts.strip("`").split() == want, name


@pytest.mark.slow
def test_verify_all_in_float64_passes_in_the_strongest_mode_that_applies():
    """A default that prints FAIL is a bug, in every arithmetic: heads certified in fixed point only
    (pointer, match and content heads) run exhaustively or sampled in float64, the rest certify."""
    from exactformer.verify.verifier import certificate_refusal

    r = invoke("verify", "all", "--n", "8", "--arithmetic", "float64", "--json")
    d = one_json(r)
    assert r.exit_code == 0 and d["passed"], [x["reason"] for x in d["reports"] if not x["passed"]]
    for x in d["reports"]:
        c = registry.get(x["name"])
        certifiable = "certify" in c.task.modes and not certificate_refusal(c.builder(x["n"]), "float64")
        assert (x["mode"] == "certify") == certifiable, x


# ---- a target, and each option once -----------------------------------------------------------------------------------


@pytest.mark.parametrize("command,words", [("verify", ("verify: a target is required", "all, or a DIR")),
                                           ("build", ("build: a target is required", "a construction"))])
def test_a_missing_target_is_bad_input(command, words):
    """`exactformer verify` without a target printed the group's help and exited 0."""
    r = invoke(command)
    assert bad(r, *words) and r.stderr.count("\n") == 1 and r.stdout == ""


@pytest.mark.parametrize("args,option", [
    (("verify", "index-lookup", "--n", "8", "--n", "16", "--alphabet", "4"), "--n"),  # took the last, silently
    (("verify", "index-lookup", "--n=8", "--alphabet", "4", "--n", "8"), "--n"),
    (("build", "equality", "--n", "8", "--out", "a", "--out", "b"), "--out"),
    (("sizes", "--n-min", "16", "--n-min", "32"), "--n-min"),
    (("verify", "equality", "--n", "8", "--json", "--json"), "--json"),
])
def test_a_repeated_option_is_refused(args, option):
    line = bad(invoke(*args), option, "given 2 times")
    assert line.endswith("give it once")


def test_repeatable_options_stay_repeatable():
    r = invoke("sizes", "--construction", "equality", "--construction", "index-lookup", "--n-max", "64", "--csv")
    assert r.exit_code == 0 and {line.split(",")[0] for line in r.stdout.splitlines()[1:]} == {"equality", "index-lookup"}


def test_device_cuda_is_refused_before_the_heavy_imports():
    """`--device cuda` without CUDA took 8-13 s to refuse (torch imported, then the commands): the
    refusal now comes before the command's modules and torch are imported (the same line, exit 2),
    and cuda_available() answers without torch where no driver's device node exists."""
    from exactformer.precision import cuda_available

    if cuda_available():
        pytest.skip("this machine has a CUDA device")
    code = ("import sys\nfrom exactformer.precision import cuda_available\nassert not cuda_available()\n"
            "print('torch' in sys.modules)\nfrom exactformer.cli.main import app\n"
            "try:\n    app(['verify', 'index-lookup', '--n', '8', '--device', 'cuda'])\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules, 'exactformer.cli.commands' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "2", "False", "False"], out.stdout + out.stderr
    assert out.stderr.strip() == "error: --device: cuda: no CUDA device is available (use cpu)"
    for args in (("verify", "all", "--device=cuda"), ("positions", "--n", "64", "--device", "cuda")):
        bad(invoke(*args), "--device", "no CUDA device")
    with pytest.raises(xf.VerifyError, match="device: cuda: no CUDA device"):
        xf.verify(xf.build("equality", n=8), device="cuda")


def test_tables_on_an_80_column_terminal_split_no_number():
    """A boxed table at 80 columns folded 65536 into 655 / 36; now text wraps at spaces and columns
    that do not fit go into a continued table repeating the first column."""
    from exactformer.cli.output import column_groups, print_table
    from exactformer.verify.bounds import sizes as sz

    doc = sz.report([sz.SIZE_SPECS["index-lookup"]], [1 << 16, 1 << 20], sz.committed_sizes())
    head, cells = sz.spec_table(doc, "index-lookup")
    buf = io.StringIO()
    print_table("index-lookup", head, cells, console=Console(file=buf, force_terminal=True, width=80, color_system=None))
    text = buf.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    numbers = {v for row in cells for v in row if v.replace("^", "").isdigit()}
    assert len(numbers) > 8 and all(re.search(rf"(?<![\w^]){re.escape(v)}(?![\w^])", text) for v in numbers)
    assert "(continued)" in text and text.count("2^16") >= 2  # the first column in every part
    assert column_groups([4, 10, 10, 10], 30) == [[0, 1], [0, 2], [0, 3]] and column_groups([5], 80) == [[0]]
