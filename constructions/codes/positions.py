"""Near-orthogonal position codes T(0), ..., T(n-1) (Lemma 2 / Cor. 8.1 of the paper).

``position_codes(n, max_inner=Fraction(1, 4), family="auto", seed=0)`` returns a code with
``|<T(i), T(j)>| <= max_inner`` for i != j and ``<T(i), T(i)> = 1``, vectors generated on demand.
Families (docs/positions.md has the proofs, the search and the tables):

* ``reed-solomon``: Reed--Solomon over GF(q), q = 2^m, concatenated with the Hadamard code.
  k = q^2, proved bound (d-1)/q. Certification uses the algebra: O(n q).
* ``random``: seeded counter-based +-1 vectors; the smallest k (multiple of 8) found by exact
  certification of all pairs. No proof (``bound is None``); the certificate is attached.
* ``onehot``: the width-n baseline T(i) = e_i (``signs`` does not exist; see ``numerators``).
* ``auto``: the smallest k that carries a proof or a passed certificate (ties: smaller bound).

Conventions, uniform over families:

* ``numerators(indices)`` -> int8 [m, k] and ``gram_scale`` (a Fraction) with
  ``<T(i), T(j)> = <numerators(i), numerators(j)> * gram_scale``; ``vectors(indices)`` returns
  the pair. For +-1 families numerators = signs and gram_scale = 1/k (T = signs / sqrt(k)); for
  onehot numerators are the one-hot rows and gram_scale = 1.
* ``inner_products_with(p, indices)`` -> int64 ``k * <T(p), T(i)>`` (an integer for every family;
  for +-1 codes it is ``<signs(p), signs(i)>``). Divide by ``k`` for the exact inner product.
* ``certify(device, progress, method)`` -> :class:`Certificate` with the exact
  ``max_{i != j} |<T(i), T(j)>|`` (a Fraction), a pair attaining it and the time taken.

Bad input raises :class:`PositionCodeError` (a ValueError) naming the parameter and the allowed
range.
"""

from __future__ import annotations

import hashlib

import math
import time
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Optional, Sequence, Union

import numpy as np

from exactformer.constructions.codes import generators as gen
from exactformer.constructions.core.ir import code_fingerprint
from exactformer.precision import cuda_available
from exactformer.constructions.codes.gram import (
    K_EXACT_MAX,
    GramMax,
    gram_absmax_cpu,
    prefix_absmax,
)

__all__ = [
    "PositionCodeError",
    "Certificate",
    "PositionCode",
    "ReedSolomonCode",
    "RandomSignCode",
    "OneHotCode",
    "BinaryCode",
    "position_codes",
    "lemma2_k",
    "parse_max_inner",
    "choose_reed_solomon",
    "FAMILIES",
    "N_MAX",
]

FAMILIES = ("auto", "reed-solomon", "random", "onehot")
#: Largest n per family: RS positions stay far inside int64 digit arithmetic; onehot has k = n and
#: every certification kernel is exact only for k <= 2^24; a random code needs all-pairs
#: certificates: at 2^20 one probe (k ~ 800) is ~1.5 s on an H200 and about an hour on 2 CPU cores.
N_MAX = {"reed-solomon": 1 << 40, "random": 1 << 20, "onehot": K_EXACT_MAX, "binary": 1 << 62}
RANDOM_K_STEP = 8  # the random family's k is searched over multiples of 8
RANDOM_SUBSET = 512  # positions used for the exact lower bound of the random search
#: first probe k_lo * (ln n / ln 512)^1.4, then x1.15 per failed probe (fitted to searches at
#: N = 2^10..2^20 on an H200; the heuristic only orders the probes, it decides nothing)
GUESS_EXPONENT = 1.4
GROWTH = 1.15
#: work auto may spend certifying random candidates, in pair-columns (pairs x k) per device:
#: 2^39 (= 2^31 pairs x 256, the CPU benchmark) is ~6-7 s on 2 idle CPU cores; on an H200 2^39
#: takes 0.45 s, so 2^43 is ~7 s.
AUTO_BUDGET = {"cpu": 1 << 39, "cuda": 1 << 43}

IndexLike = Union[int, np.integer, Sequence[int], np.ndarray]


class PositionCodeError(ValueError):
    """Invalid arguments for a position code (the message names the parameter and its range)."""


# ------------------------------------------------------------------------------------------
# argument parsing
# ------------------------------------------------------------------------------------------


def parse_max_inner(x: Any) -> Fraction:
    """A Fraction in the open interval (0, 1) from a Fraction, int, float, or "a/b"/"0.25" string."""
    try:
        if isinstance(x, Fraction):
            f = x
        elif isinstance(x, bool):
            raise TypeError
        elif isinstance(x, (int, np.integer)):
            f = Fraction(int(x))
        elif isinstance(x, (float, np.floating)):
            if not math.isfinite(float(x)):
                raise ValueError
            f = Fraction(repr(float(x)))  # the decimal the caller wrote: 0.1 -> 1/10
        elif isinstance(x, str):
            f = Fraction(x.strip())
        else:
            raise TypeError
    except (TypeError, ValueError, ZeroDivisionError):
        raise PositionCodeError(
            f"max_inner must be a number in the open interval (0, 1), e.g. 1/4 or 0.25 (got {x!r})"
        ) from None
    if not (0 < f < 1):
        raise PositionCodeError(f"max_inner must lie in the open interval (0, 1) (got {f})")
    return f


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise PositionCodeError(f"n must be an integer >= 2 (got {n!r})")
    n = int(n)
    if n < 2:
        raise PositionCodeError(f"n must be an integer >= 2 (got {n})")
    return n


