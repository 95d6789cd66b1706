"""The ``exactformer`` command line (docs/cli.md), built on the API (``xf.build``, ``xf.verify``,
``xf.save``, ``xf.load``).

``build <construction>`` and ``verify <construction>`` take their construction options from the
builder's signature and docstring (:mod:`exactformer.cli.options`): the subcommands are read from
the registry when asked for, so a new construction needs no edit here, and an option that a
construction does not have is refused. ``verify DIR`` verifies a saved model, ``verify all`` every
registered construction. The commands themselves (:mod:`exactformer.cli.commands`,
``positions``, ``sizes``, ``attention``) are imported when they are resolved, so that
``exactformer --help`` starts in a fraction of a second. Output conventions (errors, JSON, exit
codes, progress): :mod:`exactformer.cli.output`.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from typer.core import TyperGroup

try:  # typer >= 0.29 carries its own copy of click; its exceptions are not click's
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as click_errors

from exactformer.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, report_error

TARGET = "<construction|DIR|all>"
#: what ``build`` and ``verify`` need as their first argument, for the error without one
TARGETS = {"build": "a construction", "verify": "a construction, all, or a DIR written by `exactformer build`"}
#: commands besides build and verify: (module, function, help), imported when resolved
OTHER_COMMANDS = {
    "positions": ("exactformer.cli.positions", "positions",
                  "Near-orthogonal position codes (Lemma 2, Cor. 8.1, App. B.3)."),
    "sizes": ("exactformer.cli.sizes", "sizes", "Built sizes against the papers' lower bounds (tables, JSON, CSV, plots)."),
    "attention": ("exactformer.cli.attention", "attention",
                  "EMA, ANNA (LSH, Alg. 1) or dense attention on generated data, checked."),
    "frontier": ("exactformer.cli.frontier", "frontier",
                 "The precision frontier: the largest certified N per construction and arithmetic (dask)."),
    "mpc": ("exactformer.cli.mpc", "mpc",
            "P2 Thms 4.2 and 4.4: ANNA and low-rank attention simulated through MPC protocols, checked."),
}


def _commands() -> Any:
    return importlib.import_module("exactformer.cli.commands")


def _names() -> list[str]:
    from exactformer.constructions.core import registry

    return registry.names()


def _resolve(name: str) -> Any | None:
    """The registered construction ``name`` (the registry's entry, passed down to the command), or None."""
    from exactformer.constructions.core import registry

    try:
        return registry.get(name)
    except registry.UnknownConstruction:
        return None


def _import_modules(ctx: typer.Context, param: Any, modules: list[str] | None) -> list[str]:
    """``--module``: import each module of constructions (a dotted name or a .py file) before the
    subcommand is resolved, so that the constructions it registers are commands."""
    from exactformer.constructions.core import registry

    for module in modules or ():
        try:
            registry.import_code(module)
        except ImportError as e:
            raise click_errors.BadParameter(str(e), ctx, param) from None
    return list(modules or ())


#: the groups' ``--module`` option (an option's callback runs while the group's options are parsed,
#: before the subcommand is looked up)
_MODULE_HELP = ("import a module of constructions of one's own first: a dotted module name or a .py file (repeatable; "
                "installed packages register theirs through the entry-point group exactformer.constructions)")


def _group(module: Optional[List[str]] = typer.Option(None, "--module", metavar="MODULE", help=_MODULE_HELP,
                                                      callback=_import_modules, is_eager=True)) -> None:
    """The build and verify groups' own options (``--module``)."""


class _Root(TyperGroup):
    """Click's usage errors (unknown option, bad integer ...) as one line ``error: ...`` (exit 2,
    ``{"error": ...}`` on stdout under --json), like every other bad input; the commands of
    :data:`OTHER_COMMANDS` imported when resolved."""

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        _refuse_cuda_early(argv)
        try:
            code = super().main(argv, prog_name or "exactformer", complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as e:
            if e.ctx.parent is not None:  # `build` or `verify` without its target: bad input, not a help request
                report_error(f"{e.ctx.command_path}: a target is required: {TARGETS[e.ctx.info_name]}; "
                             f"`{e.ctx.command_path} --help` lists them", "--json" in argv)
                sys.exit(EXIT_BAD_INPUT)
            e.show()
            sys.exit(0)
        except click_errors.ClickException as e:
            report_error(_usage_message(e), "--json" in argv)
            sys.exit(EXIT_BAD_INPUT)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(EXIT_FAILED)
        sys.exit(code if isinstance(code, int) else 0)

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*super().list_commands(ctx), *OTHER_COMMANDS]

    def get_command(self, ctx: typer.Context, name: str) -> Any | None:
        if name in OTHER_COMMANDS:
            module, fn, text = OTHER_COMMANDS[name]
            return _commands().typer_command(name, getattr(importlib.import_module(module), fn), text, text)
        return super().get_command(ctx, name)

    def format_commands(self, ctx: typer.Context, formatter: Any) -> None:
        """The commands and their short help, without importing the lazily resolved ones."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(name) for name in names)  # as click's own listing
        rows = [(name, self.commands[name].get_short_help_str(limit)) for name in super().list_commands(ctx)]
        rows += [(name, text) for name, (_, _, text) in OTHER_COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _refuse_cuda_early(argv: list[str]) -> None:
    """``--device cuda`` on a machine without CUDA, refused before the command's modules (and torch)
    are imported: the same line the command's own check prints, in a fraction of a second."""
    asked = any(a == "--device=cuda" or (a == "--device" and b == "cuda") for a, b in zip(argv, argv[1:] + [""]))
    if not asked or "--help" in argv or not argv or argv[0] not in ("verify", "positions", "attention"):
        return
    from exactformer.precision import NO_CUDA, cuda_available

    if not cuda_available():
        report_error(f"--device: {NO_CUDA}", "--json" in argv)
        sys.exit(EXIT_BAD_INPUT)


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


class _BuildGroup(TyperGroup):
    """One subcommand per registered construction, read from the registry when asked."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return _names()

    def get_command(self, ctx: typer.Context, name: str) -> Any | None:
        c = _resolve(name)
        return None if c is None else _commands().build_command(c)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any | None, list[str]]:
        if args and self.get_command(ctx, args[0]) is None:
            raise click_errors.UsageError(f"{args[0]!r} is not a construction; one of {', '.join(_names())}", ctx)
        return super().resolve_command(ctx, args)


class _VerifyGroup(TyperGroup):
    """``verify <construction>`` (one subcommand per registered construction), ``verify all``, and
    ``verify DIR`` for any other argument."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return [*_names(), "all"]

    def get_command(self, ctx: typer.Context, name: str) -> Any | None:
        c = "all" if name == "all" else _resolve(name)
        return None if c is None else _commands().verify_command(c)

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any | None, list[str]]:
        if args and not args[0].startswith("-") and self.get_command(ctx, args[0]) is None:
            path = args[0]
            if not Path(path).is_dir():
                what = "not a directory" if Path(path).exists() else "no such construction or directory"
                raise click_errors.UsageError(f"{path}: {what}; the target is a construction "
                                              f"({', '.join(_names())}), all, or a DIR written by "
                                              "`exactformer build`", ctx)
            return path, _commands().dir_command(path), args[1:]
        return super().resolve_command(ctx, args)

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        """``verify --help``: the group's options and targets, then the verification options that
        every target takes (those of ``verify DIR``)."""
        super().format_options(ctx, formatter)
        with formatter.section("Verification options (after the target, for every target)"):
            formatter.write_dl([p.get_help_record(ctx) for p in _commands().dir_command("DIR").params])


app = typer.Typer(cls=_Root, add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Build, run and verify proven transformer constructions exactly (docs/cli.md). "
                       "Exit codes: 0 passed, 1 verification failed, 2 bad input.")
app.add_typer(typer.Typer(cls=_BuildGroup, no_args_is_help=True, rich_markup_mode=None, callback=_group,
                          subcommand_metavar="<construction> [OPTIONS]"), name="build",
              help="Build a construction and write DIR/manifest.json, DIR/model.exact.safetensors and "
                   "(unless --compact) DIR/model.safetensors. `exactformer build <construction> --help` "
                   "lists its options.")
app.add_typer(typer.Typer(cls=_VerifyGroup, no_args_is_help=True, rich_markup_mode=None, callback=_group,
                          subcommand_metavar=f"{TARGET} [OPTIONS]"), name="verify",
              help="Verify a construction by name (built from the options), a saved model (DIR written by "
                   "`exactformer build`), or `all` registered constructions. Exit 1 if verification fails.")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
