"""Command-line options of a construction, derived from its builder.

Every parameter of a registered builder (:mod:`exactformer.constructions.registry`) becomes an
option ``--name`` (underscores as dashes) whose help is the parameter's line in the builder's
numpy-style docstring, so ``--help`` shows the allowed values the builder documents. Values arrive
as text and are converted by the parameter's annotation (and, for the few values that are not
scalars, by its name):

==========================  ====================================================================
annotation / name           command-line text
==========================  ====================================================================
``int``                     ``4096``, ``0x10`` or ``2^12``
``Fraction``                ``1/4`` or ``0.25``
``Fraction | str``          a number as above, else the text (e.g. ``eta``: ``one-hot``)
``Format``                  ``binary:int=I,frac=F`` | ``paper:n=N,kc=K`` (``paper:kc=K``: N = --n) | ``float64``
``clauses`` / ``terms``     ``"1,-2;3,4"`` (:func:`~exactformer.constructions.boolean_tasks.parse_clauses`)
``list`` (e.g. features)    JSON text, or the name of a JSON file
``bool``                    a flag ``--name/--no-name``
anything else               the text, validated by the builder
==========================  ====================================================================

The builder's ``seed`` (the position code's seed) is ``--code-seed``, because ``verify --seed``
seeds the sampled inputs. Nothing here names a construction: a new builder gets its options from
its signature and docstring.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from exactformer.constructions import registry
from exactformer.constructions.boolean_tasks import parse_clauses
from exactformer.precision import Format, parse_format

#: builder parameter -> option name, where the builder's name means something else on the command line
RENAMED = {"seed": "code_seed"}


class OptionError(ValueError):
    """A command-line value that does not parse (the message names the option and what it allows)."""


# ---- the docstring ---------------------------------------------------------------------------------------------


def parameter_docs(fn: Callable) -> dict[str, str]:
    """``name -> "text"`` from the ``Parameters`` section of a numpy-style docstring: the entry
    ``name : text`` with its indented continuation lines joined into one line."""
    lines = inspect.getdoc(fn).splitlines() if fn.__doc__ else []
    out: dict[str, str] = {}
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Parameters") + 2
    except StopIteration:
        return out
    current = None
    for line in lines[start:]:
        entry = re.match(r"(\w+) : (.*)", line)
        if entry:
            current = entry.group(1)
            out[current] = entry.group(2).strip()
        elif current is not None and line.startswith((" ", "\t")) and line.strip():
            out[current] += " " + line.strip()
        else:
            break
    return out


# ---- conversions -------------------------------------------------------------------------------------------------


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of an annotation, ``X | Y | None`` -> (X, Y) (None dropped)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def parse_int(text: str, opt: str, doc: str) -> int:
    t = text.strip().replace(" ", "")
    try:
        if re.fullmatch(r"2\^\d{1,3}", t):
            return 1 << int(t[2:])
        return int(t, 0)
    except ValueError:
        raise OptionError(f"{opt}: must be an integer ({doc}), got {text!r}") from None


def _fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None


def _json(text: str, opt: str, doc: str) -> Any:
    """The name of a JSON file, or JSON text."""
    path = Path(text)
    source = "the value"
    if path.is_file():
        try:
            text, source = path.read_text(), str(path)
        except OSError as e:
            raise OptionError(f"{opt}: cannot read {str(path)!r}: {e.strerror}") from None
    elif text.lstrip()[:1] not in ("[", "{"):
        raise OptionError(f"{opt}: no such file {text!r} (give a JSON file or JSON text; {doc})")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise OptionError(f"{opt}: {source} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                          f"{doc}") from None


def _clauses(text: str, opt: str, doc: str) -> list[list[int]]:
    try:
        return parse_clauses(text, opt.lstrip("-"))
    except ValueError as e:
        raise OptionError(f"{opt}: {e}") from None


#: builder parameters whose text is parsed by name (values that are not scalars)
BY_NAME: dict[str, Callable[[str, str, str], Any]] = {"clauses": _clauses, "terms": _clauses}


def precision_format(text: str, n: int | None, opt: str = "--precision") -> Format:
    """A format from its name; ``paper:kc=K`` is App. B.2's grid for the given N."""
    m = re.fullmatch(r"paper:kc=(\d+)", text.strip())
    if m:
        if n is None:
            raise OptionError(f"{opt}: paper:kc=K needs --n (or write paper:n=N,kc=K)")
        text = f"paper:n={n},kc={m.group(1)}"
    try:
        return parse_format(text)
    except ValueError as e:
        raise OptionError(f"{opt}: {e}; paper:kc=K is paper:n=N,kc=K at the given --n") from None


