"""Inner products of position-code vectors, derived from the codes' generators.

Certificates need, for a query vector, the multiset of its integer inner products with many key
vectors (a histogram over levels). Two exact methods:

* Reed--Solomon∘Hadamard codes (:class:`ReedSolomonCode`, the exact class, both sides the same
  generator): ``<num(i), num(j)> = q * agreements(i XOR j)``, and for keys forming a contiguous
  index range the histogram over the range is a sum of prefix-sum differences over its aligned
  dyadic blocks (the XOR of an aligned block of size 2^m with any index is again an aligned
  block), O(q log n) per query after O(n) tables.
* everything else: exact Gram rows from the numerators (entries in {-1, 0, 1}, so float32
  products are exact for k < 2^24), streamed in blocks.

A code may be a view of another (``base`` and ``base_indices``, e.g. a position code read through
an index table); :func:`resolve` follows views to the generating code, so facts come from the
generator, never from a ``family`` label.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactformer.constructions.core.ir import code_fingerprint
from exactformer.constructions.codes.positions import ReedSolomonCode

GRAM_MAX_WORK = 1 << 36  # queries x keys x k above which Gram histograms are refused


class CodeWorkError(ValueError):
    """Exact histograms would exceed the work limit for this (non Reed--Solomon) code."""


def resolve(code: Any, idx: np.ndarray) -> tuple[Any, np.ndarray]:
    """(generating code, indices into it) for vectors ``idx`` of ``code`` (views followed)."""
    idx = np.asarray(idx, dtype=np.int64)
    while hasattr(code, "base") and hasattr(code, "base_indices"):
        idx = np.asarray(code.base_indices(idx), dtype=np.int64)
        code = code.base
    return code, idx


def same_generator(a: Any, b: Any) -> bool:
    return a is b or code_fingerprint(a) == code_fingerprint(b)


def _is_rs(a: Any, b: Any) -> bool:
    return type(a) is ReedSolomonCode and type(b) is ReedSolomonCode and same_generator(a, b)


def pair_inner(qcode: Any, qi: np.ndarray, kcode: Any, kj: np.ndarray) -> np.ndarray:
    """<num(qi[t]), num(kj[t])> for each t (int64)."""
    qi, kj = np.asarray(qi, dtype=np.int64), np.asarray(kj, dtype=np.int64)
    if _is_rs(qcode, kcode):
        return int(qcode.q) * np.asarray(qcode.agreements(qi ^ kj), dtype=np.int64)
    out = np.empty(qi.size, dtype=np.int64)
    step = 1 << 14
    for s in range(0, qi.size, step):
        x = np.asarray(qcode.numerators(qi[s : s + step]), dtype=np.int64)
        y = np.asarray(kcode.numerators(kj[s : s + step]), dtype=np.int64)
        out[s : s + step] = np.sum(x * y, axis=1)
    return out


def _dyadic_blocks(start: int, count: int) -> list[tuple[int, int]]:
    """[start, start + count) as maximal aligned blocks (begin, log2 size)."""
    out = []
    s, e = start, start + count
    while s < e:
        m = (s & -s).bit_length() - 1 if s else (e - s).bit_length() - 1
        while (1 << m) > e - s:
            m -= 1
        out.append((s, m))
        s += 1 << m
    return out


def _ranges(idx: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct indices as maximal runs (start, count)."""
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [idx.size]])
    return [(int(idx[a]), int(b - a)) for a, b in zip(starts, ends)]


def histograms(qcode: Any, qi: np.ndarray, kcode: Any, kj: np.ndarray, device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """Integer levels [L] and counts [len(qi), L]: for each query vector qi[t], how many of the key
    vectors kj (a multiset) have each inner product level."""
    qi, kj = np.asarray(qi, dtype=np.int64), np.sort(np.asarray(kj, dtype=np.int64))
    if _is_rs(qcode, kcode) and kj.size and np.all(np.diff(kj) >= 1):
        q = int(qcode.q)
        M = 1 << int(max(int(qi.max()) if qi.size else 0, int(kj.max()))).bit_length()
        ag = np.asarray(qcode.agreements(np.arange(M, dtype=np.int64)), dtype=np.int64)
        hist = np.zeros((qi.size, q + 1), dtype=np.int64)
        blocks = [b for s, c in _ranges(kj) for b in _dyadic_blocks(s, c)]
        pref = np.zeros((M + 1, q + 1), dtype=np.int32)  # pref[x, lv] = #{c < x : agreements(c) = lv}
        np.cumsum(ag[:, None] == np.arange(q + 1)[None, :], axis=0, out=pref[1:])
        for b0, m in blocks:
            # the keys of an aligned block XOR the query form the aligned block starting at begin
            hb = (qi ^ b0) >> m
            if (M >> m) * 4 <= qi.size:  # few distinct blocks: tabulate them, then gather
                starts = np.arange(M >> m, dtype=np.int64) << m
                table = pref[starts + (1 << m)].astype(np.int64) - pref[starts]
                hist += table[hb]
            else:
                begin = hb << m
                hist += pref[begin + (1 << m)].astype(np.int64) - pref[begin]
        used = np.flatnonzero(hist.sum(axis=0))
        return q * used.astype(np.int64), hist[:, used]
    k = int(qcode.k)
    if qi.size * kj.size * k > GRAM_MAX_WORK:
        raise CodeWorkError(f"exact Gram histograms for {qi.size} queries x {kj.size} keys x k = {k} exceed "
                            f"2^{GRAM_MAX_WORK.bit_length() - 1}; use a Reed-Solomon code")
    L = 2 * k + 1
    hist = np.zeros((qi.size, L), dtype=np.int64)
    step_k = max(1, (1 << 22) // max(k, 1))
    step_q = max(1, (1 << 24) // max(kj.size, 1))
    for s in range(0, qi.size, step_q):
        Q = np.asarray(qcode.numerators(qi[s : s + step_q]), dtype=np.float32)
        for t in range(0, kj.size, step_k):
            K = np.asarray(kcode.numerators(kj[t : t + step_k]), dtype=np.float32)
            G = np.rint(Q @ K.T).astype(np.int64) + k  # exact: entries in {-1, 0, 1}, k < 2^24
            off = G + (np.arange(G.shape[0]) * L)[:, None]
            hist[s : s + Q.shape[0]] += np.bincount(off.reshape(-1), minlength=G.shape[0] * L).reshape(G.shape[0], L)
    used = np.flatnonzero(hist.sum(axis=0))
    return used.astype(np.int64) - k, hist[:, used]
