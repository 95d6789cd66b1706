"""Low-rank attention transformers (P2 Def. 4.3) and the MPC protocol that simulates them: the first
half of P2 Thm 4.4's proof; Thm 4.1's compiler (:func:`~exactformer.constructions.mpc.compile.compile_protocol`)
is the second half (docs/mpc.md, "Thm 4.4: ANNA simulates low-rank attention").

A low-rank head has feature maps Q′, K′ to Z^r (rank r) and values V in Z^m; Def. 4.3 computes
Q′(X)K′(X)ᵀV(X) by first forming the r × m matrix K′ᵀV = Σ_j K′_j ⊗ V_j and then multiplying by
Q′: the output at token i is Σ_j (Q′_i · K′_j) V_j, an exact integer vector (``fmt=None``). In a
fixed-point format of scale S (features and values raw values) its value Σ_j (q_i·k_j) v_j / S³ is
rounded once to the format's grid: raw round(num / S²) with the format's rounding, saturated
(:func:`head_out`). A :class:`LowRankTransformer` is an
:class:`~exactformer.constructions.mpc.program.EMAProgram` skeleton (init, layers of pre / heads /
post, readout; a head's ``query`` is Q′, ``key`` K′, ``value`` V) with bounds on its features and
values.

The protocol (:func:`low_rank_protocol`, P = N machines, push only) per layer with heads:

* rounds ``up-1 .. up-D``: every token sends Σ_h K′_i ⊗ V_i (U = Σ_h r_h·m_h words, two's complement)
  up a tree of fan-in B_up = max(2, ⌈N^{ε′−ε}⌉) (the library's prefix-sum routes), leaders adding
  what they receive: machine 0 ends with K′ᵀV of every head;
* rounds ``down-D′ .. down-1``: machine 0 sends the matrices down a tree of fan-out
  b = max(2, ⌊N^{(ε′−ε)/4}⌋) — P2 Thm 4.1's H = O(N^{(ε′−ε)/4}) heads once compiled;
* the next round's local step (or ψ): token i computes Q′_i (K′ᵀV) and the layer's ``post``.

Rounds ⌈log_{B_up} N⌉ + ⌈log_b N⌉ per layer = O(L/(ε′ − ε)); local memory s = W + B_up·U + U words with
W the token's width; compiled by Thm 4.1: one layer per round, 1 send head (up) or b − 1 (down), values
of 2·s_in = O(N^{ε′}) words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.mpc.library import down_route, levels, up_route
from exactformer.constructions.mpc.program import EMAProgram, Head, HeadOut, Layer, OnProgram, State
from exactformer.constructions.mpc.protocol import Memory, Protocol, ProtocolError, Round, Send, Step, bits_for, signed, twos
from exactformer.precision import FixedPoint

MAX_WORD_BITS = 62


class LowRankError(ValueError):
    """A malformed low-rank transformer or bad parameters (names the parameter and its range)."""


@dataclass(frozen=True)
class LowRankTransformer(OnProgram):
    """L layers of low-rank heads: ``program`` (a head's query = Q′ [B, n, r], key = K′ [B, n, r],
    value = V [B, n, m]); features satisfy |Q′|, |K′| < 2^``factor_bits`` and values |V| <
    2^``value_bits`` (checked when run)."""

    program: EMAProgram
    factor_bits: int
    value_bits: int

    def ranks(self, layer: int) -> tuple[int, ...]:
        return tuple(h.key_words for h in self.program.layers[layer].heads)

    def __repr__(self) -> str:
        r = sorted({h.key_words for layer in self.program.layers for h in layer.heads})
        return f"<LowRankTransformer {self.name!r}: n={self.n}, L={self.layers}, ranks {r}>"


def head_inputs(T: LowRankTransformer, head: Head, state: State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Q′ [B, n, r], K′ [B, n, r], V [B, n, m]) of one head, checked against the declared bounds."""
    q, k, v = (np.asarray(f(state)) for f in (head.query, head.key, head.value))
    B, n = q.shape[0], T.n
    for a, w, what, bits in ((q, head.key_words, "Q′", T.factor_bits), (k, head.key_words, "K′", T.factor_bits),
                             (v, head.value_words, "V", T.value_bits)):
        if a.dtype.kind not in "iu" or a.shape != (B, n, w):
            raise LowRankError(f"head {head.name!r}: {what} must be an int array [B, {n}, {w}], got {a.dtype} "
                               f"{list(a.shape)}")
        if a.size and int(np.abs(a).max()) >= 1 << bits:
            raise LowRankError(f"head {head.name!r}: {what} entries up to {int(np.abs(a).max())} break the bound "
                               f"2^{bits}")
    return q.astype(np.int64), k.astype(np.int64), v.astype(np.int64)


