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


@pytest.mark.parametrize("cmd", _commands())
def test_readme_command_runs(cmd: str, scratch: Path, monkeypatch):
    monkeypatch.chdir(scratch)  # commands run in order: `build ... --out il4k` precedes `verify il4k`
    args = shlex.split(cmd, comments=True)[1:]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])


def test_readme_python_runs(capsys):
    for code in _blocks("python"):
        exec(compile(code, "README.md", "exec"), {})
    assert "True" in capsys.readouterr().out
