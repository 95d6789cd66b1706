"""The ``exactformer`` command line (docs/cli.md).

``build <construction>`` and ``verify <construction>`` take their construction options from the
builder's signature and docstring (:mod:`exactformer.verify.cli_options`): the subcommands are
read from the registry when asked for, so a new construction needs no edit here, and an option
that a construction does not have is refused. ``verify DIR`` verifies a saved model, ``verify all``
every registered construction. Output conventions (errors, JSON, exit codes, progress):
:mod:`exactformer.verify.cli_output`.
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer
from typer.core import TyperGroup

try:  # typer >= 0.29 carries its own copy of click; its exceptions are not click's
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_errors

from exactformer.constructions import registry
from exactformer.constructions.export import ManifestError, load, save
from exactformer.constructions.ir import CompiledModel
from exactformer.verify.cli_options import OptionError, builder_kwargs, command, construction_options, parse_int
from exactformer.verify.cli_output import EXIT_BAD_INPUT, EXIT_FAILED, Steps, fail, print_json, print_table, report_error
from exactformer.verify.precision_scan import find_min_precision
from exactformer.verify.verifier import (ARITHMETICS, COUNTS_MEANING, EXHAUSTIVE_LIMIT, MODES, Report, VerifyError,
                                         certified_arithmetics)
from exactformer.verify.verifier import verify as run_verify

DEFAULT_N = 4096  # verify all
DEFAULT_SAMPLES = 1000
TARGET = "<construction|DIR|all>"


# ------------------------------------------------------------------------------------------------
# the command groups
# ------------------------------------------------------------------------------------------------


class _Root(TyperGroup):
    """Click's usage errors (unknown option, bad integer ...) as one line ``error: ...`` (exit 2,
    ``{"error": ...}`` on stdout under --json), like every other bad input."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name or "exactformer", complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as e:
            e.show()
            sys.exit(0)
        except click_errors.ClickException as e:
            report_error(_usage_message(e), "--json" in argv)
            sys.exit(EXIT_BAD_INPUT)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(code if isinstance(code, int) else 0)


def _usage_message(e: Exception) -> str:
    msg = e.format_message()
    ctx = getattr(e, "ctx", None)
    if ctx is None:
        return msg
    if isinstance(e, click_errors.NoSuchOption):
        opts = [o for p in ctx.command.params if p.param_type_name == "option" for o in p.opts + p.secondary_opts
                if o.startswith("--")]
        msg = f"{e.option_name}: no such option for `{ctx.command_path}`; its options: {', '.join(opts)}"
    return f"{ctx.command_path}: {msg}"


def _typer_command(name: str, fn: Any, help: str, short_help: str | None = None) -> Any:
    t = typer.Typer(rich_markup_mode=None, add_completion=False)
    t.command(name, help=help, short_help=short_help)(fn)
    cmd = typer.main.get_command(t)
    cmd.name = name
    return cmd


def _help(name: str) -> str:
    c = registry.get(name)
    first = (inspect.getdoc(c.builder) or "").split("\n\n")[0].replace("\n", " ")
    return f"{first} ({c.theorem})"


class _BuildGroup(TyperGroup):
    """One subcommand per registered construction, read from the registry when asked."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return registry.names()

    def get_command(self, ctx: typer.Context, name: str) -> Any | None:
        if name not in registry.names():
            return None
        return _typer_command(name, command(construction_options(name) + _BUILD_OPTIONS,
                                            lambda kw: _build(name, kw), ""), _help(name),
                              registry.get(name).theorem)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any | None, list[str]]:
        if args and self.get_command(ctx, args[0]) is None:
            raise click_errors.UsageError(f"{args[0]!r} is not a construction; one of {', '.join(registry.names())}", ctx)
        return super().resolve_command(ctx, args)


class _VerifyGroup(TyperGroup):
    """``verify <construction>`` (one subcommand per registered construction), ``verify all``, and
    ``verify DIR`` for any other argument."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*registry.names(), "all"]

    def get_command(self, ctx: typer.Context, name: str) -> Any | None:
        if name == "all":
            return _typer_command("all", command(_ALL_OPTIONS, _verify_all, ""), _ALL_HELP, "every construction, one table")
        if name not in registry.names():
            return None
        opts = construction_options(name) + _VERIFY_OPTIONS + _FIND_MIN
        return _typer_command(name, command(opts, lambda kw: _verify_named(name, kw), ""), _help(name),
                              registry.get(name).theorem)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any | None, list[str]]:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            path = args[0]
            if not Path(path).is_dir():
                what = "not a directory" if Path(path).exists() else "no such construction or directory"
                raise click_errors.UsageError(f"{path}: {what}; the target is a construction "
                                              f"({', '.join(registry.names())}), all, or a DIR written by "
                                              "`exactformer build`", ctx)
            cmd = _typer_command(path, command(_VERIFY_OPTIONS, lambda kw: _verify_dir(path, kw), ""), _DIR_HELP)
            return path, cmd, args[1:]
        return super().resolve_command(ctx, args)