def _check_family_reach(family: str, n: int) -> None:
    if n > N_MAX[family]:
        raise PositionCodeError(
            f"n = {n} is beyond the reach of family {family!r}: n must lie in "
            f"[2, {N_MAX[family]}] (2^{N_MAX[family].bit_length() - 1}) for this family"
        )


def _check_device(device: Any) -> str:
    if not isinstance(device, str) or not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise PositionCodeError(f"device must be 'cpu' or 'cuda' (or 'cuda:N') (got {device!r})")
    if device.startswith("cuda"):
        if not cuda_available():
            raise PositionCodeError(
                f"device={device!r} needs a CUDA device, but torch.cuda.is_available() is False; "
                "allowed here: device='cpu'"
            )
    return device


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not (0 <= int(seed) < 1 << 64):
        raise PositionCodeError(f"seed must be an integer in [0, 2^64) (got {seed!r})")
    return int(seed)


def lemma2_k(n: int, gamma: Fraction) -> int:
    """The paper's width k = ceil(8 ln(2n) / gamma^2) (Lemma 2), exactly (50-digit mpmath)."""
    import mpmath

    with mpmath.workdps(50):
        v = 8 * mpmath.log(2 * n) * gamma.denominator**2 / gamma.numerator**2
        return int(mpmath.ceil(v))


def _frac_str(f: Optional[Fraction]) -> Optional[str]:
    return None if f is None else f"{f.numerator}/{f.denominator}"


# ------------------------------------------------------------------------------------------
# certificates
# ------------------------------------------------------------------------------------------


@dataclass
class Certificate:
    """The exact maximum off-diagonal inner product of a code, found by exhaustive computation.

    ``max_inner = max_{i != j} |<T(i), T(j)>|`` (exact), ``pair`` attains it (i < j),
    ``max_dot = k * max_inner`` (an integer), ``seconds`` is the wall time (vector generation
    included). ``method`` is "gram" (all pairs' dot products), "algebraic" (Reed--Solomon: roots of
    f_c for c in {i XOR j}) or "orthogonal" (onehot)."""

    max_inner: Fraction
    pair: tuple[int, int]
    seconds: float
    max_dot: int
    n: int
    k: int
    family: str
    method: str
    device: str
    max_inner_requested: Optional[Fraction] = None

    @property
    def passed(self) -> Optional[bool]:
        """max_inner <= the requested max_inner (None when the code has no requested value)."""
        return None if self.max_inner_requested is None else self.max_inner <= self.max_inner_requested

    def to_dict(self) -> dict:
        d = asdict(self)
        d["max_inner"] = _frac_str(self.max_inner)
        d["max_inner_requested"] = _frac_str(self.max_inner_requested)
        d["pair"] = list(self.pair)
        d["passed"] = self.passed
        return d


# ------------------------------------------------------------------------------------------
# the codes
# ------------------------------------------------------------------------------------------


