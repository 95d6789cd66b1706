"""Attention rows through their window: the exact fixed-point row from a few keys, found by hashing.

A rounded softmax entry is exactly 0 when its logit lies ``d0`` or more below the row's maximum
(``round(e^d) = 0`` for ``d <= d0``, :meth:`~exactformer.precision.FixedPoint.exp_zero_below`): it
adds 0 to the row's sum, its weight is 0 and its value's product is 0; the forward pass counts it as
one underflow. So a row is fixed by the keys within ``-d0`` of its maximum, and by the count of the
others. This module finds those keys without forming the row, for heads that read **codes**:

* the key dims split into *code dims* C, where every key holds ``+-s_d`` (one ``s_d`` per dim), and
  the *other dims* O; the keys whose O-part is the most common one form the *main* class, the rest
  are *exceptional* (at most :data:`EXCEPTIONAL` per input: each row takes them all);
* a main key's logit is ``C-part + O-part + p_j``: with every product exact (each dim's query
  values times key values a multiple of the scale, checked from their gcds), the C-part is
  ``sum_d |q_d| s_d / S`` minus twice the weights of the dims where the key's sign differs from the
  query's; ``p_j`` is the shared partial logit of the position (the same for every query: checked);
* keys are grouped by (input, sign pattern on C); the query's own sign pattern names its *match*
  class, found by binary search; every other main key differs from it in at least ``D`` dims, where
  ``D`` is a lower bound on the distance between distinct patterns among the keys and queries of
  the call (1, or 2 or 3 after flip look-ups), so its logit is at most
  ``UB1 = Cmax - gap + O + max_{j <= t} p_j`` (gap: twice the ``D`` smallest weights);
* of the match class the latest :data:`TAIL` keys up to the row's last position are taken; the
  earlier ones are at most ``UB2 = Cmax + O + (their largest p)``.

The candidates (tail and exceptional keys) are computed exactly; with their maximum ``LB``, every
other key is certified 0 when ``UB1, UB2 <= LB + d0`` (then the row's maximum is ``LB``). Where that
fails for some row, or a precondition fails (a query entry 0 on a code dim, an inexact product, a
logit that could saturate), :func:`window_rows` returns None and the caller forms the rows whole.
The result is bit-identical to the whole row, events included (the caller adds the pruned keys'
underflows: ``t + 1 - #candidates`` per row).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from exactformer.constructions.codes.positions import BinaryCode, ReedSolomonCode

TAIL = 4  # latest keys of the match class taken per row
EXCEPTIONAL = 8  # keys per input outside the main class, taken by every row
FLIP_LOOKUPS = 1 << 22  # look-ups allowed for the distance bound D >= 3


class Keys(ABC):
    """The keys of one head [Bk, T, D] (raw; Bk = 1 when shared by every input), as the window reads
    them: code dims ``C`` (every main key holds +-s there), other dims ``O`` (every main key holds
    ``o_main``), and the exceptional keys, at most :data:`EXCEPTIONAL` per input."""

    Bk: int
    T: int
    C: np.ndarray
    s: np.ndarray  # [|C|] the code dims' magnitudes
    O: np.ndarray
    o_main: np.ndarray  # [|O|]
    gk: np.ndarray  # [D] a divisor of every key value of each dim
    kmax: np.ndarray  # [D] the largest |key value| of each dim
    e_pos: np.ndarray  # [Bk, EXCEPTIONAL] the exceptional keys' positions (0 where none)
    e_ok: np.ndarray  # [Bk, EXCEPTIONAL] valid

    @abstractmethod
    def at(self, bk: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Key vectors [N, K, D] of input ``bk`` [N] at positions ``pos`` [N, K]."""

    @abstractmethod
    def match(self, bk: np.ndarray, qbits: np.ndarray, last: np.ndarray) -> tuple:
        """The match class of each row (the main keys whose sign pattern on C is ``qbits`` [N, |C|]):
        (its latest TAIL positions <= ``last`` [N, TAIL], valid [N, TAIL], whether it has earlier
        keys [N], the largest shared partial p among those [N])."""

    @abstractmethod
    def distance(self, qbits: np.ndarray) -> np.ndarray:
        """[N] a lower bound on the number of C dims in which a main key outside the row's match
        class differs from ``qbits``."""


