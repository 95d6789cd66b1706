"""The smt mode (docs/smt.md) beside certify and exhaustive, and its goals (2 CPU cores):

  smt proves the default Index Lookup (|Sigma| = 64) at N = 64        goal <= 60 s
  smt proves Equality at N = 128                                        goal <= 60 s
  smt refutes a weight mutant with a replayed counterexample at N = 8   goal <= 10 s

Usage:
  python benchmarks/bench_smt.py goals [--repeat 3]
  python benchmarks/bench_smt.py table [--repeat 3] [--budget 300]

``goals``: the median of --repeat runs of each goal (every run printed: the first also builds the
executor's plan and the torch module a counterexample is replayed through), plus every weight
mutant of the default Index Lookup at N = 8 (tests/mutants.py) that smt refutes: the largest and
median time to its replayed counterexample (each mutant a new model: nothing cached). ``table``: N against seconds for smt, certify and exhaustive on the same models
(median of --repeat runs; exhaustive only where its 2^22-input limit allows, smt with a budget of
--budget seconds: "unknown" past it). Each row prints as it is measured, with the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import exactformer as xf
from exactformer.constructions.core.ir import ExactTensor
from exactformer.verify.verifier import VerifyError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mutants import weight_mutants  # noqa: E402  (the tests' mutants: one definition)

TABLE = (("index-lookup", dict(alphabet=4), (4, 8, 16, 32, 64, 128)),
         ("equality", {}, (4, 8, 16, 32, 64, 128, 256)),
         ("equality-rnn", {}, (4, 8, 16, 32, 64, 128)),
         ("k-hop", dict(k=3, alphabet=3), (4, 6, 8, 10)),
         ("match2", {}, (2, 4, 8)))


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def timed(fn, repeat: int):
    """(median seconds, last result) of ``repeat`` calls."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def cell(model, mode: str, repeat: int, budget: float) -> str:
    kw = {"smt_timeout": budget} if mode == "smt" else {}
    try:
        s, r = timed(lambda: xf.verify(model, mode=mode, **kw), repeat)
    except VerifyError as e:
        return "refused" if "limit" in str(e) else f"n/a ({e.reason[:40]})"
    verdict = "PASS" if r.passed else ("unknown" if r.reason.startswith("unknown") else "FAIL")
    return f"{s:.2f} ({verdict})"


def table(repeat: int, budget: float) -> None:
    print("| construction | N | smt s | certify s | exhaustive s | load |")
    print("|---|---|---|---|---|---|")
    for name, kw, ns in TABLE:
        for n in ns:
            m = xf.build(name, n=n, **kw)
            cells = [cell(m, mode, repeat, budget) for mode in ("smt", "certify", "exhaustive")]
            print(f"| {name} {kw or ''} | {n} | {' | '.join(cells)} | {load()} |", flush=True)


def goals(repeat: int) -> None:
    print("| goal | model | median s (runs) | result | load |")
    print("|---|---|---|---|---|")
    for what, name, n, limit in (("prove", "index-lookup", 64, 60), ("prove", "equality", 128, 60)):
        m = xf.build(name, n=n)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            r = xf.verify(m, mode="smt")
            times.append(time.perf_counter() - t0)
        print(f"| {what} in <= {limit} s | {name}, N = {n}, `{m.precision}` | **{statistics.median(times):.2f}** "
              f"({', '.join(f'{t:.2f}' for t in times)}) | {'PASS' if r.passed else r.reason} | {load()} |", flush=True)
    m = xf.build("index-lookup", n=8).compiled
    b_U = m.b_U
    weak = m.replace_weight("unembed.b_U", ExactTensor(b_U.num + np.r_[3, np.zeros(b_U.shape[0] - 1, np.int64)] * b_U.den,
                                                       b_U.den))
    times = []
    for _ in range(repeat):  # the first run also builds the executor's plan and the torch module for the replay
        t0 = time.perf_counter()
        r = xf.verify(weak, mode="smt")
        times.append(time.perf_counter() - t0)
    cex = r.counterexample or {}
    result = (f"FAIL with {cex.get('input')}, replayed wrong by the executor (torch float64 wrong: "
              f"{cex.get('torch_float64', {}).get('wrong')})" if cex else r.reason)
    print(f"| refute in <= 10 s | index-lookup, N = 8, b_U[0] + 3 | **{statistics.median(times):.2f}** "
          f"({', '.join(f'{t:.2f}' for t in times)}) | {result} | {load()} |", flush=True)
    refuted, proved = [], 0
    for _, mutant in weight_mutants(m, seed=0):
        t0 = time.perf_counter()
        r = xf.verify(mutant, mode="smt")
        if r.passed:
            proved += 1
        elif r.counterexample is not None:
            refuted.append(time.perf_counter() - t0)
    print(f"| refute in <= 10 s | every weight mutant of index-lookup, N = 8 (tests/mutants.py, seed 0) | "
          f"**max {max(refuted):.2f}**, median {statistics.median(refuted):.2f} | {len(refuted)} refuted with replayed "
          f"counterexamples, {proved} proved | {load()} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("goals", "table"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", type=float, default=300.0)
    a = ap.parse_args()
    print(f"load average at the start: {load()}")
    if a.what == "goals":
        goals(a.repeat)
    else:
        table(a.repeat, a.budget)


if __name__ == "__main__":
    main()
