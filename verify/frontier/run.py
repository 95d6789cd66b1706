"""``frontier(...)``: the grid of :mod:`exactformer.verify.frontier.grid` run on the engine of
:mod:`exactformer.verify.distributed.engine`, results read from and written to the cache.

Every chain's first job is submitted at once; each result is written to the cache as it arrives
and the chain's next job is submitted then, so jobs of many chains run side by side and a chain
stops at its first N that is not certified. Cached results are used without running anything (no
cluster is started when every needed result is cached), so an interrupted run resumes where it
stopped and a re-run computes only what changed.

**Running ahead.** Run that way, a chain's jobs run one after another, and at the end of the grid
one long chain runs alone while the other workers idle. With more than one worker, a chain
therefore also runs its next N ahead, while its current one runs, at a lower priority than every
job a chain waits for, when three rules allow it:

* time: the job the chain waits for is predicted (:meth:`~exactformer.verify.frontier.grid.Chain.predicted`)
  to take at most the budget / :data:`~exactformer.verify.frontier.grid.GROWTH` ^ 2;
* memory (:func:`may_run_ahead`): the job's predicted peak memory (:func:`predicted_peak`, from the
  memory its chain's last jobs took, which every result records) is at most :data:`SAFETY` times a
  worker's memory limit, and with the largest predictions of the other jobs that may run beside it
  (one per other worker) at most SAFETY times the workers' limits together. A job whose memory
  cannot be predicted (its chain has no result yet; no memory limit is known) does not run ahead.
  Without this rule the default grid's workers were killed for memory (docs/benchmarks.md);
* at most one job per chain runs ahead, the N right after the one it waits for.

A job run ahead is cached when it ends; its result joins the chain only when the serial rule
reaches that N (an error run ahead, which may be the memory of the jobs beside it, is dropped and
the job runs again then), so the table is the serial run's; a result the chain never reaches is
only cached. :attr:`Frontier.ran_ahead` counts the jobs run ahead and those of them whose result
joined the table (when it ended before the chain reached it, or later: the chain then waits for it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from exactformer.constructions.core import registry
from exactformer.verify.distributed.engine import check_scheduler, check_workers, pool
from exactformer.verify.frontier import report
from exactformer.verify.frontier.cache import Cache, code_version, default_dir
from exactformer.verify.frontier.grid import (DEFAULT_BUDGET, GROWTH, MAX_LOG_N, MIN_LOG_N, Chain,
                                              check_arithmetics, check_budget, check_constructions, check_log_n,
                                              check_params)
from exactformer.verify.frontier.jobs import run_job

#: ``progress(event)`` events: {"done": job result, "cached": bool, "total": jobs the grid may still need}
Progress = Callable[[dict[str, Any]], None]

SAFETY = 0.5  # the share of the workers' memory limits that jobs run ahead may be predicted to fill
MEMORY_GROWTH = 2.0  # the least growth of a job's own memory per doubling of N that the prediction assumes
MEMORY_FLOOR = 32 << 20  # bytes: a job's own memory before the last one counts as at least this
AHEAD = 64  # how far below the priorities of the jobs chains wait for (-log2 N - 1) jobs run ahead are


def predicted_peak(chain: Chain, steps: int) -> int | None:
    """The predicted peak resident bytes of the chain's job ``steps`` N past its last result: the
    last job's memory at its start plus its own memory (peak minus start) times g^steps, where g is
    its own memory's growth over the job before (at least :data:`MEMORY_GROWTH`; the one before
    counted as at least :data:`MEMORY_FLOOR` bytes, so that noise on small jobs predicts no
    blow-up). None before the chain has a result. Only the schedule reads this: no result depends
    on it, so it lives here, outside the sources of the cache's code version."""
    ran = chain.ran()
    if not ran:
        return None

    def own(c: dict[str, Any]) -> int:
        return c["peak_rss"] - (c["rss_start"] or 0)  # no start known: the whole peak is the job's

    last = ran[-1]
    growth = MEMORY_GROWTH if len(ran) < 2 else max(MEMORY_GROWTH, own(last) / max(own(ran[-2]), MEMORY_FLOOR))
    return int((last["rss_start"] or 0) + own(last) * growth ** steps)