class HashedKeys(Keys):
    """Keys given as an array [Bk, T, D], grouped by (input, sign pattern on C) in a sorted table."""

    def __init__(self, keys: np.ndarray, C, s, O, o_main, gk, kmax, e_pos, e_ok, classes, pats, sorted_key,
                 sorted_pos, pm):
        self.keys, self.Bk, self.T = keys, keys.shape[0], keys.shape[1]
        self.C, self.s, self.O, self.o_main, self.gk, self.kmax = C, s, O, o_main, gk, kmax
        self.e_pos, self.e_ok = e_pos, e_ok
        self.classes, self.pats, self.sorted_key, self.sorted_pos, self.pm = classes, pats, sorted_key, sorted_pos, pm

    def at(self, bk, pos):
        return self.keys[bk[:, None], pos]

    def match(self, bk, qbits, last):
        T, N = self.T, bk.size
        cid = bk * (np.int64(1) << self.C.size) + _pack(qbits)
        r = np.minimum(np.searchsorted(self.classes, cid), max(0, self.classes.size - 1))
        found = self.classes[r] == cid if self.classes.size else np.zeros(N, bool)
        at = np.searchsorted(self.sorted_key, r * T + last, side="right") - 1
        ti = at[:, None] - np.arange(TAIL)[None, :]
        tcl = np.maximum(ti, 0)
        t_ok = found[:, None] & (ti >= 0) & (self.sorted_key[tcl] // T == r[:, None])
        ei = at - TAIL
        ecl = np.maximum(ei, 0)
        earlier = found & (ei >= 0) & (self.sorted_key[ecl] // T == r)
        return self.sorted_pos[tcl], t_ok, earlier, self.pm[ecl]

    def distance(self, qbits):
        D = distance_bound(np.union1d(self.pats, _pack(qbits)), self.C.size)
        return np.full(qbits.shape[0], D, dtype=np.int64)


class CodedKeys(Keys):
    """Keys shared by every input that are a position code, read from the positional embedding's
    code blocks (the generator the executor reads rows from): main key j is ``+-s`` with the sign
    pattern of codeword ``j + offset`` (one offset per block, codewords distinct), so a row's match
    is the position the code's decoder names (checked by regenerating it) and every other main key
    is another codeword, at least ``D = ceil((k - max_distinct_dot) / 2)`` dims away. The positions
    no block covers are the exceptional keys."""

    def __init__(self, code, runs: list[tuple[int, int, int]], C: np.ndarray, O: np.ndarray, src: np.ndarray,
                 sigma: np.ndarray, s: np.ndarray, T: int, e_pos: np.ndarray, e_keys: np.ndarray):
        self.code, self.runs, self.src, self.sigma, self.Bk, self.T = code, runs, src, sigma, 1, T
        self.C, self.s, self.O, self.o_main = C, s, O, np.zeros(O.size, np.int64)
        main = np.zeros(C.size + O.size, dtype=np.int64)
        main[C] = s
        every = np.concatenate([main[None], np.abs(e_keys)])
        self.gk, self.kmax = np.gcd.reduce(every, axis=0), every.max(axis=0)
        self.e_pos = np.zeros((1, EXCEPTIONAL), np.int64)
        self.e_ok = np.zeros((1, EXCEPTIONAL), bool)
        self.e_pos[0, : e_pos.size], self.e_ok[0, : e_pos.size] = e_pos, True
        self._e_keys = {int(p): k for p, k in zip(e_pos, e_keys)}
        self._D = -(-(code.k - code.max_distinct_dot()) // 2)

    @classmethod
    def from_embedding(cls, embedding, rows: np.ndarray, W: np.ndarray, b: np.ndarray, scale: int, max_raw: int,
                       reader) -> "CodedKeys | None":
        """The keys ``x[rows] @ W + b`` [T, D] of a head whose key reads the embedding's columns
        ``rows`` and nothing an earlier block writes, or None when they are not a decodable sign
        code: every column of ``rows`` one code's (the same generator and scale in every block
        that covers it, the table 0 there), each key dim reading one code column (C) or none (O:
        0 for every key), each code column read once, b 0, every product exact and within range;
        at most EXCEPTIONAL positions outside the blocks."""
        blocks = [bl for bl in embedding.blocks if np.any((rows >= bl.col) & (rows < bl.col + bl.code.k))]
        if not blocks or W.shape[0] != rows.size or np.any(b != 0):
            return None
        code = blocks[0].code
        if type(code) not in (BinaryCode, ReedSolomonCode) or any(  # the families whose distance is proved
                bl.code.generator_key() != code.generator_key() or bl.scale != blocks[0].scale
                or not np.array_equal(rows, np.arange(bl.col, bl.col + bl.code.k)) for bl in blocks):
            return None
        if embedding.table.shape[0] and np.any(embedding.table.num[:, rows] != 0):
            return None
        per_dim = np.count_nonzero(W, axis=0)
        if np.any(per_dim > 1) or np.any(np.count_nonzero(W, axis=1) != 1):
            return None  # each key dim reads at most one code column, each column is read once
        C, O = np.flatnonzero(per_dim == 1), np.flatnonzero(per_dim == 0)
        src = np.argmax(W[:, C] != 0, axis=0)  # the code column each code dim reads
        w = W[src, C]
        # the blocks' raw value for a numerator +1 (signed: a negative scale flips every key)
        first = blocks[0]
        m = int(reader(np.array([first.first_row]), rows[:1])[0, 0]) * int(code.numerators([first.code_start])[0, 0])
        if m == 0 or np.any((m * w) % scale) or np.any(np.abs(m * w) // scale > max_raw):
            return None
        s, sigma = np.abs(m * w) // scale, np.sign(m * w)
        runs = sorted((bl.first_row, bl.first_row + bl.count, bl.code_start - bl.first_row) for bl in blocks)
        words = sorted((lo + off, hi + off) for lo, hi, off in runs)
        if any(b0 < a1 for (_, a1), (b0, _) in zip(words, words[1:])):
            return None  # two positions hold the same codeword
        gaps, at = [], 0  # the positions no block covers
        for lo, hi, _ in runs + [(embedding.n_rows, embedding.n_rows, 0)]:
            if lo > at:
                gaps.append(np.arange(at, lo))
                if sum(g.size for g in gaps) > EXCEPTIONAL:
                    return None
            at = max(at, hi)
        e_pos = np.concatenate(gaps) if gaps else np.zeros(0, np.int64)
        x = reader(e_pos, rows).astype(np.int64) if e_pos.size else np.zeros((0, rows.size), np.int64)
        if np.any((x[:, :, None] * W[None]) % scale):
            return None
        e_keys = x @ W.astype(np.int64) // scale
        if np.any(np.abs(e_keys) > max_raw):
            return None
        return cls(code, runs, C, O, src, sigma, s, embedding.n_rows, e_pos, e_keys)

    def at(self, bk, pos):
        N, K = pos.shape
        flat = pos.reshape(-1)
        out = np.zeros((flat.size, self.C.size + self.O.size), dtype=np.int64)
        word = np.full(flat.size, -1, dtype=np.int64)
        for lo, hi, off in self.runs:
            inside = (flat >= lo) & (flat < hi)
            word[inside] = flat[inside] + off
        coded = word >= 0
        if coded.any():
            signs = np.asarray(self.code.numerators(word[coded]), dtype=np.int64)[:, self.src]
            out[np.ix_(np.flatnonzero(coded), self.C)] = signs * self.sigma * self.s
        for i in np.flatnonzero(~coded):
            out[i] = self._e_keys[int(flat[i])]
        return out.reshape(N, K, -1)

    def _words(self, qbits: np.ndarray) -> np.ndarray:
        """The codeword index each query's sign pattern is (on the code columns), -1 where none."""
        signs = np.empty((qbits.shape[0], self.code.k), dtype=np.int64)
        signs[:, self.src] = np.where(qbits, 1, -1) * self.sigma
        return self.code.decode(signs)

    def match(self, bk, qbits, last):
        N = qbits.shape[0]
        word = self._words(qbits)
        pos = np.full(N, -1, dtype=np.int64)
        for lo, hi, off in self.runs:
            inside = (word >= lo + off) & (word < hi + off)
            pos[inside] = word[inside] - off
        t_pos = np.zeros((N, TAIL), dtype=np.int64)
        t_ok = np.zeros((N, TAIL), dtype=bool)
        t_pos[:, 0] = np.maximum(pos, 0)
        t_ok[:, 0] = (pos >= 0) & (pos <= last)
        return t_pos, t_ok, np.zeros(N, bool), np.zeros(N, np.int64)

    def distance(self, qbits):
        """D where the query's pattern is a codeword (every other codeword is D dims away), else 1."""
        return np.where(self._words(qbits) >= 0, self._D, 1)


def _pack(bits: np.ndarray) -> np.ndarray:
    """Sign patterns [..., n] (bool) -> int64 codes."""
    return bits.astype(np.int64) @ (np.int64(1) << np.arange(bits.shape[-1], dtype=np.int64))


def index_keys(keys: np.ndarray, p: np.ndarray | None) -> HashedKeys | None:
    """Group the keys [Bk, T, D] (see the module docstring); ``p`` [T] the shared partial logits or
    None. None when the keys have no code dims or more exceptional keys than allowed."""
    if keys.dtype == object or keys.ndim != 3:
        return None
    Bk, T, D = keys.shape
    a = np.abs(keys)
    top = a.max(axis=(0, 1))
    is_code = (top > 0) & np.all(a == top, axis=(0, 1))
    C, O = np.flatnonzero(is_code), np.flatnonzero(~is_code)
    if C.size == 0 or C.size + max(1, Bk).bit_length() > 62:
        return None
    flat = keys.reshape(Bk * T, D)
    if O.size:
        ov, inv, cnt = np.unique(flat[:, O], axis=0, return_inverse=True, return_counts=True)
        main = int(np.argmax(cnt))
        is_main = inv.reshape(-1) == main
        o_main = ov[main]
    else:
        is_main, o_main = np.ones(Bk * T, dtype=bool), np.zeros(0, dtype=np.int64)
    exc = np.flatnonzero(~is_main)
    per_input = np.bincount(exc // T, minlength=Bk)
    if per_input.size and per_input.max() > EXCEPTIONAL:
        return None
    e_pos = np.zeros((Bk, EXCEPTIONAL), dtype=np.int64)
    e_ok = np.zeros((Bk, EXCEPTIONAL), dtype=bool)
    if exc.size:
        b = exc // T
        slot = np.arange(exc.size) - np.repeat(np.cumsum(per_input) - per_input, per_input)
        e_pos[b, slot], e_ok[b, slot] = exc % T, True
    mk = np.flatnonzero(is_main)
    pat = _pack(flat[mk][:, C] > 0)
    cid = (mk // T) * (np.int64(1) << C.size) + pat
    classes, rank = np.unique(cid, return_inverse=True)
    pos = mk % T
    skey = rank.reshape(-1) * T + pos
    order = np.argsort(skey, kind="stable")
    skey, spos = skey[order], pos[order]
    if p is None:
        pm = np.zeros(spos.size, dtype=np.int64)
    else:  # prefix maximum of p within each class: offsets keep earlier classes below later ones
        ps = p[spos].astype(np.int64)
        lo, span = int(p.min()), int(p.max()) - int(p.min()) + 1
        off = (skey // T) * span
        pm = np.maximum.accumulate(ps - lo + off) - off + lo
    gk = np.gcd.reduce(a.reshape(-1, D), axis=0)
    return HashedKeys(keys, C, top[C], O, o_main, gk, top, e_pos, e_ok, classes, np.unique(pat), skey, spos, pm)


def distance_bound(pats: np.ndarray, n: int) -> int:
    """A lower bound D (1, 2 or 3) on the Hamming distance between distinct patterns among
    ``pats`` (unique int64 codes of n bits): D >= 2 when no single flip of one lands on another,
    D >= 3 when no double flip does either (tried when the look-ups stay within budget)."""
    flips = [np.int64(1) << d for d in range(n)]
    if _any_hit(pats, [pats ^ f for f in flips]):
        return 1
    if pats.size * n * (n - 1) // 2 > FLIP_LOOKUPS:
        return 2
    doubles = (pats ^ (flips[i] | flips[j]) for i in range(n) for j in range(i + 1, n))
    return 2 if _any_hit(pats, doubles) else 3


def _any_hit(pats: np.ndarray, probes) -> bool:
    for x in probes:
        at = np.minimum(np.searchsorted(pats, x), pats.size - 1)
        if np.any(pats[at] == x):
            return True
    return False


@dataclass
class Window:
    """Candidate keys per row: positions [N, K], valid [N, K], exact logits [N, K] (invalid entries
    hold the sentinel ``LB + d0``, whose rounded exp is 0), and ``pruned`` [N]: keys of the row's
    prefix that are certified 0 and not among the candidates."""

    pos: np.ndarray
    ok: np.ndarray
    logits: np.ndarray
    pruned: np.ndarray


def window_rows(idx: Keys, q: np.ndarray, b_of_row: np.ndarray, last: np.ndarray, p: np.ndarray | None,
                scale: int, max_raw: int, min_raw: int, d0: int) -> Window | None:
    """The window of each query row ``q`` [N, D] (raw) of input ``b_of_row`` [N] over keys at
    positions ``<= last`` [N]; None where it cannot be certified (the module docstring)."""
    if q.dtype == object or q.shape[1] != idx.gk.size:
        return None
    N = q.shape[0]
    # every product exact: (gcd of the query values) x (gcd of the key values) a multiple of S
    gq = np.gcd.reduce(np.abs(q), axis=0) if N else np.zeros(q.shape[1], np.int64)
    if np.any((gq * idx.gk) % scale):
        return None
    if N and int(np.abs(q).max()) * int(idx.kmax.max()) * q.shape[1] >= 1 << 62:
        return None  # sums could leave int64
    p_lo, p_abs = (0, 0) if p is None else (int(p.min()), int(np.abs(p).max()))
    qC = q[:, idx.C]
    if np.any(qC == 0):
        return None
    w = np.abs(qC) * idx.s // scale  # [N, |C|] exact
    cmax = w.sum(axis=1)
    qbits = qC > 0
    D = idx.distance(qbits)
    w_sorted = np.sort(w, axis=1)
    gap = 2 * np.where(np.arange(w.shape[1])[None, :] < D[:, None], w_sorted, 0).sum(axis=1)
    o_part = (q[:, idx.O] * idx.o_main).sum(axis=1) // scale if idx.O.size else np.zeros(N, np.int64)
    if np.any(cmax + np.abs(o_part) + p_abs > max_raw):
        return None  # a main key's logit (or its part before p) could saturate
    pmax = np.zeros(N, np.int64) if p is None else np.maximum.accumulate(p)[last]
    bk = b_of_row if idx.Bk > 1 else np.zeros(N, np.int64)
    t_pos, t_ok, earlier, pm_before = idx.match(bk, qbits, last)  # the match class's latest keys
    pos = np.concatenate([t_pos, idx.e_pos[bk]], axis=1)
    ok = np.concatenate([t_ok, idx.e_ok[bk] & (idx.e_pos[bk] <= last[:, None])], axis=1)
    pos = np.where(ok, pos, 0)
    kc = idx.at(bk, pos)  # [N, K, D]
    logits = np.einsum("nd,nkd->nk", q, kc) // scale
    if p is not None:
        logits = logits + p[pos]
    part = logits - (0 if p is None else p[pos])
    if not np.all(ok.any(axis=1)) or np.any(ok & ((np.abs(logits) > max_raw) | (np.abs(part) > max_raw))):
        return None  # an empty row, or a candidate's logit saturates
    LB = np.where(ok, logits, np.iinfo(np.int64).min).max(axis=1)
    ub1 = cmax - gap + o_part + pmax
    ub2 = np.where(earlier, cmax + o_part + pm_before, np.iinfo(np.int64).min)
    if np.any(np.maximum(ub1, ub2) > LB + d0) or np.any(LB - (o_part - cmax + p_lo) > -min_raw):
        return None  # a pruned key might not be 0, or its difference to the maximum be clipped
    logits = np.where(ok, logits, (LB + d0)[:, None])
    return Window(pos, ok, logits, last + 1 - ok.sum(axis=1))

