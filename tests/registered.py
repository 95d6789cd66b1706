"""Small default builds of every registered construction, for the state tests (one place)."""

from __future__ import annotations

from typing import Any

import exactformer as xf
from exactformer.constructions import registry

#: builder keywords of a small build where the builder's defaults with n = 8 do not fit
SMALL: dict[str, dict[str, Any]] = {"index-lookup": dict(n=16, alphabet=4), "nearest-neighbor": dict(n=8),
                                    "mqar": dict(n=8), "match2": dict(n=8)}


def small_kwargs(name: str) -> dict[str, Any]:
    return SMALL.get(name, dict(n=8))


def small_build(name: str) -> Any:
    """``xf.build(name, ...)`` at a small n with the builder's defaults otherwise."""
    return xf.build(name, **small_kwargs(name))


def weight_constructions() -> list[str]:
    """Every registered construction whose build has weights (an ``xf.Model``)."""
    return [n for n in registry.names() if isinstance(small_build(n), xf.Model)]
