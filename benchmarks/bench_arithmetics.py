"""Certificate time per arithmetic: the default builds of Index Lookup, Equality and
Threshold at N = 2^16 and 2^20, certified in their fixed-point format, exact reals, float64 and
float32.

Usage: python benchmarks/bench_arithmetics.py [--log-n 16 20] [--repeat 3]
Prints a Markdown table (median of --repeat runs, after one warm-up run per model) for
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import exactformer as xf

ARITHMETICS = ("fixed", "real", "float64", "float32")
CONSTRUCTIONS = ("index-lookup", "equality", "threshold")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log-n", type=int, nargs="+", default=[16, 20])
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("| construction | N | precision | eta | " + " | ".join(f"{x} s" for x in ARITHMETICS) + " |")
    print("|---|---|---|---|" + "---|" * len(ARITHMETICS))
    for name in CONSTRUCTIONS:
        for e in a.log_n:
            m = xf.build(name, n=1 << e)
            cells = []
            for arithmetic in ARITHMETICS:
                r = xf.verify(m, mode="certify", arithmetic=arithmetic)  # warm-up (plans, code tables)
                times = []
                for _ in range(a.repeat):
                    t0 = time.perf_counter()
                    r = xf.verify(m, mode="certify", arithmetic=arithmetic)
                    times.append(time.perf_counter() - t0)
                cells.append(f"{statistics.median(times):.2f}" + ("" if r.passed else " (FAIL)"))
            print(f"| {name} | 2^{e} | {m.precision} | {float(m.params['eta'].value):.4g} | " + " | ".join(cells) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
