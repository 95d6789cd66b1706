"""Verification of MPC protocols, their compiled EMA programs and their softmax lowerings (P2 Thm 4.1
and §5; docs/mpc.md, "Verification").

Five-way differential run on every input:

    truth          the task's definition (:mod:`exactformer.constructions.mpc.applications`)
    L1  "mpc"      :func:`exactformer.verify.mpc.protocol_run.trace` — direct delivery, every resource checked
    L2  "ideal"    :func:`exactformer.verify.mpc.program_run.trace` in exact rational semantics
    L2  fixed      the same under each requested fixed-point format (weights ⌊S/c⌋/S)
    L3  weights    where a registered construction computes the application (Match2: the program
                   lowered head for head; induction heads and k-hop: the pointer-doubling weights of
                   constructions/theorems/induction_heads.py; prefix sums: the protocol simulated
                   round for round, constructions/theorems/mpc_simulation.py), run by the exact
                   executor in its own format — its answers against the truth; for a head-for-head
                   lowering, every lowered head's output against the EMA head's output in that
                   format, bit for bit; for a round-for-round simulation, the residual stream after
                   layer r decoded against L1's memory after round r (the invariant, at the weights)

L1 and every L2 run go in lockstep, and after every round the L2 state must equal the L1 memory
field by field for every machine (the **simulation invariant**); the first difference is reported
with its round, machine, input and field. Outputs are then compared with the truth.

:func:`check` runs the input sources of the application (exhaustive, sample, adversarial);
:class:`MPCModel` is a built application ready to run (:func:`build`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
from exactformer.constructions.core import registry
from exactformer.constructions.blocks.match import MatchHead
from exactformer.constructions.mpc.program import EMAProgram, HeadOut
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.mpc.protocol import Protocol
from exactformer.constructions.theorems.mpc_simulation import decode_memory
from exactformer.constructions.mpc.compile import ResourceReport
from exactformer.constructions.mpc.applications import (
    APPLICATIONS,
    ApplicationError,
    ProgramModel,
)
from exactformer.constructions.core.task import EXHAUSTIVE_LIMIT, format_count
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.mpc import program_run as ema_program, protocol_run as mpc
from exactformer.verify.attention.ema import EMAError
from exactformer.verify.executor.exact import run as run_model
from exactformer.verify.executor.forward import forward_with_cache

HEAD_COMPARE_ENTRIES = 1 << 24  # attention entries per chunk of the L3 head comparison (inputs x T x T)
HEAD_COMPARE_MAX_T = 1024  # above this length L3 is checked on its answers only

#: bad arguments to a check or an application (mode, counts, parameters, inputs)
CheckError = ApplicationError


@dataclass
class Counterexample:
    input: list[int]
    index: int  # position of the input in the run (0-based)
    source: str
    level: str  # "mpc", "ideal", a format name, "softmax <format>", or "truth"
    kind: str  # "invariant", "output", "head", "error"
    round: int | None = None
    round_name: str | None = None
    machine: int | None = None
    field: str | None = None
    expected: Any = None
    got: Any = None
    message: str = ""

    def describe(self) -> str:
        if self.kind == "invariant":
            return (f"{self.level}: state differs from the MPC memory after round {self.round} ({self.round_name!r}) "
                    f"at machine {self.machine}, field {self.field!r}: expected {self.expected}, got {self.got}")
        if self.kind == "output":
            return f"{self.level}: output at position {self.machine} is {self.got}, truth {self.expected}"
        if self.kind == "head":
            return (f"{self.level}: the lowered head {self.field} at machine {self.machine} outputs {self.got} (raw), "
                    f"the EMA head {self.expected}")
        return f"{self.level}: {self.message}"


@dataclass
class CheckReport:
    """Result of :func:`check`: a PASS covers ``inputs`` inputs (exhaustive, or from ``seed``)."""

    name: str
    n: int
    params: dict
    mode: str
    passed: bool
    inputs: int
    seed: int | None
    sources: dict[str, int]
    levels: list[str]
    seconds: float
    counterexample: Counterexample | None = None
    usage: dict[str, int] = field(default_factory=dict)  # largest L1 resource use
    max_matches: int = 0  # largest match count of any head
    lost_matches: dict[str, int] = field(default_factory=dict)  # format -> queries that lost a match
    resources: ResourceReport | None = None
    heads_compared: int = 0  # inputs on which L3's heads were compared with L2's bit for bit

    @property
    def reason(self) -> str:
        if self.counterexample is not None:
            return self.counterexample.describe()
        if self.mode == "exhaustive":
            return "every input correct"
        sampled = self.sources.get("sample", 0)
        return (f"{self.inputs} inputs correct ({sampled} sampled with seed {self.seed}, the rest adversarial with "
                f"seed {None if self.seed is None else self.seed + 1})")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["reason"] = self.reason
        d["resources"] = None if self.resources is None else {
            k: v for k, v in asdict(self.resources).items() if k != "per_layer"}
        return d


def _level_name(fmt: FixedPoint | None) -> str:
    return "ideal" if fmt is None else fmt.name


def _first_difference(want: dict, got: dict) -> tuple[int, int, str] | None:
    """(input, machine, field) of the first difference between two states, or None."""
    for f in sorted(set(want) ^ set(got)):
        return 0, -1, f
    diff = None
    for f in sorted(want):
        a, b = want[f], np.asarray(got[f])
        if a.shape != b.shape:
            return 0, -1, f
        d = a != b
        if d.ndim == 3:
            d = d.any(axis=-1)
        diff = d if diff is None else diff | d
    if diff is None or not diff.any():
        return None
    b, i = (int(v) for v in np.argwhere(diff)[0])
    for f in sorted(want):
        if not np.array_equal(want[f][b, i], np.asarray(got[f])[b, i]):
            return b, i, f
    return None


def _row(a: np.ndarray, b: int, i: int) -> Any:
    v = np.asarray(a)[b, i]
    return v.tolist() if np.ndim(v) else int(v)


def differential(protocol: Protocol, program: EMAProgram, x: np.ndarray, truth: np.ndarray | None,
                 formats: Sequence[FixedPoint | None] = (None,), run_mpc: bool = True,
                 stats: dict | None = None, lowered: CompiledModel | None = None,
                 compare_heads: bool = True, simulates: bool = False) -> Counterexample | None:
    """Run one batch ``x`` [B, n] through L1 (if ``run_mpc``), L2 under every format (None = ideal) in
    lockstep, and L3 (``lowered``, whose format must be among ``formats``: its heads compared with
    L2's where ``compare_heads``, its residual stream after every layer with L1's memory where
    ``simulates``); return the first counterexample (input index relative to the batch; source "")."""
    levels: list[tuple[str, Iterator]] = []
    if run_mpc:
        levels.append(("mpc", mpc.trace(protocol, x)))
    levels += [(_level_name(f), ema_program.trace(program, x, f)) for f in formats]
    stats = {} if stats is None else stats
    usage = stats.setdefault("usage", {})
    lost = stats.setdefault("lost", {})
    finals: dict[str, dict] = {}
    outs: dict[str, list[tuple[HeadOut, ...]]] = {}
    memories: list[dict] = []  # L1's memory after every round (the weights' invariant compares with it)

    def cex(level: str, kind: str, **kw) -> Counterexample:
        b = kw.pop("b", 0)
        return Counterexample(x[b].tolist(), b, "", level, kind, **kw)

    for r in range(len(protocol.rounds) + 1):
        states = {}
        for name, it in levels:
            try:
                st = next(it)
            except (mpc.MPCError, ema_program.EMAProgramError, EMAError) as e:
                b = getattr(e, "input", None) or 0
                return cex(name, "error", b=b, round=getattr(e, "round", r), message=str(e))
            if name == "mpc":
                for k, v in asdict(st.usage).items():
                    if isinstance(v, int) and k != "round":
                        usage[k] = max(usage.get(k, 0), v)
                states[name] = st.memory
            else:
                for hs in st.heads:
                    stats["max_matches"] = max(stats.get("max_matches", 0), hs.max_count)
                    if name != "ideal":
                        lost[name] = lost.get(name, 0) + hs.lost
                states[name] = st.state
                if st.layer:
                    outs.setdefault(name, []).append(st.outs)
            finals[name] = states[name]
        if run_mpc:
            ref = states["mpc"]
            memories.append(ref)
            for name, st in states.items():
                if name == "mpc":
                    continue
                d = _first_difference(ref, st)
                if d is not None:
                    b, i, f = d
                    exp, got = (("(field missing)" if f not in s else f"(shape {list(np.shape(s[f]))})" if i < 0
                                 else _row(s[f], b, i)) for s in (ref, st))
                    return cex(name, "invariant", b=b, round=r, round_name=protocol.rounds[r - 1].name if r else "init",
                               machine=i, field=f, expected=exp, got=got)
    if truth is None:
        return None
    for name, _ in levels:
        if name == "mpc":
            try:
                out = mpc.output(protocol, finals[name], x.shape[0])
            except mpc.MPCError as e:
                return cex(name, "error", message=str(e))
        else:
            out = np.asarray(program.readout(finals[name]))
        bad = out != truth
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            return cex(name, "output", b=b, machine=i, expected=int(truth[b, i]), got=int(out[b, i]))
    if lowered is not None:
        return _softmax_level(lowered, x, truth, outs[parse_format(lowered.precision).name] if compare_heads else None,
                              stats, cex, memories if run_mpc else None, protocol, simulates)
    return None


def _softmax_level(lowered: CompiledModel, x: np.ndarray, truth: np.ndarray, l2: list[tuple[HeadOut, ...]] | None,
                   stats: dict, cex: Callable[..., Counterexample], memories: list[dict] | None = None,
                   protocol: Protocol | None = None, model_simulates_rounds: bool = False) -> Counterexample | None:
    """L3: the weights' answers (exact executor, its own format) against the truth; where the
    construction simulates the protocol round for round (``model_simulates_rounds``: the MPC
    simulation), the residual stream after every layer decoded against L1's memory after that
    round (``memories``); and where it lowers the program head for head (``l2`` given: Match2),
    its match heads' outputs against the EMA heads' (L2 in the same format), bit for bit: the
    program's heads, layer by layer, are the model's :class:`MatchHead` blocks in plan order,
    machine i answer position i."""
    fmt = parse_format(lowered.precision)
    level = f"softmax {fmt.name}"
    tokens = registry.task_of(lowered).encode_arrays(lowered, x)
    if memories is not None and model_simulates_rounds:
        found = _weights_invariant(lowered, tokens, fmt, memories, protocol, cex, level)
        if found is not None:
            return found
    res = run_model(lowered, tokens, fmt)
    got = np.array([[-1 if a is None else int(a) for a in row] for row in res.answers])
    bad = got != truth
    if bad.any():
        b, i = (int(v) for v in np.argwhere(bad)[0])
        return cex(level, "output", b=b, machine=i, expected=int(truth[b, i]), got=None if got[b, i] < 0 else int(got[b, i]))
    if l2 is None:
        return None
    heads = [(p.layer, p.index, p.block) for p in lowered.plan if p.kind == "head" and isinstance(p.block, MatchHead)]
    ema = [o for layer in l2 for o in layer]
    if len(heads) != len(ema):
        return cex(level, "error", message=f"the lowering has {len(heads)} match heads, the program {len(ema)} EMA heads")
    T = tokens.shape[1]
    if T > HEAD_COMPARE_MAX_T:
        return None
    pos = lowered.answer_positions_for(T)
    chunk = max(1, HEAD_COMPARE_ENTRIES // (T * T))
    for lo in range(0, len(x), chunk):
        _, cache = forward_with_cache(lowered, tokens[lo:lo + chunk], fmt)
        for (layer, h, _), out in zip(heads, ema):
            dv = out.num.shape[-1]
            z = cache.raw[f"blocks.{layer}.attn.hook_z"][:, pos, h, :dv]
            want = out.num[lo:lo + chunk]
            diff = np.argwhere(np.any(z != want, axis=-1))
            if diff.size:
                b, i = (int(v) for v in diff[0])
                return cex(level, "head", b=lo + b, machine=i, field=f"blocks.{layer}.attn head {h}",
                           expected=want[b, i].tolist(), got=np.asarray(z[b, i]).tolist())
    stats["heads_compared"] = stats.get("heads_compared", 0) + len(x)
    return None


def _weights_invariant(lowered: CompiledModel, tokens: np.ndarray, fmt: FixedPoint, memories: list[dict],
                       protocol: Protocol | None, cex: Callable[..., Counterexample], level: str) -> Counterexample | None:
    """The simulation invariant at the weight level: after layer r (r = 0: the embedding) the
    residual stream, decoded by the model's memory map (:func:`decode_memory`), equals L1's memory
    after round r for every machine (position i + 1) and field; the first difference is returned."""
    chunk = max(1, HEAD_COMPARE_ENTRIES // (tokens.shape[1] ** 2))
    for lo in range(0, len(tokens), chunk):
        _, cache = forward_with_cache(lowered, tokens[lo:lo + chunk], fmt)
        for r, want in enumerate(memories):
            hook = "blocks.0.hook_resid_pre" if r == 0 else f"blocks.{r - 1}.hook_resid_post"
            got = decode_memory(lowered, cache.raw[hook][:, 1:], int(fmt.scale), r)
            part = {f: v[lo:lo + len(cache.raw[hook])] for f, v in want.items()}
            d = _first_difference(part, got)
            if d is not None:
                b, i, f = d
                exp, val = (("(field missing)" if f not in s else f"(shape {list(np.shape(s[f]))})" if i < 0
                             else _row(s[f], b, i)) for s in (part, got))
                name = protocol.rounds[r - 1].name if r and protocol is not None else "init"
                return cex(level, "invariant", b=lo + b, round=r, round_name=name, machine=i, field=f,
                           expected=exp, got=val)
    return None


# ------------------------------------------------------------------------------------------------
# built applications and their checks
# ------------------------------------------------------------------------------------------------


def _answers(out: np.ndarray, single: bool) -> list:
    rows = [[None if v < 0 else int(v) for v in row] for row in out.tolist()]
    return rows[0] if single else rows


def _semantics(model: ProgramModel, fmt: Any) -> FixedPoint | None:
    """None / "ideal" -> ideal semantics; "default" -> the model's coarsest exact format; a format or its name."""
    if fmt is None or fmt == "ideal":
        return None
    if fmt == "default":
        return model.fmt
    return parse_format(fmt) if isinstance(fmt, str) else fmt


