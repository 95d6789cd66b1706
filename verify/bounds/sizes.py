"""Size tables and figures: what exactformer builds against the papers' lower bounds (docs/sizes.md).

A *size row* is what one built model costs: layers, heads, d_model, d_head, width, precision bits,
stored parameters and total size in bits (:class:`SizeRow`). Rows come from a *size provider*
``provider(spec, n) -> SizeRow`` (raising :class:`SizeUnavailable` where it has no answer). The
provider in use is the module variable :data:`SIZE_PROVIDER`: :func:`formula_size_row` runs the
builder shapes-only (no weights assembled, N up to each spec's ``max_n``), checked against real
builds (:func:`built_size_row`) for N <= 2^20; everything here (tables, CSV, JSON, plots) reads it
at call time unless given another provider. :func:`report` with it wrote the committed size data
(:data:`COMMITTED_DATA`, docs/figures/sizes.json), which :class:`CommittedSizes` serves back: the
``sizes`` command reads the committed data and computes only the rows it lacks (``--recompute``:
every row).

Each row is set beside the lower bounds of its task (:mod:`exactformer.verify.bounds.lower_bounds`),
evaluated at the built model's own precision p ("the same precision"), or, for rows not built, at
the paper's App. B.2 precision with Kc = 1 (``p_source = "reference"``).

Figures (``exactformer sizes --figures DIR``): one log-log plot per task family (built width x
heads and size in bits against the bounds at the App. B.2 precision), and attention patterns of
small built models, each with the CSV of the numbers it draws.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import os
import re
import textwrap
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from exactformer.constructions.core import registry
from exactformer.constructions.core.registry import BUILD_MAX_N, Claim
from exactformer.constructions.core.builder import shapes_only
from exactformer.precision import Format, parse_format
from exactformer.verify.bounds import lower_bounds as lb

SCHEMA = "exactformer-sizes/1"
N_MIN, N_MAX = 2, 1 << 30


class SizesError(ValueError):
    """Bad arguments: the message reads ``<parameter>: <allowed values>``."""


class SizeUnavailable(Exception):
    """A provider has no size for this (spec, N); the message says why."""


# ------------------------------------------------------------------------------------------------
# what is sized
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SizeSpec:
    """A row source: construction ``construction`` built with ``kwargs`` (name/value pairs), in task
    family ``family``, compared with ``bounds`` (keys of lower_bounds.BOUNDS; default the family's)
    and with the paper's claim ``claim``. Made from the constructions' registrations
    (:class:`~exactformer.constructions.core.registry.SizeRows`)."""

    name: str
    construction: str
    family: str
    kwargs: tuple[tuple[str, Any], ...] = ()
    bounds: tuple[str, ...] | None = None
    claim: Claim | None = None
    build_max_n: int = BUILD_MAX_N
    max_n: int = BUILD_MAX_N
    note: str = ""

    @property
    def builder_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def bound_keys(self) -> tuple[str, ...]:
        return self.bounds if self.bounds is not None else lb.FAMILIES[self.family].bounds


def _registered_specs() -> tuple[dict[str, SizeSpec], dict[str, str]]:
    """Every registered construction's size rows, and why a family has no rows on this page: the
    constructions' own reasons, and the families no construction builds (Dyck: bounds only)."""
    specs: dict[str, SizeSpec] = {}
    not_built = {"dyck": "exactformer builds no Dyck model: the family is here for its lower bounds (P1 Thm 5) "
                         "beside the constant-size DFA, and the figure above shows bounds only."}
    for name in registry.names():
        c = registry.get(name)
        for r in c.sizes:
            spec_name = r.name or name
            specs[spec_name] = SizeSpec(spec_name, name, r.family, r.kwargs, r.bounds, r.claim or c.claim,
                                        r.build_max_n, r.max_n, r.note)
        if c.no_sizes is not None:
            not_built[c.no_sizes.family] = c.no_sizes.reason
    return specs, not_built


SIZE_SPECS, NOT_BUILT = _registered_specs()


def spec(name: str) -> SizeSpec:
    if name not in SIZE_SPECS:
        raise SizesError(f"--construction: one of {', '.join(SIZE_SPECS)}, got {name!r}")
    return SIZE_SPECS[name]


# ------------------------------------------------------------------------------------------------
# size rows and providers
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SizeRow:
    """The size of one built model. ``parameters`` counts stored numbers (position-code rows are
    generated, not stored: CompiledModel.parameter_count); ``size_bits = parameters x
    precision_bits``; ``heads`` is the most heads of any layer; ``width = max(d_model, d_head)``
    (P1 Sec. 2). ``source``: "build" or "formula"."""

    spec: str
    n: int
    layers: int
    heads: int
    d_model: int
    d_head: int
    d_mlp: int
    width: int
    precision: str
    precision_bits: int
    parameters: int
    size_bits: int
    source: str

    def to_json(self) -> dict:
        return asdict(self)


SizeProvider = Callable[[SizeSpec, int], SizeRow]


def size_row_from_summary(spec_name: str, summary: dict[str, Any], source: str) -> SizeRow:
    """A SizeRow from ``CompiledModel.summary()`` (or any dict with the same keys)."""
    bits = int(summary["params"]["precision_bits"]["value"])
    return SizeRow(spec_name, int(summary["n"]), int(summary["layers"]), int(summary["heads"]),
                   int(summary["d_model"]), int(summary["d_head"]), int(summary["d_mlp"]), int(summary["width"]),
                   str(summary["precision"]), bits, int(summary["parameters"]), int(summary["parameters"]) * bits,
                   source)


@functools.lru_cache(maxsize=1024)
def _summary(construction: str, kwargs: tuple[tuple[str, Any], ...], n: int, shapes: bool) -> dict[str, Any]:
    with shapes_only() if shapes else contextlib.nullcontext():
        return registry.get(construction).builder(n, **dict(kwargs)).summary()


def _size_row(spec: SizeSpec, n: int, shapes: bool) -> SizeRow:
    limit, source, verb = (spec.max_n, "formula", "computed") if shapes else (spec.build_max_n, "build", "built")
    if n > limit:
        raise SizeUnavailable(f"not {verb}: N > 2^{limit.bit_length() - 1} for {spec.name}")
    try:
        summary = _summary(spec.construction, spec.kwargs, n, shapes)
    except ValueError as e:  # the builder's own range check or search (e.g. no format up to 48 bits)
        raise SizeUnavailable(f"not built: {e}") from None
    return size_row_from_summary(spec.name, summary, source)


def built_size_row(spec: SizeSpec, n: int) -> SizeRow:
    """Build ``spec`` at N = n and read its size (N <= spec.build_max_n)."""
    return _size_row(spec, n, shapes=False)


def formula_size_row(spec: SizeSpec, n: int) -> SizeRow:
    """The size of ``spec`` at N = n from its builder run shapes-only (:func:`shapes_only`: the same
    design searches, layout and block placements, no weight tensor or embedding table assembled;
    the parameter count is :class:`ModelShape`'s formula), N <= spec.max_n."""
    return _size_row(spec, n, shapes=True)


#: The provider every table, plot and the ``sizes`` command use: the shapes-only path, checked
#: against :func:`built_size_row` (real builds) by :func:`compare_providers` for N <= 2^20
#: (``benchmarks/check_size_formulas.py``; tests/test_sizes.py for small N).
SIZE_PROVIDER: SizeProvider = formula_size_row


def _provider(provider: SizeProvider | None) -> SizeProvider:
    return provider if provider is not None else SIZE_PROVIDER


# ------------------------------------------------------------------------------------------------
# the committed size data (docs/figures/sizes.json)
# ------------------------------------------------------------------------------------------------

#: The committed report: every spec at N = 2^4 .. 2^30, written by :func:`generate_figures` (the
#: command in docs/sizes.md) from :func:`report` with :data:`SIZE_PROVIDER`. A source checkout has
#: it (``pip install -e .``); an installed wheel does not, and then every row is computed.
COMMITTED_DATA = Path(__file__).resolve().parents[2] / "docs" / "figures" / "sizes.json"


@dataclass
class CommittedSizes:
    """A size provider that answers from a committed report (``rows``: (spec, N) -> its row) and
    computes with ``fallback`` (default :data:`SIZE_PROVIDER`, read at call time) every (spec, N)
    the report does not hold, and every row of a spec whose definition (construction, kwargs,
    family, bounds, claim, note) differs from the committed one."""

    source: Path
    specs: dict[str, dict[str, Any]]
    rows: dict[tuple[str, int], dict[str, Any]]
    fallback: SizeProvider | None = None

    def holds(self, spec: SizeSpec, n: int) -> bool:
        """Whether the committed report answers (spec, N) (else it is computed)."""
        return (spec.name, n) in self.rows and self.specs.get(spec.name) == spec_json(spec)

    def __call__(self, spec: SizeSpec, n: int) -> SizeRow:
        if not self.holds(spec, n):
            return _provider(self.fallback)(spec, n)
        row = self.rows[(spec.name, n)]
        if row["built"] is None:
            raise SizeUnavailable(row["not_built"])
        return SizeRow(**row["built"])


def committed_sizes(path: Path | None = None, fallback: SizeProvider | None = None) -> CommittedSizes | None:
    """The committed report at ``path`` (default :data:`COMMITTED_DATA`) as a provider, or None
    when there is no such file; SizesError when it is not a sizes report of this schema."""
    path = path if path is not None else COMMITTED_DATA
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SizesError(f"committed size data: a readable JSON report of schema {SCHEMA}, got {path} ({e})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SizesError(f"committed size data: a report of schema {SCHEMA}, got {path} (regenerate it: docs/sizes.md)")
    return CommittedSizes(path, doc["specs"], {(r["spec"], r["n"]): r for r in doc["rows"]}, fallback)


def compare_providers(a: SizeProvider, b: SizeProvider, specs: Iterable[SizeSpec], ns: Iterable[int]) -> list[str]:
    """Every (spec, N) where providers ``a`` and ``b`` disagree (fields other than ``source``, or
    one answers and the other does not), as readable lines; [] when they agree everywhere."""
    out = []
    for s in specs:
        for n in ns:
            rows = []
            for p in (a, b):
                try:
                    rows.append(p(s, n).to_json() | {"source": None})
                except SizeUnavailable as e:
                    rows.append(f"unavailable ({e})")
            if rows[0] != rows[1]:
                out.append(f"{s.name} N={n}: {rows[0]} != {rows[1]}")
    return out


# ------------------------------------------------------------------------------------------------
# N ranges
# ------------------------------------------------------------------------------------------------


def parse_n(text: str | int, param: str) -> int:
    """An integer or ``2^k`` in [2, 2^30]; SizesError names ``param`` otherwise."""
    allowed = f"{param}: an integer or 2^k in [2, 2^30]"
    s = str(text).strip()
    m = re.fullmatch(r"2\^(\d{1,3})", s)
    if m:
        v = 1 << int(m.group(1))
    elif re.fullmatch(r"\d{1,12}", s):
        v = int(s)
    else:
        raise SizesError(f"{allowed}, got {s!r}")
    if not N_MIN <= v <= N_MAX:
        raise SizesError(f"{allowed}, got {s}")
    return v


def n_values(n_min: int, n_max: int, step: int = 1) -> list[int]:
    """n_min, n_min 2^step, n_min 2^(2 step), ... up to n_max."""
    if n_min > n_max:
        raise SizesError(f"--n-min/--n-max: n-min <= n-max, got {n_min} > {n_max}")
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= 30:
        raise SizesError(f"--step: an integer in [1, 30] (log2 step between rows), got {step!r}")
    out, n = [], n_min
    while n <= n_max:
        out.append(n)
        n <<= step
    return out


def fmt_n(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


# ------------------------------------------------------------------------------------------------
# the report (the JSON document; tables and CSV are views of it)
# ------------------------------------------------------------------------------------------------


def reference_p(n: int) -> int:
    return lb.paper_precision_bits(n, 1)


def bound_values(keys: Iterable[str], n: int, p: int) -> dict[str, dict[str, int | None]]:
    out = {}
    for k in keys:
        units, bits = lb.evaluate(lb.BOUNDS[k], n, p)
        out[k] = {"units": units, "bits": bits}
    return out


def report(specs: Iterable[SizeSpec], ns: list[int], provider: SizeProvider | None = None,
           progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """The sizes document (schema in docs/sizes.md): one row per (spec, N)."""
    provider = _provider(provider)
    specs = list(specs)
    rows = []
    for s in specs:
        for n in ns:
            try:
                built, reason = provider(s, n), None
            except SizeUnavailable as e:
                built, reason = None, str(e)
            p = built.precision_bits if built else reference_p(n)
            rows.append({"spec": s.name, "construction": s.construction, "family": s.family, "n": n,
                         "built": built.to_json() if built else None, "not_built": reason,
                         "p": p, "p_source": "built" if built else "reference",
                         "bounds": bound_values(s.bound_keys, n, p)})
            if progress:
                progress()
    keys = sorted({k for s in specs for k in s.bound_keys})
    return {
        "schema": SCHEMA,
        "n": ns,
        "reference_precision": "P1 App. B.2 with Kc = 1: p = ceil(log2(2 N^2 + 1)) bits (used where a row is not built)",
        "specs": {s.name: spec_json(s) for s in specs},
        "bounds": {k: lb.BOUNDS[k].describe() for k in keys},
        "rows": rows,
    }


def spec_json(s: SizeSpec) -> dict[str, Any]:
    """The definition of a spec as the report records it (``specs`` of the JSON schema)."""
    return {"construction": s.construction, "family": s.family, "kwargs": s.builder_kwargs,
            "bounds": list(s.bound_keys), "claim": _claim(s), "note": s.note}


def _claim(s: SizeSpec) -> dict | None:
    return s.claim.to_json() if s.claim else None


BUILT_FIELDS = ("layers", "heads", "d_model", "d_head", "d_mlp", "width", "precision", "precision_bits",
                "parameters", "size_bits", "source")


def report_csv(doc: dict[str, Any]) -> str:
    """One CSV line per row: the built fields, p and its source, then ``<bound>`` (units) and
    ``<bound>_bits`` for every bound of the report (empty where it does not apply)."""
    keys = list(doc["bounds"])
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["spec", "family", "n", *BUILT_FIELDS, "not_built", "p", "p_source",
                *[c for k in keys for c in (k, k + "_bits")]])
    for r in doc["rows"]:
        b = r["built"] or {}
        vals = [r["bounds"].get(k, {}) for k in keys]
        w.writerow([r["spec"], r["family"], r["n"], *[_blank(b.get(f)) for f in BUILT_FIELDS], _blank(r["not_built"]),
                    r["p"], r["p_source"], *[_blank(v.get(c)) for v in vals for c in ("units", "bits")]])
    return buf.getvalue()


def _blank(v: Any) -> Any:
    return "" if v is None else v


# ------------------------------------------------------------------------------------------------
# Markdown tables (docs/sizes.md) and the text view of the CLI
# ------------------------------------------------------------------------------------------------


def _explicit(keys: Iterable[str]) -> list[str]:
    return [k for k in keys if lb.BOUNDS[k].explicit]


def _bound_header(k: str) -> str:
    b = lb.BOUNDS[k]
    unit = {lb.UNITS_M: "m", lb.UNITS_MH: "mH", lb.UNITS_WIDTH: "width", lb.UNITS_STATE_BITS: "state bits"}[b.unit]
    return f"{b.model} {unit} {'≥' if b.kind == 'lower' else '='} ({b.short})"


def spec_table(doc: dict[str, Any], spec_name: str, ns: Iterable[int] | None = None,
               built_only: bool = False) -> tuple[list[str], list[list[str]]]:
    """Header and cells of one construction's table: built sizes, then each explicit bound at the
    row's p (a p marked * is the reference precision: the row is not built; ``built_only`` leaves
    such rows out)."""
    keys = _explicit(doc["specs"][spec_name]["bounds"])
    head = ["N", "layers", "heads", "d_model", "width", "p (bits)", "parameters", "size (bits)"]
    head += [_bound_header(k) for k in keys]
    rows = [r for r in doc["rows"] if r["spec"] == spec_name and (ns is None or r["n"] in ns)
            and (r["built"] or not built_only)]
    cells = []
    for r in rows:
        b = r["built"]
        built = [str(b[f]) for f in ("layers", "heads", "d_model", "width")] if b else ["—"] * 4
        p = f"{r['p']}" if b else f"{r['p']}*"
        tail = [str(b["parameters"]), str(b["size_bits"])] if b else ["—", "—"]
        cells.append([fmt_n(r["n"]), *built, p, *tail, *[_cell(r["bounds"][k]["units"]) for k in keys]])
    return head, cells


def _cell(v: int | None) -> str:
    return "—" if v is None else str(v)


def markdown(head: list[str], cells: list[list[str]]) -> str:
    def row(values: list[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    return "\n".join([row(head), "|" + "---|" * len(head)] + [row(c) for c in cells])


def separation_lines(doc: dict[str, Any], spec_name: str) -> list[str]:
    """For each lower bound of the spec: from which built N on the built model's width x heads
    (and its size in bits) stays below the bound at the same p, as sentences."""
    rows = [r for r in doc["rows"] if r["spec"] == spec_name and r["built"]]
    out = []
    for k in _explicit(doc["specs"][spec_name]["bounds"]):
        b = lb.BOUNDS[k]
        if b.kind != "lower" or not rows:
            continue
        for what, mine, theirs in (("width x heads", lambda r: r["built"]["width"] * r["built"]["heads"], "units"),
                                   ("size in bits", lambda r: r["built"]["size_bits"], "bits")):
            below = [r["bounds"][k][theirs] is not None and mine(r) < r["bounds"][k][theirs] for r in rows]
            since = next((i for i in range(len(rows)) if all(below[i:])), None)
            where = (f"from N = {fmt_n(rows[since]['n'])} on" if since is not None else "at no built N")
            out.append(f"built {what} < {b.model} bound ({b.short}, same p): {where} "
                       f"(built up to N = {fmt_n(rows[-1]['n'])})")
    return out


# ------------------------------------------------------------------------------------------------
# family figures: built sizes against the bounds at the reference precision
# ------------------------------------------------------------------------------------------------


@dataclass
class Series:
    """One plotted line: ``points`` are (N, value, p) with p the precision the value assumes. Its
    label is ``name + detail`` ("equality" + " (built): width x heads")."""

    name: str
    detail: str
    kind: str  # "built", "lower", "upper", "alternative"
    quantity: str  # "units" (width x heads, hidden units, width) or "bits"
    points: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.name + self.detail


def family_series(family: str, ns: list[int], provider: SizeProvider | None = None,
                  specs: Iterable[SizeSpec] | None = None) -> list[Series]:
    """The lines of one family's figure: every spec of the family (built width x heads and size in
    bits, N <= its provider's range) and every explicit bound of the family at the reference p."""
    provider = _provider(provider)
    specs = [s for s in (specs if specs is not None else SIZE_SPECS.values()) if s.family == family]
    out: list[Series] = []
    for s in specs:
        units = Series(s.name, " (built): width x heads", "built", "units")
        bits = Series(s.name, " (built): size", "built", "bits")
        for n in ns:
            try:
                r = provider(s, n)
            except SizeUnavailable:
                continue
            units.points.append((n, r.width * r.heads, r.precision_bits))
            bits.points.append((n, r.size_bits, r.precision_bits))
        out += [x for x in (units, bits) if x.points]
    keys = [k for k in lb.FAMILIES[family].bounds if lb.BOUNDS[k].explicit]
    for k in keys:
        b = lb.BOUNDS[k]
        name = f"{b.model} ({b.short}): {b.formula}"
        units = Series(name, "", b.kind, "units")
        bits = Series(name, "; bits", b.kind, "bits")
        for n in ns:
            p = reference_p(n)
            u, bb = lb.evaluate(b, n, p)
            if u is not None:
                units.points.append((n, u, p))
            if bb is not None:
                bits.points.append((n, bb, p))
        out += [x for x in (units, bits) if x.points]
    return out


def series_csv(series: list[Series]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["series", "kind", "quantity", "n", "value", "p"])
    for s in series:
        for n, v, p in s.points:
            w.writerow([s.label, s.kind, s.quantity, n, v, p])
    return buf.getvalue()


_STYLE = {"built": dict(ls="-", ms=3), "lower": dict(ls="--"), "upper": dict(ls=":"), "alternative": dict(ls="-.")}
_BUILT_MARKERS = "osD^v<>"
REFERENCE_NOTE = ("lower bounds at P1 App. B.2 precision with Kc = 1 (p = 2 log2 N + 2 bits); "
                  "built models at their own precision")
BOUNDS_ONLY = "bounds only: no stored-weight model of this family is built (docs/sizes.md says why)"
NO_BOUND = "no lower bound: neither paper states one for this family"


def merged_series(series: list[Series]) -> list[Series]:
    """The lines to draw: series with equal kind, quantity and points are drawn once, labelled with
    every name ("equality = inequality (built): width x heads", "RNN (Thm 3): m >= ceil(N/p) =
    RNN (Prop. 9): m >= ceil(N/p), N pairs"), so that no line hides under an identical one."""
    out: dict[tuple, Series] = {}
    for s in series:
        key = (s.kind, s.quantity, tuple(s.points))
        if key not in out:
            out[key] = s
            continue
        o = out[key]
        out[key] = (Series(f"{o.name} = {s.name}", s.detail, s.kind, s.quantity, s.points) if o.detail == s.detail
                    else Series(f"{o.label} = {s.label}", "", s.kind, s.quantity, s.points))
    return list(out.values())


def _matplotlib_figure(**kw):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SizesError("--plot/--figures: matplotlib is needed to draw figures (pip install matplotlib)") from None
    return Figure(**kw)


def plot_families(families: list[tuple[str, list[Series]]], path: Path):
    """One row of two log-log panels per family (units, bits) into ``path`` (.png or .svg); returns
    the figure. Identical lines are drawn once (:func:`merged_series`), built models with markers,
    legends below the panels (never over the data); a family without built rows says "bounds
    only", one without bounds says so, and the figure's title speaks of lower bounds only when
    some are drawn."""
    fig = _matplotlib_figure(figsize=(12, 7 * len(families)), layout="constrained")
    axes = np.atleast_2d(fig.subplots(len(families), 2, squeeze=False))
    any_bound = False
    for row, (family, series) in zip(axes, families):
        fam = lb.FAMILIES[family]
        lines = merged_series(series)
        built = any(s.kind == "built" for s in lines)
        bound = any(s.kind != "built" for s in lines)
        any_bound |= bound
        notes = [n for n in (fam.scope, "" if built else BOUNDS_ONLY, "" if bound else NO_BOUND) if n]
        scope = "".join(f"\n({n})" for n in notes)
        for ax, qty, ylabel in ((row[0], "units", "width x heads / hidden units"), (row[1], "bits", "bits")):
            markers = iter(_BUILT_MARKERS)
            for s in lines:
                if s.quantity != qty:
                    continue
                xs, ys = [p[0] for p in s.points], [max(p[1], 1) for p in s.points]
                marker = {"marker": next(markers)} if s.kind == "built" else {}
                ax.plot(xs, ys, label=textwrap.fill(s.label, 72, subsequent_indent="  "), **_STYLE[s.kind], **marker)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=10)
            ax.set_xlabel("N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{fam.title}: {ylabel}{scope}", fontsize=9)
            ax.grid(True, which="major", alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.12), borderaxespad=0.0, frameon=False)
    fig.suptitle(REFERENCE_NOTE if any_bound else "built models at their own precision", fontsize=9)
    _save(fig, path)
    return fig


def _save(fig, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise SizesError(f"--plot: a file name ending in .png or .svg, got {path.name!r}")
    meta = {"Software": None} if suffix == ".png" else {"Date": None}
    fig.savefig(path, dpi=90, metadata=meta)


# ------------------------------------------------------------------------------------------------
# attention patterns of small built models
# ------------------------------------------------------------------------------------------------


def exact_attention(model, tokens: np.ndarray, fmt: Format | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """The rounded softmax weights of every layer, raw values ``[B, H, T, T]``, and the
    last-position logits (raw ``[B, d_vocab_out]``), from the plain forward pass
    (:func:`exactformer.verify.executor.forward.forward_with_cache`, whose logits the tests check equal
    the executor's)."""
    from exactformer.verify.executor.forward import forward_with_cache

    fmt = fmt if fmt is not None else parse_format(model.precision)
    logits, cache = forward_with_cache(model, np.asarray(tokens, dtype=np.int64), fmt)
    weights = [cache.raw[f"blocks.{l}.attn.hook_pattern"] for l in range(model.n_layers)]
    return weights, logits[:, -1, :]


def float_attention(model, tokens: np.ndarray) -> list[np.ndarray]:
    """Softmax weights of every layer, ``[B, H, T, T]`` float64, of the float export
    ``model.to_torch()`` (read by a ``TorchFunctionMode`` that records each softmax call of one
    forward pass; the module itself is unchanged)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from exactformer.constructions.export import to_torch

    class Recorder(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.weights: list[np.ndarray] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if getattr(func, "__name__", "") == "softmax":
                self.weights.append(out.detach().cpu().numpy())
            return out

    module = to_torch(model)
    rec = Recorder()
    with torch.no_grad(), rec:
        module(torch.as_tensor(np.asarray(tokens), dtype=torch.long))
    if len(rec.weights) != model.n_layers:
        raise RuntimeError(f"recorded {len(rec.weights)} softmax calls for {model.n_layers} layers")
    return rec.weights


@dataclass(frozen=True)
class AttentionPicture:
    """A small built model and the input it is shown on."""

    name: str
    construction: str
    n: int
    kwargs: tuple[tuple[str, Any], ...]
    title: str


ATTENTION_PICTURES = (
    AttentionPicture("attention-index-lookup-n16", "index-lookup", 16, (("alphabet", 64),),
                     "Index Lookup, N = 16: the index token p attends to position p"),
    AttentionPicture("attention-equality-n8", "equality", 8, (),
                     "Equality, N = 8: layer 1 fetches x_(i-N/2) (and x_i for i <= N/2); layer 2 averages"),
    AttentionPicture("attention-disjointness-n8", "disjointness", 8, (),
                     "Disjointness, N = 8: head h of layer 1 fetches x_(I_i[h]) (BOS for no index); layer 2 averages"),
)


@dataclass
class Panel:
    title: str
    exact: list[list[Fraction]]  # the rounded weights under the model's format
    float64: np.ndarray  # the float export's weights
    rows: list[str]
    cols: list[str]


def picture_panels(pic: AttentionPicture) -> tuple[str, list[Panel], bool]:
    """The model's format name, the panels of ``pic`` (for Index Lookup the index token's row on one
    input per p = 1..N; otherwise every layer and head on one fixed input) and whether the build is
    certified in float64 (``params["arithmetics"]``)."""
    model = registry.get(pic.construction).builder(pic.n, **dict(pic.kwargs))
    task = registry.task_of(model)
    fmt = parse_format(model.precision)
    n = pic.n
    if pic.construction == "index-lookup":
        symbols = np.random.default_rng(0).integers(0, len(model.answers), size=n).tolist()
        tokens = task.encode_batch(model, [(symbols, p) for p in range(1, n + 1)])
        sel = [(0, 0, "layer 1: the index token's row, one input per p")]
        rows, cols = [f"p={p}" for p in range(1, n + 1)], [f"s{i}" for i in range(1, n + 1)] + ["p"]
        pick = lambda w: w[:, 0, -1, :]  # noqa: E731
    else:
        x = [1, -1, 1, 1, 1, -1, -1, 1] if pic.construction == "equality" else [1, 0, 1, 1, 0, 1, 1, 0]
        tokens = task.encode_batch(model, [x[:n]])
        sel = [(l, h, f"layer {l + 1}, head {h + 1}") for l, b in enumerate(model.blocks) for h in range(b.attn.n_heads)]
        rows = cols = ([] if pic.construction == "equality" else ["BOS"]) + [str(i) for i in range(1, n + 1)]
        pick = None
    exact, _ = exact_attention(model, tokens, fmt)
    flt = float_attention(model, tokens)
    panels = []
    for l, h, title in sel:
        e = np.asarray(fmt.to_fraction(pick(exact[l]) if pick else exact[l][0, h]), dtype=object)
        f = pick(flt[l]) if pick else flt[l][0, h]
        panels.append(Panel(title, e.tolist(), f, rows, cols))
    return fmt.name, panels, "float64" in model.params["arithmetics"].value


def picture_csv(panels: list[Panel]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["panel", "row", "column", "exact", "float64"])
    for p in panels:
        for i, r in enumerate(p.rows):
            for j, c in enumerate(p.cols):
                w.writerow([p.title, r, c, str(p.exact[i][j]), f"{p.float64[i, j]:.6f}"])
    return buf.getvalue()


def float_target_weight(p: Panel) -> float | None:
    """The smallest float64 weight on the target over the rows whose exact weights are one-hot
    (None when no row is): what the real softmax leaves where the format's is exactly 1."""
    exact = np.array([[float(v) for v in r] for r in p.exact])
    rows = [i for i, r in enumerate(exact) if r.max() == 1.0 and np.count_nonzero(r) == 1]
    return min(float(p.float64[i, int(np.argmax(exact[i]))]) for i in rows) if rows else None


def plot_picture(pic: AttentionPicture, fmt_name: str, panels: list[Panel], path: Path, float64_certified: bool):
    """Two rows of heat maps: the exact rounded weights, then the float export's; returns the figure.
    A float panel over one-hot exact rows names the float weight left on the target, and the title
    says why the two differ: the format floors every off-target weight to 0, the real softmax does
    not (the float model answers right where it is certified in float64)."""
    k = len(panels)
    width = max(3.4 * k + 1.2, 6.0)
    fig = _matplotlib_figure(figsize=(width, 7.4), layout="constrained")
    axes = fig.subplots(2, k, squeeze=False)
    for row in range(2):
        for ax, p in zip(axes[row], panels):
            a = np.array([[float(v) for v in r] for r in p.exact]) if row == 0 else p.float64
            target = float_target_weight(p)
            which = (f"exact, {fmt_name}" if row == 0 else "float64 export, real softmax"
                     + (f": target weight {target:.3f}" if target is not None else ""))
            im = ax.imshow(a, vmin=0.0, vmax=1.0, cmap="Blues")
            ax.set_title(f"{p.title}\n({which})", fontsize=8)
            ax.set_xticks(range(len(p.cols)), p.cols, fontsize=6, rotation=90)
            ax.set_yticks(range(len(p.rows)), p.rows, fontsize=6)
            ax.set_xlabel("key position", fontsize=7)
            ax.set_ylabel("query", fontsize=7)
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="attention weight")
    why = ("top: the model's fixed-point softmax, which rounds every off-target weight down to 0; bottom: the "
           "float64 export, the real softmax with the same weights, which leaves some weight off target ("
           + ("certified in float64 too: it answers right" if float64_certified else "not certified in float64")
           + "; docs/sizes.md, Attention patterns)")
    fig.suptitle(pic.title + "\n" + textwrap.fill(why, int(width * 13)), fontsize=8)
    _save(fig, path)
    return fig


# ------------------------------------------------------------------------------------------------
# the one command that regenerates docs/figures (and the tables in docs/sizes.md)
# ------------------------------------------------------------------------------------------------


def figure_families(spec_families: Iterable[str]) -> list[str]:
    """Families with something to plot: one of ``spec_families`` (the families of the specs
    sized) or a family with an explicit bound."""
    fams = set(spec_families)
    return [f for f, fam in lb.FAMILIES.items()
            if f in fams or any(lb.BOUNDS[k].explicit for k in fam.bounds)]


def generate_figures(out_dir: Path, ns: list[int], provider: SizeProvider | None = None,
                     specs: Iterable[SizeSpec] | None = None, doc_path: Path | None = None,
                     progress: Callable[[], None] | None = None) -> list[Path]:
    """Write into ``out_dir``: sizes.json (the report), sizes-<family>.png/.csv per family and
    attention-*.png/.csv; with ``doc_path``, rewrite its generated blocks. Returns the paths."""
    specs = list(specs if specs is not None else SIZE_SPECS.values())
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    doc = report(specs, ns, provider, progress)
    written.append(_write(out_dir / "sizes.json", _json_text(doc)))
    for fam in figure_families(s.family for s in specs):
        series = family_series(fam, ns, provider, specs)
        written.append(_write(out_dir / f"sizes-{fam}.csv", series_csv(series)))
        plot_families([(fam, series)], out_dir / f"sizes-{fam}.png")
        written.append(out_dir / f"sizes-{fam}.png")
    for pic in ATTENTION_PICTURES:
        fmt_name, panels, float64_certified = picture_panels(pic)
        written.append(_write(out_dir / f"{pic.name}.csv", picture_csv(panels)))
        plot_picture(pic, fmt_name, panels, out_dir / f"{pic.name}.png", float64_certified)
        written.append(out_dir / f"{pic.name}.png")
    if doc_path is not None:
        rel = Path(os.path.relpath(out_dir.resolve(), doc_path.resolve().parent)).as_posix()
        written.append(_write(doc_path, update_doc(doc_path.read_text(), doc, rel)))
    return written


def _json_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ---- generated blocks of docs/sizes.md ----------------------------------------------------------

_BLOCK = re.compile(r"(<!-- BEGIN GENERATED (?P<name>[\w:-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED (?P=name) -->)", re.S)


def doc_blocks(doc: dict[str, Any], fig_dir: str) -> dict[str, str]:
    """The generated Markdown of docs/sizes.md by block name, from a report (pure: no builds)."""
    even = [n for n in doc["n"] if (n.bit_length() - 1) % 2 == 0]
    blocks = {"bounds": _bounds_block(), "bound-values": _bound_values_block(even)}
    with_figure = figure_families(d["family"] for d in doc["specs"].values())
    for fam in lb.FAMILIES:
        parts = []
        names = [s for s, d in doc["specs"].items() if d["family"] == fam]
        if fam in with_figure:
            parts.append(f"![{lb.FAMILIES[fam].title}]({fig_dir}/sizes-{fam}.png)\n"
                         f"(data: [`sizes-{fam}.csv`]({fig_dir}/sizes-{fam}.csv))")
        if not names:
            parts.append(NOT_BUILT.get(fam, "No construction of this family is built yet: its rows appear here once "
                                            "a `SizeSpec` for it is added to `verify/bounds/sizes.py`."))
        for name in names:
            d = doc["specs"][name]
            c = d["claim"]
            kw = ", ".join(f"{k}={v}" for k, v in d["kwargs"].items()) or "defaults"
            claim = (f"Paper ({c['source']}): layers {c['layers']}; heads {c['heads']}; width {c['width']}; "
                     f"precision {c['precision']}; size {c['size']}." if c else "No paper claim recorded.")
            parts.append(f"**{name}** (`{d['construction']}`, {kw}{'; ' + d['note'] if d['note'] else ''}). {claim}")
            parts.append(markdown(*spec_table(doc, name, even, built_only=True)))
            sep = separation_lines(doc, name)
            if sep:
                parts.append("\n".join(f"- {s}" for s in sep))
        blocks[f"family:{fam}"] = "\n\n".join(parts)
    return blocks


def _bounds_block() -> str:
    head = ["key", "model", "kind", "source", "statement (paper)", "formula evaluated (ceil)", "unit", "precision",
            "note"]
    cells = [[f"`{b.key}`", b.model, b.kind, b.source, b.statement, b.formula if b.explicit else f"— ({b.formula})",
              b.unit, b.precision, b.note] for b in lb.BOUNDS.values()]
    return markdown(head, cells)


def _bound_values_block(ns: list[int]) -> str:
    """Every explicit lower bound at the reference precision and at p = 64; bounds with the same
    values everywhere share a column."""
    keys = [k for k, b in lb.BOUNDS.items() if b.explicit and b.kind == "lower"]
    points = [(n, p) for n in ns for p in (reference_p(n), 64)]
    columns: dict[tuple, list[str]] = {}
    for k in keys:
        columns.setdefault(tuple(_cell(lb.evaluate(lb.BOUNDS[k], n, p)[0]) for n, p in points), []).append(k)
    head = ["N", "p"] + [" = ".join(f"`{k}`" for k in ks) for ks in columns.values()]
    cells = [[fmt_n(n), str(p)] + [vals[i] for vals in columns] for i, (n, p) in enumerate(points)]
    return markdown(head, cells)


def update_doc(text: str, doc: dict[str, Any], fig_dir: str) -> str:
    """``text`` with every generated block replaced. The blocks present must be exactly the ones
    the generator makes (so a renamed or new family cannot leave a stale or missing block)."""
    blocks = doc_blocks(doc, fig_dir)
    present = [m.group("name") for m in _BLOCK.finditer(text)]
    unknown, missing = set(present) - set(blocks), set(blocks) - set(present)
    if unknown or missing:
        raise SizesError(f"--doc: the file's generated blocks must be exactly {sorted(blocks)}; "
                         f"unknown: {sorted(unknown)}, missing: {sorted(missing)}")

    def sub(m: re.Match) -> str:
        return f"{m.group(1)}{blocks[m.group('name')]}\n{m.group(4)}"

    return _BLOCK.sub(sub, text)
