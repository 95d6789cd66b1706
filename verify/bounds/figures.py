"""Figures of the size tables and of attention patterns (docs/sizes.md): one log-log plot per task
family (built width x heads and size in bits against the bounds at the App. B.2 precision), and
the attention patterns of small built models, each with the CSV of the numbers it draws.
:func:`generate_figures` is what ``exactformer sizes --figures DIR --doc FILE`` runs: the size data
(sizes.json), every figure with its CSV, and the generated tables of the page.

matplotlib is imported where a figure is drawn.
"""

from __future__ import annotations

import csv
import io
import json
import os
import textwrap
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from exactformer.constructions.core import registry
from exactformer.precision import Format, parse_format
from exactformer.verify.bounds import lower_bounds as lb
from exactformer.verify.bounds import separations
from exactformer.verify.verifier import certificate_refusal, verify
from exactformer.verify.bounds.sizes import (SIZE_SPECS, SizeProvider, SizesError, SizeSpec, SizeUnavailable,
                                             figure_families, provider_or_default, reference_p, report, update_doc)


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
    """The lines of one family's figure: every spec of the family (built width x heads -- a
    recurrent model's hidden units -- and size in bits, N <= its provider's range) and every
    explicit bound of the family or of one of its specs at the reference p."""
    provider = provider_or_default(provider)
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
            if r.architecture == "recurrent":
                units.detail = " (built): hidden units m"
            units.points.append((n, r.units, r.precision_bits))
            bits.points.append((n, r.size_bits, r.precision_bits))
        out += [x for x in (units, bits) if x.points]
    keys = [k for k in dict.fromkeys([*lb.FAMILIES[family].bounds, *(k for s in specs for k in s.bound_keys)])
            if lb.BOUNDS[k].explicit]
    for k in keys:
        b = lb.BOUNDS[k]
        for params in _bound_params(b, [s for s in specs if k in s.bound_keys]):
            where = "".join(f", {name} = {v}" for name, v in params.items())
            name = f"{b.model} ({b.short}{where}): {b.formula}"
            units = Series(name, "", b.kind, "units")
            bits = Series(name, "; bits", b.kind, "bits")
            for n in ns:
                p = reference_p(n)
                u, bb = lb.evaluate(b, n, p, params)
                if u is not None:
                    units.points.append((n, u, p))
                if bb is not None:
                    bits.points.append((n, bb, p))
            out += [x for x in (units, bits) if x.points]
    return out


