"""ANNA (P2 Def. 3.3) implemented with locality-sensitive hashing (Alg. 1, Thm 3.4; docs/ema.md).

Alg. 1 as implemented (P2 Sec. 3.2; the algorithm itself is only described in prose): sample ``tables``
(ℓ) functions g_t = (h_t1, ..., h_tz) of ``hashes`` (z) functions each from an LSH family; every
bucket of table t keeps the sum of the values and the count of the keys hashed to it; query i reads
its bucket in every table and returns

    ANNA(X)_i = sum_t S_t[g_t(q_i)] / sum_t C_t[g_t(q_i)] = sum_j n_ij v_j / sum_j n_ij,
    n_ij = #{t : g_t(q_i) = g_t(k_j)},   so   w_ij = n_ij / sum_j' n_ij'.

When no key shares a bucket with q_i (sum_j n_ij = 0) the output is 0 and ``matched`` is False
(the EMA convention; Def. 3.3 has no such case). Buckets are exact: a table's code g_t(x) is z
symbols packed into int64 words and grouped by the exact sort of :func:`~.ema.match_sums` (bucket
sums and counts once per table, O(ℓ) lookups per query). Values are int64 and sums are exact, so
the output is the exact rational num/den.

Families (points are integer vectors; hashing is exact integer arithmetic, identical on every
backend): :class:`BitSampling` (Hamming space {0,1}^m), :class:`RandomHyperplane` (SimHash) and
:class:`CrossPolytope` (both on a sphere: all points of one squared norm R^2). Distances are
Euclidean as in Def. 3.3 and compared exactly through squared distances.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.precision._xp import NP
from exactformer.verify.attention.ema import EMAError, arange, backend, cat, int_array, to_numpy, match_sums

GAUSS_BITS = 20  # integer Gaussians: round(2^20 * N(0, 1)) -- exact dot products in float64
FLOAT_EXACT = 1 << 53
CHUNK_ENTRIES = 1 << 24  # symbols hashed per chunk of tables


class ANNAError(EMAError):
    """Bad arguments to an ANNA / LSH function (names the parameter and the allowed range)."""


def _int_param(v, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ANNAError(f"{name}: must be an integer {rng}, got {v!r}")
    return int(v)


def _fraction(v, name: str, lo: Fraction, strict: bool) -> Fraction:
    """v as an exact Fraction > lo (strict) or >= lo."""
    allowed = f"a rational number {'>' if strict else '>='} {lo}"
    try:
        f = Fraction(v)
    except (TypeError, ValueError):
        raise ANNAError(f"{name}: must be {allowed}, got {v!r}") from None
    if f < lo or (strict and f == lo):
        raise ANNAError(f"{name}: must be {allowed}, got {v!r}")
    return f


# ================================================================================================
# LSH families (Def. 3.2)
# ================================================================================================


class LSHFamily(ABC):
    """An LSH family H (Def. 3.2): ``sample`` draws hash functions, ``hash`` evaluates them exactly,
    ``collision_probability`` is Pr_h[h(x) = h(y)] as a function of the squared distance."""

    name: str
    on_sphere: bool = False

    @abstractmethod
    def sample(self, rng: np.random.Generator, dim: int, count: int) -> np.ndarray:
        """Parameters of ``count`` independent hash functions on dimension ``dim``."""

    @abstractmethod
    def hash(self, xp, params, X):
        """Symbols [n, count] int64 in [0, alphabet(dim)) of the points X [n, dim]."""

    @abstractmethod
    def alphabet(self, dim: int) -> int:
        """Number of distinct symbols one hash function takes."""

    @abstractmethod
    def collision_probability(self, dist_sq, dim: int, radius_sq: int | None = None) -> np.ndarray:
        """p(Δ) for squared distances Δ^2 (numpy array), points of dimension ``dim`` (on the sphere of
        squared radius ``radius_sq`` for sphere families)."""

    def param_columns(self, dim: int) -> int:
        """Columns of ``sample``'s parameters per hash function."""
        return 1

    def check_points(self, xp, X, name: str) -> int | None:
        """Validate integer points [n, dim] of the family's space; returns their squared radius (sphere
        families; None otherwise or for no points)."""
        if not self.on_sphere or not X.shape[0]:
            return None
        Xf = X.to(xp.t.float64) if xp.torch else X.astype(np.float64)
        lo, hi = xp.minmax((Xf * Xf).sum(-1))
        if hi >= FLOAT_EXACT or lo != hi or lo == 0:
            raise ANNAError(f"{name}: {self.name} needs points on one sphere (equal nonzero squared norms), "
                            f"got squared norms in [{lo}, {hi}]")
        return lo

    def __repr__(self) -> str:
        return self.name


