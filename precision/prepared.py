"""A fixed right operand of the rounded matmul, analysed once.

Verification multiplies many left operands by the same matrix (every key of a model against each
distinct query). ``fmt.matmul`` validates and analyses both operands on every call;
``Prepared(fmt, b)`` analyses ``b`` once, and ``Prepared.matmul(a)`` returns exactly
``fmt.matmul(a, b)``, with the same event counts.

The shortcut: when every raw entry of ``b`` is a multiple of the scale S (``b`` lies on the integer
grid), each rounded product ``round(a_ik * b_kj / S) = a_ik * (b_kj / S)`` is exact, so the result
is the exact integer product ``A @ (B / S)`` saturated once, with no underflow. It is computed with
float32 BLAS when ``k * max|A| * max|B/S| <= 2^24`` and with float64 BLAS when it is at most 2^53
(every product and partial sum is then an exactly representable integer, in any summation order,
FMA or not); otherwise, and for every other case (float formats,
formats beyond int64, operands off the integer grid), ``fmt.matmul`` itself is called.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._wide import F53

F24 = 1 << 24
from ._xp import is_torch
from .base import Format


class Prepared:
    """``b`` [k, n] (raw values of ``fmt``, numpy or torch) prepared as the right operand of
    ``fmt.matmul``."""

    def __init__(self, fmt: Format, b: Any):
        self.fmt, self.b = fmt, b
        self.h = None
        if not fmt.is_exact or not getattr(fmt, "int64_mode", False) or b.ndim != 2:
            return
        S = int(fmt.scale)
        if is_torch(b):
            if bool((b % S != 0).any()):
                return
            self.h = (b // S).double()
            self.h32 = self.h.float()
            self.hmax = int((b // S).abs().max()) if b.numel() else 0
        else:
            b = np.asarray(b)
            if b.size and np.any(b % S != 0):
                return
            self.h = (b // S).astype(np.float64)
            self.h32 = self.h.astype(np.float32)
            self.hmax = int(np.abs(b // S).max()) if b.size else 0

    def matmul(self, a: Any, fmt: Format | None = None):
        """Exactly ``fmt.matmul(a, b)`` (a: [..., m, k] raw values); events are counted on ``fmt``
        (default: the format given at preparation; it must be an equal format)."""
        fmt = self.fmt if fmt is None else fmt
        if self.h is None:
            return fmt.matmul(a, self.b)
        xp, (A,), (bound,), _, tagged = fmt._prep("matmul", (a,), ("a",))
        k = int(A.shape[-1])
        if k != int(self.h.shape[0]):
            return fmt.matmul(a, self.b)  # let matmul report the shape error
        worst = k * int(bound) * self.hmax
        if worst > F53:
            return fmt.matmul(a, self.b)
        if xp.torch:
            C = (A.float() @ self.h32).long() if worst <= F24 else (A.double() @ self.h).long()
        elif worst <= F24:
            C = (np.asarray(A, dtype=np.float32) @ self.h32).astype(np.int64)
        else:
            C = (np.asarray(A, dtype=np.float64) @ self.h).astype(np.int64)
        r, sat = fmt._sat(xp, C)
        fmt._bump(sat, 0)
        return fmt._finish(xp, r, False, tagged)
