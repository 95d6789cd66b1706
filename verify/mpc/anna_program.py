"""ANNA-transformers as Algorithm 1 runs them (P2 Defs. 2.2, 3.3, Alg. 1): the input of the Thm 4.2
compiler (:mod:`exactformer.verify.mpc.anna_mpc`) and its reference executor.

An :class:`ANNATransformer` is an :class:`~exactformer.constructions.mpc.program.EMAProgram` — the
skeleton of Def. 2.2 with P2's arbitrary element-wise maps: ``init``, layers of ``pre`` / heads /
``post``, ``readout`` — in which every head is one of

* **Algorithm 1** (:class:`LSHHead`): the head's query and key maps give integer points of an LSH
  family's space, ``LSHAttention`` (verify/attention/anna.py) with its ℓ tables of z hash functions
  sampled from its seed hashes them, and query i reads Σ_t S_t[g_t(q_i)] / Σ_t C_t[g_t(q_i)] —
  the exact pair (num, den) = (Σ_j n_ij v_j, Σ_j n_ij);
* **exact match** (``None``): EMA, ANNA with r = 0 and c → ∞ (P2 Sec. 4.1), run by the EMA kernel
  as :mod:`~exactformer.verify.mpc.program_run` runs EMA programs (a query or key row holding −1
  asks / publishes nothing).

A head's output reaches ``post`` as a :class:`~exactformer.constructions.mpc.program.HeadOut`:
ideal semantics (``fmt=None``) the exact rational num/den; in a fixed-point format, EMA heads as
the EMA kernel computes them (weights round(S/c)) and Alg. 1 heads as the exact average rounded once
to the format's grid (its rounding, saturated): :func:`lsh_head_out`. Values are integers with
|v| < 2^``value_bits`` (checked), which bounds every sum the simulation carries.

An EMA program is the ANNA-transformer with every head exact-match (:func:`from_program`);
:func:`planted_transformer` builds seeded ANNA-transformers whose tokens share near and far points,
so that buckets hold several keys and queries (tests, benchmarks, the resource tables).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from exactformer.constructions.mpc.program import EMAProgram, Head, HeadOut, Layer, OnProgram, State
from exactformer.constructions.mpc.protocol import bits_for
from exactformer.precision import FixedPoint
from exactformer.verify.attention.anna import FAMILIES, LSHAttention, family as lsh_family
from exactformer.verify.attention.ema import check_fmt
from exactformer.verify.mpc import program_run


class ANNAProgramError(ValueError):
    """A malformed ANNA-transformer or one whose maps break its declarations (names the parameter)."""


@dataclass(frozen=True)
class LSHHead:
    """Algorithm 1 for one head: ``lsh`` (ℓ = ``lsh.tables``, z = ``lsh.hashes``, its seed) on points
    whose coordinates are ``point_bits``-bit integers (two's complement when ``signed``): how the
    points travel as words in the MPC simulation (bit sampling: 1 bit, unsigned; ±1 points: 2 bits,
    signed)."""

    lsh: LSHAttention
    point_bits: int = 1
    signed: bool = False

    def check_points(self, pts: np.ndarray, what: str) -> None:
        lo, hi = (-(1 << (self.point_bits - 1)), (1 << (self.point_bits - 1)) - 1) if self.signed \
            else (0, (1 << self.point_bits) - 1)
        if pts.size and (pts.min() < lo or pts.max() > hi):
            raise ANNAProgramError(f"{what}: coordinates in [{pts.min()}, {pts.max()}] are not "
                                   f"{self.point_bits}-bit {'signed' if self.signed else 'unsigned'} integers")


@dataclass(frozen=True)
class ANNATransformer(OnProgram):
    """An L-layer ANNA-transformer: ``program`` (skeleton and maps) and, per layer and head, its
    :class:`LSHHead` (Alg. 1) or None (exact match); values satisfy |v| < 2^``value_bits``."""

    program: EMAProgram
    hashing: tuple[tuple[LSHHead | None, ...], ...]
    value_bits: int

    def __post_init__(self) -> None:
        if len(self.hashing) != len(self.program.layers) or any(
                len(h) != len(layer.heads) for h, layer in zip(self.hashing, self.program.layers)):
            raise ANNAProgramError("hashing: one entry (LSHHead or None) per head of every layer")
        for layer, hs in zip(self.program.layers, self.hashing):
            for head, lh in zip(layer.heads, hs):
                if lh is not None and head.key_words != lh.lsh.dim:
                    raise ANNAProgramError(f"head {head.name!r}: key_words {head.key_words} != the LSH dimension "
                                           f"{lh.lsh.dim}")
        if not 1 <= self.value_bits <= 60:
            raise ANNAProgramError(f"value_bits must be in [1, 60], got {self.value_bits}")

    @property
    def max_heads(self) -> int:
        return max((len(layer.heads) for layer in self.program.layers), default=0)

    def tables(self, layer: int) -> tuple[int, ...]:
        """ℓ of each head of ``layer`` (1 for exact match: one table, the identity code)."""
        return tuple(1 if h is None else h.lsh.tables for h in self.hashing[layer])

    def __repr__(self) -> str:
        kinds = sorted({"ema" if h is None else f"alg1(ℓ={h.lsh.tables}, z={h.lsh.hashes})"
                        for hs in self.hashing for h in hs})
        return f"<ANNATransformer {self.name!r}: n={self.n}, L={self.layers}, H<={self.max_heads}, heads {kinds}>"


def from_program(program: EMAProgram, value_bits: int | None = None) -> ANNATransformer:
    """The EMA program as an ANNA-transformer (every head exact match). Its values are words of the
    program (or ⊥ = −1): |v| < 2^(p + 1) by default."""
    return ANNATransformer(program, tuple((None,) * len(layer.heads) for layer in program.layers),
                           program.word_bits + 1 if value_bits is None else value_bits)


# ------------------------------------------------------------------------------------------------
# head outputs
# ------------------------------------------------------------------------------------------------


def round_quotient(num: np.ndarray, den: np.ndarray, fmt: FixedPoint) -> np.ndarray:
    """Raw values round(S·num/den) [B, n, dv] in ``fmt``'s rounding (floor or nearest-even),
    saturated; 0 where den = 0 (den [B, n] > 0 elsewhere)."""
    S = fmt.scale
    d = np.maximum(den, 1)[..., None]
    big = num.size and int(np.abs(num).max()) > ((1 << 62) // max(S, 1))
    a = num.astype(object) * S if big else num * S
    q = a // d
    if fmt.nearest:
        r = a - q * d
        q = q + ((2 * r > d) | ((2 * r == d) & (q % 2 == 1)))
    q = np.where(den[..., None] > 0, q, 0)
    return np.clip(q, fmt.min_raw, fmt.max_raw).astype(np.int64)


def lsh_head_out(num: np.ndarray, den: np.ndarray, fmt: FixedPoint | None) -> HeadOut:
    """An Alg. 1 head's output from its exact sums (num [B, n, dv], den [B, n]): the exact ratio
    (ideal), or the ratio rounded once to ``fmt``'s grid."""
    return HeadOut(num, den) if fmt is None else HeadOut(round_quotient(num, den, fmt), fmt.scale)


def check_values(v: np.ndarray, value_bits: int, what: str) -> None:
    if v.size and int(np.abs(v).max()) >= 1 << value_bits:
        raise ANNAProgramError(f"{what}: values up to {int(np.abs(v).max())} break |v| < 2^{value_bits} "
                               "(the transformer's value_bits)")


def head_inputs(head: Head, lh: LSHHead | None, state: State, n: int, value_bits: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(queries [B, n, kw], keys [B, n, kw], values [B, n, dv]) of one head, checked."""
    q, k, v = (np.asarray(f(state)) for f in (head.query, head.key, head.value))
    B = q.shape[0]
    for a, w, what in ((q, head.key_words, "query"), (k, head.key_words, "key"), (v, head.value_words, "value")):
        if a.dtype.kind not in "iu" or a.shape != (B, n, w):
            raise ANNAProgramError(f"head {head.name!r}: {what} must be an int array [B, {n}, {w}], got "
                                   f"{a.dtype} {list(a.shape)}")
    if lh is not None:
        lh.check_points(q, f"head {head.name!r}: query points")
        lh.check_points(k, f"head {head.name!r}: key points")
    check_values(v, value_bits, f"head {head.name!r}")
    return q.astype(np.int64), k.astype(np.int64), v.astype(np.int64)


# ------------------------------------------------------------------------------------------------
# the reference executor: Algorithm 1 head by head, layer by layer
# ------------------------------------------------------------------------------------------------


@dataclass
class ANNALayerState:
    """The state after layer ``layer`` (0: after ``init``) and that layer's head outputs."""

    layer: int
    name: str
    state: State
    outs: tuple[HeadOut, ...] = ()


def alg1_head(lh: LSHHead, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1 on every input of a batch: (num [B, n, dv], den [B, n]) exact."""
    num = np.zeros(v.shape, dtype=np.int64)
    den = np.zeros(v.shape[:2], dtype=np.int64)
    for b in range(q.shape[0]):
        r = lh.lsh(q[b], k[b], v[b])
        num[b], den[b] = np.asarray(r.num), np.asarray(r.den)
    return num, den


def trace(T: ANNATransformer, inputs, fmt: FixedPoint | None = None) -> Iterator[ANNALayerState]:
    """The state after ``init`` (layer 0) and after every layer, Alg. 1 / EMA head by head."""
    fmt = check_fmt(fmt)
    x = program_run.check_inputs(T.program, inputs)
    n = T.n
    state = T.program.init(x)
    yield ANNALayerState(0, "init", state)
    for li, (layer, hashing) in enumerate(zip(T.program.layers, T.hashing), start=1):
        st = layer.pre(state)
        outs = []
        for head, lh in zip(layer.heads, hashing):
            q, k, v = head_inputs(head, lh, st, n, T.value_bits)
            if lh is None:
                outs.append(program_run.attend(head, st, n, fmt)[0])
            else:
                outs.append(lsh_head_out(*alg1_head(lh, q, k, v), fmt))
        state = layer.post(st, tuple(outs))
        yield ANNALayerState(li, layer.name, state, tuple(outs))


def run(T: ANNATransformer, inputs, fmt: FixedPoint | None = None) -> np.ndarray:
    """Outputs [B, n] (−1 = ⊥) of ``T`` on ``inputs`` ([B, n] or [n] words)."""
    state = None
    for ls in trace(T, inputs, fmt):
        state = ls.state
    return np.asarray(T.program.readout(state), dtype=np.int64)


# ------------------------------------------------------------------------------------------------
# planted ANNA-transformers
# ------------------------------------------------------------------------------------------------


def _flips(rng: np.random.Generator, n: int, dim: int, at_most: int) -> np.ndarray:
    """[n, dim] 0/1 masks with at most ``at_most`` ones per row (a uniform count, then uniform places)."""
    count = rng.integers(0, at_most + 1, size=n)
    places = np.argsort(rng.random((n, dim)), axis=1)[:, :at_most]
    out = np.zeros((n, dim), dtype=np.int64)
    np.put_along_axis(out, places, (np.arange(min(at_most, dim))[None, :] < count[:, None]).astype(np.int64), axis=1)
    return out


def planted_transformer(n: int, *, layers: int = 2, heads: int = 1, dim: int = 16, value_words: int = 1,
                        alphabet: int = 4, near_flips: int = 1, tables: int = 4, hashes: int = 4,
                        family: str = "bit-sampling", value_bits: int = 10, seed: int = 0) -> ANNATransformer:
    """A seeded ANNA-transformer whose tokens share near points (shapes in the docstring below).

    Inputs: n words in [0, ``alphabet``). State: x (the input) and y (``value_words`` words in
    [0, 2^(value_bits − 1))). Layer ℓ, head h: the token's symbol a = (x + y_0) mod alphabet picks a
    codeword C_{ℓ,h}[a] ∈ {0,1}^dim; the query is C[a] with at most ``near_flips`` bits flipped (a
    fixed mask per position), the key the same with another mask — so tokens of one symbol are
    near (Hamming ≤ 2·near_flips) and others are far with high probability; the value is
    (x·(h + 1) + i + ℓ + u) mod 2^(value_bits − 1), u = 0 .. value_words − 1 (i the position).
    Sphere families use the ±1 points 2C − 1. Each head is Alg. 1 with ``tables`` × ``hashes`` of
    ``family`` (seed = seed + 1000ℓ + h). post: y ← (y + Σ_h ⌊out_h⌋) mod 2^(value_bits − 1);
    readout: (x + y_0) mod 2^(value_bits − 1)."""
    if family not in FAMILIES:
        raise ANNAProgramError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    for name, v, lo in (("n", n, 1), ("layers", layers, 1), ("heads", heads, 1), ("dim", dim, 2),
                        ("value_words", value_words, 1), ("alphabet", alphabet, 1), ("near_flips", near_flips, 0),
                        ("tables", tables, 1), ("hashes", hashes, 1), ("value_bits", value_bits, 2)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ANNAProgramError(f"{name} must be an integer >= {lo}, got {v!r}")
    rng = np.random.default_rng(seed)
    sphere = FAMILIES[family].on_sphere
    mod = 1 << (value_bits - 1)
    pos = np.arange(n, dtype=np.int64)[None, :]
    code = [[rng.integers(0, 2, size=(alphabet, dim)) for _ in range(heads)] for _ in range(layers)]
    qmask = [[_flips(rng, n, dim, near_flips) for _ in range(heads)] for _ in range(layers)]
    kmask = [[_flips(rng, n, dim, near_flips) for _ in range(heads)] for _ in range(layers)]

    def init(x: np.ndarray) -> State:
        return {"x": x, "y": np.zeros(x.shape + (value_words,), dtype=np.int64)}

    def points(li: int, h: int, mask: list) -> object:
        def f(st: State) -> np.ndarray:
            a = (st["x"] + st["y"][..., 0]) % alphabet
            bits = code[li][h][a] ^ mask[li][h][None, :, :]
            return 2 * bits - 1 if sphere else bits
        return f

    def value(li: int, h: int):
        def f(st: State) -> np.ndarray:
            u = np.arange(value_words, dtype=np.int64)
            return (st["x"][..., None] * (h + 1) + pos[..., None] + li + u) % mod
        return f

    def post(st: State, outs: tuple[HeadOut, ...]) -> State:
        y = st["y"].copy()
        for o in outs:
            den = np.broadcast_to(np.asarray(o.den), o.num.shape[:2])
            y += np.where(den[..., None] > 0, o.num // np.maximum(den, 1)[..., None], 0)
        return {"x": st["x"], "y": y % mod}

    layer_objs, hashing = [], []
    for li in range(layers):
        hs = [Head(f"L{li}.h{h}", points(li, h, qmask), points(li, h, kmask), value(li, h), dim, value_words, n)
              for h in range(heads)]
        layer_objs.append(Layer(f"layer-{li + 1}", lambda st: st, tuple(hs), post))
        hashing.append(tuple(LSHHead(LSHAttention(lsh_family(family), dim, tables, hashes, seed + 1000 * li + h),
                                     2 if sphere else 1, sphere) for h in range(heads)))
    params = {"n": n, "layers": layers, "heads": heads, "dim": dim, "value_words": value_words,
              "alphabet": alphabet, "near_flips": near_flips, "tables": tables, "hashes": hashes, "family": family,
              "value_bits": value_bits, "seed": seed}
    program = EMAProgram("planted-anna", n, bits_for(alphabet), init, tuple(layer_objs),
                         lambda st: (st["x"] + st["y"][..., 0]) % mod, params)
    return ANNATransformer(program, tuple(hashing), value_bits)