class BitSampling(LSHFamily):
    """Bit sampling (Indyk–Motwani): h(x) = x_i, i uniform on [m]; points in {0,1}^m. For such points
    Δ^2 = Hamming(x, y), so p(Δ) = 1 - Δ^2/m exactly."""

    name = "bit-sampling"

    def sample(self, rng, dim, count):
        return rng.integers(0, dim, size=count)

    def hash(self, xp, params, X):
        idx = xp.from_numpy(params) if xp.torch else params
        return X[:, idx]

    def alphabet(self, dim):
        return 2

    def collision_probability(self, dist_sq, dim, radius_sq=None):
        return 1.0 - np.asarray(dist_sq, dtype=np.float64) / dim

    def check_points(self, xp, X, name):
        lo, hi = xp.minmax(X)
        if lo < 0 or hi > 1:
            raise ANNAError(f"{name}: bit sampling needs points in {{0,1}}^m, got coordinates in [{lo}, {hi}]")
        return None


def _gauss(rng: np.random.Generator, shape) -> np.ndarray:
    return np.rint(rng.standard_normal(shape) * (1 << GAUSS_BITS)).astype(np.int64)


def _project(xp, A: np.ndarray, X):
    """X @ A exactly (integer entries; float64 is exact while every partial sum is < 2^53)."""
    bound = int(np.abs(A).max(initial=0)) * A.shape[0]
    xmax = int(xp.minmax(X)[1]) if X.shape[0] else 0
    xmax = max(xmax, -int(xp.minmax(X)[0]) if X.shape[0] else 0)
    if bound * max(xmax, 1) >= FLOAT_EXACT:
        raise ANNAError(f"points: coordinates up to {xmax} are too large for exact hashing in dimension "
                        f"{A.shape[0]} (need |x| * dim * 2^{GAUSS_BITS + 3} < 2^53)")
    Af = xp.from_numpy(A.astype(np.float64)) if xp.torch else A.astype(np.float64)
    Xf = X.to(xp.t.float64) if xp.torch else X.astype(np.float64)
    return Xf @ Af


class RandomHyperplane(LSHFamily):
    """Random hyperplanes / SimHash (Charikar 2002): h(x) = [<a, x> >= 0], a Gaussian. For points on a
    sphere of squared radius R^2 at angle θ, cos θ = 1 - Δ^2/(2R^2) and p(Δ) = 1 - θ/π.

    a has integer entries round(2^20 * N(0, 1)), so <a, x> is exact; p(Δ) is the continuous
    family's (the rounding of a is not accounted for)."""

    name = "hyperplane"
    on_sphere = True

    def sample(self, rng, dim, count):
        return _gauss(rng, (dim, count))

    def hash(self, xp, params, X):
        P = _project(xp, params, X)
        return (P >= 0).to(xp.t.int64) if xp.torch else (P >= 0).astype(np.int64)

    def alphabet(self, dim):
        return 2

    def collision_probability(self, dist_sq, dim, radius_sq=None):
        cos = np.clip(1.0 - np.asarray(dist_sq, dtype=np.float64) / (2.0 * radius_sq), -1.0, 1.0)
        return 1.0 - np.arccos(cos) / math.pi


