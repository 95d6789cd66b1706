"""``exactformer frontier``: the precision frontier (``xf.frontier``) as a table, JSON, CSV,
Markdown or figures.

Registered lazily by exactformer/cli/main.py (:data:`~exactformer.cli.main.OTHER_COMMANDS`). Bad
arguments print one line ``error: --option: <allowed>`` (exit 2) through the API's own checks.
Results stream to stderr as jobs finish (a bar on a terminal, one line per job otherwise); the
table goes to stdout. Exit 1 when a job ended in an error (a bug or a resource limit: the table
says which); a cell that is not certified is a result, not a failure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from exactformer.arguments import ArgumentError, parse_int
from exactformer.cli.output import EXIT_FAILED, fail, print_json, print_table

_ARITHMETICS = "fixed, float8_e4m3, float8_e5m2, bfloat16, float16, float32, float64"


def _progress() -> tuple[Callable[[dict[str, Any]], None], Callable[[], None]]:
    """Each finished job on stderr: a rich bar on a terminal (its total the jobs the grid may still
    need), else one line per computed job; and a function that ends the display."""
    if not sys.stderr.isatty():
        def line(event: dict[str, Any]) -> None:
            r = event["done"]
            if not event["cached"]:
                typer.echo(f"frontier: {r['construction']} {r['arithmetic']} N=2^{r['n'].bit_length() - 1}: "
                           f"{r['status']}" + (f" ({r['precision']})" if r.get("precision") else "")
                           + f", {r['seconds']:.1f} s", err=True)
        return line, (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("frontier {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    bar.start()
    task = bar.add_task("", total=None)
    done = [0]

    def update(event: dict[str, Any]) -> None:
        r = event["done"]
        done[0] += 1
        bar.update(task, completed=done[0], total=done[0] + event["total"],
                   description=f"{r['construction']} {r['arithmetic']} N=2^{r['n'].bit_length() - 1}: {r['status']}")
    return update, bar.stop


def frontier(
    constructions: Optional[str] = typer.Option(
        None, "--constructions", metavar="A,B", show_default=False,
        help="a comma list of registered constructions. Default: every one"),
    arithmetics: Optional[str] = typer.Option(
        None, "--arithmetics", metavar="A,B", show_default=False,
        help=f"a comma list of {_ARITHMETICS}. fixed: the fewest-bit fixed-point build per N; a float dtype: the "
             "build designed for it, certified in it. Default: all"),
    min_log_n: str = typer.Option("4", "--min-log-n", metavar="K", help="the smallest N is 2^K, K in [1, 30]"),
    max_log_n: str = typer.Option("20", "--max-log-n", metavar="K", help="the largest N is 2^K, K in [1, 30]"),
    workers: Optional[str] = typer.Option(
        None, "--workers", metavar="W", show_default=False,
        help="worker processes of the embedded dask LocalCluster, >= 0 (0: this process, no cluster). Default: the "
             "machine's cores"),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", metavar="ADDRESS", show_default=False,
        help="a running dask scheduler (tcp://HOST:PORT) to send the jobs to instead; DASK_SCHEDULER_ADDRESS "
             "does the same"),
    budget: str = typer.Option(
        "120", "--budget", metavar="SECONDS",
        help="a chain's next N is not run when its predicted time is over this (> 0)"),
    cache: Optional[Path] = typer.Option(
        None, "--cache", metavar="DIR", show_default=False,
        help="the results cache. Default: $EXACTFORMER_CACHE/frontier, else ~/.cache/exactformer/frontier"),
    no_cache: bool = typer.Option(False, "--no-cache", help="compute every job, read and write no cache"),
    json: bool = typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/precision-frontier.md)"),
    csv: bool = typer.Option(False, "--csv", help="print CSV, one row per job"),
    markdown: bool = typer.Option(False, "--markdown", help="print the Markdown tables"),
    figures: Optional[Path] = typer.Option(
        None, "--figures", metavar="DIR", show_default=False,
        help="write frontier.json, frontier.csv and the figures (frontier-bits.png, frontier-heatmap.png) into DIR"),
    doc: Optional[Path] = typer.Option(
        None, "--doc", metavar="FILE", show_default=False,
        help="with --figures: rewrite the generated tables of this Markdown file"),
) -> None:
    """The precision frontier: for each construction and arithmetic the largest N (a power of two) at
    which a build is certified, and the fewest fixed-point bits per N beside the paper's precision.

    Jobs run on dask.distributed (an embedded LocalCluster, or --scheduler); results are cached, so a
    re-run computes only what changed and an interrupted run resumes (docs/precision-frontier.md)."""
    import exactformer as xf
    from exactformer.verify.verifier import VerifyError

    as_json = json
    if sum((json, csv, markdown)) > 1:
        fail("--json/--csv/--markdown: at most one of them", as_json)
    if doc is not None and figures is None:
        fail("--doc: only together with --figures DIR", as_json)
    if doc is not None and not doc.is_file():
        fail(f"--doc: an existing Markdown file, got {str(doc)!r}", as_json)
    if no_cache and cache is not None:
        fail("--no-cache: not together with --cache", as_json)
    try:
        lo = parse_int(min_log_n, "--min-log-n", "in [1, 30]")
        hi = parse_int(max_log_n, "--max-log-n", "in [1, 30]")
        w = None if workers is None else parse_int(workers, "--workers", ">= 0")
    except ArgumentError as e:
        fail(str(e), as_json)
    try:
        seconds = float(budget)
    except ValueError:
        fail(f"--budget: must be a number of seconds > 0, got {budget!r}", as_json)
    update, stop = _progress()
    try:
        result = xf.frontier(constructions, arithmetics, lo, hi, workers=w, scheduler=scheduler, budget=seconds,
                             cache=False if no_cache else (cache or True), progress=update)
    except VerifyError as e:
        stop()
        fail(f"--{e.parameter.replace('_', '-')}: {e.reason}", as_json)
    stop()
    ran = f"{result.computed} jobs computed on {result.where}" if result.computed else "nothing computed"
    typer.echo(f"frontier: {ran}, {result.cached} results from the cache, {result.seconds:.1f} s", err=True)
    if figures is not None:
        from exactformer.verify.frontier.figures import write_figures

        for path in write_figures(result, figures, doc):
            typer.echo(str(path), err=as_json)
    if as_json:
        print_json(result.to_dict())
    elif csv:
        sys.stdout.write(result.to_csv())
    elif markdown:
        sys.stdout.write(result.to_markdown())
    elif figures is None:
        _print(result)
    errors = [c for ch in result.chains for c in ch.ran() if c["status"] == "error"]
    if errors:
        e = errors[0]
        typer.echo(f"error: {len(errors)} job(s) ended in an error, first {e['construction']} {e['arithmetic']} "
                   f"N={e['n']}: {e['reason']}", err=True)
        raise typer.Exit(EXIT_FAILED)


def _print(result: Any) -> None:
    from exactformer.verify.frontier import report

    lo, hi = result.ns[0].bit_length() - 1, result.ns[-1].bit_length() - 1
    head, rows = report.heat_rows(result)
    print_table(f"largest certified N, N = 2^{lo} .. 2^{hi} (≥: not reached; *: gaps below)", head, rows)
    if any(c.arithmetic == "fixed" for c in result.chains):
        head, rows = report.bits_rows(result)
        print_table("fewest fixed-point bits of a certified build", head, rows)
    print_table("where each chain stops", ["construction", "arithmetic", "gaps", "stops"],
                [list(s) for s in report.stops(result)])
