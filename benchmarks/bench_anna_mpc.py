"""P2 Thm 4.2 and Thm 4.4 executed: agreement runs, the resource table's time, the Thm 4.4 sizes table.

Usage:
  python benchmarks/bench_anna_mpc.py --case agreement   [--scale 1.0]
  python benchmarks/bench_anna_mpc.py --case resources   [--max-log-n 16]
  python benchmarks/bench_anna_mpc.py --case low-rank    [--write]

``agreement``: the goal run — Thm 4.2's protocol against Alg. 1, head by head and layer by layer, on
seeded inputs at N = 2^4 … 2^12 for several (ε, ε′), LSH families and head counts, plus EMA round trips
(k-hop, induction heads); at least 10,000 inputs at --scale 1. Every run goes through the MPC runtime
(Def. 2.3 checked every round: a violation stops the run) and the round count is compared with
C·L/(ε′ − ε). ``resources``: the table of ``exactformer mpc --kind resources`` (rows built, and run
where they fit), timed. ``low-rank``: Thm 4.4's sizes and agreement for docs/mpc.md (``--write``
replaces its ``low-rank`` table block).
Prints one JSON object: wall and CPU seconds, the machine, the load average, the verdicts.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

from exactformer.verify.mpc import check as mpc_check
from exactformer.verify.mpc.anna_check import check
from exactformer.verify.mpc.anna_mpc import compile_anna, width_exponent
from exactformer.verify.mpc.anna_program import from_program, planted_transformer

#: (log2 N, inputs, planted kwargs, (eps, eps′)) — inputs at scale 1
AGREEMENT = [
    (4, 3000, dict(layers=2, heads=2, tables=4), (0.3, 0.8)),
    (5, 2000, dict(layers=2, heads=1, tables=6, family="hyperplane", dim=8), (0.3, 0.7)),
    (6, 1500, dict(layers=2, heads=2, tables=4), (0.3, 0.6)),
    (7, 1000, dict(layers=2, heads=1, tables=8, family="cross-polytope", dim=8), (0.3, 0.6)),
    (8, 800, dict(layers=2, heads=2, tables=4), (0.25, 0.5)),
    (9, 500, dict(layers=1, heads=1, tables=12), (0.25, 0.5)),
    (10, 400, dict(layers=2, heads=1, tables=4), (0.3, 0.6)),
    (11, 250, dict(layers=2, heads=1, tables=4), (0.3, 0.7)),
    (12, 150, dict(layers=2, heads=1, tables=4), (0.3, 0.75)),
]
#: EMA round trips: (application, N, protocol parameters, inputs)
ROUND_TRIPS = [("k-hop", 16, dict(hops=3, alphabet=4), 600), ("induction-heads", 64, dict(alphabet=6), 400),
               ("k-hop", 256, dict(hops=5, alphabet=8), 100), ("k-hop", 4096, dict(hops=2, alphabet=16), 10)]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def agreement(scale: float) -> dict:
    rows, total, ok = [], 0, True
    for e, count, kw, (eps, ep) in AGREEMENT:
        n = 1 << e
        t0, c0 = time.perf_counter(), time.process_time()
        sim = compile_anna(planted_transformer(n, seed=e, **kw), ep, eps)
        r = check(sim, samples=max(1, round(count * scale)), seed=e)
        rows.append({"n": n, "transformer": kw, "eps": eps, "eps_prime": ep, "inputs": r.inputs, "passed": r.passed,
                     "rounds": r.rounds, "round_bound": round(r.round_bound, 1), "machines": r.machines,
                     "memory": r.memory, "peak": r.peak, "wall_s": round(time.perf_counter() - t0, 2),
                     "cpu_s": round(time.process_time() - c0, 2), "reason": r.reason})
        total += r.inputs
        ok &= r.passed
    for name, n, params, count in ROUND_TRIPS:
        t0, c0 = time.perf_counter(), time.process_time()
        m = mpc_check.build(name, n, **params)
        T = from_program(m.program)
        sim = compile_anna(T, width_exponent(T) + 0.25)
        src = [(b.kind, b.arrays[0]) for b in m.application.adversarial(m.compiled, 1 << 20, 1)]
        src += [(b.kind, b.arrays[0]) for b in m.application.sample(m.compiled, max(1, round(count * scale)), 0)]
        r = check(sim, src, batch=max(1, (1 << 16) // n))
        rows.append({"n": n, "round_trip": name, "params": params, "inputs": r.inputs, "passed": r.passed,
                     "rounds": r.rounds, "round_bound": round(r.round_bound, 1), "machines": r.machines,
                     "memory": r.memory, "peak": r.peak, "wall_s": round(time.perf_counter() - t0, 2),
                     "cpu_s": round(time.process_time() - c0, 2), "reason": r.reason})
        total += r.inputs
        ok &= r.passed
    return {"inputs": total, "passed": ok, "rows": rows}


def resources(max_log_n: int) -> dict:
    from exactformer.verify.mpc import anna_resources as ar

    t0, c0 = time.perf_counter(), time.process_time()
    rs = ar.rows(ar.CONFIGS, [e for e in ar.LOG_NS if e <= max_log_n])
    return {"rows": len(rs), "run": sum(r.run for r in rs), "all_agree": all(r.agrees in (None, True) for r in rs),
            "wall_s": round(time.perf_counter() - t0, 1), "cpu_s": round(time.process_time() - c0, 1),
            "slowest_rows": sorted(((round(r.seconds, 1), r.n, r.eps, r.eps_prime, r.c) for r in rs), reverse=True)[:5]}


def low_rank_table() -> str:
    from exactformer.constructions.mpc.low_rank import random_low_rank
    from exactformer.verify.mpc.low_rank import check as check_low_rank, simulate

    lines = ["| N | (ε, ε′) | ANNA layers (L = 2) | per low-rank layer: up + down | heads (max) | N^{(ε′−ε)/4} "
             "| m (words) | N^{ε′} | s | p (bits) | p / log₂N | inputs: low-rank = MPC = ANNA ideal = fixed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e, ep in ((6, 0.75), (8, 0.75), (10, 0.75), (12, 0.75), (8, 0.6), (10, 0.9)):
        n = 1 << e
        sim = simulate(random_low_rank(n, layers=2, rank=2, value_words=2, seed=e), ep, 0.5)
        r = check_low_rank(sim, samples=50, seed=e)
        z, pl = r.sizes, sim.plan
        lines.append(f"| 2^{e} | (0.5, {ep}) | {z['anna_layers']} | {pl.up_levels} + {pl.down_levels} "
                     f"| {z['max_heads']} | {z['heads_bound']:.2f} | {z['m']} | {z['m_bound']:.0f} | {z['memory']} "
                     f"| {z['word_bits']} | {z['word_bits_per_log2_n']:.2f} | {r.inputs}: "
                     f"{'equal' if r.passed else 'DIFFER'} |")
    return "\n".join(lines) + (
        "\n\nHeads: b − 1 = 1 wherever N^{(ε′−ε)/4} < 3 (b = max(2, ⌊N^{(ε′−ε)/4}⌋)). Depth per low-rank "
        "layer: ⌈log_{B_up} N⌉ + ⌈log_b N⌉ ≤ ⌈1/(ε′ − ε)⌉ + ⌈4/(ε′ − ε)⌉ (B_up = ⌈N^{ε′−ε}⌉; b = 2 here, and "
        "log₂ N ≤ 4/(ε′ − ε) while N^{(ε′−ε)/4} ≤ 2): O(1/(ε′ − ε)), the broadcast dominating. m is the "
        "widest send head's value, 2·B_up·U words (U = r·m = 4 here); s = W + U + B_up·U.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["agreement", "resources", "low-rank"], required=True)
    ap.add_argument("--scale", type=float, default=1.0, help="agreement: inputs × scale")
    ap.add_argument("--max-log-n", type=int, default=16)
    ap.add_argument("--write", action="store_true", help="low-rank: replace the table block in docs/mpc.md")
    a = ap.parse_args()
    out: dict = {"case": a.case, "machine": _machine(), "load_before": _load()}
    t0 = time.perf_counter()
    if a.case == "agreement":
        out |= agreement(a.scale)
    elif a.case == "resources":
        out |= resources(a.max_log_n)
    else:
        text = low_rank_table()
        if a.write:
            from exactformer.verify.mpc.anna_resources import replace_table_block

            path = Path(__file__).resolve().parents[1] / "docs" / "mpc.md"
            path.write_text(replace_table_block(path.read_text(), "low-rank", text))
        out["table"] = text
    out["wall_s_total"] = round(time.perf_counter() - t0, 1)
    out["load_after"] = _load()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
