"""``exactformer sizes``: built sizes against the papers' lower bounds, as a table, JSON, CSV or plot.

Registered by exactformer/cli/main.py as ``app.command("sizes")(sizes)``. Bad arguments print one line
``error: <parameter>: <allowed>`` to stderr and exit with status 2 (with ``--json``, stdout also
holds ``{"error": ...}``). With ``--json`` stdout holds exactly one JSON object (schema in
docs/sizes.md). Progress goes to stderr (docs/cli.md): on a terminal a bar over the rows with its
ETA, in a log one line per construction, nothing under ``--json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

import typer

from exactformer.verify.bounds import figures as fig
from exactformer.verify.bounds import sizes as sz
from exactformer.cli.output import Steps, fail, print_json, print_table


def _specs(values: list[str] | None) -> list[sz.SizeSpec]:
    if not values:
        return list(sz.SIZE_SPECS.values())
    names = [v.strip() for item in values for v in item.split(",") if v.strip()]
    return [sz.spec(name) for name in dict.fromkeys(names)]


def _progress(steps: Steps, total: int, provider: sz.SizeProvider | None, ns: list[int]) -> Callable[[str], None]:
    """Each row as it is done: on a terminal a bar over all ``total`` rows with its ETA; a step per
    construction whose rows are computed (not all read from the committed data ``provider``), in a
    log one line each with its seconds."""
    done = steps.overall(total, "rows")
    current: list[str] = []

    def computed(name: str) -> bool:
        held = getattr(provider, "holds", None)
        return held is None or not all(held(sz.SIZE_SPECS[name], n) for n in ns)

    def row(name: str) -> None:
        if current != [name]:
            current[:] = [name]
            if computed(name):
                steps.step(f"sizes {name}")
        if done:
            done(1)
    return row


def _rows_provider(recompute: bool, specs: list[sz.SizeSpec], ns: list[int]) -> sz.SizeProvider | None:
    """The committed size data (docs/figures/sizes.json) unless ``recompute``; None: compute every
    row (:data:`sz.SIZE_PROVIDER`). Says on stderr which rows are computed and why."""
    if recompute:
        return None
    committed = sz.committed_sizes()
    if committed is None:
        typer.echo(f"note: no committed size data ({sz.COMMITTED_DATA}, part of a source checkout): computing "
                   "every row (full builds, shapes-only above each construction's built_to; minutes for the whole "
                   "table)", err=True)
        return None
    missing = [(s.name, n) for s in specs for n in ns if not committed.holds(s, n)]
    if missing:
        examples = ", ".join(f"{name} N={sz.fmt_n(n)}" for name, n in missing[:3]) + (", ..." if len(missing) > 3 else "")
        typer.echo(f"note: {len(missing)} of {len(specs) * len(ns)} rows are not in the committed size data "
                   f"({examples}): computing them (full builds, shapes-only above each construction's built_to; large "
                   "N can take minutes)", err=True)
    return committed


def sizes(
    construction: Optional[list[str]] = typer.Option(
        None, "--construction", help=f"repeatable or comma list; default all: {', '.join(sz.SIZE_SPECS)}"),
    n_min: str = typer.Option("2^4", "--n-min", help="smallest N: an integer or 2^k in [2, 2^30]"),
    n_max: str = typer.Option("2^30", "--n-max", help="largest N: an integer or 2^k in [2, 2^30]"),
    step: int = typer.Option(1, "--step", help="log2 step between rows (N = n-min * 2^(step j))"),
    json: bool = typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/cli.md, docs/sizes.md)"),
    csv: bool = typer.Option(False, "--csv", help="print CSV"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="draw the families of the constructions into FILE (.png or .svg)"),
    figures: Optional[Path] = typer.Option(None, "--figures", help="write every figure and its data into DIR"),
    doc: Optional[list[Path]] = typer.Option(
        None, "--doc", help="with --figures: rewrite the generated tables of this Markdown file (repeatable: "
                            "docs/sizes.md, docs/separations.md)"),
    recompute: bool = typer.Option(
        False, "--recompute", help="compute every row (full builds, shapes-only above each construction's built_to; "
                                   "minutes for the whole table) instead of reading the committed data "
                                   "docs/figures/sizes.json"),
) -> None:
    """Sizes of the built models (layers, heads, width, precision, bits) beside the lower bounds.

    Rows come from the committed size data (docs/figures/sizes.json: every construction at
    N = 2^4 .. 2^30); rows it does not hold (other N, changed constructions) are computed, and
    --recompute computes every row."""
    try:
        if sum(bool(x) for x in (json and not figures, csv, plot, figures)) > 1:
            raise sz.SizesError("--json/--csv/--plot/--figures: at most one of them (--json may go with --figures)")
        if doc and figures is None:
            raise sz.SizesError("--doc: only together with --figures DIR")
        for page in doc or []:
            if not page.is_file():
                raise sz.SizesError(f"--doc: an existing Markdown file, got {str(page)!r}")
        if plot is not None and plot.suffix.lower() not in (".png", ".svg"):
            raise sz.SizesError(f"--plot: a file name ending in .png or .svg, got {plot.name!r}")
        specs = _specs(construction)
        ns = sz.n_values(sz.parse_n(n_min, "--n-min"), sz.parse_n(n_max, "--n-max"), step)
        provider = _rows_provider(recompute, specs, ns)
        if figures is not None:
            with Steps(lines=not json) as steps:
                paths = fig.generate_figures(figures, ns, provider, specs=specs, doc_path=doc,
                                            progress=_progress(steps, len(specs) * len(ns), provider, ns),
                                            phase=steps.step)
            if json:
                print_json({"written": [str(p) for p in paths]})
            else:
                typer.echo("\n".join(str(p) for p in paths))
            return
        if plot is not None:
            fams = sz.figure_families(s.family for s in specs)
            fig.plot_families([(f, fig.family_series(f, ns, provider, specs)) for f in fams], plot)
            typer.echo(str(plot))
            return
        with Steps(lines=not json) as steps:
            doc_ = sz.report(specs, ns, provider, _progress(steps, len(specs) * len(ns), provider, ns))
    except sz.SizesError as e:
        fail(str(e), json)
    if json:
        print_json(doc_)
    elif csv:
        sys.stdout.write(sz.report_csv(doc_))
    else:
        _print_tables(doc_)


def _print_tables(doc: dict) -> None:
    for name, d in doc["specs"].items():
        head, cells = sz.spec_table(doc, name)
        print_table(f"{name} ({d['family']}); p* = reference precision (not built)", head, cells)
