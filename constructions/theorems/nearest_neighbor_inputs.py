"""Inputs for nearest neighbour (Theorem 7): exact grid vectors with prescribed inner products, the
adversarial kinds listed in docs/nearest-neighbor.md, and a finite
family for exhaustive runs at tiny N.

**The exact generator** (``queries="last"``). Let D = 4^e <= d' and H the Sylvester Hadamard matrix
of order D: u_j = H_j / sqrt(D) is an orthonormal basis whose entries are +-2^-e. The query is
x_N = u_0; candidate i is x_i = c_i0 u_0 + sum_{j >= 1} c_ij u_j with every c a multiple of 2^-b,
so <x_N, x_i> = c_i0 and ||x_i||^2 = sum_j c_ij^2 exactly, and every entry of x_i is a multiple of
2^-(b+e) (a grid value when b + e <= the format's fraction bits). A unit vector with inner product
t = r/2^b writes 4^b - r^2 as a sum of four squares (Lagrange; sympy's ``sum_of_four_squares``)
on four further basis vectors (D >= 16); with fewer spare basis vectors the completion is greedy and
the norm may fall short of 1 (allowed: the precondition is ||x||^2 <= 1). A random signed
permutation of the D coordinates keeps everything exact and hides the basis.

**All queries** (``queries="all"``: every x_K with K > N/2 is a query, so every one needs its own
margin): hypercube words. The first half are distinct words w in {+-2^-e}^D at pairwise Hamming
distance >= h = ceil(margin D / 2) (inner products <= 1 - 2h/D <= 1 - margin), the second half a
permutation of them, each possibly scaled by c >= margin D / (2h) (shorter queries keep the margin).
Every query's nearest candidate is its first-half copy.

Kinds (``adversarial``: every batch holds equal shares of every kind): ``alltight`` (every other candidate exactly margin
behind: the largest first-layer denominator), ``tight``, ``negative`` (t* = -1 + margin, others -1),
``duplicate`` (a candidate equal to the query), ``code-worst`` (the nearest candidate where the
self-exclusion code penalises most), ``labels`` (every other label the farthest from the answer),
``edges`` (j* first or last, margin exactly), ``short-norm`` (shorter candidates, zero vectors),
``random``. In "all" mode: ``labels``, ``edges``, ``short-norm``, ``random`` on the hypercube family.

**Finite family** (exhaustive): the 16 vectors (+-1/2)^4 in the first four coordinates, every
sequence for N <= 4 with every label sequence, kept when it satisfies the precondition.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.codes.products import pair_inner, resolve
from exactformer.constructions.core.task import Batch, TaskError

KINDS_LAST = ("alltight", "tight", "negative", "duplicate", "code-worst", "labels", "edges", "short-norm", "random")
KINDS_ALL = ("labels", "edges", "short-norm", "random")
FAMILY_N = 4  # the finite family exists for N <= 4


class InputError(TaskError):
    """No input family of the requested kind exists for this model (the message says why)."""


# ------------------------------------------------------------------------------------------------
# grid and basis
# ------------------------------------------------------------------------------------------------


def _two_adic(S: int) -> int:
    return (S & -S).bit_length() - 1


def _grid(task: Any, model: Any) -> tuple[int, int, int, int]:
    """(S, D, e, b): the format's scale, the basis size D = 4^e <= d', and the coefficient bits b
    (entries multiples of 2^-(b+e) are grid values; the margin a multiple of 2^-b)."""
    S, d = task.scale(model), int(model.task_params["d_in"])
    e = max(0, (int(math.log2(d)) // 2))
    while 4**e > d:
        e -= 1
    b = _two_adic(S) - e
    g = task.precondition(model).margin
    if b < 1 or (g * (1 << b)).denominator != 1:
        raise InputError(f"the input generator needs a binary grid with at least {e + 1} fraction bits and a margin "
                         f"that is a multiple of 2^-b (here b = {b}, margin {g})")
    return S, 4**e, e, b


@lru_cache(maxsize=8)
def _hadamard(D: int) -> np.ndarray:
    H = np.ones((1, 1), dtype=np.int64)
    while H.shape[0] < D:
        H = np.block([[H, H], [H, -H]])
    return H


@lru_cache(maxsize=4096)
def _four_squares(m: int) -> tuple[int, int, int, int]:
    from sympy.solvers.diophantine.diophantine import sum_of_four_squares  # sympy (0.4 s) imported where used

    return tuple(int(v) for v in sum_of_four_squares(m)) if m else (0, 0, 0, 0)


def _complete(r: np.ndarray, b: int, spare: int, rng: np.random.Generator) -> np.ndarray:
    """Coefficient numerators [.., spare] (over 2^b) with sum of squares 4^b - r^2 when spare >= 4
    (exactly unit vectors), else greedily at most that (norm <= 1)."""
    out = np.zeros(r.shape + (spare,), dtype=np.int64)
    if spare == 0:
        return out
    rem = (1 << (2 * b)) - r.astype(np.int64) ** 2
    if spare >= 4:
        uniq, inv = np.unique(rem, return_inverse=True)
        table = np.array([_four_squares(int(m)) for m in uniq], dtype=np.int64).reshape(-1, 4)
        flat = table[inv.reshape(-1)].reshape(r.shape + (4,))
        out[..., :4] = flat
    else:
        for j in range(spare):
            s = np.floor(np.sqrt(rem.astype(np.float64))).astype(np.int64)  # exact for rem < 2^52
            s -= s * s > rem
            s += (s + 1) * (s + 1) <= rem
            out[..., j] = s
            rem = rem - s * s
    signs = rng.choice(np.array([-1, 1]), size=out.shape)
    return out * signs


def _vectors(C: np.ndarray, S: int, D: int, e: int, b: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """Raw grid vectors [B, n, d] from basis coefficients C [B, n, D] (numerators over 2^b): x = C H
    / 2^(b+e), then a random signed permutation of the D coordinates per input."""
    X = C @ _hadamard(D) * (S >> (b + e))  # exact integers
    B = C.shape[0]
    perm = np.argsort(rng.random((B, D)), axis=1)
    sign = rng.choice(np.array([-1, 1]), size=(B, 1, D))
    X = np.take_along_axis(X, perm[:, None, :], axis=2) * sign
    out = np.zeros(C.shape[:2] + (d,), dtype=np.int64)
    out[..., :D] = X
    return out


# ------------------------------------------------------------------------------------------------
# queries="last": the exact generator
# ------------------------------------------------------------------------------------------------


def _last_batch(task: Any, model: Any, B: int, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    S, D, e, b = _grid(task, model)
    n, L = model.n, task.labels(model)
    one, g = 1 << b, int(task.precondition(model).margin * (1 << b))
    c = n - 1  # candidates x_1 .. x_{N-1}
    lo = -one
    r_star = rng.integers(lo + g, one + 1, size=B)
    if kind == "negative":
        r_star = np.full(B, lo + g)
    elif kind == "duplicate":
        r_star = np.full(B, one)
    j = rng.integers(0, c, size=B)
    r = rng.integers(lo, (r_star - g)[:, None] + 1, size=(B, c))  # every other candidate >= margin behind
    if kind == "alltight":
        r = np.repeat((r_star - g)[:, None], c, axis=1)
    elif kind in ("tight", "edges"):
        if kind == "edges":
            j = np.where(rng.random(B) < 0.5, 0, c - 1)
        r[np.arange(B), (j + 1) % c] = r_star - g
    elif kind == "negative":
        r = np.full((B, c), lo)
    elif kind == "code-worst":
        j = np.full(B, _code_worst(model), dtype=np.int64)
        r = np.repeat((r_star - g)[:, None], c, axis=1)
    r[np.arange(B), j] = r_star
    spare = D - 1
    C = np.zeros((B, n, D), dtype=np.int64)
    C[:, n - 1, 0] = one  # the query u_0
    C[:, : n - 1, 0] = r
    if D > 1:
        comp = _complete(r, b, min(spare, 4) if spare >= 4 else spare, rng)
        if kind == "short-norm":  # shorter candidates, some the zero vector
            comp = comp * (rng.random(comp.shape[:-1] + (1,)) < 0.5)
            zero = (rng.random(r.shape) < 0.1) & (np.arange(c)[None, :] != j[:, None]) & (r_star >= g)[:, None]
            C[:, : n - 1][zero] = 0
            comp[zero] = 0
        where = np.argsort(rng.random((B, c, spare)), axis=2)[..., : comp.shape[-1]] + 1
        np.put_along_axis(C[:, : n - 1], where, comp, axis=2)
    X = _vectors(C, S, D, e, b, int(model.task_params["d_in"]), rng)
    Y = rng.integers(0, L, size=(B, n - 1))
    if kind == "labels":
        v = rng.integers(0, L, size=B)
        Y = np.repeat(_farthest(L)[v][:, None], n - 1, axis=1)
        Y[np.arange(B), j] = v
    return X, Y


def _code_worst(model: Any) -> int:
    """The candidate pair whose self-exclusion code vector has the largest inner product with the
    query's position (K = N): the nearest candidate placed where the code penalises it most."""
    blk = next((p.block for p in model.plan if type(p.block).__name__ == "RetrieveNearest"), None)
    if blk is None:
        return 0
    start, width = model.layout[blk.code]
    cb = next((b for b in model.pos_embed.blocks if b.col == start and b.code.k == width), None)
    if cb is None:
        return 0
    n = model.n
    pos = np.arange(0, 2 * n - 2, 2)
    gen, qi = resolve(cb.code, np.array([2 * n - 2 - cb.first_row + cb.code_start]))
    _, ki = resolve(cb.code, pos - cb.first_row + cb.code_start)
    ip = pair_inner(gen, np.repeat(qi, pos.size), gen, ki)
    return int(np.argmax(ip))


