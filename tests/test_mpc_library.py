"""Library protocols (L1) and ground truths against the definitions of P2 §5, written out in 1-based
pure Python exactly as the paper states them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from exactformer.constructions.mpc.protocol import ProtocolError
from exactformer.constructions.mpc.compile import resources
from exactformer.constructions.mpc.library import columnsort_shape, induction_heads, k_hop, levels, match2, prefix_sums, sort
from exactformer.verify.mpc.protocol_run import run
from exactformer.constructions.mpc.applications import (
    count_rgs,
    k_hop_truth,
    match2_truth,
    restricted_growth_strings,
    sigma,
    sigma_power,
)

# ------------------------------------------------------------------------------------------------
# definitions (1-based, as in P2; 0 = ⊥ for positions, None for tokens)
# ------------------------------------------------------------------------------------------------


def sigma_def(w: str | list, i: int) -> int:
    """P2 Def. 5.3: σ(w, i) = 1 + max{j < i : w_j = w_i}, 0 if there is none; σ(w, 0) = 0."""
    if i == 0:
        return 0
    js = [j for j in range(1, i) if w[j - 1] == w[i - 1]]
    return js[-1] + 1 if js else 0


def k_hop_def(w, k: int, i: int):
    """P2 Def. 5.5: w_{σ^k(w, i)} with σ(w, 0) = 0 absorbing and w_0 = ⊥ (None)."""
    for _ in range(k):
        i = sigma_def(w, i)
    return w[i - 1] if i else None


def tokens(s: str) -> list[int]:
    return [ord(c) - ord("a") for c in s]


def letters(out) -> list:
    return [None if v < 0 else chr(ord("a") + v) for v in out]


W = "aabcbabca"


def test_paper_examples():
    # P2 L123: σ(w, 9) = 7 and w_7 = b; P2 L129: the 2-hop answer at position 9 is a
    assert sigma_def(W, 9) == 7 and W[7 - 1] == "b"
    assert k_hop_def(W, 2, 9) == "a"
    assert [sigma_def(W, i) for i in range(1, 10)] == [0, 2, 0, 0, 4, 3, 6, 5, 7]
    assert sigma_def(W, 2) == 2  # "aa": a fixed point
    table = {1: [None, "a", None, None, "c", "b", "a", "b", "b"],
             2: [None, "a", None, None, None, None, "b", "c", "a"],
             3: [None, "a", None, None, None, None, None, None, "b"]}
    for k, want in table.items():
        assert [k_hop_def(W, k, i) for i in range(1, 10)] == want
        assert letters(k_hop_truth(np.array([tokens(W)]), k)[0]) == want
        assert letters(run(k_hop(9, k, 3), np.array([tokens(W)])).outputs[0]) == want


def test_vectorised_truths_equal_the_definitions():
    for n in range(1, 8):
        rows = np.concatenate(list(restricted_growth_strings(n)))
        s = sigma(rows)
        for row, srow in zip(rows, s):
            w = row.tolist()
            assert [sigma_def(w, i) - 1 for i in range(1, n + 1)] == srow.tolist()
        for k in (1, 2, 3, n + 1):
            got = k_hop_truth(rows, k)
            want = [[-1 if (a := k_hop_def(r.tolist(), k, i)) is None else a for i in range(1, n + 1)] for r in rows]
            assert got.tolist() == want
    rng = np.random.default_rng(0)
    x = rng.integers(0, 3, size=(50, 40))
    naive = sigma(x)
    acc = np.broadcast_to(np.arange(40), x.shape)
    for k in range(1, 70):  # binary exponentiation equals k-fold iteration
        acc = np.where(acc >= 0, np.take_along_axis(naive, np.maximum(acc, 0), axis=-1), -1)
        assert np.array_equal(sigma_power(x, k), acc)


def test_match2_truth_counts_j_equal_i():
    x = np.array([[0, 3, 5], [1, 2, 4]])
    # M = 6: 0+0 ≡ 0 and 3+3 ≡ 0 (j = i), 5 has no partner; 2+4 ≡ 0, 1 has none
    assert match2_truth(x, 6).tolist() == [[1, 1, 0], [0, 1, 1]]
    rng = np.random.default_rng(1)
    for M in (1, 2, 7, 37):
        x = rng.integers(0, M, size=(20, 9))
        want = [[int(any((a + b) % M == 0 for b in row)) for a in row] for row in x.tolist()]
        assert match2_truth(x, M).tolist() == want


# ------------------------------------------------------------------------------------------------
# restricted growth strings
# ------------------------------------------------------------------------------------------------


def test_rgs_enumerate_every_equality_pattern_once():
    bell = [1, 2, 5, 15, 52, 203, 877, 4140, 21147, 115975]
    for n in range(1, 8):
        rows = np.concatenate(list(restricted_growth_strings(n, chunk=37)))
        assert len(rows) == bell[n - 1] == count_rgs(n)
        # canonical (first occurrences labelled 0, 1, 2, … in order) and lexicographic
        for r in rows.tolist():
            seen = {}
            assert r == [seen.setdefault(v, len(seen)) for v in r]
        assert [tuple(r) for r in rows.tolist()] == sorted({tuple(r) for r in rows.tolist()})
        # every string over an alphabet of size 3 has exactly one pattern here
        pats = {tuple(r) for r in rows.tolist()}
        for w in itertools.product(range(3), repeat=min(n, 5)):
            seen = {}
            assert tuple(seen.setdefault(v, len(seen)) for v in w) in {p[: len(w)] for p in pats}
    assert count_rgs(10) == bell[9] and count_rgs(12) == 4213597
    for n, blocks in ((6, 2), (7, 3), (5, 1)):
        rows = np.concatenate(list(restricted_growth_strings(n, blocks)))
        assert rows.max() < blocks and len(rows) == count_rgs(n, blocks) == sum(
            round(sum((-1) ** (j - i) * math.comb(j, i) * i**n for i in range(j + 1)) / math.factorial(j))
            for j in range(1, blocks + 1))


# ------------------------------------------------------------------------------------------------
# protocols against the truths (L1), and their round counts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branching", [2, 3, 4])
def test_k_hop_every_pattern_up_to_7(branching):
    for n in range(1, 8):
        rows = np.concatenate(list(restricted_growth_strings(n)))
        for k in range(1, n + 2):
            out = run(k_hop(n, k, n, branching), rows).outputs
            assert np.array_equal(out, k_hop_truth(rows, k)), (n, k)


def test_k_hop_random_and_long_inputs():
    rng = np.random.default_rng(2)
    for n, k, B, S in ((64, 5, 2, 3), (100, 17, 3, 4), (257, 64, 4, 257), (300, 1000, 2, 2)):
        x = rng.integers(0, S, size=(16, n))
        assert np.array_equal(run(k_hop(n, k, S, B), x).outputs, k_hop_truth(x, k))


def test_round_counts():
    """Induction heads: 3 rounds (2 when N <= B); k-hop: min(L, 2) + ⌊log₂ k⌋ + 2 for k >= 2, within
    the bound ceil(log_B N) + ⌊log₂ k⌋ + 2; heads (L−1)(B−1) and L(B−1) in the two σ rounds."""
    for n in (1, 2, 5, 8, 9, 100, 1 << 10, 1 << 20):
        for B in (2, 3, 16):
            L = levels(n, B)
            assert B**L >= n and (L == 1 or B ** (L - 1) < n)
            sig = min(L, 2)
            assert len(induction_heads(n, 4, B).rounds) == sig + 1
            for k in (1, 2, 3, 7, 8, 1000, 1024):
                R = len(k_hop(n, k, 4, B).rounds)
                assert R <= L + math.floor(math.log2(k)) + 2
                assert R == (sig + 1 if k == 1 else sig + k.bit_length() + 1)
    r = resources(k_hop(1 << 16, 1024, 1 << 16))
    assert r.layers == 2 + 10 + 2 and r.heads[:2] == (15, 16) and set(r.heads[2:]) <= {1, 2}
    r = resources(induction_heads(1 << 20, 4, 32))  # the spec's example N = 2^20, B = 32: L = 4
    assert r.layers == 3 and r.heads == (3 * 31, 4 * 31, 1)


def test_match2_exhaustive_small():
    for n, M in ((6, 6), (5, 7), (4, 10), (1, 3)):
        x = np.array(list(itertools.product(range(M), repeat=n)))
        assert np.array_equal(run(match2(n, M), x).outputs, match2_truth(x, M))


def test_prefix_sums_exhaustive_small_and_random():
    for n, p, B in ((5, 2, 2), (7, 1, 3), (4, 3, 2)):
        x = np.array(list(itertools.product(range(1 << p), repeat=n)))
        assert np.array_equal(run(prefix_sums(n, p, B), x).outputs, np.cumsum(x, axis=1) % (1 << p))
    rng = np.random.default_rng(3)
    for n, p, B in ((1, 4, 2), (100, 8, 2), (129, 5, 4), (1000, 16, 10)):
        x = rng.integers(0, 1 << p, size=(5, n))
        assert np.array_equal(run(prefix_sums(n, p, B), x).outputs, np.cumsum(x, axis=1) % (1 << p))


def test_columnsort_shape_conditions():
    for n in list(range(1, 200)) + [1000, 4096, 65536]:
        r, c = columnsort_shape(n)
        assert r * c >= n and r % c == 0 and r % 2 == 0 and r >= 2 * (c - 1) ** 2
        assert c == 1 or c + 1 <= n
    assert columnsort_shape(1024) == (128, 8)


def test_sort_exhaustive_small_and_random():
    for n, vb in ((1, 2), (2, 2), (3, 2), (5, 2), (6, 1)):
        x = np.array(list(itertools.product(range(1 << vb), repeat=n)))
        assert np.array_equal(run(sort(n, vb), x).outputs, np.sort(x, axis=1)), n
    rng = np.random.default_rng(4)
    for n, vb in ((50, 8), (257, 3), (1024, 10)):
        x = rng.integers(0, 1 << vb, size=(4, n))
        p = sort(n, vb)
        assert np.array_equal(run(p, x).outputs, np.sort(x, axis=1))
        assert len(p.rounds) == 5 and p.is_mpc


@pytest.mark.parametrize("call, match", [
    (lambda: k_hop(8, 0, 3), "hops must be an integer >= 1"),
    (lambda: k_hop(8, 2, 3, branching=1), "branching must be an integer >= 2"),
    (lambda: k_hop(0, 2, 3), "n must be an integer >= 1"),
    (lambda: match2(8, 0), "modulus must be an integer >= 1"),
    (lambda: prefix_sums(8, 4, fan_in=1), "fan_in must be an integer >= 2"),
    (lambda: sort(8, 0), "value_bits must be an integer >= 1"),
])
def test_bad_parameters(call, match):
    with pytest.raises(ProtocolError, match=match):
        call()
