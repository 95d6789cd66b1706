"""The applications of P2 Thm 4.1 as tasks: ground truths, input sources and built programs.

An :class:`Application` is the task of a construction that is an EMA program (P2 §5): it builds the
protocol (L1, :mod:`exactformer.constructions.mpc.library`) and compiles it (L2,
:mod:`exactformer.constructions.mpc.compile`) into a :class:`ProgramModel`, states the ground
truth (vectorised, below; the tests compare it with P2's definitions written out in pure Python)
and the input sources: ``exhaustive`` (for the string tasks every restricted growth string -- one
string per equality pattern, which covers every alphabet because the protocols use tokens only
through equality), ``sample`` (seeded) and ``adversarial`` (named kinds, deterministic given the
seed). Running and checking programs is :mod:`exactformer.verify.mpc.check`'s job.

Match2's ground truth and inputs serve two constructions: the EMA program here and the softmax
model of :mod:`exactformer.constructions.theorems.match2` (its lowering, docs/ema.md).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from exactformer.constructions.mpc import library as lib
from exactformer.constructions.mpc.program import EMAProgram
from exactformer.constructions.mpc.protocol import Protocol
from exactformer.constructions.mpc.compile import (
    ResourceReport,
    compile_protocol,
    resources,
)
from exactformer.constructions.core.task import Batch, Domains, Task, TaskError
from exactformer.precision import FixedPoint

COUNT_WORK_LIMIT = 1 << 18  # count_rgs is exact up to n * min(n, blocks) of this many steps


class ApplicationError(TaskError):
    """Bad parameters of an application, or a bad input (the message names the parameter)."""


# ------------------------------------------------------------------------------------------------
# ground truths
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
        raise ApplicationError(f"n must be >= 1, got {n}")
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


def count_rgs(n: int, blocks: int | None = None) -> int | float:
    """Number of restricted growth strings of length n with at most ``blocks`` values (Σ_j S(n, j)),
    exact while the recurrence takes at most :data:`COUNT_WORK_LIMIT` steps; beyond that
    ``math.inf`` (then there are at least 2^(n−1) > 2^1000 of them whenever blocks >= 2, and no
    caller needs the exact number)."""
    cap = n if blocks is None else max(1, min(n, blocks))
    if cap >= 2 and n * cap > COUNT_WORK_LIMIT:
        return math.inf
    row = [1] + [0] * cap  # Stirling numbers of the second kind S(m, j), j = 0..cap
    for m in range(1, n + 1):
        row = [0] + [j * row[j] + row[j - 1] for j in range(1, cap + 1)]
    return sum(row)


# ------------------------------------------------------------------------------------------------
# built programs and applications
# ------------------------------------------------------------------------------------------------


@dataclass
class ProgramModel:
    """A built application: the protocol (L1), its compiled EMA program (L2), their resources and the
    coarsest exact fixed-point format (``program.min_format()``). It is to EMA-program constructions
    what :class:`~exactformer.constructions.core.ir.CompiledModel` is to weight models: data; running
    it needs :mod:`exactformer.verify` (``xf.build`` returns it wrapped in
    :class:`exactformer.verify.mpc.check.MPCModel`)."""

    application: "Application"
    params: dict
    protocol: Protocol
    program: EMAProgram
    resources: ResourceReport
    fmt: FixedPoint

    @property
    def construction(self) -> str:
        return self.application.name

    @property
    def theorem(self) -> str:
        return self.application.theorem

    @property
    def name(self) -> str:
        return self.application.name

    @property
    def n(self) -> int:
        return self.protocol.n

    def summary(self) -> dict[str, Any]:
        """Sizes beside P2 Thm 4.1's bounds (JSON-able)."""
        r = self.resources
        return {"construction": self.construction, "theorem": self.theorem, "n": self.n, "params": dict(self.params),
                "kind": "ema-program", "layers": r.layers, "heads": list(r.heads), "max_heads": r.max_heads,
                "m": r.m, "memory": r.memory, "residual_words": r.residual, "word_bits": r.word_bits,
                "precision": self.fmt.name, "is_mpc": r.is_mpc,
                "bounds": [{"quantity": q, "built": b, "P2": p} for q, b, p in r.rows()]}


