"""The ``build`` and ``verify`` commands (docs/cli.md), on the API: ``xf.build``, ``xf.verify``,
``xf.save``, ``xf.load``.

A construction's options come from its builder's signature and docstring
(:mod:`exactformer.cli.options`); the verification options are checked by the API's own checks
(:mod:`exactformer.verify.verifier`) and a refusal names the option. This module is imported when
a ``build`` or ``verify`` subcommand is resolved (:mod:`exactformer.cli.main`), not when the command
line starts.
"""

from __future__ import annotations

import inspect
import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer
from typer.core import TyperCommand

import exactformer as xf
from exactformer.arguments import ArgumentError, parse_int, parse_seconds
from exactformer.cli.main import click_errors
from exactformer.cli.options import builder_kwargs, command, construction_options
from exactformer.cli.output import EXIT_FAILED, Steps, fail, print_json, print_table
from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.task import EXHAUSTIVE_LIMIT, format_count
from exactformer.constructions.export import ManifestError, read_manifest
from exactformer.verify.certify.composed import SEARCH_SECONDS
from exactformer.verify.precision_scan import find_min_precision
from exactformer.verify.verifier import (ARITHMETICS, COUNTS_MEANING, COVERS, DEFAULT_SAMPLES, DEVICES,
                                         VERIFY_MODES, Report, VerifyError, check_arithmetic, check_device, check_mode,
                                         check_samples, check_sampling, check_search_seconds, check_seed,
                                         check_sharding, check_smt_timeout, certificate_refusal, choose_mode, lacks,
                                         smt_refusal, task_of)

DEFAULT_N = 4096  # verify all
#: verify all: random inputs of each sampled row (plus its adversarial ones) unless --samples is given; fewer
#: than sample mode's default so that verify all at N = 4096 stays within seconds (docs/cli.md, docs/benchmarks.md)
ALL_SAMPLES = 100


# ------------------------------------------------------------------------------------------------
# the subcommands
# ------------------------------------------------------------------------------------------------


