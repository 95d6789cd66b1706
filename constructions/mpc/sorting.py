"""Columnsort (Leighton 1985) on M machines of k items each, recursive when one column exceeds a
machine: the sort of P2 Thm 4.2's simulation (docs/mpc.md, "Thm 4.2: the MPC simulation of ANNA").

The library's :func:`~exactformer.constructions.mpc.library.sort` is Columnsort with one column per
machine, which sorts at most about k^{3/2} items (Leighton's condition r >= 2(c − 1)^2 for an r × c
matrix with a column of r <= k items on each machine). The simulation sorts up to
N^{1+3/c²}·H records on machines of s = O(N^{ε′}) words, so a column may span g machines; it is
then sorted by the same algorithm on those g machines, recursively (Leighton's paper, Sec. 5).

Columnsort moves items only by *fixed* permutations between local sorts, so the whole recursive
sort is a list of permutations of item slots, each applied after every machine has sorted its own
items (:func:`columnsort_plan`): one MPC round per permutation, whatever the data. With M machines
and k items per machine (both powers of two), a level with columns of g machines (r = g·k items)
and c = M/g columns does

    sort columns; transpose; sort columns; untranspose; sort columns; shift; sort windows; unshift

where "sort columns" is the recursive sort of each column (a local sort when g = 1), transpose
sends column-major index κ to row-major place κ (column κ mod c, row ⌊κ/c⌋), untranspose is its
inverse, and the shift/sort/unshift of Leighton's steps 6–8 is done on *windows*: window w >= 1 is
the bottom half of column w − 1 and the top half of column w, window 0 the top half of column 0 and
the bottom half of column c − 1 (both already in their final places after step 5, so sorting them
together changes nothing; it saves the (c + 1)-th column). For g >= 2 a window is g machines that
already hold it (no permutation); for g = 1 the shift and the unshift are one permutation each.
Consecutive permutations without a local sort between them are composed and identities dropped.

Rounds: 4 for one level, 16 for two, 4·(T − 1) + 4 for a level above a level of T rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from exactformer.constructions.mpc.protocol import ProtocolError

SORT = "sort"


def _pow2(x: int, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1 or x & (x - 1):
        raise ProtocolError(f"{what} must be a power of two >= 1, got {x!r}")
    return int(x)


def column_machines(k: int, g: int) -> int:
    """The fewest machines per column (a power of two) for which Leighton's condition holds on g
    machines of k items: r = k·gc >= 2(c − 1)^2 with c = g / gc columns."""
    gc = 1
    while gc < g and k * gc < 2 * (g // gc - 1) ** 2:
        gc *= 2
    return gc


def _slots(groups: np.ndarray, k: int) -> np.ndarray:
    """Global slot of each column-major index of each group: [G, g·k]."""
    kap = np.arange(groups.shape[1] * k)
    return groups[:, kap // k] * k + kap % k


def _perm(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return src.reshape(-1), dst.reshape(-1)


def _ops(groups: np.ndarray, k: int) -> list:
    """Operations sorting each group (a row of machine ids) into column-major order along the row:
    ``SORT`` (every machine sorts its items) or (src slots, dst slots)."""
    G, g = groups.shape
    if g == 1:
        return [SORT]
    gc = column_machines(k, g)  # <= g/2: c = 2 columns always satisfy the condition (k >= 2)
    c, r = g // gc, k * gc
    cols = groups.reshape(G * c, gc)
    kap = np.arange(g * k)
    here = _slots(groups, k)
    transpose = here[:, (kap % c) * r + kap // c]  # κ goes to row-major place κ: column κ mod c, row κ div c
    untranspose = here[:, (kap % r) * c + kap // r]  # (column j, row i) goes to column-major place i·c + j
    ops = _ops(cols, k) + [_perm(here, transpose)] + _ops(cols, k) + [_perm(here, untranspose)] + _ops(cols, k)
    half = r // 2
    if gc == 1:
        j, i = kap // r, kap % r
        win = np.where(i >= half, (j + 1) % c, j)  # the window each item goes to
        pos = np.where(i >= half, np.where(j == c - 1, i, i - half), np.where(j == 0, i, i + half))
        shifted = groups[:, win] * k + pos
        return ops + [_perm(here, shifted), SORT, _perm(shifted, here)]
    h = gc // 2
    cm = groups.reshape(G, c, gc)
    windows = [np.concatenate([cm[:, 0, :h], cm[:, c - 1, h:]], axis=1)]
    windows += [np.concatenate([cm[:, w - 1, h:], cm[:, w, :h]], axis=1) for w in range(1, c)]
    return ops + _ops(np.stack(windows, axis=1).reshape(G * c, gc), k)


@dataclass(frozen=True)
class ColumnsortPlan:
    """The permutations of a recursive Columnsort of ``machines`` × ``per`` slots: before each
    permutation every machine sorts its items (empty slots last); ``perms[j][σ]`` is where the item
    in slot σ goes. After the last one (and a final local sort) slot order is the global order.
    ``levels``: the recursion depth (1: one column per machine)."""

    machines: int
    per: int
    perms: tuple[np.ndarray, ...]
    levels: int

    @property
    def rounds(self) -> int:
        return len(self.perms)


def _depth(k: int, g: int) -> int:
    return 0 if g == 1 else 1 + _depth(k, column_machines(k, g))


@lru_cache(maxsize=32)
def columnsort_plan(machines: int, per: int) -> ColumnsortPlan:
    """The recursive Columnsort of ``machines`` machines with ``per`` items each (powers of two;
    ``per`` >= 2 when ``machines`` >= 2). See the module docstring. Cached: the permutations are read
    only (each is written once, here)."""
    M, k = _pow2(machines, "machines"), _pow2(per, "per (items per machine)")
    if M > 1 and k < 2:
        raise ProtocolError("columnsort: per must be >= 2 when machines >= 2")
    n = M * k
    perms: list[np.ndarray] = []
    pending: np.ndarray | None = None  # composed permutation since the last local sort
    for op in _ops(np.arange(M)[None, :], k):
        if isinstance(op, str):
            if pending is not None and not np.array_equal(pending, np.arange(n)):
                perms.append(pending)
            pending = None
            continue
        src, dst = op
        step = np.arange(n)
        step[src] = dst
        pending = step if pending is None else step[pending]
    if pending is not None and not np.array_equal(pending, np.arange(n)):
        perms.append(pending)
    for p in perms:
        p.flags.writeable = False
    return ColumnsortPlan(M, k, tuple(perms), _depth(k, M))
