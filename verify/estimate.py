"""What an exhaustive or sampled run will cost, before it starts, and how far it has come.

Memory is estimated from sizes before anything runs: a batch of the task's inputs
(``Task.batch_inputs`` x ``Task.input_bytes``: inputs generated on demand hold a few bytes, formed
ones their token ids) plus the runner's own estimate for that batch
(:func:`~exactformer.verify.executor.exact.memory_estimate` for the exact executors,
:func:`~exactformer.verify.executor.torch_run.torch_memory` for the exported torch modules) plus
what the process holds already. A run whose estimate exceeds :data:`MEMORY_FRACTION` of the memory
available now is refused before it starts, naming the estimate and the ``samples`` or ``n`` that
would fit (``n`` scaled by the input length). Time is measured, not guessed: :class:`Meter`
counts the inputs done (fractions of an input where an input is long: the recurrent executor
reports each chunk of positions) and, once the run has taken :data:`MEASURE_SECONDS`, states the
time the whole run will take at that rate.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from exactformer.constructions.core.task import Task, format_count
from exactformer.precision import Format
from exactformer.verify.executor.exact import memory_estimate

MEMORY_FRACTION = 0.9  # of the memory available when a run starts that its estimate may take
RUNNER_BUDGET = 1 << 31  # bytes one runner call may hold by its own estimate: larger batches run in parts
MEASURE_SECONDS = 2.0  # the time estimate is stated once the run has taken this long


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (``psutil``: free plus reclaimable)."""
    import psutil  # a dependency of dask.distributed

    return int(psutil.virtual_memory().available)


def held_memory() -> int:
    """Bytes this process holds now (its resident set)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**27 else f"{n / 2**20:.0f} MiB"


def duration(seconds: float) -> str:
    """Seconds as a short duration: 42 s, 3.5 min, 2.1 h, 3.0 days."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


@dataclass
class Estimate:
    """The cost of an exhaustive or sampled run (module docstring)."""

    mode: str
    inputs: int  # the inputs the run checks
    length: int  # tokens per input
    batch: int  # inputs per batch of the task's sources
    input_bytes: int  # bytes one formed input of a batch holds
    runner_bytes: int  # the runner's own estimate for a batch
    held_bytes: int  # what the process holds already
    available_bytes: int  # memory available when estimated
    runner_one: int = 0  # the runner's estimate for one input
    chunk: int = 1  # inputs per runner call (:func:`runner_chunk`): runner_bytes is for a call of this many
    seconds: float | None = None  # the whole run at the rate measured on its first inputs
    measured_on: float | None = None  # inputs the rate was measured on

    @property
    def memory(self) -> int:
        return self.held_bytes + self.batch * self.input_bytes + self.runner_bytes

    def fits(self) -> bool:
        return self.batch * self.input_bytes + self.runner_bytes <= MEMORY_FRACTION * self.available_bytes

    def text(self) -> str:
        return (f"estimate: {format_count(self.inputs)} inputs of {self.length} tokens, about {gib(self.memory)} of "
                f"memory ({gib(self.available_bytes)} available); the time is stated once measured")

    def time_text(self) -> str:
        return (f"estimate: about {duration(self.seconds or 0.0)} for {format_count(self.inputs)} inputs (the rate of "
                f"the first {self.measured_on:.3g})")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"memory": self.memory}


def estimate_run(model: Any, task: Task, mode: str, inputs: int, fmt: Format, arithmetic: str, device: str) -> Estimate:
    """The memory of running ``inputs`` inputs of ``task`` in ``mode`` (module docstring)."""
    T = task.length(model)
    batch = max(1, min(inputs, task.batch_inputs(model)))
    chunk = runner_chunk(model, fmt, arithmetic, device, T, batch)
    return Estimate(mode, inputs, T, batch, task.input_bytes(model), runner_memory(model, fmt, arithmetic, device, T, chunk),
                    held_memory(), available_memory(), runner_memory(model, fmt, arithmetic, device, T, 1), chunk=chunk)


