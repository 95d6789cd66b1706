"""Checks of the Thm 4.2 simulation (docs/mpc.md, "Thm 4.2: checks"): the protocol against
Algorithm 1, layer by layer, on every input, with Def. 2.3's limits checked by the runtime.

For each batch of inputs:

1. the ANNA-transformer runs as Algorithm 1 runs it (:func:`~exactformer.verify.mpc.anna_program.trace`:
   every head's (num, den) from the LSH buckets, or the EMA kernel);
2. the protocol runs on the MPC runtime (:func:`~exactformer.verify.mpc.protocol_run.trace`), which
   stops at the first machine that sends, receives or holds more than s words (or breaks any other
   rule: a counterexample of kind "resource");
3. after the last round of every layer the token machines' sums give every head's output
   (:meth:`ANNASimulation.sums`), compared with Alg. 1's bit for bit (kind "head": layer, head,
   token, expected and obtained num and den);
4. the outputs are compared (kind "output").

Before anything runs, the protocol's round count is compared with the plan's (a protocol with a round
added or dropped is refused: kind "rounds") and with the theorem's bound C·L/(ε′ − ε) with the
constant :data:`ROUND_CONSTANT` (refused above it).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from exactformer.constructions.mpc.program import HeadOut
from exactformer.verify.mpc import anna_program as ap
from exactformer.verify.mpc import protocol_run
from exactformer.verify.mpc.anna_mpc import ANNAMPCError, ANNASimulation, head_outs, work_words

#: the constant C of the round bound R <= C·L/(ε′ − ε) that every simulation here meets (docs/mpc.md)
ROUND_CONSTANT = 40
#: words of the runtime's largest per-round array for one batch: batches are cut to stay below it
BATCH_WORDS = 1 << 25
#: a simulation whose largest round needs more words than this for one input is refused before it runs
#: (the runtime keeps a few such arrays: about 8 bytes × 6 per word)
MAX_WORDS = 1 << 26


@dataclass
class SimulationCounterexample:
    input: list[int]
    index: int
    source: str
    kind: str  # "resource", "head", "output", "rounds", "error"
    round: int | None = None
    round_name: str | None = None
    layer: int | None = None
    head: str | None = None
    token: int | None = None
    expected: Any = None
    got: Any = None
    message: str = ""

    def describe(self) -> str:
        if self.kind == "head":
            return (f"layer {self.layer} head {self.head!r} at token {self.token} (after round {self.round}, "
                    f"{self.round_name!r}): Alg. 1 gives {self.expected}, the protocol {self.got}")
        if self.kind == "output":
            return f"output at token {self.token}: Alg. 1 gives {self.expected}, the protocol {self.got}"
        return self.message


@dataclass
class SimulationReport:
    """Result of :func:`check`: a PASS covers ``inputs`` inputs (their sources and seed given)."""

    name: str
    n: int
    params: dict
    eps: float
    eps_prime: float
    fmt: str
    passed: bool
    inputs: int
    seed: int | None
    sources: dict[str, int]
    seconds: float
    rounds: int
    round_bound: float  # C·L/(ε′ − ε)
    layers: int
    machines: int
    memory: int
    word_bits: int
    peak: dict[str, int] = field(default_factory=dict)  # largest words held / sent / received by a machine
    counterexample: SimulationCounterexample | None = None

    @property
    def reason(self) -> str:
        if self.counterexample is not None:
            return self.counterexample.describe()
        return (f"{self.inputs} inputs: every head of every layer and every output equal to Alg. 1's; no machine "
                f"over s = {self.memory} words (peak {self.peak.get('memory', 0)})")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = self.reason
        return d


def round_bound(sim: ANNASimulation) -> float:
    """C·L/(ε′ − ε) for the simulation's transformer and exponents."""
    pl = sim.plan
    return ROUND_CONSTANT * max(1, sim.T.layers) / (pl.eps_prime - pl.eps)


def _same(a: HeadOut, b: HeadOut) -> np.ndarray:
    """[B, N] bool: the outputs agree (value words and denominators)."""
    ok = np.all(np.asarray(a.num) == np.asarray(b.num), axis=-1)
    return ok & (np.broadcast_to(np.asarray(a.den), ok.shape) == np.broadcast_to(np.asarray(b.den), ok.shape))


def _row(h: HeadOut, b: int, i: int) -> dict[str, Any]:
    return {"num": np.asarray(h.num)[b, i].tolist(), "den": int(np.broadcast_to(np.asarray(h.den), h.num.shape[:2])[b, i])}


