"""The ``exactformer`` command line: positions, build, verify (one model, a saved model, or all)."""

from __future__ import annotations

import json as jsonlib
import re
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from exactformer.constructions import registry
from exactformer.precision import Format, parse_format

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Build, run and verify proven transformer constructions exactly.")
console = Console(stderr=True)

DEFAULT_N = 4096
# construction -> (keyword arguments of the builder at the default size for `verify all`)
ALL_DEFAULTS: dict[str, dict[str, Any]] = {
    "index-lookup": {"alphabet": 64},
}


def _fail(msg: str) -> None:
    console.print(f"[red]error:[/red] {msg}")
    raise typer.Exit(2)


def precision_from_cli(spec: str | None, n: int) -> Format | None:
    """``paper:kc=K`` | ``binary:int=I,frac=F[,rounding=R]`` | ``float64`` | ``float32`` | None."""
    if spec is None:
        return None
    m = re.fullmatch(r"paper:kc=(\d+)", spec.strip())
    if m:
        spec = f"paper:n={n},kc={m.group(1)}"
    try:
        return parse_format(spec)
    except ValueError as e:
        _fail(f"--precision: {e} (allowed: paper:kc=K, binary:int=I,frac=F, float64, float32)")
    return None


BOOLEAN = ("equality", "inequality", "threshold", "disjointness", "dnf", "cnf")


def boolean_options(construction: str, clauses: str | None, k: int | None, clause_seed: int,
                    features: str | None, b: int | None, g: str | None, feature_seed: int) -> dict[str, Any]:
    """Builder keywords from the CLI options of the threshold family (see docs/thresholds.md)."""
    from exactformer.constructions import thresholds

    out: dict[str, Any] = {}
    if k is not None:
        out["k"] = k
    if construction in ("dnf", "cnf"):
        out["clause_seed"] = clause_seed
        if clauses is not None:
            out["terms" if construction == "dnf" else "clauses"] = thresholds.parse_clauses(clauses)
    if construction == "threshold":
        out["feature_seed"] = feature_seed
        if features is not None:
            text = Path(features).read_text() if Path(features).is_file() else features
            try:
                out["features"] = jsonlib.loads(text)
            except jsonlib.JSONDecodeError as e:
                _fail(f"--features: not valid JSON ({e}); expected a list of index sets or [set, table] pairs")
        if b is not None:
            out["b"] = b
        if g is not None:
            if not set(g) <= {"0", "1"}:
                _fail(f"--g must be a truth table of 0/1 characters, got {g!r}")
            out["g"] = [int(c) for c in g]
    return out


def build_model(construction: str, n: int, alphabet: int | None, positions: str, eta: str | None,
                precision: str | None, max_inner: str, code_seed: int, extra: dict | None = None):
    try:
        fn = registry.get(construction).builder
    except ValueError as e:
        _fail(str(e))
    kwargs: dict[str, Any] = dict(extra or {})
    try:
        if construction == "index-lookup":
            kwargs.update(alphabet=alphabet if alphabet is not None else 64, positions=positions,
                          eta=None if eta is None else Fraction(eta), max_inner=Fraction(max_inner), seed=code_seed)
        elif construction in BOOLEAN:
            kwargs.update(positions=positions, max_inner=Fraction(max_inner), seed=code_seed)
            if eta is not None:
                kwargs["eta"] = eta if eta in ("one-hot", "threshold") else Fraction(eta)
        elif eta is not None:
            kwargs["eta"] = Fraction(eta)
    except (ValueError, ZeroDivisionError) as e:
        _fail(f"--eta / --max-inner: {e}")
    kwargs["precision"] = precision_from_cli(precision, n)
    try:
        return fn(n, **kwargs)
    except ValueError as e:
        _fail(str(e))


# ------------------------------------------------------------------------------------------------
# exactformer positions
# ------------------------------------------------------------------------------------------------


def _register_positions() -> None:
    from exactformer.verify.cli_positions import positions

    app.command("positions", help="Near-orthogonal position codes (Lemma 2, Cor. 8.1, App. B.3).")(positions)


_register_positions()


def _register_sizes() -> None:
    from exactformer.verify.cli_sizes import sizes

    app.command("sizes", help="Built sizes against the papers' lower bounds (tables, JSON, CSV, plots).")(sizes)


_register_sizes()


def _register_attention() -> None:
    from exactformer.verify.cli_attention import attention

    app.command("attention", help="EMA, ANNA (LSH, Alg. 1) or dense attention on generated data, checked.")(attention)


_register_attention()


# ------------------------------------------------------------------------------------------------
# exactformer build
# ------------------------------------------------------------------------------------------------


@app.command(help="Build a construction and write DIR/manifest.json, DIR/model.exact.safetensors and "
                  "(unless --compact) DIR/model.safetensors.")
