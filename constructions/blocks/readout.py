"""Readouts: the unembedding of a construction.

* :class:`SymbolReadout` (App. C.2, Theorem 1): symbol s scores ``sum_j (2 rho_j(s) - 1)(2 b_j - 1)``
  on the answer bits b (rho(s) = the m-bit binary code of s): m for the symbol whose bits are b,
  at most m - 2 for every other;
* :class:`ThresholdReadout` (Theorems 6 and 13): ``logit_yes = c z`` against the constant
  ``logit_no = l0``, so the answer is "yes" iff z > l0 / c; the builder puts the threshold halfway
  between the averaged values of b and b + 1 true features.

Their local certificate is the image of the unembedding over the answer positions' views (the
composed certificate evaluates it for every assignment of the view and requires the correct logit's
lower bound to exceed every other logit's upper bound).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, ReadoutBlock


@block
@dataclass(frozen=True)
class SymbolReadout(ReadoutBlock):
    bits: str
    alphabet: int

    def emit(self, mb: Any) -> None:
        m = mb.layout[self.bits].size
        rho = np.array([[(s >> j) & 1 for j in range(m)] for s in range(self.alphabet)], dtype=np.int64)
        sign = 2 * rho - 1  # [S, m]
        mb.unembed(self, W_U=[(self.bits, 2 * sign.T)], b_U=-sign.sum(axis=1))


@block
@dataclass(frozen=True)
class ThresholdReadout(ReadoutBlock):
    """Answers 1 (column ``yes``) iff c * z > l0 on the one-column slot ``inp``."""

    inp: str
    c: Fraction
    l0: Fraction
    yes: int = 1

    def emit(self, mb: Any) -> None:
        W = np.zeros((1, 2), dtype=object)
        W[0, self.yes] = Fraction(self.c)
        b = np.array([Fraction(0), Fraction(0)], dtype=object)
        b[1 - self.yes] = Fraction(self.l0)
        mb.unembed(self, W_U=[(self.inp, W)], b_U=b)