def may_run_ahead(peak: int | None, beside: list[int | None], workers: int, memory_limit: int | None) -> bool:
    """Whether a job predicted to peak at ``peak`` bytes may run ahead on ``workers`` workers of
    ``memory_limit`` bytes each while the jobs predicted at ``beside`` are pending (submitted, not
    finished; None: not predicted, counted as a worker's share SAFETY * memory_limit): it fits on
    its worker, peak <= SAFETY * memory_limit, and with the workers - 1 largest of ``beside`` (the
    most that can run beside it) the workers' memory, peak + those <= SAFETY * memory_limit * workers.
    Never on one worker, and never when the peak or the limit is unknown (None)."""
    if workers < 2 or memory_limit is None or peak is None:
        return False
    share = SAFETY * memory_limit
    others = sorted((share if b is None else b for b in beside), reverse=True)[:workers - 1]
    return peak <= share and peak + sum(others) <= share * workers


@dataclass
class Frontier:
    """The result of :func:`frontier`: the chains (with every job's result), how they were computed,
    and the tables (:meth:`to_dict`, :meth:`to_csv`, :meth:`to_markdown`)."""

    chains: list[Chain]
    ns: list[int]
    budget: float
    code_version: str
    computed: int
    cached: int
    seconds: float
    where: str
    cache_dir: str | None
    theorems: dict[str, str] = field(default_factory=dict)
    #: jobs run ahead of their chains (module docstring): how many ran, how many joined the table
    ran_ahead: dict[str, int] = field(default_factory=lambda: {"run": 0, "joined": 0})

    def to_dict(self) -> dict[str, Any]:
        return report.to_dict(self)

    def to_json(self) -> str:
        import json

        return json.dumps(self.to_dict(), default=str)

    def to_csv(self) -> str:
        return report.to_csv(self)

    def to_markdown(self) -> str:
        return report.to_markdown(self)