def build(
    construction: str = typer.Argument(..., help=f"one of {registry.names()}"),
    n: int = typer.Option(..., "--n", help="input length N"),
    alphabet: Optional[int] = typer.Option(None, "--alphabet", help="|Sigma| (index-lookup; default 64)"),
    positions: str = typer.Option("auto", "--positions", help="auto | reed-solomon | random | onehot"),
    eta: Optional[str] = typer.Option(None, "--eta", help="attention scale (default: smallest that works)"),
    precision: Optional[str] = typer.Option(None, "--precision", help="paper:kc=K | binary:int=I,frac=F | float64"),
    max_inner: str = typer.Option("1/4", "--max-inner"),
    code_seed: int = typer.Option(0, "--code-seed", help="seed of a random position code"),
    clauses: Optional[str] = typer.Option(None, "--clauses", help='dnf/cnf: literal lists, e.g. "1,-2;3,4"'),
    k: Optional[int] = typer.Option(None, "--k", help="dnf/cnf/threshold: feature arity k"),
    clause_seed: int = typer.Option(0, "--clause-seed", help="dnf/cnf: seed of the default random clauses"),
    features: Optional[str] = typer.Option(None, "--features", help="threshold: JSON (or a JSON file) of index sets / [set, table] pairs"),
    b: Optional[int] = typer.Option(None, "--b", help="threshold: answer is [sum_j g_j > b]"),
    g: Optional[str] = typer.Option(None, "--g", help="threshold: truth table of g over k bits, e.g. 0110"),
    feature_seed: int = typer.Option(0, "--feature-seed", help="threshold: seed of the default random features"),
    out: Path = typer.Option(..., "--out", help="output directory"),
    compact: bool = typer.Option(False, "--compact", help="no float file: embeddings generated on load (docs/exports.md)"),
    json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
) -> None:
    from exactformer.constructions.export import save

    extra = boolean_options(construction, clauses, k, clause_seed, features, b, g, feature_seed)
    model = build_model(construction, n, alphabet, positions, eta, precision, max_inner, code_seed, extra)
    try:
        path = save(model, out, dense=not compact)
    except ValueError as e:
        _fail(str(e))
    summary = model.summary() | {"out": str(path)}
    if json:
        print(jsonlib.dumps(summary, default=str))
    else:
        _print_summary(summary)


def _print_summary(summary: dict) -> None:
    t = Table(title=f"{summary['construction']} ({summary['theorem']})")
    t.add_column("quantity")
    t.add_column("value")
    t.add_column("formula")
    for key in ("n", "layers", "heads", "d_model", "d_head", "d_mlp", "width", "parameters", "precision"):
        t.add_row(key, str(summary[key]), "")
    for key, p in summary["params"].items():
        t.add_row(key, str(p["value"]), p["formula"])
    Console().print(t)


# ------------------------------------------------------------------------------------------------
# exactformer verify
# ------------------------------------------------------------------------------------------------


