"""The sizes tables' provider (builders run shapes-only, verify/sizes.formula_size_row) against real
builds (built_size_row), every spec at N = 2^4 .. 2^20 (the test suite checks
N <= 2^8).

Usage: python benchmarks/check_size_formulas.py [--max-log2 20]
Prints every disagreement (none expected), the rows compared and the time; exit code 1 on any.
"""

from __future__ import annotations

import argparse
import sys
import time

from exactformer.verify.bounds import sizes as sz


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-log2", type=int, default=20)
    a = ap.parse_args()
    ns = [1 << e for e in range(4, a.max_log2 + 1)]
    t0, compared, bad = time.perf_counter(), 0, []
    for spec in sz.SIZE_SPECS.values():
        top = [n for n in ns if n <= min(spec.build_max_n, spec.max_n)]
        bad += sz.compare_providers(sz.formula_size_row, sz.built_size_row, [spec], top)
        compared += len(top)
        print(f"{spec.name}: N = 2^4 .. 2^{top[-1].bit_length() - 1} compared ({time.perf_counter() - t0:.0f} s)", flush=True)
    for line in bad:
        print("DISAGREE", line)
    print(f"{compared} (spec, N) rows compared, {len(bad)} disagreements, {time.perf_counter() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
