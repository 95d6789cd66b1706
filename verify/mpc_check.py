"""Verification of MPC protocols and their compiled EMA programs (P2 Thm 4.1 and §5).

Four-way differential run on every input (spec §B.8):

    truth          the task's definition (vectorised ground truths below)
    L1  "mpc"      :func:`exactformer.verify.mpc.trace` — direct delivery, every resource checked
    L2  "ideal"    :func:`exactformer.verify.ema_program.trace` in exact rational semantics
    L2  fixed      the same under each requested fixed-point format (weights ⌊S/c⌋/S)

L1 and every L2 run go in lockstep, and after every round the L2 state must equal the L1 memory
field by field for every machine (the **simulation invariant**); the first difference is reported
with its round, machine, input and field. Outputs are then compared with the truth.

Input sources per application (:class:`Application`): ``exhaustive`` (for the string tasks every
restricted growth string — one string per equality pattern, which covers every alphabet because
the protocols use tokens only through equality), ``sample`` (seeded) and ``adversarial`` (named
kinds, deterministic given the seed). :func:`build` returns an :class:`MPCModel` (protocol, compiled
program, resources) that answers per position with None for ⊥.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from exactformer.constructions import mpc_library as lib
from exactformer.constructions.ema_program import EMAProgram
from exactformer.constructions.mpc import Protocol
from exactformer.constructions.mpc_compile import ResourceReport, compile_protocol, resources
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify import ema_program, mpc
from exactformer.verify.ema import EMAError

EXHAUSTIVE_LIMIT = 1 << 22  # inputs; beyond this exhaustive mode refuses


class CheckError(ValueError):
    """Bad arguments to a check (mode, counts, parameters of an application)."""


# ------------------------------------------------------------------------------------------------
# ground truths (vectorised; tests compare them with definitional pure-Python versions)
# ------------------------------------------------------------------------------------------------


def sigma(w: np.ndarray) -> np.ndarray:
    """σ of P2 Def. 5.3, 0-based, for every position: σ(p) = 1 + (last q < p with w_q = w_p), −1 (⊥)
    if none. [B, n] -> [B, n]. (A stable sort by token puts equal tokens in position order; the
    previous entry of the same token is the last earlier occurrence.)"""
    w = np.asarray(w, dtype=np.int64)
    order = np.argsort(w, axis=-1, kind="stable")
    sw = np.take_along_axis(w, order, axis=-1)
    prev = np.full(w.shape, -1, dtype=np.int64)
    same = sw[:, 1:] == sw[:, :-1]
    prev_sorted = np.where(same, order[:, :-1], -1)
    np.put_along_axis(prev, order[:, 1:], prev_sorted, axis=-1)
    return np.where(prev >= 0, prev + 1, -1)


def compose(f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """(f∘g)(p) = f(g(p)) for pointer arrays [B, n] with ⊥ = −1 absorbing."""
    return np.where(g >= 0, np.take_along_axis(f, np.maximum(g, 0), axis=-1), -1)


def sigma_power(w: np.ndarray, hops: int) -> np.ndarray:
    """σ^k (k = ``hops``) by binary exponentiation of the pointer array (⊥ absorbing)."""
    s = sigma(w)
    acc = np.broadcast_to(np.arange(s.shape[1]), s.shape).copy()
    k = hops
    while k:
        if k & 1:
            acc = compose(s, acc)
        k >>= 1
        if k:
            s = compose(s, s)
    return acc


def k_hop_truth(w: np.ndarray, hops: int) -> np.ndarray:
    """P2 Def. 5.5: w_{σ^k(p)} at every position, −1 (⊥) where σ^k(p) = ⊥. [B, n] -> [B, n]."""
    w = np.asarray(w, dtype=np.int64)
    p = sigma_power(w, hops)
    return np.where(p >= 0, np.take_along_axis(w, np.maximum(p, 0), axis=-1), -1)


def match2_truth(x: np.ndarray, modulus: int) -> np.ndarray:
    """P2 Def. 5.1: 1{∃ j (j = i allowed): x_i + x_j ≡ 0 (mod M)}. [B, n] -> [B, n]."""
    r = np.asarray(x, dtype=np.int64) % modulus
    rows = np.arange(r.shape[0], dtype=np.int64)[:, None] * modulus
    flat = (np.sort(r, axis=-1) + rows).ravel()
    want = ((modulus - r) % modulus + rows).ravel()
    pos = np.minimum(np.searchsorted(flat, want), flat.size - 1)
    return (flat[pos] == want).reshape(r.shape).astype(np.int64)


def prefix_sums_truth(x: np.ndarray, word_bits: int) -> np.ndarray:
    """y_i = (x_0 + … + x_i) mod 2^p."""
    return np.cumsum(np.asarray(x, dtype=np.int64), axis=-1) % (1 << word_bits)


def sort_truth(x: np.ndarray) -> np.ndarray:
    return np.sort(np.asarray(x, dtype=np.int64), axis=-1)


# ------------------------------------------------------------------------------------------------
# restricted growth strings
# ------------------------------------------------------------------------------------------------


def restricted_growth_strings(n: int, blocks: int | None = None, chunk: int = 1 << 16) -> Iterator[np.ndarray]:
    """Every restricted growth string of length n (a_0 = 0, a_p <= 1 + max(a_0..a_{p−1})) with at most
    ``blocks`` distinct values, in lexicographic order, in chunks of at most ``chunk`` rows: one
    string per equality pattern, Bell(n) of them without a block limit."""
    if n < 1:
        raise CheckError(f"n must be >= 1, got {n}")
    cap = n if blocks is None else max(1, min(n, blocks))

    def grow(rows: np.ndarray, top: np.ndarray) -> Iterator[np.ndarray]:
        if rows.shape[1] == n:
            yield rows
            return
        kids = np.minimum(top + 2, cap)
        idx = np.repeat(np.arange(len(rows)), kids)
        starts = np.cumsum(kids) - kids
        vals = np.arange(len(idx)) - np.repeat(starts, kids)
        new = np.concatenate([rows[idx], vals[:, None].astype(rows.dtype)], axis=1)
        new_top = np.maximum(top[idx], vals)
        for lo in range(0, len(new), chunk):
            yield from grow(new[lo:lo + chunk], new_top[lo:lo + chunk])

    yield from grow(np.zeros((1, 1), dtype=np.int64), np.zeros(1, dtype=np.int64))


def count_rgs(n: int, blocks: int | None = None) -> int:
    """Number of restricted growth strings of length n with at most ``blocks`` values (Σ_j S(n, j))."""
    cap = n if blocks is None else max(1, min(n, blocks))
    row = [1] + [0] * cap  # Stirling numbers of the second kind S(m, j), j = 0..cap
    for m in range(1, n + 1):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, cap + 1)]
    return sum(row)


# ------------------------------------------------------------------------------------------------
# the differential check
# ------------------------------------------------------------------------------------------------


@dataclass
class Counterexample:
    input: list[int]
    index: int  # position of the input in the run (0-based)
    source: str
    level: str  # "mpc", "ideal", a format name, or "truth"
    kind: str  # "invariant", "output", "error"
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
        return f"{self.level}: {self.message}"


@dataclass
class CheckReport:
    """Result of :func:`check_batches`: a PASS covers ``inputs`` inputs (exhaustive, or from ``seed``)."""

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

    @property
    def reason(self) -> str:
        if self.counterexample is not None:
            return self.counterexample.describe()
        return ("every input correct" if self.mode == "exhaustive"
                else f"{self.inputs} inputs correct (seed {self.seed})")

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
                 stats: dict | None = None) -> Counterexample | None:
    """Run one batch ``x`` [B, n] through L1 (if ``run_mpc``) and L2 under every format (None = ideal),
    in lockstep; return the first counterexample (input index relative to the batch; source "")."""
    levels: list[tuple[str, Iterator]] = []
    if run_mpc:
        levels.append(("mpc", mpc.trace(protocol, x)))
    levels += [(_level_name(f), ema_program.trace(program, x, f)) for f in formats]
    stats = {} if stats is None else stats
    usage = stats.setdefault("usage", {})
    lost = stats.setdefault("lost", {})
    finals: dict[str, dict] = {}

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
            finals[name] = states[name]
        if run_mpc:
            ref = states["mpc"]
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
    return None


# ------------------------------------------------------------------------------------------------
# models and applications
# ------------------------------------------------------------------------------------------------


def _answers(out: np.ndarray, single: bool) -> list:
    rows = [[None if v < 0 else int(v) for v in row] for row in out.tolist()]
    return rows[0] if single else rows


@dataclass
class MPCModel:
    """A built application: the protocol (L1), its compiled EMA program (L2) and their resources.

    ``model(inputs)`` runs the compiled program (ideal semantics by default; ``fmt`` a FixedPoint,
    its name, or "default" for :attr:`fmt`) and returns the answers per position, None for ⊥ —
    a list for one input ([n]), a list of lists for a batch ([B, n])."""

    application: "Application"
    params: dict
    protocol: Protocol
    program: EMAProgram
    resources: ResourceReport
    fmt: FixedPoint  # the coarsest exact fixed-point format (program.min_format())

    @property
    def name(self) -> str:
        return self.application.name

    @property
    def n(self) -> int:
        return self.protocol.n

    def _format(self, fmt) -> FixedPoint | None:
        if fmt is None or fmt == "ideal":
            return None
        if fmt == "default":
            return self.fmt
        return parse_format(fmt) if isinstance(fmt, str) else fmt

    def __call__(self, inputs, fmt: FixedPoint | str | None = None) -> list:
        x = np.asarray(self.application.encode(self, inputs))
        out = ema_program.run(self.program, x, self._format(fmt)).outputs
        return _answers(out, x.ndim == 1)

    def mpc(self, inputs) -> list:
        """The same answers from the protocol run directly (L1)."""
        x = np.asarray(self.application.encode(self, inputs))
        return _answers(mpc.run(self.protocol, x).outputs, x.ndim == 1)

    def truth(self, inputs) -> list:
        x = np.asarray(self.application.encode(self, inputs))
        return _answers(self.application.truth(self, np.atleast_2d(x)), x.ndim == 1)

    def verify(self, mode: str = "sample", **kw) -> CheckReport:
        return self.application.verify(self, mode, **kw)

    def __repr__(self) -> str:
        r = self.resources
        return (f"<MPCModel {self.name} {self.params}: {r.layers} layers, heads {list(r.heads)}, "
                f"m = {r.m}, p = {r.word_bits}, {self.fmt.name}>")


class Application:
    """An application of Thm 4.1: a protocol builder, its ground truth and its input sources."""

    name = ""
    theorem = ""
    domain_name = "inputs"

    # ---- to implement ---------------------------------------------------------------------------
    def protocol(self, n: int, **params) -> Protocol:
        raise NotImplementedError

    def truth(self, model: MPCModel, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def domain(self, model: MPCModel) -> int:
        """Inputs are integers in [0, domain)."""
        raise NotImplementedError

    def exhaustive(self, model: MPCModel, batch: int) -> Iterator[np.ndarray]:
        """Every input (default: all of [0, domain)^n in counting order)."""
        d, n = self.domain(model), model.n
        total = d**n
        for lo in range(0, total, batch):
            idx = np.arange(lo, min(total, lo + batch), dtype=np.int64)
            digits = (idx[:, None] // d ** np.arange(n - 1, -1, -1, dtype=np.int64)) % d
            yield digits

    def count(self, model: MPCModel) -> int:
        return self.domain(model) ** model.n

    def sample(self, model: MPCModel, count: int, seed: int, batch: int) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(seed)
        done = 0
        while done < count:
            b = min(batch, count - done)
            yield self.draw(model, rng, b)
            done += b

    def draw(self, model: MPCModel, rng: np.random.Generator, b: int) -> np.ndarray:
        return rng.integers(0, self.domain(model), size=(b, model.n))

    def adversarial(self, model: MPCModel, seed: int) -> Iterator[tuple[str, np.ndarray]]:
        raise NotImplementedError

    # ---- shared ---------------------------------------------------------------------------------
    def build(self, n: int, **params) -> MPCModel:
        allowed = [k for k in inspect.signature(self.protocol).parameters if k != "n"]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise CheckError(f"{self.name}: unknown parameter(s) {unknown}; allowed: {allowed}")
        protocol = self.protocol(n, **params)
        program = compile_protocol(protocol)
        return MPCModel(self, dict(protocol.params), protocol, program, resources(protocol), program.min_format())

    def encode(self, model: MPCModel, inputs) -> np.ndarray:
        x = np.asarray(inputs)
        if x.ndim not in (1, 2) or x.shape[-1] != model.n or x.dtype.kind not in "iu":
            raise CheckError(f"{self.domain_name} must be integers of shape [{model.n}] or [B, {model.n}], "
                             f"got {x.dtype} {list(x.shape)}")
        d = self.domain(model)
        if x.size and (x.min() < 0 or x.max() >= d):
            raise CheckError(f"{self.domain_name} must lie in [0, {d}), got values in [{x.min()}, {x.max()}]")
        return x.astype(np.int64)

    def verify(self, model: MPCModel, mode: str = "sample", samples: int = 100, seed: int = 0,
               formats: Sequence[FixedPoint | str | None] | None = None, batch: int | None = None,
               run_mpc: bool = True) -> CheckReport:
        """Four-way differential check of ``model``. ``mode``: "exhaustive" (every input, refused above
        2^22), "sample" (every adversarial input of ``seed`` + ``samples`` seeded random inputs) or
        "adversarial" (only those). ``formats``: L2 semantics to run (None = ideal; default: ideal and
        the model's coarsest exact format). ``run_mpc=False`` skips L1 and the invariant (outputs
        against the truth only)."""
        if mode not in ("exhaustive", "sample", "adversarial"):
            raise CheckError(f"mode must be one of ('exhaustive', 'sample', 'adversarial'), got {mode!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise CheckError(f"samples must be an integer >= 0, got {samples!r}")
        fmts = [None, model.fmt] if formats is None else [model._format(f) for f in formats]
        batch = batch or max(1, (1 << 20) // model.n)
        if mode == "exhaustive":
            total = self.count(model)
            if total > EXHAUSTIVE_LIMIT:
                raise CheckError(f"exhaustive mode: {total} inputs exceed the limit of {EXHAUSTIVE_LIMIT}; use sample")
            sources = (("exhaustive", x) for x in self.exhaustive(model, batch))
        else:
            def both():
                for kind, x in self.adversarial(model, seed + 1):
                    for lo in range(0, len(x), batch):
                        yield kind, x[lo:lo + batch]
                if mode == "sample":
                    for x in self.sample(model, samples, seed, batch):
                        yield "sample", x
            sources = both()
        return check_batches(model, sources, fmts, mode, None if mode == "exhaustive" else seed, run_mpc)


def check_batches(model: MPCModel, sources, formats: Sequence[FixedPoint | None], mode: str, seed: int | None,
                  run_mpc: bool = True) -> CheckReport:
    """Run the differential check over ``(source kind, inputs [B, n])`` pairs; stop at the first
    counterexample."""
    t0 = time.perf_counter()
    stats: dict = {}
    covered, counts, cex = 0, {}, None
    for kind, x in sources:
        x = np.asarray(x, dtype=np.int64)
        truth = model.application.truth(model, x)
        cex = differential(model.protocol, model.program, x, truth, formats, run_mpc, stats)
        if cex is not None:
            cex.index += covered
            cex.source = kind
            counts[kind] = counts.get(kind, 0) + cex.index - covered + 1
            covered = cex.index + 1
            break
        covered += len(x)
        counts[kind] = counts.get(kind, 0) + len(x)
    levels = (["mpc"] if run_mpc else []) + [_level_name(f) for f in formats] + ["truth"]
    return CheckReport(model.name, model.n, model.params, mode, cex is None, covered, seed, counts, levels,
                       time.perf_counter() - t0, cex, stats.get("usage", {}), stats.get("max_matches", 0),
                       stats.get("lost", {}), model.resources)


# ---- the applications ----------------------------------------------------------------------------


class Match2(Application):
    name = "match2"
    theorem = "P2 Thm 5.2 (Def. 5.1)"
    domain_name = "Match2 inputs (residues)"

    def protocol(self, n: int, modulus: int = 37) -> Protocol:
        return lib.match2(n, modulus)

    def domain(self, model):
        return model.params["modulus"]

    def truth(self, model, x):
        return match2_truth(x, model.params["modulus"])

    def adversarial(self, model, seed):
        n, M = model.n, model.params["modulus"]
        rng = np.random.default_rng(seed)
        yield "all-zero", np.zeros((1, n), dtype=np.int64)
        if M % 2 == 0:
            yield "all-half", np.full((1, n), M // 2, dtype=np.int64)
        if M > 2:
            yield "no-pair", np.ones((1, n), dtype=np.int64)  # 1 + 1 = 2 ≢ 0
            one = np.ones((n, n), dtype=np.int64)
            if n >= 2:
                j = (np.arange(n) + 1 + rng.integers(0, n - 1, size=n)) % n
                one[np.arange(n), j] = M - 1  # exactly one pair (1, M−1) at every position
            yield "one-pair", one
        yield "distinct", np.arange(n, dtype=np.int64)[None, :] % M
        yield "max-residue", np.full((1, n), M - 1, dtype=np.int64)


class KHop(Application):
    """k-hop induction heads (P2 Def. 5.5, Thm 5.6); ``hops = 1`` is induction heads (Def. 5.3, Thm 5.4)."""

    domain_name = "tokens"

    def __init__(self, name: str = "k-hop", fixed_hops: int | None = None):
        self.name = name
        self.fixed_hops = fixed_hops
        self.theorem = "P2 Thm 5.4 (Def. 5.3)" if fixed_hops == 1 else "P2 Thm 5.6 (Def. 5.5)"

    def protocol(self, n: int, hops: int = 1, alphabet: int | None = None, branching: int = 2) -> Protocol:
        if self.fixed_hops is not None:
            if hops != self.fixed_hops:
                raise CheckError(f"{self.name} has hops = {self.fixed_hops}; use k-hop for other hop counts")
            return lib.induction_heads(n, n if alphabet is None else alphabet, branching)
        return lib.k_hop(n, hops, n if alphabet is None else alphabet, branching)

    def domain(self, model):
        return model.params["alphabet"]

    def truth(self, model, x):
        return k_hop_truth(x, model.params["hops"])

    def count(self, model):
        return count_rgs(model.n, self.domain(model))

    def exhaustive(self, model, batch):
        """Every equality pattern: the restricted growth strings with at most |Σ| values."""
        return restricted_growth_strings(model.n, self.domain(model), batch)

    def draw(self, model, rng, b):
        n, S = model.n, self.domain(model)
        sizes = np.array(sorted({max(1, min(S, v)) for v in (2, 4, n // 4, n, S)}))
        size = sizes[rng.integers(0, len(sizes), size=b)]
        return (rng.random((b, n)) * size[:, None]).astype(np.int64)

    def adversarial(self, model, seed):
        """Named hard cases (spec §B.8.4): fixed points, no repeats, long chains, block boundaries."""
        n, S, B = model.n, self.domain(model), model.params["branching"]
        rng = np.random.default_rng(seed)
        pos = np.arange(n, dtype=np.int64)
        yield "all-equal", np.zeros((1, n), dtype=np.int64)  # σ(p) = p: fixed points
        yield "max-token", np.full((1, n), S - 1, dtype=np.int64)
        yield "runs-of-2", (pos // 2 % S)[None, :]  # "aabbcc…": fixed points inside chains
        periods = [q for q in (2, 3, 5, S) if 1 <= q <= S]
        yield "periodic", np.stack([(pos % q + (S - q)) % S for q in periods])  # long hop chains
        yield "no-repeats", (pos % S)[None, :] if S >= n else ((pos * 7 + 3) % S)[None, :]
        # the last earlier occurrence sits just before p's level-ℓ block (or at position 0), nothing equal
        # in between: the search must find it in the sibling block right at the boundary
        if S >= 2:
            L = lib.levels(n, B)
            rows = []
            for lev in range(1, L + 1):
                span = B ** (L - lev)
                if span >= n:
                    continue
                for p in rng.integers(span, n, size=4):
                    for q in {int(p // span * span - 1), 0}:
                        if q < p:
                            row = rng.integers(1, S, size=n)
                            row[[q, p]] = 0
                            rows.append(row)
            if rows:
                yield "block-boundary", np.stack(rows)


class PrefixSums(Application):
    name = "prefix-sums"
    theorem = "library (push-only MPC; not in P2)"
    domain_name = "words"

    def protocol(self, n: int, word_bits: int = 8, fan_in: int = 2) -> Protocol:
        return lib.prefix_sums(n, word_bits, fan_in)

    def domain(self, model):
        return 1 << model.params["word_bits"]

    def truth(self, model, x):
        return prefix_sums_truth(x, model.params["word_bits"])

    def adversarial(self, model, seed):
        n, top = model.n, self.domain(model) - 1
        yield "all-zero", np.zeros((1, n), dtype=np.int64)
        yield "all-max", np.full((1, n), top, dtype=np.int64)  # wraps around 2^p at every step
        yield "alternating", (np.arange(n)[None, :] % 2) * top


class Sort(Application):
    name = "sort"
    theorem = "library (Columnsort, push-only MPC; P2 L56: sorting in O(1) MPC rounds)"
    domain_name = "words"

    def protocol(self, n: int, value_bits: int = 8) -> Protocol:
        return lib.sort(n, value_bits)

    def domain(self, model):
        return 1 << model.params["value_bits"]

    def truth(self, model, x):
        return sort_truth(x)

    def adversarial(self, model, seed):
        n, d = model.n, self.domain(model)
        pos = np.arange(n, dtype=np.int64)[None, :]
        yield "all-equal", np.zeros((1, n), dtype=np.int64)
        yield "all-max", np.full((1, n), d - 1, dtype=np.int64)
        yield "sorted", pos * d // n
        yield "reversed", (n - 1 - pos) * d // n
        yield "two-values", (pos % 2) * (d - 1)


APPLICATIONS: dict[str, Application] = {
    "match2": Match2(),
    "induction-heads": KHop("induction-heads", fixed_hops=1),
    "k-hop": KHop("k-hop"),
    "prefix-sums": PrefixSums(),
    "sort": Sort(),
}


def build(name: str, n: int, **params) -> MPCModel:
    """Build application ``name`` (one of :data:`APPLICATIONS`) for ``n`` machines / tokens."""
    if name not in APPLICATIONS:
        raise CheckError(f"application must be one of {sorted(APPLICATIONS)}, got {name!r}")
    return APPLICATIONS[name].build(n, **params)
