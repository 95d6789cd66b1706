"""docs/cli.md's option tables, generated from the commands themselves.

Every table of options in docs/cli.md sits between ``<!-- BEGIN GENERATED name -->`` and
``<!-- END GENERATED name -->`` and is written here from the click command objects that
``--help`` prints (option, metavar, help text, default), so the page and ``--help`` cannot
disagree: a construction's options come from its builder's signature and docstring
(:mod:`exactformer.cli.options`), the others from the commands' declarations.
``python -m exactformer.cli.docs`` rewrites the page; ``--check`` exits 1 if it is stale
(the tests run the same comparison).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import typer

from exactformer.constructions.core import registry
from exactformer.cli.commands import BUILD_OPTIONS, FIND_MIN_OPTIONS, VERIFY_OPTIONS, dir_command
from exactformer.cli.main import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
BLOCK = re.compile(r"<!-- BEGIN GENERATED (?P<name>[\w:-]+) -->\n(?P<body>.*?)<!-- END GENERATED (?P=name) -->", re.S)


class StaleBlocks(ValueError):
    """The page's generated blocks are not exactly the generated ones (a block missing or unknown)."""


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def option_rows(cmd: Any, ctx: Any, names: set[str] | None = None) -> list[tuple[str, str]]:
    """(option with its metavar, help as ``--help`` shows it) for the options of ``cmd`` (those
    named ``names``, if given), in their order."""
    rows = []
    for p in cmd.params:
        if names is None or p.name in names:
            opts, help_text = p.get_help_record(ctx)
            rows.append((opts, help_text))
    return rows


def options_table(rows: list[tuple[str, str]]) -> str:
    lines = ["| option | meaning |", "|---|---|"]
    lines += [f"| `{_cell(opts)}` | {_cell(help_text)} |" for opts, help_text in rows]
    return "\n".join(lines)


def generated_blocks() -> dict[str, str]:
    """Every generated block of docs/cli.md by name."""
    root = typer.main.get_command(app)
    ctx = root.make_context("exactformer", ["verify", "all"], resilient_parsing=True)
    build, verify = root.get_command(ctx, "build"), root.get_command(ctx, "verify")
    names = registry.names()
    first = verify.get_command(ctx, names[0])
    blocks = {
        "build-options": options_table(option_rows(build.get_command(ctx, names[0]), ctx,
                                                   {p.name for p in BUILD_OPTIONS})),
        "verify-options": options_table(option_rows(dir_command("DIR"), ctx)),
        "find-min-options": options_table(option_rows(first, ctx, {p.name for p in FIND_MIN_OPTIONS})),
        "verify-all-options": options_table(option_rows(verify.get_command(ctx, "all"), ctx)),
    }
    verification = {p.name for p in VERIFY_OPTIONS + FIND_MIN_OPTIONS}
    summary = ["| construction | options besides `--n` |", "|---|---|"]
    per_construction = []
    for name in names:
        cmd = verify.get_command(ctx, name)
        rows = option_rows(cmd, ctx, {p.name for p in cmd.params} - verification)
        flags = " ".join(opts.split()[0] for opts, _ in rows if not opts.startswith("--n "))
        summary.append(f"| `{name}` | `{flags}` |" if flags else f"| `{name}` | |")
        per_construction.append(f"#### `{name}` ({_cell(registry.get(name).theorem)})\n\n{options_table(rows)}")
    blocks["construction-summary"] = "\n".join(summary)
    blocks["construction-options"] = "\n\n".join(per_construction)
    for command in ("positions", "sizes", "attention", "mpc"):
        blocks[f"{command}-options"] = options_table(option_rows(root.get_command(ctx, command), ctx))
    return blocks


def update(text: str) -> str:
    """``text`` with every generated block rewritten; the blocks present must be exactly the
    generated ones (a renamed or new table cannot leave a stale or missing block)."""
    blocks = generated_blocks()
    present = [m.group("name") for m in BLOCK.finditer(text)]
    unknown, missing = set(present) - set(blocks), set(blocks) - set(present)
    if unknown or missing:
        raise StaleBlocks(f"docs/cli.md: the generated blocks must be exactly {sorted(blocks)}; "
                          f"unknown: {sorted(unknown)}, missing: {sorted(missing)}")
    return BLOCK.sub(lambda m: f"<!-- BEGIN GENERATED {m.group('name')} -->\n{blocks[m.group('name')]}\n"
                               f"<!-- END GENERATED {m.group('name')} -->", text)


def main(argv: list[str]) -> int:
    """Rewrite docs/cli.md (``--check``: only say whether it is current; exit 1 if not)."""
    text = DOC.read_text()
    new = update(text)
    if "--check" in argv:
        print("docs/cli.md is current" if new == text else "docs/cli.md is stale: run python -m exactformer.cli.docs")
        return int(new != text)
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