class _OnceCommand(TyperCommand):
    """A command whose options are given at most once each (those declared repeatable aside): click
    would keep the last of ``--n 8 --n 16`` silently; a repeated option is refused (exit 2)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if not ctx.resilient_parsing:
            _, _, order = self.make_parser(ctx).parse_args(args=list(args))
            given = Counter(p for p in order if p.param_type_name == "option" and not p.multiple and not p.count)
            for p, times in given.items():
                if times > 1:
                    raise click_errors.UsageError(f"{p.opts[0]}: given {times} times; give it once", ctx)
        return super().parse_args(ctx, args)


def typer_command(name: str, fn: Any, help: str, short_help: str | None = None) -> Any:
    """A click command from a function with typer options (each option at most once)."""
    t = typer.Typer(rich_markup_mode=None, add_completion=False)
    t.command(name, help=help, short_help=short_help, cls=_OnceCommand)(fn)
    cmd = typer.main.get_command(t)
    cmd.name = name
    return cmd


def _help(c: registry.Construction) -> str:
    first = (inspect.getdoc(c.builder) or "").split("\n\n")[0].replace("\n", " ")
    return f"{first} ({c.theorem})"


def build_command(c: registry.Construction) -> Any:
    """``build <name>`` of construction ``c`` (resolved once, by the command line): its options and
    the build options."""
    return typer_command(c.name, command(construction_options(c) + BUILD_OPTIONS, lambda kw: _build(c, kw), ""),
                         _help(c), c.theorem)


def verify_command(c: registry.Construction | str) -> Any:
    """``verify <name>`` of construction ``c``, or ``verify all`` (``c`` = "all")."""
    if c == "all":
        return typer_command("all", command(_ALL_OPTIONS, _verify_all, ""), _ALL_HELP, "every construction, one table")
    opts = construction_options(c) + VERIFY_OPTIONS + FIND_MIN_OPTIONS
    return typer_command(c.name, command(opts, lambda kw: _verify_named(c, kw), ""), _help(c), c.theorem)


def dir_command(path: str) -> Any:
    """``verify DIR``: the verification options and ``--trust-code``."""
    return typer_command(path, command(VERIFY_OPTIONS + [TRUST_CODE], lambda kw: _verify_dir(path, kw), ""), _DIR_HELP)


# ------------------------------------------------------------------------------------------------
# options shared by the commands
# ------------------------------------------------------------------------------------------------


def _opt(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_JSON = _opt("json", bool, typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/cli.md)"))
BUILD_OPTIONS = [
    _opt("out", Optional[Path], typer.Option(None, "--out", metavar="DIR", show_default=False,
                                             help="the directory to write (created if missing). Required.")),
    _opt("compact", bool, typer.Option(False, "--compact", help="leave out the float file's embeddings: they are "
                                                                "generated from the position codes on load (docs/exports.md)")),
    _JSON,
]
VERIFY_OPTIONS = [
    _opt("mode", Optional[str], typer.Option(
        None, "--mode", metavar="MODE", show_default=False,
        help=f"{' | '.join(VERIFY_MODES)}: certify ({COVERS['certify']}), exhaustive ({COVERS['exhaustive']}, at most "
             f"{format_count(EXHAUSTIVE_LIMIT)} inputs), smt ({COVERS['smt']}, docs/smt.md; needs z3: pip install -e "
             f"'.[smt]'), sample ({COVERS['sample']}). Default: the strongest mode the construction has (certify "
             "where it has a certificate -- unproven, it is followed by exhaustive where the inputs fit --, else "
             "exhaustive where the inputs fit, else smt where z3 is installed and "
             "the model is small enough -- out of time after 60 s it samples --, else sample), named in the report; "
             "a mode it does not have is refused")),
    _opt("smt_timeout", Optional[str], typer.Option(
        None, "--smt-timeout", metavar="SECONDS", show_default=False,
        help="smt mode: the time budget in seconds, > 0; when it runs out the result is unknown, a failure. "
             "Default: 600 (60 when smt is the default's choice)")),
    _opt("samples", Optional[str], typer.Option(
        None, "--samples", metavar="COUNT", show_default=False,
        help=f"sample mode: random inputs (plus as many adversarial ones), >= 1. Default: {DEFAULT_SAMPLES} "
             f"({ALL_SAMPLES} per sampled row in verify all)")),
    _opt("seed", Optional[str], typer.Option(
        None, "--seed", metavar="SEED", show_default=False,
        help="sample mode: seed of the random inputs (the adversarial ones use seed + 1), >= 0. Default: 0")),
    _opt("device", str, typer.Option("cpu", "--device", metavar="DEVICE",
                                     help=f"{' | '.join(DEVICES)}: where the executor runs (cuda: refused without a "
                                          "CUDA device)")),
    _opt("workers", Optional[str], typer.Option(
        None, "--workers", metavar="W", show_default=False,
        help="exhaustive and sample: shard the inputs over W dask worker processes (an embedded LocalCluster; 0: "
             "this process), exhaustive up to 2^32 inputs; the result does not depend on W")),
    _opt("scheduler", Optional[str], typer.Option(
        None, "--scheduler", metavar="ADDRESS", show_default=False,
        help="exhaustive and sample: shard the inputs over the workers of the dask scheduler at ADDRESS "
             "(tcp://HOST:PORT)")),
    _opt("search_seconds", Optional[str], typer.Option(
        None, "--search-seconds", metavar="SECONDS", show_default=False,
        help=f"certify: the time budget of the counterexample search when a proof step fails, >= 0 (0: none). "
             f"Default: {SEARCH_SECONDS:g}; the report says what the search ran")),
    _opt("arithmetic", Optional[str], typer.Option(
        None, "--arithmetic", metavar="ARITH", show_default=False,
        help=f"{' | '.join(ARITHMETICS)}: fixed (the default) runs the exact executor in the model's fixed-point "
             "format; a float dtype checks the exported torch forward pass on the CPU (certify: rigorous float error "
             "bounds, docs/precision.md), real the exact real-number forward pass")),
    _JSON,
]
TRUST_CODE = _opt("trust_code", bool, typer.Option(
    False, "--trust-code", help="verify DIR: a model whose construction or blocks are defined in a module of one's own "
                                "imports that module (runs its code) from the path its manifest records; without "
                                "it such a model is refused, naming the module"))
FIND_MIN_OPTIONS = [
    _opt("find_min_precision", bool, typer.Option(
        False, "--find-min-precision", help="instead of verifying: the smallest frac bits at int=6 (--scan binary) "
                                            "or kc (--scan paper) that certifies, scanning upward; the integer bits are "
                                            "not varied. Exit 1 if none up to the top of the scan does")),
    _opt("scan", Optional[str], typer.Option(
        None, "--scan", metavar="KIND", show_default=False,
        help="with --find-min-precision: binary (frac bits 1..24 at int=6; the default) | paper (kc 1..4 of App. B.2)")),
]
_ALL_OPTIONS = [
    _opt("n", str, typer.Option(str(DEFAULT_N), "--n", metavar="N", help="input length N of every construction "
                                                                          "(an integer or 2^k)")),
    *VERIFY_OPTIONS,
]
_ALL_HELP = ("Build every registered construction at --n with its builder's defaults, verify each in the strongest "
             "mode it has (or in --mode where it has that mode; a row without it runs its strongest, and says so) and "
             "print one table saying which mode and how many inputs; exit 1 if any fails.")
_DIR_HELP = "Verify the model saved in this directory (by `exactformer build`), at the precision it was built for."


@dataclass
class _Verification:
    """The verification options, checked (the API's checks: :mod:`exactformer.verify.verifier`)."""

    mode: str | None
    samples: int | None
    seed: int | None
    device: str
    arithmetic: str
    json: bool
    workers: int | None = None
    scheduler: str | None = None
    search_seconds: float | None = None
    smt_timeout: float | None = None


def _bad(e: VerifyError, as_json: bool) -> NoReturn:
    """An API argument error as the command line's error: the parameter as its option."""
    fail(f"--{e.parameter.replace('_', '-')}: {e.reason}", as_json)


def _verify_args(kw: dict[str, Any]) -> _Verification:
    """The verification options from their text, checked by the API's checks; a given mode is also
    checked against --samples and --seed here, before anything is built."""
    as_json = kw["json"]
    try:
        samples = None if kw["samples"] is None else parse_int(kw["samples"], "--samples", ">= 1")
        seed = None if kw["seed"] is None else parse_int(kw["seed"], "--seed", ">= 0")
        workers = None if kw.get("workers") is None else parse_int(kw["workers"], "--workers", ">= 0")
        search = None if kw.get("search_seconds") is None else parse_seconds(kw["search_seconds"], "--search-seconds")
        smt_timeout = None if kw.get("smt_timeout") is None else parse_seconds(kw["smt_timeout"], "--smt-timeout", positive=True)
    except ArgumentError as e:
        fail(str(e), as_json)
    try:
        v = _Verification(check_mode(kw["mode"]), check_samples(samples), check_seed(seed), check_device(kw["device"]),
                          check_arithmetic(kw.get("arithmetic") or "fixed"), as_json, workers, kw.get("scheduler"),
                          search, check_smt_timeout(smt_timeout))
        check_search_seconds(search)
        if v.mode is not None:
            check_sampling(v.mode, v.samples, v.seed)
        if v.smt_timeout is not None and v.mode not in (None, "smt"):
            raise VerifyError("smt_timeout", f"only with mode smt (this run's mode is {v.mode}: {COVERS[v.mode]})")
        check_sharding(v.mode, v.workers, v.scheduler)
    except VerifyError as e:
        _bad(e, as_json)
    return v


# ------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------


def _construct(c: registry.Construction, kw: dict[str, Any], as_json: bool, steps: Steps) -> tuple[Any, dict[str, Any]]:
    """The model of construction ``c`` built from its command-line options by ``xf.build`` (and the
    builder keywords used)."""
    try:
        kwargs = builder_kwargs(c, kw)
        steps.step(f"build {c.name}" + (f" n={kwargs['n']}" if "n" in kwargs else ""))
        return xf.build(c, **kwargs), kwargs
    except ValueError as e:
        fail(str(e) if isinstance(e, ArgumentError) else f"{c.name}: {e}", as_json)


def _build(c: registry.Construction, kw: dict[str, Any]) -> None:
    as_json, out, compact = kw.pop("json"), kw.pop("out"), kw.pop("compact")
    if out is None:
        fail("--out is required: the directory to write (created if missing)", as_json)
    if out.exists() and not out.is_dir():
        fail(f"--out: {str(out)!r} exists and is not a directory", as_json)
    with Steps(lines=not as_json) as steps:
        model, _ = _construct(c, kw, as_json, steps)
        steps.step(f"certify {c.name} n={model.n} (its format, float64, float32) and write {out}"
                   if "certify" in task_of(model).modes else f"write {out} (no certificate: nothing to record)")
        try:
            path = xf.save(model, out, dense=not compact)
        except VerifyError as e:
            _bad(e, as_json)
        except (ValueError, OSError) as e:
            fail(f"--out {str(out)!r}: {e}", as_json)
    certified = read_manifest(path)["certified_arithmetics"]
    summary = model.summary() | {"out": str(path), "files": sorted(p.name for p in path.iterdir() if p.is_file()),
                                 "certified_arithmetics": certified}
    if as_json:
        print_json(summary)
        return
    rows = [[k, summary[k], ""] for k in ("n", "layers", "heads", "d_model", "d_head", "d_mlp", "width", "parameters",
                                          "precision")]
    rows += [[k, p["value"], p["formula"]] for k, p in summary["params"].items()]
    if certified is None:
        rows.append(["certified in", "none", "no certificate: it is verified by running it (exactformer verify)"])
    else:
        rows.append(["certified in", ", ".join(certified["certified"]) or "none",
                     "not certified: " + (", ".join(certified["not_certified"]) or "none")])
    rows.append(["out", summary["out"], ", ".join(summary["files"])])
    print_table(f"{summary['construction']} ({summary['theorem']})", ["quantity", "value", "formula"], rows)


# ------------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------------


def _run(model: Any, v: _Verification, steps: Steps) -> Report:
    """Verify with progress (certificate steps, or a bar over the inputs)."""
    try:
        chosen, _ = choose_mode(task_of(model), model, v.mode, v.workers is not None or v.scheduler is not None,
                                v.arithmetic, smt_default=v.samples is None and v.seed is None)
        what = f"{chosen} {model.construction} n={model.n}" + ("" if v.arithmetic == "fixed" else f" in {v.arithmetic}")
        steps.step(what)
        total = task_of(model).count(model) if chosen == "exhaustive" else 2 * (v.samples or DEFAULT_SAMPLES)
        progress = steps.bar(total, "inputs") if chosen not in ("certify", "smt") else None
        return xf.verify(model, mode=v.mode, samples=v.samples, seed=v.seed, device=v.device, progress=progress,
                          phase=lambda name: steps.step(f"{what}: {name}"), arithmetic=v.arithmetic, workers=v.workers,
                          scheduler=v.scheduler, search_seconds=v.search_seconds, smt_timeout=v.smt_timeout,
                          notice=steps.note)
    except VerifyError as e:
        _bad(e, v.json)


def _verify_named(c: registry.Construction, kw: dict[str, Any]) -> None:
    find, scan = kw.pop("find_min_precision"), kw.pop("scan")
    v = _verify_args(kw)
    if find:
        given = [f"--{o}" for o in ("mode", "samples", "seed", "precision") if kw.get(o) is not None]
        if given:
            fail(f"--find-min-precision certifies at each precision it scans: {', '.join(given)} do not apply", v.json)
        scan = scan or "binary"
        if scan not in ("binary", "paper"):
            fail(f"--scan must be binary or paper, got {scan!r}", v.json)
        if v.arithmetic != "fixed":
            fail("--arithmetic: --find-min-precision scans fixed-point formats only", v.json)
    elif scan is not None:
        fail("--scan: only with --find-min-precision", v.json)
    for o in ("mode", "samples", "seed", "device", "arithmetic", "json", "workers", "scheduler", "search_seconds",
              "smt_timeout"):
        kw.pop(o)
    with Steps(lines=not v.json) as steps:
        model, kwargs = _construct(c, kw, v.json, steps)
        if find:
            steps.step(f"scan {scan} precisions of {c.name} n={model.n}")
            scanned = _find_min(c, model, kwargs, scan, v.device)
        else:
            report = _run(model, v, steps)
    if find:
        _emit_scan(scanned, v.json)
    else:
        _emit_report(report, v.json)


def _verify_dir(path: str, kw: dict[str, Any]) -> None:
    trust = kw.pop("trust_code")
    v = _verify_args(kw)
    with Steps(lines=not v.json) as steps:
        steps.step(f"load {path}")
        try:
            model = xf.load(path, trust_code=trust)
        except (ManifestError, ValueError, OSError) as e:
            fail(f"{path}: {e}", v.json)
        report = _run(model, v, steps)
    _emit_report(report, v.json)


def _counts_rows(counts: dict[str, int]) -> list[list[Any]]:
    return [[key, f"{val}: {COUNTS_MEANING.get(key, '')}"] for key, val in counts.items()]


def inputs_text(r: Report) -> str:
    """How many inputs a report covers, of how many, and (sampled) with which seed."""
    if r.inputs_covered == "all":
        return f"all {r.input_count}"
    text = f"{r.inputs_covered} of {r.input_count}"
    return text + (f" ({r.samples} random, seed {r.seed}, the rest adversarial)" if r.mode == "sample" else "")


def _emit_report(report: Report, as_json: bool) -> None:
    d = report.to_dict()
    if as_json:
        print_json(d)
    else:
        rows = [["result", "PASS" if d["passed"] else "FAIL"], ["reason", d["reason"]]]
        if d["mode_reason"]:
            rows.append(["mode chosen", d["mode_reason"]])
        rows.append(["inputs", inputs_text(report)])
        rows += [[k, d[k]] for k in ("theorem", "precision", "precision_bits", "eta", "eta_paper", "k", "layers",
                                     "heads", "width", "d_mlp", "size_bits", "min_margin")]
        rows += _counts_rows(d["counts"])
        if d["counterexample"]:
            rows.append(["counterexample", json.dumps(d["counterexample"], default=str)])
        rows += [[f"details: {k}", v] for k, v in d["details"].items()]
        rows.append(["seconds", round(d["seconds"], 3)])
        print_table(f"verify {d['construction']} n={d['n']} ({d['mode']})", ["field", "value"], rows)
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)


