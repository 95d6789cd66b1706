"""Whether a compiled model is right: exhaustive, sampled and certified verification, and reports.

A PASS is either a proof (mode ``certify``: every input) or a stated count of inputs with their
seed (modes ``exhaustive`` and ``sample``). Every report names the first counterexample found.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable

import numpy as np

from exactformer.constructions.ir import CompiledModel, IRError
from exactformer.precision import Format, parse_format
from exactformer.verify.executor import run
from exactformer.verify.tasks import Batch, task_for

MODES = ("certify", "exhaustive", "sample")
EXHAUSTIVE_LIMIT = 1 << 22  # inputs; beyond this exhaustive mode refuses


class VerifyError(ValueError):
    """Bad arguments to :func:`verify` (mode, sample count, an impossible exhaustive run)."""


@dataclass
class Report:
    construction: str
    theorem: str
    n: int
    mode: str
    passed: bool
    inputs_covered: int | str  # "all" for a certificate, else the number of inputs run
    seed: int | None
    precision: str
    precision_bits: int
    eta: str | None
    eta_paper: float | None
    k: int | None
    layers: int
    heads: int
    width: int
    size_bits: int
    seconds: float
    min_margin: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    counterexample: dict | None = None
    reason: str = ""
    details: dict = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _param(model: CompiledModel, key: str):
    p = model.params.get(key)
    return None if p is None else p.value


def _base_report(model: CompiledModel, fmt: Format, mode: str, seed: int | None) -> dict[str, Any]:
    bits = int(getattr(fmt, "bits", 64) or 64)
    eta = _param(model, "eta")
    return dict(
        construction=model.construction,
        theorem=model.theorem,
        n=model.n,
        mode=mode,
        seed=seed,
        precision=fmt.name,
        precision_bits=bits,
        eta=None if eta is None else str(eta),
        eta_paper=_param(model, "eta_paper"),
        k=_param(model, "k"),
        layers=model.n_layers,
        heads=model.n_heads,
        width=model.width,
        size_bits=model.size_bits(bits),
    )


def _check_batches(model: CompiledModel, fmt: Format, batches: Iterable[Batch], device: str,
                   progress: Any = None) -> tuple[int, dict | None, Fraction | None, dict[str, int]]:
    """Run batches; return (inputs run, first counterexample, min margin, summed counts)."""
    covered, cex, min_margin = 0, None, None
    counts: dict[str, int] = {}
    for b in batches:
        res = run(model, b.tokens, fmt, device=device)
        for key, val in res.counts.items():
            counts[key] = counts.get(key, 0) + int(val)
        truth = np.asarray(b.truth).reshape(len(b.truth), -1)  # [B, A]
        if truth.shape != res.margin.shape:
            raise VerifyError(f"the task gives truths of shape {truth.shape} for answers of shape {res.margin.shape}")
        got = np.array([[a if a is not None else -1 for a in row] for row in res.answers]).reshape(truth.shape)
        ok = got == truth
        signed = np.where(ok, res.margin, -res.margin)
        m = Fraction(int(signed.min())) * fmt.step if fmt.is_exact else Fraction(float(signed.min()))
        min_margin = m if min_margin is None else min(min_margin, m)
        covered += len(truth)
        if progress is not None:
            progress(len(truth))
        wrong = np.flatnonzero(~ok.all(axis=1))
        if wrong.size and cex is None:
            i = int(wrong[0])
            a = int(np.flatnonzero(~ok[i])[0])
            cex = {"input": b.example(i), "expected": _plain(b.truth[i]),
                   "got": _plain(res.answers[i] if truth.shape[1] > 1 else res.answers[i][0]),
                   "answer_position": a if truth.shape[1] > 1 else None,
                   "logits": [str(fmt.to_fraction(int(v))) if fmt.is_exact else float(v) for v in res.logits[i, a]]}
            break
    return covered, cex, min_margin, counts


def _plain(v: Any) -> Any:
    """A truth or an answer as plain JSON-able Python values."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    return None if v is None else int(v)


def verify(
    model: CompiledModel,
    mode: str = "certify",
    fmt: Format | str | None = None,
    samples: int = 1000,
    seed: int = 0,
    device: str = "cpu",
    progress: Callable[[int], None] | None = None,
) -> Report:
    """Verify ``model`` under ``fmt`` (default: the precision it was built for).

    ``mode``: "certify" (a proof for all inputs, or a counterexample), "exhaustive" (every input;
    refused above 2^22 inputs) or "sample" (``samples`` random inputs from ``seed`` plus as many
    adversarial ones, see :mod:`exactformer.verify.tasks`).
    """
    if mode not in MODES:
        raise VerifyError(f"mode must be one of {MODES}, got {mode!r}")
    if fmt is None:
        fmt = model.precision or "float64"
    if isinstance(fmt, str):
        fmt = parse_format(fmt)
    task = task_for(model)
    t0 = time.perf_counter()
    base = _base_report(model, fmt, mode, seed if mode == "sample" else None)
    try:
        model.weights_raw(fmt)
    except IRError as e:
        return Report(**base, passed=False, inputs_covered=0, seconds=time.perf_counter() - t0,
                      reason=f"weights not representable: {e}; the model was built for {model.precision} "
                             f"(`--find-min-precision` finds the smallest precision that certifies)")
    if mode == "certify":
        from exactformer.verify.certificates import certify

        cert = certify(model, fmt, device=device)
        return Report(**base, passed=cert.passed, inputs_covered="all" if cert.passed else 0,
                      seconds=time.perf_counter() - t0,
                      min_margin=None if cert.min_margin is None else str(cert.min_margin),
                      counterexample=cert.counterexample, reason=cert.reason, details=cert.details)
    if mode == "exhaustive":
        total = task.count(model)
        if total > EXHAUSTIVE_LIMIT:
            raise VerifyError(f"exhaustive mode: {total} inputs exceed the limit of {EXHAUSTIVE_LIMIT}; use sample or certify")
        batches = task.exhaustive(model)
    else:
        if not isinstance(samples, int) or samples < 1:
            raise VerifyError(f"samples must be an integer >= 1, got {samples!r}")

        def both():
            yield from task.adversarial(model, samples, seed + 1)
            yield from task.sample(model, samples, seed)

        batches = both()
    covered, cex, min_margin, counts = _check_batches(model, fmt, batches, device, progress)
    reason = "counterexample found" if cex else (
        "all inputs correct" if mode == "exhaustive" else f"{covered} inputs correct (seed {seed})")
    return Report(**base, passed=cex is None, inputs_covered=covered, seconds=time.perf_counter() - t0,
                  min_margin=None if min_margin is None else str(min_margin), counts=counts,
                  counterexample=cex, reason=reason)


def counterexample_runner(device: str = "cpu"):
    """A function (model, *task arrays) -> first counterexample dict or None, for certificates."""

    def run_candidates(model: CompiledModel, *arrays: np.ndarray, fmt: Format) -> dict | None:
        task = task_for(model)
        b = task._batch(model, *arrays)
        _, cex, _, _ = _check_batches(model, fmt, [b], device)
        return cex

    return run_candidates