class CrossPolytope(LSHFamily):
    """Cross-polytope LSH (Terasawa–Tanaka; Andoni et al. 2015, P2's [6]): y = A x with A a Gaussian
    dim x dim matrix, h(x) = the closest of ±e_i to y: symbol 2i + [y_i < 0] for i = argmax |y_i|
    (first index on ties). Points on a sphere. p(Δ) has no closed form: it is estimated by Monte
    Carlo (``samples`` draws of the correlated Gaussian pair (Ax, Ay), seeded); P2 Remark 3.6's
    exp(-Δ^2 ln m / (4 - Δ^2)) is its asymptotic form."""

    name = "cross-polytope"
    on_sphere = True

    def __init__(self, samples: int = 20000, seed: int = 0):
        self.samples = _int_param(samples, "samples", 100)
        self.seed = _int_param(seed, "seed", 0)
        self._cache: dict[tuple[float, int, int], float] = {}

    def sample(self, rng, dim, count):
        return _gauss(rng, (dim, count * dim))

    def param_columns(self, dim):
        return dim

    def hash(self, xp, params, X):
        dim = params.shape[0]
        Y = _project(xp, params, X).reshape(X.shape[0], -1, dim)
        i = xp.t.argmax(Y.abs(), dim=-1) if xp.torch else np.argmax(np.abs(Y), axis=-1)
        yi = xp.t.gather(Y, -1, i[..., None])[..., 0] if xp.torch else np.take_along_axis(Y, i[..., None], -1)[..., 0]
        neg = (yi < 0).to(xp.t.int64) if xp.torch else (yi < 0).astype(np.int64)
        return 2 * i + neg

    def alphabet(self, dim):
        return 2 * dim

    def collision_probability(self, dist_sq, dim, radius_sq=None):
        d2 = np.asarray(dist_sq, dtype=np.float64)
        uniq, inv = np.unique(d2, return_inverse=True)
        todo = [u for u in uniq.tolist() if (u, dim, radius_sq) not in self._cache]
        if todo:
            rng = np.random.default_rng(self.seed)
            G1 = rng.standard_normal((self.samples, dim))
            G2 = rng.standard_normal((self.samples, dim))
            rows = np.arange(self.samples)
            i1 = np.argmax(np.abs(G1), -1)
            s1 = G1[rows, i1] < 0
            for u in todo:
                cos = min(1.0, max(-1.0, 1.0 - u / (2.0 * radius_sq)))
                Y = cos * G1 + math.sqrt(max(0.0, 1.0 - cos * cos)) * G2
                i2 = np.argmax(np.abs(Y), -1)
                self._cache[(u, dim, radius_sq)] = float(np.mean((i1 == i2) & (s1 == (Y[rows, i2] < 0))))
        vals = np.array([self._cache[(u, dim, radius_sq)] for u in uniq.tolist()])
        return vals[inv.reshape(-1)].reshape(d2.shape)


FAMILIES = {"bit-sampling": BitSampling, "hyperplane": RandomHyperplane, "cross-polytope": CrossPolytope}


def family(name: str) -> LSHFamily:
    """An LSH family by name: one of ``FAMILIES``."""
    if name not in FAMILIES:
        raise ANNAError(f"family: must be one of {sorted(FAMILIES)}, got {name!r}")
    return FAMILIES[name]()


# ================================================================================================
# Alg. 1
# ================================================================================================


