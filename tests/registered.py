"""Small default builds of every registered construction, for the state tests (one place: each
construction's registered ``example``)."""

from __future__ import annotations

from typing import Any, Iterator

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup


def small_kwargs(name: str) -> dict[str, Any]:
    return dict(registry.get(name).example)


def small_build(name: str) -> Any:
    """``xf.build(name, ...)`` with the construction's registered example arguments."""
    return xf.build(name, **small_kwargs(name))


#: name -> (its registered construction, whether its example build has weights): every build takes a
#: while and three test modules ask (two at collection); kept while the name stays registered as that object
_HAS_WEIGHTS: dict[str, tuple[registry.Construction, bool]] = {}


def weight_constructions() -> list[str]:
    """Every registered construction whose build has weights (an ``xf.Model``)."""
    names = []
    for n in registry.names():
        c = registry.get(n)
        known = _HAS_WEIGHTS.get(n)
        if known is None or known[0] is not c:
            known = _HAS_WEIGHTS[n] = (c, isinstance(small_build(n), xf.Model))
        if known[1]:
            names.append(n)
    return names


class NoCertificateTask(IndexLookupTask):
    """Index Lookup's task declaring no certificate, as the task of a construction without one does."""

    modes = ("exhaustive", "sample")


def tiny_builder(name: str):
    """The builder of a test construction ``name`` whose model no certificate proves (no plan of
    certified blocks)."""

    def tiny(n: int, alphabet: int = 2, wide: bool = False) -> CompiledModel:
        """Index Lookup without a plan.

        Parameters
        ----------
        n : int in [2, 64]. N.
        alphabet : int in [2, 4]. |Sigma|.
        wide : use a 4-symbol alphabet instead.
        """
        model = index_lookup(n, 4 if wide else alphabet)
        model.plan, model.construction = [], name
        return model

    return tiny


TEST_CLAIM = registry.Claim("a test", "1", "1", "O(1)", "O(1)", "O(1)")


def register_tiny(name: str, task: Any) -> Iterator[str]:
    """Register the test construction ``name`` with ``task`` for the duration of a test (a generator
    for a fixture: it removes the registration afterwards)."""
    registry.names()
    registry._REGISTRY[name] = registry.Construction(name, tiny_builder(name), task, "test", TEST_CLAIM)
    try:
        yield name
    finally:
        registry._REGISTRY.pop(name, None)
