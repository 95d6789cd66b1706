"""The constructions the package knows, by name.

Each construction is one module of this package exposing ``NAME``, ``THEOREM``, a builder and the
task interface ``encode(model, example)`` / ``encode_batch(model, examples)``. Its ground truth
lives in :mod:`exactformer.verify.tasks`; the executor never needs to know about it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# name -> (module, builder function name)
_CONSTRUCTIONS: dict[str, tuple[str, str]] = {
    "index-lookup": ("exactformer.constructions.index_lookup", "index_lookup"),
    "equality": ("exactformer.constructions.equality", "equality"),
    "inequality": ("exactformer.constructions.equality", "inequality"),
    "disjointness": ("exactformer.constructions.thresholds", "disjointness"),
    "dnf": ("exactformer.constructions.thresholds", "k_dnf"),
    "cnf": ("exactformer.constructions.thresholds", "k_cnf"),
    "threshold": ("exactformer.constructions.thresholds", "threshold_features"),
}


class UnknownConstruction(ValueError):
    pass


def names() -> list[str]:
    return list(_CONSTRUCTIONS)


def task(name: str) -> ModuleType:
    """The module implementing construction ``name``."""
    if name not in _CONSTRUCTIONS:
        raise UnknownConstruction(f"construction must be one of {names()}, got {name!r}")
    return importlib.import_module(_CONSTRUCTIONS[name][0])


def builder(name: str):
    mod = task(name)
    return getattr(mod, _CONSTRUCTIONS[name][1])


def register(name: str, module: str, builder_name: str) -> None:
    """Add a construction (used by construction modules of later theorems)."""
    _CONSTRUCTIONS[name] = (module, builder_name)
