"""ANNA by LSH (verify/attention/anna.py): Alg. 1 against its definition w_ij = n_ij / sum n_ij', the LSH
families' collision probabilities, Thm 3.4's reconstruction and the Def. 3.3 condition checker."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from exactformer.verify.attention.anna import (
    ANNAError,
    BitSampling,
    CrossPolytope,
    LSHAttention,
    RandomHyperplane,
    check_conditions,
    family,
    planted_data,
    thm34,
)

SPHERE = {"bit-sampling": False, "hyperplane": True, "cross-polytope": True}
SELECTIVE = {"bit-sampling": 12, "hyperplane": 10, "cross-polytope": 3}  # z with few random collisions at dim 16


def _fam(name):
    return CrossPolytope(samples=4000) if name == "cross-polytope" else family(name)


def _collisions(lsh, Q, K):
    """n_ij = #{t : g_t(q_i) = g_t(k_j)} by comparing every pair's codes (dense, for tests)."""
    qc, kc = lsh.codes(Q), lsh.codes(K)  # [n, T, kw]
    return np.all(qc[:, None] == kc[None, :], axis=-1).sum(-1)


@pytest.mark.parametrize("name", sorted(SPHERE))
def test_alg1_is_the_collision_weighted_mean(name):
    """num/den equals sum_j n_ij v_j / sum_j n_ij exactly (0 and unmatched when nothing collides);
    torch CPU is bit-identical to numpy."""
    pd = planted_data(60, 50, 16, 2, planted=0.7, sphere=SPHERE[name], seed=3)
    lsh = LSHAttention(_fam(name), 16, tables=6, hashes=SELECTIVE[name], seed=7)
    V = np.random.default_rng(0).integers(-1000, 1000, (50, 3))
    res = lsh(pd.queries, pd.keys, V)
    n = _collisions(lsh, pd.queries, pd.keys)
    assert res.den.tolist() == n.sum(1).tolist()
    assert res.num.tolist() == (n @ V).tolist()
    out = res.output()
    for i in range(60):
        want = [Fraction(int(x), int(n[i].sum())) if n[i].sum() else Fraction(0) for x in n[i] @ V]
        assert out[i].tolist() == want
    assert (res.den == 0).any() and (res.den > 0).any()  # both cases occur
    assert res.matched.tolist() == (n.sum(1) > 0).tolist()
    rt = lsh(*(torch.from_numpy(x) for x in (pd.queries, pd.keys, V)))
    assert isinstance(rt.num, torch.Tensor)
    assert np.array_equal(rt.num.numpy(), res.num) and np.array_equal(rt.den.numpy(), res.den)
    assert np.array_equal(lsh.codes(torch.from_numpy(pd.keys)).numpy(), lsh.codes(pd.keys))


def test_seeds_and_repeats():
    pd = planted_data(40, 40, 32, 2, seed=1)
    V = np.arange(40)[:, None]
    a = LSHAttention(BitSampling(), 32, tables=4, hashes=5, seed=11)
    b = LSHAttention(BitSampling(), 32, tables=4, hashes=5, seed=11)
    c = LSHAttention(BitSampling(), 32, tables=4, hashes=5, seed=12)
    ra, rb = a(pd.queries, pd.keys, V), b(pd.queries, pd.keys, V)
    assert np.array_equal(ra.num, rb.num) and np.array_equal(ra.den, rb.den)
    assert np.array_equal(a(pd.queries, pd.keys, V).den, ra.den)  # repeated call
    assert not np.array_equal(a.codes(pd.keys), c.codes(pd.keys))
    # one query at a time equals the batch of all
    for i in (0, 17, 39):
        one = a(pd.queries[i:i + 1], pd.keys, V)
        assert one.num.tolist() == ra.num[i:i + 1].tolist() and one.den.tolist() == ra.den[i:i + 1].tolist()


def test_chunked_tables_equal_one_chunk(monkeypatch):
    pd = planted_data(50, 70, 24, 2, seed=4)
    V = np.arange(70)[:, None] - 30
    lsh = LSHAttention(RandomHyperplane(), 24, tables=9, hashes=4, seed=2)
    pd = planted_data(50, 70, 24, 2, sphere=True, seed=4)
    whole = lsh(pd.queries, pd.keys, V)
    import exactformer.verify.attention.anna as anna_mod

    monkeypatch.setattr(anna_mod, "CHUNK_ENTRIES", 1)  # one table per chunk
    assert len(lsh.table_chunks(120)) == 9
    parts = lsh(pd.queries, pd.keys, V)
    assert np.array_equal(whole.num, parts.num) and np.array_equal(whole.den, parts.den)