def lowered_model(model: ProgramModel) -> CompiledModel | None:
    """The registered softmax construction that lowers ``model``'s program, built for it (or None)."""
    app = model.application
    if app.lowered_construction is None:
        return None
    return registry.get(app.lowered_construction).builder(n=model.n, **app.lowered_params(model))


class MPCModel:
    """A built MPC application (a protocol and its EMA program: the reference levels of
    :func:`check`), ready to run: ``compiled`` is its
    :class:`~exactformer.constructions.mpc.applications.ProgramModel` (protocol, program, resources,
    ``fmt``, ``application``, ``params``: available directly as attributes).

    ``model(inputs)`` runs the compiled program (ideal semantics by default; ``fmt`` a FixedPoint,
    its name, or "default" for :attr:`fmt`) and returns the answers per position, None for ⊥ —
    a list for one input ([n]), a list of lists for a batch ([B, n])."""

    def __init__(self, compiled: ProgramModel):
        self.compiled = compiled

    def __getattr__(self, name: str) -> Any:
        if name == "compiled":
            raise AttributeError(name)
        return getattr(self.compiled, name)

    def _inputs(self, inputs: Any) -> np.ndarray:
        """One input [n] or a batch [B, n], checked by the application (its task's ``to_arrays``)."""
        x = np.asarray(inputs)
        (checked,) = self.application.to_arrays(self.compiled, x[None] if x.ndim == 1 else x)
        return checked[0] if x.ndim == 1 else checked

    def __call__(self, inputs, fmt: FixedPoint | str | None = None) -> list:
        x = self._inputs(inputs)
        out = ema_program.run(self.program, x, _semantics(self.compiled, fmt)).outputs
        return _answers(out, x.ndim == 1)

    def mpc(self, inputs) -> list:
        """The same answers from the protocol run directly (L1)."""
        x = self._inputs(inputs)
        return _answers(mpc.run(self.protocol, x).outputs, x.ndim == 1)

    def truth(self, inputs) -> list:
        x = self._inputs(inputs)
        return _answers(self.application.truth(self.compiled, np.atleast_2d(x)), x.ndim == 1)

    def lowered(self) -> CompiledModel | None:
        """The softmax model lowering this program (L3), where one exists."""
        return lowered_model(self.compiled)

    def verify(self, mode: str = "sample", **kw: Any) -> CheckReport:
        """The four-way differential check (see :func:`check`)."""
        return check(self.compiled, mode, **kw)

    def __repr__(self) -> str:
        r = self.resources
        return (f"<MPCModel {self.name} {self.params}: {r.layers} layers, heads {list(r.heads)}, "
                f"m = {r.m}, p = {r.word_bits}, {self.fmt.name}>")


