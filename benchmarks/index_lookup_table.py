"""Size table for Index Lookup (Thm 1) at N = 2^6 .. 2^20, written into docs/index-lookup.md.

Usage: python benchmarks/index_lookup_table.py [--alphabet 64] [--max-log-n 20] [--write]
Builds each model (no verification), prints a Markdown table of k, eta and precision in both
regimes (robust: the default, checked in the format, real, float64 and float32; minimal: the
format only), the paper's eta, width, parameters and size in bits of the default, with tracr's
one-hot width 3N + 9 beside it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from boolean_tables import write_block  # a sibling script of benchmarks/

from exactformer.constructions.theorems.index_lookup import index_lookup


def table(alphabet: int, lo: int, hi: int) -> str:
    rows = ["| N | family | k | eta robust (default) | precision (default) | p (bits) | eta minimal | precision (minimal) | "
            "eta paper 2 ln(3N) | d_model | width | tracr width 3N+9 | parameters | size (bits) | build s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in range(lo, hi + 1):
        n = 1 << e
        t0 = time.perf_counter()
        m = index_lookup(n, alphabet)
        dt = time.perf_counter() - t0
        mini = index_lookup(n, alphabet, eta="minimal")
        p = m.params
        bits = p["precision_bits"].value
        rows.append(f"| 2^{e} | {m.position_code.family} | {p['k'].value} | {float(p['eta'].value):.4g} | {m.precision} | {bits} | "
                    f"{float(mini.params['eta'].value):.4g} | {mini.precision} | {p['eta_paper'].value:.4g} | "
                    f"{m.d_model} | {m.width} | {3 * n + 9} | {m.parameter_count()} | {m.size_bits(bits)} | {dt:.2f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--alphabet", type=int, default=64)
    ap.add_argument("--min-log-n", type=int, default=6)
    ap.add_argument("--max-log-n", type=int, default=20)
    ap.add_argument("--write", action="store_true", help="replace the table in docs/index-lookup.md")
    a = ap.parse_args()
    md = table(a.alphabet, a.min_log_n, a.max_log_n)
    print(md, flush=True)
    if a.write:
        write_block(Path(__file__).resolve().parents[1] / "docs" / "index-lookup.md", "index-lookup", md)


if __name__ == "__main__":
    main()