# ------------------------------------------------------------------------------------------------
# collision probabilities p(Δ) of the families
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,hamming", [("bit-sampling", 5), ("bit-sampling", 20), ("hyperplane", 6),
                                          ("hyperplane", 16), ("cross-polytope", 4), ("cross-polytope", 12)])
def test_collision_probability_matches_sampled_functions(name, hamming):
    """The empirical collision rate of 6000 sampled functions on one pair agrees with p(Δ)."""
    dim = 32
    x = np.random.default_rng(0).integers(0, 2, dim)
    y = x.copy()
    y[:hamming] ^= 1
    fam = _fam(name)
    if SPHERE[name]:
        x, y = 2 * x - 1, 2 * y - 1
    lsh = LSHAttention(fam, dim, tables=6000, hashes=1, seed=5)
    hit = np.mean(lsh.codes(x[None])[0] == lsh.codes(y[None])[0])
    d2 = int(((x - y) ** 2).sum())
    p = float(fam.collision_probability(np.array([d2]), dim, dim if SPHERE[name] else None)[0])
    se = math.sqrt(p * (1 - p) / 6000) + (math.sqrt(p * (1 - p) / 4000) if name == "cross-polytope" else 0)
    assert abs(hit - p) < 4.5 * se + 1e-9, (hit, p)
    if name == "bit-sampling":
        assert p == 1 - hamming / dim


def test_remark_3_6_formula_is_cross_polytope_not_hyperplane():
    """Remark 3.6's exp(-Δ^2 ln m / (4 - Δ^2)) (unit sphere) describes cross-polytope LSH up to
    lower-order terms, not random hyperplanes (1 - θ/π): at m = 256, Δ^2 = 1 it is 0.157; the
    hyperplane rate is 2/3 and the cross-polytope rate is far closer."""
    m, d2 = 256, 1.0
    remark = math.exp(-d2 * math.log(m) / (4 - d2))
    hyper = float(RandomHyperplane().collision_probability(np.array([d2 * m]), m, m)[0])
    cp = float(CrossPolytope(samples=4000).collision_probability(np.array([d2 * m]), m, m)[0])
    assert abs(hyper - 2 / 3) < 1e-12
    assert abs(cp - remark) < 0.5 * abs(hyper - remark)


# ------------------------------------------------------------------------------------------------
# Thm 3.4
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2**8, 2**12, 2**16, 2**20])
@pytest.mark.parametrize("p1,p2", [(0.97, 0.5), (0.9, 0.3), (15 / 16, 3 / 4), (0.8, 0.6)])
def test_thm34_reconstruction(n, p1, p2):
    t = thm34(n, p1, p2)
    assert abs(t.rho - math.log(p1) / math.log(p2)) < 1e-12 and t.applies == (t.rho < 1 / 3)
    assert p2 ** t.hashes <= n ** -3 < p2 ** (t.hashes - 1)  # z = ceil(3 log_{1/p2} n)
    assert t.tables * p1 ** t.hashes >= 3 * math.log(n) > (t.tables - 1) * p1 ** t.hashes
    assert t.near_term <= n ** -3 * (1 + 1e-9)
    assert t.far_term <= t.tables * n ** -3
    assert t.fail_prob <= min(1.0, t.tables / n + 1 / n) * (1 + 1e-9)
    assert t.tables <= 3 * n ** (3 * t.rho) * math.log(n) / p1 + 1  # Θ(n^{3ρ} log n)
    assert t.time_exponent == 1 + 3 * t.rho


def test_thm34_explicit_parameters_and_errors():
    t = thm34(1000, 0.9, 0.5, tables=10, hashes=4)
    assert (t.tables, t.hashes) == (10, 4)
    assert abs(t.far_term - (1 - (1 - 0.5**4) ** 10)) < 1e-12 and abs(t.near_term - (1 - 0.9**4) ** 10) < 1e-15
    assert t.fail_prob == 1.0  # such small z, ℓ prove nothing
    with pytest.raises(ANNAError, match="p1, p2: need 0 < p2 < p1 <= 1"):
        thm34(100, 0.5, 0.9)
    with pytest.raises(ANNAError, match="n: must be an integer >= 2"):
        thm34(1, 0.9, 0.5)


