"""P2 Thm 4.2 as a compiler: an L-layer ANNA-transformer, as Algorithm 1 runs it, becomes an MPC
protocol with local memory s = O(N^{ε′}), O(L/(ε′ − ε)) rounds and O(N^{1+ε−ε′+3/c²}) machines
(docs/mpc.md, "Thm 4.2: the MPC simulation of ANNA"; P2's proof, App. C, is not available).

Input: an :class:`~exactformer.verify.mpc.anna_program.ANNATransformer` T (N tokens, heads that are
Alg. 1 with ℓ tables of z hash functions and their seeds, or exact match) and ε′ > ε, where ε is
the exponent of T's width W (words per token, P2's mH = O(N^ε); by default ε = log_N W). The
protocol runs on the project's MPC runtime (:mod:`~exactformer.verify.mpc.protocol_run`), which
checks Def. 2.3 in every round: no machine sends, receives or holds more than s words.

Machines: token i on machine i (the runtime's convention, docs/mpc.md "Machines and layout"),
then G workers per token, the sort groups and the value groups, all from machine N on (a machine
plays several parts; the memory budget below keeps their sum within s). Per layer with heads:

1. **bcast** (L_b rounds, G >= 1): the token applies the previous layer's ``post`` and this layer's
   ``pre``, computes every head's query, key and value (the bundle, U_b words) and sends it down a
   tree of fan-out F_b to its G workers. (G = 0 when the token's own pairs fit its memory.)
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
8. **reduce** (L_b rounds, G >= 1): workers add their pairs' results per head and send them up the
   tree; the token holds Σ_t S_t[g_t(q_i)] and Σ_t C_t[g_t(q_i)] for every head: Alg. 1's exact
   (num, den), from which it computes the head output and ``post`` locally.

Words are p-bit (Def. 2.3: an element of Z_{2^p}); values and sums travel in two's complement, exact
because |num| <= ℓ·N·2^value_bits < 2^{p−1} (p is chosen so). Fan-ins: F = ⌈N^{ε′−ε}⌉ widths per
machine and s = 8·F·W; then F_b, F_v >= 2F, and every tree has depth O(1/(ε′ − ε)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np

from exactformer.constructions.mpc.library import down_route, levels, up_route
from exactformer.constructions.mpc.program import HeadOut, State
from exactformer.constructions.mpc.protocol import Memory, Protocol, Round, Send, Step, signed, twos
from exactformer.constructions.mpc.sorting import ColumnsortPlan, columnsort_plan
from exactformer.precision import FixedPoint
from exactformer.verify.attention.ema import _weights, check_fmt
from exactformer.precision._xp import NP
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
    """The rounds of one layer with heads (see the module docstring for the phases)."""

    index: int
    heads: tuple[HeadPlan, ...]
    pairs: int  # T = Σ_h ℓ_h: one sort group per pair (head, table)
    workers: int  # G per token (0: the token hashes its own pairs)
    per_worker: int  # pairs per worker
    tree_fan: int  # F_b of the token's broadcast / reduce tree over its G workers
    tree_levels: int  # L_b (0 when G = 0)
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
    def rounds(self) -> int:
        return 2 * self.tree_levels + 1 + self.sort.rounds + 2 + 2 * self.scan_levels + 1

    @property
    def machines(self) -> int:
        """Machines besides the N token machines."""
        return max(self.workers * self.n, self.pairs * self.sort_machines, self.pairs * self.value_machines)


@dataclass(frozen=True)
class SimulationPlan:
    """Sizes of the simulation: N, ε, ε′, the width W (words per token), F = ⌈N^{ε′−ε}⌉, s, p, P,
    and one :class:`LayerPlan` per layer with heads."""

    n: int
    eps: float
    eps_prime: float
    width: int
    state_words: int
    fan: int
    memory: int
    base_memory: int  # 8·F·W; ``memory`` exceeds it where the log-depth parts need more (small W)
    word_bits: int
    layers: tuple[LayerPlan, ...]

    @property
    def machines(self) -> int:
        return self.n + max((lp.machines for lp in self.layers), default=0)

    @property
    def rounds(self) -> int:
        return sum(lp.rounds for lp in self.layers)


def _pow2_floor(x: int) -> int:
    return 1 << (max(1, int(x)).bit_length() - 1)


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _state_words(state: State, n: int) -> int:
    return sum(int(np.prod(np.shape(a)[2:], dtype=np.int64)) for a in state.values() if np.ndim(a) >= 2
               and np.shape(a)[1] == n)


def _widths(T: ANNATransformer) -> tuple[int, list[list[tuple[int, int]]]]:
    """(the largest token state in words, per layer and head (key words, value words)), from one
    run on the all-zero input: state shapes do not depend on the input."""
    x = np.zeros((1, T.n), dtype=np.int64)
    words = 0
    dims: list[list[tuple[int, int]]] = []
    for ls in ap.trace(T, x):
        words = max(words, _state_words(ls.state, T.n))
    for layer in T.program.layers:
        dims.append([(h.key_words, h.value_words) for h in layer.heads])
    return words, dims


def _point_words(lh: LSHHead | None, key_words: int, p: int) -> int:
    if lh is None:
        return key_words
    per = max(1, p // lh.point_bits)
    return -(-key_words // per)


def _code_words(lh: LSHHead | None, key_words: int, p: int) -> int:
    if lh is None:
        return key_words
    per = max(1, p // lh.lsh.symbol_bits)
    return -(-lh.lsh.hashes // per)


def _check_float(v: Any, name: str, lo: float, hi: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ANNAMPCError(f"{name}: must be a number in ({lo}, {hi}), got {v!r}") from None
    if not lo < f < hi or isinstance(v, bool):
        raise ANNAMPCError(f"{name}: must be a number in ({lo}, {hi}), got {v!r}")
    return f


def plan(T: ANNATransformer, eps_prime: float, eps: float | None = None, memory: int | None = None) -> SimulationPlan:
    """The simulation's sizes for ``T`` (see the module docstring). ``eps`` defaults to log_N W;
    ``memory`` overrides s = 8·⌈N^{ε′−ε}⌉·W (it must leave room for every part, else an error names
    the smallest)."""
    if not isinstance(T, ANNATransformer):
        raise ANNAMPCError(f"T: must be an ANNATransformer, got {type(T).__name__}")
    N = T.n
    if N < 2:
        raise ANNAMPCError(f"n: the simulation needs N >= 2 tokens, got {N}")
    state_words, dims = _widths(T)
    max_tables = max([1] + [t for li in range(T.layers) for t in T.tables(li)])
    # words: ids and ranks below 4N·ℓ, sums of ℓ·N values of value_bits bits (two's complement)
    p = max(T.program.word_bits, (4 * N).bit_length() + 1,
            T.value_bits + (N * max_tables).bit_length() + 1,
            max([1] + [h.lsh.symbol_bits for hs in T.hashing for h in hs if h is not None]))
    if p > MAX_WORD_BITS:
        raise ANNAMPCError(f"word bits: the sums need p = {p} > {MAX_WORD_BITS} bits (value_bits {T.value_bits}, "
                           f"N = {N}, ℓ <= {max_tables})")
    bundles = []
    for li, (layer, hs) in enumerate(zip(T.program.layers, T.hashing)):
        bundles.append(sum(2 * _point_words(lh, kw, p) + dv for (kw, dv), lh in zip(dims[li], hs)))
    width = max([state_words] + bundles)
    eps0 = math.log(width) / math.log(N)
    e = eps0 if eps is None else _check_float(eps, "eps", 0.0, math.inf)
    ep = _check_float(eps_prime, "eps_prime", e, e + 4)
    fan = max(2, math.ceil(N ** (ep - e) - 1e-9))
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (int, np.integer)) or memory < 1):
        raise ANNAMPCError(f"memory: must be an integer >= 1 (s, words per machine), got {memory!r}")
    heads_of = []
    for li, (layer, hs) in enumerate(zip(T.program.layers, T.hashing)):
        heads, pair0 = [], 0
        for head, lh, (kw, dv) in zip(layer.heads, hs, dims[li]):
            ell = 1 if lh is None else lh.lsh.tables
            heads.append(HeadPlan(head.name, lh, ell, _point_words(lh, kw, p), dv, _code_words(lh, kw, p), pair0))
            pair0 += ell
        heads_of.append(tuple(heads))
    base = MEMORY_FACTOR * fan * width
    s = base if memory is None else int(memory)
    while True:
        try:
            layers = tuple(_layer_plan(li, heads, bundles[li], state_words, N, s)
                           for li, heads in enumerate(heads_of) if heads)
            break
        except _NoRoom as err:
            if memory is not None or s > 1 << 40:
                raise ANNAMPCError(f"memory: {err}") from None
            s += max(1, s // 4)
    return SimulationPlan(N, e, ep, width, state_words, fan, s, base, p, layers)


class _NoRoom(Exception):
    """s words do not hold one part of a machine (the message says which)."""


def _layer_plan(li: int, heads: tuple[HeadPlan, ...], bundle: int, state_words: int, N: int, s: int) -> LayerPlan:
    """The plan of layer ``li`` with memory s: every part of a machine within s/4 (see the module
    docstring), or :class:`_NoRoom`."""
    quarter = s // 4
    pairs = sum(h.tables for h in heads)
    dv = max(h.value_words for h in heads)
    kwc = max(h.code_words for h in heads)
    partial = sum(h.value_words + 1 for h in heads)
    w_s, w_v = kwc + 1, dv + 3
    per_pair = 2 * w_s + dv + 1 + 1  # two items out, one rank and one result in
    if state_words + partial * 2 > s:
        raise _NoRoom(f"s = {s} words cannot hold a token's state ({state_words} words) and its partial sums")
    if state_words + bundle + pairs * per_pair <= s // 2:
        G, per_worker, fan_b, lev_b = 0, pairs, 2, 0
    else:
        per_worker = quarter // per_pair
        fan_b = quarter // max(bundle, partial)
        if per_worker < 1 or fan_b < 2 or state_words + fan_b * partial > s:
            raise _NoRoom(f"s = {s} words leave no room for a worker (a pair needs {per_pair} words, the tree "
                          f"{2 * max(bundle, partial)} of s/4 = {quarter})")
        G = -(-pairs // per_worker)
        per_worker = -(-pairs // G)  # spread evenly
        lev_b = levels(G + 1, fan_b)
    half = s // 2
    k = _pow2_floor(half // w_s)
    if half // w_s < 2:
        raise _NoRoom(f"s = {s} words hold fewer than 2 sort items of {w_s} words in s/2")
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
    return LayerPlan(li, heads, pairs, G, per_worker, fan_b, lev_b, bundle, partial, kwc, M_t, k,
                     columnsort_plan(M_t, k), dv, M_v, k_v, fan_v, lev_v, N)


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
        """Messages of the machines ``rows`` (distinct machine ids, any shape R): ``dest``, ``slot``,
        ``word`` broadcast to [B, *R, *m], m words per machine; ⊥ words (< 0) and destinations < 0
        send nothing. Blocks of one machine follow each other in its message list."""
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
            offsets.append(fill[rows].copy())
            fill[rows] += dest.shape[2]
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
    w, _ = _weights(NP, fmt, count)
    prod = w[..., None].astype(object) * total.astype(object)
    return HeadOut(np.clip(prod, fmt.min_raw, fmt.max_raw).astype(np.int64), fmt.scale)


def head_outs(lp: LayerPlan, sums: list[tuple[np.ndarray, np.ndarray]], fmt: FixedPoint | None) -> tuple[HeadOut, ...]:
    return tuple(ap.lsh_head_out(num, den, fmt) if h.lsh is not None else ema_head_out(num, den, fmt)
                 for h, (num, den) in zip(lp.heads, sums))


# ------------------------------------------------------------------------------------------------
# the protocol
# ------------------------------------------------------------------------------------------------


TOKEN = "t."


@dataclass
class ANNASimulation:
    """A compiled simulation: the ``protocol`` (run it with :func:`protocol_run.run`), its ``plan``,
    the transformer ``T`` and the semantics ``fmt``; ``layer_ends[j]`` is the round after which
    the tokens hold the sums of the j-th layer with heads (:meth:`sums`)."""

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


class _Builder:
    def __init__(self, T: ANNATransformer, pl: SimulationPlan, fmt: FixedPoint | None):
        self.T, self.pl, self.fmt = T, pl, fmt
        self.N, self.P, self.p = pl.n, pl.machines, pl.word_bits

    # ---- the tokens' state -----------------------------------------------------------------------
    def encode_state(self, state: State) -> Memory:
        N, P = self.N, self.P
        mem = {}
        for k, a in state.items():
            a = np.asarray(a)
            if a.dtype.kind not in "iu" or a.ndim not in (2, 3) or a.shape[1] != N:
                raise ANNAMPCError(f"state field {k!r}: must be an int array [B, {N}] or [B, {N}, w], got {a.dtype} "
                                   f"{list(a.shape)}")
            if a.size and (a.min() < -1 or a.max() >= 1 << self.p):
                raise ANNAMPCError(f"state field {k!r}: words in [{a.min()}, {a.max()}] are not p = {self.p} bit "
                                   "words (or ⊥ = -1)")
            out = np.full((a.shape[0], P) + a.shape[2:], -1, dtype=np.int64)
            out[:, :N] = a
            mem[TOKEN + k] = out
        return mem

    def decode_state(self, mem: Memory) -> State:
        return {k[len(TOKEN):]: v[:, :self.N] for k, v in mem.items() if k.startswith(TOKEN)}

    def token_fields(self, mem: Memory) -> Memory:
        return {k: v for k, v in mem.items() if k.startswith(TOKEN)}

    # ---- machines ---------------------------------------------------------------------------------
    def worker(self, lp: LayerPlan, i: np.ndarray, g: np.ndarray) -> np.ndarray:
        return i if lp.workers == 0 else self.N + i * lp.workers + g

    def tree_machine(self, lp: LayerPlan, i: np.ndarray, node: np.ndarray) -> np.ndarray:
        """Machine of node ``node`` of token i's tree (node 0: the token, node g + 1: worker g)."""
        return np.where(node == 0, i, self.N + i * lp.workers + node - 1)

    def received(self, lp: LayerPlan, j: int) -> np.ndarray:
        """[G + 1] bool: the tree nodes that receive the bundle in broadcast round j (0-based)."""
        lead, dest = down_route(lp.workers + 1, lp.tree_fan, lp.tree_levels - j)
        got = np.zeros(lp.workers + 1, dtype=bool)
        got[dest[lead]] = True
        return got

    def take_bundles(self, mem: Memory, lp: LayerPlan, j: int) -> np.ndarray:
        """"w.bundle" [B, P, U_b] with the bundles received in broadcast round j stored."""
        i = np.arange(self.N)[:, None]
        nodes = np.flatnonzero(self.received(lp, j))[None, :]
        rows = self.tree_machine(lp, i, nodes).reshape(-1)
        out = mem["w.bundle"].copy()
        out[:, rows] = mem["inbox"][:, rows, :lp.bundle]
        return out

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
                q = np.where(q < 0, -1, q)
                k = np.where(k < 0, -1, k)
                if max(q.max(initial=0), k.max(initial=0)) >= 1 << self.p:
                    raise ANNAMPCError(f"head {head.name!r}: key words beyond p = {self.p} bits")
            else:
                q, k = _pack_points(q, h.lsh, self.p, h.point_words), _pack_points(k, h.lsh, self.p, h.point_words)
            parts += [q, k, twos(v, self.p)]
        return np.concatenate(parts, axis=-1)

    def head_parts(self, lp: LayerPlan, bundle: np.ndarray, h: HeadPlan) -> tuple[np.ndarray, ...]:
        """(queries, keys, values) of head h from bundles [..., U_b] (⊥ where not received)."""
        off = 0
        for x in lp.heads:
            if x is h:
                break
            off += 2 * x.point_words + x.value_words
        q = bundle[..., off:off + h.point_words]
        k = bundle[..., off + h.point_words:off + 2 * h.point_words]
        v = bundle[..., off + 2 * h.point_words:off + 2 * h.point_words + h.value_words]
        return q, k, v

    # ---- token sums ---------------------------------------------------------------------------------
    def token_sums(self, mem: Memory, lp: LayerPlan) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every head's (num, den) at the token machines, from their inbox after the layer's last round."""
        p, N = self.p, self.N
        inbox = mem["inbox"][:, :N]
        B = inbox.shape[0]
        out = []
        if lp.workers == 0:  # results per pair: (S_t, C_t), dv + 1 words each
            res = signed(inbox[..., :lp.pairs * (lp.value_words + 1)].reshape(B, N, lp.pairs, lp.value_words + 1), p)
            for h in lp.heads:
                r = res[:, :, h.pair0:h.pair0 + h.tables].sum(axis=2)
                out.append((r[..., :h.value_words], r[..., lp.value_words]))
            return out
        parts = signed(inbox[..., :lp.tree_fan * lp.partial].reshape(B, N, lp.tree_fan, lp.partial), p).sum(axis=2)
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
            for j in range(lp.tree_levels):
                out.append(Round(f"L{L}.bcast-{j + 1}", self._bcast(lp, prev, j), sends=lp.tree_fan - 1,
                                 slots=lp.bundle))
        out.append(Round(f"L{L}.codes", self._codes(lp, prev), sends=2 * lp.per_worker,
                         slots=lp.sort_per * lp.item_words))
        for j, perm in enumerate(lp.sort.perms):
            out.append(Round(f"L{L}.sort-{j + 1}", self._sort(lp, perm), sends=lp.sort_per,
                             slots=lp.sort_per * lp.item_words))
        out.append(Round(f"L{L}.ranks", self._ranks(lp), sends=lp.sort_per + 1,
                         slots=lp.per_worker + lp.code_words))
        out.append(Round(f"L{L}.values", self._values(lp), sends=lp.per_worker + lp.sort_per,
                         slots=lp.value_per * lp.value_item))
        for lev in range(1, lp.scan_levels + 1):
            out.append(Round(f"L{L}.up-{lev}", self._up(lp, lev), sends=1, slots=lp.scan_fan * lp.summary))
        for lev in range(lp.scan_levels, 0, -1):
            out.append(Round(f"L{L}.down-{lev}", self._down(lp, lev), sends=lp.scan_fan - 1,
                             slots=lp.value_words + 1))
        out.append(Round(f"L{L}.results", self._results(lp), sends=lp.value_per,
                         slots=lp.per_worker * (lp.value_words + 1)))
        for lev in range(1, lp.tree_levels + 1):
            out.append(Round(f"L{L}.reduce-{lev}", self._reduce(lp, lev), sends=1, slots=lp.tree_fan * lp.partial))
        return out

    # bcast ---------------------------------------------------------------------------------------------
    def _bcast(self, lp: LayerPlan, prev: LayerPlan | None, j: int):
        lev = lp.tree_levels - j  # the tree's level whose leaders send now

        def step(mem: Memory) -> Step:
            B = next(iter(mem.values())).shape[0]
            if j == 0:
                state = self.advance(mem, prev, lp.index)
                keep = self.encode_state(state)
                bundles = np.full((B, self.P, lp.bundle), -1, dtype=np.int64)
                bundles[:, :self.N] = self.bundle(lp, state)
            else:
                keep = self.token_fields(mem)
                bundles = self.take_bundles(mem, lp, j - 1)
            keep["w.bundle"] = bundles
            lead, dest = down_route(lp.workers + 1, lp.tree_fan, lev)  # [G + 1, F − 1]
            i = np.arange(self.N)[:, None, None]
            nodes = np.arange(lp.workers + 1)[None, :, None]
            src = self.tree_machine(lp, i, nodes)  # [N, G + 1, 1]
            tgt = np.where(lead[None], self.tree_machine(lp, i, np.maximum(dest, 0)[None]), -1)  # [N, G + 1, F − 1]
            data = bundles[:, src[..., 0]]  # [B, N, G + 1, U_b]
            ob = _Outbox(B, self.P)
            ob.add(src[..., 0], tgt[None, ..., None], np.arange(lp.bundle), data[:, :, :, None, :])
            return Step(keep, send=ob.send())

        return step

    # codes ---------------------------------------------------------------------------------------------
    def _received_bundles(self, mem: Memory, lp: LayerPlan, prev: LayerPlan | None) -> tuple[Memory, np.ndarray]:
        """(kept memory, bundles [B, P, U_b]) at the start of the codes round."""
        B = next(iter(mem.values())).shape[0]
        if lp.workers == 0:
            state = self.advance(mem, prev, lp.index)
            keep = self.encode_state(state)
            bundles = np.full((B, self.P, lp.bundle), -1, dtype=np.int64)
            bundles[:, :self.N] = self.bundle(lp, state)
            return keep, bundles
        bundles = self.take_bundles(mem, lp, lp.tree_levels - 1)
        bundles[:, :self.N] = -1  # the tokens hash nothing: only workers keep a bundle
        return self.token_fields(mem), bundles

    def _codes(self, lp: LayerPlan, prev: LayerPlan | None):
        N, p = self.N, self.p

        def step(mem: Memory) -> Step:
            keep, bundles = self._received_bundles(mem, lp, prev)
            B = bundles.shape[0]
            keep["w.bundle"] = bundles
            ob = _Outbox(B, self.P)
            i = np.arange(N)
            for g in range(max(1, lp.workers)):
                lo, hi = g * lp.per_worker, min(lp.pairs, (g + 1) * lp.per_worker)
                if lo >= hi:
                    continue
                wm = self.worker(lp, i, g)  # [N]
                bun = bundles[:, wm]  # [B, N, U_b]
                for h in lp.heads:
                    t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                    if t0 >= t1:
                        continue
                    q, k, _ = self.head_parts(lp, bun, h)
                    if h.lsh is None:
                        cq, ck = q[:, :, None, :], k[:, :, None, :]  # [B, N, 1, kw]; ⊥ rows ask nothing
                        cq = np.where((cq >= 0).all(-1, keepdims=True), cq, -1)
                        ck = np.where((ck >= 0).all(-1, keepdims=True), ck, -1)
                    else:
                        dim = h.lsh.lsh.dim
                        cq, ck = (h.lsh.lsh.codes(_unpack_points(a, h.lsh, p, dim).reshape(B * N, dim), t0, t1, p)
                                  .reshape(B, N, t1 - t0, -1) for a in (q, k))
                    for kind, code in ((0, ck), (1, cq)):
                        pad = np.zeros(code.shape[:3] + (lp.code_words - code.shape[3],), dtype=np.int64)
                        code = np.concatenate([code, np.where(code[..., :1] < 0, -1, pad)], axis=-1)
                        origin = kind * N + i  # [N]
                        tau = h.pair0 + np.arange(t0, t1)  # [T]
                        dest = N + tau[None, :] * lp.sort_machines + (origin // lp.sort_per)[:, None]
                        base = (origin % lp.sort_per)[:, None] * lp.item_words
                        item = np.concatenate([code, np.broadcast_to(np.where(code[..., :1] < 0, -1, origin[None, :, None, None]),
                                                                     code.shape[:3] + (1,))], axis=-1)
                        w = np.arange(lp.item_words)
                        ob.add(wm, dest[None, :, :, None], base[None, :, :, None] + w, item)
            return Step(keep, send=ob.send())

        return step

    # sort ----------------------------------------------------------------------------------------------
    def _sorted_items(self, mem: Memory, lp: LayerPlan) -> np.ndarray:
        """The sort machines' items [B, groups, M_t, k, w_s], each machine's sorted (empty last)."""
        k, w, M = lp.sort_per, lp.item_words, lp.sort_machines
        B = mem["inbox"].shape[0]
        lo = self.N
        items = mem["inbox"][:, lo:lo + lp.pairs * M, :k * w].reshape(B, lp.pairs, M, k, w)
        flat = items.reshape(-1, k, w)
        empty = flat[..., 0] < 0
        bits = [int(flat[..., c].max(initial=0)).bit_length() for c in range(w)]
        if sum(bits) <= 62:  # one int64 per item, in the order of the words; empty items last
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
            ob = _Outbox(B, self.P)
            M, k, w = lp.sort_machines, lp.sort_per, lp.item_words
            tau = np.arange(lp.pairs)[:, None, None]
            rows = self.N + tau[..., 0] * M + np.arange(M)[None, :]  # [T, M]
            dst = perm.reshape(1, M, k)
            dest = self.N + tau * M + dst // k  # [T, M, k]
            slot = (dst % k) * w
            ob.add(rows, dest[None, ..., None], slot[None, ..., None] + np.arange(w), items)
            return Step(keep, send=ob.send())

        return step

    # ranks ---------------------------------------------------------------------------------------------
    def _ranks(self, lp: LayerPlan):
        N = self.N

        def step(mem: Memory) -> Step:
            items = self._sorted_items(mem, lp)  # [B, T, M, k, w]
            B = items.shape[0]
            M, k, w = lp.sort_machines, lp.sort_per, lp.item_words
            keep = {kk: v for kk, v in mem.items() if kk != "inbox"}
            s_items = np.full((B, self.P, k * w), -1, dtype=np.int64)
            s_items[:, N:N + lp.pairs * M] = items.reshape(B, lp.pairs * M, k * w)
            keep["s.items"] = s_items
            ob = _Outbox(B, self.P)
            tau = np.arange(lp.pairs)[:, None, None]
            mu = np.arange(M)[None, :, None]
            rank = mu * k + np.arange(k)[None, None, :]  # [1, M, k]
            origin = items[..., -1]  # [B, T, M, k]
            is_key = (origin >= 0) & (origin < N)
            tok = np.where(is_key, origin, 0)
            dest = np.where(is_key, self.worker(lp, tok, tau // lp.per_worker), -1)
            rows = N + tau[..., 0] * M + mu[..., 0]  # [T, M]
            ob.add(rows, dest, tau % lp.per_worker, rank)
            # each sort machine's last code to the next machine of its group
            last = items[:, :, :-1, -1, :lp.code_words]  # [B, T, M − 1, kw]
            if M > 1:
                nxt = N + tau[..., 0] * M + np.arange(1, M)[None, :]  # [T, M − 1]
                ob.add(nxt - 1, nxt[None, ..., None], lp.per_worker + np.arange(lp.code_words), last)
            return Step(keep, send=ob.send())

        return step

    # values --------------------------------------------------------------------------------------------
    def _values(self, lp: LayerPlan):
        N, p = self.N, self.p

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, k, w, kw = lp.sort_machines, lp.sort_per, lp.item_words, lp.code_words
            keep = self.token_fields(mem)
            ob = _Outbox(B, self.P)
            # sort machines: run starts, kinds and origins to the value layout
            items = mem["s.items"][:, N:N + lp.pairs * M].reshape(B, lp.pairs, M, k, w)
            codes = items[..., :kw]
            prev = np.concatenate([np.full(codes.shape[:3] + (1, kw), -2, dtype=np.int64), codes[:, :, :, :-1]], axis=3)
            if M > 1:
                bound = mem["inbox"][:, N:N + lp.pairs * M, lp.per_worker:lp.per_worker + kw].reshape(B, lp.pairs, M, kw)
                bound = np.where(np.arange(M)[None, None, :, None] == 0, -2, bound)
                prev[:, :, :, 0] = bound
            origin = items[..., -1]
            real = origin >= 0
            start = (codes != prev).any(axis=-1)
            kind = np.where(origin < N, 1, 2)
            tau = np.arange(lp.pairs)[:, None, None]
            rank = np.arange(M)[None, :, None] * k + np.arange(k)[None, None, :]
            vm = N + tau * lp.value_machines + rank // lp.value_per
            vslot = (rank % lp.value_per) * lp.value_item
            rows = N + tau[..., 0] * M + np.arange(M)[None, :]
            data = np.stack([start.astype(np.int64), kind, origin], axis=-1)
            ob.add(rows, np.where(real, vm, -1)[..., None], vslot[None, ..., None] + np.arange(3), data)
            # workers: the value of each key item to its rank
            i = np.arange(N)
            for g in range(max(1, lp.workers)):
                lo, hi = g * lp.per_worker, min(lp.pairs, (g + 1) * lp.per_worker)
                if lo >= hi:
                    continue
                wm = self.worker(lp, i, g)
                bun = mem["w.bundle"][:, wm]
                ranks = mem["inbox"][:, wm, :hi - lo]  # [B, N, pairs of g]
                for h in lp.heads:
                    t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                    if t0 >= t1:
                        continue
                    _, _, v = self.head_parts(lp, bun, h)  # [B, N, dv_h]
                    tau_h = h.pair0 + np.arange(t0, t1)
                    r = ranks[:, :, tau_h - lo]  # [B, N, T]
                    dest = np.where(r >= 0, N + tau_h[None, None, :] * lp.value_machines + np.maximum(r, 0) // lp.value_per, -1)
                    slot = (np.maximum(r, 0) % lp.value_per) * lp.value_item + 3
                    ob.add(wm, dest[..., None], slot[..., None] + np.arange(h.value_words),
                           np.broadcast_to(v[:, :, None, :], r.shape + (h.value_words,)))
            return Step(keep, send=ob.send())

        return step

    # scan ----------------------------------------------------------------------------------------------
    def _value_items(self, mem: Memory, lp: LayerPlan) -> np.ndarray:
        M, k, w = lp.value_machines, lp.value_per, lp.value_item
        B = mem["v.items"].shape[0]
        return mem["v.items"][:, self.N:self.N + lp.pairs * M, :k * w].reshape(B, lp.pairs, M, k, w)

    def _payload(self, items: np.ndarray, lp: LayerPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(run start [.., k] bool, key [.., k] bool, payload [.., k, dv + 1] signed: (value, 1) of keys)."""
        start = items[..., 0] == 1
        key = items[..., 1] == 1
        val = signed(items[..., 3:3 + lp.value_words], self.p)
        pay = np.concatenate([val, np.ones(val.shape[:-1] + (1,), dtype=np.int64)], axis=-1)
        return start, key, np.where(key[..., None], pay, 0)

    @staticmethod
    def _fold(carry: np.ndarray, f: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Segmented fold: X ← t if the block holds a run start, else X + t."""
        return np.where(f[..., None], t, carry + t)

    def _local_summary(self, items: np.ndarray, lp: LayerPlan) -> tuple[np.ndarray, np.ndarray]:
        start, _, pay = self._payload(items, lp)
        f = start.any(axis=-1)
        after = np.cumsum(start[..., ::-1], axis=-1)[..., ::-1]  # run starts at or after each item
        last = (after - start) == 0  # items at or after the machine's last run start (all if none)
        return f, np.where(last[..., None], pay, 0).sum(axis=-2)

    def _summary_words(self, f: np.ndarray, t: np.ndarray) -> np.ndarray:
        return np.concatenate([f[..., None].astype(np.int64), twos(t, self.p)], axis=-1)

    def _up(self, lp: LayerPlan, lev: int):
        N = self.N

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, F, U = lp.value_machines, lp.scan_fan, lp.summary
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            if lev == 1:
                items = np.full((B, self.P, lp.value_per * lp.value_item), -1, dtype=np.int64)
                items[:, N:N + lp.pairs * M] = mem["inbox"][:, N:N + lp.pairs * M, :lp.value_per * lp.value_item]
                keep["v.items"] = items
                f, t = self._local_summary(self._value_items(keep, lp), lp)  # [B, T, M], [B, T, M, dv + 1]
            else:
                kids = mem["inbox"][:, N:N + lp.pairs * M, :F * U].reshape(B, lp.pairs, M, F, U)
                saved = np.full((B, self.P, F * U), -1, dtype=np.int64)
                saved[:, N:N + lp.pairs * M] = kids.reshape(B, lp.pairs * M, F * U)
                keep[f"v.sum{lev - 1}"] = saved
                f, t = self._combine(kids, lp)
            lead, dest, slot = up_route(M, F, lev)
            tau = np.arange(lp.pairs)[:, None]
            src = N + tau * M + np.arange(M)[None, :]
            d = np.where(lead[None, :], N + tau * M + dest[None, :], -1)
            ob = _Outbox(B, self.P)
            ob.add(src, d[None, ..., None], (slot * U)[None, None, :, None] + np.arange(U),
                   self._summary_words(f, t))
            return Step(keep, send=ob.send())

        return step

    def _combine(self, kids: np.ndarray, lp: LayerPlan) -> tuple[np.ndarray, np.ndarray]:
        """A block's summary from its children's summary words [..., F, U] (⊥: no child)."""
        f = kids[..., 0] == 1
        t = signed(kids[..., 1:], self.p)
        acc_f = np.zeros(f.shape[:-1], bool)
        acc_t = np.zeros(t.shape[:-2] + t.shape[-1:], dtype=np.int64)
        for c in range(kids.shape[-2]):
            acc_t = self._fold(acc_t, f[..., c], t[..., c, :])
            acc_f |= f[..., c]
        return acc_f, acc_t

    def _down(self, lp: LayerPlan, lev: int):
        N = self.N

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M, F, U = lp.value_machines, lp.scan_fan, lp.summary
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            rows = slice(N, N + lp.pairs * M)
            if lev == lp.scan_levels:  # the top: the last up round's summaries arrived just now
                kids = mem["inbox"][:, rows, :F * U].reshape(B, lp.pairs, M, F, U)
                carry = np.zeros((B, lp.pairs, M, lp.value_words + 1), dtype=np.int64)
            else:
                kids = mem[f"v.sum{lev}"][:, rows].reshape(B, lp.pairs, M, F, U)
                del keep[f"v.sum{lev}"]
                carry = self._carry(mem, lp)
            f = kids[..., 0] == 1
            t = signed(kids[..., 1:], self.p)
            carries = [carry]
            for c in range(F - 1):
                carries.append(self._fold(carries[-1], f[..., c], t[..., c, :]))
            out = np.stack(carries[1:], axis=-2)  # [B, T, M, F − 1, dv + 1]: child u = 1 .. F − 1
            store = np.full((B, self.P, lp.value_words + 1), -1, dtype=np.int64)
            store[:, rows] = twos(carry, self.p).reshape(B, lp.pairs * M, -1)
            keep["v.carry"] = store
            lead, dest = down_route(M, F, lev)  # [M, F − 1]
            tau = np.arange(lp.pairs)[:, None, None]
            src = N + tau[..., 0] * M + np.arange(M)[None, :]
            d = np.where(lead[None], N + tau * M + np.maximum(dest, 0)[None], -1)
            ob = _Outbox(B, self.P)
            ob.add(src, d[None, ..., None], np.arange(lp.value_words + 1), twos(out, self.p))
            return Step(keep, send=ob.send())

        return step

    def _carry(self, mem: Memory, lp: LayerPlan) -> np.ndarray:
        """Each value machine's carry-in [B, T, M, dv + 1]: received in the last down round, else kept."""
        M = lp.value_machines
        rows = slice(self.N, self.N + lp.pairs * M)
        B = mem["inbox"].shape[0]
        got = mem["inbox"][:, rows, :lp.value_words + 1]
        has = (got >= 0).all(axis=-1, keepdims=True)
        kept = mem["v.carry"][:, rows] if "v.carry" in mem else np.zeros_like(got)
        return signed(np.where(has, got, kept), self.p).reshape(B, lp.pairs, M, -1)

    # results -------------------------------------------------------------------------------------------
    def _results(self, lp: LayerPlan):
        N = self.N

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            M = lp.value_machines
            if lp.scan_levels == 0:  # one value machine per group: the items arrived just now
                items = mem["inbox"][:, N:N + lp.pairs * M, :lp.value_per * lp.value_item].reshape(
                    B, lp.pairs, M, lp.value_per, lp.value_item)
                carry = np.zeros((B, lp.pairs, M, lp.value_words + 1), dtype=np.int64)
            else:
                items = self._value_items(mem, lp)
                carry = self._carry(mem, lp)
            start, key, pay = self._payload(items, lp)
            # the running sum of key payloads since the last run start, entering with the carry
            csum = np.cumsum(pay, axis=-2)
            seg = np.maximum.accumulate(np.where(start, np.arange(lp.value_per), -1), axis=-1)  # last start <= j
            idx = np.broadcast_to(np.maximum(seg - 1, 0)[..., None], csum.shape)
            before = np.where(seg[..., None] >= 1, np.take_along_axis(csum, idx, axis=-2), 0)
            run = csum - before + np.where(seg[..., None] < 0, carry[..., None, :], 0)
            query = items[..., 1] == 2
            origin = items[..., 2]
            tok = np.where(query, origin - N, 0)
            tau = np.arange(lp.pairs)[:, None, None]
            dest = np.where(query, self.worker(lp, tok, tau // lp.per_worker), -1)
            slot = (tau % lp.per_worker) * (lp.value_words + 1)
            src = N + tau[..., 0] * M + np.arange(M)[None, :]
            keep = self.token_fields(mem)
            ob = _Outbox(B, self.P)
            ob.add(src, dest[..., None], slot[None, ..., None] + np.arange(lp.value_words + 1),
                   twos(run, self.p))
            return Step(keep, send=ob.send())

        return step

    # reduce --------------------------------------------------------------------------------------------
    def _reduce(self, lp: LayerPlan, lev: int):
        N, p = self.N, self.p

        def step(mem: Memory) -> Step:
            B = mem["inbox"].shape[0]
            G = lp.workers
            keep = self.token_fields(mem)
            i = np.arange(N)[:, None]
            machines = self.tree_machine(lp, i, np.arange(G + 1)[None, :])  # [N, G + 1]
            inbox = mem["inbox"][:, machines]  # [B, N, G + 1, slots]
            part = np.zeros((B, N, G + 1, lp.partial), dtype=np.int64)
            if lev == 1:  # the workers' own pairs
                dvp = lp.value_words + 1
                res = signed(inbox[..., :lp.per_worker * dvp].reshape(B, N, G + 1, lp.per_worker, dvp), p)
                off = 0
                for h in lp.heads:
                    for g in range(G):
                        lo, hi = g * lp.per_worker, min(lp.pairs, (g + 1) * lp.per_worker)
                        t0, t1 = max(0, lo - h.pair0), min(h.tables, hi - h.pair0)
                        if t0 < t1:
                            r = res[:, :, g + 1, h.pair0 + t0 - lo:h.pair0 + t1 - lo].sum(axis=2)
                            part[:, :, g + 1, off:off + h.value_words] = r[..., :h.value_words]
                            part[:, :, g + 1, off + h.value_words] = r[..., lp.value_words]
                    off += h.value_words + 1
            else:
                kids = signed(inbox[..., :lp.tree_fan * lp.partial].reshape(B, N, G + 1, lp.tree_fan, lp.partial), p)
                part = kids.sum(axis=3)
            lead, dest, slot = up_route(G + 1, lp.tree_fan, lev)
            sender = lead & ((np.arange(G + 1) > 0) | (lev > 1))  # the token (node 0) holds no pairs of its own
            d = np.where(sender[None, :], self.tree_machine(lp, i, dest[None, :]), -1)  # [N, G + 1]
            ob = _Outbox(B, self.P)
            ob.add(machines, d[None, ..., None], (slot * lp.partial)[None, None, :, None]
                   + np.arange(lp.partial), twos(part, p))
            return Step(keep, send=ob.send())

        return step

    # the protocol --------------------------------------------------------------------------------------
    def protocol(self) -> tuple[Protocol, list[int]]:
        T, pl = self.T, self.pl

        def init(x: np.ndarray) -> Memory:
            return self.encode_state(T.program.init(x))

        rounds, ends = self.rounds()
        last = pl.layers[-1] if pl.layers else None

        def output(mem: Memory) -> np.ndarray:
            state = self.advance(mem, last, T.layers)
            return np.asarray(T.program.readout(state), dtype=np.int64)

        params = {"transformer": T.name, "eps": pl.eps, "eps_prime": pl.eps_prime, "width": pl.width,
                  "fan": pl.fan}
        return Protocol(f"anna-mpc({T.name})", T.n, pl.word_bits, pl.memory, init, tuple(rounds), output, params,
                        machines=pl.machines), ends


def compile_anna(T: ANNATransformer, eps_prime: float, eps: float | None = None, *, memory: int | None = None,
                 fmt: FixedPoint | None = None) -> ANNASimulation:
    """Thm 4.2: the MPC protocol simulating ``T`` (Alg. 1 with its seeds) with local memory
    s = O(N^{ε′}) (see the module docstring); ``fmt``: the head outputs' semantics (None: exact)."""
    fmt = check_fmt(fmt)
    pl = plan(T, eps_prime, eps, memory)
    b = _Builder(T, pl, fmt)
    protocol, ends = b.protocol()
    return ANNASimulation(T, pl, fmt, protocol, tuple(ends), b.token_sums)