app = typer.Typer(cls=_Root, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Build, run and verify proven transformer constructions exactly (docs/cli.md). "
                       "Exit codes: 0 passed, 1 verification failed, 2 bad input.")
app.add_typer(typer.Typer(cls=_BuildGroup, no_args_is_help=True, rich_markup_mode=None,
                          subcommand_metavar="<construction> [OPTIONS]"), name="build",
              help="Build a construction and write DIR/manifest.json, DIR/model.exact.safetensors and "
                   "(unless --compact) DIR/model.safetensors. `exactformer build <construction> --help` "
                   "lists its options.")
app.add_typer(typer.Typer(cls=_VerifyGroup, no_args_is_help=True, rich_markup_mode=None,
                          subcommand_metavar=f"{TARGET} [OPTIONS]"), name="verify",
              help="Verify a construction by name (built from the options), a saved model (DIR written by "
                   "`exactformer build`), or `all` registered constructions. Exit 1 if verification fails.")


def _register_other_commands() -> None:
    from exactformer.verify.cli_attention import attention
    from exactformer.verify.cli_positions import positions
    from exactformer.verify.cli_sizes import sizes

    for name, fn, text in (
            ("positions", positions, "Near-orthogonal position codes (Lemma 2, Cor. 8.1, App. B.3)."),
            ("sizes", sizes, "Built sizes against the papers' lower bounds (tables, JSON, CSV, plots)."),
            ("attention", attention, "EMA, ANNA (LSH, Alg. 1) or dense attention on generated data, checked.")):
        app.command(name, help=text, short_help=text)(fn)


_register_other_commands()


# ------------------------------------------------------------------------------------------------
# options shared by the commands
# ------------------------------------------------------------------------------------------------


