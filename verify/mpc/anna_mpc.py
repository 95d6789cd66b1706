"""P2 Thm 4.2 as a compiler: an L-layer ANNA-transformer, as Algorithm 1 runs it, becomes an MPC
protocol with local memory s = O(N^{ε′}), O(L/(ε′ − ε)) rounds and O(N^{1+ε−ε′+3/c²}) machines
(docs/mpc.md, "Thm 4.2: the MPC simulation of ANNA"; P2's proof, App. C, is not available).

Input: an :class:`~exactformer.verify.mpc.anna_program.ANNATransformer` T (N tokens, heads that are
Alg. 1 with ℓ tables of z hash functions and their seeds, or exact match) and ε′ > ε, where ε is
the exponent of T's width W (words per token, P2's mH = O(N^ε); by default ε = log_N W). The
protocol runs on the project's MPC runtime (:mod:`~exactformer.verify.mpc.protocol_run`), which
checks Def. 2.3 in every round: no machine sends, receives or holds more than s words.

Machines: the N tokens packed k to a token machine (token i on machine ⌊i/k⌋: the input on the
first ⌈N/k⌉ machines, as Def. 2.3 puts it on the first ones), then G workers per token, the sort
groups and the value groups, all from machine ⌈N/k⌉ on (a machine plays several parts; the memory
budget of :func:`plan` keeps their sum within s). Per layer with heads:

1. **bcast** (1 + L_w rounds, G >= 1): the token machine applies the previous layer's ``post`` and
   this layer's ``pre``, computes every head's query, key and value (the bundle, U_b words) and sends
   each token's bundle to its worker 0, which sends it down a tree of fan-out F_b over the token's G
   workers. (G = 0 when the token machine can hash its tokens' pairs itself.)
2. **codes** (1 round): worker g of token i hashes its pairs π = (head h, table t) — Alg. 1's
   g_t(q_i), g_t(k_i) with the head's sampled functions, or the key words for exact match — and sends
   a key item (code, i) and a query item (code, N + i) to sort group π, at slot "origin" (i or N + i).
3. **sort** (T_s rounds): each group (2N items on M_t machines of k items) is sorted by (code,
   origin) with the recursive Columnsort of :mod:`~exactformer.constructions.mpc.sorting`: every
   bucket of table t becomes a run, its keys before its queries.
4. **ranks** (1 round): each sorted key item sends its rank back to its worker; each sort machine
   sends its last code to the next one (to find the runs' starts).
5. **values** (1 round): workers send each key item's value to the value layout at its rank, the
   sort machines each item's (run start, kind, origin).
6. **scan** (2·D_v rounds): a segmented prefix sum of (value, 1) over the key items of each group,
   up and down a tree of fan F_v (the library's routes of prefix sums): every query item obtains
   its bucket's (S_t, C_t).
7. **results** (1 round): each query item sends (S_t, C_t) to its worker.
8. **reduce** (L_w + 1 rounds, G >= 1): workers add their pairs' results per head and send them up
   their tree, worker 0 to the token machine, which holds Σ_t S_t[g_t(q_i)] and Σ_t C_t[g_t(q_i)]
   for every head: Alg. 1's exact (num, den), from which it computes the head output and ``post``
   locally (in the next round's step, or ψ).

Words are p-bit (Def. 2.3: an element of Z_{2^p}); values and sums travel in two's complement, exact
because |num| <= ℓ·N·2^value_bits < 2^{p−1} (p is chosen so). Fan-ins: F = ⌈N^{ε′−ε}⌉ widths per
machine and s = 8·F·W; the trees' fan-ins F_b = ⌊(s/4)/max(U_b, U_r)⌋ >= 2F and F_v (s/4 over the
scan's summaries and its depth) are Θ(F), so every tree has depth O(1/(ε′ − ε)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from exactformer.constructions.mpc.library import down_route, levels, up_route
from exactformer.constructions.mpc.program import HeadOut, State
from exactformer.constructions.mpc.protocol import Memory, Protocol, Round, Send, Step, signed, twos
from exactformer.constructions.mpc.sorting import ColumnsortPlan, columnsort_plan
from exactformer.precision import FixedPoint
from exactformer.constructions.blocks.match import ema_weight
from exactformer.verify.attention.ema import check_fmt
from exactformer.verify.mpc import anna_program as ap
from exactformer.verify.mpc import protocol_run
from exactformer.verify.mpc.anna_program import ANNATransformer, LSHHead

#: s = MEMORY_FACTOR · F · W: the budget below gives each part of a machine at most s/4
MEMORY_FACTOR = 8
MAX_WORD_BITS = 62


class ANNAMPCError(ValueError):
    """Bad parameters of the simulation (names the parameter and the allowed range)."""


# ------------------------------------------------------------------------------------------------
# the plan
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadPlan:
    """One head of a layer: ``tables`` = ℓ (1 for exact match), its pairs start at ``pair0``."""

    name: str
    lsh: LSHHead | None
    tables: int
    point_words: int  # words of a query (or key) in the bundle
    value_words: int  # dv
    code_words: int  # words of a bucket code
    pair0: int


@dataclass(frozen=True)
class LayerPlan:
    """The rounds of one layer with heads (the phases of the module docstring). Machines: the token
    machines [0, ``base``), then workers, sort groups and value groups from ``base`` on."""

    index: int
    heads: tuple[HeadPlan, ...]
    pairs: int  # T = Σ_h ℓ_h: one sort group per pair (head, table)
    workers: int  # G per token (0: the token machine hashes its tokens' pairs)
    per_worker: int  # pairs per worker
    tree_fan: int  # F_b of the tree over a token's G workers
    tree_levels: int  # L_w (0 when G <= 1)
    bundle: int  # U_b words
    partial: int  # U_r = Σ_h (dv_h + 1) words
    code_words: int  # kw_c (the widest code)
    sort_machines: int  # M_t per group
    sort_per: int  # k items per sort machine
    sort: ColumnsortPlan
    value_words: int  # dv (widest value)
    value_machines: int  # M_v per group
    value_per: int  # k_v items per value machine
    scan_fan: int  # F_v
    scan_levels: int  # D_v (0 with one value machine per group)
    n: int  # N tokens
    tok_per: int  # tokens per token machine
    base: int  # the first machine after the token machines

    @property
    def item_words(self) -> int:  # sort item: code words, origin
        return self.code_words + 1

    @property
    def value_item(self) -> int:  # value item: run start, kind, origin, value words
        return self.value_words + 3

    @property
    def summary(self) -> int:  # scan summary: run start seen, value sums, count
        return self.value_words + 2

    @property
    def rank_slots(self) -> int:  # a worker's (or token machine's) inbox for ranks and results, in pairs
        return self.tok_per * self.pairs if self.workers == 0 else self.per_worker

    @property
    def tree_rounds(self) -> int:  # broadcast (or reduce) rounds: token -> worker 0, then the workers' tree
        return 0 if self.workers == 0 else 1 + self.tree_levels

    @property
    def rounds(self) -> int:
        return 2 * self.tree_rounds + 1 + self.sort.rounds + 2 + 2 * self.scan_levels + 1

    @property
    def machines(self) -> int:
        """Machines besides the token machines."""
        return max(self.workers * self.n, self.pairs * self.sort_machines, self.pairs * self.value_machines)


@dataclass(frozen=True)
class SimulationPlan:
    """Sizes of the simulation: N, ε, ε′, the width W (words per token), F = ⌈N^{ε′−ε}⌉, s, p, the
    tokens per token machine, and one :class:`LayerPlan` per layer with heads."""

    n: int
    eps: float
    eps_prime: float
    width: int
    state_words: int
    fan: int
    memory: int
    base_memory: int  # 8·F·W; ``memory`` exceeds it where the log-depth parts need more (small W)
    word_bits: int
    tok_per: int
    layers: tuple[LayerPlan, ...]

    @property
    def token_machines(self) -> int:
        return -(-self.n // self.tok_per)

    @property
    def machines(self) -> int:
        return self.token_machines + max((lp.machines for lp in self.layers), default=0)

    @property
    def rounds(self) -> int:
        return sum(lp.rounds for lp in self.layers)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, int(x)).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _state_words(state: State, n: int) -> int:
    return sum(int(np.prod(np.shape(a)[2:], dtype=np.int64)) for a in state.values())


def _widths(T: ANNATransformer) -> tuple[int, list[list[tuple[int, int]]]]:
    """(the largest token state in words, per layer and head (key words, value words)), from the
    maps on the all-zero input with all-zero head outputs: state shapes depend on neither."""
    n = T.n
    state = T.program.init(np.zeros((1, n), dtype=np.int64))
    words = _state_words(state, n)
    for layer in T.program.layers:
        st = layer.pre(state)
        outs = tuple(HeadOut(np.zeros((1, n, h.value_words), dtype=np.int64), np.zeros((1, n), dtype=np.int64))
                     for h in layer.heads)
        state = layer.post(st, outs)
        words = max(words, _state_words(state, n))
    return words, [[(h.key_words, h.value_words) for h in layer.heads] for layer in T.program.layers]


def _point_words(lh: LSHHead | None, key_words: int, p: int) -> int:
    if lh is None:
        return key_words
    return -(-key_words // max(1, p // lh.point_bits))


def _code_words(lh: LSHHead | None, key_words: int, p: int) -> int:
    if lh is None:
        return key_words
    return -(-lh.lsh.hashes // max(1, p // lh.lsh.symbol_bits))


def _check_float(v: Any, name: str, lo: float, hi: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ANNAMPCError(f"{name}: must be a number in ({lo}, {hi}), got {v!r}") from None
    if not lo < f < hi or isinstance(v, bool):
        raise ANNAMPCError(f"{name}: must be a number in ({lo:.4g}, {hi:.4g}), got {v!r}")
    return f


def _sizes(T: ANNATransformer) -> tuple[int, list[tuple[HeadPlan, ...]], list[int], int, int]:
    """(token state words, the heads of every layer, bundle words per layer, the width W, word bits p)."""
    N = T.n
    state_words, dims = _widths(T)
    max_tables = max([1] + [t for li in range(T.layers) for t in T.tables(li)])
    # words: origins and ranks below 4N; sums of ℓ·N values of value_bits bits (two's complement)
    p = max(T.program.word_bits, (4 * N).bit_length() + 1, T.value_bits + (N * max_tables).bit_length() + 1,
            max([1] + [h.lsh.symbol_bits for hs in T.hashing for h in hs if h is not None]))
    if p > MAX_WORD_BITS:
        raise ANNAMPCError(f"word bits: the sums need p = {p} > {MAX_WORD_BITS} bits (value_bits {T.value_bits}, "
                           f"N = {N}, ℓ <= {max_tables})")
    heads_of, bundles = [], []
    for li, hs in enumerate(T.hashing):
        heads, pair0 = [], 0
        for head, lh, (kw, dv) in zip(T.program.layers[li].heads, hs, dims[li]):
            ell = 1 if lh is None else lh.lsh.tables
            heads.append(HeadPlan(head.name, lh, ell, _point_words(lh, kw, p), dv, _code_words(lh, kw, p), pair0))
            pair0 += ell
        heads_of.append(tuple(heads))
        bundles.append(sum(2 * h.point_words + h.value_words for h in heads))
    return state_words, heads_of, bundles, max([state_words] + bundles), p


def width_exponent(T: ANNATransformer) -> float:
    """ε = log_N W for the transformer's width W (words per token: its state, or the queries, keys and
    values of a layer's heads, whichever is larger): the default ε of :func:`plan`."""
    if not isinstance(T, ANNATransformer) or T.n < 2:
        raise ANNAMPCError("T: must be an ANNATransformer with N >= 2 tokens")
    return math.log(_sizes(T)[3]) / math.log(T.n)


