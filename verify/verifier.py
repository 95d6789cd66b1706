"""Whether a compiled model is right: certified, exhaustive and sampled verification, and reports.

A PASS is either a proof (modes ``certify`` and ``smt``: every input) or a stated count of inputs
with their seed (modes ``exhaustive`` and ``sample``). A FAIL names the first counterexample found,
which the executor answered wrong; a certificate that can neither prove nor find one says "unproven" and
fails. The verifier never branches on a construction's name or kind: the task comes from the
registry, the certificate composes the blocks' own local certificates.

Which modes a construction has is declared by its task (``task.modes``,
:class:`~exactformer.constructions.core.task.Task`); without a ``mode`` the verifier uses the
strongest one that applies (:func:`choose_mode`) and the report says why (``mode_reason``). The
smt mode (:mod:`exactformer.verify.smt`, z3 installed) is a second prover for any model it encodes,
whatever its task declares. Every
argument has one check here (``check_*``) that the CLI uses too; a bad one raises
:class:`VerifyError` naming the parameter.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import CompiledModel, IRError, ModelIR, fixed_point_only_heads
from exactformer.constructions.core.task import EXHAUSTIVE_LIMIT, Batch, Task, count_log2, format_count, inputs_phrase
from exactformer.precision import NO_CUDA, Format, cuda_available, float_format, parse_format
from exactformer.verify.certify.composed import SEARCH_SECONDS, certify
from exactformer.verify.errors import VerifyError
from exactformer.verify.estimate import Meter, estimate_run, refusal, runner_chunk
from exactformer.verify.executor.exact import run

DEFAULT_SAMPLES = 1000  # sample mode's random inputs (plus as many adversarial ones) when none are given
DEVICES = ("cpu", "cuda")
#: what each mode covers, for the reports
COVERS = {"certify": "a proof for every input", "exhaustive": "every input run",
          "smt": "a proof for every input by an SMT solver (z3)", "sample": "seeded random and adversarial inputs"}
#: the modes :func:`verify` takes, strongest first: the tasks' (``task.modes``) and smt, which any model it encodes has
VERIFY_MODES = ("certify", "exhaustive", "smt", "sample")

#: what each event count means (reports carry this next to the numbers)
COUNTS_MEANING = {
    "saturations": "results clipped to the format's range (the forward pass's exact semantics include them)",
    "underflows": "nonzero exact results that rounded to 0 -- expected wherever a construction relies on "
                  "small attention weights rounding away; they are not errors (the verdict is the answers)",
}


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
    mode_reason: str | None = None  # why this mode, when none was asked for (:func:`choose_mode`)
    samples: int | None = None  # sample mode: the random inputs asked for (the rest of inputs_covered: adversarial)
    input_count: str = ""  # the number of distinct inputs, short (:func:`format_count`)
    input_count_log2: float | None = None  # its log2 (None: too many to count)
    d_mlp: int = 0  # the most MLP hidden units of a layer: not in the width (P1's max(m, d)), shown beside it

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
                heads=model.n_heads, width=model.width, d_mlp=model.d_mlp, size_bits=model.size_bits(bits))


#: the float dtypes torch runs the exported model in (and the certificates enclose, precision/boxes.py)
FLOAT_DTYPES = ("float64", "float32", "bfloat16", "float16")
ARITHMETICS = ("fixed", "real") + FLOAT_DTYPES


def arithmetic_bits(arithmetic: str) -> int:
    """Bits of one number in a float arithmetic (64 for the exact reals, run in float64)."""
    return float_format(arithmetic).bits if arithmetic in FLOAT_DTYPES else 64


def _runner(fmt: Format, arithmetic: str, device: str) -> Callable[..., Any]:
    """How inputs are run: the exact executor under ``fmt`` ("fixed"), or the exported torch module
    in a float dtype on ``device`` (the real arithmetic's closest runnable arithmetic is float64);
    ``runner(model, tokens, progress)``."""
    if arithmetic == "fixed":
        return lambda model, tokens, progress=None: run(model, tokens, fmt, device=device, progress=progress)
    from exactformer.verify.executor.torch_run import run_torch  # torch is imported here, when a float run is asked for

    dtype = arithmetic if arithmetic in FLOAT_DTYPES else "float64"
    return lambda model, tokens, progress=None: run_torch(model, tokens, dtype, device, progress)


def check_batches(model: CompiledModel, fmt: Format, batches: Iterable[Batch], device: str = "cpu",
                  progress: Callable[[int], None] | None = None,
                  arithmetic: str = "fixed") -> tuple[int, dict | None, Fraction | None, dict[str, int]]:
    """Run batches; return (inputs run, first counterexample, min signed margin, summed counts).
    A batch is run in parts of :func:`~exactformer.verify.estimate.runner_chunk` inputs (the run's
    estimate counts one part)."""
    covered, cex, min_margin = 0, None, None
    counts: dict[str, int] = {}
    runner = _runner(fmt, arithmetic, device)
    exact = arithmetic == "fixed" and fmt.is_exact
    chunks: dict[tuple[int, int], int] = {}
    for b in batches:
        T = int(np.shape(b.tokens)[1])
        truth = np.asarray(b.truth).reshape(len(b), -1)  # [B, A]
        if (T, len(b)) not in chunks:
            chunks[T, len(b)] = runner_chunk(model, fmt, arithmetic, device, T, len(b))
        step = chunks[T, len(b)]
        for s in range(0, len(b), step):
            ticked = [0.0]  # inputs of this part the runner reported (fractions where an input is long)

            def tick(k: float) -> None:
                ticked[0] += k
                progress(k)

            res = runner(model, b.tokens if step >= len(b) else b.tokens[s : s + step], None if progress is None else tick)
            for key, val in res.counts.items():
                counts[key] = counts.get(key, 0) + int(val)
            part = truth[s : s + step]
            if part.shape != res.margin.shape:
                raise VerifyError("model", f"its task gives truths of shape {part.shape} for answers of shape "
                                           f"{res.margin.shape}")
            got = np.array([[a if a is not None else -1 for a in row] for row in res.answers]).reshape(part.shape)
            ok = (got == part) & (np.asarray(res.margin) > 0)  # a tie is never right: torch's argmax picks the lowest index
            signed = np.where(ok, res.margin, -res.margin)
            m = Fraction(int(signed.min())) * fmt.step if exact else Fraction(float(signed.min()))
            min_margin = m if min_margin is None else min(min_margin, m)
            covered += len(part)
            if progress is not None and len(part) > ticked[0]:
                progress(len(part) - ticked[0])
            wrong = np.flatnonzero(~ok.all(axis=1))
            if wrong.size:
                j = int(wrong[0])
                i, a = s + j, int(np.flatnonzero(~ok[j])[0])
                multi = truth.shape[1] > 1
                cex = {"input": b.example(i), "expected": _plain(b.truth[i]),
                       "got": _plain(res.answers[j] if multi else res.answers[j][0]),
                       "answer_position": int(model.answer_positions_for(T)[a]) if multi else None,
                       "logits": [str(fmt.to_fraction(int(v))) if exact else float(v) for v in res.logits[j, a]],
                       "arithmetic": fmt.name if arithmetic == "fixed" else arithmetic}
                return covered, cex, min_margin, counts
    return covered, cex, min_margin, counts


def _plain(v: Any) -> Any:
    """A truth or an answer as plain JSON-able values, exactly: integers and booleans as themselves,
    a float as itself, a Fraction as its text ("1/2"; never rounded to an integer)."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return [_plain(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Fraction):
        return v.numerator if v.denominator == 1 else f"{v.numerator}/{v.denominator}"
    return str(v)


def counterexample_runner(fmt: Format, device: str = "cpu", arithmetic: str = "fixed") -> Callable[[CompiledModel, Batch], dict | None]:
    """For certificates: run one batch of candidate inputs, return the first wrong answer or None."""

    def run_candidates(model: CompiledModel, batch: Batch) -> dict | None:
        return check_batches(model, fmt, [batch], device, arithmetic=arithmetic)[1]

    return run_candidates


# ---- the arguments: one check each, used by xf.verify and the CLI ----------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_model(model: Any) -> CompiledModel:
    """The built model behind ``model`` (an ``xf.Model`` or a compiled model)."""
    model = getattr(model, "compiled", model)
    if not isinstance(model, ModelIR):
        raise VerifyError("model", f"must be a built construction (xf.build / xf.load), got {type(model).__name__}")
    return model


def check_mode(mode: str | None) -> str | None:
    """A mode name (or None: the strongest the construction has, :func:`choose_mode`)."""
    if mode is not None and mode not in VERIFY_MODES:
        raise VerifyError("mode", f"must be one of {' | '.join(VERIFY_MODES)}, got {mode!r}")
    return mode


def check_smt_timeout(seconds: float | None) -> float | None:
    """The smt mode's time budget in seconds: a number > 0 (None: :data:`~exactformer.verify.smt.DEFAULT_TIMEOUT`)."""
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating))
                                or not 0 < seconds < float("inf")):
        raise VerifyError("smt_timeout", f"must be a number of seconds > 0, got {seconds!r}")
    return None if seconds is None else float(seconds)