def _opt(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_JSON = _opt("json", bool, typer.Option(False, "--json", help="print one JSON object on stdout (schema: docs/cli.md)"))
_BUILD_OPTIONS = [
    _opt("out", Optional[Path], typer.Option(None, "--out", metavar="DIR", show_default=False,
                                             help="the directory to write (created if missing). Required.")),
    _opt("compact", bool, typer.Option(False, "--compact", help="leave out the float file's embeddings: they are "
                                                                "generated from the position codes on load (docs/exports.md)")),
    _JSON,
]
_VERIFY_OPTIONS = [
    _opt("mode", Optional[str], typer.Option(None, "--mode", metavar="MODE", show_default=False,
                                             help="certify (a proof for every input; the default) | exhaustive (every "
                                                  f"input run, at most {EXHAUSTIVE_LIMIT} inputs) | sample")),
    _opt("samples", Optional[str], typer.Option(None, "--samples", metavar="COUNT", show_default=False,
                                                help=f"--mode sample: random inputs (plus as many adversarial ones), "
                                                     f">= 1. Default: {DEFAULT_SAMPLES}.")),
    _opt("seed", Optional[str], typer.Option(None, "--seed", metavar="SEED", show_default=False,
                                             help="--mode sample: seed of the random inputs (the adversarial ones use "
                                                  "seed + 1). Default: 0.")),
    _opt("device", str, typer.Option("cpu", "--device", metavar="DEVICE", help="cpu | cuda: where the executor runs")),
    _opt("arithmetic", Optional[str], typer.Option(
        None, "--arithmetic", metavar="ARITH", show_default=False,
        help=f"{' | '.join(ARITHMETICS)}: fixed (the default) runs the exact executor in the model's fixed-point "
             "format; float32 / float64 check the exported torch forward pass (certify: rigorous float error bounds), "
             "real the exact real-number forward pass")),
    _JSON,
]
_FIND_MIN = [
    _opt("find_min_precision", bool, typer.Option(
        False, "--find-min-precision", help="instead of verifying: the smallest precision that certifies, scanning "
                                            "upward (see --scan); exit 1 if none up to the top of the scan does")),
    _opt("scan", Optional[str], typer.Option(
        None, "--scan", metavar="KIND", show_default=False,
        help="with --find-min-precision: binary (frac bits 1..24 at int=6; the default) | paper (kc 1..4 of App. B.2)")),
]
_ALL_OPTIONS = [
    _opt("n", str, typer.Option(str(DEFAULT_N), "--n", metavar="N", help="input length N of every construction "
                                                                          "(an integer or 2^k)")),
    *_VERIFY_OPTIONS,
]
_ALL_HELP = ("Build every registered construction at --n with its builder's defaults, verify each (certify: falls "
             "back to sampling, stated in the row, only where no certificate exists) and print one table; exit 1 if "
             "any fails.")
_DIR_HELP = "Verify the model saved in this directory (by `exactformer build`), at the precision it was built for."


def _verify_args(kw: dict[str, Any]) -> tuple[str, int, int, str, bool]:
    """(mode, samples, seed, device, json) from the verification options, refusing what does not apply;
    ``kw["arithmetic"]`` is checked and left in ``kw``."""
    as_json = kw["json"]
    kw["arithmetic"] = kw.get("arithmetic") or "fixed"
    if kw["arithmetic"] not in ARITHMETICS:
        fail(f"--arithmetic must be one of {' | '.join(ARITHMETICS)}, got {kw['arithmetic']!r}", as_json)
    mode = kw["mode"] or "certify"
    if mode not in MODES:
        fail(f"--mode must be one of {' | '.join(MODES)}, got {mode!r}", as_json)
    if mode != "sample":
        given = [o for o in ("samples", "seed") if kw[o] is not None]
        if given:
            fail(f"--{' and --'.join(given)}: only with --mode sample ({mode} covers every input)", as_json)
    try:
        samples = DEFAULT_SAMPLES if kw["samples"] is None else parse_int(kw["samples"], "--samples", ">= 1")
        seed = 0 if kw["seed"] is None else parse_int(kw["seed"], "--seed", ">= 0")
    except OptionError as e:
        fail(str(e), as_json)
    if samples < 1 or seed < 0:
        fail(f"--samples must be >= 1 and --seed >= 0, got {samples} and {seed}", as_json)
    device = kw["device"]
    if device not in ("cpu", "cuda"):
        fail(f"--device must be cpu or cuda, got {device!r}", as_json)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda: no CUDA device is available (use --device cpu)", as_json)
    return mode, samples, seed, device, as_json


# ------------------------------------------------------------------------------------------------
# build
# ------------------------------------------------------------------------------------------------


def _construct(name: str, kw: dict[str, Any], as_json: bool, steps: Steps) -> tuple[CompiledModel, dict[str, Any]]:
    """The model built from its command-line options (and the builder keywords used)."""
    try:
        kwargs = builder_kwargs(name, kw)
        steps.step(f"build {name} n={kwargs['n']}")
        return registry.get(name).builder(**kwargs), kwargs
    except ValueError as e:
        fail(f"{name}: {e}" if not isinstance(e, OptionError) else str(e), as_json)


def _build(name: str, kw: dict[str, Any]) -> None:
    as_json, out, compact = kw.pop("json"), kw.pop("out"), kw.pop("compact")
    if out is None:
        fail("--out is required: the directory to write (created if missing)", as_json)
    if out.exists() and not out.is_dir():
        fail(f"--out: {str(out)!r} exists and is not a directory", as_json)
    with Steps(lines=not as_json) as steps:
        model, _ = _construct(name, kw, as_json, steps)
        if not isinstance(model, CompiledModel):  # an EMA program (P2 Thm 4.1): no weights to write
            fail(f"{name} builds an EMA program, which has no weight files; run it with `exactformer verify {name}` "
                 f"or xf.build({name!r}, ...)", as_json)
        steps.step(f"certify {name} n={model.n} in {model.precision}, float64 and float32 (for the manifest)")
        certified = certified_arithmetics(model)
        steps.step(f"write {out}")
        try:
            path = save(model, out, dense=not compact, certified_arithmetics=certified)
        except (ValueError, OSError) as e:
            fail(f"--out {str(out)!r}: {e}", as_json)
    summary = model.summary() | {"out": str(path), "files": sorted(p.name for p in path.iterdir() if p.is_file()),
                                 "certified_arithmetics": certified}
    if as_json:
        print_json(summary)
        return
    rows = [[k, summary[k], ""] for k in ("n", "layers", "heads", "d_model", "d_head", "d_mlp", "width", "parameters",
                                          "precision")]
    rows += [[k, p["value"], p["formula"]] for k, p in summary["params"].items()]
    rows.append(["certified in", ", ".join(certified["certified"]) or "none",
                 "not certified: " + (", ".join(certified["not_certified"]) or "none")])
    rows.append(["out", summary["out"], ", ".join(summary["files"])])
    print_table(f"{summary['construction']} ({summary['theorem']})", ["quantity", "value", "formula"], rows)


# ------------------------------------------------------------------------------------------------
# verify
# ------------------------------------------------------------------------------------------------


def _run(model: CompiledModel, mode: str, samples: int, seed: int, device: str, as_json: bool, steps: Steps,
         arithmetic: str = "fixed") -> Report:
    """Verify with progress: certificate steps, or a bar over the inputs."""
    what = f"{mode} {model.construction} n={model.n}" + ("" if arithmetic == "fixed" else f" in {arithmetic}")
    steps.step(what)
    total = registry.task_of(model).count(model) if mode == "exhaustive" else 2 * samples
    progress = steps.bar(total, "inputs") if mode != "certify" else None
    try:
        return run_verify(model, mode=mode, samples=samples, seed=seed, device=device, progress=progress,
                          phase=lambda name: steps.step(f"{what}: {name}"), arithmetic=arithmetic)
    except VerifyError as e:
        fail(str(e), as_json)


def _verify_named(name: str, kw: dict[str, Any]) -> None:
    find, scan = kw.pop("find_min_precision"), kw.pop("scan")
    mode, samples, seed, device, as_json = _verify_args(kw)
    if find:
        given = [f"--{o}" for o in ("mode", "samples", "seed", "precision") if kw.get(o) is not None]
        if given:
            fail(f"--find-min-precision certifies at each precision it scans: {', '.join(given)} do not apply", as_json)
        scan = scan or "binary"
        if scan not in ("binary", "paper"):
            fail(f"--scan must be binary or paper, got {scan!r}", as_json)
    elif scan is not None:
        fail("--scan: only with --find-min-precision", as_json)
    arithmetic = kw.pop("arithmetic")
    if find and arithmetic != "fixed":
        fail("--arithmetic: --find-min-precision scans fixed-point formats only", as_json)
    for o in ("mode", "samples", "seed", "device", "json"):
        kw.pop(o)
    with Steps(lines=not as_json) as steps:
        model, kwargs = _construct(name, kw, as_json, steps)
        if find:
            steps.step(f"scan {scan} precisions of {name} n={model.n}")
            scanned = _find_min(name, model, kwargs, scan, device)
        else:
            report = _run(model, mode, samples, seed, device, as_json, steps, arithmetic)
    if find:
        _emit_scan(scanned, as_json)
    else:
        _emit_report(report, as_json)


def _verify_dir(path: str, kw: dict[str, Any]) -> None:
    mode, samples, seed, device, as_json = _verify_args(kw)
    with Steps(lines=not as_json) as steps:
        steps.step(f"load {path}")
        try:
            model = load(path)
        except (ManifestError, ValueError, OSError) as e:
            fail(f"{path}: {e}", as_json)
        report = _run(model, mode, samples, seed, device, as_json, steps, kw["arithmetic"])
    _emit_report(report, as_json)


def _counts_rows(counts: dict[str, int]) -> list[list[Any]]:
    return [[key, f"{val}: {COUNTS_MEANING.get(key, '')}"] for key, val in counts.items()]


def _emit_report(report: Report, as_json: bool) -> None:
    d = report.to_dict()
    if as_json:
        print_json(d)
    else:
        rows = [["result", "PASS" if d["passed"] else "FAIL"], ["reason", d["reason"]]]
        rows += [[k, d[k]] for k in ("theorem", "inputs_covered", "seed", "precision", "precision_bits", "eta",
                                     "eta_paper", "k", "layers", "heads", "width", "size_bits", "min_margin")]
        rows += _counts_rows(d["counts"])
        if d["counterexample"]:
            rows.append(["counterexample", json.dumps(d["counterexample"], default=str)])
        rows += [[f"details: {k}", v] for k, v in d["details"].items()]
        rows.append(["seconds", round(d["seconds"], 3)])
        print_table(f"verify {d['construction']} n={d['n']} ({d['mode']})", ["field", "value"], rows)
    if not report.passed:
        raise typer.Exit(EXIT_FAILED)


def _find_min(name: str, model: CompiledModel, kwargs: dict[str, Any], kind: str, device: str) -> dict[str, Any]:
    """The precision scan (:func:`~exactformer.verify.precision_scan.find_min_precision`) as the
    command's JSON object."""
    builder = registry.get(name).builder
    t0 = time.perf_counter()
    res = find_min_precision(lambda fmt: builder(**(kwargs | {"precision": fmt})), kind=kind, n=model.n, device=device)
    return {"construction": name, "theorem": model.theorem, "n": model.n, "mode": "find-min-precision", "kind": kind,
            "passed": res.value is not None, "min_value": res.value, "precision": res.format,
            "passing": res.passing, "checked_up_to": res.checked_up_to,
            "results": [{"value": v, "precision": r["format"], "passed": r["passed"], "reason": r["reason"]}
                        for v, r in res.results.items()],
            "seconds": time.perf_counter() - t0}


def _emit_scan(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(out)
    else:
        what = "frac bits (int=6)" if out["kind"] == "binary" else "kc"
        print_table(f"smallest precision of {out['construction']} n={out['n']}: {out['precision'] or 'none found'}",
                    [what, "precision", "certified", "reason"],
                    [[r["value"], r["precision"], "yes" if r["passed"] else "no", r["reason"]] for r in out["results"]])
    if not out["passed"]:
        raise typer.Exit(EXIT_FAILED)


def _verify_all(kw: dict[str, Any]) -> None:
    mode, samples, seed, device, as_json = _verify_args(kw)
    try:
        n = parse_int(kw["n"], "--n", "an integer or 2^k")
    except OptionError as e:
        fail(str(e), as_json)
    names = registry.names()
    rows: list[tuple[str, Report, str | None]] = []
    with Steps(lines=not as_json) as steps:
        models = []
        for name in names:
            model, _ = _construct(name, {"n": str(n)}, as_json, steps)
            count = registry.task_of(model).count(model)
            if mode == "exhaustive" and count > EXHAUSTIVE_LIMIT:
                fail(f"--mode exhaustive: {name} at n={n} has {count} inputs, above the limit of {EXHAUSTIVE_LIMIT}; "
                     "use a smaller --n, --mode certify or --mode sample", as_json)
            models.append(model)
        done = steps.overall(len(models), "constructions")
        for name, model in zip(names, models):
            arithmetic, note = kw["arithmetic"], None
            if not isinstance(model, CompiledModel) and arithmetic != "fixed":
                arithmetic, note = "fixed", f"an EMA program has no float forward pass: checked in exact arithmetic, not {arithmetic}"
            report = _run(model, mode, samples, seed, device, as_json, steps, arithmetic)
            if mode == "certify" and not report.passed and report.counterexample is None:
                # no certificate for this model (and no counterexample): evidence by sampling, said so
                note = f"no certificate ({report.reason}); sampled instead"
                report = _run(model, "sample", samples, seed, device, as_json, steps, arithmetic)
            rows.append((name, report, note))
            if done:
                done(1)
    passed = all(r.passed for _, r, _ in rows)
    if as_json:
        print_json({"n": n, "mode": mode, "passed": passed,
                    "reports": [r.to_dict() | {"name": name, "note": note} for name, r, note in rows]})
    else:
        table = [[name, r.theorem.split(" (")[0], r.layers, r.heads, r.width, r.precision, r.precision_bits,
                  r.size_bits, r.mode + (" (no certificate)" if note else ""), r.inputs_covered,
                  "PASS" if r.passed else "FAIL", f"{r.seconds:.2f}"] for name, r, note in rows]
        print_table(f"exactformer: every construction at n = {n}",
                    ["construction", "theorem", "layers", "heads", "width", "precision", "bits", "size (bits)", "mode",
                     "inputs", "result", "seconds"], table)
        for name, r, note in rows:
            if note or not r.passed:
                typer.echo(f"{name}: {note or r.reason}")
    if not passed:
        raise typer.Exit(EXIT_FAILED)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
