"""Resources of the Thm 4.2 simulation beside the theorem (docs/mpc.md, "Thm 4.2: resources"): rounds
against O(L/(ε′ − ε)), local memory s against N^{ε′}, machines P against N^{1+ε−ε′+3/c²} and against
the N² of simulating a standard transformer, over N and several (ε, ε′, c).

Each row builds the ANNA-transformer :func:`table_transformer` — planted (bit sampling on 16-bit
points), L layers of one head whose values have ⌈N^ε⌉ − 2 words, so that its width (the query, key and
value words) is W = max(3, ⌈N^ε⌉): P2's mH = Θ(N^ε) — with ℓ = ⌈N^{3/c²}⌉ tables (Thm 3.4's
ℓ = Θ(N^{3ρ} log N) at ρ = 1/c², the log factor dropped as Thm 4.2's exponent drops it) of z = 8
hash functions, and compiles it with ε and ε′. Rounds, s and P are the protocol's (they do not
depend on the input). Where the work fits the budget (:data:`RUN_WORDS` words in the largest
layout) the row is also **run**: the protocol on one seeded input on the MPC runtime (every machine's
words checked against s in every round) and compared with Alg. 1 — the peak words a machine held,
sent and received are measured there; other rows are built, not run ("plan").
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from exactformer.verify.mpc.anna_check import ROUND_CONSTANT, check
from exactformer.verify.mpc.anna_mpc import compile_anna
from exactformer.verify.mpc.anna_program import ANNATransformer, planted_transformer

#: (ε, ε′, c) of the table: c at fixed (ε, ε′), then ε′, then ε (the last: a small ε′, three sort levels)
CONFIGS: tuple[tuple[float, float, float], ...] = (
    (0.25, 0.5, 2.0), (0.25, 0.5, 3.0), (0.25, 0.5, 4.0), (0.25, 0.75, 3.0), (0.1, 0.5, 3.0), (0.1, 0.35, 3.0))
LOG_NS = (8, 10, 12, 14, 16)
LAYERS = 2
HASHES = 8
#: rows whose largest layout (2N·ℓ value items of ⌈N^ε⌉ + 1 words) exceeds this many words are built, not run
RUN_WORDS = 8_000_000


class ResourceError(ValueError):
    """Bad parameters of the resource table (names the parameter and its range)."""


def table_tables(n: int, c: float) -> int:
    """ℓ = ⌈N^{3/c²}⌉."""
    return max(1, math.ceil(n ** (3 / (c * c)) - 1e-9))


def table_transformer(n: int, eps: float, c: float, layers: int = LAYERS, seed: int = 0) -> ANNATransformer:
    """The planted ANNA-transformer of the table (module docstring): width W = max(3, ⌈N^ε⌉)."""
    return planted_transformer(n, layers=layers, heads=1, dim=16, value_words=max(1, math.ceil(n ** eps - 1e-9) - 2),
                               tables=table_tables(n, c), hashes=HASHES, value_bits=10, seed=seed)


@dataclass
class ResourceRow:
    n: int
    eps: float
    eps_prime: float
    c: float
    tables: int
    layers: int
    width: int
    rounds: int
    round_constant: float  # rounds·(ε′ − ε)/L
    memory: int  # s
    memory_ratio: float  # s / N^{ε′}
    machines: int  # P
    machines_theorem: float  # N^{1+ε−ε′+3/c²}
    machines_ratio: float
    quadratic_ratio: float  # P / N²
    sort_levels: int
    run: bool  # run on the MPC runtime (else: built, not run)
    agrees: bool | None = None
    peak_memory: int | None = None
    peak_sent: int | None = None
    peak_received: int | None = None
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def row(n: int, eps: float, eps_prime: float, c: float, *, layers: int = LAYERS, run_words: int = RUN_WORDS,
        seed: int = 0) -> ResourceRow:
    """One row: build (and, within ``run_words``, run and check) the simulation at (N, ε, ε′, c)."""
    t0 = time.perf_counter()
    T = table_transformer(n, eps, c, layers, seed)
    sim = compile_anna(T, eps_prime, eps)
    pl = sim.plan
    lp = pl.layers[0]
    gap = eps_prime - eps
    theorem = n ** (1 + eps - eps_prime + 3 / (c * c))
    work = 2 * n * lp.pairs * lp.value_item
    r = ResourceRow(n, eps, eps_prime, c, lp.pairs, layers, pl.width, pl.rounds, pl.rounds * gap / layers, pl.memory,
                    pl.memory / n ** eps_prime, pl.machines, theorem, pl.machines / theorem, pl.machines / n ** 2,
                    max(x.sort.levels for x in pl.layers), work <= run_words)
    if r.run:
        x = np.random.default_rng(seed).integers(0, 1 << T.program.word_bits, size=(1, n))
        rep = check(sim, [("sample", x)])
        r.agrees = rep.passed
        r.peak_memory, r.peak_sent, r.peak_received = (rep.peak.get(k) for k in ("memory", "sent", "received"))
    r.seconds = time.perf_counter() - t0
    return r


def rows(configs: Sequence[tuple[float, float, float]] = CONFIGS, log_ns: Sequence[int] = LOG_NS, *,
         layers: int = LAYERS, run_words: int = RUN_WORDS, progress: Callable[[ResourceRow], None] | None = None
         ) -> list[ResourceRow]:
    for eps, ep, c in configs:
        if not (0 < eps < ep < 1) or c <= 1:
            raise ResourceError(f"configs: need 0 < ε < ε′ < 1 and c > 1, got (ε, ε′, c) = ({eps}, {ep}, {c})")
    for e in log_ns:
        if isinstance(e, bool) or not isinstance(e, int) or not 4 <= e <= 20:
            raise ResourceError(f"log_ns: must be integers in [4, 20], got {e!r}")
    out = []
    for eps, ep, c in configs:
        for e in log_ns:
            out.append(row(1 << e, eps, ep, c, layers=layers, run_words=run_words))
            if progress is not None:
                progress(out[-1])
    return out


def _slope(xs: list[float], ys: list[float]) -> float:
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0]) if len(xs) >= 2 else float("nan")


def exponents(rs: list[ResourceRow]) -> dict[tuple[float, float, float], dict[str, float]]:
    """Per (ε, ε′, c): the measured log-log slopes of P and s in N beside the theorem's exponents."""
    out = {}
    for key in dict.fromkeys((r.eps, r.eps_prime, r.c) for r in rs):
        g = [r for r in rs if (r.eps, r.eps_prime, r.c) == key]
        ns = [r.n for r in g]
        eps, ep, c = key
        out[key] = {"machines": _slope(ns, [r.machines for r in g]), "machines_theorem": 1 + eps - ep + 3 / (c * c),
                    "memory": _slope(ns, [r.memory for r in g]), "memory_theorem": ep,
                    "round_constant_max": max(r.round_constant for r in g)}
    return out