def check_arithmetic(arithmetic: str) -> str:
    """One of :data:`ARITHMETICS` (fixed: the exact executor; the others: the torch forward pass)."""
    if arithmetic not in ARITHMETICS:
        raise VerifyError("arithmetic", f"must be one of {' | '.join(ARITHMETICS)}, got {arithmetic!r}")
    return arithmetic


def check_device(device: str) -> str:
    """cpu, or cuda where a CUDA device is available."""
    if device not in DEVICES:
        raise VerifyError("device", f"must be one of {' | '.join(DEVICES)}, got {device!r}")
    if device == "cuda" and not cuda_available():
        raise VerifyError("device", NO_CUDA)
    return device


def check_samples(samples: int | None) -> int | None:
    """The number of random inputs of sample mode: an integer >= 1 (None: :data:`DEFAULT_SAMPLES`)."""
    if samples is not None and (not _is_int(samples) or samples < 1):
        raise VerifyError("samples", f"must be an integer >= 1, got {samples!r}")
    return None if samples is None else int(samples)


def check_seed(seed: int | None) -> int | None:
    """The seed of sample mode's random inputs: an integer >= 0 (None: 0)."""
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise VerifyError("seed", f"must be an integer >= 0, got {seed!r}")
    return None if seed is None else int(seed)


