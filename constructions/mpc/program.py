"""EMA programs (level L2): ANNA-transformers with r = 0, the transformers of P2 Thm 4.1.

P2 Def. 2.2 with arbitrary element-wise maps (Sec. 2.1) makes a transformer "arbitrary per-token
computation alternating with communication between tokens"; the proof of Thm 4.1 (Sec. 4.1) only needs
ANNA's exact special case, Exact-Match Attention (EMA). exactformer's definition of EMA (P2's formal
one is in the unavailable App. B; the "c → ∞, r = 0" limit leaves c·r undefined):

    EMA(X)_i = (1/|M_i|) Σ_{j ∈ M_i} v_j,    M_i = {j : k_j = q_i},    and 0 if M_i = ∅.

Under a fixed-point format of step 1/S with floor rounding every match weighs ŵ = ⌊S/c⌋/S (c = |M_i|),
so a match is read as "no match" when S < c.

An :class:`EMAProgram` holds per-token data as a structured residual stream: a :data:`State` maps
field names to ``int64`` arrays ``[B, n]`` or ``[B, n, w]`` of words (−1 = ⊥), for all tokens and a
batch of B inputs at once. A :class:`Layer` is

    state ← pre(state)                                   element-wise (Def. 2.2's Q/K/V maps)
    out_h ← EMA(query_h(state), key_h(state), value_h(state))   for every head h
    state ← post(state, (out_1, …, out_H))              element-wise

and :attr:`EMAProgram.readout` is ψ. A query or key row holding −1 asks / publishes nothing. Heads
see their outputs only as the exact rational vectors :class:`HeadOut` — never the match count —
so a program decodes integer words from a value layout with an indicator word (see
:meth:`HeadOut.word`), which is exact in ideal and fixed-point semantics alike.
The executor is :mod:`exactformer.verify.mpc.program_run`; the compiler from MPC protocols is
:mod:`exactformer.constructions.mpc.compile`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from exactformer.precision import FixedPoint

State = dict[str, np.ndarray]


@dataclass(frozen=True)
class Head:
    """One EMA head: per-token maps to query and key words ``[B, n, key_words]`` and integer value
    words ``[B, n, value_words]``. ``max_matches`` is the declared bound on |M_i| (the fixed-point
    step must satisfy S >= max_matches for no match to be lost)."""

    name: str
    query: Callable[[State], np.ndarray]
    key: Callable[[State], np.ndarray]
    value: Callable[[State], np.ndarray]
    key_words: int
    value_words: int
    max_matches: int


@dataclass(frozen=True)
class HeadOut:
    """A head's output at every token: the exact rational vector ``num / den`` (0 where den = 0).

    Ideal semantics: ``num`` = Σ_{j∈M_i} v_j and ``den`` = |M_i|. Fixed point: ``num`` = the raw
    output Σ_j fmt.mul(ŵ, v_j) and ``den`` = S. Element-wise maps may use only the value num/den;
    the helpers below do."""

    num: np.ndarray  # [B, n, dv] int64
    den: np.ndarray | int  # [B, n] int64 (ideal) or S (fixed point)

    def present(self, ind: int = 0) -> np.ndarray:
        """[B, n] bool: indicator word ``ind`` of the output is > 0 (some match carried it)."""
        return self.num[..., ind] > 0

    def word(self, at: int | slice, ind: int = 0) -> np.ndarray:
        """Words carried next to indicator ``ind``: out[at] / out[ind] where the indicator is > 0, −1
        (⊥) elsewhere. With integer words and one contributor per indicator the ratio is exact in
        both semantics (ideal: (v/c)/(1/c); fixed: (ŵ·v)/ŵ since ŵ·v is a grid value)."""
        ind_v = self.num[..., ind]
        ok = ind_v > 0
        safe = np.where(ok, ind_v, 1)
        val = self.num[..., at]
        if val.ndim == ok.ndim:
            return np.where(ok, val // safe, -1)
        return np.where(ok[..., None], val // safe[..., None], -1)

    def pairs(self) -> np.ndarray:
        """For a value laid out as (indicator, word) pairs: the words [B, n, dv/2], −1 where the
        pair's indicator is 0 (exact as in :meth:`word`)."""
        ind, val = self.num[..., 0::2], self.num[..., 1::2]
        ok = ind > 0
        return np.where(ok, val // np.where(ok, ind, 1), -1)


@dataclass(frozen=True)
class Layer:
    name: str
    pre: Callable[[State], State]
    heads: tuple[Head, ...]
    post: Callable[[State, tuple[HeadOut, ...]], State]


@dataclass(frozen=True)
class EMAProgram:
    """An L-layer EMA program on ``n`` tokens with ``word_bits``-bit words.

    ``init(inputs [B, n]) -> State``; ``readout(State) -> [B, n]`` answers (−1 = ⊥)."""

    name: str
    n: int
    word_bits: int
    init: Callable[[np.ndarray], State]
    layers: tuple[Layer, ...]
    readout: Callable[[State], np.ndarray]
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_matches(self) -> int:
        return max((h.max_matches for layer in self.layers for h in layer.heads), default=1)

    def min_format(self) -> FixedPoint:
        """The coarsest binary fixed point in which the program is exact: int bits = p (every value is a
        word in [−1, 2^p)), frac bits = ⌈log₂ c_max⌉ (S = 2^frac >= every head's match bound, so
        ⌊S/c⌋ >= 1). Outputs never saturate: Σ_j ŵ v_j <= c·(1/c)·max v."""
        return FixedPoint.binary(self.word_bits, (self.max_matches - 1).bit_length())


class OnProgram:
    """A model whose skeleton is an EMA program's (``program``: init, layers of pre / heads / post,
    readout) with other heads: ANNA-transformers (Alg. 1 heads), low-rank transformers. Its N, name
    and depth are the skeleton's."""

    program: EMAProgram

    @property
    def n(self) -> int:
        return self.program.n

    @property
    def name(self) -> str:
        return self.program.name

    @property
    def layers(self) -> int:
        return len(self.program.layers)