def runner_memory(model: Any, fmt: Format, arithmetic: str, device: str, T: int, batch: int) -> int:
    """The runner's estimate for one batch: the exact executor's, or the exported module's."""
    if arithmetic == "fixed":
        return memory_estimate(model, fmt, T, batch, "cpu" if device == "cpu" else device)
    from exactformer.verify.executor.torch_run import torch_memory  # torch is imported here, when a float run is asked for

    return torch_memory(model, arithmetic, device, T, batch)


def runner_chunk(model: Any, fmt: Format, arithmetic: str, device: str, T: int, batch: int) -> int:
    """Inputs of a batch of ``batch`` per runner call: all of them where the runner's estimate stays
    within :data:`RUNNER_BUDGET`, else the most that do (at least one; a bisection: the estimate
    grows with the inputs). The verifier runs a task's batch in parts of this size, so what the
    runner holds (its logits above all: k-hop's [B, N, N + 1]) is bounded whatever the batch."""
    lo, hi = 1, max(1, batch)
    if runner_memory(model, fmt, arithmetic, device, T, hi) <= RUNNER_BUDGET:
        return hi
    while lo < hi:  # the largest b in [lo, hi] that fits (lo always does, or is 1)
        mid = (lo + hi + 1) // 2
        if runner_memory(model, fmt, arithmetic, device, T, mid) <= RUNNER_BUDGET:
            lo = mid
        else:
            hi = mid - 1
    return lo


def refusal(est: Estimate, n: int) -> tuple[str, str] | None:
    """(parameter, reason) when ``est`` does not fit the memory available, naming the estimate and
    the ``samples`` (a smaller batch) or the ``n`` (shorter inputs, the estimate scaled by the
    length) that would; None when it fits."""
    if est.fits():
        return None
    room = MEMORY_FRACTION * est.available_bytes
    need = est.batch * est.input_bytes + est.runner_bytes
    head = (f"{est.mode}: about {gib(est.memory)} of memory for batches of {est.batch} inputs of {est.length} tokens "
            f"(inputs {gib(est.batch * est.input_bytes)}, runner {gib(est.runner_bytes)}), {gib(est.available_bytes)} "
            f"available")
    if est.mode == "sample" and est.batch > 1:  # a batch of b inputs: b formed inputs, the runner affine in b
        if est.chunk < est.batch:  # the runner runs parts of est.chunk inputs already: only the inputs grow with b
            fit = int((room - est.runner_bytes) // max(1, est.input_bytes)) // 2
        else:
            per = est.input_bytes + max(0, est.runner_bytes - est.runner_one) / (est.batch - 1)
            fit = int((room - est.runner_one + per - est.input_bytes) // per) // 2  # samples s: 2s inputs, batches of up to 2s
        if fit >= 1:
            return "samples", f"{head}; --samples {fit} fits"
    scale = room / need
    k = int(math.floor(math.log2(max(1, n * scale)))) if scale < 1 else None
    fits = f"n <= 2^{k} fits (the estimate scaled with the input length)" if k is not None and k >= 1 else \
        "no input length fits"
    return "n", f"{head}; {fits}"


class Meter:
    """Counts a run's inputs for ``progress`` (fractions allowed) and, once the run has taken
    :data:`MEASURE_SECONDS`, states the time the whole run takes at that rate through ``notice``
    (and into ``estimate.seconds``)."""

    def __init__(self, estimate: Estimate | None, progress: Callable[[float], None] | None,
                 notice: Callable[[str], None] | None):
        self.estimate, self.progress, self.notice = estimate, progress, notice
        self.done, self.t0, self.told = 0.0, time.perf_counter(), estimate is None

    def __call__(self, k: float) -> None:
        self.done += k
        if self.progress is not None:
            self.progress(k)
        elapsed = time.perf_counter() - self.t0
        if not self.told and self.done > 0 and elapsed >= MEASURE_SECONDS:
            self.told = True
            self.estimate.seconds = elapsed * self.estimate.inputs / self.done
            self.estimate.measured_on = self.done
            if self.notice is not None:
                self.notice(self.estimate.time_text())
