"""Size tables: what exactformer builds against the papers' lower bounds (docs/sizes.md).

A *size row* is what one built model costs: layers, heads, d_model, d_head, width, precision bits,
stored parameters and total size in bits (:class:`SizeRow`). Rows come from a *size provider*
``provider(spec, n) -> SizeRow`` (raising :class:`SizeUnavailable` where it has no answer). The
provider in use is the module variable :data:`SIZE_PROVIDER`: :func:`measured_size_row` builds
the model (:func:`built_size_row`, ``source: "build"``) up to each spec's ``built_to`` (N = 2^30 for
the constructions the run certificate covers there: Index Lookup, Equality, Inequality,
Disjointness; 2^12 for the others) and above it runs the builder shapes-only
(:func:`formula_size_row`, ``source: "formula"``: no weights assembled, N up to ``max_n``, checked
against real builds for N <= 2^20), the row saying why it was not built; everything here
(tables, CSV, JSON, plots) reads it at call time unless given another provider. :func:`report`
with it wrote the committed size data (:data:`COMMITTED_DATA`, docs/figures/sizes.json), which
:class:`CommittedSizes` serves back: the ``sizes`` command reads the committed data and computes
only the rows it lacks (``--recompute``: every row).

Each row is set beside the lower bounds of its task (:mod:`exactformer.verify.bounds.lower_bounds`),
evaluated at the built model's own precision p ("the same precision"), or, for rows not built, at
the paper's App. B.2 precision with Kc = 1 (``p_source = "reference"``).

The rows come from the constructions' registrations (``sizes=SizeRows(...)``, or ``NoRows``: the
reason a construction has none). Figures: :mod:`exactformer.verify.bounds.figures`.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable

from exactformer.constructions.core import registry
from exactformer.constructions.core.registry import BUILD_MAX_N, BUILT_TO, Claim
from exactformer.constructions.core.builder import shapes_only
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
    built_to: int = BUILT_TO

    @property
    def builder_kwargs(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def bound_keys(self) -> tuple[str, ...]:
        return self.bounds if self.bounds is not None else lb.FAMILIES[self.family].bounds

    def bound_params(self, key: str) -> dict[str, Any]:
        """The task parameters bound ``key`` reads (:attr:`lb.Bound.params`), from the builder
        arguments of the rows; BoundError where one without a default is not given."""
        return lb.BOUNDS[key].arguments(self.builder_kwargs)


def _registered_specs() -> tuple[dict[str, SizeSpec], dict[str, str]]:
    """Every registered construction's size rows, and why a family has no rows on this page (the
    constructions' own reasons)."""
    specs: dict[str, SizeSpec] = {}
    not_built: dict[str, str] = {}
    for name in registry.names():
        c = registry.get(name)
        for r in c.sizes:
            spec_name = r.name or name
            s = specs[spec_name] = SizeSpec(spec_name, name, r.family, r.kwargs, r.bounds, r.claim or c.claim,
                                            r.build_max_n, r.max_n, r.note, min(r.built_to, r.build_max_n, r.max_n))
            for key in s.bound_keys:  # a bound that reads a parameter the rows do not give is a registration error
                s.bound_params(key)
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
    (P1 Sec. 2; a recurrent model's width is its hidden units m, and it has no heads).
    ``source``: "build" or "formula". ``architecture``: "transformer" or "recurrent"."""

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
    architecture: str = "transformer"

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def units(self) -> int:
        """What the bounds count: width x heads (mH) of a transformer, hidden units m of a recurrent model."""
        return self.width * self.heads if self.architecture == "transformer" else self.width


SizeProvider = Callable[[SizeSpec, int], SizeRow]


def size_row_from_summary(spec_name: str, summary: dict[str, Any], source: str) -> SizeRow:
    """A SizeRow from ``CompiledModel.summary()`` (or any dict with the same keys)."""
    bits = int(summary["params"]["precision_bits"]["value"])
    return SizeRow(spec_name, int(summary["n"]), int(summary["layers"]), int(summary["heads"]),
                   int(summary["d_model"]), int(summary["d_head"]), int(summary["d_mlp"]), int(summary["width"]),
                   str(summary["precision"]), bits, int(summary["parameters"]), int(summary["parameters"]) * bits,
                   source, str(summary.get("architecture", "transformer")))


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


def measured_size_row(spec: SizeSpec, n: int) -> SizeRow:
    """A full build (:func:`built_size_row`) for N <= ``spec.built_to``, else the builder run
    shapes-only (:func:`formula_size_row`; :func:`not_built_note` says so in the row)."""
    return built_size_row(spec, n) if n <= spec.built_to else formula_size_row(spec, n)


def not_built_note(spec: SizeSpec, row: SizeRow) -> str | None:
    """Why a row with sizes was not measured from a build (None for a build)."""
    if row.source == "build":
        return None
    top = f"N = {fmt_n(spec.built_to)}" if spec.built_to >= 2 else "no N"
    return (f"not built: the size tables build {spec.name} up to {top}; this row is its builder run "
            "shapes-only (the same design, layout and blocks, no weights assembled)")


#: The provider every table, plot and the ``sizes`` command use: full builds up to each spec's
#: ``built_to``, the shapes-only path above it (checked against :func:`built_size_row` by
#: :func:`compare_providers` for N <= 2^20: ``benchmarks/check_size_formulas.py``;
#: tests/test_sizes.py for small N and at 2^24 and 2^30).
SIZE_PROVIDER: SizeProvider = measured_size_row


def provider_or_default(provider: SizeProvider | None) -> SizeProvider:
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
    family, bounds, claim, note, max_n, build_max_n, built_to) differs from the committed one."""

    source: Path
    specs: dict[str, dict[str, Any]]
    rows: dict[tuple[str, int], dict[str, Any]]
    fallback: SizeProvider | None = None

    def holds(self, spec: SizeSpec, n: int) -> bool:
        """Whether the committed report answers (spec, N) (else it is computed)."""
        return (spec.name, n) in self.rows and self.specs.get(spec.name) == spec_json(spec)

    def __call__(self, spec: SizeSpec, n: int) -> SizeRow:
        if not self.holds(spec, n):
            return provider_or_default(self.fallback)(spec, n)
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


def exact_ratio(x: Fraction) -> str:
    """A ratio written exactly: its decimal where that terminates (2.125, 4, 15), else the fraction
    with seven significant digits beside it (``7/3 ≈ 2.333333``), never a rounding passed off as the value."""
    x = Fraction(x)
    rest = x.denominator
    for f in (2, 5):
        while rest % f == 0:
            rest //= f
    if rest != 1:
        return f"{x.numerator}/{x.denominator} ≈ {float(x):.7g}"
    digits = 0
    while (x * 10 ** digits).denominator != 1:
        digits += 1
    whole, frac = divmod(abs(int(x * 10 ** digits)), 10 ** digits)
    return ("-" if x < 0 else "") + (f"{whole}.{frac:0{digits}d}" if digits else str(whole))


def fmt_n(n: int) -> str:
    return f"2^{n.bit_length() - 1}" if n & (n - 1) == 0 else str(n)


# ------------------------------------------------------------------------------------------------
# the report (the JSON document; tables and CSV are views of it)
# ------------------------------------------------------------------------------------------------


def reference_p(n: int) -> int:
    return lb.paper_precision_bits(n, 1)


def bound_values(spec: SizeSpec, n: int, p: int) -> dict[str, dict[str, Any]]:
    """Each bound of ``spec`` at (N, p) and the rows' parameters: units and bits, or None with the
    condition that fails (``why_not``): a bound is shown only where its conditions hold."""
    out = {}
    for k in spec.bound_keys:
        b, params = lb.BOUNDS[k], spec.bound_params(k)
        units, bits = lb.evaluate(b, n, p, params)
        out[k] = {"units": units, "bits": bits, "why_not": lb.why_not(b, n, p, params)}
    return out


def report(specs: Iterable[SizeSpec], ns: list[int], provider: SizeProvider | None = None,
           progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The sizes document (schema in docs/sizes.md): one row per (spec, N); ``progress(spec name)``
    after each row."""
    provider = provider_or_default(provider)
    specs = list(specs)
    rows = []
    for s in specs:
        for n in ns:
            try:
                built = provider(s, n)
                reason = not_built_note(s, built)
            except SizeUnavailable as e:
                built, reason = None, str(e)
            p = built.precision_bits if built else reference_p(n)
            rows.append({"spec": s.name, "construction": s.construction, "family": s.family, "n": n,
                         "built": built.to_json() if built else None, "not_built": reason,
                         "p": p, "p_source": "built" if built else "reference",
                         "bounds": bound_values(s, n, p)})
            if progress:
                progress(s.name)
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
            "bounds": list(s.bound_keys), "claim": _claim(s), "note": s.note, "max_n": s.max_n,
            "build_max_n": s.build_max_n, "built_to": s.built_to}


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
    such rows out). The width is P1's max(d_model, d_head), which neither paper's statement makes
    count the MLPs: their hidden units (the most of any layer, d_mlp) are the column beside it."""
    keys = _explicit(doc["specs"][spec_name]["bounds"])
    head = ["N", "layers", "heads", "d_model", "width", "MLP units", "p (bits)", "parameters", "size (bits)"]
    head += [_bound_header(k) for k in keys]
    rows = [r for r in doc["rows"] if r["spec"] == spec_name and (ns is None or r["n"] in ns)
            and (r["built"] or not built_only)]
    cells = []
    for r in rows:
        b = r["built"]
        built = ([str(b[f]) for f in ("layers", "heads", "d_model", "width")]
                 + ["—" if _recurrent(r) else str(b["d_mlp"])] if b else ["—"] * 5)
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


def _recurrent(row: dict[str, Any]) -> bool:
    return row["built"].get("architecture", "transformer") == "recurrent"


def row_units(row: dict[str, Any]) -> int:
    """What a built row's bounds count (:attr:`SizeRow.units`) from its JSON."""
    b = row["built"]
    return b["width"] if _recurrent(row) else b["width"] * b["heads"]


def separation_lines(doc: dict[str, Any], spec_name: str) -> list[str]:
    """For each lower bound of the spec, as sentences: from which built N on the built model's
    width x heads (a recurrent model's hidden units m) and its size in bits stay below the bound at
    the same p; for a recurrent model beside a recurrent bound (it must meet it), the largest
    factor by which its hidden units m and state bits m p exceed the bound."""
    rows = [r for r in doc["rows"] if r["spec"] == spec_name and r["built"]]
    out = []
    for k in _explicit(doc["specs"][spec_name]["bounds"]):
        b = lb.BOUNDS[k]
        if b.kind != "lower" or not rows:
            continue
        last = f"built up to N = {fmt_n(rows[-1]['n'])}"
        if _recurrent(rows[0]) and b.model == lb.RNN:
            pairs = [(row_units(r), r["bounds"][k]["units"]) for r in rows if r["bounds"][k]["units"]]
            meets = all(m >= bound for m, bound in pairs)
            worst = max(Fraction(m, bound) for m, bound in pairs)
            out.append(f"built hidden units m {'>=' if meets else 'BELOW'} {b.model} bound ({b.short}, same p) at every "
                       f"built N; m is at most {exact_ratio(worst)} times the bound, and so are the state bits m p "
                       f"({last})")
            continue
        what = "hidden units m" if _recurrent(rows[0]) else "width x heads"
        for text, mine, theirs in ((what, row_units, "units"), ("size in bits", lambda r: r["built"]["size_bits"], "bits")):
            below = [r["bounds"][k][theirs] is not None and mine(r) < r["bounds"][k][theirs] for r in rows]
            since = next((i for i in range(len(rows)) if all(below[i:])), None)
            where = (f"from N = {fmt_n(rows[since]['n'])} on" if since is not None else "at no built N")
            out.append(f"built {text} < {b.model} bound ({b.short}, same p): {where} ({last})")
    return out


def figure_families(spec_families: Iterable[str]) -> list[str]:
    """Families with something to plot: one of ``spec_families`` (the families of the specs
    sized) or a family with an explicit bound."""
    fams = set(spec_families)
    return [f for f, fam in lb.FAMILIES.items()
            if f in fams or any(lb.BOUNDS[k].explicit for k in fam.bounds)]


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
        if lb.FAMILIES[fam].note:
            parts.append(lb.FAMILIES[fam].note)
        if not names:
            parts.append(NOT_BUILT.get(fam, "No construction of this family is built yet: its rows appear here once "
                                            "a construction declares `SizeRows` of this family in its registration."))
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
    """Every explicit lower bound at the reference precision and at p = 64 (a bound with task
    parameters at its ``table_params``, said in its column); bounds with the same values
    everywhere share a column."""
    keys = [k for k, b in lb.BOUNDS.items() if b.explicit and b.kind == "lower" and (not b.params or b.table_params)]
    points = [(n, p) for n in ns for p in (reference_p(n), 64)]
    columns: dict[tuple, list[str]] = {}
    for k in keys:
        b = lb.BOUNDS[k]
        values = tuple(_cell(lb.evaluate(b, n, p, b.table_params[1](n) if b.table_params else None)[0])
                       for n, p in points)
        columns.setdefault(values, []).append(f"`{k}`" + (f" ({b.table_params[0]})" if b.table_params else ""))
    head = ["N", "p"] + [" = ".join(ks) for ks in columns.values()]
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