def check_fmt(fmt: Format | str | None) -> Format | None:
    """A number format or its name (None: the one the model was built for)."""
    if isinstance(fmt, str):
        try:
            return parse_format(fmt)
        except ValueError as e:
            raise VerifyError("fmt", str(e)) from None
    if fmt is not None and not isinstance(fmt, Format):
        raise VerifyError("fmt", f"must be a number format or its name, got {type(fmt).__name__}")
    return fmt


def check_search_seconds(seconds: Any) -> float:
    """The counterexample search's time budget in seconds: a number >= 0 (None: the default)."""
    if seconds is None:
        return SEARCH_SECONDS
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, Fraction)) or not 0 <= seconds < float("inf"):
        raise VerifyError("search_seconds", f"must be a number of seconds >= 0, got {seconds!r}")
    return float(seconds)


def check_sharding(mode: str | None, workers: Any, scheduler: Any) -> bool:
    """Whether a run is sharded over dask workers (``workers`` or ``scheduler`` given: an integer >= 0,
    an address tcp://HOST:PORT); only exhaustive and sample runs are, so ``mode`` must be one."""
    if workers is None and scheduler is None:
        return False
    from exactformer.verify.distributed.engine import check_scheduler, check_workers

    check_workers(workers)
    check_scheduler(scheduler)
    if mode not in ("exhaustive", "sample"):
        given = "workers" if workers is not None else "scheduler"
        raise VerifyError(given, "shards exhaustive and sample runs only: give mode exhaustive or sample"
                                 + ("" if mode is None else f" (this run's mode is {mode})"))
    return True


def check_sampling(mode: str, samples: int | None, seed: int | None) -> tuple[int, int]:
    """(samples, seed) for a run in ``mode``: given values apply to sample mode only."""
    given = [name for name, value in (("samples", samples), ("seed", seed)) if value is not None]
    if given and mode != "sample":
        raise VerifyError(given[0], f"only with mode sample (this run's mode is {mode}: {COVERS[mode]})")
    return DEFAULT_SAMPLES if samples is None else samples, 0 if seed is None else seed


