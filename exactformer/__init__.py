"""exactformer: a compiler for proven transformer constructions.

The package is split into three subpackages whose imports point down only::

    exactformer.verify        executor, certificates, verifier, CLI
        -> exactformer.constructions   tasks, position codes, model IR, blocks, builders
            -> exactformer.precision   exact number formats and integer arithmetic

The public API (``import exactformer as xf``) is :mod:`exactformer.api`: ``xf.build``,
``xf.verify``, ``xf.save``, ``xf.load``, ``xf.constructions``, ``model(inputs)``, and a builder
per construction (``xf.index_lookup``, ``xf.equality`` ...); ``xf.BuildError`` and
``xf.VerifyError`` are the ValueErrors of bad arguments.
"""

from exactformer.api import BuildError, Model, VerifyError, build, builder, constructions, load, save
from exactformer.precision import FixedPoint, Float32, Float64, parse_format

__version__ = "0.2.0"  # the same as pyproject.toml

__all__ = ["Model", "build", "builder", "constructions", "load", "save", "verify", "BuildError", "VerifyError",
           "FixedPoint", "Float32", "Float64", "parse_format"]

# ``xf.verify`` is the subpackage exactformer.verify, which is callable: xf.verify(model, mode="certify")


def __getattr__(name: str):
    """``xf.index_lookup``, ``xf.k_dnf`` ...: the builder of the construction of that name."""
    from exactformer.constructions import registry

    for cname in registry.names():
        if registry.get(cname).builder.__name__ == name or cname.replace("-", "_") == name:
            return builder(cname)
    raise AttributeError(f"module 'exactformer' has no attribute {name!r}")