class Application(Task):
    """An application of Thm 4.1 as a task: a protocol builder, its ground truth and its input
    sources (the :class:`~exactformer.constructions.core.task.Task` interface, the model being a
    :class:`ProgramModel`). It has no certificate (its element-wise maps are arbitrary functions,
    P2 Def. 2.2): it is verified by running inputs, every one (every equality pattern for the
    string tasks) or seeded samples (:mod:`exactformer.verify.mpc.check`)."""

    modes = ("exhaustive", "sample")
    name = ""
    theorem = ""
    domain_name = "inputs"
    #: how a natural input becomes the program's input (schema of docs/exports.md): word i is x_i
    ENCODING: dict[str, Any] = {"inputs": [{"name": "x", "type": "N ints in [0, domain)"}],
                                "tokens": [{"for_each": "x", "token": "{}"}]}
    #: the registered construction whose weights compute this program's task (docs/mpc.md), if there
    #: is one, built with ``lowered_params``: the differential check's last level
    lowered_construction: str | None = None
    #: whether that construction lowers the program head for head (Match2: each EMA head one
    #: softmax head, compared bit for bit), or only computes the same answers (k-hop)
    lowered_heads: bool = False
    #: whether that construction simulates the protocol round for round (prefix sums: layer r is
    #: round r), so that its residual stream after layer r decodes to the protocol's memory after
    #: round r (``decode_memory`` of constructions/theorems/mpc_simulation.py), checked per round
    lowered_rounds: bool = False

    # ---- to implement ---------------------------------------------------------------------------
    def protocol(self, n: int, **params) -> Protocol:
        raise NotImplementedError

    def domain(self, model: ProgramModel) -> int:
        """Inputs are integers in [0, domain)."""
        raise NotImplementedError

    def named(self, model: ProgramModel, seed: int) -> Iterator[tuple[str, np.ndarray]]:
        """The named hard inputs: (kind, inputs [B, n])."""
        raise NotImplementedError

    def lowered_params(self, model: ProgramModel) -> dict[str, Any]:
        return {}

    # ---- the task: one word per machine ----------------------------------------------------------------
    def length(self, model: ProgramModel) -> int:
        return model.n

    def domains(self, model: ProgramModel) -> Domains:
        return Domains([np.arange(self.domain(model))], np.zeros(model.n, dtype=np.int64))

    def encode_arrays(self, model: ProgramModel, x: np.ndarray) -> np.ndarray:
        return np.atleast_2d(np.asarray(x, dtype=np.int64))

    def to_arrays(self, model: ProgramModel, examples: list[Any]) -> tuple[np.ndarray, ...]:
        try:
            x = np.asarray(examples)
        except ValueError:
            x = np.asarray([], dtype=float)
        if x.ndim != 2 or x.shape[-1] != model.n or x.dtype.kind not in "iu":
            raise ApplicationError(f"{self.domain_name} must be integers of shape [{model.n}] or [B, {model.n}], got "
                                   f"{x.dtype} {list(x.shape)[1:]}")
        d = self.domain(model)
        if x.size and (x.min() < 0 or x.max() >= d):
            raise ApplicationError(f"{self.domain_name} must lie in [0, {d}), got values in [{x.min()}, {x.max()}]")
        return (x.astype(np.int64),)

    # ---- sources ----------------------------------------------------------------------------------
    def exhaustive(self, model: ProgramModel, batch: int = 4096) -> Iterator[Batch]:
        """Every input (default: all of [0, domain)^n in counting order)."""
        d, n = self.domain(model), model.n
        total = d**n
        for lo in range(0, total, batch):
            idx = np.arange(lo, min(total, lo + batch), dtype=np.int64)
            yield self.batch(model, (idx[:, None] // d ** np.arange(n - 1, -1, -1, dtype=np.int64)) % d,
                             kind="exhaustive")

    def count(self, model: ProgramModel) -> int | float:
        return self.domain(model) ** model.n

    def sample(self, model: ProgramModel, count: int, seed: int) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        batch = max(1, (1 << 20) // model.n)
        for lo in range(0, count, batch):
            yield self.batch(model, self.draw(model, rng, min(batch, count - lo)), kind="sample")

    def adversarial(self, model: ProgramModel, count: int, seed: int) -> Iterator[Batch]:
        done = 0
        for kind, x in self.named(model, seed):
            take = x[: max(0, count - done)]
            if len(take):
                yield self.batch(model, take, kind=kind)
                done += len(take)

    def draw(self, model: ProgramModel, rng: np.random.Generator, b: int) -> np.ndarray:
        return rng.integers(0, self.domain(model), size=(b, model.n))

    # ---- building and encoding ------------------------------------------------------------------
    def build(self, n: int, **params) -> ProgramModel:
        allowed = [k for k in inspect.signature(self.protocol).parameters if k != "n"]
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ApplicationError(f"{self.name}: unknown parameter(s) {unknown}; allowed: {allowed}")
        protocol = self.protocol(n, **params)
        program = compile_protocol(protocol)
        return ProgramModel(self, dict(protocol.params), protocol, program, resources(protocol), program.min_format())


# ---- Match2 ------------------------------------------------------------------------------------


def match2_draw(n: int, modulus: int, rng: np.random.Generator, b: int) -> np.ndarray:
    """b random Match2 inputs: residues from a random subset of [0, M) per input (its size 1, 2, 4,
    M/4 or M, uniformly), so that positions with and without a partner both occur."""
    sizes = np.array(sorted({max(1, min(modulus, s)) for s in (1, 2, 4, modulus // 4, modulus)}))
    size = sizes[rng.integers(0, len(sizes), size=b)]
    pools = np.argsort(rng.random((b, modulus)), axis=1)  # a random order of the residues per input
    pick = (rng.random((b, n)) * size[:, None]).astype(np.int64)
    return np.take_along_axis(pools, pick, axis=1)


def match2_adversarial(n: int, modulus: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """Named Match2 inputs (docs/mpc.md, "Verification"): all x ≡ 0 (c = N for every position), all x ≡ M/2 (M even),
    no pair, exactly one pair per position, distinct residues, every residue M − 1."""
    M = modulus
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


class Match2(Application):
    name = "match2"
    theorem = "P2 Thm 5.2 (Def. 5.1)"
    domain_name = "Match2 inputs (residues)"
    lowered_construction = "match2"
    lowered_heads = True

    def protocol(self, n: int, modulus: int = 37) -> Protocol:
        return lib.match2(n, modulus)

    def domain(self, model):
        return model.params["modulus"]

    def truth(self, model, x):
        return match2_truth(x, model.params["modulus"])

    def draw(self, model, rng, b):
        return match2_draw(model.n, model.params["modulus"], rng, b)

    def named(self, model, seed):
        return match2_adversarial(model.n, model.params["modulus"], seed)

    def lowered_params(self, model):
        return {"modulus": model.params["modulus"]}


# ---- induction heads and k-hop -------------------------------------------------------------------


def k_hop_draw(n: int, alphabet: int, rng: np.random.Generator, b: int) -> np.ndarray:
    """b random k-hop inputs [b, n]: tokens from the first 2, 4, n/4, n or |Sigma| symbols (one size
    per input, uniformly), so that short and long hop chains both occur."""
    sizes = np.array(sorted({max(1, min(alphabet, v)) for v in (2, 4, n // 4, n, alphabet)}))
    size = sizes[rng.integers(0, len(sizes), size=b)]
    return (rng.random((b, n)) * size[:, None]).astype(np.int64)


def k_hop_adversarial(n: int, alphabet: int, branching: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """Named hard cases (docs/mpc.md, "Verification"): fixed points, no repeats, long chains, and
    last occurrences at the block boundaries of a ``branching``-ary search."""
    S, B = alphabet, branching
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


class KHop(Application):
    """k-hop induction heads (P2 Def. 5.5, Thm 5.6); ``hops = 1`` is induction heads (Def. 5.3, Thm 5.4)."""

    domain_name = "tokens"

    def __init__(self, name: str = "k-hop", fixed_hops: int | None = None):
        self.name = name
        self.fixed_hops = fixed_hops
        self.theorem = "P2 Thm 5.4 (Def. 5.3)" if fixed_hops == 1 else "P2 Thm 5.6 (Def. 5.5)"
        self.lowered_construction = name  # the weights (constructions/theorems/induction_heads.py): same answers

    def lowered_params(self, model):
        hops = {} if self.fixed_hops is not None else {"k": model.params["hops"]}
        return hops | {"alphabet": max(2, model.params["alphabet"])}

    def protocol(self, n: int, hops: int = 1, alphabet: int | None = None, branching: int = 2) -> Protocol:
        if self.fixed_hops is not None:
            if hops != self.fixed_hops:
                raise ApplicationError(f"{self.name} has hops = {self.fixed_hops}; use k-hop for other hop counts")
            return lib.induction_heads(n, n if alphabet is None else alphabet, branching)
        return lib.k_hop(n, hops, n if alphabet is None else alphabet, branching)

    def domain(self, model):
        return model.params["alphabet"]

    def truth(self, model, x):
        return k_hop_truth(x, model.params["hops"])

    def count(self, model):
        return count_rgs(model.n, self.domain(model))

    def exhaustive(self, model, batch=4096):
        """Every equality pattern: the restricted growth strings with at most |Σ| values."""
        for x in restricted_growth_strings(model.n, self.domain(model), batch):
            yield self.batch(model, x, kind="exhaustive")

    def draw(self, model, rng, b):
        return k_hop_draw(model.n, self.domain(model), rng, b)

    def named(self, model, seed):
        return k_hop_adversarial(model.n, self.domain(model), model.params["branching"], seed)


def prefix_sums_adversarial(n: int, word_bits: int, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """Named prefix-sums inputs: all-zero, all-max (the sum wraps around 2^p at every step),
    alternating 0 / max, one max word at each position (a carry travelling through every level of
    the tree), and words whose block sums are each exactly 2^p (every carry out of the word drops)."""
    top = (1 << word_bits) - 1
    pos = np.arange(n)[None, :]
    yield "all-zero", np.zeros((1, n), dtype=np.int64)
    yield "all-max", np.full((1, n), top, dtype=np.int64)
    yield "alternating", (pos % 2) * top
    yield "one-max", np.where(np.arange(n)[:, None] == pos, top, 1).astype(np.int64)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, top + 1, size=(4, n))
    x[:, 1::2] = (top + 1 - x[:, 0::2][:, : n // 2]) & top  # pairs summing to 2^p (or 0)
    yield "pairs-to-2^p", x


# ---- push-only library protocols --------------------------------------------------------------------


class PrefixSums(Application):
    name = "prefix-sums"
    theorem = "library (push-only MPC; not in P2)"
    domain_name = "words"
    #: the weights simulate this protocol round for round (constructions/theorems/mpc_simulation.py):
    #: the check decodes their residual stream after every layer against the memory
    lowered_construction = "prefix-sums"
    lowered_rounds = True

    def lowered_params(self, model):
        return {"word_bits": model.params["word_bits"], "fan_in": model.params["fan_in"]}

    def protocol(self, n: int, word_bits: int = 8, fan_in: int = 2) -> Protocol:
        return lib.prefix_sums(n, word_bits, fan_in)

    def domain(self, model):
        return 1 << model.params["word_bits"]

    def truth(self, model, x):
        return prefix_sums_truth(x, model.params["word_bits"])

    def named(self, model, seed):
        yield from prefix_sums_adversarial(model.n, model.params["word_bits"], seed)


class Sort(Application):
    name = "sort"
    theorem = "library (Columnsort, push-only MPC; P2 Sec. 2.2: sorting in O(1) MPC rounds)"
    domain_name = "words"

    def protocol(self, n: int, value_bits: int = 8) -> Protocol:
        return lib.sort(n, value_bits)

    def domain(self, model):
        return 1 << model.params["value_bits"]

    def truth(self, model, x):
        return sort_truth(x)

    def named(self, model, seed):
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