def convert(param: inspect.Parameter, text: str, doc: str, n: int | None) -> Any:
    """The builder's value for ``param`` from the command-line ``text``."""
    opt = option_flag(param.name)
    if param.name in BY_NAME:
        return BY_NAME[param.name](text, opt, doc)
    members = _members(param.annotation)
    if Format in members:
        return precision_format(text, n, opt)
    if int in members:
        return parse_int(text, opt, doc)
    if Fraction in members:
        value = _fraction(text)
        if value is not None:
            return value
        if str in members:
            return text
        raise OptionError(f"{opt}: must be a number such as 1/4 or 0.25 ({doc}), got {text!r}")
    if list in members or typing.get_origin(members[0]) is list:
        return _json(text, opt, doc)
    return text


# ---- options -------------------------------------------------------------------------------------------------------


def option_name(param: str) -> str:
    return RENAMED.get(param, param)


def option_flag(param: str) -> str:
    return "--" + option_name(param).replace("_", "-")


def _help(param: inspect.Parameter, doc: str) -> str:
    if param.default is not inspect.Parameter.empty and param.default is not None and "Default" not in doc:
        return f"{doc} Default: {param.default}."
    return doc


def builder_parameters(name: str) -> list[inspect.Parameter]:
    """The builder's parameters with their annotations evaluated (builders may use postponed
    annotations)."""
    c = registry.get(name)
    hints = typing.get_type_hints(c.builder)
    return [p.replace(annotation=hints.get(p.name, p.annotation)) for p in c.parameters.values()]


def construction_options(name: str) -> list[inspect.Parameter]:
    """Typer parameters (keyword-only, typer.Option defaults) for the builder of ``name``: text
    options (None: the builder's default), flags for ``bool`` parameters."""
    docs = parameter_docs(registry.get(name).builder)
    out = []
    for p in builder_parameters(name):
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        doc = docs.get(p.name, "(not documented by the builder)")
        flag = option_flag(p.name)
        if p.annotation is bool:
            flags = f"{flag}/--no-{flag[2:]}"
            opt = typer.Option(bool(p.default), flags, help=_help(p, doc))
            out.append(inspect.Parameter(option_name(p.name), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                         annotation=bool))
        else:
            opt = typer.Option(None, flag, help=_help(p, doc), metavar=option_name(p.name).upper(), show_default=False)
            out.append(inspect.Parameter(option_name(p.name), inspect.Parameter.KEYWORD_ONLY, default=opt,
                                         annotation=Optional[str]))
    return out


def builder_kwargs(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """Builder keywords from the options' values (``values``: option name -> text, bool or None;
    None leaves the builder's default). A required parameter without a value is an OptionError."""
    docs = parameter_docs(registry.get(name).builder)
    n_text = values.get("n")
    n = parse_int(n_text, "--n", docs.get("n", "")) if isinstance(n_text, str) else None
    out: dict[str, Any] = {}
    for p in builder_parameters(name):
        value = values.get(option_name(p.name))
        doc = docs.get(p.name, "")
        if value is None:
            if p.default is inspect.Parameter.empty:
                raise OptionError(f"{option_flag(p.name)} is required: {doc}")
            continue
        out[p.name] = value if isinstance(value, bool) else convert(p, value, doc, n)
    return out


def command(params: list[inspect.Parameter], run: Callable[[dict[str, Any]], None], doc: str) -> Callable[..., None]:
    """A function typer can register: its signature is ``params``, it calls ``run(kwargs)``."""

    def cmd(**kwargs: Any) -> None:
        run(kwargs)

    cmd.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    cmd.__annotations__ = {p.name: p.annotation for p in params}
    cmd.__doc__ = doc
    return cmd