class _NoRoom(Exception):
    """s words do not hold one part of a machine (the message says which)."""


def plan(T: ANNATransformer, eps_prime: float, eps: float | None = None, memory: int | None = None) -> SimulationPlan:
    """The simulation's sizes for ``T`` (see the module docstring). ``eps`` defaults to log_N W;
    ``memory`` overrides s = 8·⌈N^{ε′−ε}⌉·W (it must leave room for every part, else an error names
    the part); without it s is raised above 8·F·W where a log-depth part (the scan's summaries, a
    sort of 2 items) needs more."""
    if not isinstance(T, ANNATransformer):
        raise ANNAMPCError(f"T: must be an ANNATransformer, got {type(T).__name__}")
    N = T.n
    if N < 2:
        raise ANNAMPCError(f"n: the simulation needs N >= 2 tokens, got {N}")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, np.integer)) or memory < 1):
        raise ANNAMPCError(f"memory: must be an integer >= 1 (s, words per machine), got {memory!r}")
    state_words, heads_of, bundles, width, p = _sizes(T)
    e = math.log(width) / math.log(N) if eps is None else _check_float(eps, "eps", 0.0, math.inf)
    ep = _check_float(eps_prime, "eps_prime", e, e + 4)
    fan = max(2, math.ceil(N ** (ep - e) - 1e-9))
    base = MEMORY_FACTOR * fan * width
    s = base if memory is None else int(memory)
    while True:
        try:
            return _plan_with(T, heads_of, bundles, state_words, s, (N, e, ep, width, fan, base, p))
        except _NoRoom as err:
            if memory is not None or s > 1 << 40:
                raise ANNAMPCError(f"memory: {err}") from None
            s += max(1, s // 4)


def _plan_with(T: ANNATransformer, heads_of: list, bundles: list[int], state_words: int, s: int,
               sizes: tuple) -> SimulationPlan:
    """The plan with memory s, or :class:`_NoRoom`: the token machines' part within s/2, every other
    part of a machine within s/4 (workers' pairs, the tree, the scan's summaries) or s/2 (sort and
    value items), so that a machine playing several parts stays within s."""
    N, e, ep, width, fan, base_memory, p = sizes
    quarter, half = s // 4, s // 2
    per_token = []
    for li, heads in enumerate(heads_of):
        if not heads:
            continue
        pairs = sum(h.tables for h in heads)
        dv = max(h.value_words for h in heads)
        per_pair = 2 * (max(h.code_words for h in heads) + 1) + dv + 2  # two items out; a rank and a result in
        partial = sum(h.value_words + 1 for h in heads)
        alone = state_words + bundles[li] + pairs * per_pair  # the token machine hashes its tokens' pairs
        per_token.append(alone if alone <= half else state_words + bundles[li] + partial)
    need = max([state_words] + per_token)
    if need > half:
        raise _NoRoom(f"s = {s} words: a token's state and bundle ({need} words) exceed s/2")
    tok_per = max(1, half // need)
    P_tok = -(-N // tok_per)
    layers = []
    for li, heads in enumerate(heads_of):
        if not heads:
            continue
        pairs = sum(h.tables for h in heads)
        dv = max(h.value_words for h in heads)
        kwc = max(h.code_words for h in heads)
        partial = sum(h.value_words + 1 for h in heads)
        bundle = bundles[li]
        w_s, w_v = kwc + 1, dv + 3
        per_pair = 2 * w_s + dv + 2
        if state_words + bundle + pairs * per_pair <= half:
            G, per_worker, fan_b, lev_b = 0, pairs, 2, 0
        else:
            per_worker = quarter // per_pair
            fan_b = quarter // max(bundle, partial)
            if per_worker < 1 or fan_b < 2 or bundle > quarter:
                raise _NoRoom(f"s = {s} words leave no room for a worker (a pair needs {per_pair} words, the bundle "
                              f"{bundle}, the tree {2 * max(bundle, partial)} of s/4 = {quarter})")
            G = -(-pairs // per_worker)
            per_worker = -(-pairs // G)  # spread evenly
            lev_b = 0 if G == 1 else levels(G, fan_b)
        if half // w_s < 2:
            raise _NoRoom(f"s = {s} words hold fewer than 2 sort items of {w_s} words in s/2")
        k = _pow2_floor(half // w_s)
        M_t = _pow2_ceil(-(-2 * N // k))
        k_v = half // w_v
        if k_v < 1:
            raise _NoRoom(f"s = {s} words hold no value item of {w_v} words in s/2")
        M_v = -(-2 * N // k_v)
        fan_v, lev_v = 2, 0
        if M_v > 1:
            fan_v = max(2, quarter // (2 * (dv + 2)))
            while True:
                lev_v = levels(M_v, fan_v)
                if (lev_v + 1) * fan_v * (dv + 2) <= quarter or fan_v == 2:
                    break
                fan_v -= 1
            if (lev_v + 1) * fan_v * (dv + 2) > quarter:
                raise _NoRoom(f"s = {s} words leave no room for the scan's summaries ({lev_v + 1} levels of "
                              f"{fan_v} × {dv + 2} words in s/4)")
        layers.append(LayerPlan(li, heads, pairs, G, per_worker, fan_b, lev_b, bundle, partial, kwc, M_t, k,
                                columnsort_plan(M_t, k), dv, M_v, k_v, fan_v, lev_v, N, tok_per, P_tok))
    return SimulationPlan(N, e, ep, width, state_words, fan, s, base_memory, p, tok_per, tuple(layers))


# ------------------------------------------------------------------------------------------------
# words
# ------------------------------------------------------------------------------------------------


def _pack_points(pts: np.ndarray, lh: LSHHead, p: int, words: int) -> np.ndarray:
    """[..., dim] coordinates -> [..., words] p-bit words (point_bits each, two's complement)."""
    pb = lh.point_bits
    per = max(1, p // pb)
    c = pts & ((1 << pb) - 1)
    out = np.zeros(pts.shape[:-1] + (words,), dtype=np.int64)
    for j in range(pts.shape[-1]):
        out[..., j // per] |= c[..., j] << ((j % per) * pb)
    return out


def _unpack_points(w: np.ndarray, lh: LSHHead, p: int, dim: int) -> np.ndarray:
    pb = lh.point_bits
    per = max(1, p // pb)
    w = np.where(w < 0, 0, w)
    out = np.empty(w.shape[:-1] + (dim,), dtype=np.int64)
    for j in range(dim):
        c = (w[..., j // per] >> ((j % per) * pb)) & ((1 << pb) - 1)
        out[..., j] = c - (1 << pb) * (c >= 1 << (pb - 1)) if lh.signed else c
    return out


class _Outbox:
    """Messages of one round from every machine, assembled into a :class:`Send` ([B, P, m])."""

    def __init__(self, B: int, P: int):
        self.B, self.P = B, P
        self.blocks: list[tuple[np.ndarray, ...]] = []

    def add(self, rows, dest, slot, word) -> None:
        """Messages of the machines ``rows`` (machine ids, any shape R; a machine may appear several
        times): ``dest``, ``slot``, ``word`` broadcast to [B, *R, *m], m words per entry of ``rows``;
        ⊥ words (< 0) and destinations < 0 send nothing. A machine's blocks follow each other in its
        message list."""
        rows = np.asarray(rows)
        dest, slot, word = np.broadcast_arrays(dest, slot, word)
        shape = np.broadcast_shapes(dest.shape, (self.B,) + rows.shape + (1,) * (dest.ndim - 1 - rows.ndim))
        dest, slot, word = (np.broadcast_to(a, shape).reshape(self.B, rows.size, -1) for a in (dest, slot, word))
        self.blocks.append((rows.reshape(-1), np.where(word >= 0, dest, -1), slot, word))

    def send(self) -> Send | None:
        if not self.blocks:
            return None
        fill = np.zeros(self.P, dtype=np.int64)
        offsets = []
        for rows, dest, _, _ in self.blocks:
            m = dest.shape[2]
            order = np.argsort(rows, kind="stable")
            occ = np.empty_like(rows)
            occ[order] = np.arange(rows.size) - np.searchsorted(rows[order], rows[order])  # earlier copies of the row
            offsets.append(fill[rows] + occ * m)
            fill += np.bincount(rows, minlength=self.P) * m
        m = int(fill.max())
        D = np.full((self.B, self.P, m), -1, dtype=np.int64)
        S = np.zeros((self.B, self.P, m), dtype=np.int64)
        W = np.zeros((self.B, self.P, m), dtype=np.int64)
        for (rows, dest, slot, word), off in zip(self.blocks, offsets):
            cols = off[:, None] + np.arange(dest.shape[2])
            D[:, rows[:, None], cols], S[:, rows[:, None], cols], W[:, rows[:, None], cols] = dest, slot, word
        return Send(D, S, W)


# ------------------------------------------------------------------------------------------------
# head outputs from the sums
# ------------------------------------------------------------------------------------------------


def ema_head_out(total: np.ndarray, count: np.ndarray, fmt: FixedPoint | None) -> HeadOut:
    """An exact-match head's output from the exact sum of its matched values and their count, as
    the EMA kernel computes it: ideal (total, count); fixed point sat(w_c · total) with the raw
    weight w_c = sat(round(S/c)) of every match (docs/ema.md)."""
    if fmt is None:
        return HeadOut(total, count)
    w = np.where(count > 0, ema_weight(fmt, np.maximum(count, 1)), 0)
    prod = w[..., None].astype(object) * total.astype(object)
    return HeadOut(np.clip(prod, fmt.min_raw, fmt.max_raw).astype(np.int64), fmt.scale)


def head_outs(lp: LayerPlan, sums: list[tuple[np.ndarray, np.ndarray]], fmt: FixedPoint | None) -> tuple[HeadOut, ...]:
    return tuple(ap.lsh_head_out(num, den, fmt) if h.lsh is not None else ema_head_out(num, den, fmt)
                 for h, (num, den) in zip(lp.heads, sums))


# ------------------------------------------------------------------------------------------------
# the protocol
# ------------------------------------------------------------------------------------------------


@dataclass
class ANNASimulation:
    """A compiled simulation: the ``protocol`` (run it with :func:`protocol_run.run`), its ``plan``,
    the transformer ``T`` and the semantics ``fmt``; ``layer_ends[j]`` is the round after which
    the token machines hold the sums of the j-th layer with heads (:meth:`sums`)."""

    T: ANNATransformer
    plan: SimulationPlan
    fmt: FixedPoint | None
    protocol: Protocol
    layer_ends: tuple[int, ...]
    _sums: Callable[[Memory, LayerPlan], list] = field(repr=False)

    def sums(self, mem: Memory, j: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(num [B, N, dv_h], den [B, N]) of every head of the j-th layer with heads, from the token
        machines' memory after round ``layer_ends[j]``."""
        return self._sums(mem, self.plan.layers[j])

    def __call__(self, inputs) -> np.ndarray:
        """The protocol's outputs [B, N] (every resource checked)."""
        return protocol_run.run(self.protocol, inputs).outputs


STATE2, STATE3, BUNDLES = "t0.", "t1.", "t.bundles"


class _Builder:
    """The rounds of the protocol (module docstring). Token i lives on machine i // k (k tokens
    per token machine, at offset i mod k); a field of the token machines holds k tokens' words."""

    def __init__(self, T: ANNATransformer, pl: SimulationPlan, fmt: FixedPoint | None):
        self.T, self.pl, self.fmt = T, pl, fmt
        self.N, self.P, self.p, self.k = pl.n, pl.machines, pl.word_bits, pl.tok_per
        self.P_tok = pl.token_machines
        self.i = np.arange(self.N)

    # ---- the token machines ----------------------------------------------------------------------
    def pack(self, a: np.ndarray) -> np.ndarray:
        """Per-token words [B, N, w] -> a field [B, P, k·w] of the token machines (⊥ elsewhere)."""
        B, N, w = a.shape
        out = np.full((B, self.P_tok * self.k, w), -1, dtype=np.int64)
        out[:, :N] = a
        full = np.full((B, self.P, self.k * w), -1, dtype=np.int64)
        full[:, :self.P_tok] = out.reshape(B, self.P_tok, self.k * w)
        return full

    def unpack(self, field_: np.ndarray, w: int) -> np.ndarray:
        """A token machines' field [B, P, k·w] -> per-token words [B, N, w]."""
        B = field_.shape[0]
        return field_[:, :self.P_tok, :self.k * w].reshape(B, self.P_tok * self.k, w)[:, :self.N]

    def encode_state(self, state: State) -> Memory:
        mem = {}
        for name, a in state.items():
            a = np.asarray(a)
            if a.dtype.kind not in "iu" or a.ndim not in (2, 3) or a.shape[1] != self.N:
                raise ANNAMPCError(f"state field {name!r}: must be an int array [B, {self.N}] or [B, {self.N}, w], got "
                                   f"{a.dtype} {list(a.shape)}")
            if a.size and (a.min() < -1 or a.max() >= 1 << self.p):
                raise ANNAMPCError(f"state field {name!r}: words in [{a.min()}, {a.max()}] are not p = {self.p} bit "
                                   "words (or ⊥ = -1)")
            mem[(STATE2 if a.ndim == 2 else STATE3) + name] = self.pack(a.reshape(a.shape[:2] + (-1,)).astype(np.int64))
        return mem

    def decode_state(self, mem: Memory) -> State:
        out = {}
        for key, v in mem.items():
            if key.startswith(STATE2):
                out[key[len(STATE2):]] = self.unpack(v, 1)[..., 0]
            elif key.startswith(STATE3):
                out[key[len(STATE3):]] = self.unpack(v, v.shape[2] // self.k)
        return out

    @staticmethod
    def token_fields(mem: Memory) -> Memory:
        return {k: v for k, v in mem.items() if k.startswith((STATE2, STATE3))}

    def token_machine(self, i: np.ndarray) -> np.ndarray:
        return i // self.k

    # ---- workers ----------------------------------------------------------------------------------
    def worker(self, lp: LayerPlan, i: np.ndarray, pair: np.ndarray) -> np.ndarray:
        """The machine hashing pair ``pair`` of token i (its token machine when G = 0)."""
        if lp.workers == 0:
            return self.token_machine(i)
        return lp.base + i * lp.workers + pair // lp.per_worker

    def worker_slot(self, lp: LayerPlan, i: np.ndarray, pair: np.ndarray) -> np.ndarray:
        """The pair's place in its worker's inbox of ranks (or results, × (dv + 1))."""
        if lp.workers == 0:
            return (i % self.k) * lp.pairs + pair
        return pair % lp.per_worker

    def groups(self, lp: LayerPlan) -> list[tuple[int, int, np.ndarray]]:
        """(first pair, end, machines of every token [N]) for each worker g (one group when G = 0)."""
        out = []
        for g in range(max(1, lp.workers)):
            lo, hi = g * lp.per_worker, min(lp.pairs, (g + 1) * lp.per_worker)
            if lo < hi:
                out.append((lo, hi, self.worker(lp, self.i, np.full(self.N, lo))))
        return out

    def worker_bundles(self, mem: Memory, lp: LayerPlan, machines: np.ndarray) -> np.ndarray:
        """The bundles [B, N, U_b] a group's workers hold."""
        if lp.workers == 0:
            return self.unpack(mem[BUNDLES], lp.bundle)
        return mem["w.bundle"][:, machines]

    # ---- the token's local step: post of the last layer, pre and the bundle of the next ------------
    def advance(self, mem: Memory, done: LayerPlan | None, upto: int) -> State:
        """The state before layer ``upto`` (an index of the program's layers): the state in memory
        after ``post`` of ``done`` (its sums from the inbox) and of every layer without heads
        before ``upto``."""
        state = self.decode_state(mem)
        layers = self.T.program.layers
        start = 0
        if done is not None:
            L = layers[done.index]
            state = L.post(L.pre(state), head_outs(done, self.token_sums(mem, done), self.fmt))
            start = done.index + 1
        for li in range(start, upto):
            state = layers[li].post(layers[li].pre(state), ())
        return state

    def bundle(self, lp: LayerPlan, state: State) -> np.ndarray:
        """[B, N, U_b] words: per head (query, key, value)."""
        layer = self.T.program.layers[lp.index]
        st = layer.pre(state)
        parts = []
        for head, h in zip(layer.heads, lp.heads):
            q, k, v = ap.head_inputs(head, h.lsh, st, self.N, self.T.value_bits)
            if h.lsh is None:
                q, k = np.where(q < 0, -1, q), np.where(k < 0, -1, k)
                if max(q.max(initial=0), k.max(initial=0)) >= 1 << self.p:
                    raise ANNAMPCError(f"head {head.name!r}: key words beyond p = {self.p} bits")
            else:
                q, k = _pack_points(q, h.lsh, self.p, h.point_words), _pack_points(k, h.lsh, self.p, h.point_words)
            parts += [q, k, twos(v, self.p)]
        return np.concatenate(parts, axis=-1)

    @staticmethod
    def head_parts(lp: LayerPlan, bundle: np.ndarray, h: HeadPlan) -> tuple[np.ndarray, ...]:
        """(queries, keys, values) of head h from bundles [..., U_b] (⊥ where not received)."""
        off = sum(2 * x.point_words + x.value_words for x in lp.heads[:lp.heads.index(h)])
        return (bundle[..., off:off + h.point_words], bundle[..., off + h.point_words:off + 2 * h.point_words],
                bundle[..., off + 2 * h.point_words:off + 2 * h.point_words + h.value_words])

    def token_sums(self, mem: Memory, lp: LayerPlan) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every head's (num [B, N, dv_h], den [B, N]) at the token machines, from their inbox after
        the layer's last round."""
        p, dvp = self.p, lp.value_words + 1
        out = []
        if lp.workers == 0:  # results per pair: (S_t, C_t)
            res = signed(self.unpack(mem["inbox"], lp.pairs * dvp).reshape(-1, self.N, lp.pairs, dvp), p)
            for h in lp.heads:
                r = res[:, :, h.pair0:h.pair0 + h.tables].sum(axis=2)
                out.append((r[..., :h.value_words], r[..., lp.value_words]))
            return out
        parts = signed(self.unpack(mem["inbox"], lp.partial), p)
        off = 0
        for h in lp.heads:
            out.append((parts[..., off:off + h.value_words], parts[..., off + h.value_words]))
            off += h.value_words + 1
        return out

    # ---- rounds -----------------------------------------------------------------------------------
    def rounds(self) -> tuple[list[Round], list[int]]:
        rounds: list[Round] = []
        ends = []
        prev = None
        for lp in self.pl.layers:
            rounds += self.layer_rounds(lp, prev)
            ends.append(len(rounds))
            prev = lp
        return rounds, ends

    def layer_rounds(self, lp: LayerPlan, prev: LayerPlan | None) -> list[Round]:
        L = lp.index
        out: list[Round] = []
        if lp.workers:
            out.append(Round(f"L{L}.bcast-0", self._bcast(lp, prev, 0), sends=self.k, slots=lp.bundle))
            for j in range(1, lp.tree_levels + 1):
                out.append(Round(f"L{L}.bcast-{j}", self._bcast(lp, prev, j), sends=lp.tree_fan - 1, slots=lp.bundle))
        out.append(Round(f"L{L}.codes", self._codes(lp, prev), sends=2 * lp.rank_slots,
                         slots=lp.sort_per * lp.item_words))
        for j, perm in enumerate(lp.sort.perms):
            out.append(Round(f"L{L}.sort-{j + 1}", self._sort(lp, perm), sends=lp.sort_per,
                             slots=lp.sort_per * lp.item_words))
        out.append(Round(f"L{L}.ranks", self._ranks(lp), sends=lp.sort_per + 1, slots=lp.rank_slots + lp.code_words))
        out.append(Round(f"L{L}.values", self._values(lp), sends=lp.rank_slots + lp.sort_per,
                         slots=lp.value_per * lp.value_item))
        for lev in range(1, lp.scan_levels + 1):
            out.append(Round(f"L{L}.up-{lev}", self._up(lp, lev), sends=1, slots=lp.scan_fan * lp.summary))
        for lev in range(lp.scan_levels, 0, -1):
            out.append(Round(f"L{L}.down-{lev}", self._down(lp, lev), sends=lp.scan_fan - 1,
                             slots=lp.value_words + 1))
        out.append(Round(f"L{L}.results", self._results(lp), sends=lp.value_per,
                         slots=lp.rank_slots * (lp.value_words + 1)))
        if lp.workers:
            for lev in range(1, lp.tree_levels + 1):
                out.append(Round(f"L{L}.reduce-{lev}", self._reduce(lp, lev), sends=1,
                                 slots=lp.tree_fan * lp.partial))
            out.append(Round(f"L{L}.reduce-top", self._reduce(lp, 0), sends=1, slots=self.k * lp.partial))
        return out

    # bcast: the token machine sends each token's bundle to its worker 0; then the workers' tree -------
    def _tree(self, lp: LayerPlan) -> np.ndarray:
        """Machines of every token's workers [N, G]."""
        return lp.base + self.i[:, None] * lp.workers + np.arange(lp.workers)[None, :]

    def _received(self, lp: LayerPlan, j: int) -> np.ndarray:
        """[G] bool: the workers that receive the bundle in broadcast round j."""
        got = np.zeros(lp.workers, dtype=bool)
        if j == 0:
            got[0] = True
        else:
            lead, dest = down_route(lp.workers, lp.tree_fan, lp.tree_levels - j + 1)
            got[dest[lead]] = True
        return got

    def _take_bundles(self, mem: Memory, lp: LayerPlan, j: int) -> np.ndarray:
        """"w.bundle" [B, P, U_b] with the bundles received in broadcast round j stored."""
        rows = self._tree(lp)[:, self._received(lp, j)].reshape(-1)
        out = mem["w.bundle"].copy() if "w.bundle" in mem else np.full(mem["inbox"].shape[:2] + (lp.bundle,), -1,
                                                                         dtype=np.int64)
        out[:, rows] = mem["inbox"][:, rows, :lp.bundle]
        return out

    def _bcast(self, lp: LayerPlan, prev: LayerPlan | None, j: int):
        def step(mem: Memory) -> Step:
            B = next(iter(mem.values())).shape[0]
            ob = _Outbox(B, self.P)
            if j == 0:
                state = self.advance(mem, prev, lp.index)
                keep = self.encode_state(state)
                ob.add(self.token_machine(self.i), self._tree(lp)[None, :, :1], np.arange(lp.bundle),
                       self.bundle(lp, state))
                return Step(keep, send=ob.send())
            keep = self.token_fields(mem)
            bundles = self._take_bundles(mem, lp, j - 1)
            keep["w.bundle"] = bundles
            lead, dest = down_route(lp.workers, lp.tree_fan, lp.tree_levels - j + 1)  # [G, F − 1]
            tree = self._tree(lp)  # [N, G]
            tgt = np.where(lead[None], tree[:, np.maximum(dest, 0)], -1)  # [N, G, F − 1]
            ob.add(tree, tgt[None, ..., None], np.arange(lp.bundle), bundles[:, tree][:, :, :, None, :])
            return Step(keep, send=ob.send())

        return step

    # codes -----------------------------------------------------------------------------------------
    def _codes(self, lp: LayerPlan, prev: LayerPlan | None):
        N, p = self.N, self.p

        def step(mem: Memory) -> Step:
            B = next(iter(mem.values())).shape[0]
            if lp.workers == 0:
                state = self.advance(mem, prev, lp.index)
                keep = self.encode_state(state)
                keep[BUNDLES] = self.pack(self.bundle(lp, state))
            else:
                keep = self.token_fields(mem)
                keep["w.bundle"] = self._take_bundles(mem, lp, lp.tree_levels)
            ob = _Outbox(B, self.P)
            for lo, hi, machines in self.groups(lp):
                bun = self.worker_bundles(keep, lp, machines)  # [B, N, U_b]
                for h in lp.heads:
                    t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                    if t0 >= t1:
                        continue
                    q, k, _ = self.head_parts(lp, bun, h)
                    if h.lsh is None:  # the key words themselves; a row holding ⊥ asks / publishes nothing
                        cq = np.where((q >= 0).all(-1, keepdims=True), q, -1)[:, :, None, :]
                        ck = np.where((k >= 0).all(-1, keepdims=True), k, -1)[:, :, None, :]
                    else:
                        lsh, dim = h.lsh.lsh, h.lsh.lsh.dim
                        cq, ck = (lsh.codes(_unpack_points(a, h.lsh, p, dim).reshape(B * N, dim), t0, t1, p)
                                  .reshape(B, N, t1 - t0, -1) for a in (q, k))
                    tau = h.pair0 + np.arange(t0, t1)  # [T]
                    for kind, code in ((0, ck), (1, cq)):
                        absent = code[..., :1] < 0
                        pad = np.zeros(code.shape[:3] + (lp.code_words - code.shape[3],), dtype=np.int64)
                        origin = kind * N + self.i  # [N]
                        item = np.concatenate([code, pad, np.broadcast_to(origin[None, :, None, None], absent.shape)],
                                              axis=-1)
                        item = np.where(absent, -1, item)
                        dest = lp.base + tau[None, :] * lp.sort_machines + (origin // lp.sort_per)[:, None]
                        slot = (origin % lp.sort_per)[:, None, None] * lp.item_words + np.arange(lp.item_words)
                        ob.add(machines, dest[None, :, :, None], slot[None], item)
            return Step(keep, send=ob.send())

        return step

    # sort ------------------------------------------------------------------------------------------
    def _sort_rows(self, lp: LayerPlan) -> np.ndarray:
        """Machines of every sort group [T, M_t]."""
        return lp.base + np.arange(lp.pairs)[:, None] * lp.sort_machines + np.arange(lp.sort_machines)[None, :]

    def _sorted_items(self, mem: Memory, lp: LayerPlan) -> np.ndarray:
        """The sort machines' items [B, T, M_t, k, w_s], each machine's sorted by (code, origin),
        empty slots last."""
        k, w, M = lp.sort_per, lp.item_words, lp.sort_machines
        B = mem["inbox"].shape[0]
        items = mem["inbox"][:, lp.base:lp.base + lp.pairs * M, :k * w].reshape(B, lp.pairs, M, k, w)
        flat = items.reshape(-1, k, w)
        empty = flat[..., 0] < 0
        bits = [int(flat[..., c].max(initial=0)).bit_length() for c in range(w)]
        if sum(bits) <= 62:  # one int64 per item, in the order of the words
            key = np.zeros(flat.shape[:2], dtype=np.int64)
            for c in range(w):
                key = (key << bits[c]) | np.maximum(flat[..., c], 0)
            order = np.argsort(np.where(empty, np.iinfo(np.int64).max, key), axis=-1, kind="stable")
        else:
            cols = [flat[..., c] for c in range(w - 1, -1, -1)]
            keys = cols + [empty, np.broadcast_to(np.arange(flat.shape[0])[:, None], empty.shape)]
            order = np.lexsort([a.reshape(-1) for a in keys]).reshape(flat.shape[0], k) % k
        return np.take_along_axis(flat, order[..., None], axis=1).reshape(items.shape)

    def _sort(self, lp: LayerPlan, perm: np.ndarray):
        def step(mem: Memory) -> Step:
            items = self._sorted_items(mem, lp)
            B = items.shape[0]
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            M, k, w = lp.sort_machines, lp.sort_per, lp.item_words
            dst = perm.reshape(1, M, k)
            dest = lp.base + np.arange(lp.pairs)[:, None, None] * M + dst // k  # [T, M, k]
            ob = _Outbox(B, self.P)
            ob.add(self._sort_rows(lp), dest[None, ..., None], ((dst % k) * w)[None, ..., None] + np.arange(w), items)
            return Step(keep, send=ob.send())

        return step

    # ranks -----------------------------------------------------------------------------------------
    def _ranks(self, lp: LayerPlan):
        N = self.N

        def step(mem: Memory) -> Step:
            items = self._sorted_items(mem, lp)  # [B, T, M, k, w]
            B = items.shape[0]
            M, k, w = lp.sort_machines, lp.sort_per, lp.item_words
            keep = {kk: v for kk, v in mem.items() if kk != "inbox"}
            s_items = np.full((B, self.P, k * w), -1, dtype=np.int64)
            s_items[:, lp.base:lp.base + lp.pairs * M] = items.reshape(B, lp.pairs * M, k * w)
            keep["s.items"] = s_items
            ob = _Outbox(B, self.P)
            tau = np.arange(lp.pairs)[:, None, None]
            rank = np.arange(M)[None, :, None] * k + np.arange(k)[None, None, :]  # [1, M, k]
            origin = items[..., -1]  # [B, T, M, k]
            is_key = (origin >= 0) & (origin < N)
            tok = np.where(is_key, origin, 0)
            dest = np.where(is_key, self.worker(lp, tok, tau), -1)
            ob.add(self._sort_rows(lp), dest, self.worker_slot(lp, tok, tau), rank)
            if M > 1:  # each sort machine's last code to the next machine of its group
                rows = self._sort_rows(lp)
                ob.add(rows[:, :-1], rows[None, :, 1:, None], lp.rank_slots + np.arange(lp.code_words),
                       items[:, :, :-1, -1, :lp.code_words])
            return Step(keep, send=ob.send())

        return step

    # values ----------------------------------------------------------------------------------------
    def _values(self, lp: LayerPlan):
        N = self.N

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, k, w, kw = lp.sort_machines, lp.sort_per, lp.item_words, lp.code_words
            rows = self._sort_rows(lp)
            keep = self.token_fields(mem)
            ob = _Outbox(B, self.P)
            # sort machines: run starts, kinds and origins to the value layout
            items = mem["s.items"][:, rows].reshape(B, lp.pairs, M, k, w)
            codes = items[..., :kw]
            prev = np.concatenate([np.full(codes.shape[:3] + (1, kw), -2, dtype=np.int64), codes[:, :, :, :-1]], axis=3)
            bound = mem["inbox"][:, rows, lp.rank_slots:lp.rank_slots + kw]  # [B, T, M, kw]
            prev[:, :, :, 0] = np.where(np.arange(M)[None, None, :, None] == 0, -2, bound)
            origin = items[..., -1]
            start = (codes != prev).any(axis=-1)
            kind = np.where(origin < N, 1, 2)
            rank = np.arange(M)[None, :, None] * k + np.arange(k)[None, None, :]
            vm = lp.base + np.arange(lp.pairs)[:, None, None] * lp.value_machines + rank // lp.value_per
            vslot = (rank % lp.value_per) * lp.value_item
            data = np.stack([start.astype(np.int64), kind, origin], axis=-1)
            ob.add(rows, np.where(origin >= 0, vm, -1)[..., None], vslot[None, ..., None] + np.arange(3), data)
            # workers: the value of each key item to its rank
            for lo, hi, machines in self.groups(lp):
                bun = self.worker_bundles(mem, lp, machines)
                for h in lp.heads:
                    t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                    if t0 >= t1:
                        continue
                    tau = h.pair0 + np.arange(t0, t1)
                    slots = self.worker_slot(lp, self.i[:, None], tau[None, :])  # [N, T]
                    r = np.take_along_axis(mem["inbox"][:, machines], np.broadcast_to(slots[None], (B,) + slots.shape),
                                           axis=2)  # [B, N, T]
                    _, _, v = self.head_parts(lp, bun, h)
                    dest = np.where(r >= 0, lp.base + tau * lp.value_machines + np.maximum(r, 0) // lp.value_per, -1)
                    slot = (np.maximum(r, 0) % lp.value_per) * lp.value_item + 3
                    ob.add(machines, dest[..., None], slot[..., None] + np.arange(h.value_words),
                           np.broadcast_to(v[:, :, None, :], r.shape + (h.value_words,)))
            return Step(keep, send=ob.send())

        return step

    # scan ------------------------------------------------------------------------------------------
    def _value_rows(self, lp: LayerPlan) -> np.ndarray:
        """Machines of every value group [T, M_v]."""
        return lp.base + np.arange(lp.pairs)[:, None] * lp.value_machines + np.arange(lp.value_machines)[None, :]

    def _value_items(self, items_field: np.ndarray, lp: LayerPlan) -> np.ndarray:
        B = items_field.shape[0]
        return items_field[:, self._value_rows(lp), :lp.value_per * lp.value_item].reshape(
            B, lp.pairs, lp.value_machines, lp.value_per, lp.value_item)

    def _payload(self, items: np.ndarray, lp: LayerPlan) -> tuple[np.ndarray, np.ndarray]:
        """(run start [.., k] bool, payload [.., k, dv + 1] signed: (value, 1) of key items, 0 else)."""
        start = items[..., 0] == 1
        key = items[..., 1] == 1
        val = signed(items[..., 3:3 + lp.value_words], self.p)
        pay = np.concatenate([val, np.ones(val.shape[:-1] + (1,), dtype=np.int64)], axis=-1)
        return start, np.where(key[..., None], pay, 0)

    @staticmethod
    def _fold(carry: np.ndarray, f: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Segmented fold: X ← t if the block holds a run start, else X + t."""
        return np.where(f[..., None], t, carry + t)

    def _combine(self, kids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A block's summary from its children's summary words [..., F, U] (⊥: no child)."""
        f = kids[..., 0] == 1
        t = signed(kids[..., 1:], self.p)
        acc_f = f.any(axis=-1)
        acc_t = np.zeros(t.shape[:-2] + t.shape[-1:], dtype=np.int64)
        for c in range(kids.shape[-2]):
            acc_t = self._fold(acc_t, f[..., c], t[..., c, :])
        return acc_f, acc_t

    def _up(self, lp: LayerPlan, lev: int):
        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, F, U = lp.value_machines, lp.scan_fan, lp.summary
            rows = self._value_rows(lp)
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            if lev == 1:
                items = np.full((B, self.P, lp.value_per * lp.value_item), -1, dtype=np.int64)
                items[:, rows] = mem["inbox"][:, rows, :lp.value_per * lp.value_item]
                keep["v.items"] = items
                start, pay = self._payload(self._value_items(items, lp), lp)
                f = start.any(axis=-1)
                after = np.cumsum(start[..., ::-1], axis=-1)[..., ::-1]  # run starts at or after each item
                t = np.where(((after - start) == 0)[..., None], pay, 0).sum(axis=-2)  # after the last start
            else:
                kids = mem["inbox"][:, rows, :F * U]  # [B, T, M, F·U]
                saved = np.full((B, self.P, F * U), -1, dtype=np.int64)
                saved[:, rows] = kids
                keep[f"v.sum{lev - 1}"] = saved
                f, t = self._combine(kids.reshape(B, lp.pairs, M, F, U))
            lead, dest, slot = up_route(M, F, lev)
            d = np.where(lead[None, :], rows[:, :1] + dest[None, :], -1)
            ob = _Outbox(B, self.P)
            ob.add(rows, d[None, ..., None], (slot * U)[None, None, :, None] + np.arange(U),
                   np.concatenate([f[..., None].astype(np.int64), twos(t, self.p)], axis=-1))
            return Step(keep, send=ob.send())

        return step

    def _carry(self, mem: Memory, lp: LayerPlan) -> np.ndarray:
        """Each value machine's carry-in [B, T, M, dv + 1]: received in the last down round, else kept."""
        rows = self._value_rows(lp)
        got = mem["inbox"][:, rows, :lp.value_words + 1]
        has = (got >= 0).all(axis=-1, keepdims=True)
        kept = mem["v.carry"][:, rows] if "v.carry" in mem else np.zeros_like(got)
        return signed(np.where(has, got, kept), self.p)

    def _down(self, lp: LayerPlan, lev: int):
        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, F, U = lp.value_machines, lp.scan_fan, lp.summary
            rows = self._value_rows(lp)
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            if lev == lp.scan_levels:  # the top: the last up round's summaries arrived just now
                kids = mem["inbox"][:, rows, :F * U]
                carry = np.zeros((B, lp.pairs, M, lp.value_words + 1), dtype=np.int64)
            else:
                kids = mem[f"v.sum{lev}"][:, rows]
                del keep[f"v.sum{lev}"]
                carry = self._carry(mem, lp)
            kids = kids.reshape(B, lp.pairs, M, F, U)
            f, t = kids[..., 0] == 1, signed(kids[..., 1:], self.p)
            carries = [carry]
            for c in range(F - 1):
                carries.append(self._fold(carries[-1], f[..., c], t[..., c, :]))
            store = np.full((B, self.P, lp.value_words + 1), -1, dtype=np.int64)
            store[:, rows] = twos(carry, self.p)
            keep["v.carry"] = store
            lead, dest = down_route(M, F, lev)  # [M, F − 1]
            d = np.where(lead[None], rows[:, :1, None] + np.maximum(dest, 0)[None], -1)  # [T, M, F − 1]
            ob = _Outbox(B, self.P)
            ob.add(rows, d[None, ..., None], np.arange(lp.value_words + 1), twos(np.stack(carries[1:], axis=-2), self.p))
            return Step(keep, send=ob.send())

        return step

    # results ---------------------------------------------------------------------------------------
    def _results(self, lp: LayerPlan):
        N = self.N

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            if lp.scan_levels == 0:  # one value machine per group: the items arrived just now
                items = self._value_items(mem["inbox"], lp)
                carry = np.zeros(items.shape[:3] + (lp.value_words + 1,), dtype=np.int64)
            else:
                items, carry = self._value_items(mem["v.items"], lp), self._carry(mem, lp)
            start, pay = self._payload(items, lp)
            # the running sum of key payloads since the last run start (entering with the carry)
            csum = np.cumsum(pay, axis=-2)
            seg = np.maximum.accumulate(np.where(start, np.arange(lp.value_per), -1), axis=-1)  # last start <= j
            idx = np.broadcast_to(np.maximum(seg - 1, 0)[..., None], csum.shape)
            before = np.where(seg[..., None] >= 1, np.take_along_axis(csum, idx, axis=-2), 0)
            run = csum - before + np.where(seg[..., None] < 0, carry[..., None, :], 0)
            query = items[..., 1] == 2
            tok = np.where(query, items[..., 2] - N, 0)
            tau = np.arange(lp.pairs)[:, None, None]
            dest = np.where(query, self.worker(lp, tok, tau), -1)
            slot = self.worker_slot(lp, tok, tau) * (lp.value_words + 1)
            ob = _Outbox(B, self.P)
            ob.add(self._value_rows(lp), dest[..., None], slot[..., None] + np.arange(lp.value_words + 1),
                   twos(run, self.p))
            return Step(self.token_fields(mem), send=ob.send())

        return step

    # reduce: the workers' tree, then worker 0 to the token machine ---------------------------------------
    def _reduce(self, lp: LayerPlan, lev: int):
        """Round ``reduce-lev`` (lev >= 1: the workers' tree) or ``reduce-top`` (lev = 0)."""
        N, p = self.N, self.p

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            G = lp.workers
            keep = self.token_fields(mem)
            tree = self._tree(lp)  # [N, G]
            inbox = mem["inbox"][:, tree]  # [B, N, G, slots]
            first = lev == 1 or (lev == 0 and lp.tree_levels == 0)
            if first:  # the workers' own pairs
                dvp = lp.value_words + 1
                res = signed(inbox[..., :lp.per_worker * dvp].reshape(B, N, G, lp.per_worker, dvp), p)
                part = np.zeros((B, N, G, lp.partial), dtype=np.int64)
                off = 0
                for h in lp.heads:
                    for g in range(G):
                        lo, hi = g * lp.per_worker, min(lp.pairs, (g + 1) * lp.per_worker)
                        t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                        if t0 < t1:
                            r = res[:, :, g, h.pair0 + t0 - lo:h.pair0 + t1 - lo].sum(axis=2)
                            part[:, :, g, off:off + h.value_words] = r[..., :h.value_words]
                            part[:, :, g, off + h.value_words] = r[..., lp.value_words]
                    off += h.value_words + 1
            else:
                part = signed(inbox[..., :lp.tree_fan * lp.partial].reshape(B, N, G, lp.tree_fan, lp.partial), p).sum(3)
            ob = _Outbox(B, self.P)
            if lev == 0:  # worker 0 sends its token's sums to the token machine
                ob.add(tree[:, 0], self.token_machine(self.i)[None, :, None],
                       (self.i % self.k)[None, :, None] * lp.partial + np.arange(lp.partial), twos(part[:, :, 0], p))
            else:
                lead, dest, slot = up_route(G, lp.tree_fan, lev)
                d = np.where(lead[None, :], tree[:, np.maximum(dest, 0)], -1)  # [N, G]
                ob.add(tree, d[None, ..., None], (slot * lp.partial)[None, None, :, None] + np.arange(lp.partial),
                       twos(part, p))
            return Step(keep, send=ob.send())

        return step

    # the protocol ----------------------------------------------------------------------------------
    def protocol(self) -> tuple[Protocol, list[int]]:
        T, pl = self.T, self.pl

        def init(x: np.ndarray) -> Memory:
            return self.encode_state(T.program.init(x))

        rounds, ends = self.rounds()
        last = pl.layers[-1] if pl.layers else None

        def output(mem: Memory) -> np.ndarray:
            return np.asarray(T.program.readout(self.advance(mem, last, T.layers)), dtype=np.int64)

        params = {"transformer": T.name, "eps": pl.eps, "eps_prime": pl.eps_prime, "width": pl.width, "fan": pl.fan,
                  "tokens_per_machine": pl.tok_per}
        return Protocol(f"anna-mpc({T.name})", T.n, pl.word_bits, pl.memory, init, tuple(rounds), output, params,
                        machines=pl.machines), ends


def work_words(sim: ANNASimulation) -> int:
    """Words of the runtime's largest per-round array for one input: P machines × the largest inbox
    (what a run allocates, per input of a batch, in the round that moves the most)."""
    return sim.protocol.n_machines * max((r.slots for r in sim.protocol.rounds), default=1)


def compile_anna(T: ANNATransformer, eps_prime: float, eps: float | None = None, *, memory: int | None = None,
                 fmt: FixedPoint | None = None) -> ANNASimulation:
    """Thm 4.2: the MPC protocol simulating ``T`` (Alg. 1 with its seeds) with local memory
    s = O(N^{ε′}) (see the module docstring); ``fmt``: the head outputs' semantics (None: exact)."""
    fmt = check_fmt(fmt)
    pl = plan(T, eps_prime, eps, memory)
    b = _Builder(T, pl, fmt)
    protocol, ends = b.protocol()
    return ANNASimulation(T, pl, fmt, protocol, tuple(ends), b.token_sums)
