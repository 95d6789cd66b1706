"""What the ``exactformer`` commands print: errors, JSON, tables and progress.

Conventions (docs/cli.md): exit 0 = passed, 1 = verification failed, 2 = bad input. A bad input
prints one plain line ``error: <message>`` on stderr and, under ``--json``, ``{"error": <message>}``
on stdout (so stdout under ``--json`` always holds exactly one JSON object). Tables go to stdout:
on a terminal boxed to its width, otherwise (a file, a pipe) as plain text sized to the content;
every cell is plain text (:func:`cell_text`: lists joined, objects as ``key=value`` pairs).
Progress goes to stderr: on a terminal a live display (a bar with the total and the ETA where the
total is known, a spinner where it is not), otherwise one line per finished step and, for a bar,
one line every :data:`LINE_SECONDS` with the count and the ETA (never a flood of bar updates in a
log). Notes (a run's estimate) are one line each, printed when they come.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, Task, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)
from rich.table import Table
from rich.text import Text

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
LINE_SECONDS = 15.0  # a bar's line in a log: one at most this often


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


def cell_text(value: Any) -> str:
    """A table cell as plain text: None empty, lists and tuples joined by ", ", objects as
    ``key=value`` pairs (nested the same way), anything else ``str``."""
    if value is None:
        return ""
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell_text(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(f"({cell_text(v)})" if isinstance(v, (dict, list, tuple)) else cell_text(v) for v in value)
    return str(value)


def plain_table(title: str, columns: list[str], rows: list[list[str]], header: bool = True) -> str:
    """A table as plain text sized to its content: the title, the header and a rule, then one line
    per row; columns two spaces apart, no trailing blanks."""
    lines = ([columns, ["-" * len(c) for c in columns]] if header else []) + rows
    widths = [max(len(r[i]) for r in lines) for i in range(len(columns))] if lines else []
    out = [title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in lines]
    return "\n".join(out) + "\n"


def print_table(title: str, columns: list[str], rows: list[Any], header: bool = True,
                console: Console | None = None) -> None:
    """A table on stdout, cells as plain text (:func:`cell_text`; square brackets are printed, not
    read as markup): boxed to the terminal's width on a terminal, else :func:`plain_table`. On a
    terminal no word of a cell is split (65536 folded into 655 / 36 before): text wraps at spaces,
    and columns that do not fit side by side go into further tables below, each repeating the
    first column (:func:`column_groups`)."""
    cells = [[cell_text(v) for v in r] for r in rows]
    if console is None and not sys.stdout.isatty():
        sys.stdout.write(plain_table(title, columns, cells, header))
        return
    console = console or Console(file=sys.stdout, highlight=False, markup=False, emoji=False)
    words = [max([len(w) for text in (c, *(r[i] for r in cells)) for w in text.split()] + [1])
             for i, c in enumerate(columns)]
    groups = column_groups(words, console.width)
    for g, group in enumerate(groups):
        t = Table(title=title if g == 0 else f"{title} (continued)", show_header=header)
        for i in group:
            t.add_column(columns[i], overflow="fold", min_width=min(words[i], console.width - 4))
        for r in cells:
            t.add_row(*(r[i] for i in group))
        console.print(t)


def column_groups(widths: list[int], available: int) -> list[list[int]]:
    """Columns of these smallest widths (their longest words) in groups whose boxed tables fit
    ``available`` characters (3 per column for the padding and the rule, 1 for the last rule): the
    first column in every group, the others in order, each group as many as fit (at least one)."""
    groups: list[list[int]] = []
    for i in range(1, len(widths)) if len(widths) > 1 else []:
        if groups and sum(widths[j] + 3 for j in groups[-1]) + widths[i] + 3 + 1 <= available:
            groups[-1].append(i)
        else:
            groups.append([0, i])
    return groups or [[0]]


class _WithTotal(ProgressColumn):
    """A column shown only for tasks whose total is known (a bar, a count, an ETA); a step without
    one shows its spinner, name and elapsed time alone."""

    def __init__(self, column: ProgressColumn):
        super().__init__()
        self.column = column

    def render(self, task: Task) -> RenderableType:
        return self.column.render(task) if task.total is not None else Text("")


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
            cols = (SpinnerColumn(), TextColumn("{task.description}"), _WithTotal(BarColumn()),
                    _WithTotal(MofNCompleteColumn()), TimeElapsedColumn(), _WithTotal(TextColumn("ETA")),
                    _WithTotal(TimeRemainingColumn()))
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

    def note(self, text: str) -> None:
        """One line that stays (above the live display on a terminal), unless ``lines`` is False."""
        if not self.lines:
            return
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            typer.echo(text, err=True)

    def bar(self, total: int | None, what: str) -> Callable[[float], None] | None:
        """A counter for the current step: ``advance(k)`` after k more of ``total`` ``what`` (k may
        be a fraction). Without a terminal: a line every :data:`LINE_SECONDS` (none without ``lines``)."""
        if self._live is None:
            if not self.lines or not total:
                return None
            name, t0 = self._step if self._step else ("", time.perf_counter())
            state = {"done": 0.0, "last": time.perf_counter()}

            def line(k: float) -> None:
                state["done"] += k
                now = time.perf_counter()
                if now - state["last"] >= LINE_SECONDS and state["done"] < total:
                    state["last"] = now
                    eta = (now - t0) * (total - state["done"]) / state["done"] if state["done"] else 0.0
                    typer.echo(f"{name}: {state['done']:.4g}/{total} {what}, {now - t0:.0f} s, ETA {eta:.0f} s", err=True)
            return line
        if self._task is not None:
            self._live.remove_task(self._task)
        desc = f"{self._step[0] if self._step else ''} ({what})"
        task = self._task = self._live.add_task(desc, total=total)
        live = self._live
        return lambda k: live.advance(task, k)
