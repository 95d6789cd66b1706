"""WordSum: word arithmetic of an MPC machine as one exact ReLU layer (P2 Thm 4.1's per-token
computation, lowered; docs/mpc.md "Weights").

A **word** ``w`` of p bits lives in two slots: ``w.ok`` (one column: 1 if the word is there, 0 for
⊥) and ``w.bits`` (p columns, least significant first; all 0 for ⊥). A **gate** is a one-column
slot ``g`` (a flag, or a word's ``.ok``) read as "on" when it is 1, or ``!g``: on when it is 0.

:class:`WordSum` writes ``out = (Σ terms) mod 2^p`` where every gate is on and ⊥ (all 0) where one
is off; ``out.ok`` = AND of the gates (1 without gates). A missing term (⊥) counts as 0. Two
WordSums with complementary gates writing the same ``out`` add up to a *select* (exactly one of
them is on): ``off' = got if got is there else off`` is WordSum(off', (got,), (got.ok,)) +
WordSum(off', (off,), (!got.ok, off.ok)).

Units. Every output is a sum of *robust steps*: with f the linear form of the input (f = Σ_t Σ_j
2^j t_j, an integer in [0, f_max] on exact inputs) and G = Σ_gates (g or 1 − g) − #gates (0 when
every gate is on, <= −1 otherwise)::

    step_s = relu(2(f − s) + 3/2 + M G) − relu(2(f − s) + 1/2 + M G)     M = 2 f_max + 4

is 1 for f >= s − 1/4 and 0 for f <= s − 3/4 when G = 0, and 0 when G <= −1 (the arguments are
<= 2 f_max + 3/2 − M < 0). On inputs within 1/8 of exact values in f and 1/(4M) in G the step is
*exactly* 0 or 1: that is what makes the MLP right in float32, where the attention that delivered
the words leaks e^-eta. Bit j of f mod 2^p is Σ_{s=1}^{f_max} (bit_j(s) − bit_j(s − 1)) step_s
(2 f_max units for all bits together); a single-term sum (a copy, or the clean-up of a delivered
word) uses one step per bit instead (f = the bit, s = 1: 2 units per bit). The presence column is
one more step on G alone: relu(2G + 3/2) − relu(2G + 1/2).

Every weight is one of 2^j, 3/2, 1/2, ±1, ±M: exact in a binary format with one fraction bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import block, MLPBlock
from exactformer.constructions.core.ir import IRError


def word_slots(name: str) -> tuple[str, str]:
    """The slots of word ``name``: (presence, bits)."""
    return f"{name}.ok", f"{name}.bits"


@block
@dataclass(frozen=True)
class WordSum(MLPBlock):
    """``out`` = (Σ ``terms``) mod 2^p where every gate is on, else ⊥ (see the module docstring).
    ``terms`` and ``out`` are words; ``gates`` one-column slots, ``!slot`` for "on when 0"."""

    out: str
    terms: tuple[str, ...]
    gates: tuple[str, ...] = ()

    def f_max(self, mb: Any) -> int:
        """The largest value of Σ terms on exact inputs."""
        return sum((1 << mb.layout[word_slots(t)[1]].size) - 1 for t in self.terms)

    def units(self, mb: Any) -> int:
        """How many MLP units :meth:`emit` adds."""
        p = mb.layout[word_slots(self.terms[0])[1]].size if len(self.terms) == 1 else None
        body = 2 * p if p is not None else 2 * self.f_max(mb)
        return body + (2 if self.gates else 0)

    def emit(self, mb: Any, layer: int) -> None:
        lay = mb.layout
        ok_out, bits_out = word_slots(self.out)
        p = lay[bits_out].size
        if not self.terms:
            raise IRError(f"WordSum {self.out!r}: no terms")
        gates = [(g[1:], -1) if g.startswith("!") else (g, 1) for g in self.gates]
        for g, _ in gates:
            if lay[g].size != 1:
                raise IRError(f"WordSum {self.out!r}: gate {g!r} must be one column, it has {lay[g].size}")
        g_const = sum(1 for _, sign in gates if sign < 0) - len(gates)  # G = Σ ±g + g_const

        if len(self.terms) == 1:  # one step per bit: f = the bit, s = 1
            src = word_slots(self.terms[0])[1]
            w = lay[src].size
            if w > p:
                raise IRError(f"WordSum {self.out!r}: term {self.terms[0]!r} has {w} bits, out only {p}")
            f_max, steps = 1, w
            f_in = [(src, np.repeat(np.eye(w, dtype=np.int64), 2, axis=1))]  # unit 2j, 2j+1 read bit j
            thresholds = np.ones(w, dtype=np.int64)
            out_of_step = np.eye(w, p, dtype=np.int64)  # step j -> bit j
        else:
            f_max = self.f_max(mb)
            steps = f_max
            f_in = []
            for t in self.terms:
                src = word_slots(t)[1]
                w = lay[src].size
                f_in.append((src, np.repeat(np.outer(1 << np.arange(w, dtype=np.int64), np.ones(steps, np.int64)), 2,
                                            axis=1)))
            thresholds = np.arange(1, steps + 1, dtype=np.int64)
            s = np.arange(steps + 1, dtype=np.int64)
            bits = (s[:, None] >> np.arange(p, dtype=np.int64)) & 1  # [f_max + 1, p]
            out_of_step = bits[1:] - bits[:-1]  # [steps, p]: bit_j(s) - bit_j(s - 1)
        M = 2 * f_max + 4
        n_units = 2 * steps + (2 if gates else 0)
        two = Fraction(2)
        W_in: list[tuple[str, Any]] = [(src, M_ * 2) for src, M_ in f_in]
        # pair (2i, 2i+1): relu(2(f - s) + 3/2 + M G) - relu(2(f - s) + 1/2 + M G)
        b_in = np.zeros(n_units, dtype=object)
        b_in[0:2 * steps:2] = [-two * int(t) + Fraction(3, 2) + M * g_const for t in thresholds]
        b_in[1:2 * steps:2] = [-two * int(t) + Fraction(1, 2) + M * g_const for t in thresholds]
        if gates:  # the presence step on G alone
            b_in[2 * steps] = 2 * g_const + Fraction(3, 2)
            b_in[2 * steps + 1] = 2 * g_const + Fraction(1, 2)
        W_in = [(src, np.pad(M_, ((0, 0), (0, n_units - 2 * steps)))) for src, M_ in W_in]
        for g, sign in gates:
            row = np.full((1, n_units), sign * M, dtype=np.int64)
            row[0, 2 * steps:] = 2 * sign
            W_in.append((g, row))
        W_out_bits = np.zeros((n_units, p), dtype=np.int64)
        W_out_bits[0:2 * steps:2] = out_of_step
        W_out_bits[1:2 * steps:2] = -out_of_step
        W_out = [(bits_out, W_out_bits)]
        if gates:
            ok = np.zeros((n_units, 1), dtype=np.int64)
            ok[2 * steps, 0], ok[2 * steps + 1, 0] = 1, -1
            W_out.append((ok_out, ok))
        mb.mlp(self, layer, W_in=W_in, b_in=b_in, W_out=W_out, n_units=n_units)
        if not gates:
            mb.b_out(layer, ok_out, np.array([1]))