def smt_refusal(model: Any, arithmetic: str, fmt: Format | None = None) -> str | None:
    """Why the smt mode does not cover ``model`` (z3 missing, a float arithmetic, a model or task it
    does not encode: :func:`exactformer.verify.smt.refusal`), or None."""
    from exactformer.verify import smt

    model = check_model(model)
    return smt.refusal(model, task_of(model), arithmetic, fmt)


def task_of(model: CompiledModel) -> Task:
    """The task of a built model: its declared modes and input count (VerifyError naming the
    model's ``construction`` where no registered construction has that name)."""
    try:
        return registry.task_of(model)
    except registry.UnknownConstruction:
        raise VerifyError("model", f"its construction {model.construction!r} is not registered (registered: "
                                   f"{', '.join(registry.names())})") from None


#: the exhaustive limit of a run sharded over workers (``workers`` or ``scheduler`` given)
SHARDED_EXHAUSTIVE_LIMIT = 1 << 32


def exhaustive_refusal(task: Task, model: CompiledModel, limit: int = EXHAUSTIVE_LIMIT) -> str | None:
    """Why exhaustive mode refuses ``model`` (more than ``limit`` inputs: :data:`EXHAUSTIVE_LIMIT`,
    or :data:`SHARDED_EXHAUSTIVE_LIMIT` sharded), or None."""
    count = task.count(model)
    if count <= limit:
        return None
    others = " | ".join(m for m in task.modes if m != "exhaustive")
    # the sharding hint only where sharding would reach the inputs
    shard = (f"; sharded (workers, scheduler) up to {format_count(SHARDED_EXHAUSTIVE_LIMIT)}"
             if limit < SHARDED_EXHAUSTIVE_LIMIT and count <= SHARDED_EXHAUSTIVE_LIMIT else "")
    return (f"exhaustive: {model.construction} at N = {model.n} has {inputs_phrase(count, model.n)}, above "
            f"the limit of {format_count(limit)}" + shard + (f"; use {others}" if others else ""))


def lacks(name: str, mode: str) -> str:
    """That construction ``name`` does not have ``mode``, in words."""
    return f"no certificate for {name}" if mode == "certify" else f"no {mode} mode for {name}"


def certificate_refusal(model: Any, arithmetic: str) -> str | None:
    """Why no certificate covers ``model`` run in ``arithmetic`` (a head of its plan whose block is
    certified in fixed point only: :func:`~exactformer.constructions.core.ir.fixed_point_only_heads`,
    the one source the manifest and ``params["arithmetics"]`` read too), or None. It only steers the
    choice of a mode; the certificate itself never trusts the plan."""
    model = check_model(model)
    only = [] if arithmetic == "fixed" else fixed_point_only_heads(model.plan)
    if not only:
        return None
    return (f"no certificate for {model.construction} in {arithmetic}: its {', '.join(only)} heads are certified "
            "in fixed point only")