# ------------------------------------------------------------------------------------------------
# the Def. 3.3 checker
# ------------------------------------------------------------------------------------------------


def _conditions_by_definition(lsh, Q, K, r_sq, c):
    """Both conditions from Def. 3.3 with Fractions, all pairs (independent of check_conditions)."""
    n = _collisions(lsh, Q, K)
    d2 = ((Q[:, None, :] - K[None, :, :]) ** 2).sum(-1)
    cr_sq = Fraction(c) ** 2 * Fraction(r_sq)
    far_fail, near_fail = set(), set()
    for i in range(len(Q)):
        tot = int(n[i].sum())
        within = int((d2[i] <= cr_sq).sum())
        for j in range(len(K)):
            w = Fraction(int(n[i, j]), tot) if tot else Fraction(0)
            if w > 0 and d2[i, j] > cr_sq:
                far_fail.add(i)
            if d2[i, j] <= r_sq and w < Fraction(1, (within - 1) * lsh.tables + 1):
                near_fail.add(i)
    return far_fail, near_fail


@pytest.mark.parametrize("name,tables,hashes", [("bit-sampling", 3, 2), ("bit-sampling", 2, 12),
                                                ("hyperplane", 4, 3), ("cross-polytope", 3, 1)])
def test_checker_equals_definition(name, tables, hashes):
    """Small z makes far keys collide, small ℓ with large z makes near keys miss: the checker finds
    exactly the queries the definition finds (a broken configuration is rejected)."""
    pd = planted_data(40, 30, 12, 2, planted=0.8, sphere=SPHERE[name], seed=8)
    lsh = LSHAttention(_fam(name), 12, tables=tables, hashes=hashes, seed=1)
    rep = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=Fraction(3, 2))
    far, near = _conditions_by_definition(lsh, pd.queries, pd.keys, pd.r_sq, Fraction(3, 2))
    assert rep.far_failures == len(far) and rep.near_failures == len(near)
    assert rep.failed == bool(far or near) and rep.queries_checked == 40 and not rep.sampled
    assert rep.failed  # these parameters are too small: the checker rejects them
    if far:
        assert rep.worst_far["query"] in far
    if near:
        assert rep.worst_near["fails"] and rep.worst_near["query"] in near


def test_checker_sampled_rows():
    pd = planted_data(200, 100, 24, 2, planted=0.5, seed=2)
    lsh = LSHAttention(BitSampling(), 24, tables=2, hashes=3, seed=4)
    full = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=2)
    part = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=2, sample=50, seed=9)
    assert part.sampled and part.queries_checked == 50 and len(set(part.rows.tolist())) == 50
    far, near = _conditions_by_definition(lsh, pd.queries[part.rows], pd.keys, pd.r_sq, 2)
    assert (part.far_failures, part.near_failures) == (len(far), len(near))
    assert full.far_failures >= part.far_failures
    again = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=2, sample=50, seed=9)
    assert again.as_dict() == part.as_dict()


def test_checker_r_zero_is_exact_match():
    """r = 0 (EMA's case): near keys are identical points, which collide in every table, so without
    far collisions the second condition holds; far keys sharing buckets (z = 1) break both."""
    rng = np.random.default_rng(6)
    keys = rng.integers(0, 2, (30, 16))
    keys[10:20] = keys[0]  # duplicates
    queries = keys[rng.integers(0, 30, 25)]
    for hashes, expect_far in ((40, False), (1, True)):
        lsh = LSHAttention(BitSampling(), 16, tables=3, hashes=hashes, seed=2)
        rep = check_conditions(lsh, queries, keys, r_sq=0, approx_c=2)
        far, near = _conditions_by_definition(lsh, queries, keys, 0, 2)
        assert rep.near_failures == len(near) and rep.far_failures == len(far)
        assert (rep.far_failures > 0) == expect_far and rep.theorem is None
        if not expect_far:
            assert rep.near_failures == 0


