"""Command-line options of a construction, derived from its builder.

Every parameter of a registered builder (:mod:`exactformer.constructions.core.registry`) becomes an
option ``--name`` (underscores as dashes) whose help is the parameter's line in the builder's
numpy-style docstring, so ``--help`` shows the allowed values the builder documents (a
parenthesis ``(Python: ...)`` there describes a value only Python can give and is left out).
Values arrive as text and are converted by :func:`exactformer.arguments.from_text`, the
conversions ``xf.build`` uses for text too (the table is in that module).

The builder's ``seed`` (the position code's seed) is ``--code-seed``, because ``verify --seed``
seeds the sampled inputs. Nothing here names a construction: a new builder gets its options from
its signature and docstring.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Optional

import typer

from exactformer.constructions.core import registry
from exactformer.arguments import ArgumentError, builder_parameters, from_text, parameter_docs, parse_int

#: builder parameter -> option name, where the builder's name means something else on the command line
RENAMED = {"seed": "code_seed"}

PYTHON_ONLY = re.compile(r"\s*\(Python: [^)]*\)")  # a value the command line cannot give


def option_name(param: str) -> str:
    return RENAMED.get(param, param)


def option_flag(param: str) -> str:
    return "--" + option_name(param).replace("_", "-")


def option_help(param: inspect.Parameter, doc: str) -> str:
    """The option's help: the builder's documentation of the parameter without Python-only values,
    and its default where the documentation does not state one."""
    doc = PYTHON_ONLY.sub("", doc)
    if param.default is not inspect.Parameter.empty and param.default is not None and "Default" not in doc:
        return f"{doc} Default: {param.default}."
    return doc


def construction_options(c: registry.Construction) -> list[inspect.Parameter]:
    """Typer parameters (keyword-only, typer.Option defaults) for the builder of construction ``c``:
    text options (None: the builder's default), flags for ``bool`` parameters."""
    docs = parameter_docs(c.builder)
    out = []
    for p in builder_parameters(c):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        doc = docs.get(p.name, "(not documented by the builder)")
        flag = option_flag(p.name)
        if p.annotation is bool:
            flags = f"{flag}/--no-{flag[2:]}"
            opt = typer.Option(bool(p.default), flags, help=option_help(p, doc))
            out.append(inspect.Parameter(option_name(p.name), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                         annotation=bool))
        else:
            opt = typer.Option(None, flag, help=option_help(p, doc), metavar=option_name(p.name).upper(),
                               show_default=False)
            out.append(inspect.Parameter(option_name(p.name), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                         annotation=Optional[str]))
    return out


def builder_kwargs(c: registry.Construction, values: dict[str, Any]) -> dict[str, Any]:
    """Builder keywords of construction ``c`` from the options' values (``values``: option name ->
    text, bool or None; None leaves the builder's default). A required parameter without a value is
    an ArgumentError."""
    docs = parameter_docs(c.builder)
    n_text = values.get("n")
    n = parse_int(n_text, "--n", docs.get("n", "")) if isinstance(n_text, str) else None
    out: dict[str, Any] = {}
    for p in builder_parameters(c):
        value = values.get(option_name(p.name))
        doc = docs.get(p.name, "")
        if value is None:
            if p.default is inspect.Parameter.empty:
                raise ArgumentError(f"{option_flag(p.name)} is required: {doc}")
            continue
        out[p.name] = value if isinstance(value, bool) else from_text(p, value, option_flag(p.name), doc, n)
    return out


def command(params: list[inspect.Parameter], run: Callable[[dict[str, Any]], None], doc: str) -> Callable[..., None]:
    """A function typer can register: its signature is ``params``, it calls ``run(kwargs)``."""

    def cmd(**kwargs: Any) -> None:
        run(kwargs)

    cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cmd.__annotations__ = {p.name: p.annotation for p in params}
    cmd.__doc__ = doc
    return cmd