def choose_mode(task: Task, model: CompiledModel, mode: str | None, sharded: bool = False,
                arithmetic: str = "fixed", fmt: Format | None = None, smt_default: bool = True) -> tuple[str, str | None]:
    """The mode to run and, when none was asked for, why it was chosen. ``mode`` given: itself if the
    task declares it (``task.modes``; smt: if :func:`smt_refusal` has no objection) and, for
    exhaustive, the inputs fit :data:`EXHAUSTIVE_LIMIT` (``sharded``: :data:`SHARDED_EXHAUSTIVE_LIMIT`)
    and, for certify, a certificate covers the model in ``arithmetic`` (:func:`certificate_refusal`);
    else :class:`VerifyError` naming the modes it has. ``mode`` None: the strongest mode that
    applies -- certify, else exhaustive where the inputs fit :data:`EXHAUSTIVE_LIMIT`, else smt where
    z3 is installed, it encodes the model and the model is small enough
    (:func:`exactformer.verify.smt.estimate` at most :data:`~exactformer.verify.smt.ESTIMATE_LIMIT`),
    else sample (``smt_default`` False: not smt -- samples or a seed were given)."""
    name, model = model.construction, check_model(model)
    gap = certificate_refusal(model, arithmetic)
    if mode == "smt":
        refusal = smt_refusal(model, arithmetic, fmt)
        if refusal:
            raise VerifyError("mode", refusal)
        return mode, None
    if mode is not None:
        if mode not in task.modes:
            raise VerifyError("mode", f"{lacks(name, mode)}; its modes: {' | '.join(task.modes)}")
        if mode == "certify" and gap:
            raise VerifyError("mode", f"{gap}; its other modes: {' | '.join(m for m in task.modes if m != mode)}")
        limit = SHARDED_EXHAUSTIVE_LIMIT if sharded else EXHAUSTIVE_LIMIT
        refusal = exhaustive_refusal(task, model, limit) if mode == "exhaustive" else None
        if refusal:
            raise VerifyError("mode", refusal)
        return mode, None
    skipped = []
    for m in VERIFY_MODES:
        if m == "smt":
            why, size = (None, None) if sharded or not smt_default else _smt_skip(model, task, arithmetic, fmt)
            if size is not None:
                from exactformer.verify.smt import ESTIMATE_LIMIT

                return m, "; ".join(skipped + [f"smt: {COVERS[m]}; its size estimate {size:.3g} is within the "
                                               f"default's limit {ESTIMATE_LIMIT:.3g}"])
            skipped += [why] if why else []
        elif m not in task.modes:
            skipped.append(lacks(name, m))
        elif m == "certify" and gap:
            skipped.append(gap)
        elif m == "exhaustive" and exhaustive_refusal(task, model):
            skipped.append(f"{inputs_phrase(task.count(model), model.n)}, above the exhaustive limit of "
                           f"{format_count(EXHAUSTIVE_LIMIT)}")
        else:
            strongest = "" if skipped else "the strongest mode, "
            return m, "; ".join(skipped + [f"{m}: {strongest}{COVERS[m]}"])
    raise VerifyError("mode", f"{name}: none of its modes ({' | '.join(task.modes)}) applies ({'; '.join(skipped)})")


def _smt_skip(model: Any, task: Task, arithmetic: str, fmt: Format | None) -> tuple[str | None, int | None]:
    """(why the default does not run smt, None) or (None, the size estimate): not installed, not
    encoded, or larger than :data:`~exactformer.verify.smt.ESTIMATE_LIMIT`."""
    from exactformer.verify import smt

    if not smt.available():
        return None, None  # not installed: the default is what it was without it
    refusal = smt.refusal(model, task, arithmetic, fmt)
    if refusal:
        return refusal, None
    size = smt.estimate(model, task)
    if size > smt.ESTIMATE_LIMIT:
        return f"smt: its size estimate {size:.3g} is above the default's limit {smt.ESTIMATE_LIMIT:.3g}", None
    return None, size


# ---- verification ------------------------------------------------------------------------------------------------