def head_out(q: np.ndarray, kv: np.ndarray, fmt: FixedPoint | None) -> HeadOut:
    """The head's output from Q′ [B, n, r] and K′ᵀV [B, r, m]: exact num = Q′ (K′ᵀV) (den 1), or in
    ``fmt`` the raw value round(num / S²), saturated."""
    big = q.size and kv.size and (int(np.abs(q).max()) * int(np.abs(kv).max()) * q.shape[-1]).bit_length() > 62
    num = np.einsum("bnr,brm->bnm", *((q.astype(object), kv.astype(object)) if big else (q, kv)))
    if fmt is None:
        return HeadOut(num.astype(np.int64), 1)
    d = fmt.scale * fmt.scale
    out = num // d
    if fmt.nearest:
        r = num - out * d
        out = out + ((2 * r > d) | ((2 * r == d) & (out % 2 == 1)))
    return HeadOut(np.clip(out, fmt.min_raw, fmt.max_raw).astype(np.int64), fmt.scale)


# ------------------------------------------------------------------------------------------------
# the protocol
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LowRankPlan:
    """Sizes of the simulation: ``up_fan`` = B_up, ``down_fan`` = b, ``up_levels`` = D,
    ``down_levels`` = D′ per layer with heads; ``matrix`` = U words; ``memory`` = s; ``word_bits`` = p."""

    n: int
    eps: float
    eps_prime: float
    width: int
    state_words: int
    up_fan: int
    down_fan: int
    up_levels: int
    down_levels: int
    matrix: int
    memory: int
    word_bits: int
    head_layers: tuple[int, ...]  # the program's layers with heads

    @property
    def rounds(self) -> int:
        return len(self.head_layers) * (self.up_levels + self.down_levels)


