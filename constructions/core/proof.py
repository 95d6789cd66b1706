"""What a proof step raises and what local certificates read: :class:`Unproven` and
:class:`CertContext`.

They live here, below the blocks, so that the views, the specifications and the runs (which
raise ``Unproven`` too) import nothing from :mod:`exactformer.constructions.blocks`: the blocks
import the core, never the other way round (tests/test_layout.py checks that no import circle
exists).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.precision.boxes import Arithmetic


class Unproven(Exception):
    """A proof step failed. ``hint`` tells the counterexample search which inputs to try."""

    def __init__(self, reason: str, hint: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint or {}


@dataclass
class CertContext:
    """What local certificates read: the model, its raw weights in the arithmetic, slot columns,
    the token domain of every position, and a details dict for the report."""

    model: Any
    arith: Arithmetic
    W: dict[str, np.ndarray]
    domains: Any  # exactformer.constructions.core.task.Domains
    T: int
    device: str = "cpu"
    details: dict[str, Any] = field(default_factory=dict)
    written: list[np.ndarray] = field(default_factory=list)  # per layer: columns earlier layers write

    def slot(self, name: str) -> np.ndarray:
        """The residual columns of slot ``name`` (the layout is a witness: the local certificates check
        the weights on these columns; a slot it does not have is Unproven)."""
        if name not in self.model.layout:
            raise Unproven(f"the plan names slot {name!r}, which the model's layout does not have "
                           f"(slots: {', '.join(sorted(self.model.layout))})")
        start, width = self.model.layout[name]
        if not (0 <= start and 0 <= width and start + width <= self.model.d_model):
            raise Unproven(f"layout[{name!r}] = [{start}, {width}] does not fit d_model = {self.model.d_model}")
        return np.arange(start, start + width)

    def head_weights(self, layer: int, head: int) -> dict[str, np.ndarray]:
        p = f"blocks.{layer}.attn."
        return {w: self.W[p + w][head] for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")}