def test_near_failure_rate_falls_with_tables_as_predicted():
    """Planted pairs at Hamming distance h <= 4 in {0,1}^128, z = Thm 3.4's hashes at n = 256:
    the planted key misses every table with probability exactly (1 - (1 - h/128)^z)^ℓ. Over 12
    seeds the mean number of near failures agrees with the sum of these, and falls with ℓ; far
    keys (Δ^2 > 36) never collide."""
    dim, n, flips, c = 128, 256, 4, 3
    pd = planted_data(n, n, dim, flips, seed=0)
    p1, p2 = 1 - flips / dim, 1 - c * c * flips / dim
    z = thm34(n, p1, p2).hashes
    p = (1 - pd.flips / dim) ** z
    means = []
    for ell in (1, 2, 4, 8, 16):
        predicted = float(((1 - p) ** ell).sum())
        counts = []
        for seed in range(12):
            lsh = LSHAttention(BitSampling(), dim, tables=ell, hashes=z, seed=100 * ell + seed)
            rep = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=c)
            assert rep.far_failures == 0
            counts.append(rep.near_failures)
        mean, sd = float(np.mean(counts)), float(np.std(counts, ddof=1))
        assert abs(mean - predicted) <= 5 * sd / math.sqrt(12) + 1.0, (ell, mean, predicted)
        means.append(mean)
    assert all(a > b for a, b in zip(means, means[1:]))
    assert means[-1] < 0.1 * means[0]


# ------------------------------------------------------------------------------------------------
# bad arguments
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: family("minhash"), "family: must be one of"),
        (lambda: LSHAttention(BitSampling(), 8, tables=0, hashes=2), r"tables: must be an integer >= 1"),
        (lambda: LSHAttention(BitSampling(), 8, tables=1, hashes=0), r"hashes: must be an integer >= 1"),
        (lambda: LSHAttention("bits", 8, tables=1, hashes=1), "family: must be an LSHFamily"),
        (lambda: LSHAttention(BitSampling(), 8, 1, 1)(np.zeros((2, 7), int), np.zeros((2, 8), int), np.zeros((2, 1), int)),
         r"queries: must have shape \[N, 8\]"),
        (lambda: LSHAttention(BitSampling(), 8, 1, 1)(np.full((2, 8), 2), np.zeros((2, 8), int), np.zeros((2, 1), int)),
         r"queries: bit sampling needs points in \{0,1\}\^m"),
        (lambda: LSHAttention(BitSampling(), 8, 1, 1)(np.zeros((2, 8)), np.zeros((2, 8), int), np.zeros((2, 1), int)),
         "queries: must hold integers"),
        (lambda: LSHAttention(RandomHyperplane(), 3, 1, 1)(np.array([[1, 0, 0], [1, 1, 0]]), np.array([[1, 0, 0]]),
                                                          np.zeros((1, 1), int)),
         "queries: hyperplane needs points on one sphere"),
        (lambda: LSHAttention(BitSampling(), 8, 1, 1)(np.zeros((2, 8), int), np.zeros((2, 8), int), np.zeros((3, 1), int)),
         r"values: must have shape \[Nk, dv\] = \[2, dv\]"),
        (lambda: check_conditions(LSHAttention(BitSampling(), 8, 1, 1), np.zeros((2, 8), int), np.zeros((2, 8), int),
                                  r_sq=-1, approx_c=2), "r_sq: must be a rational number >= 0"),
        (lambda: check_conditions(LSHAttention(BitSampling(), 8, 1, 1), np.zeros((2, 8), int), np.zeros((2, 8), int),
                                  r_sq=1, approx_c=1), "approx_c: must be a rational number > 1"),
        (lambda: planted_data(4, 4, 8, 9), r"near_flips: must be an integer \[0, 8\]"),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(ANNAError, match=match):
        make()
    assert issubclass(ANNAError, ValueError)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_numpy():
    for name in sorted(SPHERE):
        pd = planted_data(500, 400, 32, 2, sphere=SPHERE[name], seed=1)
        lsh = LSHAttention(_fam(name), 32, tables=8, hashes=4, seed=3)
        V = np.arange(400)[:, None]
        a = lsh(pd.queries, pd.keys, V)
        b = lsh(*(torch.from_numpy(x).cuda() for x in (pd.queries, pd.keys, V)))
        assert b.num.device.type == "cuda"
        assert np.array_equal(a.num, b.num.cpu().numpy()) and np.array_equal(a.den, b.den.cpu().numpy())
