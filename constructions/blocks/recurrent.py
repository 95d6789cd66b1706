"""Blocks of recurrent models: unit groups of a ReLU RNN with exact integer weights, each one exact
in every arithmetic whose range holds its values (P1 Sec. 2's RNN, h_t = relu(W_ih x_t + W_hh h_{t-1} + b)).

* :func:`automaton_units`: a finite automaton (P1 App. E: "any bounded dyck language Dyck-(n, k)
  can be represented by a DFA"). One unit per pair (state q, symbol a) with q reachable by a; after
  every prefix the hidden state is one-hot on (the automaton's state, the last symbol), or zero
  once the string is rejected. A single ReLU unit per state cannot do this (its pre-activation is
  a sum of a state term and a symbol term, and a state reached from two (state, symbol) pairs with
  crossed terms is out of its reach), so the unit also remembers the symbol::

      h_t[(q, a)] = relu( sum_{(q', a'): delta(q', a) = q} h_{t-1}[(q', a')] + [x_t = a] - 1 )

  The pre-activation lies in [-1, 1]; the readout is accept(q) on a one-hot state.
* :func:`shift_register`: slot i holds the code of the symbol read i steps ago (P1 Thm 3's
  reduction read backwards: a recurrent model that stores every symbol), slot 0 from the input,
  slot i from slot i - 1; the values are the code's.
* :func:`integer_format`: the fewest-bit binary format (no fraction bits) whose range holds every
  weight, value and pre-activation of such a model.
* :func:`two_digit_match`: the ``[x_t = target]`` term of a unit whose target is one of many tokens
  (an index, a key), with the token written as two one-hot digits (:func:`digit_columns`): the
  term is ``[hi matches] + [lo matches] - 2 * flag`` with ``flag`` = 1 on those tokens only, so the
  pre-activation stays in [-2, ...] whatever the number of targets (a binary address would need
  log N in the range).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from exactformer.constructions.core.recurrent import RecurrentBuilder
from exactformer.constructions.core.spec import REJECT, Automaton
from exactformer.precision import FixedPoint, Format, parse_format


def automaton_units(rb: RecurrentBuilder, dfa: Automaton, token_cols: np.ndarray, name: str = "state"
                    ) -> list[tuple[int, int]]:
    """Units of ``dfa`` (module docstring) on the one-hot input columns ``token_cols[token]``; h_0 is
    one-hot on a unit of the start state (a unit of its own when no symbol leads there, which the
    first step clears). Writes the readout ``answer_index`` logits: accept(q) on the accepting
    answer, 1 - accept(q) on the other (so the zero state rejects). Returns the (state, token)
    pair of every unit (token -1: the start's own unit)."""
    Q, V = dfa.delta.shape
    pairs = sorted({(int(dfa.delta[q, a]), a) for q in range(Q) for a in range(V) if dfa.delta[q, a] != REJECT})
    if not any(q == dfa.start for q, _ in pairs):
        pairs = [(dfa.start, -1)] + pairs
    units = rb.units(name, len(pairs))
    state = np.array([q for q, _ in pairs], dtype=np.int64)
    for u, (q, a) in zip(units, pairs):
        if a >= 0:
            readers = units[(state[:, None] == np.flatnonzero(dfa.delta[:, a] == q)[None, :]).any(axis=1)]
            rb.recur(u, readers, 1)
            rb.read(u, token_cols[a], 1)
    rb.bias(units, -1)
    rb.start(units[int(np.flatnonzero(state == dfa.start)[0])], 1)
    acc = dfa.accept[state].astype(np.int64)
    no, yes = dfa.answer_index
    rb.readout(units, yes, acc)
    rb.readout(units, no, -acc)
    rb.readout_bias(np.eye(2, dtype=np.int64)[no])
    return pairs


def shift_register(rb: RecurrentBuilder, name: str, depth: int, code_cols: np.ndarray) -> np.ndarray:
    """``depth`` slots of ``len(code_cols)`` units (returned [depth, width]): slot 0 reads the input
    columns ``code_cols`` (the code of the current symbol), slot i copies slot i - 1."""
    width = len(code_cols)
    units = rb.units(name, depth * width).reshape(depth, width)
    rb.read(units[0], np.asarray(code_cols), 1)
    if depth > 1:
        rb.recur(units[1:], units[:-1], 1)
    return units


def digit_base(count: int) -> int:
    """r = ceil(sqrt(count)): ``count`` targets written as two digits in base r."""
    return max(1, math.isqrt(max(count, 1) - 1) + 1)


def digit_columns(index: np.ndarray, base: int, first: int) -> tuple[np.ndarray, np.ndarray]:
    """Input columns of the two one-hot digits of ``index`` (hi digit in ``first .. first + base - 1``,
    lo digit in the next ``base`` columns)."""
    index = np.asarray(index, dtype=np.int64)
    return first + index // base, first + base + index % base


def two_digit_match(rb: RecurrentBuilder, units: Any, targets: np.ndarray, base: int, first: int, flag: int) -> None:
    """Adds ``[hi = hi(target)] + [lo = lo(target)] - 2 flag`` to the pre-activation of each unit
    (``targets`` broadcast to ``units``): 0 when the token is the unit's target, <= -1 for another
    digit-coded token, 0 for a token whose digit and flag columns are zero."""
    units, targets = np.broadcast_arrays(np.asarray(units), np.asarray(targets))
    hi, lo = digit_columns(targets, base, first)
    rb.read(units, hi, 1)
    rb.read(units, lo, 1)
    rb.read(units, np.full(units.shape, flag), -2)


def integer_format(lo: int, hi: int, precision: Format | str | None, err: type) -> Format:
    """``binary:int=I,frac=0`` with the fewest bits whose range [-2^I, 2^I - 1] holds [lo, hi] (the
    model's weights, values and pre-activations, all integers), or ``precision`` if given and a
    fixed-point format that represents lo, hi and 0 (``err`` names the parameter otherwise)."""
    if precision is None:
        bits = max(1, (max(-lo, 0) - 1).bit_length(), (max(hi, 0)).bit_length())
        return FixedPoint.binary(bits, 0)
    fmt = parse_format(precision) if isinstance(precision, str) else precision
    if not (fmt.is_exact and all(fmt.represents(v) for v in (lo, 0, hi))):
        raise err(f"precision: a fixed-point format that holds the integers {lo} .. {hi} (the model's weights, values "
                  f"and pre-activations), got {fmt.name}")
    return fmt
