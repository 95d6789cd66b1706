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
cluster's start included (goal: 1-worker / 2-worker wall time >= 1.7). ``schedule``: the schedule
alone, without the machine: the grid on 1 and on 2 *simulated* workers (verify/frontier/run.py's
rules, the pool's priorities, each worker's memory limit the machine's memory over the workers as
dask's "auto" sets it); every job runs once, in this process, and a virtual clock places it on a
worker for its own measured seconds, so both schedules see the same job times, and their makespan
ratio is what 2 free cores would give without the cluster's start; 2 workers run twice, with jobs
run ahead and with the serial rule alone. With ``--cache DIR`` (and ``--code-version V``, that
run's) the jobs' results and seconds are taken from a run's cache, e.g. the default grid's. Grid options:
``--constructions``, ``--arithmetics``, ``--min-log-n``, ``--max-log-n`` (defaults: the frontier's,
the whole default grid), ``--budget`` (default: the frontier's). Every case runs ``--repeats``
times; one JSON object: medians, every run, the load average before and after, the machine.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

import exactformer as xf
from exactformer.verify.distributed.engine import Pool
from exactformer.verify.frontier import run as frontier_run
from exactformer.verify.frontier.grid import DEFAULT_BUDGET, MAX_LOG_N, MIN_LOG_N


RULE = frontier_run.may_run_ahead


class Simulated(Pool):
    """``workers`` virtual workers: a queued job starts when a worker is free (highest priority
    first, then submission order), runs in this process (or is taken from ``memo``, so that every
    schedule sees the same result and seconds) and ends its own seconds later on :attr:`clock`."""

    def __init__(self, workers: int, memory_limit: int, memo: dict[str, Any]):
        self.where, self.workers, self.memory_limit = f"{workers} simulated workers", workers, memory_limit
        self.memo, self.clock, self.count = memo, 0.0, 0
        self.queue: list[tuple[int, int, Callable[[Any], Any], Any, str]] = []
        self.running: list[tuple[float, int, str, Any]] = []

    def submit(self, fn: Callable[[Any], Any], arg: Any, key: str, priority: int = 0) -> None:
        self.count += 1
        heapq.heappush(self.queue, (-priority, self.count, fn, arg, key))

    def share(self, obj: Any) -> Any:
        return obj

    def completed(self, on_killed: Callable[[str, str], Any] | None = None) -> Iterator[tuple[str, Any]]:
        while self.queue or self.running:
            while self.queue and len(self.running) < self.workers:
                _, count, fn, arg, key = heapq.heappop(self.queue)
                if key not in self.memo:
                    self.memo[key] = fn(arg)
                heapq.heappush(self.running, (self.clock + self.memo[key]["seconds"], count, key, self.memo[key]))
            self.clock, _, key, result = heapq.heappop(self.running)
            yield key, result


def _schedule(grid: dict, workers: int, memo: dict[str, Any], ahead: bool) -> dict:
    """The grid on ``workers`` simulated workers, running jobs ahead or not: its makespan on the
    virtual clock."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // workers  # dask's "auto" limit
    sim = Simulated(workers, limit, memo)
    frontier_run.pool = contextmanager(lambda w, s: iter([sim]))
    frontier_run.may_run_ahead = RULE if ahead else (lambda *args: False)
    f = xf.frontier(**grid, cache=False)
    busy = sum(c["seconds"] for chain in f.chains for c in chain.ran())
    return {"makespan_s": sim.clock, "computed": f.computed, "table_job_s": busy, "ran_ahead": f.ran_ahead,
            "table": {(c.name, c.arithmetic): [x["status"] for x in c.ran()] for c in f.chains}}


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
    ap.add_argument("--case", choices=["rerun", "scaling", "schedule"], required=True)
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
    elif a.case == "schedule":
        memo: dict[str, Any] = {}
        if a.cache:  # the results of a run: file name = cache key (verify/frontier/cache.py)
            memo = {f.stem: json.loads(f.read_text()) for f in Path(a.cache).glob("*/*.json")}
        sims = {"1": _schedule(grid, 1, memo, False), "2 serial rule": _schedule(grid, 2, memo, False),
                "2 run ahead": _schedule(grid, 2, memo, True)}
        tables = [sim.pop("table") for sim in sims.values()]
        assert tables[0] == tables[1] == tables[2]  # the serial run's table
        out |= {"runs": sims, "ratio_1_over_2": {k: sims["1"]["makespan_s"] / sims[k]["makespan_s"]
                                                 for k in ("2 serial rule", "2 run ahead")}}
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