def _farthest(L: int) -> np.ndarray:
    """For each label, a label far from it in its bits (the complement when it exists)."""
    m = max(1, (L - 1).bit_length())
    v = np.arange(L)
    comp = (~v) & ((1 << m) - 1)
    return np.where(comp < L, comp, (v + L // 2) % L)


# ------------------------------------------------------------------------------------------------
# queries="all": hypercube words
# ------------------------------------------------------------------------------------------------


def _words(count: int, D: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` distinct words of D bits at pairwise Hamming distance >= h (random greedy)."""
    if h <= 2 and D >= 2 and count <= 1 << (D - 1):  # even-weight words: distance >= 2
        pick = rng.choice(1 << (D - 1), size=count, replace=False).astype(np.int64)
        bits = (pick[:, None] >> np.arange(D - 1)) & 1
        return np.concatenate([bits, bits.sum(axis=1, keepdims=True) % 2], axis=1)
    words: list[np.ndarray] = []
    for _ in range(200 * count):
        w = rng.integers(0, 2, size=D)
        if all(int(np.sum(w != x)) >= h for x in words):
            words.append(w)
            if len(words) == count:
                return np.array(words)
    raise InputError(f"no {count} words of {D} bits at distance >= {h} found (N too large for d_in and the margin)")


def _cube(task: Any, model: Any) -> tuple[int, int, int, int]:
    """(S, D, e, b) for the hypercube words: ``_grid``'s, except that with d' < 4 (no Hadamard basis
    of order 4) the words use all D = d' coordinates with entries +-1/2 (e = 1, norm^2 = D/4 < 1)."""
    d = int(model.task_params["d_in"])
    if d >= 4:
        return _grid(task, model)
    S = task.scale(model)
    b = _two_adic(S) - 1
    g = task.precondition(model).margin
    if b < 1 or (g * (1 << b)).denominator != 1:
        raise InputError(f"the input generator needs a binary grid with at least 2 fraction bits and a margin "
                         f"that is a multiple of 2^-b (here b = {b}, margin {g})")
    return S, d, 1, b


def _all_batch(task: Any, model: Any, B: int, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    S, D, e, b = _cube(task, model)
    n, L = model.n, task.labels(model)
    g = task.precondition(model).margin
    # words of D entries +-2^-e at distance h: <w, w> - <w, w'> = 2h 4^-e >= margin
    h = max(1, math.ceil(g * 4**e / 2))
    if kind == "short-norm" and h < D // 2:  # room for queries scaled down to c >= margin 4^e / (2h) < 1
        h += 1
    if 2 * h > D or h > D:
        raise InputError(f"all-queries inputs need words at Hamming distance >= {h} in D = {D} dims "
                         f"(margin {g}): none exist for d_in = {int(model.task_params['d_in'])}")
    half = n // 2
    X = np.zeros((B, n, int(model.task_params["d_in"])), dtype=np.int64)
    Y = rng.integers(0, L, size=(B, n - 1))
    unit = S >> e
    for i in range(B):
        w = 1 - 2 * _words(half, D, h, rng)  # +-1
        perm = rng.permutation(half) if kind != "edges" else np.r_[half - 1, np.arange(half - 1)]
        X[i, :half, :D] = w * unit
        X[i, half:, :D] = w[perm[: n - half]] * unit
        if kind == "short-norm":  # queries scaled by c >= margin 4^e / (2h), a multiple of 2^-b
            cmin = min(1 << b, math.ceil(g * 4**e / (2 * h) * (1 << b)))
            c = rng.integers(cmin, (1 << b) + 1, size=n - half)
            X[i, half:, :D] = w[perm[: n - half]] * (c[:, None] * (S >> (b + e)))
        if kind == "labels":
            v = rng.integers(0, L)
            Y[i] = _farthest(L)[v]
            Y[i, perm[0]] = v
    return X, Y


# ------------------------------------------------------------------------------------------------
# the sources
# ------------------------------------------------------------------------------------------------


def _batches(task: Any, model: Any, count: int, seed: int, batch: int, kinds: tuple[str, ...]) -> Iterator[Batch]:
    """Batches of ``batch`` inputs, each made of equal shares of every kind (in order)."""
    rng = np.random.default_rng(seed)
    make = _last_batch if model.task_params.get("queries") == "last" else _all_batch
    done = 0
    while done < count:
        B = min(batch, count - done)
        shares = [B // len(kinds) + (i < B % len(kinds)) for i in range(len(kinds))]
        parts = [make(task, model, b, kind, rng) for kind, b in zip(kinds, shares) if b]
        yield task.batch(model, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        done += B


def sample(task: Any, model: Any, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
    """``count`` inputs of the "random" kind from ``np.random.default_rng(seed)``."""
    yield from _batches(task, model, count, seed, batch, ("random",))


def adversarial(task: Any, model: Any, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
    """``count`` inputs of the adversarial kinds (module docstring), equal shares in every batch."""
    kinds = KINDS_LAST if model.task_params.get("queries") == "last" else KINDS_ALL
    yield from _batches(task, model, count, seed, batch, kinds)


def _family_vectors(task: Any, model: Any) -> np.ndarray:
    """Every sequence of N vectors from (+-1/2)^4 (raw, in the first four coordinates) that
    satisfies the precondition at every answered query."""
    n, d = model.n, int(model.task_params["d_in"])
    if n > FAMILY_N or d < 4:
        raise InputError(f"the finite input family (+-1/2)^4 needs N <= {FAMILY_N} and d_in >= 4 "
                         f"(got N = {n}, d_in = {d}); use sample or certify")
    S = task.scale(model)
    if S % 2:
        raise InputError("the finite input family needs 1/2 on the grid")
    cube = np.array(list(itertools.product((-1, 1), repeat=4)), dtype=np.int64) * (S // 2)
    idx = np.array(list(itertools.product(range(16), repeat=n)), dtype=np.int64)
    X = np.zeros((idx.shape[0], n, d), dtype=np.int64)
    X[..., :4] = cube[idx]
    ok = np.ones(idx.shape[0], dtype=bool)
    g = task.precondition(model).margin
    for q in task.queries(model):
        K = q // 2
        ip = np.einsum("bnd,bd->bn", X[:, :K], X[:, K])
        top = np.sort(ip, axis=1)
        if K > 1:
            ok &= (top[:, -1] - top[:, -2]) * g.denominator >= g.numerator * S * S
    return X[ok]


#: what ``count`` reports when no finite family exists (the grid vectors of a ball: no enumeration
#: reaches them), so exhaustive verification refuses and says to sample or certify
UNENUMERABLE = math.inf


def family_count(task: Any, model: Any) -> int:
    """The size of the finite family, or :data:`UNENUMERABLE` for models it does not fit."""
    n, d = model.n, int(model.task_params["d_in"])
    if n > FAMILY_N or d < 4 or task.scale(model) % 2:
        return UNENUMERABLE
    return int(_family_vectors(task, model).shape[0]) * task.labels(model) ** (model.n - 1)


def family(task: Any, model: Any, batch: int = 4096) -> Iterator[Batch]:
    """Every input of the finite family (module docstring), label sequences innermost."""
    X = _family_vectors(task, model)
    n, L = model.n, task.labels(model)
    Ys = np.array(list(itertools.product(range(L), repeat=n - 1)), dtype=np.int64).reshape(-1, n - 1)
    per = max(1, batch // len(Ys))
    for s in range(0, X.shape[0], per):
        xs = X[s : s + per]
        yield task.batch(model, np.repeat(xs, len(Ys), axis=0), np.tile(Ys, (xs.shape[0], 1)))
