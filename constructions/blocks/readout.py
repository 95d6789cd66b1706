"""Readouts: the unembedding of a construction.

* :class:`SymbolReadout` (App. C.2, Theorem 1): symbol s scores ``sum_j (2 rho_j(s) - 1)(2 b_j - 1)``
  on the answer bits b (rho(s) = the m-bit binary code of s): m for the symbol whose bits are b,
  at most m - 2 for every other;
* :class:`ThresholdReadout` (Theorems 6 and 13): ``logit_yes = c z`` against the constant
  ``logit_no = l0``, so the answer is "yes" iff z > l0 / c; the builder puts the threshold halfway
  between the averaged values of b and b + 1 true features;
* :class:`AverageReadout`: answer k (of 0 .. m) where z is nearest the average k/m (an average
  over m positions, :class:`~exactformer.constructions.blocks.average.SetAverage`): ``logit_k =
  2 k m z - k^2``, so logit_k - logit_j = (k - j)(2 m z - k - j) and the nearest k wins while
  |z - k/m| < 1/(2m); the composed certificate, which bounds each logit on its own over the box of
  z, proves it while |z - k/m| < 1/(2m (2m - 1)) (margin >= 1/2 at 1/(8 m^2), what
  :class:`~exactformer.constructions.blocks.average.SetAverage` is designed for).

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


def _bits(count: int, m: int) -> np.ndarray:
    """The m bits of 0 .. count-1, least significant first: [count, m]."""
    return (np.arange(count, dtype=np.int64)[:, None] >> np.arange(m)) & 1


@block
@dataclass(frozen=True)
class SymbolReadout(ReadoutBlock):
    """Answer s (of 0 .. alphabet-1) where the slot ``bits`` holds rho(s), the bits of s (least
    significant first: :meth:`rows`)."""

    bits: str
    alphabet: int

    @staticmethod
    def width(alphabet: int) -> int:
        """m = ceil(log2 alphabet) (at least 1): the bits of a symbol."""
        return max(1, (int(alphabet) - 1).bit_length())

    @staticmethod
    def rows(alphabet: int) -> np.ndarray:
        """rho(s) for s = 0 .. alphabet-1: [alphabet, m] bits, least significant first (the token
        embedding rows a symbol writes)."""
        return _bits(alphabet, SymbolReadout.width(alphabet))

    def emit(self, mb: Any) -> None:
        m = mb.layout[self.bits].size
        if m < self.width(self.alphabet):
            raise ValueError(f"slot {self.bits!r} has {m} columns, {self.alphabet} symbols need {self.width(self.alphabet)}")
        sign = 2 * _bits(self.alphabet, m) - 1  # [S, m]
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


@block
@dataclass(frozen=True)
class AverageReadout(ReadoutBlock):
    """Answer k (logit k, for k = 0 .. ``count``) where the one-column slot ``inp`` holds the
    average k / count (module docstring); proved while |inp - k/count| < 1/(2 count (2 count - 1))."""

    inp: str
    count: int

    def emit(self, mb: Any) -> None:
        if mb.layout.width(self.inp) != 1:
            raise ValueError(f"slot {self.inp!r} must have width 1, has {mb.layout.width(self.inp)}")
        k = np.arange(self.count + 1, dtype=np.int64)
        mb.unembed(self, W_U=[(self.inp, (2 * k * self.count)[None, :])], b_U=-k * k)