def _number(v: Any, name: str, lo: float, hi: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise LowRankError(f"{name}: must be a number in ({lo}, {hi}), got {v!r}") from None
    if isinstance(v, bool) or not lo < f < hi:
        raise LowRankError(f"{name}: must be a number in ({lo}, {hi}), got {v!r}")
    return f


def _state_words(state: State, n: int) -> int:
    return sum(int(np.prod(np.shape(a)[2:], dtype=np.int64)) for a in state.values())


def _width(T: LowRankTransformer) -> tuple[int, int, int, tuple[int, ...], int]:
    """(token state words, U = max Σ_h r_h·m_h, max Σ_h r_h, the layers with heads, the width W)."""
    if not isinstance(T, LowRankTransformer):
        raise LowRankError(f"T: must be a LowRankTransformer, got {type(T).__name__}")
    N = T.n
    if N < 2:
        raise LowRankError(f"n: the simulation needs N >= 2 tokens, got {N}")
    layers = T.program.layers
    head_layers = tuple(li for li, layer in enumerate(layers) if layer.heads)
    U = max([0] + [sum(h.key_words * h.value_words for h in layers[li].heads) for li in head_layers])
    Rq = max([0] + [sum(h.key_words for h in layers[li].heads) for li in head_layers])
    state = T.program.init(np.zeros((1, N), dtype=np.int64))
    words = _state_words(state, N)
    for layer in layers:  # state shapes do not depend on the input
        st = layer.pre(state)
        outs = tuple(HeadOut(np.zeros((1, N, h.value_words), dtype=np.int64), 1) for h in layer.heads)
        state = layer.post(st, outs)
        words = max(words, _state_words(state, N))
    return words, U, Rq, head_layers, max(words, U + Rq, 1)


def width_exponent(T: LowRankTransformer) -> float:
    """ε = log_N W, W the token's width in words (its state, or Q′ and Σ_h r_h·m_h): the default ε."""
    return math.log(_width(T)[4]) / math.log(T.n)


def plan(T: LowRankTransformer, eps_prime: float, eps: float | None = None) -> LowRankPlan:
    """The simulation's sizes (module docstring); ``eps`` defaults to :func:`width_exponent`."""
    words, U, Rq, head_layers, width = _width(T)
    N = T.n
    e = math.log(width) / math.log(N) if eps is None else _number(eps, "eps", 0.0, math.inf)
    ep = _number(eps_prime, "eps_prime", e, e + 4)
    up_fan = max(2, math.ceil(N ** (ep - e) - 1e-9))
    down_fan = max(2, math.floor(N ** ((ep - e) / 4) + 1e-9))
    p = max(T.program.word_bits, T.factor_bits + T.value_bits + N.bit_length() + 2)
    if p > MAX_WORD_BITS:
        raise LowRankError(f"word bits: K′ᵀV needs p = {p} > {MAX_WORD_BITS} bits (factor_bits {T.factor_bits}, "
                           f"value_bits {T.value_bits}, N = {N})")
    s = words + Rq + U + up_fan * U
    return LowRankPlan(N, e, ep, width, words, up_fan, down_fan, levels(N, up_fan), levels(N, down_fan), U, s, p,
                       head_layers)


def low_rank_protocol(T: LowRankTransformer, eps_prime: float, eps: float | None = None,
                      fmt: FixedPoint | None = None) -> tuple[Protocol, LowRankPlan]:
    """The MPC protocol simulating ``T`` (module docstring) and its plan; ``fmt``: the heads'
    semantics (None: exact)."""
    pl = plan(T, eps_prime, eps)
    N, p, U = pl.n, pl.word_bits, pl.matrix
    layers = T.program.layers

    def encode(state: State) -> Memory:
        mem = {}
        for k, a in state.items():
            a = np.asarray(a)
            if a.dtype.kind not in "iu" or a.ndim not in (2, 3) or a.shape[1] != N:
                raise LowRankError(f"state field {k!r}: must be an int array [B, {N}] or [B, {N}, w]")
            if a.size and (a.min() < -1 or a.max() >= 1 << p):
                raise LowRankError(f"state field {k!r}: words in [{a.min()}, {a.max()}] are not {p}-bit words (or ⊥)")
            mem["t." + k] = a.astype(np.int64)
        return mem

    def decode(mem: Memory) -> State:
        return {k[2:]: v for k, v in mem.items() if k.startswith("t.")}

    def matrices(li: int, words: np.ndarray) -> list[np.ndarray]:
        """The heads' K′ᵀV [B, N, r, m] from U words per machine."""
        out, off = [], 0
        for h in layers[li].heads:
            size = h.key_words * h.value_words
            out.append(signed(words[..., off:off + size], p).reshape(words.shape[:2] + (h.key_words, h.value_words)))
            off += size
        return out

    def advance(mem: Memory, done: int | None, upto: int) -> State:
        """The state before layer ``upto``: ``post`` of layer ``done`` (its K′ᵀV received or kept)
        and of the layers without heads in between."""
        state = decode(mem)
        start = 0
        if done is not None:
            got = mem["inbox"][..., :U]
            M = np.where((got >= 0).any(axis=-1, keepdims=True), got, mem["lr.M"])
            L = layers[done]
            st = L.pre(state)
            q = signed(mem["lr.q"], p)
            outs, off = [], 0
            for h, kv in zip(L.heads, matrices(done, M)):
                outs.append(head_out(q[..., off:off + h.key_words], kv[:, 0], fmt))
                off += h.key_words
            state = L.post(st, tuple(outs))
            start = done + 1
        for li in range(start, upto):
            state = layers[li].post(layers[li].pre(state), ())
        return state

    def up(li: int, prev: int | None, lev: int):
        lead, dest, slot = up_route(N, pl.up_fan, lev)

        def step(mem: Memory) -> Step:
            if lev == 1:
                state = advance(mem, prev, li)
                keep = encode(state)
                st = layers[li].pre(state)
                qs, cs = [], []
                for h in layers[li].heads:
                    q, k, v = head_inputs(T, h, st)
                    qs.append(q)
                    cs.append(np.einsum("bnr,bnm->bnrm", k, v).reshape(q.shape[:2] + (-1,)))
                keep["lr.q"] = twos(np.concatenate(qs, axis=-1), p)
                part = np.concatenate(cs, axis=-1)
            else:
                keep = {k: v for k, v in mem.items() if k != "inbox"}
                B = mem["inbox"].shape[0]
                part = signed(mem["inbox"][..., :pl.up_fan * U].reshape(B, N, pl.up_fan, U), p).sum(axis=2)
            words = np.where(lead[None, :, None], twos(part, p), 0)
            B = words.shape[0]
            d = np.broadcast_to(np.where(lead, dest, -1)[None, :, None], words.shape)
            sl = np.broadcast_to((slot[:, None] * U + np.arange(U))[None], words.shape)
            return Step(keep, send=Send(d, sl, words))

        return step

    def down(li: int, lev: int):
        lead, dest = down_route(N, pl.down_fan, lev)  # [N, b − 1]

        def step(mem: Memory) -> Step:
            keep = {k: v for k, v in mem.items() if k != "inbox"}
            B = mem["inbox"].shape[0]
            if lev == pl.down_levels:  # machine 0 adds the top level of the up tree
                top = signed(mem["inbox"][..., :pl.up_fan * U].reshape(B, N, pl.up_fan, U), p).sum(axis=2)
                M = np.where(np.arange(N)[None, :, None] == 0, twos(top, p), -1)
            else:
                got = mem["inbox"][..., :U]
                M = np.where((got >= 0).any(axis=-1, keepdims=True), got, mem["lr.M"])
            keep["lr.M"] = M
            kids = pl.down_fan - 1
            d = np.where(lead, dest, -1)[None, :, :, None]  # [1, N, b − 1, 1]
            d = np.broadcast_to(d, (B, N, kids, U)).reshape(B, N, kids * U)
            sl = np.broadcast_to(np.arange(U), (B, N, kids, U)).reshape(B, N, kids * U)
            w = np.broadcast_to(M[:, :, None, :], (B, N, kids, U)).reshape(B, N, kids * U)
            return Step(keep, send=Send(np.where(w >= 0, d, -1), sl, np.maximum(w, 0)))

        return step

    rounds, prev = [], None
    for li in pl.head_layers:
        for lev in range(1, pl.up_levels + 1):
            rounds.append(Round(f"L{li}.up-{lev}", up(li, prev, lev), sends=1, slots=pl.up_fan * U))
        for lev in range(pl.down_levels, 0, -1):
            rounds.append(Round(f"L{li}.down-{lev}", down(li, lev), sends=pl.down_fan - 1, slots=U))
        prev = li

    def init(x: np.ndarray) -> Memory:
        return encode(T.program.init(x))

    def output(mem: Memory) -> np.ndarray:
        return np.asarray(T.program.readout(advance(mem, prev, len(layers))), dtype=np.int64)

    params = {"transformer": T.name, "eps": pl.eps, "eps_prime": pl.eps_prime, "up_fan": pl.up_fan,
              "down_fan": pl.down_fan}
    try:
        protocol = Protocol(f"low-rank-mpc({T.name})", N, p, pl.memory, init, tuple(rounds), output, params)
    except ProtocolError as e:
        raise LowRankError(str(e)) from None
    return protocol, pl


# ------------------------------------------------------------------------------------------------
# seeded low-rank transformers
# ------------------------------------------------------------------------------------------------


def random_low_rank(n: int, *, layers: int = 2, heads: int = 1, rank: int = 2, value_words: int = 2,
                    alphabet: int = 8, entry_bits: int = 3, seed: int = 0) -> LowRankTransformer:
    """A seeded low-rank transformer with given integer factors: the token's features are
    f = (x, y_0 .. y_{m−1}, 1) mod 2^(b−1) (x the input word, y the state, b = ``entry_bits``); head h
    of layer ℓ has integer matrices A_Q, A_K (r × |f|) and A_V (m × |f|) with entries in
    [−2^(b−1), 2^(b−1)): Q′ = A_Q f, K′ = A_K f, V = A_V f; post: y ← (y + Σ_h out_h) mod 2^(b−1)
    (out: the exact integer output, or raw // S in fixed point); readout: y_0."""
    for name, v, lo in (("n", n, 2), ("layers", layers, 1), ("heads", heads, 1), ("rank", rank, 1),
                        ("value_words", value_words, 1), ("alphabet", alphabet, 1), ("entry_bits", entry_bits, 2)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise LowRankError(f"{name} must be an integer >= {lo}, got {v!r}")
    rng = np.random.default_rng(seed)
    half = 1 << (entry_bits - 1)
    f_dim = value_words + 2
    mats = [[tuple(rng.integers(-half, half, size=(rows, f_dim)) for rows in (rank, rank, value_words))
             for _ in range(heads)] for _ in range(layers)]
    width = bits_for(alphabet)

    def features(st: State) -> np.ndarray:
        one = np.ones(st["x"].shape + (1,), dtype=np.int64)
        return np.concatenate([st["x"][..., None] % half, st["y"] % half, one], axis=-1)

    def lin(li: int, h: int, which: int):
        def f(st: State) -> np.ndarray:
            return features(st) @ mats[li][h][which].T
        return f

    def post(st: State, outs: tuple[HeadOut, ...]) -> State:
        y = st["y"].copy()
        for o in outs:
            y = y + o.num // np.asarray(o.den)
        return {"x": st["x"], "y": y % half}

    def init(x: np.ndarray) -> State:
        return {"x": x, "y": np.zeros(x.shape + (value_words,), dtype=np.int64)}

    layer_objs = [Layer(f"layer-{li + 1}", lambda st: st,
                        tuple(Head(f"L{li}.h{h}", lin(li, h, 0), lin(li, h, 1), lin(li, h, 2), rank, value_words, n)
                              for h in range(heads)), post) for li in range(layers)]
    params = {"n": n, "layers": layers, "heads": heads, "rank": rank, "value_words": value_words,
              "alphabet": alphabet, "entry_bits": entry_bits, "seed": seed}
    program = EMAProgram("random-low-rank", n, width, init, tuple(layer_objs), lambda st: st["y"][..., 0].copy(),
                         params)
    # |A f| <= f_dim · half · half: the features' bound
    bits = (f_dim * half * half).bit_length() + 1
    return LowRankTransformer(program, bits, bits)
