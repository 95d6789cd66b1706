"""The ``positions`` CLI command, registered on a throwaway typer app (exactformer/cli/main.py registers it
for real)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from exactformer.cli.positions import positions


@pytest.fixture(scope="module")
def app():
    app = typer.Typer()
    app.command("positions")(positions)

    @app.command("noop")
    def noop() -> None:  # a second command keeps "positions" a subcommand
        pass

    return app


def _json(res):
    lines = [l for l in res.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, res.stdout
    return json.loads(lines[0])


def test_human_output(app):
    res = CliRunner().invoke(app, ["positions", "--n", "4096", "--certify"])
    assert res.exit_code == 0, res.output
    for word in ("reed-solomon", "256", "1/8", "paper_k", "1154", "certified max", "worst pair"):
        assert word in res.stdout


def test_json_rs(app):
    res = CliRunner().invoke(app, ["positions", "--n", "1024", "--max-inner", "1/4", "--certify", "--json"])
    assert res.exit_code == 0, res.output
    out = _json(res)
    assert out["family"] == "reed-solomon" and out["n"] == 1024 and out["k"] == 256
    assert out["q"] == 16 and out["d"] == 3 and out["bound"] == "1/8" and out["certified_max"] == "1/8"
    assert out["paper_k"] == 976 and out["seconds"] >= 0 and out["pair"][0] < out["pair"][1]
    assert out["passed"] is True


def test_json_families(app):
    res = CliRunner().invoke(app, ["positions", "--n", "300", "--family", "random", "--seed", "3", "--json"])
    out = _json(res)
    assert out["family"] == "random" and out["bound"] is None and out["certified_max"] is None
    assert out["seed"] == 3 and out["k"] % 8 == 0 and out["search_certified_max"] is not None
    res = CliRunner().invoke(app, ["positions", "--n", "50", "--family", "onehot", "--json", "--certify"])
    out = _json(res)
    assert (out["family"], out["k"], out["bound"], out["certified_max"]) == ("onehot", 50, "0/1", "0/1")


@pytest.mark.parametrize(
    "args,match",
    [
        (["--n", "1"], "n must be an integer >= 2"),
        (["--n", "100", "--max-inner", "2"], "max_inner must lie in the open interval (0, 1)"),
        (["--n", "100", "--family", "nope"], "family must be one of"),
        (["--n", "100", "--device", "tpu"], "--device: must be one of cpu | cuda"),
    ],
)
def test_errors(app, args, match):
    res = CliRunner().invoke(app, ["positions", *args, "--json"])
    assert res.exit_code == 2
    assert match in _json(res)["error"]
    assert match in res.stderr


def test_n_as_power_of_two_and_certify_estimate(app):
    res = CliRunner().invoke(app, ["positions", "--n", "2^12", "--certify", "--json"])
    out = _json(res)
    assert res.exit_code == 0 and out["n"] == 4096 and out["passed"] is True
    assert 0 <= out["certify_estimate_seconds"] < 60


def test_certify_beyond_the_limit_needs_force(app, monkeypatch):
    from exactformer.cli import positions as cli_positions

    res = CliRunner().invoke(app, ["positions", "--n", "2^40", "--certify", "--json"])
    assert res.exit_code == 2 and "hours" in _json(res)["error"] and "--force" in res.stderr
    # with --force the estimate is no obstacle (a tiny limit stands in for a long run)
    monkeypatch.setattr(cli_positions, "CERTIFY_LIMIT_S", 0.0)
    res = CliRunner().invoke(app, ["positions", "--n", "300", "--family", "random", "--seed", "3", "--certify", "--json"])
    assert res.exit_code == 2 and "--force" in _json(res)["error"]
    res = CliRunner().invoke(app, ["positions", "--n", "300", "--family", "random", "--seed", "3", "--certify", "--force", "--json"])
    assert res.exit_code == 0 and _json(res)["passed"] is True