def check(model: ProgramModel, mode: str = "sample", samples: int = 100, seed: int = 0,
          formats: Sequence[FixedPoint | str | None] | None = None, batch: int | None = None,
          run_mpc: bool = True, lowered: bool = True, progress: Callable[[int], None] | None = None) -> CheckReport:
    """Four-way differential check of ``model``. ``mode``: "exhaustive" (every input, refused above
    2^22), "sample" (every adversarial input of ``seed`` + 1 and ``samples`` seeded random inputs) or
    "adversarial" (only those). ``formats``: L2 semantics to run (None = ideal; default: ideal and the
    model's coarsest exact format). ``run_mpc=False`` skips L1 and the invariant (outputs against the
    truth only); ``lowered=False`` skips L3. ``progress(k)`` is called with the inputs of each batch."""
    model = getattr(model, "compiled", model)
    app = model.application
    if mode not in ("exhaustive", "sample", "adversarial"):
        raise CheckError(f"mode must be one of ('exhaustive', 'sample', 'adversarial'), got {mode!r}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise CheckError(f"samples must be an integer >= 0, got {samples!r}")
    fmts = [None, model.fmt] if formats is None else [_semantics(model, f) for f in formats]
    low = lowered_model(model) if lowered else None
    if low is not None and app.lowered_heads and parse_format(low.precision).name not in [_level_name(f) for f in fmts]:
        fmts.append(parse_format(low.precision))  # L2 in L3's format, for the head comparison
    batch = batch or max(1, (1 << 20) // model.n)
    if mode == "exhaustive":
        total = app.count(model)
        if total > EXHAUSTIVE_LIMIT:
            raise CheckError(f"exhaustive mode: {format_count(total, model.n)} inputs exceed the limit of "
                             f"{format_count(EXHAUSTIVE_LIMIT)}; use sample")
        sources: Iterator[tuple[str, np.ndarray]] = ((b.kind, b.arrays[0]) for b in app.exhaustive(model, batch))
    else:
        def both() -> Iterator[tuple[str, np.ndarray]]:
            for b in app.adversarial(model, EXHAUSTIVE_LIMIT, seed + 1):
                for lo in range(0, len(b), batch):
                    yield b.kind, b.arrays[0][lo:lo + batch]
            if mode == "sample":
                for b in app.sample(model, samples, seed):
                    yield b.kind, b.arrays[0]
        sources = both()
    return check_batches(model, sources, fmts, mode, None if mode == "exhaustive" else seed, run_mpc, low, progress)


def check_batches(model: ProgramModel, sources, formats: Sequence[FixedPoint | None], mode: str, seed: int | None,
                  run_mpc: bool = True, lowered: CompiledModel | None = None,
                  progress: Callable[[int], None] | None = None) -> CheckReport:
    """Run the differential check over ``(source kind, inputs [B, n])`` pairs; stop at the first
    counterexample."""
    model = getattr(model, "compiled", model)
    t0 = time.perf_counter()
    stats: dict = {}
    covered, counts, cex = 0, {}, None
    for kind, x in sources:
        x = np.asarray(x, dtype=np.int64)
        truth = model.application.truth(model, x)
        cex = differential(model.protocol, model.program, x, truth, formats, run_mpc, stats, lowered,
                           model.application.lowered_heads, model.application.lowered_rounds)
        if cex is not None:
            cex.index += covered
            cex.source = kind
            counts[kind] = counts.get(kind, 0) + cex.index - covered + 1
            covered = cex.index + 1
            break
        covered += len(x)
        counts[kind] = counts.get(kind, 0) + len(x)
        if progress is not None:
            progress(len(x))
    levels = ((["mpc"] if run_mpc else []) + [_level_name(f) for f in formats]
              + ([f"softmax {parse_format(lowered.precision).name}"] if lowered is not None else []) + ["truth"])
    return CheckReport(model.name, model.n, model.params, mode, cex is None, covered, seed, counts, levels,
                       time.perf_counter() - t0, cex, stats.get("usage", {}), stats.get("max_matches", 0),
                       stats.get("lost", {}), model.resources, stats.get("heads_compared", 0))


def build(name: str, n: int, **params) -> MPCModel:
    """Build application ``name`` (one of :data:`APPLICATIONS`) for ``n`` machines / tokens, with the
    protocol's own parameter names (``hops`` for k-hop; the registered builders take ``k``)."""
    if name not in APPLICATIONS:
        raise CheckError(f"application must be one of {sorted(APPLICATIONS)}, got {name!r}")
    return MPCModel(APPLICATIONS[name].build(n, **params))
