"""Whether a compiled model is right: certified, exhaustive and sampled verification, and reports.

A PASS is either a proof (mode ``certify``: every input) or a stated count of inputs with their
seed (modes ``exhaustive`` and ``sample``). A FAIL names the first counterexample found, which the
executor answered wrong; a certificate that can neither prove nor find one says "unproven" and
fails. The verifier never branches on a construction's name: the task comes from the registry.
Constructions that are EMA programs (:class:`~exactformer.constructions.mpc_tasks.ProgramModel`)
have no certificate; they are checked by the four-way differential run of
:mod:`exactformer.verify.mpc_check`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable

import numpy as np

from exactformer.constructions import registry
from exactformer.constructions.ir import CompiledModel, IRError
from exactformer.constructions.mpc_tasks import ProgramModel
from exactformer.constructions.task import Batch, Task
from exactformer.precision import Format, parse_format
from exactformer.verify.certify import certify
from exactformer.verify.executor import run
from exactformer.verify.mpc_check import CheckError, report_fields
from exactformer.verify.torch_run import run_torch

MODES = ("certify", "exhaustive", "sample")
EXHAUSTIVE_LIMIT = 1 << 22  # inputs; beyond this exhaustive mode refuses

#: what each event count means (reports carry this next to the numbers)
COUNTS_MEANING = {
    "saturations": "results clipped to the format's range (the forward pass's exact semantics include them)",
    "underflows": "nonzero exact results that rounded to 0 -- expected wherever a construction relies on "
                  "small attention weights rounding away; they are not errors (the verdict is the answers)",
}


class VerifyError(ValueError):
    """Bad arguments to :func:`verify` (mode, sample count, an impossible exhaustive run)."""


@dataclass
class Report:
    construction: str
    theorem: str
    n: int
    mode: str
    passed: bool
    inputs_covered: int | str  # "all" for a proof, else the number of inputs run
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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.counts:
            out["counts_meaning"] = {k: COUNTS_MEANING[k] for k in self.counts if k in COUNTS_MEANING}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), default=str)


def _param(model: CompiledModel, key: str):
    p = model.params.get(key)
    return None if p is None else p.value


def _base(model: CompiledModel, fmt: Format, mode: str, seed: int | None) -> dict[str, Any]:
    bits = int(getattr(fmt, "bits", 64) or 64)
    eta = _param(model, "eta")
    return dict(construction=model.construction, theorem=model.theorem, n=model.n, mode=mode, seed=seed,
                precision=fmt.name, precision_bits=bits, eta=None if eta is None else str(eta),
                eta_paper=_param(model, "eta_paper"), k=_param(model, "k"), layers=model.n_layers,
                heads=model.n_heads, width=model.width, size_bits=model.size_bits(bits))


ARITHMETICS = ("fixed", "real", "float64", "float32")


def _runner(fmt: Format, arithmetic: str, device: str) -> Callable[[CompiledModel, np.ndarray], Any]:
    """How inputs are run: the exact executor under ``fmt`` ("fixed"), or the exported torch module
    in float64 / float32 (the real arithmetic's closest runnable arithmetic is float64)."""
    if arithmetic == "fixed":
        return lambda model, tokens: run(model, tokens, fmt, device=device)
    dtype = "float32" if arithmetic == "float32" else "float64"
    return lambda model, tokens: run_torch(model, tokens, dtype)


def check_batches(model: CompiledModel, fmt: Format, batches: Iterable[Batch], device: str = "cpu",
                  progress: Callable[[int], None] | None = None,
                  arithmetic: str = "fixed") -> tuple[int, dict | None, Fraction | None, dict[str, int]]:
    """Run batches; return (inputs run, first counterexample, min signed margin, summed counts)."""
    covered, cex, min_margin = 0, None, None
    counts: dict[str, int] = {}
    runner = _runner(fmt, arithmetic, device)
    exact = arithmetic == "fixed" and fmt.is_exact
    for b in batches:
        res = runner(model, b.tokens)
        for key, val in res.counts.items():
            counts[key] = counts.get(key, 0) + int(val)
        truth = np.asarray(b.truth).reshape(len(b), -1)  # [B, A]
        if truth.shape != res.margin.shape:
            raise VerifyError(f"the task gives truths of shape {truth.shape} for answers of shape {res.margin.shape}")
        got = np.array([[a if a is not None else -1 for a in row] for row in res.answers]).reshape(truth.shape)
        ok = got == truth
        signed = np.where(ok, res.margin, -res.margin)
        m = Fraction(int(signed.min())) * fmt.step if exact else Fraction(float(signed.min()))
        min_margin = m if min_margin is None else min(min_margin, m)
        covered += len(truth)
        if progress is not None:
            progress(len(truth))
        wrong = np.flatnonzero(~ok.all(axis=1))
        if wrong.size:
            i = int(wrong[0])
            a = int(np.flatnonzero(~ok[i])[0])
            multi = truth.shape[1] > 1
            cex = {"input": b.example(i), "expected": _plain(b.truth[i]),
                   "got": _plain(res.answers[i] if multi else res.answers[i][0]),
                   "answer_position": int(model.answer_positions_for(b.tokens.shape[1])[a]) if multi else None,
                   "logits": [str(fmt.to_fraction(int(v))) if exact else float(v) for v in res.logits[i, a]],
                   "arithmetic": fmt.name if arithmetic == "fixed" else arithmetic}
            break
    return covered, cex, min_margin, counts


def _plain(v: Any) -> Any:
    """A truth or an answer as plain JSON-able values."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    return None if v is None else int(v)


def counterexample_runner(fmt: Format, device: str = "cpu", arithmetic: str = "fixed") -> Callable[[CompiledModel, Batch], dict | None]:
    """For certificates: run one batch of candidate inputs, return the first wrong answer or None."""

    def run_candidates(model: CompiledModel, batch: Batch) -> dict | None:
        return check_batches(model, fmt, [batch], device, arithmetic=arithmetic)[1]

    return run_candidates


def verify(model: Any, mode: str = "certify", fmt: Format | str | None = None, samples: int = 1000, seed: int = 0,
           device: str = "cpu", progress: Callable[[int], None] | None = None,
           phase: Callable[[str], None] | None = None, arithmetic: str = "fixed") -> Report:
    """Verify ``model`` under ``fmt`` (default: the precision it was built for).

    ``mode``: "certify" (a proof for all inputs, or a counterexample), "exhaustive" (every input;
    refused above 2^22 inputs) or "sample" (``samples`` seeded random inputs plus as many
    adversarial ones, see the task). ``arithmetic``: "fixed" (the exact executor under ``fmt``),
    or "float32" / "float64" / "real": the model as torch runs its exported weights (certificates:
    rigorous float error bounds; sampling and exhaustive: the torch module itself).
    ``progress(n)`` is called with the inputs done per batch, ``phase(name)`` with each
    certificate step."""
    model = getattr(model, "compiled", model)
    if isinstance(model, ProgramModel):  # an EMA-program construction: the four-way differential check
        if arithmetic != "fixed":
            raise VerifyError(f"arithmetic: an EMA program has no weights to run in {arithmetic}; only fixed applies")
        if mode not in MODES:
            raise VerifyError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        try:
            return Report(**report_fields(model, mode, fmt, samples, seed, device, progress))
        except CheckError as e:
            raise VerifyError(str(e)) from None
    if not isinstance(model, CompiledModel):
        raise VerifyError(f"model must be a built construction (xf.build / xf.load), got {type(model).__name__}")
    if mode not in MODES:
        raise VerifyError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if arithmetic not in ARITHMETICS:
        raise VerifyError(f"arithmetic must be one of {', '.join(ARITHMETICS)}, got {arithmetic!r}")
    if fmt is None:
        fmt = model.precision or "float64"
    if isinstance(fmt, str):
        fmt = parse_format(fmt)
    task: Task = registry.task_of(model)
    t0 = time.perf_counter()
    base = _base(model, fmt, mode, seed if mode == "sample" else None)
    if arithmetic != "fixed":
        base["precision"], base["precision_bits"] = arithmetic, {"float32": 32}.get(arithmetic, 64)
    elif not fmt.is_exact:
        arithmetic = fmt.name  # a float format given as fmt: the same as that arithmetic
    try:
        if arithmetic == "fixed":
            model.weights_raw(fmt)
    except IRError as e:
        return Report(**base, passed=False, inputs_covered=0, seconds=time.perf_counter() - t0,
                      reason=f"weights not representable: {e}; the model was built for {model.precision}")
    if mode == "certify":
        cert = certify(model, fmt, task, device=device,
                       run_candidates=counterexample_runner(fmt, device, arithmetic), progress=phase,
                       arithmetic=arithmetic)
        return Report(**base, passed=cert.passed, inputs_covered="all" if cert.passed else 0,
                      seconds=time.perf_counter() - t0,
                      min_margin=None if cert.min_margin is None else str(cert.min_margin),
                      counterexample=cert.counterexample, reason=cert.reason, details=cert.details)
    if mode == "exhaustive":
        total = task.count(model)
        if total > EXHAUSTIVE_LIMIT:
            raise VerifyError(f"exhaustive mode: {total} inputs exceed the limit of {EXHAUSTIVE_LIMIT}; use sample or certify")
        batches: Iterable[Batch] = task.exhaustive(model)
    else:
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise VerifyError(f"samples must be an integer >= 1, got {samples!r}")

        def both() -> Iterable[Batch]:
            yield from task.adversarial(model, samples, seed + 1)
            yield from task.sample(model, samples, seed)

        batches = both()
    covered, cex, min_margin, counts = check_batches(model, fmt, batches, device, progress, arithmetic)
    reason = "counterexample found" if cex else (
        "all inputs correct" if mode == "exhaustive" else
        f"{covered} inputs correct ({samples} sampled with seed {seed}, the rest adversarial with seed {seed + 1})")
    return Report(**base, passed=cex is None, inputs_covered=covered, seconds=time.perf_counter() - t0,
                  min_margin=None if min_margin is None else str(min_margin), counts=counts,
                  counterexample=cex, reason=reason)


def certified_arithmetics(model: Any, device: str = "cpu") -> dict[str, list[str]]:
    """Certify ``model`` in its fixed-point format and in float64 and float32 (the arithmetics a
    saved model is run in): ``{"certified": [names], "not_certified": [names]}`` for the manifest,
    the fixed-point format under its own name."""
    model = getattr(model, "compiled", model)
    out: dict[str, list[str]] = {"certified": [], "not_certified": []}
    for arithmetic in ("fixed", "float64", "float32"):
        if arithmetic == "fixed" and not (model.precision and parse_format(model.precision).is_exact):
            continue
        r = verify(model, mode="certify", device=device, arithmetic=arithmetic)
        name = model.precision if arithmetic == "fixed" else arithmetic
        out["certified" if r.passed else "not_certified"].append(name)
    return out