def _bound_params(b: lb.Bound, specs: list[SizeSpec]) -> list[dict[str, Any]]:
    """The parameters a family figure draws bound ``b`` at: those of each spec that lists it (each
    set once), or none for a bound without parameters; a bound that needs parameters no spec gives
    is not drawn."""
    if not b.params:
        return [{}]
    sets = [s.bound_params(b.key) for s in specs]
    return [dict(t) for t in dict.fromkeys(tuple(d.items()) for d in sets)]


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
    ``to_torch(model)``: its dense forward pass (``dense_forward``, every position)."""
    import torch

    from exactformer.constructions.export import to_torch

    with torch.no_grad():
        _, patterns = to_torch(model).dense_forward(np.asarray(tokens, dtype=np.int64))
    return [w.cpu().numpy() for w in patterns]


@dataclass(frozen=True)
class AttentionPicture:
    """A small built model and the input it is shown on (``example``: the task's natural input;
    Index Lookup is shown on one input per index instead)."""

    name: str
    construction: str
    n: int
    kwargs: tuple[tuple[str, Any], ...]
    title: str
    example: tuple[int, ...] = ()


PICTURE_SAMPLES = 200  # inputs a picture's float64 model is run on where no certificate covers float64

ATTENTION_PICTURES = (
    AttentionPicture("attention-index-lookup-n16", "index-lookup", 16, (("alphabet", 64),),
                     "Index Lookup, N = 16: the index token p attends to position p"),
    AttentionPicture("attention-equality-n8", "equality", 8, (),
                     "Equality, N = 8: layer 1 fetches x_(i-N/2) (and x_i for i <= N/2); layer 2 averages",
                     (1, -1, 1, 1, 1, -1, -1, 1)),
    AttentionPicture("attention-disjointness-n8", "disjointness", 8, (),
                     "Disjointness, N = 8: head h of layer 1 fetches x_(I_i[h]) (BOS for no index); layer 2 averages",
                     (1, 0, 1, 1, 0, 1, 1, 0)),
    AttentionPicture("attention-k-hop-n9", "k-hop", 9, (("k", 5), ("alphabet", 3)),
                     "k-hop, N = 9, k = 5, w = aabcbabca. Layer 1: the previous token; layer 2: sigma (the latest "
                     "earlier match; BOS for none); pointer doubling: layer 3 P = sigma^2 (looks at sigma(p)) and "
                     "A = sigma (looks at p), layer 4 P = sigma^4 (looks at sigma^2(p)), layer 5 A = P o A = sigma^5 "
                     "(looks at A(p) = sigma(p))",
                     (0, 0, 1, 2, 1, 0, 1, 2, 0)),
)


@dataclass
class Panel:
    title: str
    exact: list[list[Fraction]]  # the rounded weights under the model's format
    float64: np.ndarray  # the float export's weights
    rows: list[str]
    cols: list[str]


def picture_panels(pic: AttentionPicture) -> tuple[str, list[Panel], str]:
    """The model's format name, the panels of ``pic`` (for Index Lookup the index token's row on one
    input per p = 1..N; otherwise every layer and head on one fixed input) and what is known of it in
    float64: "certified" (the certificate proves it there), "sampled" (no certificate covers float64,
    and it answers :data:`PICTURE_SAMPLES` seeded inputs right there) or ""."""
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
        tokens = task.encode_batch(model, [list(pic.example)])
        sel = [(l, h, f"layer {l + 1}, head {h + 1}") for l, b in enumerate(model.blocks) for h in range(b.attn.n_heads)]
        rows = cols = (["BOS"] if task.length(model) == n + 1 else []) + [str(i) for i in range(1, n + 1)]
        pick = None
    exact, _ = exact_attention(model, tokens, fmt)
    flt = float_attention(model, tokens)
    panels = []
    for l, h, title in sel:
        e = np.asarray(fmt.to_fraction(pick(exact[l]) if pick else exact[l][0, h]), dtype=object)
        f = pick(flt[l]) if pick else flt[l][0, h]
        panels.append(Panel(title, e.tolist(), f, rows, cols))
    if certificate_refusal(model, "float64") is None and verify(model, mode="certify", arithmetic="float64").passed:
        return fmt.name, panels, "certified"
    sampled = verify(model, mode="sample", samples=PICTURE_SAMPLES, seed=0, arithmetic="float64").passed
    return fmt.name, panels, "sampled" if sampled else ""


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


def plot_picture(pic: AttentionPicture, fmt_name: str, panels: list[Panel], path: Path, float64: str):
    """Two rows of heat maps: the exact rounded weights, then the float export's; returns the figure.
    A float panel over one-hot exact rows names the float weight left on the target, and the title
    says why the two differ: the format floors every off-target weight to 0, the real softmax does
    not (the float model answers right where it is certified in float64). ``float64``: what
    :func:`picture_panels` says is known there."""
    k = len(panels)
    width = max(3.4 * k + 1.2, 6.0)
    fig = _matplotlib_figure(figsize=(width, 7.4 if k <= 3 else 9.0), layout="constrained")
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
           + {"certified": "certified in float64 too: it answers right",
              "sampled": f"not certified in float64, where it answers {PICTURE_SAMPLES} sampled inputs (seed 0) "
                         "right"}.get(float64, "not certified in float64")
           + "; docs/sizes.md, Attention patterns)")
    fig.suptitle(pic.title + "\n" + textwrap.fill(why, int(width * 13)), fontsize=8)
    _save(fig, path)
    return fig


# ------------------------------------------------------------------------------------------------
# the one command that regenerates docs/figures (and the tables in docs/sizes.md)
# ------------------------------------------------------------------------------------------------


def generate_figures(out_dir: Path, ns: list[int], provider: SizeProvider | None = None,
                     specs: Iterable[SizeSpec] | None = None, doc_path: Path | Sequence[Path] | None = None,
                     progress: Callable[[str], None] | None = None,
                     phase: Callable[[str], None] | None = None) -> list[Path]:
    """Write into ``out_dir``: sizes.json (the report), sizes-<family>.png/.csv per family and
    attention-*.png/.csv; with ``doc_path`` (one page or several), rewrite each page's generated
    blocks: the separations page's (:mod:`exactformer.verify.bounds.separations`) or the size
    tables'. Returns the paths. ``progress``: :func:`report`'s; ``phase(name)`` as each later part
    starts."""
    specs = list(specs if specs is not None else SIZE_SPECS.values())
    phase = phase or (lambda name: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    doc = report(specs, ns, provider, progress)
    written.append(_write(out_dir / "sizes.json", _json_text(doc)))
    phase("family figures")
    for fam in figure_families(s.family for s in specs):
        series = family_series(fam, ns, provider, specs)
        written.append(_write(out_dir / f"sizes-{fam}.csv", series_csv(series)))
        plot_families([(fam, series)], out_dir / f"sizes-{fam}.png")
        written.append(out_dir / f"sizes-{fam}.png")
    phase("attention pictures")
    for pic in ATTENTION_PICTURES:
        fmt_name, panels, float64 = picture_panels(pic)
        written.append(_write(out_dir / f"{pic.name}.csv", picture_csv(panels)))
        plot_picture(pic, fmt_name, panels, out_dir / f"{pic.name}.png", float64)
        written.append(out_dir / f"{pic.name}.png")
    for page in ([doc_path] if isinstance(doc_path, Path) else list(doc_path or [])):
        phase(f"rewrite {page}")
        rel = Path(os.path.relpath(out_dir.resolve(), page.resolve().parent)).as_posix()
        text = page.read_text()
        update = separations.update_doc if separations.holds_separations(text) else update_doc
        written.append(_write(page, update(text, doc, rel)))
    return written


def _json_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