def _find_min(c: registry.Construction, model: CompiledModel, kwargs: dict[str, Any], kind: str,
              device: str) -> dict[str, Any]:
    """The precision scan (:func:`~exactformer.verify.precision_scan.find_min_precision`) as the
    command's JSON object."""
    t0 = time.perf_counter()
    res = find_min_precision(lambda fmt: c.builder(**(kwargs | {"precision": fmt})), kind=kind, n=model.n, device=device)
    return {"construction": c.name, "theorem": model.theorem, "n": model.n, "mode": "find-min-precision", "kind": kind,
            "scanned": res.scanned, "passed": res.value is not None, "min_value": res.value, "precision": res.format,
            "passing": res.passing, "checked_up_to": res.checked_up_to,
            "results": [{"value": v, "precision": r["format"], "passed": r["passed"], "reason": r["reason"]}
                        for v, r in res.results.items()],
            "seconds": time.perf_counter() - t0}


def _emit_scan(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(out)
    else:
        what = "frac bits (int=6)" if out["kind"] == "binary" else "kc"
        smallest = "frac bits at int=6" if out["kind"] == "binary" else "kc"
        print_table(f"smallest {smallest} that certifies {out['construction']} n={out['n']} (scanned {out['scanned']}): "
                    f"{out['precision'] or 'none found'}", [what, "precision", "certified", "reason"],
                    [[r["value"], r["precision"], "yes" if r["passed"] else "no", r["reason"]] for r in out["results"]])
    if not out["passed"]:
        raise typer.Exit(EXIT_FAILED)


@dataclass
class _Row:
    """One construction of ``verify all``: its model, the mode it runs in (``chosen``), its options
    and what differs from the command's options (``note``)."""

    name: str
    model: Any
    chosen: str
    options: _Verification
    note: str | None


def _plan(name: str, model: Any, v: _Verification, n: int) -> _Row:
    """How ``verify all`` runs one construction: in --mode where the construction has it (exhaustive
    over the limit is refused before anything runs), else in its strongest mode; --samples and
    --seed for sampled rows only; at a smaller n than --n where the registration caps it. Every
    difference from the options is the row's note."""
    task, notes = task_of(model), []
    if model.n != n:
        notes.append(f"built at n = {model.n}, the largest `verify all` runs it at (it is verified by running it)")
    mode = v.mode
    if mode == "smt" and smt_refusal(model, v.arithmetic):
        notes.append(f"{smt_refusal(model, v.arithmetic)}: ran in its strongest mode")
        mode = None
    elif mode is not None and mode != "smt" and mode not in task.modes:
        notes.append(lacking_note(name, task, mode))
        mode = None
    elif mode == "certify" and certificate_refusal(model, v.arithmetic):
        notes.append(f"{certificate_refusal(model, v.arithmetic)}: ran in its strongest other mode")
        mode = None
    try:
        chosen, _ = choose_mode(task, model, mode, arithmetic=v.arithmetic)
    except VerifyError as e:
        _bad(e, v.json)
    sampled = chosen == "sample"
    options = replace(v, mode=mode, samples=v.samples if sampled else None, seed=v.seed if sampled else None,
                      search_seconds=v.search_seconds if chosen == "certify" else None)
    return _Row(name, model, chosen, options, "; ".join(notes) or None)


def lacking_note(name: str, task: Any, mode: str) -> str:
    """``verify all``'s note on a row whose construction does not have the --mode asked for."""
    return f"{lacks(name, mode)} (its modes: {' | '.join(task.modes)}): ran in its strongest"


def _verify_all(kw: dict[str, Any]) -> None:
    given = [o for o in ("workers", "scheduler") if kw.get(o) is not None]
    if given:
        fail(f"--{given[0]}: not with verify all (shard one construction's exhaustive or sample run)", kw["json"])
    v = _verify_args(kw)
    try:
        n = parse_int(kw["n"], "--n", "an integer or 2^k")
    except ArgumentError as e:
        fail(str(e), v.json)
    samples = ALL_SAMPLES if v.samples is None else v.samples
    with Steps(lines=not v.json) as steps:
        entries = [registry.get(name) for name in registry.names()]
        rows = [_plan(c.name, _construct(c, {"n": str(min(n, c.all_max_n or n))}, v.json, steps)[0],
                      replace(v, samples=samples), n) for c in entries]
        sampled = [r.name for r in rows if r.chosen == "sample"]
        given = [f"--{o}" for o in ("samples", "seed") if getattr(v, o) is not None]  # as typed, not ALL_SAMPLES
        if given and not sampled:
            fail(f"{' and '.join(given)}: only for sampled rows, and at n={n} no row is sampled", v.json)
        done = steps.overall(len(rows), "constructions")
        reports = []
        for r in rows:
            reports.append(_run(r.model, r.options, steps))
            if done:
                done(1)
    passed = all(rep.passed for rep in reports)
    if v.json:
        print_json({"n": n, "mode": v.mode, "samples": samples, "seed": v.seed or 0, "passed": passed,
                    "reports": [rep.to_dict() | {"name": r.name, "note": r.note} for r, rep in zip(rows, reports)]})
    else:
        table = [[r.name, rep.theorem.split(" (")[0], rep.layers, rep.heads, rep.width, rep.d_mlp, rep.precision,
                  rep.precision_bits, rep.size_bits, rep.mode + (" (see note)" if r.note else ""), inputs_text(rep),
                  "PASS" if rep.passed else "FAIL", f"{rep.seconds:.2f}"] for r, rep in zip(rows, reports)]
        print_table(f"exactformer: every construction at n = {n}",
                    ["construction", "theorem", "layers", "heads", "width", "MLP units", "precision", "bits",
                     "size (bits)", "mode", "inputs", "result", "seconds"], table)
        for r, rep in zip(rows, reports):
            if r.note or not rep.passed:
                typer.echo(f"{r.name}: {'; '.join(x for x in (r.note, None if rep.passed else rep.reason) if x)}")
    if not passed:
        raise typer.Exit(EXIT_FAILED)
