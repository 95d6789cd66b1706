"""What the ``exactformer`` commands print: errors, JSON, tables and progress.

Conventions (docs/cli.md): exit 0 = passed, 1 = verification failed, 2 = bad input. A bad input
prints one plain line ``error: <message>`` on stderr and, under ``--json``, ``{"error": <message>}``
on stdout (so stdout under ``--json`` always holds exactly one JSON object). Tables go to stdout,
progress to stderr: on a terminal a live bar with the total and the ETA, otherwise one line per
finished step (never a flood of bar updates in a log).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def report_error(message: str, as_json: bool) -> None:
    """One line ``error: ...`` on stderr (and ``{"error": ...}`` on stdout under --json)."""
    message = " ".join(str(message).split())
    if as_json:
        print(json.dumps({"error": message}))
    typer.echo(f"error: {message}", err=True)


def fail(message: str, as_json: bool) -> NoReturn:
    """A bad input: :func:`report_error`, exit 2."""
    report_error(message, as_json)
    raise typer.Exit(EXIT_BAD_INPUT)


def print_json(obj: Any) -> None:
    print(json.dumps(obj, default=str))


def stdout_console() -> Console:
    """Tables on stdout: the terminal's width, or 200 columns when stdout is not a terminal."""
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else 200, highlight=False, markup=False, emoji=False)


def print_table(title: str, columns: list[str], rows: list[Any], header: bool = True) -> None:
    """A table on stdout (cells as plain text: square brackets are printed, not read as markup)."""
    t = Table(title=title, show_header=header)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    stdout_console().print(t)


class Steps:
    """Progress on stderr for one command: :meth:`step` names the step now running, :meth:`bar`
    gives a counter with a total. On a terminal (``tty``) a rich live display shows the step, a bar
    with the total and the ETA, and the elapsed time; otherwise each step prints one line when it
    ends (``<step>: <seconds> s``) unless ``lines`` is False, and bars print nothing."""

    def __init__(self, lines: bool = True, tty: bool | None = None, console: Console | None = None):
        self.lines = lines
        self.tty = sys.stderr.isatty() if tty is None else tty
        self._console = console
        self._live: Progress | None = None
        self._step: tuple[str, float] | None = None
        self._task = None

    def __enter__(self) -> "Steps":
        if self.tty:
            cols = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
            self._live = Progress(*cols, console=self._console or Console(stderr=True), transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self._end_step()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _end_step(self) -> None:
        if self._step is not None and not self.tty and self.lines:
            name, t0 = self._step
            typer.echo(f"{name}: {time.perf_counter() - t0:.2f} s", err=True)
        self._step = None

    def step(self, name: str) -> None:
        """Step ``name`` starts (the previous one ends)."""
        self._end_step()
        self._step = (name, time.perf_counter())
        if self._live is not None:
            if self._task is not None:
                self._live.remove_task(self._task)
            self._task = self._live.add_task(name, total=None)

    def overall(self, total: int, what: str) -> Callable[[int], None] | None:
        """A counter over the whole command (shown beside the steps on a terminal)."""
        if self._live is None:
            return None
        task = self._live.add_task(what, total=total)
        live = self._live
        return lambda k: live.advance(task, k)

    def bar(self, total: int | None, what: str) -> Callable[[int], None] | None:
        """A counter for the current step: ``advance(k)`` after k more of ``total`` ``what``."""
        if self._live is None:
            return None
        if self._task is not None:
            self._live.remove_task(self._task)
        desc = f"{self._step[0] if self._step else ''} ({what})"
        task = self._task = self._live.add_task(desc, total=total)
        live = self._live
        return lambda k: live.advance(task, k)
