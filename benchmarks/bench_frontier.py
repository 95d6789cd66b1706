"""The precision frontier on dask (docs/precision-frontier.md; results in docs/benchmarks.md).

Usage:
  python benchmarks/bench_frontier.py --case rerun   [--cache DIR] [--repeats 5] [grid options]
  python benchmarks/bench_frontier.py --case scaling [--repeats 2] [grid options]

``rerun``: ``xf.frontier`` on a grid every result of which is in ``--cache`` (run it once first,
e.g. ``exactformer frontier --cache DIR``): the wall time of a re-run with nothing changed (goal
<= 10 s for the default grid), with the number of results read and computed. ``--code-version V``
pins the code version to V, the one the cache was written with (the ``code_version`` of that
run's JSON): on a tree others edit meanwhile, the re-run then reads that run's results as if no
source had changed (the digest of the sources is still computed, then replaced).
``scaling``: the same grid without a cache on an embedded LocalCluster of 1 and of 2 workers, the
cluster's start included (goal: 1-worker / 2-worker wall time >= 1.7). Grid options:
``--constructions``, ``--arithmetics``, ``--min-log-n``, ``--max-log-n`` (defaults: the frontier's,
the whole default grid), ``--budget`` (default: the frontier's). Every case runs ``--repeats``
times; one JSON object: medians, every run, the load average before and after, the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

import exactformer as xf
from exactformer.verify.frontier.grid import DEFAULT_BUDGET, MAX_LOG_N, MIN_LOG_N


def _run(grid: dict, **kw) -> dict:
    t0 = time.perf_counter()
    f = xf.frontier(**grid, **kw)
    wall = time.perf_counter() - t0
    busy = sum(c["seconds"] for chain in f.chains for c in chain.ran() if c.get("seconds") is not None)
    # sum_job_s: the jobs' own seconds (read from the cache: as first computed); over wall_s: jobs at a time
    # ran_ahead: jobs run ahead of their chains, and those of them whose result joined the table
    return {"wall_s": wall, "computed": f.computed, "cached": f.cached, "where": f.where, "sum_job_s": busy,
            "jobs_at_a_time": busy / wall, "ran_ahead": f.ran_ahead}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["rerun", "scaling"], required=True)
    ap.add_argument("--constructions", default=None)
    ap.add_argument("--arithmetics", default=None)
    ap.add_argument("--min-log-n", type=int, default=MIN_LOG_N)
    ap.add_argument("--max-log-n", type=int, default=MAX_LOG_N)
    ap.add_argument("--budget", type=float, default=DEFAULT_BUDGET)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--code-version", default=None)
    a = ap.parse_args()
    if a.code_version:
        from exactformer.verify.frontier import run as frontier_run

        digest = frontier_run.code_version
        frontier_run.code_version = lambda: (digest(), a.code_version)[1]
    grid = dict(constructions=a.constructions, arithmetics=a.arithmetics, min_log_n=a.min_log_n,
                max_log_n=a.max_log_n, budget=a.budget)
    out: dict = {"case": a.case, "grid": grid, "code_version_pinned": a.code_version, "machine": _machine(), "load_before": os.getloadavg()}
    if a.case == "rerun":
        runs = [_run(grid, workers=2, cache=a.cache or True) for _ in range(a.repeats or 5)]
        out |= {"runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in runs)}
    else:
        runs = {w: [] for w in (1, 2)}
        for _ in range(a.repeats or 2):
            for w in (1, 2):  # interleaved: a change of the machine's load falls on both
                runs[w].append(_run(grid, workers=w, cache=False))
        med = {w: statistics.median(r["wall_s"] for r in rs) for w, rs in runs.items()}
        out |= {"runs": runs, "median_wall_s": med, "ratio_1_over_2": med[1] / med[2]}
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
