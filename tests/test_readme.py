"""Every example in README.md runs as written: each line of a bash block that starts with
``exactformer`` (through the CLI's runner, in a scratch directory holding a copy of docs/examples),
and each python block. The set-up lines (``pip install ... && exactformer verify all``) are the
install itself and are not rerun here; ``verify all`` is run by test_cli.py at small n."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from exactformer.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def _commands() -> list[str]:
    return [line.strip() for block in _blocks("bash") for line in block.splitlines()
            if line.strip().startswith("exactformer ")]


def test_the_readme_has_examples():
    cmds = _commands()
    assert len(cmds) >= 8 and any(c.startswith("exactformer verify all") for c in cmds)
    assert "docs/examples/feats.json" in README and (ROOT / "docs/examples/feats.json").is_file()
    assert len(_blocks("python")) >= 1


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "docs" / "examples", d / "docs" / "examples")
    return d


#: README commands left to the slow suite (.ci/run runs it), each with the faster default test that
#: checks the same property (the default suite must stay under 5 minutes on 2 cores)
SLOW = (
    # slow: every registered construction verified by `verify all` at n = 8 in
    # test_cli.py::test_a_new_construction_needs_no_cli_edit
    "exactformer verify all --n 64",
    # slow: k-hop's layer count in test_induction_heads.py::test_layers_and_width, its certificate at
    # small n (CLI too) in test_induction_heads.py::test_certificate_agrees_with_every_input, ::test_the_command_line
    "exactformer verify k-hop --n 65536",
    # slow: k-hop's exhaustive runs in test_induction_heads.py::test_certificate_agrees_with_every_input
    "exactformer verify k-hop --n 8 --k 3",
    # slow: prefix-sums through the CLI in test_mpc_simulation.py::test_verify_modes_and_the_command_line,
    # at n = 16 in ::test_the_invariant_on_samples_and_named_inputs and ::test_layers_heads_and_answers
    "exactformer verify prefix-sums --n 16",
    # slow: the same features file built in test_api_doc.py (block 1), thresholds run exhaustively in
    # test_float_arithmetics.py::test_default_builds_run_right_in_torch and test_thresholds.py
    "exactformer verify threshold --n 16 --features",
    # slow: sampled runs through the CLI in test_cli.py::test_verify_sample_exhaustive_and_failing_exit_code
    "exactformer verify index-lookup --n 4096 --alphabet 8 --mode sample",
    # slow: a certificate's JSON through the CLI in test_cli.py::test_verify_by_name_certify_json, the two-layer
    # certificate at N = 4096 in test_equality.py::test_sample_mode_and_large_certificate
    "exactformer verify equality --n 4096",
    # slow: --find-min-precision in test_cli.py::test_find_min_precision_table_and_json
    "exactformer verify index-lookup --n 256 --alphabet 8 --find-min-precision",
    # slow: the frontier's command line in test_frontier.py::test_the_command_line_reads_the_cache
    "exactformer frontier",
    # slow: positions --certify in test_position_codes_cli.py (N = 4096)
    "exactformer positions --n 65536 --certify",
)


def _params() -> list:
    """The README's commands, those starting with an entry of SLOW marked slow."""
    return [pytest.param(c, marks=pytest.mark.slow) if any(c.startswith(k) for k in SLOW) else c for c in _commands()]


def test_the_slow_commands_are_in_the_readme():
    """Every SLOW entry still names a README command (a changed command would otherwise run unmarked)."""
    cmds = _commands()
    assert all(any(c.startswith(k) for c in cmds) for k in SLOW)


@pytest.mark.parametrize("cmd", _params())
def test_readme_command_runs(cmd: str, scratch: Path, monkeypatch):
    monkeypatch.chdir(scratch)  # commands run in order: `build ... --out il4k` precedes `verify il4k`
    args = shlex.split(cmd, comments=True)[1:]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])


def test_readme_python_runs(capsys):
    for code in _blocks("python"):
        exec(compile(code, "README.md", "exec"), {})
    assert "True" in capsys.readouterr().out