def _n(n: int) -> str:
    return f"2^{n.bit_length() - 1}"


def markdown(rs: list[ResourceRow]) -> str:
    lines = ["| (ε, ε′, c) | N | ℓ | W | rounds (L = 2) | rounds·(ε′−ε)/L | s | s / N^ε′ | P | N^{1+ε−ε′+3/c²} | "
             "P / N^{1+ε−ε′+3/c²} | P / N² | sort levels | run: peak held / sent / received, Alg. 1 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rs:
        ran = (f"{r.peak_memory} / {r.peak_sent} / {r.peak_received} ≤ s, {'equal' if r.agrees else 'DIFFERS'}"
               if r.run else "plan (not run)")
        lines.append(f"| ({r.eps}, {r.eps_prime}, {r.c:g}) | {_n(r.n)} | {r.tables} | {r.width} | {r.rounds} "
                     f"| {r.round_constant:.2f} | {r.memory} | {r.memory_ratio:.2f} | {r.machines} "
                     f"| {r.machines_theorem:.0f} | {r.machines_ratio:.2f} | {r.quadratic_ratio:.2e} "
                     f"| {r.sort_levels} | {ran} |")
    ex = exponents(rs)
    lines += ["", "| (ε, ε′, c) | P: measured exponent | theorem 1 + ε − ε′ + 3/c² | s: measured exponent | theorem ε′ "
              "| max rounds·(ε′−ε)/L |", "|---|---|---|---|---|---|"]
    for (eps, ep, c), v in ex.items():
        lines.append(f"| ({eps}, {ep}, {c:g}) | {v['machines']:.2f} | {v['machines_theorem']:.2f} | {v['memory']:.2f} "
                     f"| {v['memory_theorem']:.2f} | {v['round_constant_max']:.2f} |")
    worst = max(v["round_constant_max"] for v in ex.values())
    lines += ["", f"Every row: rounds ≤ C·L/(ε′ − ε) with C = {ROUND_CONSTANT} (the largest rounds·(ε′−ε)/L here: "
                  f"{worst:.2f}); no machine over s words in any round of the rows run."]
    return "\n".join(lines)


def figure(rs: list[ResourceRow], path: str | Path) -> Path:
    """Three log-log panels: P against N with N^{1+ε−ε′+3/c²} (scaled to the first N) and N²; s against
    N^{ε′}; rounds·(ε′−ε)/L against N."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ResourceError("--figure: matplotlib is needed to draw the figure (pip install matplotlib)") from None
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    axes = fig.subplots(1, 3)
    keys = list(dict.fromkeys((r.eps, r.eps_prime, r.c) for r in rs))
    colors = [f"C{i}" for i in range(len(keys))]
    for key, col in zip(keys, colors):
        g = [r for r in rs if (r.eps, r.eps_prime, r.c) == key]
        ns = np.array([r.n for r in g], dtype=float)
        lab = f"(ε, ε′, c) = ({key[0]}, {key[1]}, {key[2]:g})"
        P = np.array([r.machines for r in g], dtype=float)
        axes[0].loglog(ns, P, "o-", color=col, label=lab)
        axes[0].loglog(ns, P[0] * (ns / ns[0]) ** (1 + key[0] - key[1] + 3 / key[2] ** 2), "--", color=col, alpha=0.6)
        s = np.array([r.memory for r in g], dtype=float)
        axes[1].loglog(ns, s, "o-", color=col, label=lab)
        axes[1].loglog(ns, s[0] * (ns / ns[0]) ** key[1], "--", color=col, alpha=0.6)
        axes[2].semilogx(ns, [r.round_constant for r in g], "o-", color=col, label=lab)
    n_all = np.array(sorted({r.n for r in rs}), dtype=float)
    axes[0].loglog(n_all, n_all ** 2, "k:", label="N² (standard transformer, [55])")
    axes[0].set(title="machines P (dashed: N^{1+ε−ε′+3/c²})", xlabel="N")
    axes[1].set(title="local memory s (dashed: N^{ε′})", xlabel="N")
    axes[2].axhline(ROUND_CONSTANT, color="k", ls=":", label=f"C = {ROUND_CONSTANT}")
    axes[2].set(title="rounds · (ε′ − ε) / L", xlabel="N", ylim=(0, ROUND_CONSTANT * 1.1))
    for ax in axes:
        ax.set_xscale("log", base=2)
    axes[0].legend(fontsize=7, loc="upper left")
    axes[2].legend(fontsize=7)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)  # under the 150 kB a committed figure may take (test_sizes)
    return out


def replace_table_block(doc: str, name: str, text: str) -> str:
    """``doc`` with the block between ``<!-- table:name -->`` and ``<!-- end table -->`` replaced."""
    pat = re.compile(rf"(<!-- table:{re.escape(name)} -->\n)(?:(?!<!--)[^\n]*\n)*(<!-- end table -->)")
    if not pat.search(doc):
        raise ResourceError(f"--doc: the file has no <!-- table:{name} --> … <!-- end table --> block")
    return pat.sub(lambda m: m.group(1) + text + "\n" + m.group(2), doc, count=1)
