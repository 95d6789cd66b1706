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

from dataclasses import dataclass

import numpy as np

TAIL = 4  # latest keys of the match class taken per row
EXCEPTIONAL = 8  # keys per input outside the main class, taken by every row
FLIP_LOOKUPS = 1 << 22  # look-ups allowed for the distance bound D >= 3


@dataclass
class KeyIndex:
    """Keys [Bk, T, D] (raw) grouped for one call, or for a plan when the keys are shared (Bk = 1)."""

    keys: np.ndarray  # [Bk, T, D]
    C: np.ndarray  # code dims
    s: np.ndarray  # [|C|] the code dims' magnitudes
    O: np.ndarray  # other dims
    o_main: np.ndarray  # [|O|] the main class's O-part
    gk: np.ndarray  # [D] gcd of each dim's key values
    kmax: np.ndarray  # [D] largest |key value| per dim
    classes: np.ndarray  # sorted class ids (input * 2^|C| + pattern)
    pats: np.ndarray  # the main keys' distinct sign patterns
    sorted_key: np.ndarray  # class rank * T + position, sorted (main keys)
    sorted_pos: np.ndarray
    pm: np.ndarray  # prefix maximum of p within each class, in sorted order
    e_pos: np.ndarray  # [Bk, EXCEPTIONAL] exceptional keys' positions (0 where none)
    e_ok: np.ndarray  # [Bk, EXCEPTIONAL] valid


def _pack(bits: np.ndarray) -> np.ndarray:
    """Sign patterns [..., n] (bool) -> int64 codes."""
    return bits.astype(np.int64) @ (np.int64(1) << np.arange(bits.shape[-1], dtype=np.int64))


def index_keys(keys: np.ndarray, p: np.ndarray | None) -> KeyIndex | None:
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
    return KeyIndex(keys, C, top[C], O, o_main, gk, top, classes, np.unique(pat), skey, spos, pm, e_pos, e_ok)


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


def window_rows(idx: KeyIndex, q: np.ndarray, b_of_row: np.ndarray, last: np.ndarray, p: np.ndarray | None,
                scale: int, max_raw: int, min_raw: int, d0: int) -> Window | None:
    """The window of each query row ``q`` [N, D] (raw) of input ``b_of_row`` [N] over keys at
    positions ``<= last`` [N]; None where it cannot be certified (the module docstring)."""
    if q.dtype == object or q.shape[1] != idx.keys.shape[2]:
        return None
    N = q.shape[0]
    T = idx.keys.shape[1]
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
    qpat = _pack(qC > 0)
    D = distance_bound(np.union1d(idx.pats, qpat), idx.C.size)
    gap = 2 * np.sort(w, axis=1)[:, :D].sum(axis=1)
    o_part = (q[:, idx.O] * idx.o_main).sum(axis=1) // scale if idx.O.size else np.zeros(N, np.int64)
    if np.any(cmax + np.abs(o_part) + p_abs > max_raw):
        return None  # a main key's logit (or its part before p) could saturate
    pmax = np.zeros(N, np.int64) if p is None else np.maximum.accumulate(p)[last]
    # the match class: its latest TAIL keys at positions <= last
    Bk = idx.keys.shape[0]
    bk = b_of_row if Bk > 1 else np.zeros(N, np.int64)
    cid = bk * (np.int64(1) << idx.C.size) + qpat
    r = np.minimum(np.searchsorted(idx.classes, cid), max(0, idx.classes.size - 1))
    found = idx.classes[r] == cid if idx.classes.size else np.zeros(N, bool)
    at = np.searchsorted(idx.sorted_key, r * T + last, side="right") - 1
    steps = np.arange(TAIL)
    ti = at[:, None] - steps[None, :]
    tcl = np.maximum(ti, 0)
    t_ok = found[:, None] & (ti >= 0) & (idx.sorted_key[tcl] // T == r[:, None])
    ei = at - TAIL
    ecl = np.maximum(ei, 0)
    earlier = found & (ei >= 0) & (idx.sorted_key[ecl] // T == r)
    pos = np.concatenate([idx.sorted_pos[tcl], idx.e_pos[bk]], axis=1)
    ok = np.concatenate([t_ok, idx.e_ok[bk] & (idx.e_pos[bk] <= last[:, None])], axis=1)
    pos = np.where(ok, pos, 0)
    kc = idx.keys[bk[:, None], pos]  # [N, K, D]
    logits = np.einsum("nd,nkd->nk", q, kc) // scale
    if p is not None:
        logits = logits + p[pos]
    part = logits - (0 if p is None else p[pos])
    if not np.all(ok.any(axis=1)) or np.any(ok & ((np.abs(logits) > max_raw) | (np.abs(part) > max_raw))):
        return None  # an empty row, or a candidate's logit saturates
    LB = np.where(ok, logits, np.iinfo(np.int64).min).max(axis=1)
    ub1 = cmax - gap + o_part + pmax
    ub2 = np.where(earlier, cmax + o_part + idx.pm[ecl], np.iinfo(np.int64).min)
    if np.any(np.maximum(ub1, ub2) > LB + d0) or np.any(LB - (o_part - cmax + p_lo) > -min_raw):
        return None  # a pruned key might not be 0, or its difference to the maximum be clipped
    logits = np.where(ok, logits, (LB + d0)[:, None])
    return Window(pos, ok, logits, last + 1 - ok.sum(axis=1))

