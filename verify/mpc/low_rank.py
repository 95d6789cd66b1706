"""P2 Thm 4.4 executed: a low-rank attention transformer, its MPC simulation
(:func:`~exactformer.constructions.mpc.low_rank.low_rank_protocol`) and the ANNA-transformer that
Thm 4.1's compiler makes of that protocol, run on the same inputs (docs/mpc.md, "Thm 4.4").

Levels, all in the same semantics (exact integers, or a fixed-point format):

    low-rank   :func:`run`: Def. 4.3 directly, K′ᵀV then Q′(K′ᵀV), head by head, layer by layer
    mpc        the protocol on the MPC runtime (Def. 2.3 checked every round)
    ANNA       the compiled EMA program (ANNA with r = 0, c → ∞), ideal and in its coarsest exact
               fixed-point format, in lockstep with the protocol (the Thm 4.1 invariant after every
               round, :func:`~exactformer.verify.mpc.check.differential`)

:func:`check` compares them on every input and reports the sizes against Thm 4.4 (depth O(L), heads
H = O(N^{(ε′−ε)/4}), embedding dimension m = O(N^{ε′})). :func:`approximation` measures what the
theorem allows beyond bit-for-bit agreement: the p-bit model rounds each head's output once to its
grid, so against the same layer computed in real arithmetic (float64 here, an independent path) the
difference is below one grid step (floor rounding) or half of one (nearest).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from exactformer.constructions.mpc.compile import ResourceReport, compile_protocol, resources
from exactformer.constructions.mpc.low_rank import (LowRankError, LowRankPlan, LowRankTransformer, head_inputs, head_out,
                                                    low_rank_protocol)
from exactformer.constructions.mpc.program import EMAProgram
from exactformer.constructions.mpc.protocol import Protocol
from exactformer.precision import FixedPoint
from exactformer.verify.attention.ema import check_fmt
from exactformer.verify.mpc import program_run, protocol_run
from exactformer.verify.mpc.check import differential


def trace(T: LowRankTransformer, inputs, fmt: FixedPoint | None = None) -> Iterator[tuple[dict, tuple]]:
    """(state, head outputs) after ``init`` and after every layer (Def. 4.3, exactly)."""
    x = program_run.check_inputs(T.program, inputs)
    state = T.program.init(x)
    yield state, ()
    for layer in T.program.layers:
        st = layer.pre(state)
        outs = []
        for h in layer.heads:
            q, k, v = head_inputs(T, h, st)
            outs.append(head_out(q, np.einsum("bnr,bnm->brm", k.astype(object), v.astype(object)), fmt))
        state = layer.post(st, tuple(outs))
        yield state, tuple(outs)


def run(T: LowRankTransformer, inputs, fmt: FixedPoint | None = None) -> np.ndarray:
    """Outputs [B, n] of the low-rank transformer (Def. 4.3 computed directly)."""
    state = None
    for state, _ in trace(T, inputs, fmt):
        pass
    return np.asarray(T.program.readout(state), dtype=np.int64)


@dataclass
class LowRankSimulation:
    """The Thm 4.4 pipeline for ``T``: the MPC ``protocol`` (and its ``plan``), the ANNA-transformer
    ``program`` (Thm 4.1's compilation of the protocol) and its ``resources``."""

    T: LowRankTransformer
    fmt: FixedPoint | None
    plan: LowRankPlan
    protocol: Protocol
    program: EMAProgram
    resources: ResourceReport

    def __call__(self, inputs, level: str = "anna") -> np.ndarray:
        """Outputs [B, N] of the ANNA-transformer (``level="anna"``: ideal semantics; "anna-fixed": its
        coarsest exact format) or of the protocol ("mpc")."""
        if level == "mpc":
            return protocol_run.run(self.protocol, inputs).outputs
        if level not in ("anna", "anna-fixed"):
            raise LowRankError(f"level: must be one of ('anna', 'anna-fixed', 'mpc'), got {level!r}")
        fmt = self.program.min_format() if level == "anna-fixed" else None
        return program_run.run(self.program, inputs, fmt).outputs

    def sizes(self) -> dict[str, Any]:
        """Depth, heads and width of the ANNA-transformer against Thm 4.4 (JSON-able)."""
        pl, r, T = self.plan, self.resources, self.T
        N, gap = pl.n, pl.eps_prime - pl.eps
        return {"n": N, "low_rank_layers": T.layers, "ranks": sorted({x for li in range(T.layers) for x in T.ranks(li)}),
                "eps": round(pl.eps, 4), "eps_prime": round(pl.eps_prime, 4), "rounds": len(self.protocol.rounds),
                "anna_layers": r.layers, "layers_per_low_rank_layer": r.layers / max(1, len(pl.head_layers)),
                "depth_bound": f"O(L/(ε′ − ε)) = O({T.layers}/{gap:.3f})",
                "max_heads": r.max_heads, "heads_bound": round(N ** (gap / 4), 3),
                "m": r.m, "m_bound": round(N ** pl.eps_prime, 2), "memory": pl.memory, "word_bits": pl.word_bits,
                "word_bits_per_log2_n": round(pl.word_bits / math.log2(N), 3), "min_format": r.min_format}


def simulate(T: LowRankTransformer, eps_prime: float, eps: float | None = None,
             fmt: FixedPoint | None = None) -> LowRankSimulation:
    """Thm 4.4: ``T``'s MPC simulation and its compilation to an ANNA-transformer (Thm 4.1)."""
    fmt = check_fmt(fmt)
    protocol, pl = low_rank_protocol(T, eps_prime, eps, fmt)
    return LowRankSimulation(T, fmt, pl, protocol, compile_protocol(protocol), resources(protocol))


@dataclass
class LowRankReport:
    """Result of :func:`check`: every level on ``inputs`` inputs; ``counterexample`` describes the
    first difference."""

    name: str
    n: int
    fmt: str
    passed: bool
    inputs: int
    seed: int | None
    seconds: float
    levels: list[str]
    sizes: dict[str, Any]
    approximation: dict[str, Any] = field(default_factory=dict)
    counterexample: str | None = None

    @property
    def reason(self) -> str:
        if self.counterexample is not None:
            return self.counterexample
        return f"{self.inputs} inputs: {', '.join(self.levels)} agree bit for bit"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = self.reason
        return d


def default_sources(T: LowRankTransformer, samples: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    n, d = T.n, 1 << T.program.word_bits
    yield "all-zero", np.zeros((1, n), dtype=np.int64)
    yield "all-max", np.full((1, n), d - 1, dtype=np.int64)
    yield "ramp", np.arange(n, dtype=np.int64)[None, :] % d
    rng = np.random.default_rng(seed)
    batch = max(1, min(256, (1 << 16) // n))
    for lo in range(0, samples, batch):
        yield "sample", rng.integers(0, d, size=(min(batch, samples - lo), n))


def check(sim: LowRankSimulation, sources: Iterable[tuple[str, np.ndarray]] | None = None, *, samples: int = 100,
          seed: int = 0) -> LowRankReport:
    """The low-rank transformer, the protocol and the ANNA-transformer (ideal and its coarsest exact
    format) on the same inputs; the protocol and the programs in lockstep after every round."""
    t0 = time.perf_counter()
    fmts = [None, sim.program.min_format()]
    levels = ["low-rank", "mpc", "anna ideal", f"anna {fmts[1].name}"]
    rep = LowRankReport(sim.T.name, sim.T.n, "exact" if sim.fmt is None else sim.fmt.name, False, 0,
                        seed if sources is None else None, 0.0, levels, sim.sizes())
    for kind, x in (default_sources(sim.T, samples, seed) if sources is None else sources):
        x = np.asarray(x, dtype=np.int64)
        truth = run(sim.T, x, sim.fmt)
        cex = differential(sim.protocol, sim.program, x, truth, fmts)
        if cex is not None:
            rep.counterexample = f"{kind} input {rep.inputs + cex.index}: {cex.describe()}"
            rep.seconds = time.perf_counter() - t0
            return rep
        rep.inputs += len(x)
    rep.passed = True
    rng = np.random.default_rng(seed)
    rep.approximation = approximation(sim.T, rng.integers(0, 1 << sim.T.program.word_bits, size=(8, sim.T.n)), sim.fmt)
    rep.seconds = time.perf_counter() - t0
    return rep


def approximation(T: LowRankTransformer, inputs, fmt: FixedPoint | None) -> dict[str, Any]:
    """The first layer's head outputs of the model (its semantics) against the same layer computed
    in real arithmetic (float64: Q′ (K′ᵀ V) on the values raw / S): the largest difference in grid
    steps, and the bound the p-bit model allows (0 exact; 1 floor, 1/2 nearest — plus float64's
    own rounding, far below)."""
    x = program_run.check_inputs(T.program, inputs)
    layer = next((layer for layer in T.program.layers if layer.heads), None)
    if layer is None:
        return {"max_steps": 0.0, "bound": 0.0}
    st = layer.pre(T.program.init(x))
    worst = 0.0
    S = 1 if fmt is None else fmt.scale
    for h in layer.heads:
        q, k, v = head_inputs(T, h, st)
        real = np.einsum("bnr,brm->bnm", q / S, np.einsum("bnr,bnm->brm", k / S, v / S))
        out = head_out(q, np.einsum("bnr,bnm->brm", k.astype(object), v.astype(object)), fmt)
        worst = max(worst, float(np.abs(out.num / S - real).max(initial=0.0)) * S)
    bound = 0.0 if fmt is None else (0.5 if fmt.nearest else 1.0)
    return {"max_steps": worst, "bound": bound, "within": worst <= bound + 1e-6}
