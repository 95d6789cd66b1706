"""Certificate time without grid enumeration (goals, 2 CPU cores):

  Index Lookup, N = 2^20, default format            goal <= 1 s
  Index Lookup, N = 2^20, paper:n=1048576,kc=2       goal <= 10 s
  Equality,     N = 2^20, paper:n=1048576,kc=2       goal <= 10 s

Usage: python benchmarks/bench_certify.py [--log-n 20] [--repeat 3]
Prints a Markdown table: build time, then the median certify time of --repeat runs after one
warm-up run (the warm-up's time is printed too: it includes the first-use code tables).
"""

from __future__ import annotations

import argparse
import statistics
import time

import exactformer as xf

CASES = (("index-lookup", None), ("index-lookup", "paper:n={n},kc=2"), ("equality", "paper:n={n},kc=2"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    n = 1 << a.log_n
    print("| construction | N | precision | eta | build s | first certify s | certify s (median) | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for name, precision in CASES:
        kw = {} if precision is None else {"precision": precision.format(n=n)}
        t0 = time.perf_counter()
        m = xf.build(name, n=n, **kw)
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = xf.verify(m, mode="certify")
        first = time.perf_counter() - t0
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            r = xf.verify(m, mode="certify")
            times.append(time.perf_counter() - t0)
        print(f"| {name} | 2^{a.log_n} | `{m.precision}` | {m.params['eta'].value} | {built:.2f} | {first:.2f} | "
              f"{statistics.median(times):.2f} | {'PASS' if r.passed else 'FAIL: ' + str(r.reason)} |", flush=True)


if __name__ == "__main__":
    main()
