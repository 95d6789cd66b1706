"""Size rows, providers, the report, the figures and their committed data (verify/bounds/sizes.py), and
the ``sizes`` command (exactformer/cli/sizes.py)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from exactformer.constructions.core import registry
from exactformer.constructions.core.recurrent import RNNModel
from exactformer.precision import parse_format
from exactformer.verify.bounds import lower_bounds as lb
from exactformer.verify.bounds import figures
from exactformer.verify.bounds import sizes as sz
from exactformer.verify.executor.exact import run

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
CHEAP_MAX_N = 1 << 8  # built rows cheap enough to rebuild in a test
CHEAP = [1 << e for e in range(4, 9)]


def cheap_provider(spec: sz.SizeSpec, n: int) -> sz.SizeRow:
    """The provider in use (what the committed data comes from), for N <= 2^8 only."""
    if n > CHEAP_MAX_N:
        raise sz.SizeUnavailable("not rebuilt in the tests")
    return sz.SIZE_PROVIDER(spec, n)


# ------------------------------------------------------------------------------------------------
# N ranges
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,value", [("2^4", 16), ("16", 16), (" 2^30 ", 1 << 30), ("2", 2), (1000, 1000)])
def test_parse_n(text, value):
    assert sz.parse_n(text, "--n-min") == value


@pytest.mark.parametrize("text", ["2^31", "1", "0", "abc", "2**4", "-4", "2^", "1e3", ""])
def test_parse_n_rejects(text):
    with pytest.raises(sz.SizesError, match=r"^--n-max: an integer or 2\^k in \[2, 2\^30\]"):
        sz.parse_n(text, "--n-max")


def test_n_values():
    assert sz.n_values(16, 256, 2) == [16, 64, 256]
    assert sz.n_values(1000, 5000) == [1000, 2000, 4000]
    assert sz.n_values(16, 16) == [16]
    for bad in ((64, 16, 1), (16, 64, 0), (16, 64, 31)):
        with pytest.raises(sz.SizesError):
            sz.n_values(*bad)


# ------------------------------------------------------------------------------------------------
# providers
# ------------------------------------------------------------------------------------------------


def test_built_row_is_the_models_size():
    spec = sz.SIZE_SPECS["index-lookup"]
    model = registry.get("index-lookup").builder(1 << 8, alphabet=64)
    row = sz.built_size_row(spec, 1 << 8)
    bits = model.params["precision_bits"].value
    assert (row.layers, row.heads, row.d_model, row.d_head, row.width) == (
        model.n_layers, model.n_heads, model.d_model, model.d_head, model.width)
    assert row.parameters == model.parameter_count() and row.size_bits == model.size_bits(bits)
    assert row.precision == model.precision and row.precision_bits == bits and row.source == "build"
    assert sz.built_size_row(spec, 1 << 8) == row  # same input, same row


def test_built_row_unavailable():
    with pytest.raises(sz.SizeUnavailable, match="N > 2"):
        sz.built_size_row(sz.SIZE_SPECS["index-lookup-onehot"], 1 << 11)
    with pytest.raises(sz.SizeUnavailable, match="even"):  # the builder's own range check
        sz.built_size_row(sz.SIZE_SPECS["equality"], 17)


def test_compare_providers_finds_a_wrong_size():
    specs = [sz.SIZE_SPECS["equality"], sz.SIZE_SPECS["index-lookup"]]
    ns = [16, 64]
    assert sz.compare_providers(sz.built_size_row, sz.built_size_row, specs, ns) == []

    def off_by_one(spec, n):
        r = sz.built_size_row(spec, n)
        return sz.SizeRow(**(r.to_json() | {"size_bits": r.size_bits + (n == 64), "source": "formula"}))

    bad = sz.compare_providers(off_by_one, sz.built_size_row, specs, ns)
    assert len(bad) == 2 and all("N=64" in b and "size_bits" in b for b in bad)

    def missing(spec, n):
        raise sz.SizeUnavailable("no formula")

    assert len(sz.compare_providers(missing, sz.built_size_row, specs, ns)) == 4


@pytest.mark.slow
def test_size_provider_matches_builds():
    """The shapes-only rows (the provider above each spec's built_to) equal real builds, N <= 2^8
    here (benchmarks/check_size_formulas.py checks up to 2^20, docs/sizes.md)."""
    assert sz.SIZE_PROVIDER is sz.measured_size_row
    assert sz.compare_providers(sz.formula_size_row, sz.built_size_row, sz.SIZE_SPECS.values(), CHEAP) == []


def test_rows_are_builds_up_to_built_to_and_say_why_not_above():
    spec = dataclasses.replace(sz.SIZE_SPECS["equality"], built_to=32)
    doc = sz.report([spec], [16, 32, 64])
    assert [r["built"]["source"] for r in doc["rows"]] == ["build", "build", "formula"]
    assert [r["not_built"] is None for r in doc["rows"]] == [True, True, False]
    assert doc["rows"][2]["not_built"].startswith("not built: the size tables build equality up to N = 2^5;")
    # the run certificate's constructions are built at every N of the tables, the others to 2^12
    tops = {name: s.built_to for name, s in sz.SIZE_SPECS.items()}
    assert all(tops[n] == 1 << 30 for n in ("index-lookup", "equality", "inequality", "disjointness"))
    assert all(t <= min(s.build_max_n, s.max_n) for t, s in zip(tops.values(), sz.SIZE_SPECS.values()))


def test_committed_specs_are_the_registry_specs():
    """The committed size data records every spec's definition, limits included (max_n,
    build_max_n, built_to): a registration that changes them without regenerating the data fails
    here (and `exactformer sizes` recomputes that spec's rows meanwhile)."""
    data = json.loads((FIGURES / "sizes.json").read_text())
    assert data["specs"] == {name: sz.spec_json(s) for name, s in sz.SIZE_SPECS.items()}
    changed = dataclasses.replace(sz.SIZE_SPECS["disjointness"], max_n=1 << 22)
    assert not sz.committed_sizes().holds(changed, 1 << 10)


@pytest.mark.parametrize("name", [c for c in registry.names() if c not in ("induction-heads", "k-hop")])
def test_model_shape_counts_every_stored_number(name):
    """ModelShape.parameters (the one formula both paths use) equals the stored numbers counted
    tensor by tensor, and a shapes-only build of the same construction has the same shape; the
    context leaves ordinary builds untouched afterwards."""
    from exactformer.constructions.core.builder import shapes_only

    builder = registry.get(name).builder
    m = builder(16)
    counted = sum(int(np.prod(t.shape)) for t in m.tensors().values())
    if isinstance(m, RNNModel):  # tensors() holds the embedding; the export stores W_hh dense and bias_hh (zeros)
        counted += m.hidden**2 + m.hidden
    else:
        counted += (m.embed.table.shape[0] + m.pos_embed.table.shape[0]) * m.d_model
    assert m.shape().parameters == counted == m.parameter_count()
    with shapes_only():
        s = builder(16)
    assert s.shape() == m.shape() and not hasattr(s, "blocks")
    assert builder(16).fingerprint() == m.fingerprint()


#: bounds whose proof needs the model's answers at every query K > N/2 ("all") or at the last one
QUERY_BOUNDS = {"rnn-nearest-neighbor": "all", "rnn-nearest-neighbor-last": "last", "rnn-mqar-last": "last"}


def test_query_bounds_match_the_answers_the_builds_give():
    """Thm 8 reads the answers of all N/2 queries: it may stand only beside a model that gives them;
    a last-query build is compared with INDEX (Prop. 9's reduction) instead. Every nearest-neighbour
    row has one of these bounds."""
    n = 8
    for s in sz.SIZE_SPECS.values():
        keys = [k for k in s.bound_keys if k in QUERY_BOUNDS]
        assert keys or s.family != "nearest-neighbor", s.name
        if keys:
            model = registry.get(s.construction).builder(n, **s.builder_kwargs)
            answered = len(model.answer_positions_for(2 * n - 1))
            assert all(answered == (n // 2 if QUERY_BOUNDS[k] == "all" else 1) for k in keys), (s.name, keys)


# ------------------------------------------------------------------------------------------------
# the report
# ------------------------------------------------------------------------------------------------


def test_report_rows_use_the_built_precision():
    doc = sz.report([sz.SIZE_SPECS["equality"]], [1 << 8, 1 << 21], cheap_provider)
    built, not_built = doc["rows"]
    p = built["built"]["precision_bits"]
    assert built["p"] == p and built["p_source"] == "built"
    assert built["bounds"]["rnn-equality"] == {"units": lb.rnn_inequality(1 << 8, p),
                                               "bits": lb.rnn_inequality(1 << 8, p) * p, "why_not": None}
    assert built["bounds"]["one-layer-equality"]["units"] == lb.one_layer_equality(1 << 8, p)
    assert not_built["built"] is None and "not rebuilt" in not_built["not_built"]
    assert not_built["p"] == 44 and not_built["p_source"] == "reference"  # 2 * 21 + 2
    assert not_built["bounds"]["rnn-equality"]["units"] == lb.rnn_inequality(1 << 21, 44)
    assert doc["schema"] == sz.SCHEMA and doc["specs"]["equality"]["claim"]["source"].startswith("P1 Thm 6")
    assert set(doc["bounds"]) == set(lb.FAMILIES["equality"].bounds)


def test_report_csv_matches_report():
    doc = sz.report([sz.SIZE_SPECS["index-lookup"], sz.SIZE_SPECS["disjointness"]], [16, 64], cheap_provider)
    rows = list(csv.DictReader(io.StringIO(sz.report_csv(doc))))
    assert len(rows) == 4
    r = rows[1]
    assert r["spec"] == "index-lookup" and int(r["n"]) == 64
    assert int(r["size_bits"]) == doc["rows"][1]["built"]["size_bits"]
    assert int(r["rnn-index-lookup"]) == doc["rows"][1]["bounds"]["rnn-index-lookup"]["units"]
    assert r["one-layer-disjointness"] == ""  # not a bound of Index Lookup


#: each bound's conditions, restated by hand from its statement: (N, the row's parameters) -> whether they hold
CONDITIONS = {
    "rnn-index-lookup": lambda n, kw: n >= 2, "rnn-associative-recall": lambda n, kw: n >= 2,
    "rnn-nearest-neighbor-last": lambda n, kw: n >= 2, "tracr-index-lookup": lambda n, kw: n >= 2,
    **{k: (lambda n, kw: n % 2 == 0) for k in ("rnn-equality", "rnn-disjointness", "rnn-nearest-neighbor",
                                                "rnn-mqar-last", "one-layer-equality", "one-layer-equality-itemised",
                                                "one-layer-disjointness", "one-layer-disjointness-itemised",
                                                "one-layer-dyck", "one-layer-dyck-itemised")},
    "rnn-k-hop-index": lambda n, kw: n >= 2 * kw["k"] + 1 and kw["alphabet"] >= kw["k"] + 2,
    "rnn-k-hop-state": lambda n, kw: kw["alphabet"] >= 2, "rnn-dyck-dfa": lambda n, kw: True,
}


def _row_parameters(spec: sz.SizeSpec) -> dict:
    """The task parameters of a spec's rows, read from a built model (N = 2^6: they do not depend on N
    where a spec gives them), with k = 1 for a task without hops."""
    model = registry.get(spec.construction).builder(1 << 6, **spec.builder_kwargs)
    return {"k": 1} | {k: v for k, v in model.task_params.items() if k in ("alphabet", "k")}


def test_every_bound_value_holds_its_conditions(committed):
    """A bound stands in a row only where its conditions hold at that row's N and parameters (taken
    from a built model, restated by hand in CONDITIONS), and says which fails where they do not:
    the k-hop INDEX reduction needs N >= 2k + 1 and |Sigma| >= k + 2, and at |Sigma| = 64 it stops at
    ceil((63 - k)/p) (it read floor((N - 1)/2)/p before, 18,725 units at 2^20, for a task an RNN of 455
    state bits solves)."""
    params = {name: _row_parameters(s) for name, s in sz.SIZE_SPECS.items()
              if any(lb.BOUNDS[k].params for k in s.bound_keys)}
    seen = set()
    for r in committed["rows"]:
        for k, v in r["bounds"].items():
            b = lb.BOUNDS[k]
            if not b.explicit:
                assert v == {"units": None, "bits": None, "why_not": None}
                continue
            kw = params.get(r["spec"], {})
            assert CONDITIONS[k](r["n"], kw) == (v["why_not"] is None) == (v["units"] is not None), (r["spec"], r["n"], k)
            if k == "rnn-k-hop-index" and v["units"] is not None:
                n, kk, a = r["n"], kw["k"], kw["alphabet"]
                assert v["units"] == -(-min((n - 2 * kk + 1) // 2, a - kk - 1) // r["p"]) <= -(-(a - kk - 1) // r["p"])
            seen.add((k, v["units"] is None))
    assert {("rnn-k-hop-index", True), ("rnn-k-hop-index", False)} <= seen  # k = 16 at N = 16 has none
    assert params["induction-heads"] == {"k": 1, "alphabet": 64} and params["k-hop"] == {"k": 16, "alphabet": 64}


def test_a_bound_needing_a_parameter_the_rows_lack_is_refused():
    spec = dataclasses.replace(sz.SIZE_SPECS["k-hop"], kwargs=(("k", 16),))
    with pytest.raises(lb.BoundError, match="needs the task parameters alphabet"):
        spec.bound_params("rnn-k-hop-index")


def test_tables_show_the_mlp_units_beside_the_width(committed):
    """Neither paper's width counts the MLPs; the tables show their hidden units beside it (induction
    heads' MLPs are wider than its residual stream in every row)."""
    head, cells = sz.spec_table(committed, "induction-heads", built_only=True)
    i, w = head.index("MLP units"), head.index("width")
    assert cells and all(int(c[i]) > int(c[w]) for c in cells)
    head, cells = sz.spec_table(committed, "dyck-rnn", built_only=True)
    assert {c[head.index("MLP units")] for c in cells} == {"—"}  # a recurrent model has no MLP


@pytest.mark.parametrize("x,text", [(Fraction(17, 8), "2.125"), (Fraction(4), "4"), (Fraction(1, 20), "0.05"),
                                    (Fraction(7, 3), "7/3 ≈ 2.333333"), (Fraction(2621440, 174763), "2621440/174763 ≈ 14.99997")])
def test_exact_ratio(x, text):
    assert sz.exact_ratio(x) == text


def test_separations_page_quotes_the_factors_the_tables_give(committed):
    """docs/separations.md's factors by which the built RNNs exceed their bounds are the generated
    lines' (written 2.12 once for 2.125)."""
    text = " ".join((ROOT / "docs" / "separations.md").read_text().split())
    for spec, task in (("index-lookup-rnn", "Index Lookup"), ("equality-rnn", "Equality"), ("mqar-rnn", "MQAR")):
        line = next(x for x in sz.separation_lines(committed, spec) if "at most" in x)
        factor = re.search(r"at most (.+?) times", line).group(1)
        assert f"{factor} for {task}" in text, (spec, factor)


# ------------------------------------------------------------------------------------------------
# attention patterns
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,n,kw", [("index-lookup", 16, {"alphabet": 8}), ("equality", 8, {}),
                                       ("disjointness", 8, {})])
def test_exact_attention_reproduces_the_executor(name, n, kw):
    model = registry.get(name).builder(n, **kw)
    fmt = parse_format(model.precision)
    rng = np.random.default_rng(3)
    if name == "index-lookup":
        examples = [(rng.integers(0, 8, n).tolist(), int(rng.integers(1, n + 1))) for _ in range(7)]
    else:
        examples = (rng.integers(0, 2, (7, n)) * (2 if name == "equality" else 1) - (name == "equality")).tolist()
    tokens = registry.task_of(model).encode_batch(model, examples)
    weights, logits = figures.exact_attention(model, tokens, fmt)
    assert np.array_equal(logits, run(model, tokens, fmt).logits[:, -1])
    for b in (1, 2):  # the same rows with fewer inputs
        w_b, l_b = figures.exact_attention(model, tokens[:b], fmt)
        assert np.array_equal(l_b, logits[:b]) and all(np.array_equal(x, y[:b]) for x, y in zip(w_b, weights))
    flt = figures.float_attention(model, tokens)
    assert [w.shape for w in flt] == [w.shape for w in weights]
    assert np.allclose(np.sum(flt[0], axis=-1), 1.0)
    sums = fmt.to_fraction(np.sum(weights[0], axis=-1))
    assert all(s <= 1 for s in np.asarray(sums).ravel())  # floor-rounded weights never exceed 1 in total


# ------------------------------------------------------------------------------------------------
# figures, committed data and the generated tables of docs/sizes.md
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_generator_runs(tmp_path):
    specs = [sz.SIZE_SPECS["index-lookup"], sz.SIZE_SPECS["equality"]]
    doc_md = tmp_path / "sizes.md"
    doc_md.write_text("".join(f"<!-- BEGIN GENERATED {b} -->\nSTALE\n<!-- END GENERATED {b} -->\n"
                              for b in sz.doc_blocks(sz.report(specs, [16], cheap_provider), "x")))
    paths = figures.generate_figures(tmp_path / "fig", [16, 32, 64], cheap_provider, specs, doc_md)
    names = {p.name for p in paths}
    assert {"sizes.json", "sizes-index-lookup.png", "sizes-equality.csv", "sizes-dyck.png",
            "attention-equality-n8.png", "attention-index-lookup-n16.csv", "sizes.md"} <= names
    for p in paths:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.stat().st_size <= 150_000 and p.read_bytes()[:4] == b"\x89PNG"
    text = doc_md.read_text()
    assert "STALE" not in text and "![Equality / Inequality](fig/sizes-equality.png)" in text
    assert "| 2^4 | 1 | 1 |" in text  # the Index Lookup row at N = 16


def _drawn(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig.canvas.get_renderer()


@pytest.mark.slow
def test_family_figures_draw_every_line_visibly_with_legends_outside(tmp_path):
    """Equal lines (equality and inequality built; the RNN bounds of Thm 3 and Prop. 9) are drawn
    once with both names, built lines carry markers, and no legend covers its axes."""
    ns = [16, 32, 64, 128]
    for fam, merged in (("equality", "equality = inequality (built): width x heads"),
                        ("index-lookup", "RNN (Thm 3): m >= ceil(N/p) = RNN (Prop. 9): m >= ceil(N/p), N pairs")):
        fig = figures.plot_families([(fam, figures.family_series(fam, ns, cheap_provider))], tmp_path / f"{fam}.png")
        renderer = _drawn(fig)
        for ax in fig.axes:
            legend = ax.get_legend()
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), fam
            labels = [t.get_text() for t in legend.get_texts()]
            lines = ax.get_lines()
            assert [l.get_label() for l in lines] == labels
            assert len({(tuple(l.get_xdata()), tuple(l.get_ydata())) for l in lines}) == len(lines), labels
            assert all(l.get_marker() not in ("None", "", None) for l in lines if "(built)" in l.get_label())
        assert merged in [" ".join(t.get_text().split()) for t in fig.axes[0].get_legend().get_texts()], fam
        assert all(ax.get_window_extent(renderer).width > 300 for ax in fig.axes), fam  # legends do not squeeze
        assert fig._suptitle.get_text() == figures.REFERENCE_NOTE


@pytest.mark.slow
def test_family_figures_say_what_they_do_not_show(tmp_path):
    """A family without built rows (Dyck when no row is built) says "bounds only" on every panel, one
    with them (Dyck with its RNN, k-hop built as weights) does not; Match2, without bounds, says it
    has none and carries no title about lower bounds."""
    ns = [16, 32, 64]

    def nothing(spec, n):
        raise sz.SizeUnavailable("not built")

    for fam, provider, bounds_only in (("dyck", nothing, True), ("dyck", cheap_provider, False),
                                       ("k-hop", cheap_provider, False)):
        fig = figures.plot_families([(fam, figures.family_series(fam, ns, provider))], tmp_path / f"{fam}.png")
        assert all((figures.BOUNDS_ONLY in ax.get_title()) == bounds_only for ax in fig.axes), fam
    fig = figures.plot_families([("match2", figures.family_series("match2", ns, cheap_provider))], tmp_path / "m.png")
    assert all(figures.NO_BOUND in ax.get_title() and figures.BOUNDS_ONLY not in ax.get_title() for ax in fig.axes)
    assert "lower bound" not in fig._suptitle.get_text()


@pytest.mark.slow
def test_attention_float_panel_says_why_it_is_paler(tmp_path):
    """The float64 panel names the real softmax's weight on the target where the exact row is
    one-hot; Index Lookup's (0.773 at N = 16, also quoted in docs/sizes.md) meets the readout's
    3/4, and the title says why exact and float differ."""
    pic = figures.ATTENTION_PICTURES[0]
    fmt, panels, certified = figures.picture_panels(pic)
    fig = figures.plot_picture(pic, fmt, panels, tmp_path / "a.png", certified)
    target = figures.float_target_weight(panels[0])
    assert certified == "certified" and 0.75 <= target < 1
    exact_ax, float_ax = fig.axes[0], fig.axes[1]
    assert f"real softmax: target weight {target:.3f}" in float_ax.get_title()
    assert "target weight" not in exact_ax.get_title()
    title = " ".join(fig._suptitle.get_text().split())
    assert "rounds every off-target weight down to 0" in title and "certified in float64 too" in title
    assert f"the target keeps {target:.3f} in the Index Lookup picture" in (ROOT / "docs" / "sizes.md").read_text()


def test_update_doc_rejects_unknown_and_missing_blocks():
    doc = sz.report([sz.SIZE_SPECS["equality"]], [16], cheap_provider)
    blocks = sz.doc_blocks(doc, "f")
    full = "".join(f"<!-- BEGIN GENERATED {b} -->\n<!-- END GENERATED {b} -->\n" for b in blocks)
    assert sz.update_doc(full, doc, "f") != full
    with pytest.raises(sz.SizesError, match="unknown: \\['family:nope'\\]"):
        sz.update_doc(full + "<!-- BEGIN GENERATED family:nope -->\n<!-- END GENERATED family:nope -->\n", doc, "f")
    with pytest.raises(sz.SizesError, match="missing: \\['bounds'\\]"):
        sz.update_doc(full.replace("GENERATED bounds ", "GENERATED gone "), doc, "f")


@pytest.fixture(scope="module")
def committed():
    return json.loads((FIGURES / "sizes.json").read_text())


@pytest.mark.slow
def test_committed_report_is_current(committed):
    """The committed rows equal freshly built ones for N <= 2^8 (and every bound at every N)."""
    specs = [sz.SIZE_SPECS[s] for s in committed["specs"]]
    assert set(committed["specs"]) == set(sz.SIZE_SPECS)
    fresh = sz.report(specs, committed["n"], cheap_provider)
    assert fresh["specs"] == committed["specs"] and fresh["bounds"] == committed["bounds"]
    assert committed["n"] == [1 << e for e in range(4, 31)]
    for old, new in zip(committed["rows"], fresh["rows"]):
        assert (old["spec"], old["n"]) == (new["spec"], new["n"])
        if old["n"] <= CHEAP_MAX_N:
            assert old == new, (old["spec"], old["n"])
        elif old["p_source"] == "reference":
            assert old["bounds"] == new["bounds"]


@pytest.mark.slow
def test_committed_figure_data_is_current(committed):
    specs = [sz.SIZE_SPECS[s] for s in committed["specs"]]
    fams = sz.figure_families(s.family for s in specs)
    assert {f"sizes-{f}.csv" for f in fams} == {p.name for p in FIGURES.glob("sizes-*.csv")}
    for fam in fams:
        old = list(csv.DictReader((FIGURES / f"sizes-{fam}.csv").open()))
        new = list(csv.DictReader(io.StringIO(figures.series_csv(figures.family_series(fam, committed["n"], cheap_provider, specs)))))
        assert [r for r in old if r["kind"] != "built" or int(r["n"]) <= CHEAP_MAX_N] == new, fam
        assert {f"{fam}.png"} <= {p.name.removeprefix("sizes-") for p in FIGURES.glob("sizes-*.png")}
    for pic in figures.ATTENTION_PICTURES:
        _, panels, _ = figures.picture_panels(pic)
        assert (FIGURES / f"{pic.name}.csv").read_text() == figures.picture_csv(panels), pic.name
        assert (FIGURES / f"{pic.name}.png").stat().st_size <= 150_000
    for png in FIGURES.glob("*.png"):
        assert png.stat().st_size <= 150_000, png.name


def test_doc_tables_are_the_committed_data(committed):
    text = (ROOT / "docs" / "sizes.md").read_text()
    assert sz.update_doc(text, committed, "figures") == text


def test_doc_check_detects_a_stale_table(committed):
    text = (ROOT / "docs" / "sizes.md").read_text()
    stale = text.replace("| 2^10 |", "| 2^10 | 1 |", 1)
    assert stale != text and sz.update_doc(stale, committed, "figures") != stale


# ------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app():
    """The real command line: also checks that exactformer/cli/main.py registers ``sizes``."""
    from exactformer.cli.main import app

    return app


ARGS = ["sizes", "--construction", "index-lookup,equality", "--construction", "equality", "--n-min", "2^4",
        "--n-max", "64", "--step", "2"]


def test_cli_json(app):
    res = CliRunner().invoke(app, ARGS + ["--json"])
    assert res.exit_code == 0, res.output
    lines = [l for l in res.stdout.splitlines() if l.strip()]
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["schema"] == sz.SCHEMA and doc["n"] == [16, 64] and list(doc["specs"]) == ["index-lookup", "equality"]
    assert [(r["spec"], r["n"]) for r in doc["rows"]] == [("index-lookup", 16), ("index-lookup", 64),
                                                         ("equality", 16), ("equality", 64)]
    assert doc == sz.report([sz.SIZE_SPECS["index-lookup"], sz.SIZE_SPECS["equality"]], [16, 64])


@pytest.mark.slow
def test_cli_fresh_process_equals_in_process(app):
    out = subprocess.run([sys.executable, "-m", "exactformer.cli.main", *ARGS, "--json"], capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out) == json.loads(CliRunner().invoke(app, ARGS + ["--json"]).stdout)


def test_cli_csv_and_table(app):
    res = CliRunner().invoke(app, ARGS + ["--csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["spec"] for r in rows] == ["index-lookup", "index-lookup", "equality", "equality"]
    res = CliRunner().invoke(app, ARGS)
    assert res.exit_code == 0 and "index-lookup" in res.stdout and "RNN m ≥ (Thm 11)" in res.stdout


@pytest.mark.slow
def test_cli_plot(app, tmp_path):  # PNG files are checked with the generator
    out = tmp_path / "p.SVG"
    res = CliRunner().invoke(app, ARGS + ["--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(b"<?xml") and b"Equality / Inequality" in out.read_bytes()


def _no_builds(spec, n):
    raise AssertionError(f"built {spec.name} at N = {n}")


def test_cli_default_reads_the_committed_data(app, committed, monkeypatch):
    """Without --recompute the whole default table comes from docs/figures/sizes.json: no provider,
    no builder runs, and the JSON is the committed report."""
    monkeypatch.setattr(sz, "SIZE_PROVIDER", _no_builds)
    monkeypatch.setattr(sz, "_summary", lambda *a: _no_builds(sz.SIZE_SPECS[a[0]], a[2]))
    res = CliRunner().invoke(app, ["sizes", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == committed and res.stderr == ""
    res = CliRunner().invoke(app, ARGS)  # a subset, as tables
    assert res.exit_code == 0 and "index-lookup" in res.stdout and res.stderr == ""


def _fake_rows(calls: list):
    def provider(spec, n):
        calls.append((spec.name, n))
        return sz.SizeRow(spec.name, n, 9, 9, 9, 9, 9, 9, "binary:int=4,frac=4", 9, 9, 81, "formula")
    return provider


def test_cli_recompute_computes_every_row(app, monkeypatch):
    calls: list = []
    monkeypatch.setattr(sz, "SIZE_PROVIDER", _fake_rows(calls))
    res = CliRunner().invoke(app, ARGS + ["--json", "--recompute"])
    assert res.exit_code == 0, res.output
    assert calls == [("index-lookup", 16), ("index-lookup", 64), ("equality", 16), ("equality", 64)]
    assert all(r["built"]["layers"] == 9 for r in json.loads(res.stdout)["rows"])
    assert res.stderr == ""  # under --json: no progress


def test_cli_recompute_shows_progress(app, monkeypatch):
    """`sizes --recompute` (minutes) showed nothing without a terminal: one line per construction
    now, with its seconds (a bar with the ETA on a terminal)."""
    monkeypatch.setattr(sz, "SIZE_PROVIDER", _fake_rows([]))
    res = CliRunner().invoke(app, ARGS + ["--recompute", "--csv"])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    assert [line.split(":")[0] for line in lines] == ["sizes index-lookup", "sizes equality"]
    assert all(re.fullmatch(r"sizes [a-z-]+: \d+\.\d\d s", line) for line in lines)


def test_cli_computes_rows_the_committed_data_lacks(app, monkeypatch):
    """N outside the committed powers of two and a spec whose definition changed are computed, and
    stderr says how many and which."""
    calls: list = []
    monkeypatch.setattr(sz, "SIZE_PROVIDER", _fake_rows(calls))
    res = CliRunner().invoke(app, ["sizes", "--construction", "equality", "--n-min", "1000", "--n-max", "2000",
                                   "--json"])
    assert res.exit_code == 0, res.output
    assert calls == [("equality", 1000), ("equality", 2000)]
    assert res.stderr.startswith("note: 2 of 2 rows are not in the committed size data (equality N=1000, ")
    changed = sz.SizeSpec("equality", "equality", "equality", max_n=1 << 24, note="changed")
    monkeypatch.setitem(sz.SIZE_SPECS, "equality", changed)
    calls.clear()
    res = CliRunner().invoke(app, ARGS + ["--json"])
    assert res.exit_code == 0 and calls == [("equality", 16), ("equality", 64)]
    assert "2 of 4 rows" in res.stderr


def test_cli_without_committed_data_computes_and_says_so(app, monkeypatch, tmp_path):
    calls: list = []
    monkeypatch.setattr(sz, "SIZE_PROVIDER", _fake_rows(calls))
    monkeypatch.setattr(sz, "COMMITTED_DATA", tmp_path / "absent.json")
    res = CliRunner().invoke(app, ARGS + ["--json"])
    assert res.exit_code == 0 and len(calls) == 4
    assert res.stderr.startswith("note: no committed size data (") and "computing every row" in res.stderr
    (tmp_path / "absent.json").write_text('{"schema": "other"}')
    res = CliRunner().invoke(app, ARGS + ["--json"])
    assert res.exit_code == 2 and "committed size data: a report of schema exactformer-sizes/1" in res.stderr


def test_committed_provider_answers_like_the_report(committed):
    """The committed data read back as a provider gives the committed rows, reasons included."""
    provider = sz.committed_sizes()
    specs = [sz.SIZE_SPECS[s] for s in committed["specs"]]
    assert sz.report(specs, committed["n"], provider) == committed
    unbuilt = next(r for r in committed["rows"] if r["built"] is None)
    with pytest.raises(sz.SizeUnavailable, match=re.escape(unbuilt["not_built"])):
        provider(sz.SIZE_SPECS[unbuilt["spec"]], unbuilt["n"])


@pytest.mark.parametrize("extra,message", [
    (["--n-min", "2^x"], "error: --n-min: an integer or 2^k in [2, 2^30], got '2^x'"),
    (["--n-max", "2^31"], "error: --n-max: an integer or 2^k in [2, 2^30], got 2^31"),
    (["--n-min", "2^8", "--n-max", "2^4"], "error: --n-min/--n-max: n-min <= n-max, got 256 > 16"),
    (["--step", "0"], "error: --step: an integer in [1, 30]"),
    (["--construction", "nope"], "error: --construction: one of index-lookup, index-lookup-onehot"),
    (["--plot", "x.jpg"], "error: --plot: a file name ending in .png or .svg, got 'x.jpg'"),
    (["--csv", "--plot", "x.png"], "error: --json/--csv/--plot/--figures: at most one of them"),
    (["--doc", "README.md"], "error: --doc: only together with --figures DIR"),
])
def test_cli_bad_input(app, extra, message):
    res = CliRunner().invoke(app, ["sizes", *extra])
    assert res.exit_code == 2
    assert res.stderr.strip().startswith(message) and len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""
    res = CliRunner().invoke(app, ["sizes", *extra, "--json"])  # the same, or a clash with --json
    assert res.exit_code == 2 and res.stderr.startswith("error: ")
    assert json.loads(res.stdout) == {"error": res.stderr.strip().removeprefix("error: ")}


@pytest.mark.slow
def test_formula_rows_are_the_built_sizes_up_to_a_billion():
    """Index Lookup and Equality rows up to N = 2^30 (the run certificate's reach): the shapes-only
    row is the real build's, at the largest N too."""
    specs = [sz.SIZE_SPECS["index-lookup"], sz.SIZE_SPECS["equality"], sz.SIZE_SPECS["disjointness"]]
    assert all(s.build_max_n == s.max_n == s.built_to == 1 << 30 for s in specs)
    assert sz.compare_providers(sz.formula_size_row, sz.built_size_row, specs, [1 << 24, 1 << 30]) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["index-lookup", "equality", "inequality", "disjointness"])
def test_committed_rows_at_a_billion_are_builds(committed, name):
    """The committed rows of the run certificate's constructions at N = 2^30 are measured from
    full builds, and a fresh build gives them again."""
    row = next(r for r in committed["rows"] if r["spec"] == name and r["n"] == 1 << 30)
    assert row["built"]["source"] == "build" and row["not_built"] is None
    assert sz.built_size_row(sz.SIZE_SPECS[name], 1 << 30).to_json() == row["built"]