class PositionCode:
    """Common interface (see the module docstring). Subclasses implement ``_numerators_np``,
    ``_numerators_torch`` and ``_inner_dots``."""

    family: str = ""
    is_sign_code: bool = True

    def __init__(self, n: int, k: int, max_inner: Any = Fraction(1, 4)):
        self.n = _check_n(n)
        self.k = int(k)
        self.max_inner = parse_max_inner(max_inner)
        self.paper_k = lemma2_k(self.n, self.max_inner)
        self.q: Optional[int] = None
        self.d: Optional[int] = None
        self.m: Optional[int] = None
        self.seed: Optional[int] = None
        self.bound: Optional[Fraction] = None
        self.certificate: Optional[Certificate] = None
        self.search_log: Optional[list] = None
        self.auto_log: Optional[dict] = None

    # -- indices -----------------------------------------------------------------------------

    def _indices(self, indices: IndexLike, name: str = "indices") -> tuple[np.ndarray, bool]:
        scalar = isinstance(indices, (int, np.integer)) and not isinstance(indices, bool)
        idx = np.asarray(indices)
        if idx.dtype == bool or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
            raise PositionCodeError(f"{name} must be integers in [0, n) = [0, {self.n}) (got dtype {idx.dtype})")
        idx = idx.astype(np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            bad = int(idx[(idx < 0) | (idx >= self.n)][0])
            raise PositionCodeError(f"{name} must lie in [0, n) = [0, {self.n}) (got {bad})")
        return idx, scalar

    # -- vectors -----------------------------------------------------------------------------

    @property
    def gram_scale(self) -> Fraction:
        """<T(i), T(j)> = <numerators(i), numerators(j)> * gram_scale."""
        return Fraction(1, self.k)

    def numerators(self, indices: IndexLike) -> np.ndarray:
        """int8 [k] for an int, int8 [m, k] for m indices (O(k) time and memory per vector)."""
        idx, scalar = self._indices(indices)
        out = self._numerators_np(idx)
        return out[0] if scalar else out

    def vectors(self, indices: IndexLike) -> tuple[np.ndarray, Fraction]:
        """``(numerators, gram_scale)``: T(i) = numerators(i) * sqrt(gram_scale), exactly."""
        return self.numerators(indices), self.gram_scale

    def signs(self, indices: IndexLike) -> np.ndarray:
        """The +-1 vectors (int8 [k] or [m, k]); T(i) = signs(i) / sqrt(k)."""
        return self.numerators(indices)

    def signs_torch(self, indices: IndexLike, device: Any = "cpu"):
        """torch int8 [m, k] (or [k] for an int) on ``device``, generated there."""
        import torch

        idx, scalar = self._indices(indices)
        dev = torch.device(_check_device(device) if isinstance(device, str) else device)
        out = self._numerators_torch(torch.as_tensor(idx, device=dev), dev)
        return out[0] if scalar else out

    def table(self) -> np.ndarray:
        """The whole [n, k] table (tests and small n only: it is what the API otherwise avoids)."""
        return self.numerators(np.arange(self.n))

    def _numerators_block(self, start: int, stop: int) -> np.ndarray:
        return self._numerators_np(np.arange(start, stop, dtype=np.int64))

    # -- decoding ------------------------------------------------------------------------------

    def decode(self, signs: np.ndarray) -> Optional[np.ndarray]:
        """The index i with ``numerators(i) == signs`` for each row of ``signs`` [N, k] (+-1), -1
        where no codeword is; None for a family without a decoder. Every index returned is checked
        by generating its vector, so a decoder only has to propose the right one."""
        signs = np.asarray(signs)
        cand = self._decode_candidates(signs)
        if cand is None:
            return None
        out = np.where((cand >= 0) & (cand < self.n), cand, -1).astype(np.int64)
        rows = np.flatnonzero(out >= 0)
        if rows.size:
            same = np.all(self._numerators_np(out[rows]) == signs[rows], axis=1)
            out[rows[~same]] = -1
        return out

    def _decode_candidates(self, signs: np.ndarray) -> Optional[np.ndarray]:
        """A proposed index per row (anything where there is none: :meth:`decode` checks), or None
        when the family has no decoder."""
        return None

    # -- inner products ------------------------------------------------------------------------

    def inner_products_with(self, p: int, indices: Optional[IndexLike] = None) -> np.ndarray:
        """int64 ``k * <T(p), T(i)>`` for i in ``indices`` (default: all of 0..n-1)."""
        pi, _ = self._indices(p, "p")
        if pi.size != 1:
            raise PositionCodeError("p must be a single position in [0, n)")
        idx = np.arange(self.n, dtype=np.int64) if indices is None else self._indices(indices)[0]
        return self._inner_dots(int(pi[0]), idx)

    def max_distinct_dot(self) -> int:
        """The largest <numerators(i), numerators(j)> over i != j (signed; from the family's bound)."""
        if self.bound is None:
            raise PositionCodeError(f"family {self.family!r}: no proved bound on the inner products")
        return int(math.floor(self.bound / self.gram_scale))

    def inner(self, i: int, j: int) -> Fraction:
        """Exact <T(i), T(j)>."""
        return Fraction(int(self.inner_products_with(i, np.array([j]))[0]), self.k)

    def _inner_dots(self, p: int, idx: np.ndarray) -> np.ndarray:
        sp = self._numerators_np(np.array([p])).astype(np.int32)[0]
        out = np.empty(idx.size, dtype=np.int64)
        step = max(1, (1 << 22) // max(self.k, 1))
        for s in range(0, idx.size, step):
            out[s : s + step] = self._numerators_np(idx[s : s + step]).astype(np.int32) @ sp
        scale = self.gram_scale * self.k  # 1 for +-1 codes, k for onehot
        return out * int(scale)

    # -- certification -----------------------------------------------------------------------

    def certify(self, device: str = "cpu", progress: bool = False, method: str = "auto") -> Certificate:
        """Exact ``max_{i != j} |<T(i), T(j)>|`` in integer arithmetic (see :class:`Certificate`).

        ``method``: "auto" (the family's fastest exact method: algebraic for reed-solomon,
        orthogonality for onehot, all-pairs Gram for random), or "gram" (all pairs' dot products on
        ``device``; a cross-check for the structured families)."""
        device = _check_device(device)
        if method not in ("auto", "gram"):
            raise PositionCodeError(f"method must be 'auto' or 'gram' (got {method!r})")
        if method == "auto":
            cert = self._certify_structured(progress)
            if cert is not None:
                return cert
        return self._certify_gram(device, progress)

    def _certify_structured(self, progress: bool) -> Optional[Certificate]:
        return None

    def _certify_gram(self, device: str, progress: bool, stop_above: Optional[int] = None) -> Certificate:
        res = self._gram(device, progress, stop_above)
        return self._make_cert(res.max_dot, res.pair, res.seconds, "gram", device)

    def _gram(self, device: str, progress: bool, stop_above: Optional[int] = None) -> GramMax:
        if device == "cpu":
            return gram_absmax_cpu(self._numerators_block, self.n, self.k, progress=progress, stop_above=stop_above)
        import torch

        from exactformer.constructions.codes.gram_cuda import gram_absmax_cuda

        t0 = time.perf_counter()
        dev = torch.device(device)
        X = torch.empty((self.n, self.k), dtype=torch.int8, device=dev)
        step = max(1, (1 << 24) // max(self.k, 1))
        for s in range(0, self.n, step):
            e = min(self.n, s + step)
            X[s:e] = self._numerators_torch(torch.arange(s, e, device=dev), dev)
        best, pair, _ = gram_absmax_cuda(X, progress=progress)
        torch.cuda.synchronize(dev)
        return GramMax(best, pair, time.perf_counter() - t0, True, self.n * (self.n - 1) // 2)

    def _make_cert(self, max_dot: int, pair, seconds: float, method: str, device: str) -> Certificate:
        max_inner = Fraction(max_dot) * self.gram_scale
        return Certificate(
            max_inner=max_inner,
            pair=(int(pair[0]), int(pair[1])),
            seconds=seconds,
            max_dot=int(max_inner * self.k),
            n=self.n,
            k=self.k,
            family=self.family,
            method=method,
            device=device,
            max_inner_requested=self.max_inner,
        )

    # -- description ---------------------------------------------------------------------------

    def describe(self) -> dict:
        d = {
            "family": self.family,
            "n": self.n,
            "k": self.k,
            "q": self.q,
            "d": self.d,
            "m": self.m,
            "seed": self.seed,
            "max_inner": _frac_str(self.max_inner),
            "bound": _frac_str(self.bound),
            "paper_k": self.paper_k,
            "gram_scale": _frac_str(self.gram_scale),
            "certified_max": _frac_str(self.certificate.max_inner) if self.certificate else None,
        }
        if self.certificate is not None:
            d["certificate"] = self.certificate.to_dict()
        if self.search_log is not None:
            d["search"] = self.search_log
        if self.auto_log is not None:
            d["auto"] = self.auto_log
        return d

    def __repr__(self) -> str:
        extra = "".join(f", {a}={getattr(self, a)}" for a in ("q", "d", "seed") if getattr(self, a) is not None)
        return f"<{type(self).__name__} n={self.n} k={self.k}{extra} bound={_frac_str(self.bound)}>"


class ReedSolomonCode(PositionCode):
    """Reed--Solomon over GF(2^m) (degree < d) concatenated with the Hadamard code; k = q^2.

    Position i is the polynomial f_i(x) = sum_j c_j x^j whose coefficients c_j are the base-q
    digits of i; vector entry ``x*q + b`` is ``(-1)^popcount(f_i(x) & b)`` for x, b in GF(q).
    ``<signs(i), signs(j)> = q * #{x : f_i(x) = f_j(x)} = q * #roots(f_{i XOR j})``."""

    family = "reed-solomon"

    def __init__(self, n: int, m: int, d: int, max_inner: Any = Fraction(1, 4)):
        if not (isinstance(m, (int, np.integer)) and 1 <= m <= gen.M_MAX):
            raise PositionCodeError(f"m must be an integer in [1, {gen.M_MAX}] (got {m!r})")
        q = 1 << int(m)
        super().__init__(n, q * q, max_inner)
        if not (isinstance(d, (int, np.integer)) and d >= 1 and q ** int(d) >= self.n):
            raise PositionCodeError(f"d must be an integer >= 1 with q^d = {q}^d >= n = {self.n} (got {d!r})")
        _check_family_reach(self.family, self.n)
        self.m, self.q, self.d = int(m), q, int(d)
        self.field = gen.gf2m(self.m)
        self.bound = Fraction(self.d - 1, q)
        self._agree: Optional[gen.AgreementTables] = None

    @classmethod
    def for_max_inner(cls, n: int, max_inner: Any = Fraction(1, 4)) -> "ReedSolomonCode":
        m, d = choose_reed_solomon(n, max_inner)
        return cls(n, m, d, max_inner)

    def _numerators_np(self, idx: np.ndarray) -> np.ndarray:
        return gen.rs_signs(np, self.field, self.d, idx)

    def generator_key(self) -> tuple:
        """Everything the vectors depend on (see :func:`exactformer.constructions.core.ir.code_fingerprint`)."""
        return (self.family, self.n, self.m, self.d)

    def _numerators_torch(self, idx, device):
        import torch

        return gen.rs_signs(torch, self.field, self.d, idx, device)

    def agreements(self, c: Any) -> np.ndarray:
        """int64: the number of roots in GF(q) of the polynomial whose coefficient digits are the
        base-q digits of c (vectorised; c in [0, q^d)); ``agreements(0) = q``. Two positions i, j
        agree at ``agreements(i ^ j)`` evaluation points."""
        c = np.asarray(c, dtype=np.int64)
        limit = self.q**self.d
        if c.size and (c.min() < 0 or (limit < 1 << 63 and c.max() >= limit)):
            raise PositionCodeError(f"c must lie in [0, q^d) = [0, {limit})")
        if self._agree is None:
            self._agree = gen.AgreementTables(self.field, self.d)
        flat = c.reshape(-1)
        out = np.empty(flat.size, dtype=np.int64)
        step = 1 << 16
        for s in range(0, flat.size, step):
            out[s : s + step] = self._agree.count(flat[s : s + step])
        return out.reshape(c.shape)

    def _inner_dots(self, p: int, idx: np.ndarray) -> np.ndarray:
        return self.q * self.agreements(idx ^ p)

    def _decode_candidates(self, signs: np.ndarray) -> Optional[np.ndarray]:
        """The symbols f(x) from the Hadamard blocks (entry x*q + 2^t is -1 iff bit t of f(x) is
        set), then the d coefficients by Newton interpolation on x = 0 .. d-1 in GF(q) (the
        position's base-q digits)."""
        q, m, d, f = self.q, self.m, self.d, self.field
        if d > q:
            return None
        blocks = signs.reshape(signs.shape[0], q, q)
        sym = (blocks[:, :, 1 << np.arange(m)] < 0).astype(np.int64) @ (np.int64(1) << np.arange(m, dtype=np.int64))
        inv = lambda a: f.exp[(q - 1 - f.log[a]) % (q - 1)]  # noqa: E731  (a != 0)
        c = sym[:, :d].copy()  # divided differences, in place: c[i] = f[x_0 .. x_i]
        for j in range(1, d):
            for i in range(d - 1, j - 1, -1):
                c[:, i] = f.mul(c[:, i] ^ c[:, i - 1], inv(i ^ (i - j)))
        poly = np.zeros((signs.shape[0], d), dtype=np.int64)  # Newton form to coefficients (Horner)
        poly[:, 0] = c[:, d - 1]
        for i in range(d - 2, -1, -1):  # poly <- poly * (x + i) + c[i]  (char 2: minus is plus)
            shifted = np.zeros_like(poly)
            shifted[:, 1:] = poly[:, :-1]
            poly = shifted ^ f.mul(poly, np.full_like(poly, i))
            poly[:, 0] ^= c[:, i]
        return poly @ (np.int64(1) << (m * np.arange(d, dtype=np.int64)))

    def predicted_max(self) -> Fraction:
        """The exact maximum, by the argument in docs/positions.md: with d' the least d' >= 1 such
        that q^d' >= n, the XORs {i ^ j : i < j < n} are exactly [1, 2^ceil(log2 n)), which contains
        every monic polynomial of degree d'-1, so the maximum is min(d'-1, q)/q. It equals the
        bound (d-1)/q iff n > q^(d-1) (always true for codes chosen by ``position_codes``)."""
        dp = 1
        while self.q**dp < self.n:
            dp += 1
        return Fraction(min(dp - 1, self.q), self.q)

    def _certify_structured(self, progress: bool) -> Certificate:
        """max over i < j < n of agreements(i ^ j) = max over c in [1, L) with L = 2^ceil(log2 n):
        with t = L/2 < n, pairs inside [0, t) give every XOR in [1, t) and pairs (i, t + j') with
        i < t <= t + j' < n give t + (i ^ j') = every value in [t, L). O(L q) work."""
        from tqdm.auto import tqdm

        t0 = time.perf_counter()
        L = 1 << (self.n - 1).bit_length()
        best, best_c = -1, 1
        step = 1 << 16
        with tqdm(total=L - 1, disable=not progress, desc="certify (algebraic)", leave=False) as bar:
            for s in range(1, L, step):
                c = np.arange(s, min(L, s + step), dtype=np.int64)
                a = self.agreements(c)
                j = int(np.argmax(a))
                if a[j] > best:
                    best, best_c = int(a[j]), int(c[j])
                bar.update(c.size)
        t = L >> 1
        pair = (0, best_c) if best_c < t else (best_c ^ t, t)
        return self._make_cert(self.q * best, pair, time.perf_counter() - t0, "algebraic", "cpu")


class RandomSignCode(PositionCode):
    """Seeded counter-based +-1 vectors: entry j of T(i) is bit j of splitmix64's stream seeded by
    mix64(seed_key + (i+1) * GAMMA) (see position_codes_gen). No proof: ``bound`` is None; codes
    returned by ``position_codes`` carry the passed certificate in ``certificate``."""

    family = "random"

    def __init__(self, n: int, k: int, seed: int = 0, max_inner: Any = Fraction(1, 4)):
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not (1 <= k <= K_EXACT_MAX):
            raise PositionCodeError(f"k must be an integer in [1, 2^24] (got {k!r})")
        super().__init__(n, int(k), max_inner)
        self.seed = _check_seed(seed)
        self.key = gen.seed_key(self.seed)

    def _numerators_np(self, idx: np.ndarray) -> np.ndarray:
        return gen.random_signs(np, self.key, self.k, idx)

    def generator_key(self) -> tuple:
        return (self.family, self.n, self.k, self.seed)

    def _numerators_torch(self, idx, device):
        import torch

        return gen.random_signs(torch, self.key, self.k, idx, device)

    def with_k(self, k: int) -> "RandomSignCode":
        """The same seed at another width (vectors are prefixes of one stream)."""
        return RandomSignCode(self.n, k, self.seed, self.max_inner)


class OneHotCode(PositionCode):
    """T(i) = e_i in R^n (k = n, bound 0). Not a +-1 code: ``signs``/``signs_torch`` raise;
    ``numerators`` gives the one-hot rows and ``gram_scale`` is 1."""

    family = "onehot"
    is_sign_code = False

    def __init__(self, n: int, max_inner: Any = Fraction(1, 4)):
        n = _check_n(n)
        _check_family_reach(self.family, n)
        super().__init__(n, n, max_inner)
        self.bound = Fraction(0)

    @property
    def gram_scale(self) -> Fraction:
        return Fraction(1)

    def generator_key(self) -> tuple:
        return (self.family, self.n)

    def signs(self, indices: IndexLike) -> np.ndarray:
        raise PositionCodeError(
            "family 'onehot' has no +-1 signs: use numerators(indices) (one-hot rows, "
            "gram_scale = 1) or vectors(indices)"
        )

    def signs_torch(self, indices: IndexLike, device: Any = "cpu"):
        self.signs(indices)

    def numerators_torch(self, indices: IndexLike, device: Any = "cpu"):
        return PositionCode.signs_torch(self, indices, device)

    def _numerators_np(self, idx: np.ndarray) -> np.ndarray:
        out = np.zeros((idx.size, self.n), dtype=np.int8)
        out[np.arange(idx.size), idx] = 1
        return out

    def _numerators_torch(self, idx, device):
        import torch

        out = torch.zeros((idx.numel(), self.n), dtype=torch.int8, device=device)
        out[torch.arange(idx.numel(), device=device), idx] = 1
        return out

    def _inner_dots(self, p: int, idx: np.ndarray) -> np.ndarray:
        return np.where(idx == p, self.k, 0).astype(np.int64)

    def _certify_structured(self, progress: bool) -> Certificate:
        return self._make_cert(0, (0, 1), 0.0, "orthogonal", "cpu")


class BinaryCode(PositionCode):
    """T(i) = the k = max(1, ceil(log2 n)) bits of i as +-1 (entry b is +1 iff bit b of i is set).

    The narrowest +-1 code of n distinct vectors, for pointers (P2's k-hop, docs/mpc.md): not
    near-orthogonal -- <T(i), T(j)> = k - 2 Hamming(i, j), so distinct positions have inner
    product at most k - 2 (and complements -k: ``bound`` is 1) -- but every codeword is its own
    position's and the position is linear in the entries: i = sum_b 2^b (T_b(i) + 1) / 2."""

    family = "binary"

    def __init__(self, n: int):
        n = _check_n(n)
        _check_family_reach(self.family, n)
        k = max(1, (n - 1).bit_length())
        super().__init__(n, k, Fraction(1, 2))
        self.bound = Fraction(1)

    def generator_key(self) -> tuple:
        return (self.family, self.n)

    def _numerators_np(self, idx: np.ndarray) -> np.ndarray:
        bits = (np.asarray(idx, dtype=np.int64)[:, None] >> np.arange(self.k, dtype=np.int64)) & 1
        return (2 * bits - 1).astype(np.int8)

    def _numerators_torch(self, idx, device):
        import torch

        bits = (idx.to(torch.int64)[:, None] >> torch.arange(self.k, device=device)) & 1
        return (2 * bits - 1).to(torch.int8)

    def _decode_candidates(self, signs: np.ndarray) -> np.ndarray:
        """i = sum_b 2^b [entry b is +1]."""
        return (signs > 0).astype(np.int64) @ (np.int64(1) << np.arange(self.k, dtype=np.int64))

    def max_distinct_dot(self) -> int:
        """Distinct positions differ in at least one bit: <T(i), T(j)> <= k - 2."""
        return self.k - 2

    def _certify_structured(self, progress: bool) -> Certificate:
        """|<T(i), T(j)>| = k for the complementary pair 2^(k-1) - 1, 2^(k-1) (both < n)."""
        i = (1 << (self.k - 1)) - 1
        return self._make_cert(int(np.abs(self._inner_dots(i, np.array([i + 1])))[0]), (i, i + 1), 0.0, "binary", "cpu")


# ------------------------------------------------------------------------------------------
# choosing codes
# ------------------------------------------------------------------------------------------


def choose_reed_solomon(n: int, max_inner: Any = Fraction(1, 4)) -> tuple[int, int]:
    """The (m, d) with q = 2^m, q^d >= n and (d-1)/q <= max_inner that minimises k = q^2 (d is
    then the least d with q^d >= n, which also minimises the bound)."""
    n = _check_n(n)
    gamma = parse_max_inner(max_inner)
    _check_family_reach("reed-solomon", n)
    for m in range(1, gen.M_MAX + 1):
        q = 1 << m
        d = 1
        while q**d < n:
            d += 1
        if Fraction(d - 1, q) <= gamma:
            return m, d
    raise PositionCodeError(
        f"n = {n} with max_inner = {gamma} is beyond the reach of family 'reed-solomon': it needs "
        f"q = 2^m > 2^{gen.M_MAX} (k = q^2 > 2^24); allowed: max_inner >= "
        f"{_rs_min_gamma(n)} for this n"
    )


def _rs_min_gamma(n: int) -> Fraction:
    q = 1 << gen.M_MAX
    d = 1
    while q**d < n:
        d += 1
    return Fraction(d - 1, q)


@dataclass
class _Probe:
    k: int
    passed: bool
    max_dot: int
    complete: bool
    seconds: float
    pair: tuple


def _round_up(x: float, step: int) -> int:
    return int(math.ceil(x / step)) * step


def search_random(
    n: int,
    max_inner: Any = Fraction(1, 4),
    seed: int = 0,
    *,
    device: str = "cpu",
    progress: bool = False,
    k_max: Optional[int] = None,
    budget: Optional[int] = None,
) -> tuple[Optional[RandomSignCode], list]:
    """Smallest certified k (multiple of 8) for the random family; returns (code or None, log).

    1. Exact lower bound: all pairs of the first min(n, 512) positions, at every k = 8, 16, ...
       up to the cap (prefix property: width-k vectors are prefixes), give k_lo, the least k at
       which even that subset passes; any k that passes for all n positions passes for the subset.
       If n <= 512 this is already the exact answer.
    2. Otherwise probe k = guess (k_lo * (ln n / ln n0)^1.4, rounded up to 8), then grow k by 15%
       per failed probe (up to the cap, then the next cap) until one passes, then bisect between
       the largest failing and the smallest passing k until they are 8 apart. Each probe is an
       exact all-pairs certification (on CPU a failing one stops at the first violating tile).
    The result k passes and k - 8 fails (a local minimum on the grid: for one seed pass/fail is not
    monotone in k). Caps: [k_max] if given, else [paper_k, 2 paper_k] (rounded up to 8). ``budget``
    bounds the pair-columns (pairs x k) spent on probes; when it runs out the best passing k so far
    is returned."""
    n = _check_n(n)
    gamma = parse_max_inner(max_inner)
    seed = _check_seed(seed)
    step = RANDOM_K_STEP
    base = RandomSignCode(n, step, seed, gamma)
    caps = [k_max] if k_max is not None else [_round_up(base.paper_k, step), 2 * _round_up(base.paper_k, step)]
    caps = [c for c in caps if c >= step]
    log: list = []
    n0 = min(n, RANDOM_SUBSET)
    k_lo, cap = None, None
    t0 = time.perf_counter()
    for cap in caps:
        if cap > K_EXACT_MAX:
            break
        M0 = prefix_absmax(gen.random_signs(np, base.key, cap, np.arange(n0)), step)
        ks = step * np.arange(1, M0.size + 1)
        ok = np.nonzero(M0 <= gamma * ks)[0]
        if ok.size:
            k_lo = int(ks[ok[0]])
            break
    log.append({"stage": "subset", "n0": n0, "cap": cap, "k_lo": k_lo, "seconds": time.perf_counter() - t0})
    if k_lo is None:
        return None, log
    used = 0
    probes: dict[int, _Probe] = {}

    def probe(k: int) -> Optional[_Probe]:
        nonlocal used
        cost = n * (n - 1) // 2 * k
        if budget is not None and used + cost > budget:
            log.append({"stage": "budget", "k": k, "cost": cost, "used": used, "budget": budget})
            return None
        used += cost
        code = base.with_k(k)
        limit = int(gamma * k)  # pass iff max_dot <= gamma * k
        res = code._gram(device, progress, stop_above=limit if device == "cpu" else None)
        pr = _Probe(k, res.complete and res.max_dot <= limit, res.max_dot, res.complete, res.seconds, res.pair)
        probes[k] = pr
        log.append({"stage": "probe", **asdict(pr), "pair": list(pr.pair)})
        return pr

    if n == n0:
        lo, hi = k_lo - step, k_lo
        pr = probe(k_lo)
        if pr is None or not pr.passed:  # pragma: no cover - the subset is the whole set
            return None, log
    else:
        lo, hi = k_lo - step, None
        ci = caps.index(cap)
        ratio = math.log(n) / math.log(n0)
        k = min(cap, max(k_lo, _round_up(k_lo * ratio**GUESS_EXPONENT, step)))
        while k <= K_EXACT_MAX:
            pr = probe(k)
            if pr is None:
                break
            if pr.passed:
                hi = k
                break
            lo = k
            if k >= caps[ci]:
                ci += 1
                if ci == len(caps):
                    break
            k = min(caps[ci], max(k + step, _round_up(k * GROWTH, step)))
        if hi is None:
            return None, log
        while hi - lo > step:
            mid = _round_up((lo + hi) / 2, step)
            if mid >= hi:
                mid = hi - step
            pr = probe(mid)
            if pr is None:
                break
            if pr.passed:
                hi = mid
            else:
                lo = mid
    code = base.with_k(hi)
    pr = probes[hi]
    code.certificate = code._make_cert(pr.max_dot, pr.pair, pr.seconds, "gram", device)
    code.search_log = log
    return code, log


def position_codes(
    n: int,
    max_inner: Any = Fraction(1, 4),
    family: str = "auto",
    seed: int = 0,
    *,
    device: str = "cpu",
    progress: bool = False,
    auto_budget: Optional[int] = None,
) -> PositionCode:
    """A code for positions 0..n-1 with max off-diagonal |<T(i), T(j)>| <= max_inner.

    ``device`` is where the random family's certification runs; ``auto_budget`` (pair-columns,
    default AUTO_BUDGET[device]) bounds the certification work ``auto`` spends on random
    candidates. See the module docstring and docs/positions.md."""
    n = _check_n(n)
    gamma = parse_max_inner(max_inner)
    if family not in FAMILIES:
        raise PositionCodeError(f"family must be one of {', '.join(repr(f) for f in FAMILIES)} (got {family!r})")
    device = _check_device(device)
    seed = _check_seed(seed)
    if family == "reed-solomon":
        return ReedSolomonCode.for_max_inner(n, gamma)
    if family == "onehot":
        return OneHotCode(n, gamma)
    if family == "random":
        _check_family_reach("random", n)
        code, log = search_random(n, gamma, seed, device=device, progress=progress)
        if code is None:
            raise PositionCodeError(
                f"family 'random' with seed={seed}: no k <= 2 * paper_k passed certification for "
                f"n = {n}, max_inner = {gamma}; try another seed (search log: {log})"
            )
        return code
    return _auto(n, gamma, seed, device, progress, auto_budget)


def _auto(n: int, gamma: Fraction, seed: int, device: str, progress: bool, budget: Optional[int]) -> PositionCode:
    budget = AUTO_BUDGET["cpu" if device == "cpu" else "cuda"] if budget is None else int(budget)
    proven: list[PositionCode] = []
    log: dict = {"candidates": [], "budget": budget}
    for fam, make in (("reed-solomon", lambda: ReedSolomonCode.for_max_inner(n, gamma)), ("onehot", lambda: OneHotCode(n, gamma))):
        try:
            code = make()
            proven.append(code)
            log["candidates"].append({"family": fam, "k": code.k, "bound": _frac_str(code.bound)})
        except PositionCodeError as e:
            log["candidates"].append({"family": fam, "skipped": str(e)})
    best = min(proven, key=lambda c: (c.k, c.bound)) if proven else None
    if n > N_MAX["random"]:
        log["candidates"].append({"family": "random", "skipped": f"n > {N_MAX['random']}"})
    elif best is not None and best.k <= RANDOM_K_STEP:
        log["candidates"].append({"family": "random", "skipped": "no smaller multiple of 8 than the proven k"})
    else:
        k_top = (best.k - 1) // RANDOM_K_STEP * RANDOM_K_STEP if best is not None else None
        rnd, rlog = search_random(n, gamma, seed, device=device, progress=progress, k_max=k_top, budget=budget)
        entry = {"family": "random", "k_max": k_top, "search": rlog}
        if rnd is not None:
            entry.update(k=rnd.k, certified_max=_frac_str(rnd.certificate.max_inner))
            if best is None or rnd.k < best.k:
                best = rnd
        log["candidates"].append(entry)
    if best is None:
        raise PositionCodeError(f"no family reaches n = {n} at max_inner = {gamma}: n must be <= {N_MAX['reed-solomon']}")
    log["chosen"] = best.family
    best.auto_log = log
    return best


class CodeView:
    """A position code read through an index map: vector ``idx`` of the view is vector
    ``base_indices(idx)`` of ``base`` (its numerators: +-1 signs, or 0/1 rows for one-hot).

    ``kind``: "identity"; "constant" (every index maps to ``data``, an int); "table" (``data`` is an
    int64 array: index i maps to data[i]). Used for query blocks whose code index is not an affine
    function of the position (T(0) for unused slots, arbitrary feature index sets)."""

    def __init__(self, base: Any, kind: str = "identity", data: Any = None):
        if kind not in ("identity", "constant", "table"):
            raise ValueError(f"kind must be 'identity', 'constant' or 'table', got {kind!r}")
        self.base, self.kind = base, kind
        self.data = np.asarray(data, dtype=np.int64) if kind == "table" else data
        self.k, self.bound, self.family = base.k, base.bound, base.family
        self.n = len(self.data) if kind == "table" else (base.n if kind == "identity" else 1 << 62)
        self.is_sign_code = getattr(base, "is_sign_code", True)
        self.gram_scale = getattr(base, "gram_scale", Fraction(1, base.k))

    def base_indices(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if self.kind == "identity":
            return idx
        if self.kind == "constant":
            return np.full(idx.shape, int(self.data), dtype=np.int64)
        return self.data[idx]

    def numerators(self, idx) -> np.ndarray:
        return np.asarray(self.base.numerators(self.base_indices(idx)))

    signs = numerators

    def generator_key(self) -> tuple:
        data = hashlib.sha256(np.ascontiguousarray(self.data).tobytes()).hexdigest() if self.kind == "table" else self.data
        return ("view", self.kind, data, code_fingerprint(self.base))

    def describe(self) -> dict:
        out = {"family": "view", "kind": self.kind, "base": self.base.describe() if hasattr(self.base, "describe") else {}}
        if self.kind == "constant":
            out["index"] = int(self.data)
        elif self.kind == "table":
            out["table_len"] = int(len(self.data))
        return out
