"""The registry of constructions.

A construction registers in one place, a decorator beside its builder::

    @construction("index-lookup", task=IndexLookupTask(), theorem="Thm 1 (App. C.2)")
    def index_lookup(n: int, alphabet: int = 64, ...) -> CompiledModel: ...

and everything else -- ``xf.build``, the CLI's options (from the builder's signature and
docstring), ``verify all``, the verifier and the certificate -- finds it here. Modules of this
package that register constructions are found by reading their sources for the decorator, so a new
construction is one new module and nothing else.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from exactformer.constructions.ir import CompiledModel
from exactformer.constructions.task import Task


@dataclass
class Construction:
    name: str
    builder: Callable[..., CompiledModel]
    task: Task
    theorem: str

    @property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(self.builder).parameters)


_REGISTRY: dict[str, Construction] = {}


class UnknownConstruction(ValueError):
    pass


def construction(name: str, task: type | Task, theorem: str) -> Callable:
    """Decorator registering a builder ``f(n, ...) -> CompiledModel`` under ``name``."""

    def wrap(fn: Callable[..., CompiledModel]) -> Callable[..., CompiledModel]:
        _REGISTRY[name] = Construction(name, fn, task() if isinstance(task, type) else task, theorem)
        fn.construction_name = name  # type: ignore[attr-defined]
        return fn

    return wrap


def names() -> list[str]:
    _load_builtin()
    return list(_REGISTRY)


def get(name: str) -> Construction:
    _load_builtin()
    if name not in _REGISTRY:
        raise UnknownConstruction(f"construction must be one of {sorted(_REGISTRY)}, got {name!r}")
    return _REGISTRY[name]


def task_of(model: CompiledModel) -> Task:
    return get(model.construction).task


def _load_builtin() -> None:
    """Import every module of this package that registers a construction (found by reading the
    sources for the decorator, so a new construction is one new module and nothing else)."""
    if _LOADED:
        return
    _LOADED.append(True)
    here = Path(__file__).parent
    for path in sorted(here.glob("*.py")):
        if "@construction(" in path.read_text():
            importlib.import_module(f"{__package__}.{path.stem}")


_LOADED: list[bool] = []
