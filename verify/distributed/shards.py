"""Exhaustive and sampled verification sharded over the engine's workers.

**Exhaustive.** The task's enumeration (``task.exhaustive``, batches in a fixed order) is dealt
round-robin to the shards: shard s of S runs the batches b = s, s + S, s + 2S, ... (it draws every
batch of the enumeration, which is cheap next to running it, and runs its own) and stops at its
first wrong answer. Each shard returns one summary per batch it ran; the summaries are merged in
enumeration order up to the first batch with a wrong answer, exactly as the single-process run
(:func:`~exactformer.verify.verifier.check_batches`) stops there: the same inputs covered, the
same counterexample, minimum margin and event counts, for any number of workers.

**Sample.** ``samples`` random inputs in shards of :data:`SHARD_SAMPLES`: shard i draws
``task.adversarial(count_i, seed_i')`` and ``task.sample(count_i, seed_i)`` with its own seeds,
``seed_i = SeedSequence([seed, i])`` and ``seed_i' = SeedSequence([seed + 1, i])`` (the first word
of each), so the inputs depend on the seed and the shard, never on the workers. Merged in shard
order like the batches above.

The model travels to each worker once (``Pool.share``); every batch runs as
:func:`~exactformer.verify.verifier.check_batches` runs it.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.verify.distributed.engine import pool

SHARD_SAMPLES = 1 << 12  # random inputs per sample shard (and as many adversarial ones)
SHARDS_PER_WORKER = 2  # exhaustive shards per worker (a slow shard does not hold the others up)


def shard_seed(seed: int, shard: int) -> int:
    """The seed of ``shard``'s random inputs: the first word of ``SeedSequence([seed, shard])``."""
    return int(np.random.SeedSequence([seed, shard]).generate_state(1)[0])


def _summaries(model: Any, fmt: Any, batches: Any, device: str, arithmetic: str, keep: Callable[[int], bool],
               check: Callable) -> list[dict[str, Any]]:
    """One summary per kept batch (by its index in ``batches``), up to the first wrong answer."""
    out = []
    for i, b in enumerate(batches):
        if not keep(i):
            continue
        covered, cex, margin, counts = check(model, fmt, [b], device, arithmetic=arithmetic)
        out.append({"index": i, "covered": covered, "counterexample": cex, "counts": counts,
                    "min_margin": None if margin is None else str(margin)})
        if cex is not None:
            break
    return out


def run_shard(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """A worker's share (see the module docstring): ``spec`` holds the model, its format name, the
    arithmetic, the device, the mode, the model's task, the batch runner ``check`` (the verifier's
    ``check_batches``) and the shard (exhaustive: ``shard`` of ``shards``; sample: ``shard``, ``count``, ``seed``)."""
    from exactformer.precision import parse_format

    model, fmt = spec["model"], parse_format(spec["fmt"])
    task = spec["task"]
    if spec["mode"] == "exhaustive":
        s, S = spec["shard"], spec["shards"]
        return _summaries(model, fmt, task.exhaustive(model), spec["device"], spec["arithmetic"], lambda i: i % S == s,
                          spec["check"])

    def both() -> Any:
        yield from task.adversarial(model, spec["count"], shard_seed(spec["seed"] + 1, spec["shard"]))
        yield from task.sample(model, spec["count"], shard_seed(spec["seed"], spec["shard"]))

    return _summaries(model, fmt, both(), spec["device"], spec["arithmetic"], lambda i: True, spec["check"])


def merge(parts: list[tuple[tuple[int, int], dict[str, Any]]]) -> tuple[int, dict | None, Fraction | None, dict[str, int]]:
    """The batch summaries, keyed by their place in the enumeration, merged in that order up to the
    first wrong answer: (inputs covered, counterexample, minimum margin, event counts)."""
    covered, cex, margin = 0, None, None
    counts: dict[str, int] = {}
    for _, s in sorted(parts, key=lambda p: p[0]):
        covered += s["covered"]
        for k, v in s["counts"].items():
            counts[k] = counts.get(k, 0) + int(v)
        if s["min_margin"] is not None:
            m = Fraction(s["min_margin"])
            margin = m if margin is None else min(margin, m)
        if s["counterexample"] is not None:
            cex = s["counterexample"]
            break
    return covered, cex, margin, counts


def sharded(model: Any, fmt: Any, mode: str, samples: int, seed: int, device: str, arithmetic: str,
            workers: int | None, scheduler: str | None,
            progress: Callable[[int], None] | None = None, *,
            task: Any, check: Callable) -> tuple[int, dict | None, Fraction | None, dict[str, int], str]:
    """``mode`` (exhaustive or sample) of ``model`` and its ``task`` over the engine's workers: what ``check`` (the verifier's
    :func:`~exactformer.verify.verifier.check_batches`, passed down: the verifier imports this module,
    never the other way round) returns, and how it was sharded (a phrase)."""
    with pool(workers, scheduler) as jobs:
        shared = jobs.share(model)
        base = {"model": shared, "fmt": fmt.name, "device": device, "arithmetic": arithmetic, "mode": mode,
                "task": task, "check": check}
        if mode == "exhaustive":
            S = max(1, jobs.workers * SHARDS_PER_WORKER)
            for s in range(S):
                jobs.submit(run_shard, base | {"shard": s, "shards": S}, f"exhaustive-{s}")
            how = f"in {S} shards (batch b in shard b mod {S}) on {jobs.where}"
        else:
            S = math.ceil(samples / SHARD_SAMPLES)
            for s in range(S):
                count = min(SHARD_SAMPLES, samples - s * SHARD_SAMPLES)
                jobs.submit(run_shard, base | {"shard": s, "count": count, "seed": seed}, f"sample-{s}")
            how = (f"in {S} shard{'s' if S > 1 else ''} of up to {SHARD_SAMPLES} (shard i: seeds SeedSequence([{seed}, i]) "
                   f"and, adversarial, SeedSequence([{seed + 1}, i])) on {jobs.where}")
        parts = []
        for key, summaries in jobs.completed():
            s = int(key.rsplit("-", 1)[1])
            for b in summaries:
                # exhaustive: the batch's place in the enumeration; sample: (shard, batch within it)
                parts.append(((b["index"], 0) if mode == "exhaustive" else (s, b["index"]), b))
                if progress is not None:
                    progress(b["covered"])
    covered, cex, margin, counts = merge(parts)
    return covered, cex, margin, counts, how
