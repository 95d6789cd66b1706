"""The exactformer CLI: build, verify (by name, from a directory, all), errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from exactformer.verify.cli import app

runner = CliRunner()


def _json(result) -> dict:
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_verify_by_name_certify_json():
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--alphabet", "8", "--json"])
    d = _json(r)
    assert r.exit_code == 0
    for key in ("construction", "n", "passed", "mode", "inputs_covered", "precision_bits", "eta", "eta_paper",
                "k", "width", "size_bits", "seconds", "counterexample"):
        assert key in d
    assert d["passed"] is True and d["inputs_covered"] == "all" and d["mode"] == "certify"


def test_verify_sample_and_failing_exit_code():
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "32", "--alphabet", "4", "--mode", "sample",
                            "--samples", "20", "--seed", "5", "--json"])
    d = _json(r)
    assert d["passed"] and d["inputs_covered"] == 40 and d["seed"] == 5
    # eta far too small: verify fails with a counterexample and exit code 1
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--alphabet", "4", "--eta", "1",
                            "--precision", "binary:int=6,frac=8", "--json"])
    d = _json(r)
    assert r.exit_code == 1 and not d["passed"] and d["counterexample"] is not None


def test_build_then_verify_dir(tmp_path: Path):
    out = tmp_path / "il"
    r = runner.invoke(app, ["build", "index-lookup", "--n", "32", "--alphabet", "4", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    assert (out / "model.safetensors").exists() and (out / "manifest.json").exists()
    r = runner.invoke(app, ["verify", str(out), "--json"])
    d = _json(r)
    assert r.exit_code == 0 and d["passed"]
    # tampering with the weights is refused
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (out / "model.safetensors").write_bytes(bytes(data))
    r = runner.invoke(app, ["verify", str(out), "--json"])
    assert r.exit_code == 2 and "sha256" in r.output


def test_bad_options_name_the_parameter():
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--mode", "prove"])
    assert r.exit_code == 2 and "--mode" in r.output
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--device", "tpu"])
    assert r.exit_code == 2 and "--device" in r.output
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "1"])
    assert r.exit_code == 2 and "n must be" in r.output
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--precision", "binary:int=-1,frac=3"])
    assert r.exit_code == 2 and "--precision" in r.output
    r = runner.invoke(app, ["verify", "nonsense", "--n", "64"])
    assert r.exit_code == 2 and "construction must be one of" in r.output


def test_find_min_precision_cli():
    r = runner.invoke(app, ["verify", "index-lookup", "--n", "64", "--alphabet", "4", "--find-min-precision", "--json"])
    d = _json(r)
    assert r.exit_code == 0 and d["min_value"] is not None and d["min_value"] in d["passing"]


def test_verify_all_small():
    r = runner.invoke(app, ["verify", "all", "--n", "64", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert {row["construction"] for row in rows} == {"index-lookup", "equality", "inequality", "disjointness",
                                                     "dnf", "cnf", "threshold"}
    assert all(row["passed"] for row in rows)


def test_boolean_constructions_from_the_cli(tmp_path: Path):
    r = runner.invoke(app, ["verify", "dnf", "--n", "12", "--clauses", "1,-2;3,4", "--json"])
    d = _json(r)
    assert r.exit_code == 0 and d["passed"] and d["construction"] == "dnf" and d["layers"] == 2
    spec = tmp_path / "features.json"
    spec.write_text(json.dumps([[[1, 2], [0, 1, 1, 0]], [[3, 4], [0, 1, 1, 0]], [[5], [0, 1]]]))
    r = runner.invoke(app, ["verify", "threshold", "--n", "10", "--features", str(spec), "--b", "1",
                            "--mode", "exhaustive", "--json"])
    d = _json(r)
    assert r.exit_code == 0 and d["passed"] and d["inputs_covered"] == 2**10
    # a too-small eta is rejected with a counterexample
    r = runner.invoke(app, ["verify", "inequality", "--n", "16", "--eta", "1/32", "--precision",
                            "binary:int=6,frac=5", "--json"])
    d = _json(r)
    assert r.exit_code == 1 and not d["passed"]


def test_boolean_bad_options():
    r = runner.invoke(app, ["verify", "threshold", "--n", "16", "--features", "[[1,2]]", "--g", "0x"])
    assert r.exit_code == 2 and "--g" in r.output
    r = runner.invoke(app, ["verify", "threshold", "--n", "16", "--features", "[[1,2", "--g", "0110"])
    assert r.exit_code == 2 and "--features" in r.output
    r = runner.invoke(app, ["verify", "equality", "--n", "7"])
    assert r.exit_code == 2 and "n" in r.output
