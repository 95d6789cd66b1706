"""``exactformer mpc``: P2 Thms 4.2 and 4.4 from the command line (docs/cli.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exactformer.cli.main import app


def _run(*args: str):
    return CliRunner().invoke(app, ["mpc", *args])


def test_anna_json():
    r = _run("--n", "64", "--samples", "8", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["kind"] == "anna" and d["passed"] and d["inputs"] == 12
    assert d["machines_theorem"] == round(64 ** (1 + d["eps"] - d["eps_prime"] + 3 / 9)) or d["machines_theorem"] > 0
    assert d["peak"]["memory"] <= d["memory"] and d["rounds"] <= d["round_bound"]


def test_ema_round_trip_and_low_rank():
    r = _run("--kind", "ema", "--application", "induction-heads", "--n", "16", "--param", "alphabet=3",
             "--samples", "5", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["passed"] and d["params"]["alphabet"] == 3 and d["inputs"] > 5
    r = _run("--kind", "low-rank", "--n", "32", "--samples", "4", "--json")
    d = json.loads(r.stdout)
    assert r.exit_code == 0 and d["passed"] and d["levels"][0] == "low-rank" and d["approximation"]["within"]


def test_resources_small(tmp_path: Path):
    doc = tmp_path / "page.md"
    doc.write_text("x\n<!-- table:anna-resources -->\nold\n<!-- end table -->\ny\n")
    r = _run("--kind", "resources", "--max-log-n", "8", "--doc", str(doc), "--figure", str(tmp_path / "f.png"), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["rows"]) == 6 and all(row["run"] and row["agrees"] for row in d["rows"])
    text = doc.read_text()
    assert "old" not in text and "| (0.25, 0.5, 2) | 2^8 |" in text and (tmp_path / "f.png").stat().st_size > 0


@pytest.mark.parametrize("args,message", [
    (["--kind", "nope"], "--kind: must be one of anna | ema | low-rank | resources"),
    (["--rank", "3"], "--rank: only with --kind low-rank"),
    (["--kind", "resources", "--n", "8"], "--n: only with --kind anna or ema or low-rank"),
    (["--n", "1"], "--n: must be an integer in [2, 1048576]"),
    (["--eps-prime", "x"], "--eps-prime: must be a number in (0.0, 5.0)"),
    (["--n", "64", "--eps", "0.5", "--eps-prime", "0.4"], "eps_prime: must be a number in (0.5"),
    (["--family", "nope"], "--family: must be one of"),
    (["--precision", "float32"], "--precision: must be a fixed-point format"),
    (["--kind", "ema", "--application", "nope"], "--application: must be one of"),
    (["--kind", "ema", "--param", "hops"], "--param: must be NAME=INTEGER"),
    (["--kind", "ema", "--param", "colour=3"], "unknown parameter(s) ['colour']"),
    (["--n", "65536", "--approx-c", "2"], "words for one input (limit"),  # refused with its estimate
])
def test_bad_options_one_line_exit_2(args, message):
    r = _run(*args)
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.output