def pack_symbols(xp, sym, sbits: int, word_bits: int = 62):
    """Symbols [n, T, z] of sbits bits each -> words [n, T, kw] int64 in [0, 2^word_bits), symbol t
    in bits [(t mod per) sbits, ...) of word t // per, per = floor(word_bits / sbits): exact and
    injective (equal words iff equal symbols)."""
    n, T, z = (int(s) for s in sym.shape)
    per = max(1, word_bits // sbits)
    out = xp.zeros((n, T, -(-z // per)))
    for t in range(z):
        w, j = divmod(t, per)
        out[:, :, w] |= sym[:, :, t] << (j * sbits)
    return out


def _tables_first(xp, c):
    return c.transpose(0, 1) if xp.torch else c.transpose(1, 0, 2)


@dataclass
class ANNAResult:
    """Result of :class:`LSHAttention` (arrays of the input's library and device).

    ``num`` [Nq, dv] int64: sum_j n_ij v_j; ``den`` [Nq] int64: sum_j n_ij (the total count
    of the query's ℓ buckets). The output is num/den; 0 where den = 0 (no key collides)."""

    num: Any
    den: Any

    @property
    def matched(self):
        return self.den > 0

    def output(self) -> np.ndarray:
        """Object array [..., dv] of exact Fractions num/den (0 where den = 0)."""
        num = to_numpy(self.num).astype(object)
        den = np.broadcast_to(np.maximum(to_numpy(self.den), 1)[..., None], num.shape).astype(object)
        return np.frompyfunc(Fraction, 2, 1)(num, den).astype(object).reshape(num.shape)


class LSHAttention:
    """Alg. 1 (P2 Sec. 3.2): ``tables`` hash tables, each keyed by ``hashes`` concatenated functions of
    ``family`` on points of dimension ``dim``, sampled from numpy's Generator(``seed``)."""

    def __init__(self, family: LSHFamily, dim: int, tables: int, hashes: int, seed: int = 0):
        if not isinstance(family, LSHFamily):
            raise ANNAError(f"family: must be an LSHFamily ({sorted(FAMILIES)}), got {family!r}")
        self.family = family
        self.dim = _int_param(dim, "dim", 1)
        self.tables = _int_param(tables, "tables", 1)
        self.hashes = _int_param(hashes, "hashes", 1)
        self.seed = _int_param(seed, "seed", 0)
        self.params = family.sample(np.random.default_rng(seed), self.dim, self.tables * self.hashes)
        self.symbol_bits = max(1, (family.alphabet(self.dim) - 1).bit_length())

    def __repr__(self) -> str:
        return (f"LSHAttention({self.family.name}, dim={self.dim}, tables={self.tables}, hashes={self.hashes}, "
                f"seed={self.seed})")

    def _table_params(self, t0: int, t1: int) -> np.ndarray:
        cols = self.hashes * self.family.param_columns(self.dim)
        return self.params[..., t0 * cols:t1 * cols]

    def table_chunks(self, n_points: int):
        """Ranges [t0, t1) of tables hashed together (about CHUNK_ENTRIES symbols per chunk)."""
        per = max(1, CHUNK_ENTRIES // max(1, n_points * self.hashes))
        return [(t0, min(self.tables, t0 + per)) for t0 in range(0, self.tables, per)]

    def symbols(self, X, t0: int = 0, t1: int | None = None):
        """The hash symbols h_t1(x) .. h_tz(x) of tables t in [t0, t1): [n, T, z] int64 (X [n, dim]
        integer points)."""
        xp = backend({"points": X}, ANNAError)
        t1 = self.tables if t1 is None else t1
        return self.family.hash(xp, self._table_params(t0, t1), X).reshape(int(X.shape[0]), t1 - t0, self.hashes)

    def codes(self, X, t0: int = 0, t1: int | None = None, word_bits: int = 62):
        """Exact bucket codes g_t(x), t in [t0, t1): words [n, T, kw] int64 in [0, 2^word_bits)
        (X [n, dim] integer points)."""
        xp = backend({"points": X}, ANNAError)
        return pack_symbols(xp, self.symbols(X, t0, t1), self.symbol_bits, word_bits)

    def _points(self, xp, X, name: str):
        """X as validated integer points [N, dim] of the family's space."""
        a = int_array(xp, X, name, ANNAError)
        if a.ndim != 2 or int(a.shape[1]) != self.dim:
            raise ANNAError(f"{name}: must have shape [N, {self.dim}], got {tuple(a.shape)}")
        self.family.check_points(xp, a, name)
        return a

    def buckets(self, xp, Q, K, V):
        """Per chunk of tables [t0, t1): (key codes [T, Nk, kw], query codes [T, Nq, kw], bucket counts
        [T, Nq] = |bucket_t(q_i)|, bucket sums [T, Nq, dv]) -- the EMA core with tables as the batch."""
        Nq, Nk = int(Q.shape[0]), int(K.shape[0])
        for t0, t1 in self.table_chunks(Nq + Nk):
            T = t1 - t0
            kc, qc = _tables_first(xp, self.codes(K, t0, t1)), _tables_first(xp, self.codes(Q, t0, t1))
            kw = int(kc.shape[-1])
            ar_k, ar_q = arange(xp, T * Nk), arange(xp, T * Nq)
            batch = cat(xp, [ar_k // max(Nk, 1), ar_q // max(Nq, 1)])
            count, total, _, _ = match_sums(xp, kc.reshape(T * Nk, kw), qc.reshape(T * Nq, kw), batch, T,
                                            ar_k % max(Nk, 1), None, T * Nq, V)
            yield kc, qc, count.reshape(T, Nq), total.reshape(T, Nq, int(V.shape[1]))

    def __call__(self, queries, keys, values) -> ANNAResult:
        """Alg. 1 on queries [Nq, dim], keys [Nk, dim] (integer points of the family's space) and
        values [Nk, dv] int64. Exact: num and den are integer sums."""
        xp = backend({"queries": queries, "keys": keys, "values": values}, ANNAError)
        Q, K = self._points(xp, queries, "queries"), self._points(xp, keys, "keys")
        V = int_array(xp, values, "values", ANNAError)
        Nq, Nk = int(Q.shape[0]), int(K.shape[0])
        if V.ndim != 2 or int(V.shape[0]) != Nk:
            raise ANNAError(f"values: must have shape [Nk, dv] = [{Nk}, dv], got {tuple(V.shape)}")
        dv = int(V.shape[1])
        if V.numel() if xp.torch else V.size:
            lo, hi = xp.minmax(V)
            if self.tables * Nk * max(-lo, hi) > (1 << 63) - 1:
                raise ANNAError(f"values: tables * Nk * max|v| = {self.tables} * {Nk} * {max(-lo, hi)} can exceed int64")
        num, den = xp.zeros((Nq, dv)), xp.zeros((Nq,))
        for _, _, count, total in self.buckets(xp, Q, K, V):
            den = den + count.sum(0)
            num = num + total.sum(0)
        return ANNAResult(num, den)


# ================================================================================================
# Thm 3.4, reconstructed (docs/ema.md, "Theorem 3.4")
# ================================================================================================


@dataclass(frozen=True)
class Thm34:
    """Thm 3.4's parameters and the failure bound of the reconstruction, for n tokens.

    ``hashes`` z = ceil(3 ln n / ln(1/p2)) (p2^z <= n^-3) and ``tables`` ℓ = ceil(3 ln n / p1^z)
    unless given. ``far_term`` = 1 - (1 - p2^z)^ℓ bounds the probability that one far pair
    (Δ > cr) shares a bucket in some table; ``near_term`` = (1 - p1^z)^ℓ that one near pair
    (Δ <= r) shares none. No other event breaks Def. 3.3 (docs/ema.md), and a pair is near or far
    or neither, so ``fail_prob`` η = min(1, n^2 max(far_term, near_term)). With the default z, ℓ:
    η <= ℓ/n + 1/n = O(n^{3ρ-1} log n). ``time_exponent`` 1 + 3ρ: Alg. 1 costs
    O(m n ℓ z) = O(m n^{1+3ρ} log n log_{1/p2} n). ``applies``: ρ < 1/3 (P2 Thm 3.4)."""

    n: int
    p1: float
    p2: float
    rho: float
    hashes: int
    tables: int
    far_term: float
    near_term: float
    fail_prob: float
    time_exponent: float
    applies: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def thm34(n: int, p1: float, p2: float, *, tables: int | None = None, hashes: int | None = None) -> Thm34:
    """Thm 3.4 (P2 Sec. 3.2) for an (r, cr, p1, p2)-sensitive family and n tokens (see :class:`Thm34`)."""
    n = _int_param(n, "n", 2)
    if not (0 < p2 < p1 <= 1):
        raise ANNAError(f"p1, p2: need 0 < p2 < p1 <= 1, got p1 = {p1}, p2 = {p2}")
    rho = math.log(1 / p1) / math.log(1 / p2)
    z = math.ceil(3 * math.log(n) / math.log(1 / p2)) if hashes is None else _int_param(hashes, "hashes", 1)
    p1z, p2z = p1 ** z, p2 ** z
    ell = math.ceil(3 * math.log(n) / p1z) if tables is None else _int_param(tables, "tables", 1)
    far = -math.expm1(ell * math.log1p(-p2z))
    near = math.exp(ell * math.log1p(-p1z)) if p1z < 1 else 0.0
    return Thm34(n, p1, p2, rho, z, ell, far, near, min(1.0, n * n * max(far, near)), 1 + 3 * rho, rho < 1 / 3)


# ================================================================================================
# Def. 3.3's conditions, measured
# ================================================================================================


@dataclass
class ConditionReport:
    """How often Def. 3.3's conditions fail for Alg. 1 with one seed on given data.

    ``far_failures``: checked queries with positive weight on a key at Δ > cr (first condition);
    ``near_failures``: checked queries with a key at Δ <= r whose weight is below
    1/((|N(q, cr)| - 1)ℓ + 1) (second condition; a near key that collides in no table has weight 0);
    ``failed``: some checked query fails (the event Def. 3.3 bounds by η). ``rows``: the checked
    query indices (``sampled``: drawn with Generator(``seed``)). ``near_pairs``, ``far_pairs``:
    counts over checked queries. ``no_collision``: checked queries with no key in any of their
    buckets. ``worst_far``: the query with the largest total weight on far keys;
    ``worst_near``: the near pair with the smallest weight / bound. ``union_bound``: the
    probability bound of the reconstruction on this data: sum over far pairs of 1 - (1 - p^z)^ℓ
    plus sum over near pairs of (1 - p^z)^ℓ, p = the family's p(Δ). ``theorem``: :func:`thm34` at
    n = max(Nq, Nk) with p1 = p(r), p2 = p(cr) and this ℓ, z."""

    queries_checked: int
    sampled: bool
    seed: int
    rows: np.ndarray
    far_failures: int
    near_failures: int
    near_pairs: int
    far_pairs: int
    no_collision: int
    worst_far: dict | None
    worst_near: dict | None
    union_bound: float
    theorem: Thm34

    @property
    def failed(self) -> bool:
        return bool(self.far_failures or self.near_failures)

    @property
    def far_rate(self) -> float:
        return self.far_failures / max(self.queries_checked, 1)

    @property
    def near_rate(self) -> float:
        return self.near_failures / max(self.queries_checked, 1)

    def as_dict(self) -> dict[str, Any]:
        return {"queries_checked": self.queries_checked, "sampled": self.sampled, "seed": self.seed,
                "far_failures": self.far_failures, "near_failures": self.near_failures, "far_rate": self.far_rate,
                "near_rate": self.near_rate, "failed": self.failed, "near_pairs": self.near_pairs,
                "far_pairs": self.far_pairs, "no_collision": self.no_collision, "worst_far": self.worst_far,
                "worst_near": self.worst_near, "union_bound": self.union_bound, "theorem": self.theorem.as_dict()}


def _sq_distances(Q: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Exact squared distances [nq, nk] (int64): float64 products are exact below 2^53."""
    m = int(Q.shape[1])
    mx = max(int(np.abs(Q).max(initial=0)), int(np.abs(K).max(initial=0)))
    if 4 * m * mx * mx >= FLOAT_EXACT:
        raise ANNAError(f"points: coordinates up to {mx} in dimension {m} are too large for exact distances "
                        "(need 4 * dim * max|x|^2 < 2^53)")
    Qf, Kf = Q.astype(np.float64), K.astype(np.float64)
    d2 = (Qf * Qf).sum(1)[:, None] + (Kf * Kf).sum(1)[None, :] - 2.0 * (Qf @ Kf.T)
    return d2.astype(np.int64)


def check_conditions(lsh: LSHAttention, queries, keys, *, r_sq, approx_c, sample: int | None = None,
                     seed: int = 0, block: int = 256) -> ConditionReport:
    """Measure Def. 3.3's two conditions for Alg. 1 (``lsh``, its seed) on queries [Nq, dim] and keys
    [Nk, dim] (integer points; numpy or torch, checked on the host).

    ``r_sq`` = r^2 >= 0 and ``approx_c`` = c > 1 (rationals): near means Δ^2 <= r^2, far
    Δ^2 > c^2 r^2, both decided exactly on integer squared distances (r = 0: near = identical). ``sample``: check that many queries drawn
    without replacement with Generator(``seed``) (None: all). Weights are exact: w_ij =
    n_ij / sum_j' n_ij', with n_ij counted over the ℓ tables and the denominator from the exact
    bucket counts. Cost O(checked * Nk * dim + ℓ (Nq + Nk) log N)."""
    Q = lsh._points(NP, to_numpy(queries), "queries")
    K = lsh._points(NP, to_numpy(keys), "keys")
    R2, R2k = lsh.family.check_points(NP, Q, "queries"), lsh.family.check_points(NP, K, "keys")
    if R2 is not None and R2k is not None and R2 != R2k:
        raise ANNAError(f"keys: must lie on the queries' sphere (squared norm {R2}), got {R2k}")
    R2 = R2 if R2 is not None else R2k
    r2 = _fraction(r_sq, "r_sq", Fraction(0), strict=False)
    c = _fraction(approx_c, "approx_c", Fraction(1), strict=True)
    cr2 = c * c * r2
    near_max, mid_max = math.floor(r2), math.floor(cr2)  # integer Δ^2: Δ^2 <= x  <=>  Δ^2 <= floor(x)
    Nq, Nk = Q.shape[0], K.shape[0]
    if sample is not None:
        sample = _int_param(sample, "sample", 1)
    sampled = sample is not None and sample < Nq
    rows = np.sort(np.random.default_rng(seed).choice(Nq, sample, replace=False)) if sampled else np.arange(Nq)
    nr, ell, z = len(rows), lsh.tables, lsh.hashes

    # den_i = sum_t |bucket_t(q_i)|, exactly, with the EMA core (no values)
    den = np.zeros(nr, np.int64)
    Qr = Q[rows]
    key_codes = []
    for kc, qc, count, _ in lsh.buckets(NP, Qr, K, np.zeros((Nk, 0), np.int64)):
        den += count.sum(0)
        key_codes.append((kc, qc))

    # exact distances by blocks of queries; n_ij for the pairs within cr
    pi, pj, pd2, union = [], [], [], 0.0
    near_pairs = far_pairs = 0
    for b0 in range(0, nr, block):
        D2 = _sq_distances(Qr[b0:b0 + block], K)
        ii, jj = np.nonzero(D2 <= mid_max)
        pi.append(ii + b0)
        pj.append(jj)
        pd2.append(D2[ii, jj])
        near = D2 <= near_max
        far = D2 > mid_max
        near_pairs += int(near.sum())
        far_pairs += int(far.sum())
        pz = lsh.family.collision_probability(D2, lsh.dim, R2) ** z
        with np.errstate(divide="ignore"):
            miss = np.exp(ell * np.log1p(-np.minimum(pz, 1.0)))  # (1 - p^z)^ℓ
        union += float(miss[near].sum()) + float((1.0 - miss[far]).sum())
    pi, pj, pd2 = np.concatenate(pi), np.concatenate(pj), np.concatenate(pd2)
    nij = np.zeros(len(pi), np.int64)
    for kc, qc in key_codes:
        nij += np.all(qc[:, pi] == kc[:, pj], axis=-1).sum(0)
    within = np.bincount(pi, minlength=nr)  # |N(q_i, cr)|
    far_weight = den - np.bincount(pi, weights=nij, minlength=nr).astype(np.int64)
    far_fail = far_weight > 0
    L = (within - 1) * ell + 1  # 1/L is the bound of the second condition
    isnear = pd2 <= near_max
    bad = isnear & ((nij == 0) | (nij * L[pi] < den[pi]))
    near_fail = np.bincount(pi[bad], minlength=nr) > 0

    worst_far = None
    if far_fail.any():
        i = int(np.argmax(np.where(den > 0, far_weight / np.maximum(den, 1), 0)))
        worst_far = {"query": int(rows[i]), "far_weight": str(Fraction(int(far_weight[i]), int(den[i]))),
                     "near_keys": int(within[i])}
    worst_near = None
    if isnear.any():
        ratio = np.where(den[pi] > 0, nij * L[pi] / np.maximum(den[pi], 1), 0.0)
        ratio = np.where(isnear, ratio, np.inf)
        k = int(np.argmin(ratio))
        i = pi[k]
        worst_near = {"query": int(rows[i]), "key": int(pj[k]), "dist_sq": int(pd2[k]),
                      "weight": str(Fraction(int(nij[k]), int(den[i])) if den[i] else Fraction(0)),
                      "bound": str(Fraction(1, int(L[i]))), "fails": bool(bad[k])}
    pr = lsh.family.collision_probability(np.array([float(r2), float(cr2)]), lsh.dim, R2)
    theorem = thm34(max(Nq, Nk, 2), float(pr[0]), float(pr[1]), tables=ell, hashes=z) if pr[1] < pr[0] and pr[1] > 0 \
        else None
    return ConditionReport(nr, sampled, seed, rows, int(far_fail.sum()), int(near_fail.sum()), near_pairs, far_pairs,
                           int((den == 0).sum()), worst_far, worst_near, union, theorem)


# ================================================================================================
# planted near/far data
# ================================================================================================


@dataclass
class Planted:
    """Planted data: ``keys`` uniform in {0,1}^dim (or {-1,+1}^dim on the sphere), the first
    ``planted`` queries each a copy of key ``partner[i]`` with ``flips[i]`` <= near_flips bits
    flipped, the other queries uniform. ``r_sq``: r^2 with r the largest planted distance
    (near_flips bits: Hamming = Δ^2 on {0,1}, 4 * Hamming on {-1,+1})."""

    queries: np.ndarray
    keys: np.ndarray
    partner: np.ndarray
    flips: np.ndarray
    r_sq: int


def planted_data(n_queries: int, n_keys: int, dim: int, near_flips: int, *, planted: float = 1.0,
                 sphere: bool = False, seed: int = 0) -> Planted:
    """Seeded planted near-neighbour data for :func:`check_conditions` (see :class:`Planted`)."""
    n_queries, n_keys = _int_param(n_queries, "n_queries", 1), _int_param(n_keys, "n_keys", 1)
    dim = _int_param(dim, "dim", 1)
    near_flips = _int_param(near_flips, "near_flips", 0, dim)
    if not 0 <= planted <= 1:
        raise ANNAError(f"planted: must lie in [0, 1], got {planted!r}")
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2, (n_keys, dim))
    queries = rng.integers(0, 2, (n_queries, dim))
    n_pl = int(round(planted * n_queries))
    partner = np.full(n_queries, -1)
    flips = np.zeros(n_queries, np.int64)
    partner[:n_pl] = rng.integers(0, n_keys, n_pl)
    flips[:n_pl] = rng.integers(0, near_flips + 1, n_pl)
    for i in range(n_pl):
        q = keys[partner[i]].copy()
        pos = rng.choice(dim, flips[i], replace=False)
        q[pos] ^= 1
        queries[i] = q
    if sphere:
        return Planted(2 * queries - 1, 2 * keys - 1, partner, flips, 4 * near_flips)
    return Planted(queries, keys, partner, flips, near_flips)
