"""The arguments of a construction's builder, for ``xf.build`` and the command line alike.

One conversion per kind of value, used by both: the command line gives every value as text
(:func:`from_text`); Python gives values, of which a few may also be text (:func:`from_python`: a
JSON file for a list parameter such as ``features``, a format name for ``precision``). Then
:func:`build` checks the names against the builder's signature and calls it; the builder checks
the ranges, and its error names the parameter.

==========================  ====================================================================
annotation / name           text
==========================  ====================================================================
``int``                     ``4096``, ``0x10`` or ``2^12``
``Fraction``                ``1/4`` or ``0.25``
``Fraction | str``          a number as above, else the text (e.g. ``eta``: ``robust``)
``Format``                  ``binary:int=I,frac=F`` | ``paper:n=N,kc=K`` (``paper:kc=K``: N = n) | ``float64``
                            | ``float32``
``clauses`` / ``terms``     ``"1,-2;3,4"`` (:func:`~exactformer.constructions.theorems.boolean_tasks.parse_clauses`)
``list`` (e.g. features)    JSON text, or the name of a JSON file
``bool``                    a flag ``--name/--no-name`` (command line)
anything else               the text, validated by the builder
==========================  ====================================================================

Nothing here names a construction: a builder's parameters come from its signature, their
documentation from its numpy-style docstring (:func:`parameter_docs`).
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

from exactformer.constructions.core import registry
from exactformer.constructions.theorems.boolean_tasks import parse_clauses
from exactformer.precision import Format, parse_format


class ArgumentError(ValueError):
    """A value that does not convert: the message starts with the parameter's name (``features``)
    or, on the command line, its option (``--features``), and says what it allows."""


class BuildError(ArgumentError):
    """Arguments that the construction's builder does not take (or a missing required one)."""


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


def builder_parameters(c: registry.Construction) -> list[inspect.Parameter]:
    """The parameters of construction ``c``'s builder with their annotations evaluated (builders may
    use postponed annotations)."""
    hints = typing.get_type_hints(c.builder)
    return [p.replace(annotation=hints.get(p.name, p.annotation)) for p in c.parameters.values()]


# ---- conversions -------------------------------------------------------------------------------------------------


