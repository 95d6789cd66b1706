"""Help = docs: docs/cli.md's option tables are generated from the command objects that ``--help``
prints (exactformer/cli/docs.py), regenerating changes nothing, and every row agrees with ``--help``."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from exactformer.constructions.core import registry
from exactformer.cli.main import app
from exactformer.cli.docs import BLOCK, DOC, StaleBlocks, update

TEXT = DOC.read_text()
BLOCKS = {m.group("name"): m.group("body") for m in BLOCK.finditer(TEXT)}


def _words(text: str) -> str:
    return " ".join(text.split())


def _help(*args: str) -> str:
    r = CliRunner().invoke(app, [*args, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    return _words(r.stdout)


def _rows(body: str) -> list[tuple[str, str]]:
    """(option, meaning) of each row of the Markdown tables in ``body``, unescaped."""
    rows = re.findall(r"^\| `(--[^`]*)` \| (.*) \|$", body, re.M)
    return [(opt, meaning.replace("\\|", "|")) for opt, meaning in rows]


def test_regenerating_changes_nothing():
    assert update(TEXT) == TEXT, "docs/cli.md is stale: run python -m exactformer.cli.docs"


def test_the_generated_blocks_must_all_be_there():
    with pytest.raises(StaleBlocks, match="missing: \\['attention-options'\\]"):
        update(TEXT.replace("GENERATED attention-options", "GENERATED gone"))


@pytest.mark.parametrize("block,command", [
    ("verify-options", ["verify"]),  # `verify --help` showed none of them before
    ("module-options", ["build"]),
    ("find-min-options", ["verify", "equality"]),
    ("verify-all-options", ["verify", "all"]),
    ("build-options", ["build", "equality"]),
    ("positions-options", ["positions"]),
    ("sizes-options", ["sizes"]),
    ("attention-options", ["attention"]),
])
def test_every_row_is_what_help_prints(block, command):
    text, rows = _help(*command), _rows(BLOCKS[block])
    assert rows
    for opt, meaning in rows:
        assert f"{opt} {_words(meaning)}" in text, (command, opt)


def test_every_construction_option_is_what_help_prints():
    sections = re.split(r"^#### `([a-z0-9-]+)` .*$", BLOCKS["construction-options"], flags=re.M)[1:]
    documented = dict(zip(sections[::2], sections[1::2]))
    assert list(documented) == registry.names()
    for name, body in documented.items():
        for command in ("verify", "build"):
            text = _help(command, name)
            for opt, meaning in _rows(body):
                assert f"{opt} {_words(meaning)}" in text, (command, name, opt)


def test_help_offers_only_what_a_command_line_can_give():
    for name in registry.names():
        text = _help("verify", name)
        assert "code object" not in text and "<str>" not in text and "<int>" not in text, name
    for name in ("equality", "index-lookup", "threshold", "dnf", "match2"):
        precision = re.search(r"--precision PRECISION (.*?) --", _help("verify", name)).group(1)
        assert "float64 | float32" in precision, name  # float32 was missing
    assert "robust | threshold | minimal" in _help("verify", "equality")
    eta_row = next(line for line in TEXT.splitlines() if line.startswith("| `eta` |"))
    assert "one-hot" not in eta_row and "robust" in eta_row  # the builders say robust | threshold | minimal
    for name in ("positions", "attention"):
        assert "<str>" not in _help(name) and "<int>" not in _help(name)
