"""``frontier(...)``: the grid of :mod:`exactformer.verify.frontier.grid` run on the engine of
:mod:`exactformer.verify.distributed.engine`, results read from and written to the cache.

Every chain's first job is submitted at once; each result is written to the cache as it arrives
and the chain's next job is submitted then, so jobs of many chains run side by side and a chain
stops at its first N that is not certified. Cached results are used without running anything (no
cluster is started when every needed result is cached), so an interrupted run resumes where it
stopped and a re-run computes only what changed.
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
from exactformer.verify.frontier.grid import (DEFAULT_BUDGET, MAX_LOG_N, MIN_LOG_N, Chain, check_arithmetics,
                                              check_budget, check_constructions, check_log_n, check_params)
from exactformer.verify.frontier.jobs import run_job

#: ``progress(event)`` events: {"done": job result, "cached": bool, "total": jobs the grid may still need}
Progress = Callable[[dict[str, Any]], None]


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

    def advance(chain: Chain) -> Any:
        """Take the chain's cached results; the next job to run (None: none)."""
        nonlocal cached
        while True:
            n = chain.next_n(budget)
            if n is None:
                return None
            hit = store.get(chain.job(n))
            if hit is None:
                return chain.job(n)
            chain.cells[n] = hit
            cached += 1
            notify({"done": hit, "cached": True, "total": remaining()})

    todo = [(chain, job) for chain in chains if (job := advance(chain)) is not None]
    where = "nothing run: every result was cached"
    if todo:
        by_key = {}
        with pool(workers, scheduler) as jobs:
            where = jobs.where
            for chain, job in todo:
                key = store.key(job)
                by_key[key] = (chain, job)
                jobs.submit(run_job, job.to_dict(), key, priority=-job.n.bit_length())
            for key, result in jobs.completed():
                chain, job = by_key.pop(key)
                if result["status"] != "error":  # an error (a bug, memory) is run again next time
                    store.put(job, result)
                chain.cells[job.n] = result
                computed += 1
                notify({"done": result, "cached": False, "total": remaining()})
                nxt = advance(chain)
                if nxt is not None:
                    k = store.key(nxt)
                    by_key[k] = (chain, nxt)
                    jobs.submit(run_job, nxt.to_dict(), k, priority=-nxt.n.bit_length())
    return Frontier(chains, ns, budget, version, computed, cached, time.perf_counter() - t0, where,
                    None if root is None else str(root), {name: registry.get(name).theorem for name in names})
