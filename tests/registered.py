"""Small default builds of every registered construction, for the state tests (one place: each
construction's registered ``example``)."""

from __future__ import annotations

from typing import Any

import exactformer as xf
from exactformer.constructions.core import registry


def small_kwargs(name: str) -> dict[str, Any]:
    return dict(registry.get(name).example)


def small_build(name: str) -> Any:
    """``xf.build(name, ...)`` with the construction's registered example arguments."""
    return xf.build(name, **small_kwargs(name))


def weight_constructions() -> list[str]:
    """Every registered construction whose build has weights (an ``xf.Model``)."""
    return [n for n in registry.names() if isinstance(small_build(n), xf.Model)]
