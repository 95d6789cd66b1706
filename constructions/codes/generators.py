"""On-demand generation of position-code vectors (numpy or torch, CPU or CUDA).

Two generators, both O(k) time and memory per vector and written once for both array libraries
(``xp`` is the ``numpy`` or ``torch`` module; every operation used -- ``+ * ^ & >>``, indexing a
table, ``where`` -- means the same in both on int64 arrays, and int64 multiplication wraps modulo
2^64 in both, which the hash relies on):

* Reed--Solomon over GF(2^m) followed by the Hadamard code (:func:`rs_symbols`, :func:`rs_signs`);
* a counter-based hash (splitmix64) giving the random family's sign bits (:func:`random_signs`).

GF(2^m) arithmetic uses hand-written log/antilog tables rather than ``galois`` FieldArrays, for
three reasons: the hot loops are table lookups on arrays of millions of entries, where plain
numpy/torch indexing is much faster than FieldArray dispatch; the same tables must work on a CUDA
device (torch tensors), which galois cannot do; and the benchmark machine has no galois. The
field is fixed to galois' own choice (the Conway polynomial, which is primitive, so ``x`` generates
the multiplicative group), and tests/test_position_codes.py checks every product against
``galois.GF(2**m)`` for m = 1..8, so the codes are exactly what galois arithmetic would give.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

# Conway polynomials of GF(2^m) as integers (bit j = coefficient of x^j); these are
# ``int(galois.GF(2**m).irreducible_poly)`` (checked in the tests).
CONWAY_POLY = {
    1: 0b11,
    2: 0b111,
    3: 0b1011,
    4: 0b10011,
    5: 0b100101,
    6: 0b1011011,
    7: 0b10000011,
    8: 0x11D,
    9: 0x211,
    10: 0x46F,
    11: 0x805,
    12: 0x10EB,
}
M_MAX = max(CONWAY_POLY)


# ------------------------------------------------------------------------------------------
# GF(2^m)
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GF2m:
    """GF(2^m) with elements the integers 0..q-1 (polynomial basis, as galois' integer repr).

    ``exp[e] = x^e`` for e in [0, 2(q-1)) (doubled so a sum of two logs needs no reduction) and
    ``log[a]`` for a != 0 (``log[0] = 0`` is a placeholder that callers mask).
    """

    m: int
    q: int
    poly: int
    exp: np.ndarray  # int64 [2(q-1)]
    log: np.ndarray  # int64 [q]

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        prod = self.exp[self.log[a] + self.log[b]]
        return np.where((a == 0) | (b == 0), 0, prod)


@functools.lru_cache(maxsize=None)
def gf2m(m: int) -> GF2m:
    if m not in CONWAY_POLY:
        raise ValueError(f"m must be in [1, {M_MAX}] (got {m})")
    q = 1 << m
    poly = CONWAY_POLY[m]
    exp = np.zeros(2 * (q - 1), dtype=np.int64)
    x = 1
    for e in range(q - 1):
        exp[e] = x
        x <<= 1
        if x & q:
            x ^= poly
    if x != 1 or len(set(exp[: q - 1].tolist())) != q - 1:  # pragma: no cover - table sanity
        raise AssertionError(f"x is not primitive modulo {poly:#x}")
    exp[q - 1 :] = exp[: q - 1]
    log = np.zeros(q, dtype=np.int64)
    log[exp[: q - 1]] = np.arange(q - 1, dtype=np.int64)
    exp.setflags(write=False)
    log.setflags(write=False)
    return GF2m(m, q, poly, exp, log)


@functools.lru_cache(maxsize=None)
def hadamard(q: int) -> np.ndarray:
    """Sylvester Hadamard matrix, int8 [q, q]: ``H[s, b] = (-1)^popcount(s & b)``."""
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < q:
        h = np.block([[h, h], [h, -h]]).astype(np.int8)
    h.setflags(write=False)
    return h


_TORCH_TABLES: dict = {}


def _tables(xp: Any, field: GF2m, device: Any = None):
    if xp is np:
        return field.exp, field.log, hadamard(field.q)
    key = (field.m, str(xp.device(device) if device is not None else "cpu"))
    if key not in _TORCH_TABLES:
        _TORCH_TABLES[key] = tuple(
            xp.tensor(np.array(t), device=device) for t in (field.exp, field.log, hadamard(field.q))
        )
    return _TORCH_TABLES[key]


def rs_symbols(xp: Any, field: GF2m, d: int, idx: Any, device: Any = None) -> Any:
    """Reed--Solomon symbols, int64 [len(idx), q]: the polynomial whose coefficients are the d
    base-q digits of ``idx`` (digit j = coefficient of x^j), evaluated at every field element
    0..q-1, by Horner's rule (d table-lookup steps on a [len(idx), q] array)."""
    exp, log, _ = _tables(xp, field, device)
    q, m = field.q, field.m
    if xp is np:
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        xs = np.arange(q, dtype=np.int64)
    else:
        idx = xp.as_tensor(idx, dtype=xp.int64, device=device).reshape(-1)
        xs = xp.arange(q, dtype=xp.int64, device=device)
    logx = log[xs][None, :]
    xzero = (xs == 0)[None, :]
    acc = ((idx >> (m * (d - 1))) & (q - 1))[:, None] + 0 * xs[None, :]
    for j in range(d - 2, -1, -1):
        prod = exp[log[acc] + logx]
        acc = xp.where((acc == 0) | xzero, 0, prod)
        acc = acc ^ ((idx >> (m * j)) & (q - 1))[:, None]
    return acc


def rs_signs(xp: Any, field: GF2m, d: int, idx: Any, device: Any = None) -> Any:
    """Reed--Solomon∘Hadamard sign vectors, int8 [len(idx), q*q]; entry ``x*q + b`` is
    ``(-1)^popcount(f_idx(x) & b)``."""
    _, _, h = _tables(xp, field, device)
    sym = rs_symbols(xp, field, d, idx, device)
    return h[sym].reshape(sym.shape[0], field.q * field.q)


class AgreementTables:
    """Meet-in-the-middle evaluation tables for counting roots of many polynomials at once.

    A digit vector c (an integer < q^d) splits into its low ``d_lo`` digits and the rest:
    ``f_c(x) = lo[c_lo, x] XOR hi[c_hi, x]`` (addition in GF(2^m) is XOR), so
    ``#roots(f_c) = #{x : lo[c_lo, x] == hi[c_hi, x]}``: one comparison per (c, x) instead of a
    Horner chain. Tables hold q^d_lo * q + q^(d - d_lo) * q entries; when that would exceed
    ``max_entries`` the caller falls back to Horner (:func:`rs_symbols`).
    """

    def __init__(self, field: GF2m, d: int, max_entries: int = 1 << 23):
        self.field, self.d = field, d
        q, m = field.q, field.m
        self.d_lo = d // 2
        self.d_hi = d - self.d_lo
        size = (q**self.d_lo + q**self.d_hi) * q
        self.ok = size <= max_entries
        if not self.ok:
            return
        dtype = np.uint16 if q <= 1 << 16 else np.int64
        self.lo = rs_symbols(np, field, max(self.d_lo, 1), np.arange(q**self.d_lo)).astype(dtype)
        hi_idx = np.arange(q**self.d_hi, dtype=np.int64) << (m * self.d_lo)
        self.hi = rs_symbols(np, field, d, hi_idx).astype(dtype)
        self.shift = m * self.d_lo
        self.mask = (1 << self.shift) - 1

    def count(self, c: np.ndarray) -> np.ndarray:
        c = np.asarray(c, dtype=np.int64)
        if not self.ok:
            sym = rs_symbols(np, self.field, self.d, c)
            return np.count_nonzero(sym == 0, axis=1).astype(np.int64)
        lo = self.lo[c & self.mask]
        hi = self.hi[c >> self.shift]
        return np.count_nonzero(lo == hi, axis=1).astype(np.int64)


# ------------------------------------------------------------------------------------------
# counter-based random signs (splitmix64)
# ------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _s64(x: int) -> int:
    x &= _M64
    return x - (1 << 64) if x >> 63 else x


GAMMA = _s64(0x9E3779B97F4A7C15)
_C1 = _s64(0xBF58476D1CE4E5B9)
_C2 = _s64(0x94D049BB133111EB)


def _lsr(z: Any, s: int) -> Any:
    """Logical right shift of int64 (numpy and torch shift int64 arithmetically)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z: Any) -> Any:
    """splitmix64's finaliser on int64 arrays (wrapping arithmetic, bit-identical to uint64)."""
    z = (z ^ _lsr(z, 30)) * _C1
    z = (z ^ _lsr(z, 27)) * _C2
    return z ^ _lsr(z, 31)


def mix64_int(z: int) -> int:
    """The same on one Python integer (used for the per-code seed key)."""
    z &= _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return _s64(z ^ (z >> 31))


def seed_key(seed: int) -> int:
    return mix64_int(seed ^ 0x5EED5EED5EED5EED)


def random_words(xp: Any, key: int, idx: Any, n_words: int, device: Any = None) -> Any:
    """int64 [len(idx), n_words]: word w of vector i is ``mix64(key_i + (w+1)*GAMMA)`` with
    ``key_i = mix64(key + (i+1)*GAMMA)`` -- splitmix64's stream seeded by ``key_i``. Vector i
    depends on (seed, i) alone and its first k bits do not depend on k (prefix property)."""
    if xp is np:
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        w = np.arange(1, n_words + 1, dtype=np.int64)
        with np.errstate(over="ignore"):
            ki = mix64((idx + 1) * GAMMA + key)
            return mix64(ki[:, None] + w[None, :] * GAMMA)
    idx = xp.as_tensor(idx, dtype=xp.int64, device=device).reshape(-1)
    w = xp.arange(1, n_words + 1, dtype=xp.int64, device=device)
    ki = mix64((idx + 1) * GAMMA + key)
    return mix64(ki[:, None] + w[None, :] * GAMMA)


def random_signs(xp: Any, key: int, k: int, idx: Any, device: Any = None) -> Any:
    """int8 [len(idx), k]: entry j of vector i is ``1 - 2 * bit(j mod 64)`` of word ``j // 64``."""
    n_words = (k + 63) // 64
    words = random_words(xp, key, idx, n_words, device)
    if xp is np:
        bits = np.unpackbits(words.astype("<i8").view(np.uint8), axis=1, bitorder="little")
        return (1 - 2 * bits[:, :k].astype(np.int8)).astype(np.int8)
    shifts = xp.arange(64, dtype=xp.int64, device=words.device)
    bits = (words[:, :, None] >> shifts) & 1
    bits = bits.reshape(words.shape[0], n_words * 64)[:, :k]
    return (1 - 2 * bits).to(xp.int8)
