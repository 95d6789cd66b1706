"""Every field of a built model, and mutants that change one field at a time.

The field-coverage test (tests/test_field_coverage.py) walks a model (:func:`leaves`): every
dataclass field, list and tuple element, dict entry and attribute of the objects the model holds
(position codes, plan blocks), down to the leaves -- exact tensors, arrays, numbers, flags,
strings. Nothing is listed by hand, so a field added later is walked, mutated and checked
by construction. :func:`mutants` gives, for each leaf, the models that differ from the original in
that leaf only; :func:`family` names a leaf's path without indices, the key of the table of fields in
docs/architecture.md ("What a model is").
"""

from __future__ import annotations

import copy
import dataclasses
import re
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.core.ir import ExactTensor
from exactformer.precision import parse_format

Path = tuple[Any, ...]  # attribute names (str), sequence indices (int) and dict keys (("key", k))

#: leaves too large to mutate entry by entry are changed at a few entries
_SCALARS = (bool, int, np.integer, Fraction, str, float, np.floating, type(None))


def _children(obj: Any) -> Iterator[tuple[Any, Any]]:
    """(step, child) for every part of ``obj``: fields, elements, entries, attributes."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield f.name, getattr(obj, f.name)
    elif isinstance(obj, (list, tuple)):
        yield from enumerate(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield ("key", k), v
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("exactformer"):
        for k, v in vars(obj).items():
            if not callable(v):
                yield k, v


def _is_leaf(obj: Any) -> bool:
    return isinstance(obj, (ExactTensor, np.ndarray) + _SCALARS)


def leaves(obj: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every leaf of ``obj`` with its path (depth first, in field order)."""
    if _is_leaf(obj):
        yield path, obj
        return
    kids = list(_children(obj))
    if not kids:
        yield path, obj  # an empty container or an opaque object: a leaf of its own
        return
    for step, child in kids:
        yield from leaves(child, path + (step,))


def family(path: Path) -> str:
    """A path without its indices: ``blocks[].attn.W_Q``, ``task_params.alphabet``, ``answers[]``."""
    out = ""
    for step in path:
        if isinstance(step, int):
            out += "[]"
        elif isinstance(step, tuple):
            out += f".{step[1]}" if isinstance(step[1], str) else "[]"
        else:
            out += f".{step}" if out else step
    return re.sub(r"^\.", "", out)


def doc_key(path: Path) -> str:
    """The row of docs/architecture.md's table of fields a leaf belongs to: its family cut to the
    field of the model it is part of (``blocks[].attn.W_Q``, ``pos_embed.blocks[].code``,
    ``task_params``, ``plan``)."""
    parts = re.split(r"\.(?![^\[]*\])", family(path))
    depth = 3 if parts[0] in ("blocks[]", "embed", "pos_embed") and len(parts) > 1 and parts[1] != "table" else 2
    if parts[0] in ("embed", "pos_embed") and len(parts) > 1 and not parts[1].startswith("blocks"):
        depth = 2
    if parts[0] not in ("blocks[]", "embed", "pos_embed"):
        depth = 1
    return re.sub(r"\[\]$", "", ".".join(parts[:depth]))


def group_key(path: Path) -> tuple:
    """Leaves that play one role: the same family in the same layer (the default suite mutates one
    leaf of each group, the slow suite every leaf)."""
    layer = path[1] if path and path[0] == "blocks" else None
    return layer, family(path)


def get(obj: Any, path: Path) -> Any:
    for step in path:
        obj = obj[step[1]] if isinstance(step, tuple) else obj[step] if isinstance(step, int) else getattr(obj, step)
    return obj


def replace(obj: Any, path: Path, value: Any) -> Any:
    """A copy of ``obj`` with the leaf at ``path`` set to ``value`` (everything on the path copied,
    frozen dataclasses through ``dataclasses.replace``, the rest shared)."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    if isinstance(obj, (list, tuple)):
        items = list(obj)
        items[step] = replace(items[step], rest, value)
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    if isinstance(obj, dict):
        new = dict(obj)
        new[step[1]] = replace(obj[step[1]], rest, value)
        return new
    child = replace(getattr(obj, step), rest, value)
    if dataclasses.is_dataclass(obj):
        params = getattr(type(obj), "__dataclass_params__", None)
        if params is not None and params.frozen:
            if step in {f.name for f in dataclasses.fields(obj) if f.init}:
                return dataclasses.replace(obj, **{step: child})
            new = copy.copy(obj)
            object.__setattr__(new, step, child)
            return new
    new = copy.copy(obj)
    object.__setattr__(new, step, child) if dataclasses.is_dataclass(obj) else setattr(new, step, child)
    return new


def _format_variants(name: str) -> list[str]:
    """Other formats near a format's name: one fraction bit fewer, one integer bit fewer."""
    try:
        fmt = parse_format(name)
    except ValueError:
        return [name + "'"]
    out = []
    m = re.fullmatch(r"binary:int=(\d+),frac=(\d+)", fmt.name)
    if m:
        i, f = int(m.group(1)), int(m.group(2))
        if f > 0:
            out.append(f"binary:int={i},frac={f - 1}")
        if i > 1:
            out.append(f"binary:int={i - 1},frac={f}")
    return out or [fmt.name]


