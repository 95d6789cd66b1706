"""The EMA-program executor (level L2): runs an :class:`~exactformer.constructions.mpc.program.EMAProgram`
in ideal semantics (exact rationals) or in a fixed-point format (weights ⌊S/c⌋/S).

Every head goes through the EMA kernel :func:`exactformer.verify.attention.ema.exact_match_attention`, except
two shapes of head that are exactly a gather or a scatter and are evaluated as such (detected on the
data, never assumed; ``generic=True`` sends every head through the kernel):

* **positional keys** — one key word with k_j = j wherever a key is present: M_i is {q_i} or ∅
  (c <= 1, ŵ = S/S = 1), so out_i = v_{q_i} (a gather);
* **positional queries** — one query word with q_j = j wherever a query is present: M_j is the set
  of keys equal to j, so the count and the sum are a scatter-add over the keys; in fixed point
  out_j = sat(Σ_{i: k_i = j} fmt.mul(⌊S/c_j⌋, v_i)), term by term as the kernel defines it.

Both need the weight 1 to be representable (S <= max_raw); the scatter also floor rounding (the
kernel's weights under nearest-even rounding are round(S/c)); otherwise the kernel runs.

Per head the executor records the largest match count and, in fixed point, the matches lost to
S < c (``lost``: queries with c >= 1 whose weight ⌊S/c⌋ is 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from exactformer.constructions.mpc.program import EMAProgram, Head, HeadOut, State
from exactformer.constructions.mpc.protocol import present_rows
from exactformer.precision import FixedPoint, Format
from exactformer.verify.attention.ema import check_fmt, exact_match_attention


class EMAProgramError(ValueError):
    """Bad inputs, or a head whose values the fixed-point format cannot hold."""


@dataclass
class HeadStats:
    name: str
    max_count: int = 0
    lost: int = 0  # fixed point: queries with a match whose weight ⌊S/c⌋ is 0
    path: str = "kernel"  # "kernel", "gather" or "scatter"


@dataclass
class LayerState:
    """The state after layer ``layer`` (0: after ``init``), the layer's head statistics and its heads'
    outputs (what a lowered softmax head must reproduce bit for bit)."""

    layer: int
    name: str
    state: State
    heads: list[HeadStats] = field(default_factory=list)
    outs: tuple[HeadOut, ...] = ()


@dataclass
class ProgramResult:
    outputs: np.ndarray  # [B, n] int64, −1 = ⊥
    heads: list[list[HeadStats]]  # per layer


def _words(a, what: str, B: int, n: int, width: int) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu" or a.shape != (B, n, width):
        raise EMAProgramError(f"{what} must be an int array of shape [{B}, {n}, {width}], got "
                              f"{a.dtype} {list(a.shape)}")
    return a.astype(np.int64, copy=False)


def _positional(x: np.ndarray, mask: np.ndarray, n: int) -> bool:
    return x.shape[-1] == 1 and bool(np.all(~mask | (x[..., 0] == np.arange(n))))


def attend(head: Head, state: State, n: int, fmt: FixedPoint | None, generic: bool = False) -> tuple[HeadOut, HeadStats]:
    """One head's output at every token (see :class:`HeadOut`) and its statistics."""
    q = np.asarray(head.query(state))
    B = q.shape[0] if q.ndim else 0
    q = _words(q, f"head {head.name!r}: query", B, n, head.key_words)
    k = _words(head.key(state), f"head {head.name!r}: key", B, n, head.key_words)
    v = _words(head.value(state), f"head {head.name!r}: value", B, n, head.value_words)
    qmask, kmask = present_rows(q), present_rows(k)
    stats = HeadStats(head.name)
    if fmt is not None:
        S = fmt.scale
        if v.size and (v.min() * S < fmt.min_raw or v.max() * S > fmt.max_raw):
            raise EMAProgramError(f"head {head.name!r}: value words in [{int(v.min())}, {int(v.max())}] are not "
                                  f"representable in {fmt.name}")
        v = v * S
    exact_one = fmt is None or fmt.scale <= fmt.max_raw  # weight 1 representable: one match reads v_j itself
    floor = fmt is None or not fmt.nearest
    if not generic and exact_one and _positional(k, kmask, n):
        stats.path = "gather"
        q0 = q[..., 0]
        hit = qmask & (q0 < n)
        tgt = np.where(hit, q0, 0)
        hit &= np.take_along_axis(kmask, tgt, axis=1)
        count = hit.astype(np.int64)
        total = np.take_along_axis(v, tgt[..., None], axis=1) * count[..., None]
        weight = None if fmt is None else count * fmt.scale
    elif (not generic and exact_one and floor and _positional(q, qmask, n)
          and (fmt is None or n * fmt.bound < (1 << 62))):
        stats.path = "scatter"
        k0 = k[..., 0]
        live = kmask & (k0 < n)
        b, i = np.nonzero(live)
        j = k0[b, i]
        count = np.zeros((B, n), dtype=np.int64)
        np.add.at(count, (b, j), 1)
        count *= qmask
        if fmt is None:
            weight = None
            terms = v[b, i]
        else:
            weight = np.where(count > 0, fmt.scale // np.maximum(count, 1), 0)
            terms = np.asarray(fmt.mul(weight[b, j][:, None], v[b, i]))
        total = np.zeros((B, n, head.value_words), dtype=np.int64)
        np.add.at(total, (b, j), terms)
        total *= qmask[..., None]
        if fmt is not None:
            total = np.clip(total, fmt.min_raw, fmt.max_raw)
    else:
        res = exact_match_attention(q, k, v, query_mask=qmask, key_mask=kmask, fmt=fmt)
        count, total, weight = (None if a is None else np.asarray(a) for a in (res.count, res.total, res.weight))
    stats.max_count = int(count.max()) if count.size else 0
    if fmt is None:
        return HeadOut(np.asarray(total, dtype=np.int64), count), stats
    stats.lost = int(((count > 0) & (weight == 0)).sum())
    return HeadOut(np.asarray(total, dtype=np.int64), fmt.scale), stats


def check_inputs(program: EMAProgram, inputs) -> np.ndarray:
    x = np.asarray(inputs)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != program.n or x.shape[0] < 1 or x.dtype.kind not in "iu":
        raise EMAProgramError(f"inputs must be integers of shape [B, {program.n}], got {x.dtype} {list(x.shape)}")
    x = x.astype(np.int64)
    if x.size and (x.min() < 0 or x.max() >= 1 << program.word_bits):
        raise EMAProgramError(f"inputs must be words in [0, 2^{program.word_bits})")
    return x


def trace(program: EMAProgram, inputs, fmt: Format | None = None, generic: bool = False) -> Iterator[LayerState]:
    """The state after ``init`` (layer 0) and after every layer."""
    fmt = check_fmt(fmt)  # the kernel's own check (EMAError): None or an int64-mode FixedPoint
    x = check_inputs(program, inputs)
    state = program.init(x)
    yield LayerState(0, "init", state)
    for li, layer in enumerate(program.layers, start=1):
        state = layer.pre(state)
        outs, stats = [], []
        for head in layer.heads:
            o, s = attend(head, state, program.n, fmt, generic)
            outs.append(o)
            stats.append(s)
        state = layer.post(state, tuple(outs))
        yield LayerState(li, layer.name, state, stats, tuple(outs))


def run(program: EMAProgram, inputs, fmt: Format | None = None, generic: bool = False) -> ProgramResult:
    """Outputs [B, n] (−1 = ⊥) of ``program`` on ``inputs`` and per-layer head statistics."""
    stats, state = [], None
    for ls in trace(program, inputs, fmt, generic):
        state = ls.state
        if ls.layer:
            stats.append(ls.heads)
    out = np.asarray(program.readout(state), dtype=np.int64)
    return ProgramResult(out, stats)
