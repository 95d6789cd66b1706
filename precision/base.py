"""The interface every number format implements, and what all formats share.

:class:`Format` declares the operations (``quantize``, ``add`` .. ``softmax``; see docs/precision.md)
and holds the common machinery: event :class:`Counts` and raw-value tagging (:meth:`Format.raw`,
:class:`RawArray`). The formats are :class:`~exactformer.precision.fixed_point.FixedPoint` and
:class:`~exactformer.precision.floats.FloatFormat`; :func:`~exactformer.precision.parse.parse_format`
builds one from its name.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._xp import is_torch
from .errors import FormatMismatchError

ACCUMULATE = ("rounded-products", "exact")  # matmul's accumulation modes


class Counts:
    """Event counters of a format: ``saturations`` (results clipped to the range ends) and
    ``underflows`` (results whose exact value is nonzero but that round to 0)."""

    __slots__ = ("saturations", "underflows")

    def __init__(self) -> None:
        self.saturations = 0
        self.underflows = 0

    def as_dict(self) -> dict[str, int]:
        return {"saturations": self.saturations, "underflows": self.underflows}

    def reset(self) -> None:
        self.saturations = 0
        self.underflows = 0

    def __repr__(self) -> str:
        return f"Counts(saturations={self.saturations}, underflows={self.underflows})"


class RawArray(np.ndarray):
    """A numpy array of raw values tagged with its format (``raw_format``); see ``Format.raw``."""

    raw_format = None

    def __array_finalize__(self, obj):
        self.raw_format = getattr(obj, "raw_format", None)


_TORCH_TAG = "_exactformer_format"


class _Bound(int):
    """max |raw| of a validated argument (an int), carrying its exact minimum and maximum."""

    def __new__(cls, v: int, lo: int, hi: int):
        self = super().__new__(cls, v)
        self.lo, self.hi = lo, hi
        return self


class Format:
    """Common interface of every number format."""

    name: str
    is_exact: bool
    bits: int
    scale: int | None
    step: Fraction | None

    def __init__(self) -> None:
        self.counts = Counts()

    def reset_counts(self) -> None:
        self.counts.reset()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Format) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    # ---- tagging -------------------------------------------------------------------------------
    def raw(self, x):
        """Tag raw values with this format (validated: dtype and range). numpy input gives a
        :class:`RawArray` view; a torch tensor gets an attribute. Operations of another format
        reject tagged values with :class:`FormatMismatchError`; outputs of operations on tagged
        inputs are tagged too. Untagged plain arrays remain accepted everywhere."""
        xp, (a,), _, _, _ = self._prep("raw", (x,), ("x",))
        return self._tag(xp, a, True)

    def _check_tag(self, a, op: str, pname: str) -> bool:
        tag = getattr(a, _TORCH_TAG, None) if is_torch(a) else getattr(a, "raw_format", None)
        if tag is None:
            return False
        if tag != self:
            raise FormatMismatchError(
                f"{op}: argument {pname} holds raw values of format {tag.name}, not of {self.name}; "
                f"convert with {self.name}.quantize({tag.name}.to_fraction(raw))"
            )
        return True

    def _tag(self, xp, r, tagged: bool):
        if not tagged:
            return r
        if xp.torch:
            setattr(r, _TORCH_TAG, self)
            return r
        if isinstance(r, np.ndarray):
            v = r.view(RawArray)
            v.raw_format = self
            return v
        return r

    def _bump(self, sat, und) -> None:
        sat, und = int(sat), int(und)  # torch counts arrive as 0-d device tensors: synced here only
        if sat:
            self.counts.saturations += int(sat)
        if und:
            self.counts.underflows += int(und)
