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


# ---- statements the code can contradict --------------------------------------------------------------------------

ROOT = DOC.parents[1]
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}


def test_every_command_is_in_the_synopsis_and_has_its_options_table():
    """`exactformer frontier` was missing from this page: every command the CLI lists is in the
    synopsis at the top and has a generated option table."""
    from exactformer.cli.main import OTHER_COMMANDS

    synopsis = TEXT.split("\n\n")[1]
    for command in ("build", "verify", *OTHER_COMMANDS):
        assert f"exactformer {command} " in synopsis, command
    assert {f"{c}-options" for c in OTHER_COMMANDS} <= set(BLOCKS)


def test_no_page_says_a_certified_construction_has_no_certificate():
    """docs/cli.md and docs/api.md said induction-heads and k-hop had no certificate after they had
    one: every "no certificate for <construction>" on a page names a construction whose task has no
    certify mode, or one whose certificate does not cover the float arithmetic the sentence names."""
    from exactformer.constructions.core.ir import fixed_point_only_heads

    found = 0
    for page, text in PAGES.items():
        for m in re.finditer(r"no certificate for ([a-z0-9-]+)( in (float\w+|real))?", text):
            if m.group(1) not in registry.names():
                continue
            c = registry.get(m.group(1))
            found += 1
            if "certify" in c.task.modes:
                assert m.group(2) and fixed_point_only_heads(c.builder(**c.example).plan), (page, m.group(0))
    assert found


def test_no_page_calls_a_registered_construction_an_ema_program():
    """Every registered construction builds weights (an xf.Model); docs/api.md still said
    induction-heads and k-hop returned EMA programs."""
    names = set(registry.names())
    for page in ("README.md", "docs/api.md", "docs/cli.md"):
        for sentence in re.split(r"(?<=[.:;])\s", " ".join(PAGES[page].split())):
            if re.search(r"EMA programs? \(`|return EMA programs|an EMA program:", sentence):
                assert not names & set(re.findall(r"`([a-z0-9-]+)`", sentence)), (page, sentence)


def test_certified_in_float_has_one_source():
    """params["arithmetics"] (where the builder checked its conditions), the manifest's certified list
    (xf.save) and the pages agree, all from fixed_point_only_heads: the P2 weight models listed
    float32/float64 in params["arithmetics"] without saying that no certificate covers them, while
    the manifest recorded them as not certified and docs/mpc.md said fixed point only."""
    import exactformer as xf
    from exactformer.constructions.core.ir import FIXED_POINT_ONLY_NOTE, fixed_point_only_heads
    from exactformer.verify.verifier import certified_arithmetics

    for name, floats in (("match2", False), ("k-hop", False), ("equality", True)):
        c = registry.get(name)
        m = c.builder(**c.example)
        only = fixed_point_only_heads(m.plan)
        assert bool(only) != floats, name
        record = certified_arithmetics(m)
        assert record["certified"][0] == m.precision and ({"float64", "float32"} <= set(record["certified"])) == floats
        param = m.params.get("arithmetics")
        if param is not None:
            assert param.formula.endswith(FIXED_POINT_ONLY_NOTE.format(", ".join(only))) == (not floats), param.formula
    for name in registry.names():  # every build that lists floats it is not certified in says so
        c = registry.get(name)
        m = c.builder(**c.example)
        param, only = m.params.get("arithmetics"), fixed_point_only_heads(m.plan)
        if param is not None and only and {"float64", "float32"} & set(param.value):
            assert "no certificate covers the floats" in param.formula, name
    mpc = " ".join(PAGES["docs/mpc.md"].split())
    assert "The certificate covers the fixed-point format only" in mpc
    assert fixed_point_only_heads(xf.build("induction-heads", n=4, alphabet=2).plan)