def verify(model: Any, mode: str | None = None, fmt: Format | str | None = None, samples: int | None = None,
           seed: int | None = None, device: str = "cpu", progress: Callable[[float], None] | None = None,
           phase: Callable[[str], None] | None = None, arithmetic: str = "fixed", workers: int | None = None,
           scheduler: str | None = None, search_seconds: float | None = None, smt_timeout: float | None = None,
           notice: Callable[[str], None] | None = None) -> Report:
    """Verify ``model`` under ``fmt`` (default: the precision it was built for).

    ``mode``: "certify" (a proof for all inputs, or a counterexample), "exhaustive" (every input;
    refused above 2^22 inputs), "smt" (a proof for all inputs by z3, or a counterexample replayed
    through the executor, or "unknown" when ``smt_timeout`` seconds run out -- a failure; docs/smt.md)
    or "sample" (``samples`` seeded random inputs, default 1000, plus as many adversarial ones, see
    the task); a mode the construction does not declare is refused (smt: one it does not encode).
    None (the default): the strongest mode it has (:func:`choose_mode`), and the report's
    ``mode_reason`` says why; smt chosen so runs for at most ``smt_timeout`` (default 60 s) and
    samples if that runs out; certify chosen so that is unproven without a counterexample is
    followed by exhaustive where the inputs fit :data:`EXHAUSTIVE_LIMIT` (not for "real", nor
    with a ``search_seconds``, which asks for certify). ``samples`` and ``seed`` apply to sample mode only,
    ``smt_timeout`` (seconds, default 600 with mode smt) to smt.
    ``arithmetic``: "fixed" (the exact executor under ``fmt``), "real", or a float dtype of
    :data:`FLOAT_DTYPES` (float64, float32, bfloat16, float16): the model as torch runs its exported
    weights on the CPU (certificates: rigorous float error bounds, docs/precision.md "Float
    arithmetics"; sampling and exhaustive: the torch module itself). ``device``: cpu or cuda.
    ``workers`` / ``scheduler``: shard an exhaustive or sampled run over dask workers
    (:mod:`exactformer.verify.distributed.shards`: an embedded LocalCluster of ``workers``
    processes, 0 for this process, or the scheduler at ``scheduler``); exhaustive then runs up to
    2^32 inputs with the single-process result, sample draws its inputs per shard (seeds from
    ``seed`` and the shard, the same for any number of workers).
    ``search_seconds``: the time budget of certify's counterexample search when a proof step fails
    (default :data:`~exactformer.verify.certify.composed.SEARCH_SECONDS`; the report says what it ran).
    ``progress(n)`` is called with the inputs done (per batch, or fractions of an input where
    inputs are long), ``phase(name)`` with each certificate step (``xf.verify`` and ``m.verify``
    show a bar by default: :func:`shown_progress`). An exhaustive or sampled run in this process
    estimates its memory first (:mod:`exactformer.verify.estimate`) and is refused
    (:class:`VerifyError` naming ``samples`` or ``n`` and the estimate) where it would not fit the
    memory available; ``notice(line)`` is given the estimate, and the time the run takes once
    measured on its first inputs; the report's ``details["estimate"]`` holds both. Every bad
    argument raises :class:`VerifyError` naming it."""
    model = check_model(model)
    check_mode(mode)
    check_arithmetic(arithmetic)
    check_device(device)
    fmt = check_fmt(fmt)
    budget = check_search_seconds(search_seconds)
    task = task_of(model)
    malformed = _malformed(model, task)
    if malformed is not None:
        return malformed
    shard = check_sharding(mode, workers, scheduler)
    smt_timeout = check_smt_timeout(smt_timeout)
    if smt_timeout is not None and mode not in (None, "smt"):
        raise VerifyError("smt_timeout", f"only with mode smt (this run's mode is {mode}: {COVERS[mode]})")
    mode, why = choose_mode(task, model, mode, shard, arithmetic if fmt is None or fmt.is_exact else fmt.name, fmt,
                            smt_default=samples is None and seed is None)
    samples, seed = check_sampling(mode, check_samples(samples), check_seed(seed))
    if search_seconds is not None and mode != "certify":
        raise VerifyError("search_seconds", f"only with mode certify (this run's mode is {mode}: {COVERS[mode]})")
    count = task.count(model)
    extra = dict(mode_reason=why, samples=samples if mode == "sample" else None,
                 input_count=format_count(count, model.n), input_count_log2=count_log2(count))
    fmt = fmt or parse_format(model.precision or "float64")
    t0 = time.perf_counter()
    base = _base(model, fmt, mode, seed if mode == "sample" else None) | extra
    if arithmetic != "fixed":
        base["precision"], base["precision_bits"] = arithmetic, arithmetic_bits(arithmetic)
    elif not fmt.is_exact:
        arithmetic = fmt.name  # a float format given as fmt: the same as that arithmetic
    try:
        if arithmetic == "fixed":
            model.weights_raw(fmt)
    except IRError as e:
        return Report(**base, passed=False, inputs_covered=0, seconds=time.perf_counter() - t0,
                      reason=f"weights not representable: {e}; the model was built for {model.precision}")
    if mode == "smt":
        from exactformer.verify import smt

        smt_budget = smt_timeout or (smt.DEFAULT_TIMEOUT if why is None else smt.DEFAULT_CHOICE_TIMEOUT)
        try:
            out = smt.prove(model, fmt, task, smt_budget, phase)
        except IRError as e:
            return Report(**base, passed=False, inputs_covered=0, seconds=time.perf_counter() - t0,
                          reason=f"weights not representable: {e}; the model was built for {model.precision}")
        if out.status != "unknown" or why is None:
            return Report(**base, passed=out.passed, inputs_covered="all" if out.passed else 0,
                          seconds=time.perf_counter() - t0, counterexample=out.counterexample, reason=out.reason,
                          details=out.details)
        mode, samples, seed = "sample", DEFAULT_SAMPLES, 0  # chosen by default and out of time: sampled instead
        why = f"{why}; {out.reason}; sample: {COVERS['sample']}"
        base |= _base(model, fmt, mode, seed) | dict(mode_reason=why, samples=samples)
    if mode == "certify":
        cert = certify(model, fmt, task, device=device,
                       run_candidates=counterexample_runner(fmt, device, arithmetic), progress=phase,
                       arithmetic=arithmetic, search_seconds=budget)
        fallback = why is not None and search_seconds is None and not cert.passed and cert.counterexample is None \
            and arithmetic != "real" and "exhaustive" in task.modes \
            and exhaustive_refusal(task, model, EXHAUSTIVE_LIMIT) is None  # a search budget given: certify asked for
        if not fallback:
            return Report(**base, passed=cert.passed, inputs_covered="all" if cert.passed else 0,
                          seconds=time.perf_counter() - t0,
                          min_margin=None if cert.min_margin is None else str(cert.min_margin),
                          counterexample=cert.counterexample, reason=cert.reason, details=cert.details)
        # chosen by default, unproven, and every input fits: they are all run (a default run does not
        # print FAIL for a model that is right; nearest neighbour at N = 2, one candidate, no pointer variable)
        mode = "exhaustive"
        why = f"{why}; {cert.reason}; exhaustive: {COVERS['exhaustive']}"
        base |= _base(model, fmt, mode, None) | dict(mode_reason=why)
    if shard:
        from exactformer.verify.distributed.shards import sharded  # dask is imported here, when asked for

        covered, cex, min_margin, counts, how = sharded(model, fmt, mode, samples, seed, device, arithmetic, workers,
                                                        scheduler, progress, task=task,
                                                        check=check_batches)
        reason = "counterexample found" if cex else (
            f"all inputs correct, run {how}" if mode == "exhaustive" else
            f"{covered} inputs correct ({samples} sampled and as many adversarial, {how})")
        return Report(**base, passed=cex is None, inputs_covered=covered, seconds=time.perf_counter() - t0,
                      min_margin=None if min_margin is None else str(min_margin), counts=counts,
                      counterexample=cex, reason=reason)
    try:
        est = estimate_run(model, task, mode, int(count) if mode == "exhaustive" else 2 * samples, fmt, arithmetic,
                           device)
    except ValueError as e:  # a runner that refuses the length (the dense torch.nn.RNN's budget)
        raise VerifyError("n", f"{mode}: {e}") from None
    why = refusal(est, model.n)
    if why:
        raise VerifyError(*why)
    if notice is not None:
        notice(est.text())
    if mode == "exhaustive":
        batches: Iterable[Batch] = task.exhaustive(model)
    else:
        def both() -> Iterable[Batch]:
            yield from task.adversarial(model, samples, seed + 1)
            yield from task.sample(model, samples, seed)

        batches = both()
    try:
        covered, cex, min_margin, counts = check_batches(model, fmt, batches, device, Meter(est, progress, notice),
                                                         arithmetic)
    except VerifyError:
        raise
    except (IRError, ValueError, IndexError, KeyError, TypeError) as e:  # a model that cannot run: a report
        return Report(**base, passed=False, inputs_covered=0, seconds=time.perf_counter() - t0,
                      reason=f"the model does not run: {type(e).__name__}: {e}")
    reason = "counterexample found" if cex else (
        "all inputs correct" if mode == "exhaustive" else
        f"{covered} inputs correct ({samples} sampled with seed {seed}, the rest adversarial with seed {seed + 1})")
    return Report(**base, passed=cex is None, inputs_covered=covered, seconds=time.perf_counter() - t0,
                  min_margin=None if min_margin is None else str(min_margin), counts=counts,
                  counterexample=cex, reason=reason, details={"estimate": est.to_dict()})


