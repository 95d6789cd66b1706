"""Inputs too long to form: token ids generated on demand.

A sampled Index Lookup input at N = 2^30 has 2^30 + 1 token ids (4 GiB as int32); the exact
executor reads a handful of them (the index token, the few keys its windowed rows name). A
:class:`GeneratedTokens` stands where a token array [B, T] would: indexing the positions a reader
asks for generates exactly those ids, the same ones every time, and nothing else is formed.

Random symbols come from a counter-based generator, :func:`uniform_symbols`: symbol t of the input
with key ``k`` is a function of (k, t) alone (splitmix64, Steele, Lea and Flood, *Fast splittable
pseudorandom number generators*, OOPSLA 2014, of ``k + t * 0x9E3779B97F4A7C15``), so any position
is read in O(1) without the ones before it. The keys themselves are drawn from
``np.random.default_rng(seed)``, so an input is fixed by the seed and its index.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

#: inputs of at least this many tokens are generated on demand (by the tasks that can)
STREAM_TOKENS = 1 << 25
#: a generated input is formed as an array (``np.asarray``) up to this many ids, else refused
FORM_LIMIT = 1 << 27

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def counter_hash(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """splitmix64's output for counter ``keys[i] + positions[j] * golden``: uint64 [len(keys), len(positions)]."""
    with np.errstate(over="ignore"):
        z = np.asarray(keys, dtype=np.uint64)[:, None] + np.asarray(positions, dtype=np.uint64)[None, :] * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform_symbols(keys: np.ndarray, positions: np.ndarray, S: int) -> np.ndarray:
    """Symbols in [0, S) at ``positions`` of the inputs with ``keys``: int64 [len(keys), len(positions)],
    ``floor(h * S / 2^32)`` of the hash's top 32 bits h (exactly uniform when S is a power of two,
    within S / 2^32 of uniform otherwise)."""
    h = counter_hash(keys, positions) >> np.uint64(32)
    return ((h * np.uint64(S)) >> np.uint64(32)).astype(np.int64)


def draw_keys(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` input keys from ``rng`` (uint64)."""
    return rng.integers(0, np.iinfo(np.int64).max, size=count, dtype=np.int64).astype(np.uint64)


class GeneratedTokens:
    """Token ids [B, T] generated on demand (module docstring): ``fill(rows, positions)`` gives the
    int64 ids [len(rows), len(positions)] of inputs ``rows`` (indices into the B inputs) at
    ``positions``; every id lies in [lo, hi]. Indexing the batch axis alone gives the generated
    inputs it selects; indexing both axes gives an array. ``describe(row)`` says how input ``row``
    is generated (a counterexample names it instead of listing T ids)."""

    ndim = 2
    dtype = np.dtype(np.int64)

    def __init__(self, fill: Callable[[np.ndarray, np.ndarray], np.ndarray], B: int, T: int, lo: int, hi: int,
                 describe: Callable[[int], dict[str, Any]], rows: np.ndarray | None = None):
        self.fill, self.T, self.lo, self.hi, self._describe = fill, int(T), int(lo), int(hi), describe
        self.rows = np.arange(B) if rows is None else np.asarray(rows, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.rows.size), self.T)

    @property
    def size(self) -> int:
        return int(self.rows.size) * self.T

    def __len__(self) -> int:
        return int(self.rows.size)

    def _positions(self, key: Any) -> np.ndarray:
        if isinstance(key, slice):
            return np.arange(*key.indices(self.T))
        pos = np.asarray(key, dtype=np.int64).reshape(-1)
        if pos.size and (pos.min() < -self.T or pos.max() >= self.T):
            raise IndexError(f"positions must lie in [0, {self.T})")
        return pos % self.T

    def __getitem__(self, key: Any) -> Any:
        if not isinstance(key, tuple):
            rows = self.rows[key]
            return GeneratedTokens(self.fill, 0, self.T, self.lo, self.hi, self._describe, np.atleast_1d(rows))
        r, c = key
        rows = np.atleast_1d(self.rows[r])
        out = self.fill(rows, self._positions(c))
        if np.ndim(c) == 0 and not isinstance(c, slice):
            out = out[:, 0]
        return out[0] if np.ndim(r) == 0 and not isinstance(r, slice) else out

    def min(self) -> int:
        """The smallest id the generator gives (every id lies in [lo, hi])."""
        return self.lo

    def max(self) -> int:
        return self.hi

    def describe(self, i: int) -> dict[str, Any]:
        return self._describe(int(self.rows[i]))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.size > FORM_LIMIT:
            raise ValueError(f"generated inputs [{len(self)}, {self.T}] are not formed as an array (more than "
                             f"{FORM_LIMIT} ids); read the positions needed")
        out = self.fill(self.rows, np.arange(self.T))
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"GeneratedTokens(B={len(self)}, T={self.T}, ids in [{self.lo}, {self.hi}])"


class SequentialFill:
    """``fill(rows, positions)`` of a generator whose symbols at positions a .. b-1 follow from its
    state at a (a Markov chain: Dyck members): ``advance(rows, state, a, b) -> (ids [len(rows), b - a],
    state at b)`` from ``start(rows)`` at 0. A reader that goes forward (the recurrent executor, chunk
    by chunk) costs one pass; the state reached is kept per set of rows, and a read before it
    starts again from 0. ``reached(rows)`` is the state at the last position read, with that
    position (what a task's truth reads off the same pass)."""

    def __init__(self, advance: Callable[[np.ndarray, Any, int, int], tuple[np.ndarray, Any]],
                 start: Callable[[np.ndarray], Any], chunk: int = 1 << 20):
        self.advance, self.start, self.chunk = advance, start, chunk
        self._at: dict[bytes, tuple[int, Any]] = {}

    def reached(self, rows: np.ndarray) -> tuple[int, Any]:
        return self._at.get(np.asarray(rows, dtype=np.int64).tobytes(), (0, self.start(rows)))

    def run_to(self, rows: np.ndarray, end: int) -> Any:
        """The state at ``end`` (read forward from where these rows stand)."""
        pos, state = self.reached(rows)
        if pos > end:
            pos, state = 0, self.start(rows)
        for a in range(pos, end, self.chunk):
            _, state = self.advance(rows, state, a, min(end, a + self.chunk))
        self._at[np.asarray(rows, dtype=np.int64).tobytes()] = (end, state)
        return state

    def __call__(self, rows: np.ndarray, positions: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if positions.size == 0:
            return np.zeros((rows.size, 0), np.int64)
        a, b = int(positions.min()), int(positions.max()) + 1
        state = self.run_to(rows, a)
        ids, state = self.advance(rows, state, a, b)
        self._at[rows.tobytes()] = (b, state)
        return ids[:, positions - a]


class Deferred:
    """An array computed when first read (``np.asarray``, indexing, ``len``): the truth of generated
    inputs, read off the pass that ran them (:class:`SequentialFill`) instead of a pass of its own."""

    def __init__(self, compute: Callable[[], np.ndarray], length: int):
        self._compute, self._length, self._value = compute, int(length), None

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self._value is None:
            self._value = np.asarray(self._compute())
        return self._value if dtype is None else self._value.astype(dtype)

    def __getitem__(self, idx: Any) -> Any:
        return np.asarray(self)[idx]

    def __len__(self) -> int:
        return self._length
