"""exactformer: a compiler for proven transformer constructions.

The package is split into subpackages whose imports point down only::

    exactformer.cli                     the command line, built on the API
    exactformer (api)                   xf.build, xf.verify, xf.save, xf.load, Model
        -> exactformer.verify           executors, certificates, the verifier, sizes and bounds
            -> exactformer.constructions   model IR, codes, blocks, one module per theorem, MPC, exports
                -> exactformer.precision   exact number formats and integer arithmetic

The public API (``import exactformer as xf``) is :mod:`exactformer.api`: ``xf.build``,
``xf.verify``, ``xf.save``, ``xf.load``, ``xf.constructions``, ``xf.frontier`` (the precision
frontier, on dask), ``model(inputs)``, and a builder
per construction (``xf.index_lookup``, ``xf.equality`` ...); ``xf.BuildError`` and
``xf.VerifyError`` are the ValueErrors of bad arguments. Its names are imported when first used,
so that ``import exactformer`` (and the command line's start) stays fast. The names a construction
of one's own needs are :mod:`exactformer.construct` (docs/your-construction.md).

``xf.verify`` and ``xf.constructions`` name both the subpackages of the design card and two
verbs of the API: the subpackages are callable -- ``xf.verify(model, ...)`` is
:func:`exactformer.verify.verifier.verify` and ``xf.constructions()`` lists the registry (see their
``__init__``) -- so ``import exactformer.verify.x as y`` and the calls both work.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"  # the same as pyproject.toml

_FROM = {**{name: "exactformer.api" for name in ("Model", "build", "builder", "frontier", "load", "save", "BuildError",
                                                   "VerifyError")},
         **{name: "exactformer.precision" for name in ("FixedPoint", "Float32", "Float64", "parse_format")}}

__all__ = [*_FROM, "constructions", "verify"]


def __getattr__(name: str) -> Any:
    """The API's names (imported on first use), and ``xf.index_lookup``, ``xf.k_dnf`` ...: the
    builder of the construction of that name."""
    if name in ("constructions", "verify"):  # the callable subpackages (module docstring)
        return importlib.import_module(f"exactformer.{name}")
    if name in _FROM:
        value = getattr(importlib.import_module(_FROM[name]), name)
        globals()[name] = value
        return value
    from exactformer.api import builder
    from exactformer.constructions.core import registry

    for cname in registry.names():
        if registry.get(cname).builder.__name__ == name or cname.replace("-", "_") == name:
            return builder(cname)
    raise AttributeError(f"module 'exactformer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM])