def values(value: Any, rng: np.random.Generator) -> list[Any]:
    """Changed values of one leaf: each is the leaf with one change a corruption could make."""
    if isinstance(value, (bool, np.bool_)):
        return [not value]
    if isinstance(value, (int, np.integer)):
        return [int(value) + 1] + ([int(value) - 1] if value > 0 else [])
    if isinstance(value, Fraction):
        return [value * 2, -value] if value else [Fraction(1, 2)]
    if isinstance(value, (float, np.floating)):
        return [float(value) * 2 + 1]
    if isinstance(value, str):
        return _format_variants(value) if re.match(r"(binary|grid|fixed|float|bfloat)", value) else [value + "'"]
    if value is None:
        return []
    if isinstance(value, ExactTensor):
        return [ExactTensor(n, value.den) for n in _array_variants(value.num, rng)]
    if isinstance(value, np.ndarray):
        return list(_array_variants(value, rng))
    return []


def _array_variants(num: np.ndarray, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """An array with one nonzero entry moved by one unit, and with one zero entry set to one."""
    if num.size == 0:
        return
    if num.dtype == bool:
        out = num.copy()
        out.reshape(-1)[int(rng.integers(num.size))] ^= True
        yield out
        return
    flat = num.reshape(-1)
    nz, z = np.flatnonzero(flat), np.flatnonzero(flat == 0)
    if nz.size:
        out = flat.copy()
        i = int(nz[rng.integers(nz.size)])
        out[i] = out[i] + 1 if out[i] > 0 else out[i] - 1
        yield out.reshape(num.shape)
    if z.size:
        out = flat.copy()
        out[int(z[rng.integers(z.size)])] = 1
        yield out.reshape(num.shape)


def sequence_variants(value: Any) -> list[Any]:
    """Whole-sequence changes of a sequence of scalars: two entries swapped, every entry shifted."""
    if not isinstance(value, (list, tuple)) or len(value) < 2 or not all(isinstance(v, _SCALARS) for v in value):
        return []
    swapped = list(value)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    out = [type(value)(swapped)] if swapped != list(value) else []
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value):
        out.append(type(value)(int(v) - 1 if v > 0 else int(v) + 1 for v in value))
    return out


def containers(obj: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every list or tuple of scalars with its path (the answers, the answer positions ...)."""
    if isinstance(obj, (list, tuple)) and obj and all(isinstance(v, _SCALARS) for v in obj):
        yield path, obj
    if _is_leaf(obj):
        return
    for step, child in _children(obj):
        yield from containers(child, path + (step,))


def mutants(model: Any, seed: int = 0) -> Iterator[tuple[str, Path, Any]]:
    """(description, path, mutant) for every leaf of ``model`` and every change :func:`values` makes
    of it, then every whole-sequence change (:func:`sequence_variants`). A leaf whose change
    cannot even be made (the copy raises) is reported with mutant None."""
    rng = np.random.default_rng(seed)
    for path, value in leaves(model):
        for new in values(value, rng):
            yield _make(model, path, new, f"{family(path)} = {_short(new)}")
    for path, value in containers(model):
        for new in sequence_variants(value):
            yield _make(model, path, new, f"{family(path)} reordered/shifted: {_short(new)}")


def _make(model: Any, path: Path, new: Any, what: str) -> tuple[str, Path, Any]:
    try:
        return what, path, replace(model, path, new)
    except (TypeError, ValueError, AttributeError):
        return what, path, None


def _short(v: Any) -> str:
    s = repr(v) if not isinstance(v, (ExactTensor, np.ndarray)) else f"<{type(v).__name__} changed>"
    return s if len(s) < 60 else s[:57] + "..."