def _malformed(model: ModelIR, task: Task) -> Report | None:
    """A failed report for a model whose fields do not fit together (``model.check()``: shapes,
    ranges) or do not fit its task (the task's inputs are longer than its context, a task parameter
    the task reads is missing), naming the field; None for a well-formed model."""
    try:
        model.check()
        task.check_params(model)
        T = task.length(model)
        n_ctx = getattr(model, "n_ctx", None)
        if n_ctx is not None and T > n_ctx:
            raise IRError(f"pos_embed.n_rows: the task's inputs have {T} tokens, the model's context is {n_ctx}")
        runs = task.domain_runs(model)  # O(1) where the inputs are long
        top = max(int(runs.values[int(w)].stops[-1]) - 1 for w in np.unique(runs.which))
        if top >= model.d_vocab:
            raise IRError(f"embed.n_rows: the task's inputs use token {top}, the model's vocabulary has {model.d_vocab}")
        return None
    except (IRError, ValueError, IndexError, KeyError, TypeError) as e:
        reason = f"malformed model: {type(e).__name__}: {e}" if not isinstance(e, KeyError) else \
            f"malformed model: task_params has no {e} (the task reads it)"
    base = dict(construction=model.construction, theorem=model.theorem, n=model.n, mode="none", seed=None,
                precision=str(model.precision), precision_bits=0, eta=None, eta_paper=None, k=None,
                layers=model.n_layers, heads=model.n_heads, width=model.width, size_bits=0)
    return Report(**base, passed=False, inputs_covered=0, seconds=0.0, reason=reason)