def frontier(constructions: Any = None, arithmetics: Any = None, min_log_n: int = MIN_LOG_N,
             max_log_n: int = MAX_LOG_N, workers: int | None = None, scheduler: str | None = None,
             budget: float = DEFAULT_BUDGET, cache: str | Path | None | bool = True, params: Any = None,
             progress: Progress | None = None) -> Frontier:
    """The precision frontier of ``constructions`` (names or "a,b"; None: all) in ``arithmetics``
    (of :data:`~exactformer.verify.frontier.grid.ARITHMETICS`; None: all) over N = 2^min_log_n ..
    2^max_log_n. ``workers``/``scheduler``: where jobs run (:func:`~exactformer.verify.distributed.engine.pool`:
    default an embedded LocalCluster on the machine's cores, ``workers=0`` this process).
    ``budget``: seconds a job may be predicted to take (:mod:`~exactformer.verify.frontier.grid`).
    ``cache``: True (the default directory, :func:`~exactformer.verify.frontier.cache.default_dir`),
    a directory, or False/None (no cache). ``params``: builder keywords per construction.
    ``progress(event)`` is called for every result (cached ones first). Bad arguments raise
    :class:`~exactformer.verify.verifier.VerifyError` naming the parameter."""
    t0 = time.perf_counter()
    names = check_constructions(constructions)
    ariths = check_arithmetics(arithmetics)
    lo, hi = check_log_n(min_log_n, max_log_n)
    budget = check_budget(budget)
    keywords = check_params(params, names)
    check_workers(workers)
    check_scheduler(scheduler)
    root = default_dir() if cache is True else (Path(cache) if cache else None)
    version = code_version()
    store = Cache(root, version)
    ns = [1 << j for j in range(lo, hi + 1)]
    chains = [Chain(name, keywords[name], a, ns) for name in names for a in ariths]
    notify = progress or (lambda event: None)
    cached = computed = 0

    def remaining() -> int:
        return sum(len(c.ns) - len(c.ran()) for c in chains if c.stop(budget) is None)

    ahead: dict[str, dict[str, Any]] = {}  # results run ahead that their chain has not reached yet
    counts = {"run": 0, "joined": 0}

    def advance(chain: Chain) -> Any:
        """Take the chain's cached results and results run ahead; the next job to run (None: none)."""
        nonlocal cached
        while True:
            n = chain.next_n(budget)
            if n is None:
                return None
            job = chain.job(n)
            early = ahead.pop(store.key(job), None)
            hit = early if early is not None else store.get(job)
            if hit is None:
                return job
            chain.cells[n] = hit
            cached += early is None
            counts["joined"] += early is not None
            notify({"done": hit, "cached": early is None, "total": remaining()})

    todo = [(chain, job) for chain in chains if (job := advance(chain)) is not None]
    where = "nothing run: every result was cached"
    if todo:
        # key -> (chain, job, run ahead, predicted peak bytes) of every job submitted and not finished
        running: dict[str, tuple[Chain, Any, bool, int | None]] = {}
        submitted: dict[str, float] = {}  # when each job was first submitted (a killed job's seconds)
        with pool(workers, scheduler) as jobs:
            where = jobs.where

            def submit(chain: Chain, job: Any) -> None:
                """Run ``job``, which its chain waits for, and the chain's next N ahead of it where the
                rules of the module docstring allow."""
                key = store.key(job)
                if key in running:  # it runs ahead already: the chain now waits for it
                    counts["joined"] += 1
                else:
                    jobs.submit(run_job, job.to_dict(), key, priority=-job.n.bit_length())
                    submitted[key] = time.perf_counter()
                running[key] = (chain, job, False, predicted_peak(chain, 1))
                i = chain.ns.index(job.n) + 1
                if jobs.workers < 2 or i >= len(chain.ns) or chain.predicted() * GROWTH * GROWTH > budget:
                    return
                nxt = chain.job(chain.ns[i])
                k = store.key(nxt)
                if k in running or k in ahead or store.get(nxt) is not None:
                    return
                peak = predicted_peak(chain, 2)
                if may_run_ahead(peak, [p for *_, p in running.values()], jobs.workers, jobs.memory_limit):
                    running[k] = (chain, nxt, True, peak)
                    counts["run"] += 1
                    jobs.submit(run_job, nxt.to_dict(), k, priority=-nxt.n.bit_length() - AHEAD)
                    submitted[k] = time.perf_counter()

            for chain, job in todo:
                submit(chain, job)
            def killed(key: str, why: str) -> dict[str, Any]:
                """A job whose workers kept dying (out of memory): an error cell, its chain stops; its
                seconds are those from its submission to the last death."""
                return running[key][1].to_dict() | {"status": "error", "reason": f"not computed: {why}",
                                                    "seconds": time.perf_counter() - submitted[key]}

            for key, result in jobs.completed(on_killed=killed):
                chain, job, early, _ = running.pop(key)
                computed += 1
                if result["status"] != "error":  # an error (a bug, memory) is run again next time
                    store.put(job, result)
                if early:  # its chain takes it when (if) it reaches that N; an error runs again then
                    if result["status"] != "error":
                        ahead[key] = result
                    continue
                chain.cells[job.n] = result
                notify({"done": result, "cached": False, "total": remaining()})
                nxt = advance(chain)
                if nxt is not None:
                    submit(chain, nxt)
    return Frontier(chains, ns, budget, version, computed, cached, time.perf_counter() - t0, where,
                    None if root is None else str(root), {name: registry.get(name).theorem for name in names},
                    counts)
