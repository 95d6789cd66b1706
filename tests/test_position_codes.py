"""Tests for constructions/position_codes*.py (families, certification, bad input)."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from exactformer.constructions.codes import generators as gen
from exactformer.constructions.codes.positions import (
    N_MAX,
    OneHotCode,
    PositionCodeError,
    RandomSignCode,
    ReedSolomonCode,
    choose_reed_solomon,
    lemma2_k,
    parse_max_inner,
    position_codes,
)
from exactformer.constructions.codes.gram import gram_absmax_cpu, pack_base, prefix_absmax


def brute_max(code) -> tuple[Fraction, np.ndarray]:
    """max_{i != j} |<T(i), T(j)>| from the materialised table (float64 BLAS: exact here)."""
    T = code.table().astype(np.float64)
    G = np.rint(T @ T.T).astype(np.int64)
    iu = np.triu_indices(code.n, 1)
    return Fraction(int(np.abs(G[iu]).max())) * code.gram_scale, G


# ------------------------------------------------------------------------------------------
# GF(2^m) and the Reed-Solomon generator against galois
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_field_tables_match_galois():
    galois = pytest.importorskip("galois")
    for m in range(1, gen.M_MAX + 1):
        assert int(galois.GF(2**m).irreducible_poly) == gen.CONWAY_POLY[m]
    for m in (1, 2, 4, 5):  # each galois field costs a JIT compile: a few, not all
        F, G = gen.gf2m(m), galois.GF(2**m)
        a = np.arange(F.q)
        ours = F.mul(a[:, None], a[None, :])
        theirs = (G(a)[:, None] * G(a)[None, :]).view(np.ndarray)
        assert np.array_equal(ours, theirs), m


@pytest.mark.slow
def test_rs_symbols_are_polynomial_evaluations():
    galois = pytest.importorskip("galois")
    for m, d in [(2, 3), (4, 3)]:
        F, G = gen.gf2m(m), galois.GF(2**m)
        q = F.q
        idx = np.array([0, 1, q - 1, q, q**d - 1, (q**d) // 3], dtype=np.int64)
        sym = gen.rs_symbols(np, F, d, idx)
        for r, i in enumerate(idx):
            digits = [(int(i) >> (m * j)) & (q - 1) for j in range(d)]
            poly = galois.Poly(digits[::-1], field=G)
            assert np.array_equal(poly(G(np.arange(q))).view(np.ndarray), sym[r])
        # Hadamard concatenation: entry x*q + b = (-1)^popcount(sym[x] & b)
        s = gen.rs_signs(np, F, d, idx)
        b = np.arange(q)
        pc = np.vectorize(lambda v: bin(int(v)).count("1"))
        expect = (1 - 2 * (pc(sym[:, :, None] & b[None, None, :]) % 2)).reshape(len(idx), q * q)
        assert np.array_equal(s, expect)


def test_hadamard_rows_orthogonal():
    for q in (2, 4, 16, 64):
        H = gen.hadamard(q).astype(np.int64)
        assert np.array_equal(H @ H.T, q * np.eye(q, dtype=np.int64))


# ------------------------------------------------------------------------------------------
# parameters and expected widths
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2**10, 2**16, 2**20])
def test_rs_k_256_at_quarter(n):
    code = position_codes(n, Fraction(1, 4), family="reed-solomon")
    assert (code.k, code.q) == (256, 16)
    assert code.bound <= Fraction(1, 4)


@pytest.mark.parametrize("n", [2**13, 2**16, 2**20, 2**24])
def test_rs_k_1024_at_eighth(n):
    code = position_codes(n, Fraction(1, 8), family="reed-solomon")
    assert (code.k, code.q) == (1024, 32)
    assert code.bound <= Fraction(1, 8)


def test_rs_choice_is_minimal():
    for n in [2, 3, 5, 16, 17, 64, 65, 512, 513, 4096, 2**20, 2**20 + 1, 2**30]:
        for gamma in [Fraction(1, 2), Fraction(1, 4), Fraction(1, 8), Fraction(3, 10)]:
            m, d = choose_reed_solomon(n, gamma)
            q = 1 << m
            assert q**d >= n and Fraction(d - 1, q) <= gamma
            assert d == 1 or q ** (d - 1) < n  # least d
            for m2 in range(1, m):  # no smaller field works
                q2 = 1 << m2
                d2 = max(1, math.ceil(math.log(n, q2) - 1e-12))
                while q2**d2 < n:
                    d2 += 1
                assert Fraction(d2 - 1, q2) > gamma
    assert choose_reed_solomon(2**20 + 1, Fraction(1, 4)) == (5, 5)  # k = 1024 past 16^5 (32^4 = 2^20)


def test_paper_k_and_attributes():
    assert lemma2_k(1024, Fraction(1, 4)) == math.ceil(8 * math.log(2048) * 16)
    assert lemma2_k(2**20, Fraction(1, 4)) == math.ceil(8 * math.log(2**21) * 16)
    for fam in ("reed-solomon", "onehot", "random", "auto"):
        c = position_codes(64, Fraction(1, 2), family=fam)
        assert c.paper_k == lemma2_k(64, Fraction(1, 2))
        assert c.max_inner == Fraction(1, 2)
        json.dumps(c.describe())
    rs = position_codes(1000, family="reed-solomon")
    assert (rs.family, rs.q, rs.d, rs.seed) == ("reed-solomon", 16, 3, None)
    rnd = RandomSignCode(10, 64, seed=3)
    assert (rnd.family, rnd.q, rnd.d, rnd.seed, rnd.bound) == ("random", None, None, 3, None)
    oh = OneHotCode(10)
    assert (oh.family, oh.k, oh.q, oh.bound, oh.seed) == ("onehot", 10, None, 0, None)


def test_parse_max_inner():
    assert parse_max_inner("1/4") == Fraction(1, 4)
    assert parse_max_inner("0.1") == Fraction(1, 10)
    assert parse_max_inner(0.1) == Fraction(1, 10)
    assert parse_max_inner(Fraction(3, 8)) == Fraction(3, 8)


# ------------------------------------------------------------------------------------------
# certification against brute force
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 17, 100, 513, 1000, 4096])
def test_rs_certify_equals_brute_force(n):
    code = position_codes(n, Fraction(1, 4), family="reed-solomon")
    ref, G = brute_max(code)
    for method in ("auto", "gram"):
        cert = code.certify(method=method)
        assert cert.max_inner == ref
        i, j = cert.pair
        assert 0 <= i < j < n and Fraction(abs(int(G[i, j]))) * code.gram_scale == ref
    assert ref == code.predicted_max() == code.bound  # attained for the chosen (m, d)


def test_rs_bound_attained_exactly_when_n_exceeds_q_to_the_d_minus_1():
    """max = min(d'-1, q)/q with d' the least d' with q^d' >= n; = (d-1)/q iff n > q^(d-1)."""
    for m, d in [(1, 3), (2, 2), (2, 3), (3, 2), (3, 3), (4, 2)]:
        q = 1 << m
        for n in sorted({2, 3, q - 1, q, q + 1, q * q, q * q + 1, q**d - 1, q**d, max(2, q ** (d - 1)), q ** (d - 1) + 1}):
            if n < 2 or n > q**d:
                continue
            code = ReedSolomonCode(n, m, d, Fraction(1, 2))
            ref, _ = brute_max(code)
            assert code.certify().max_inner == ref == code.predicted_max(), (m, d, n)
            assert (ref == code.bound) == (d == 1 or n > q ** (d - 1)), (m, d, n)


def test_xor_set_of_a_range():
    for n in range(2, 300):
        L = 1 << (n - 1).bit_length()
        xs = {i ^ j for i in range(n) for j in range(i + 1, n)}
        assert xs == set(range(1, L)), n


@pytest.mark.parametrize("n,k", [(2, 1), (3, 8), (50, 24), (257, 64), (1000, 100), (2100, 256)])
def test_random_certify_equals_brute_force(n, k):
    code = RandomSignCode(n, k, seed=7)
    ref, G = brute_max(code)
    cert = code.certify()
    assert cert.max_inner == ref and cert.method == "gram"
    assert Fraction(abs(int(G[cert.pair]))) * code.gram_scale == ref


@pytest.mark.parametrize("n", [2, 50, 300])
def test_onehot_certify_equals_brute_force(n):
    code = position_codes(n, family="onehot")
    ref, _ = brute_max(code)
    assert ref == 0
    assert code.certify().max_inner == 0 and code.certify(method="gram").max_inner == 0


@pytest.mark.slow
def test_random_family_search_is_certified_and_locally_minimal():
    for n in (64, 1024, 3000):
        code = position_codes(n, Fraction(1, 4), family="random", seed=1)
        assert code.k % 8 == 0 and code.bound is None
        assert code.certificate.max_inner <= Fraction(1, 4)
        ref, _ = brute_max(code)
        assert ref == code.certificate.max_inner == code.certify().max_inner
        smaller = code.with_k(code.k - 8)
        assert smaller.certify().max_inner > Fraction(1, 4)  # k - 8 fails
        assert code.k < code.paper_k


def test_too_small_random_code_is_caught():
    code = RandomSignCode(1000, 64, seed=0, max_inner=Fraction(1, 4))
    cert = code.certify()
    assert cert.max_inner > Fraction(1, 4) and cert.passed is False


def test_auto_never_returns_an_uncertified_random_code():
    # gamma = 1/2 at n = 4096: RS gives k = 64 (q = 8, d = 4, bound 3/8); random needs more.
    # With a tiny budget auto must fall back to a proven family.
    for budget in (0, 10**6, None):
        code = position_codes(4096, Fraction(1, 2), auto_budget=budget)
        assert code.family in ("reed-solomon", "onehot", "random")
        if code.family == "random":
            assert code.certificate is not None and code.certificate.max_inner <= Fraction(1, 2)
        assert code.certify().max_inner <= Fraction(1, 2)
    # where random wins (tiny n, loose gamma), the result carries a passed certificate
    for n, gamma in [(64, Fraction(3, 4)), (300, Fraction(3, 4)), (40, Fraction(1, 2))]:
        code = position_codes(n, gamma)
        ref, _ = brute_max(code)
        assert ref <= gamma
        if code.family == "random":
            assert code.certificate.max_inner == ref
        assert code.k <= ReedSolomonCode.for_max_inner(n, gamma).k and code.k <= n


def test_auto_prefers_smallest_k():
    assert position_codes(2**16).family == "reed-solomon"
    assert position_codes(2**16).k == 256
    assert position_codes(10).family == "onehot"  # k = 10 < 16
    assert position_codes(100).k == 64


# ------------------------------------------------------------------------------------------
# vectors and inner products
# ------------------------------------------------------------------------------------------


def _codes():
    return [
        position_codes(1000, family="reed-solomon"),
        ReedSolomonCode(300, 3, 3),
        RandomSignCode(700, 200, seed=5),
        OneHotCode(60),
    ]


@pytest.mark.parametrize("code", _codes(), ids=lambda c: c.family)
def test_on_demand_vectors_equal_table(code):
    T = code.table()
    assert T.dtype == np.int8 and T.shape == (code.n, code.k)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, code.n, size=20)
    assert np.array_equal(code.numerators(idx), T[idx])
    assert np.array_equal(code.numerators(int(idx[0])), T[idx[0]])
    num, scale = code.vectors(idx)
    assert np.array_equal(num, T[idx]) and scale == code.gram_scale
    if code.is_sign_code:
        assert set(np.unique(T).tolist()) <= {-1, 1}
        assert np.array_equal(code.signs(idx), T[idx])
        assert code.signs(3).shape == (code.k,)
        st = code.signs_torch(idx, "cpu")
        assert st.dtype == torch.int8 and np.array_equal(st.numpy(), T[idx])
    else:
        with pytest.raises(PositionCodeError, match="numerators"):
            code.signs(idx)
    # <T(i), T(i)> = 1
    assert all(code.inner(int(i), int(i)) == 1 for i in idx[:5])


@pytest.mark.parametrize("code", _codes(), ids=lambda c: c.family)
def test_inner_products_with_brute_force(code):
    T = code.table().astype(np.float64)
    G = np.rint(T @ T.T).astype(np.int64) * int(code.gram_scale * code.k)  # = k <T(i),T(j)>
    for p in (0, 1, code.n // 2, code.n - 1):
        got = code.inner_products_with(p)
        assert got.dtype == np.int64 and np.array_equal(got, G[p])
    idx = np.array([5, 0, 3, 5])
    assert np.array_equal(code.inner_products_with(2, idx), G[2, idx])


def test_agreements():
    code = position_codes(4096, family="reed-solomon")  # q = 16, d = 3
    c = np.arange(code.q**code.d)
    sym = gen.rs_symbols(np, code.field, code.d, c)
    assert np.array_equal(code.agreements(c), np.count_nonzero(sym == 0, axis=1))
    assert code.agreements(np.array([0]))[0] == code.q
    assert code.agreements(c[1:]).max() == code.d - 1
    # the Horner fallback (tables too large) agrees
    tabs = gen.AgreementTables(code.field, code.d, max_entries=1)
    assert not tabs.ok and np.array_equal(tabs.count(c[:500]), code.agreements(c[:500]))


def test_seeds():
    a, b, c = RandomSignCode(100, 128, seed=1), RandomSignCode(100, 128, seed=1), RandomSignCode(100, 128, seed=2)
    assert np.array_equal(a.table(), b.table())
    assert not np.array_equal(a.table(), c.table())
    # vector i depends on (seed, i) alone, and widths are prefixes of one stream
    assert np.array_equal(RandomSignCode(10**6, 128, seed=1).signs(42), a.signs(42))
    assert np.array_equal(RandomSignCode(100, 300, seed=1).table()[:, :128], a.table())
    assert position_codes(500, family="random", seed=4).k == position_codes(500, family="random", seed=4).k


# ------------------------------------------------------------------------------------------
# kernels
# ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_gram_kernel_random_matrices():
    rng = np.random.default_rng(2)
    for trial in range(40):
        block = int(rng.choice([2, 4, 16, 64, 2048]))
        n = int(rng.integers(2, 60 if block < 16 else 600))  # tiny blocks: many tiny tiles
        k = int(rng.integers(1, 300))
        vals = np.array([-1, 0, 1] if trial % 3 == 0 else [-1, 1], dtype=np.int8)
        X = rng.choice(vals, size=(n, k))
        if trial % 2 and n > 4:
            a, b = rng.choice(n, 2, replace=False)
            X[b] = X[a]
            X[b, : k // 3] *= -1
        G = X.astype(np.int64) @ X.T.astype(np.int64)
        ref = int(np.abs(G[np.triu_indices(n, 1)]).max())
        r = gram_absmax_cpu(lambda s, e: X[s:e], n, k, block=block)
        assert r.max_dot == ref and r.complete and r.pairs_examined == n * (n - 1) // 2
        assert r.pair[0] < r.pair[1] and abs(G[r.pair]) == ref
        r2 = gram_absmax_cpu(lambda s, e: X[s:e], n, k, block=block, stop_above=max(ref - 1, 0))
        assert r2.max_dot >= min(ref, r2.max_dot) and (r2.complete or r2.max_dot > max(ref - 1, 0))


def test_pack_base_exactness_condition():
    for k in (1, 8, 256, 512, 1000):
        c = pack_base(k)
        assert c is not None and c > 2 * k and k * (c + 1) + c // 2 < 2**22
    assert pack_base(2048) is None


def test_prefix_absmax():
    rng = np.random.default_rng(1)
    X = rng.choice(np.array([-1, 1], dtype=np.int8), size=(300, 64))
    M = prefix_absmax(X, 8)
    for g in range(8):
        kk = 8 * (g + 1)
        G = X[:, :kk].astype(np.int64) @ X[:, :kk].T.astype(np.int64)
        assert M[g] == np.abs(G[np.triu_indices(300, 1)]).max()


def test_cuda_tile_enumeration_covers_upper_triangle_once():
    from exactformer.constructions.codes.gram_cuda import num_tiles, tile_coords

    for n, BM, GS in [(1000, 128, 2), (5000, 128, 4), (300, 16, 3)]:
        nb = -(-n // BM)
        seen = [tile_coords(t, GS) for t in range(num_tiles(n, BM, GS))]
        real = [(i, j) for i, j in seen if i <= j and j < nb]
        assert sorted(real) == [(i, j) for i in range(nb) for j in range(i, nb)]


# ------------------------------------------------------------------------------------------
# bad input
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n=1), r"n must be an integer >= 2"),
        (dict(n=0), r"n must be an integer >= 2"),
        (dict(n=2.5), r"n must be an integer >= 2"),
        (dict(n=10, max_inner=0), r"max_inner must lie in the open interval \(0, 1\)"),
        (dict(n=10, max_inner=1), r"max_inner must lie in the open interval \(0, 1\)"),
        (dict(n=10, max_inner="-1/4"), r"max_inner must lie in the open interval \(0, 1\)"),
        (dict(n=10, max_inner="abc"), r"max_inner must be a number in the open interval \(0, 1\)"),
        (dict(n=10, family="hadamard"), r"family must be one of 'auto', 'reed-solomon', 'random', 'onehot'"),
        (dict(n=N_MAX["onehot"] + 1, family="onehot"), r"n = \d+ is beyond the reach of family 'onehot': n must lie in \[2, 16777216\]"),
        (dict(n=N_MAX["random"] + 1, family="random"), r"beyond the reach of family 'random': n must lie in \[2, 1048576\]"),
        (dict(n=N_MAX["reed-solomon"] + 1, family="reed-solomon"), r"beyond the reach of family 'reed-solomon'"),
        (dict(n=10**6, max_inner=Fraction(1, 10**5), family="reed-solomon"), r"max_inner >= "),
        (dict(n=10, device="tpu"), r"device must be 'cpu' or 'cuda'"),
        (dict(n=10, seed=-1), r"seed must be an integer in \[0, 2\^64\)"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(PositionCodeError, match=match) as e:
        position_codes(**kwargs)
    assert isinstance(e.value, ValueError)


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the no-CUDA error")
def test_cuda_without_cuda_is_a_clear_error():
    with pytest.raises(PositionCodeError, match=r"device='cuda' needs a CUDA device.*allowed here: device='cpu'"):
        position_codes(100, device="cuda")
    code = position_codes(100)
    with pytest.raises(PositionCodeError, match="needs a CUDA device"):
        code.certify(device="cuda")
    with pytest.raises(PositionCodeError, match="needs a CUDA device"):
        code.signs_torch([1, 2], "cuda")


def test_bad_indices_and_methods():
    code = position_codes(100, family="reed-solomon")
    with pytest.raises(PositionCodeError, match=r"indices must lie in \[0, n\) = \[0, 100\)"):
        code.signs([0, 100])
    with pytest.raises(PositionCodeError, match=r"p must lie in \[0, n\)"):
        code.inner_products_with(-1)
    with pytest.raises(PositionCodeError, match=r"device must be 'cpu' or 'cuda'"):
        code.certify(device="gpu")
    with pytest.raises(PositionCodeError, match=r"method must be 'auto' or 'gram'"):
        code.certify(method="fast")
    with pytest.raises(PositionCodeError, match=r"k must be an integer in \[1, 2\^24\]"):
        RandomSignCode(10, 0)
    with pytest.raises(PositionCodeError, match=r"d must be an integer >= 1 with q\^d"):
        ReedSolomonCode(100, 2, 2)
    with pytest.raises(PositionCodeError, match=r"m must be an integer in \[1, 12\]"):
        ReedSolomonCode(100, 13, 2)
    with pytest.raises(PositionCodeError, match=r"c must lie in \[0, q\^d\)"):
        code.agreements(np.array([code.q**code.d]))


# ------------------------------------------------------------------------------------------
# CUDA (skipped without a GPU)
# ------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_certify_matches_cpu():
    codes = [
        position_codes(4096, family="reed-solomon"),
        ReedSolomonCode(3000, 3, 4),
        RandomSignCode(3001, 200, seed=3),
        RandomSignCode(130, 8, seed=1),
        OneHotCode(700),
        RandomSignCode(2, 1),
    ]
    for code in codes:
        cpu = code.certify(device="cpu", method="gram")
        gpu = code.certify(device="cuda", method="gram")
        assert gpu.max_inner == cpu.max_inner, code
        i, j = gpu.pair
        assert i < j < code.n and abs(code.inner(i, j)) == cpu.max_inner
        if code.is_sign_code:
            idx = np.arange(0, code.n, 7)
            assert np.array_equal(code.signs_torch(idx, "cuda").cpu().numpy(), code.signs(idx))
    from exactformer.constructions.codes.gram_cuda import gram_absmax_cuda

    for code in codes[:3]:  # the torch fallback (used without Triton)
        X = code.signs_torch(np.arange(code.n), "cuda")
        best, pair, _ = gram_absmax_cuda(X, backend="torch")
        assert Fraction(best, code.k) == code.certify().max_inner == abs(code.inner(*pair))
    a = position_codes(2000, family="random", device="cuda", seed=2)
    b = position_codes(2000, family="random", device="cpu", seed=2)
    assert a.k == b.k and a.certificate.max_inner == b.certificate.max_inner
