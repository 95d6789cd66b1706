"""Token codes for content matching: balanced +-1 codewords with a bottom symbol.

``token_code(alphabet)`` is an int8 table ``[alphabet + 1, M]``: row t < alphabet is symbol t, the
last row the bottom symbol (BOS, "no answer"). A symbol's row is a *balanced* word of M' = M - 1
entries (exactly M'/2 entries +1: the t-th such word, in lexicographic order of its +1 entries) and then -1;
the bottom row is M' entries -1 and then +1. So, with I the inner product:

* I(t, t) = M;
* I(t, t') <= M - 4 for distinct symbols (two balanced words differ in at least two entries);
* I(t, bottom) = -1 for every symbol (a balanced word sums to 0) -- the same for every symbol, which
  is what lets one default key sit strictly between a match and a non-match
  (:class:`~exactformer.constructions.blocks.pointer.LatestMatch`).

M' is the smallest even number with C(M', M'/2) >= alphabet: M' = 8 for |Sigma| = 64, 20 for 2^16
(plain binary would need 6 and 16): O(log |Sigma|).
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np


def balanced_width(alphabet: int) -> int:
    """M' = the smallest even m >= 2 with C(m, m/2) >= alphabet."""
    m = 2
    while math.comb(m, m // 2) < alphabet:
        m += 2
    return m


@lru_cache(maxsize=16)
def token_code(alphabet: int) -> np.ndarray:
    """int8 ``[alphabet + 1, M]``: the symbols' codewords, then the bottom symbol's (module docstring)."""
    m = balanced_width(alphabet)
    out = np.full((alphabet + 1, m + 1), -1, dtype=np.int8)
    for t, ones in enumerate(itertools.islice(itertools.combinations(range(m), m // 2), alphabet)):
        out[t, list(ones)] = 1
    out[alphabet, m] = 1
    out.setflags(write=False)
    return out


def max_other_inner(signs: np.ndarray, query_tokens: np.ndarray, key_tokens: np.ndarray) -> int:
    """The largest inner product of a query token's code with another token's code: exact against
    the key codes whose sum differs from every query code's; at most M - 4 between distinct codes of
    one sum (they differ in an even, nonzero number of entries) when all query codes share a sum,
    else at most M - 2 (distinct codes differ somewhere)."""
    M = signs.shape[1]
    sums = signs.sum(axis=1)
    q_sums = np.unique(sums[query_tokens])
    if q_sums.size > 1:
        return M - 2
    other = key_tokens[sums[key_tokens] != q_sums[0]]
    exact = int((signs[query_tokens] @ signs[other].T).max()) if other.size else -M
    return max(M - 4, exact) if np.any(sums[key_tokens] == q_sums[0]) else exact
