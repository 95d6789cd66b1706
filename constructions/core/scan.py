"""Running a finite-state machine over long inputs without a step per position in Python.

A machine with S states reads symbols: ``next[s, a]`` is the state after symbol a in state s,
``cost[s, a]`` a count charged for that step (the executor's saturations). Over a chunk of L
symbols the states are found in about 3 sqrt(L) array operations: the chunk is cut into blocks of
b ~ sqrt(L) symbols; (1) every block's map from each of the S start states to its end state (and
its summed cost) is built for all blocks at once, one symbol column at a time; (2) the blocks'
start states follow from the first state, one block at a time; (3) where the states at every
position are asked for, every block runs from its start state, one column at a time. The result
is the sequential run's, step for step (the same table lookups, in another order of evaluation).
"""

from __future__ import annotations

import math

import numpy as np


def run_machine(next_state: np.ndarray, cost: np.ndarray | None, start: np.ndarray, symbols: np.ndarray,
                every: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Run B machines from ``start`` [B] over ``symbols`` [B, L] (ids into the tables' columns).

    Returns (the states after the last symbol [B], the summed cost [B] (zeros without ``cost``),
    the state after every symbol [B, L] when ``every``, else None)."""
    B, L = symbols.shape
    S, A = next_state.shape
    start = np.asarray(start, dtype=np.int64)
    if L == 0:
        return start.copy(), np.zeros(B, np.int64), np.zeros((B, 0), np.int64) if every else None
    nxt = np.concatenate([next_state, np.arange(S)[:, None]], axis=1).reshape(-1)  # symbol A: stay (the padding)
    cst = None
    if cost is not None:
        cst = np.zeros((S, A + 1), np.int64)
        cst[:, :A] = cost
        cst = cst.reshape(-1)
    b = max(1, math.isqrt(L))
    nb = -(-L // b)
    sym = np.full((B, nb * b), A, dtype=np.int64)
    sym[:, :L] = symbols
    sym = np.ascontiguousarray(sym.reshape(B, nb, b).transpose(2, 0, 1))  # [b, B, nb]: one column per step
    # (1) each block's map from each start state, every block at once (flat indices s (A + 1) + a)
    cur = np.broadcast_to(np.arange(S), (B, nb, S)).copy()
    acc = np.zeros((B, nb, S), np.int64) if cst is not None else None
    for j in range(b):
        flat = cur * (A + 1) + sym[j][..., None]
        if acc is not None:
            acc += cst.take(flat)
        cur = nxt.take(flat)
    rows = np.arange(B)
    starts = np.empty((B, nb), np.int64)  # (2) the blocks' start states
    s, total = start, np.zeros(B, np.int64)
    for i in range(nb):
        starts[:, i] = s
        if acc is not None:
            total += acc[rows, i, s]
        s = cur[rows, i, s]
    if not every:
        return s, total, None
    out = np.empty((b, B, nb), np.int64)  # (3) every position
    c = starts
    for j in range(b):
        c = nxt.take(c * (A + 1) + sym[j])
        out[j] = c
    return s, total, out.transpose(1, 2, 0).reshape(B, nb * b)[:, :L]