def _members(annotation: Any) -> tuple[Any, ...]:
    """The types of an annotation, ``X | Y | None`` -> (X, Y) (None dropped)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def _is_list(annotation: Any) -> bool:
    members = _members(annotation)
    return list in members or typing.get_origin(members[0]) is list


def parse_int(text: str, opt: str, doc: str) -> int:
    """An integer from ``4096``, ``0x10`` or ``2^12`` (``opt``: the option, for the error)."""
    t = text.strip().replace(" ", "")
    try:
        if re.fullmatch(r"2\^\d{1,3}", t):
            return 1 << int(t[2:])
        return int(t, 0)
    except ValueError:
        raise ArgumentError(f"{opt}: must be an integer ({doc}), got {text!r}") from None


def parse_seconds(text: str, opt: str, positive: bool = False) -> float:
    """A number of seconds >= 0 (``positive``: > 0) from ``10``, ``2.5`` or ``1/2`` (``opt``: the
    option, for the error)."""
    value = _fraction(text)
    if value is None or value < 0 or (positive and value == 0):
        raise ArgumentError(f"{opt}: must be a number of seconds {'> 0' if positive else '>= 0'}, got {text!r}")
    return float(value)


def _fraction(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        return None


def json_value(value: str | Path, name: str, doc: str) -> list:
    """The list in a JSON file, or in JSON text (``name``: the parameter or option, for errors): a
    file holding anything but a list (a JSON string, a number, an object) is refused saying what it holds."""
    path = Path(value)
    text, source = str(value), "the value"
    if path.is_file():
        try:
            text, source = path.read_text(), str(path)
        except OSError as e:
            raise ArgumentError(f"{name}: cannot read {str(path)!r}: {e.strerror}") from None
    elif isinstance(value, Path) or text.lstrip()[:1] not in ("[", "{"):
        raise ArgumentError(f"{name}: no such file {text!r} (give a JSON file or JSON text; {doc})")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ArgumentError(f"{name}: {source} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                            f"{doc}") from None
    if not isinstance(value, list):
        kind = {str: "a JSON string", dict: "a JSON object", bool: "a JSON boolean", type(None): "JSON null"}.get(
            type(value), "a JSON number")
        raise ArgumentError(f"{name}: {source} holds {kind} ({json.dumps(value)[:60]}), not a list; {doc}")
    return value


def _clauses(text: str, name: str, doc: str) -> list[list[int]]:
    """Literal lists from ``"1,-2;3,4"`` (``name``: the parameter, or its option on the command line)."""
    try:
        return parse_clauses(text, name.lstrip("-"))
    except ValueError as e:  # the message names the parameter; on the command line the option comes first
        raise ArgumentError(f"{name}: {e}" if name.startswith("--") else str(e)) from None


#: builder parameters whose text is parsed by name (values that are not scalars)
BY_NAME: dict[str, Callable[[str, str, str], Any]] = {"clauses": _clauses, "terms": _clauses}


def precision_format(text: str, n: int | None, name: str = "precision") -> Format:
    """A format from its name; ``paper:kc=K`` is App. B.2's grid for the given N (``name``: the
    parameter or option, for errors)."""
    m = re.fullmatch(r"paper:kc=(\d+)", text.strip())
    if m:
        if n is None:
            raise ArgumentError(f"{name}: paper:kc=K needs n (or write paper:n=N,kc=K)")
        text = f"paper:n={n},kc={m.group(1)}"
    try:
        return parse_format(text)
    except ValueError as e:
        paper = "; paper:kc=K is paper:n=N,kc=K at the given n" if text.strip().startswith("paper") else ""
        raise ArgumentError(f"{name}: {e}{paper}") from None


def from_text(param: inspect.Parameter, text: str, name: str, doc: str, n: int | None) -> Any:
    """The builder's value for ``param`` from command-line ``text`` (``name``: its option)."""
    if param.name in BY_NAME:
        return BY_NAME[param.name](text, name, doc)
    members = _members(param.annotation)
    if Format in members:
        return precision_format(text, n, name)
    if int in members:
        return parse_int(text, name, doc)
    if Fraction in members:
        value = _fraction(text)
        if value is not None:
            return value
        if str in members:
            return text
        raise ArgumentError(f"{name}: must be a number such as 1/4 or 0.25 ({doc}), got {text!r}")
    if _is_list(param.annotation):
        return json_value(text, name, doc)
    return text


def from_python(param: inspect.Parameter, value: Any, doc: str, n: Any) -> Any:
    """The builder's value for ``param`` from a Python value: text where the command line takes
    text for a value that is not text (``"1,-2;3,4"`` for clauses or terms, a JSON file or JSON text
    for a list, a format name with ``paper:kc=K`` for a format) is converted as there; everything
    else is the builder's to check."""
    if isinstance(value, str) and param.name in BY_NAME:
        return BY_NAME[param.name](value, param.name, doc)
    if isinstance(value, (str, Path)) and _is_list(param.annotation):
        return json_value(value, param.name, doc)
    if isinstance(value, str) and Format in _members(param.annotation):
        return precision_format(value, n if isinstance(n, int) else None, param.name)
    return value


# ---- building ------------------------------------------------------------------------------------------------------


def build(name: str | registry.Construction, args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
    """Call the builder of construction ``name`` (a registered name, or the registry's entry) with
    ``args`` and ``kwargs`` (its own parameter names): an argument it does not take (or a missing
    one) is a :class:`BuildError` naming its parameters; values are converted by :func:`from_python`."""
    c = name if isinstance(name, registry.Construction) else registry.get(name)
    name = c.name
    try:
        bound = inspect.signature(c.builder).bind(*args, **(kwargs or {}))
    except TypeError as e:
        raise BuildError(f"{name}: {e}; its parameters are {', '.join(c.parameters)}") from None
    docs = parameter_docs(c.builder)
    params = {p.name: p for p in builder_parameters(c)}
    n = bound.arguments.get("n")
    for key, value in bound.arguments.items():
        bound.arguments[key] = from_python(params[key], value, docs.get(key, ""), n)
    return c.builder(*bound.args, **bound.kwargs)