@app.command(help="Verify a saved model (DIR), a construction by name, or `all` constructions.")
def verify(
    target: str = typer.Argument(..., help="DIR | a construction name | all"),
    n: Optional[int] = typer.Option(None, "--n", help=f"input length N (all: default {DEFAULT_N})"),
    alphabet: Optional[int] = typer.Option(None, "--alphabet"),
    positions: str = typer.Option("auto", "--positions"),
    eta: Optional[str] = typer.Option(None, "--eta"),
    precision: Optional[str] = typer.Option(None, "--precision"),
    max_inner: str = typer.Option("1/4", "--max-inner"),
    code_seed: int = typer.Option(0, "--code-seed"),
    clauses: Optional[str] = typer.Option(None, "--clauses", help='dnf/cnf: literal lists, e.g. "1,-2;3,4"'),
    k: Optional[int] = typer.Option(None, "--k", help="dnf/cnf/threshold: feature arity k"),
    clause_seed: int = typer.Option(0, "--clause-seed", help="dnf/cnf: seed of the default random clauses"),
    features: Optional[str] = typer.Option(None, "--features", help="threshold: JSON (or a JSON file) of index sets / [set, table] pairs"),
    b: Optional[int] = typer.Option(None, "--b", help="threshold: answer is [sum_j g_j > b]"),
    g: Optional[str] = typer.Option(None, "--g", help="threshold: truth table of g over k bits, e.g. 0110"),
    feature_seed: int = typer.Option(0, "--feature-seed", help="threshold: seed of the default random features"),
    mode: str = typer.Option("certify", "--mode", help="certify | exhaustive | sample"),
    samples: int = typer.Option(1000, "--samples", help="random inputs in sample mode (plus as many adversarial)"),
    seed: int = typer.Option(0, "--seed", help="seed of the sampled inputs"),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda"),
    find_min_precision: bool = typer.Option(False, "--find-min-precision",
                                            help="find the smallest frac bits (binary) or kc (paper) that certifies"),
    json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    from exactformer.verify.verifier import MODES, VerifyError
    from exactformer.verify.verifier import verify as run_verify

    if mode not in MODES:
        _fail(f"--mode must be one of {MODES}, got {mode!r}")
    if device not in ("cpu", "cuda"):
        _fail(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            _fail("--device cuda: no CUDA device is available")
    if target == "all":
        _verify_all(n or DEFAULT_N, device, json)
        return
    path = Path(target)
    if path.is_dir():
        from exactformer.constructions.export import ManifestError, load

        try:
            model = load(path)
        except (ManifestError, FileNotFoundError, ValueError) as e:
            _fail(str(e))
        fmt = parse_format(model.precision) if model.precision else None
    else:
        if n is None:
            _fail("--n is required when verifying a construction by name")
        extra = boolean_options(target, clauses, k, clause_seed, features, b, g, feature_seed)
        model = build_model(target, n, alphabet, positions, eta, precision, max_inner, code_seed, extra)
        fmt = parse_format(model.precision)
    if find_min_precision:
        _find_min(target, model, n or model.n, alphabet, positions, max_inner, code_seed, precision, device, json)
        return
    try:
        report = run_verify(model, mode=mode, fmt=fmt, samples=samples, seed=seed, device=device,
                            progress=_progress_bar(mode, samples) if not json else None)
    except VerifyError as e:
        _fail(str(e))
    _emit_report(report, json)
    if not report.passed:
        raise typer.Exit(1)


def _progress_bar(mode: str, samples: int):
    from tqdm import tqdm

    if mode == "certify":
        return None
    bar = tqdm(total=2 * samples if mode == "sample" else None, unit="inputs", file=sys.stderr, leave=False)
    return bar.update


def _emit_report(report, json: bool) -> None:
    d = report.to_json()
    if json:
        print(jsonlib.dumps(d, default=str))
        return
    t = Table(title=f"verify {d['construction']} (n={d['n']}, {d['mode']})")
    t.add_column("field")
    t.add_column("value")
    for key in ("passed", "inputs_covered", "seed", "precision", "precision_bits", "eta", "eta_paper", "k",
                "layers", "heads", "width", "size_bits", "min_margin", "counts", "reason", "seconds"):
        t.add_row(key, str(d[key]))
    if d["counterexample"]:
        t.add_row("counterexample", jsonlib.dumps(d["counterexample"], default=str)[:400])
    Console().print(t)


def _find_min(target, model, n, alphabet, positions, max_inner, code_seed, precision, device, json) -> None:
    from exactformer.verify.precision_scan import find_min_precision

    kind = "paper" if precision and precision.startswith("paper") else "binary"
    fn = registry.get(model.construction).builder

    def build_at(fmt):
        kw: dict[str, Any] = {"precision": fmt}
        if model.construction == "index-lookup":
            kw.update(alphabet=len(model.answers), positions=model.code, max_inner=Fraction(max_inner))
        else:
            kw["positions"] = model.code
        return fn(model.n, **kw)

    res = find_min_precision(build_at, kind=kind, n=model.n, device=device)
    out = {"construction": model.construction, "n": model.n, "kind": res.kind, "min_value": res.value,
           "format": res.fmt_name, "passing": res.passing, "checked_up_to": res.checked_up_to}
    if json:
        print(jsonlib.dumps(out))
    else:
        Console().print(out)
    if res.value is None:
        raise typer.Exit(1)


def _verify_all(n: int, device: str, json: bool) -> None:
    from exactformer.verify.verifier import verify as run_verify

    rows = []
    for name in registry.names():
        kw = dict(ALL_DEFAULTS.get(name, {}))
        t0 = time.perf_counter()
        model = registry.get(name).builder(n, **kw)
        report = run_verify(model, mode="certify", device=device)
        mode = "certify"
        if not report.passed and "no certificate" in report.reason:
            report = run_verify(model, mode="sample", samples=1000, seed=0, device=device)
            mode = "sample"
        rows.append({
            "construction": name, "theorem": model.theorem.split(" (")[0], "n": n, "layers": model.n_layers,
            "heads": model.n_heads, "width": model.width, "precision_bits": report.precision_bits,
            "size_bits": report.size_bits, "mode": mode, "passed": report.passed,
            "inputs_covered": report.inputs_covered, "seconds": round(time.perf_counter() - t0, 3),
        })
    if json:
        print(jsonlib.dumps(rows))
    else:
        t = Table(title=f"exactformer: every construction at n = {n}")
        for col in ("construction", "theorem", "n", "layers", "heads", "width", "precision bits", "size (bits)",
                    "mode", "passed", "seconds"):
            t.add_column(col)
        for r in rows:
            t.add_row(r["construction"], r["theorem"], str(r["n"]), str(r["layers"]), str(r["heads"]),
                      str(r["width"]), str(r["precision_bits"]), str(r["size_bits"]), r["mode"],
                      "PASS" if r["passed"] else "FAIL", str(r["seconds"]))
        Console(width=max(140, Console().width)).print(t)
    if not all(r["passed"] for r in rows):
        raise typer.Exit(1)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