def differential(sim: ANNASimulation, x: np.ndarray, peak: dict[str, int] | None = None) -> SimulationCounterexample | None:
    """One batch ``x`` [B, N] through Alg. 1 and the protocol; the first difference (input index
    relative to the batch; source "")."""
    T, fmt = sim.T, sim.fmt
    peak = {} if peak is None else peak

    def cex(kind: str, b: int = 0, **kw) -> SimulationCounterexample:
        return SimulationCounterexample(x[b].tolist(), b, "", kind, **kw)

    ref = list(ap.trace(T, x, fmt))
    names = [r.name for r in sim.protocol.rounds]
    ends = dict(zip(sim.layer_ends, range(len(sim.layer_ends))))
    mem = None
    try:
        for st in protocol_run.trace(sim.protocol, x):
            for k in ("memory", "sent", "received"):
                peak[k] = max(peak.get(k, 0), getattr(st.usage, k))
            mem = st.memory
            j = ends.get(st.round)
            if j is None:
                continue
            lp = sim.plan.layers[j]
            got = head_outs(lp, sim.sums(mem, j), fmt)
            want = ref[lp.index + 1].outs
            for h, (a, b) in enumerate(zip(want, got)):
                bad = ~_same(a, b)
                if bad.any():
                    bi, i = (int(v) for v in np.argwhere(bad)[0])
                    return cex("head", bi, round=st.round, round_name=names[st.round - 1], layer=lp.index + 1,
                               head=lp.heads[h].name, token=i, expected=_row(a, bi, i), got=_row(b, bi, i))
        out = protocol_run.output(sim.protocol, mem, x.shape[0])
    except protocol_run.MPCError as e:
        b = e.input or 0
        return cex("resource", b, round=e.round, round_name=e.round_name, message=str(e))
    except ANNAMPCError as e:
        return cex("error", message=str(e))
    want = np.asarray(T.program.readout(ref[-1].state), dtype=np.int64)
    bad = out != want
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        return cex("output", b, token=i, expected=int(want[b, i]), got=int(out[b, i]))
    return None


def words(T: ap.ANNATransformer) -> int:
    """Inputs are words in [0, 2^p) of the transformer's program."""
    return 1 << T.program.word_bits


def default_sources(sim: ANNASimulation, samples: int, seed: int, domain: int | None = None
                    ) -> Iterator[tuple[str, np.ndarray]]:
    """Named inputs (all equal: every token in one bucket; all max; alternating; a ramp) and
    ``samples`` uniform inputs over [0, ``domain``) (default: the program's words), seeded."""
    n = sim.T.n
    d = words(sim.T) if domain is None else domain
    pos = np.arange(n, dtype=np.int64)[None, :]
    yield "all-equal", np.zeros((1, n), dtype=np.int64)
    yield "all-max", np.full((1, n), d - 1, dtype=np.int64)
    yield "alternating", (pos % 2) * (d - 1)
    yield "ramp", pos % d
    rng = np.random.default_rng(seed)
    batch = max(1, min(256, (1 << 16) // n))
    for lo in range(0, samples, batch):
        yield "sample", rng.integers(0, d, size=(min(batch, samples - lo), n))


def check(sim: ANNASimulation, sources: Iterable[tuple[str, np.ndarray]] | None = None, *, samples: int = 100,
          seed: int = 0, batch: int | None = None) -> SimulationReport:
    """The simulation against Alg. 1 on ``sources`` ((kind, inputs [B, N]) pairs; default:
    :func:`default_sources` with ``samples`` and ``seed``), stopping at the first difference. Batches
    are cut to at most ``batch`` inputs (default: as many as keep the runtime's arrays below
    :data:`BATCH_WORDS` words); a simulation needing more than :data:`MAX_WORDS` words for one input
    is refused before it runs (:class:`ANNAMPCError` with the estimate)."""
    t0 = time.perf_counter()
    pl, T = sim.plan, sim.T
    bound = round_bound(sim)
    report = SimulationReport(T.name, T.n, dict(T.program.params), pl.eps, pl.eps_prime,
                              "ideal" if sim.fmt is None else sim.fmt.name, False, 0, seed if sources is None else None,
                              {}, 0.0, len(sim.protocol.rounds), bound, T.layers, sim.protocol.n_machines,
                              sim.protocol.memory, sim.protocol.word_bits)
    R = len(sim.protocol.rounds)
    if R != pl.rounds:
        report.counterexample = SimulationCounterexample([], 0, "", "rounds", message=(
            f"the protocol has {R} rounds, its plan {pl.rounds}: a round was added or dropped"))
    elif R > bound:
        report.counterexample = SimulationCounterexample([], 0, "", "rounds", message=(
            f"{R} rounds exceed the bound C·L/(ε′ − ε) = {bound:.1f} (C = {ROUND_CONSTANT})"))
    if report.counterexample is not None:
        report.seconds = time.perf_counter() - t0
        return report
    work = work_words(sim)
    if work > MAX_WORDS:
        raise ANNAMPCError(f"n: the simulation's largest round needs about {work:.3g} words for one input (about "
                           f"{work * 48 / 2**30:.1f} GiB of runtime arrays; limit {MAX_WORDS:.3g} words): use a smaller "
                           "N, fewer tables or a larger eps_prime")
    src = default_sources(sim, samples, seed) if sources is None else sources
    peak: dict[str, int] = {}
    for kind, x in src:
        x = np.asarray(x, dtype=np.int64)
        step = batch or max(1, min(len(x), BATCH_WORDS // max(work, 1)))
        for lo in range(0, len(x), step):
            part = x[lo:lo + step]
            c = differential(sim, part, peak)
            if c is not None:
                c.index += report.inputs
                c.source = kind
                report.sources[kind] = report.sources.get(kind, 0) + c.index - report.inputs + 1
                report.inputs = c.index + 1
                report.counterexample = c
                report.peak, report.seconds = peak, time.perf_counter() - t0
                return report
            report.inputs += len(part)
            report.sources[kind] = report.sources.get(kind, 0) + len(part)
    report.passed = True
    report.peak, report.seconds = peak, time.perf_counter() - t0
    return report
