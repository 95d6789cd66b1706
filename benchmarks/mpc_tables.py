"""Resource tables of the compiled k-hop / induction-head programs (P2 Thms 5.4, 5.6 via Thm 4.1),
for docs/mpc.md: N = 2^8 .. 2^24, k = 1 .. 2^10, beside the lower bound that Sanford, Hsu and
Telgarsky (ICML 2024) prove for recurrent nets and low-rank attention (restated in P2 Sec. 5.2),
with the cells where it is vacuous marked.

Usage: python benchmarks/mpc_tables.py [--write]
Nothing runs: the sizes come from the protocols' declarations (:func:`resources`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from exactformer.constructions.mpc.compile import resources
from exactformer.constructions.mpc.library import k_hop
from exactformer.verify.mpc.anna_resources import ResourceError, replace_table_block

NS = [8, 10, 12, 14, 16, 18, 20, 22, 24]
KS = [1, 2, 4, 16, 64, 256, 1024]


def memory_alternative_vacuous(n: int, k: int) -> bool:
    """Whether the memory half of "depth Ω(k) or memory Ω(N/k⁶)" (Sanford, Hsu, Telgarsky, ICML
    2024, restated in P2 Sec. 5.2) is vacuous at (N, k): N/k⁶ ≤ 1, so every model meets it and the
    statement says nothing there."""
    return n <= k ** 6


def _bound_cell(k: int) -> str:
    e = 6 * (k.bit_length() - 1)
    return f"Ω({k}) layers or Ω({'N' if e == 0 else f'N/2^{e}'}) words"


def layers_table() -> str:
    rows = ["| N | " + " | ".join(f"k = {k}" for k in KS) + " | round bound ⌈log₂N⌉ + ⌊log₂k⌋ + 2 at k = 2^10 |",
            "|---|" + "---|" * len(KS) + "---|"]
    vacuous = 0
    for e in NS:
        n = 1 << e
        marks = [memory_alternative_vacuous(n, k) for k in KS]
        vacuous += sum(marks)
        cells = [f"{resources(k_hop(n, k, n)).layers}{' °' if v else ''}" for k, v in zip(KS, marks)]
        rows.append(f"| 2^{e} | " + " | ".join(cells) + f" | {e + 10 + 2} |")
    rows.append("| recurrent nets, low-rank attention: depth Ω(k) or memory Ω(N/k⁶) | "
                + " | ".join(_bound_cell(k) for k in KS) + " | |")
    cells = len(NS) * len(KS)
    return "\n".join(rows) + (
        f"\n\n° N ≤ k⁶: N/k⁶ ≤ 1, so the memory alternative asks for at most a constant number of words, which "
        f"every model has: the lower bound says nothing at this (N, k) — vacuous in {vacuous} of the table's {cells} "
        "cells. The bound is asymptotic, "
        "without stated constants, and is about recurrent nets and low-rank attention, not about the EMA "
        "programs counted above.")


def sizes_table() -> str:
    rows = ["| N | layers (k = 2^10) | heads per layer (max; σ rounds / doubling) | m (words; per-token maps not counted) "
            "| s (words) | ε = log_N s | ε′ needed | p (bits) | exact fixed point | residual (words; per-token maps not "
            "counted) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for e in NS:
        n = 1 << e
        r = resources(k_hop(n, 1024, n))
        rows.append(f"| 2^{e} | {r.layers} | {r.max_heads} ({r.heads[0]}, {r.heads[1]} / ≤ 2) | {r.m} | {r.memory} "
                    f"| {r.eps:.3f} | {r.eps_prime_needed:.3f} | {r.word_bits} | {r.min_format} | {r.residual} |")
    return "\n".join(rows) + (
        "\n\nm and the residual count the words heads read and write. The per-token maps between heads (each "
        "round's local step: the queries, keys and values a machine computes from its memory, and the decoding of "
        "what it received) are arbitrary functions of one token's words, as P2 allows (Sec. 2.1: element-wise "
        "operations are arbitrary functions); they are not counted here. A transformer with weight-matrix MLPs "
        "in their place would need its own width for them.")


def branching_table() -> str:
    e = 20
    n = 1 << e
    rows = ["| B | L = ⌈log_B N⌉ | layers (induction heads) | layers (k = 2^10) | heads per layer (max) "
            "| heads in all | log_N(max heads) | s (words) |",
            "|---|---|---|---|---|---|---|---|"]
    for B in (2, 4, 32, 1024):
        r1 = resources(k_hop(n, 1, n, B))
        rk = resources(k_hop(n, 1024, n, B))
        L = -(-e // (B.bit_length() - 1))
        rows.append(f"| {B} | {L} | {r1.layers} | {rk.layers} | {rk.max_heads} | {sum(rk.heads)} "
                    f"| {rk._log(rk.max_heads):.3f} | {rk.memory} |")
    return "\n".join(rows)


TABLES = {"layers": layers_table, "sizes": sizes_table, "branching": branching_table}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="replace the tables in docs/mpc.md")
    a = ap.parse_args()
    out = {name: fn() for name, fn in TABLES.items()}
    if not a.write:
        for name, text in out.items():
            print(f"<!-- table:{name} -->\n{text}\n")
        return
    path = Path(__file__).resolve().parents[1] / "docs" / "mpc.md"
    doc = path.read_text()
    for name, text in out.items():
        try:
            doc = replace_table_block(doc, name, text)
        except ResourceError as e:
            raise SystemExit(f"docs/mpc.md: {e}") from None
    path.write_text(doc)


if __name__ == "__main__":
    main()