#: seconds a run lasts before the API's default progress bar appears (shorter runs show nothing)
PROGRESS_DELAY = 2.0


@contextlib.contextmanager
def shown_progress(model: Any, mode: str | None, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """What ``xf.verify`` and ``m.verify`` show by default: where ``progress`` / ``phase`` are not
    given (False: nothing), a tqdm bar on stderr over the inputs of an exhaustive or sampled run
    (its total and ETA) or the certificate's current step, once the run has lasted
    :data:`PROGRESS_DELAY` seconds, on a terminal or in a notebook only (tqdm's own test: nothing in
    a log). Yields :func:`verify`'s keyword arguments with the callbacks filled in."""
    kwargs = dict(kwargs)
    auto = [k for k in ("progress", "phase") if kwargs.get(k) is None]
    for k in ("progress", "phase"):
        if kwargs.get(k) is False:
            kwargs[k] = None
    bar = None
    try:
        m = check_model(model)
        task = task_of(m)
        shard = check_sharding(mode, kwargs.get("workers"), kwargs.get("scheduler"))
        chosen, _ = choose_mode(task, m, mode, shard, kwargs.get("arithmetic", "fixed"))
    except VerifyError:
        chosen = None  # verify raises it, naming the parameter
    if chosen is not None and ("phase" if chosen == "certify" else "progress") in auto:
        from tqdm.auto import tqdm  # imported where a run may show it

        what = f"{chosen} {m.construction} n={m.n}"
        if chosen == "certify":
            bar = tqdm(desc=what, bar_format="{desc} [{elapsed}]", delay=PROGRESS_DELAY, disable=None, leave=False)
            kwargs["phase"] = lambda name: bar.set_description_str(f"{what}: {name}")
        else:
            total = int(task.count(m)) if chosen == "exhaustive" else 2 * (kwargs.get("samples") or DEFAULT_SAMPLES)
            bar = tqdm(desc=what, total=total, unit=" inputs", delay=PROGRESS_DELAY, disable=None, leave=False)
            kwargs["progress"] = bar.update
    try:
        yield kwargs
    finally:
        if bar is not None:
            bar.close()


def certified_arithmetics(model: Any, device: str = "cpu") -> dict[str, list[str]]:
    """Certify ``model`` in its fixed-point format and in float64 and float32 (the arithmetics a
    saved model is run in): ``{"certified": [names], "not_certified": [names]}`` for the manifest,
    the fixed-point format under its own name."""
    model = getattr(model, "compiled", model)
    out: dict[str, list[str]] = {"certified": [], "not_certified": []}
    for arithmetic in ("fixed", "float64", "float32"):
        if arithmetic == "fixed" and not (model.precision and parse_format(model.precision).is_exact):
            continue
        proved = certificate_refusal(model, arithmetic) is None and verify(
            model, mode="certify", device=device, arithmetic=arithmetic).passed
        name = model.precision if arithmetic == "fixed" else arithmetic
        out["certified" if proved else "not_certified"].append(name)
    return out
