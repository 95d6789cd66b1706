"""Independent jobs on dask.distributed, or in this process.

:func:`pool` gives a :class:`Pool`: ``submit(fn, arg, key)`` queues a job, ``completed()`` yields
``(key, result)`` as jobs finish (jobs submitted while iterating included), in any order;
``share(obj)`` sends a large argument (a model) to every worker once, and jobs take the handle it
returns in place of the object (anywhere in their argument). Where the jobs run:

* ``scheduler`` (or the environment variable ``DASK_SCHEDULER_ADDRESS``): a running dask
  scheduler, e.g. ``tcp://10.0.0.5:8786``; its workers need exactformer installed;
* otherwise ``workers`` >= 1 (default: the machine's cores): an embedded ``LocalCluster`` of that
  many single-threaded worker processes, started and stopped with the pool;
* ``workers=0``: this process, one job at a time, in submission order (the serial reference).

A job whose worker dies (killed, out of memory) is resubmitted, up to :data:`RETRIES` times, by
the scheduler (``distributed.scheduler.allowed-failures`` on the embedded cluster) and by the pool
itself when the scheduler gives up (``KilledWorker``), so no result is lost. A job function must
catch its own errors and return them as results: an exception raised by one is re-raised here.
"""

from __future__ import annotations

import logging
import os
import re
from abc import ABC, abstractmethod
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from exactformer.verify.errors import VerifyError

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
RETRIES = 3  # a job's resubmissions after its worker died
_ADDRESS = re.compile(r"^(tcp|tls|ucx|ws|wss|inproc)://[^\s/]+$")


def check_workers(workers: Any) -> int | None:
    """None (the machine's cores), 0 (this process) or a number of worker processes >= 1."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise VerifyError("workers", f"must be an integer >= 0 (0: this process, no cluster), got {workers!r}")
    return workers


def check_scheduler(scheduler: Any) -> str | None:
    """None, or a dask scheduler's address such as tcp://HOST:PORT."""
    if scheduler is not None and (not isinstance(scheduler, str) or not _ADDRESS.match(scheduler.strip())):
        raise VerifyError("scheduler", f"must be a dask scheduler address such as tcp://HOST:PORT, got {scheduler!r}")
    return None if scheduler is None else scheduler.strip()


def default_workers() -> int:
    """The machine's cores (those this process may use)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class Pool(ABC):
    """Jobs submitted by key, results yielded as they finish (see the module docstring).
    ``where`` says where they run; ``workers`` is how many run at once; ``memory_limit`` the least
    memory limit of a worker in bytes (None: none is known)."""

    where: str
    workers: int
    memory_limit: int | None

    @abstractmethod
    def submit(self, fn: Callable[[Any], Any], arg: Any, key: str, priority: int = 0) -> None:
        """Queue ``fn(arg)`` under ``key`` (unique among the pool's pending jobs); higher ``priority``
        first where the pool orders its queue."""

    @abstractmethod
    def completed(self, on_killed: Callable[[str, str], Any] | None = None) -> Iterator[tuple[str, Any]]:
        """``(key, result)`` of every job as it finishes, jobs submitted while iterating included.
        A job whose worker died more than :data:`RETRIES` times raises ``KilledWorker`` here, or,
        with ``on_killed``, yields ``(key, on_killed(key, reason))`` and the others go on (a
        job that always takes more memory than a worker has becomes one result, not the end of
        the run)."""

    @abstractmethod
    def share(self, obj: Any) -> Any:
        """A handle to ``obj`` that jobs receive as ``obj`` itself."""


class InProcess(Pool):
    """Every job in this process, in submission order (highest ``priority`` first)."""

    def __init__(self) -> None:
        self.where, self.workers, self.memory_limit = "this process", 1, None
        self._queue: deque[tuple[int, int, Callable[[Any], Any], Any, str]] = deque()
        self._count = 0

    def submit(self, fn: Callable[[Any], Any], arg: Any, key: str, priority: int = 0) -> None:
        self._count += 1
        self._queue.append((-priority, self._count, fn, arg, key))

    def share(self, obj: Any) -> Any:
        return obj

    def completed(self, on_killed: Callable[[str, str], Any] | None = None) -> Iterator[tuple[str, Any]]:
        while self._queue:  # no worker to lose: on_killed is never called
            item = min(self._queue)
            self._queue.remove(item)
            _, _, fn, arg, key = item
            yield key, fn(arg)


class DaskPool(Pool):
    """Jobs as futures of a dask ``Client``; a ``KilledWorker`` job resubmitted (up to RETRIES)."""

    def __init__(self, client: Any, where: str):
        from distributed import as_completed

        self.client, self.where = client, where
        info = client.scheduler_info(n_workers=-1).get("workers", {})
        self.workers = max(1, len(info))
        limits = [w.get("memory_limit") or 0 for w in info.values()]  # 0: a worker without a limit
        self.memory_limit = min(limits) if limits and min(limits) > 0 else None
        self._done = as_completed([], with_results=False)
        self._jobs: dict[Any, tuple[Callable[[Any], Any], Any, str, int, int]] = {}

    def submit(self, fn: Callable[[Any], Any], arg: Any, key: str, priority: int = 0, tries: int = 0) -> None:
        future = self.client.submit(fn, arg, key=f"{key}-{tries}", priority=priority, pure=False)
        self._jobs[future.key] = (fn, arg, key, priority, tries)
        self._done.add(future)

    def share(self, obj: Any) -> Any:
        return self.client.scatter(obj, broadcast=True, hash=False)

    def completed(self, on_killed: Callable[[str, str], Any] | None = None) -> Iterator[tuple[str, Any]]:
        from distributed import KilledWorker

        for future in self._done:
            fn, arg, key, priority, tries = self._jobs.pop(future.key)
            try:
                result = future.result()
            except KilledWorker as e:
                if tries < RETRIES:
                    self.submit(fn, arg, key, priority, tries + 1)
                    continue
                if on_killed is None:
                    raise
                result = on_killed(key, f"its worker died in each of its {tries + 1} submissions ({e})")
            finally:
                future.release()
            yield key, result


@contextmanager
def pool(workers: int | None = None, scheduler: str | None = None) -> Iterator[Pool]:
    """Where jobs run (module docstring): a scheduler's address, an embedded LocalCluster of
    ``workers`` processes, or this process (``workers=0``). Arguments are checked first."""
    workers, scheduler = check_workers(workers), check_scheduler(scheduler)
    address = scheduler or (os.environ.get(SCHEDULER_ENV) or "").strip() or None
    if address is None and workers == 0:
        yield InProcess()
        return
    import dask
    from distributed import Client, LocalCluster

    with dask.config.set({"distributed.scheduler.allowed-failures": RETRIES}):
        if address is not None:
            try:
                client = Client(check_scheduler(address), timeout="30s")
            except OSError as e:
                raise VerifyError("scheduler", f"no dask scheduler answers at {address}: {e}") from None
            with client:
                yield DaskPool(client, f"the dask scheduler at {address}")
            return
        n = workers or default_workers()
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield DaskPool(client, f"an embedded LocalCluster of {n} worker process{'es' if n > 1 else ''}")
