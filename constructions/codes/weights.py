"""Inner-product histograms of the Reed--Solomon∘Hadamard code from its algebra, in O(polylog N).

For the code of :class:`~exactformer.constructions.codes.positions.ReedSolomonCode` (P1 Lemma 2,
Cor. 8.1; docs/positions.md) vector i is the polynomial f_i over GF(q), q = 2^m, whose
coefficients are the base-q digits of i, and ``<num(i), num(j)> = q * agreements(i XOR j)`` with
``agreements(c)`` the number of roots of f_c in GF(q) (the Sylvester-Hadamard rows are orthogonal,
and f_i - f_j = f_{i XOR j} in characteristic 2). The code is linear, so histograms over index
sets that are XOR-closed do not depend on the query:

* an aligned block ``[0, 2^b)`` is the F_2-space V_b of coefficient vectors with s = b // m free
  digits and r = b % m free low bits of digit s; its agreement histogram is
  ``A_s + (2^r - 1) M_s`` (:func:`block_counts`), where A_s counts the polynomials of degree < s by
  their number of roots -- the weight distribution of the MDS code RS[q, s] (:func:`mds_weights`:
  A_w = C(n, w) sum_{j=0}^{w-d} (-1)^j C(w, j) (q^{w-d+1-j} - 1), d = n - s + 1) -- and M_s the monic
  polynomials of degree exactly s, ``(A_{s+1} - A_s) / (q - 1)`` (scaling by the leading
  coefficient is a bijection that keeps the roots);
* for a query c and an aligned key block B = [beta, beta + 2^b), {c XOR j : j in B} is the aligned
  block starting at ``(beta XOR c)`` with its low b bits cleared: the block [0, 2^b) itself when c
  lies in B (its histogram holds the query's own vector once, at q agreements), else a sub-block of
  the *shell* [2^t, 2^(t+1)), t the highest bit where beta and c differ at or above b, whose
  histogram is ``block_counts(t + 1) - block_counts(t)``. Sub-blocks that fill their shell are
  counted exactly; the keys of a partial shell are *optional* (each present or not, as far as the
  certificate knows), as many as the sub-blocks hold, placed at the shell's highest levels: every
  softmax term is positive and grows with the logit, which grows with the agreements, so this bounds
  every sub-multiset of the shell of that size.

:func:`classify` splits a range of query indices into pieces whose histograms (exact and optional
counts per agreement level) are the same for every query of the piece, against keys that are a
union of index ranges: O(#ranges * log N) pieces, each found without touching a vector. The test
suite checks every formula against enumeration of small codes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.codes.generators import gf2m, hadamard
from exactformer.constructions.codes.positions import OneHotCode, ReedSolomonCode


class CodeAlgebraError(ValueError):
    """A code whose generator does not have the algebra the closed forms rely on."""


def mds_weights(n: int, dim: int, q: int) -> list[int]:
    """The weight distribution A_0 .. A_n of an MDS code of length n, dimension ``dim`` over GF(q)
    (minimum distance d = n - dim + 1): A_0 = 1, A_w = 0 for 0 < w < d, and for w >= d
    A_w = C(n, w) sum_{j=0}^{w-d} (-1)^j C(w, j) (q^{w-d+1-j} - 1) (MacWilliams--Sloane, Ch. 11, Thm 6)."""
    if not 0 <= dim <= n:
        raise CodeAlgebraError(f"dimension {dim} must lie in [0, n = {n}]")
    d = n - dim + 1
    out = [0] * (n + 1)
    out[0] = 1
    for w in range(max(d, 1), n + 1):
        out[w] = math.comb(n, w) * sum((-1) ** j * math.comb(w, j) * (q ** (w - d + 1 - j) - 1) for j in range(w - d + 1))
    return out


@functools.lru_cache(maxsize=None)
def _root_counts(q: int, s: int) -> tuple[int, ...]:
    """The polynomials of degree < s over GF(q) by number of roots a = 0 .. q (the zero polynomial
    has q): the weight distribution of RS[q, s] read at weight q - a."""
    w = mds_weights(q, s, q)
    return tuple(w[q - a] for a in range(q + 1))


@functools.lru_cache(maxsize=None)
def block_counts(m: int, b: int) -> tuple[int, ...]:
    """How many indices c in [0, 2^b) have ``agreements(c) = a``, for a = 0 .. q (q = 2^m): the
    space V_b of s = b // m free digits and r = b % m free low bits of digit s (module docstring)."""
    q = 1 << m
    s, r = divmod(b, m)
    if s > q or (r and s + 1 > q):
        raise CodeAlgebraError(f"an index block of 2^{b} needs polynomials of degree >= q = {q}")
    low = _root_counts(q, s)
    if not r:
        return low
    monic = [(hi - lo) // (q - 1) for hi, lo in zip(_root_counts(q, s + 1), low)]
    return tuple(lo + ((1 << r) - 1) * mo for lo, mo in zip(low, monic))


def shell_counts(m: int, t: int) -> tuple[int, ...]:
    """The agreement histogram of the shell [2^t, 2^(t+1)) (no index there is 0)."""
    return tuple(a - b for a, b in zip(block_counts(m, t + 1), block_counts(m, t)))


def check_algebra(code: Any) -> None:
    """The facts the closed forms rest on, checked on the code object's own tables: the field's
    antilog table lists q - 1 distinct nonzero elements (x generates GF(q)^*, so every nonzero
    polynomial of degree < d <= q has at most d - 1 roots), and the inner code is a q x q matrix
    of +-1 whose rows are orthogonal (so <num(i), num(j)> = q * agreements(i XOR j))."""
    m, q, d = int(code.m), int(code.q), int(code.d)
    field = gf2m(m)
    if q != 1 << m or field.q != q or int(code.k) != q * q or not 1 <= d <= q:
        raise CodeAlgebraError(f"Reed-Solomon parameters m = {m}, q = {q}, d = {d}, k = {code.k} are inconsistent")
    if len(set(field.exp[: q - 1].tolist())) != q - 1 or 0 in set(field.exp[: q - 1].tolist()):
        raise CodeAlgebraError(f"GF(2^{m}): x does not generate the multiplicative group")
    H = hadamard(q).astype(np.int64)
    if H.shape != (q, q) or np.any(np.abs(H) != 1) or not np.array_equal(H @ H.T, q * np.eye(q, dtype=np.int64)):
        raise CodeAlgebraError(f"the inner code is not a {q} x {q} Hadamard matrix")


# ------------------------------------------------------------------------------------------------
# query classes
# ------------------------------------------------------------------------------------------------


def dyadic_blocks(start: int, stop: int) -> list[tuple[int, int]]:
    """[start, stop) as maximal aligned blocks (begin, log2 size), in order."""
    out = []
    s, stop = int(start), int(stop)
    while s < stop:
        b = (s & -s).bit_length() - 1 if s else (stop - s).bit_length() - 1
        while (1 << b) > stop - s:
            b -= 1
        out.append((s, b))
        s += 1 << b
    return out


@dataclass(frozen=True)
class RowCounts:
    """The histogram of agreements between a query and the keys, except the query's own vector:
    ``exact[a]`` keys certainly at a agreements, ``optional[a]`` more keys that may be there (a
    subset of a shell; each present or not). ``target`` is the index of the key range that holds
    the query's own vector (:func:`classify`)."""

    exact: tuple[int, ...]
    optional: tuple[int, ...]
    target: int


def _highest(counts: tuple[int, ...], size: int) -> list[int]:
    """``size`` keys placed at the highest levels ``counts`` allows: the sub-multiset of a shell
    with the largest softmax terms (logits grow with the agreements)."""
    out = [0] * len(counts)
    for a in range(len(counts) - 1, -1, -1):
        out[a] = min(counts[a], size)
        size -= out[a]
    return out


#: a key sub-block of at most this many indices, off the query's own block and short of its shell,
#: has its histogram counted index by index from the generator (:func:`_row`)
ENUMERATE = 1 << 12
#: query blocks split (per :func:`classify` call) so that such sub-blocks are counted exactly: the
#: rows of small models are exact, those of large ones bounded with few pieces
SPLITS = 64


def _row(m: int, blocks: list[tuple[int, int, int]], c0: int, a: int, agreements: Any, split: bool) -> RowCounts | None:
    """The histogram shared by the queries [c0, c0 + 2^a) (c0 aligned), or None when the block must
    be split: a key block lies strictly inside it (the histogram differs within it), or (``split``)
    a small key block would be counted exactly after splitting (``agreements``: the generator's
    count of roots, None for closed forms only)."""
    q = 1 << m
    exact = [0] * (q + 1)
    shells: dict[int, list] = {}  # shell -> [indices in it, enumerated histogram, indices bounded]
    target = -1
    for beta, b, rng in blocks:
        small = agreements is not None and (1 << b) <= ENUMERATE
        if b >= a:
            gamma = (beta ^ c0) >> b
            if gamma == 0:
                exact = [x + y for x, y in zip(exact, block_counts(m, b))]
                target = rng
                continue
            t = b + gamma.bit_length() - 1
        else:
            delta = (beta ^ c0) >> a
            if delta == 0 or (small and split):
                return None
            t = a + delta.bit_length() - 1
            small = False
        sh = shells.setdefault(t, [0, [0] * (q + 1), 0])
        sh[0] += 1 << b
        if small and (1 << b) < (1 << t):
            hist = np.bincount(np.asarray(agreements(np.arange(gamma << b, (gamma + 1) << b))), minlength=q + 1)
            sh[1] = [x + int(y) for x, y in zip(sh[1], hist)]
        else:
            sh[2] += 1 << b
    optional = [0] * (q + 1)
    for t, (size, counted, bounded) in shells.items():
        full = shell_counts(m, t)
        if size == 1 << t:
            exact = [x + y for x, y in zip(exact, full)]
            continue
        exact = [x + y for x, y in zip(exact, counted)]
        optional = [x + y for x, y in zip(optional, _highest(tuple(f - c for f, c in zip(full, counted)), bounded))]
    if target >= 0:
        exact[q] -= 1  # the query's own vector: the target, not a stray key
    return RowCounts(tuple(exact), tuple(optional), target)


def _sorted_ranges(keys: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    ranges = sorted((int(s), int(e), i) for i, (s, e) in enumerate(keys) if e > s)
    for (s0, e0, _), (s1, _, _) in zip(ranges, ranges[1:]):
        if s1 < e0:
            raise CodeAlgebraError("key index ranges overlap: a vector would be held by two keys")
    return ranges


def classify(m: int, keys: list[tuple[int, int]], start: int, stop: int,
             agreements: Any = None) -> list[tuple[int, int, RowCounts | None]]:
    """Pieces ``(c_start, c_stop, row)`` covering the query indices [start, stop): every query of a
    piece has the histogram ``row`` (over agreements 0 .. q) against the keys, the union of the
    disjoint index ranges ``keys`` [(start, stop)]; ``row.target`` is the index in ``keys`` of the
    range holding the query's own vector (``row`` None: no key holds it). Adjacent pieces with
    equal rows are merged. With ``agreements`` (the generator's root counts) small partial
    sub-blocks are counted exactly (:data:`ENUMERATE`; up to :data:`SPLITS` splits of query
    blocks for it), else every partial shell is bounded."""
    ranges = _sorted_ranges(keys)
    blocks = [(beta, b, i) for s, e, i in ranges for beta, b in dyadic_blocks(s, e)]
    pieces: list[tuple[int, int, RowCounts | None]] = []
    todo = list(reversed(dyadic_blocks(start, stop)))
    splits = 0
    while todo:
        c0, a = todo.pop()
        row = _row(m, blocks, c0, a, agreements, splits < SPLITS)
        if row is None:
            splits += 1
            todo += [(c0 + (1 << (a - 1)), a - 1), (c0, a - 1)]
            continue
        row = row if row.target >= 0 else None
        if pieces and pieces[-1][1] == c0 and pieces[-1][2] == row:
            pieces[-1] = (pieces[-1][0], c0 + (1 << a), row)
        else:
            pieces.append((c0, c0 + (1 << a), row))
    return pieces


# ------------------------------------------------------------------------------------------------
# the codes with a closed form
# ------------------------------------------------------------------------------------------------


class ReedSolomonAlgebra:
    """Histograms of a Reed--Solomon∘Hadamard code: level a (a agreements) is the inner product
    ``levels[a] = q * a`` of numerators; the query's own vector is at a = q."""

    def __init__(self, code: Any):
        check_algebra(code)
        self.code, self.q = code, int(code.q)
        self.levels = self.q * np.arange(self.q + 1, dtype=np.int64)
        self.top = self.q

    def classify(self, keys: list[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int, RowCounts | None]]:
        return classify(int(self.code.m), keys, start, stop, self.code.agreements)


class OneHotAlgebra:
    """Histograms of the one-hot code: every other key at inner product 0, the query's own at 1."""

    def __init__(self, code: Any):
        self.code = code
        self.levels = np.array([0, 1], dtype=np.int64)
        self.top = 1

    def classify(self, keys: list[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int, RowCounts | None]]:
        ranges = _sorted_ranges(keys)
        total = sum(e - s for s, e, _ in ranges)
        cuts = sorted({int(start), int(stop)} | {x for s, e, _ in ranges for x in (s, e) if start < x < stop})
        out: list[tuple[int, int, RowCounts | None]] = []
        for a, b in zip(cuts, cuts[1:]):
            rng = next((i for s, e, i in ranges if s <= a < e), None)
            out.append((a, b, None if rng is None else RowCounts((total - 1, 0), (0, 0), rng)))
        return out


def algebra_of(code: Any) -> ReedSolomonAlgebra | OneHotAlgebra | None:
    """The closed-form histograms of ``code``'s own class (None: a code without one, e.g. random
    signs, whose inner products only their Gram rows give)."""
    if type(code) is ReedSolomonCode:
        return ReedSolomonAlgebra(code)
    if type(code) is OneHotCode:
        return OneHotAlgebra(code)
    return None
