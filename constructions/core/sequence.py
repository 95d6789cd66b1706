"""A task of one's own: token sequences, a truth, and the shape of the answer.

A :class:`SequenceTask` is a task whose natural input *is* its token sequence: T tokens (T =
``length(model)``, default N), the token at position t one of ``domains(model)[t]`` (default
``0 .. alphabet-1`` at every position, ``alphabet`` a task parameter). Everything a task must
state -- encoding, input counts, every input, seeded samples, adversarial inputs, the export's
encoding -- follows; the author writes :meth:`SequenceTask.truth` (the answers, as values, for
inputs ``x`` [B, T]) and :meth:`SequenceTask.rule`: which tokens the answer depends on, one of

* :class:`TokenAt` ``(p)``: a function of the token at position p (a copy: the identity);
* :class:`TokenAtPointer` ``(q, pointer)``: a function of the token at the position that the
  token at q names (``pointer(u)``: the position token u names, or -1) -- Index Lookup's shape;
* :class:`FunctionOf` ``(p1, p2, ...)``: a function of the tokens at several positions;
* :class:`CountOver` ``(positions, feature)``: a function of how many of ``positions`` hold a
  token with the ``feature`` (a count, an average, a majority over a set).

A rule names no answer: the answers come from the truth. :meth:`Rule.resolve` evaluates ``truth``
on one input per combination of the tokens the rule reads (the other tokens fixed) and states the
result as a specification in the certificate's terms (:class:`~exactformer.constructions.core.spec.Reads`,
:class:`~exactformer.constructions.core.spec.Select`, :class:`~exactformer.constructions.core.spec.CountOf`),
whose ``values`` are the truth's answers. A truth that depends on more than its rule says is caught
before any certificate passes: the specification is checked against the truth on every input of
the registered small build and of the model's own N (:mod:`exactformer.verify.certify.spec_check`),
and a disagreement names the first input.

The answer is read at one position, ``at`` (default -1: the last); negative positions count from
the end.
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from exactformer.constructions.core.spec import CountOf, Reads, Select, Spec
from exactformer.constructions.core.task import Batch, Domains, PowerCount, Task, TaskError, power_count

#: the most combinations a rule evaluates the truth on to derive its table
MAX_COMBINATIONS = 1 << 16


class RuleError(TaskError):
    """A rule that does not fit its task (a position out of range, too many combinations ...)."""


class SequenceTask(Task):
    """A task whose natural input is its token sequence (module docstring). Subclasses give
    :meth:`truth` and :meth:`rule`; :meth:`length` (default ``model.n``) and :meth:`domains`
    (default ``0 .. alphabet-1`` everywhere, ``alphabet`` read from ``model.task_params``) where
    they differ. Tokens are named by their ids (the builder's default ``vocab``)."""

    ENCODING = {"inputs": [{"name": "tokens", "type": "T token ids, each allowed at its position (domains)"}],
                "tokens": [{"for_each": "tokens", "token": "{}"}]}

    @abstractmethod
    def truth(self, model: Any, x: np.ndarray) -> np.ndarray:
        """The answers (values, as the task defines them) of the inputs ``x`` [B, T]: [B]."""

    @abstractmethod
    def rule(self, model: Any) -> "Rule":
        """Which tokens the answer depends on (:class:`TokenAt`, :class:`TokenAtPointer`,
        :class:`FunctionOf`, :class:`CountOver`)."""

    def spec(self, model: Any) -> Spec:
        """:meth:`rule` stated in the certificate's terms, its table from :meth:`truth`."""
        return self.rule(model).resolve(self, model)

    def length(self, model: Any) -> int:
        return int(model.n)

    def alphabet(self, model: Any) -> int:
        """The tokens are 0 .. alphabet-1 (the task parameter ``alphabet``)."""
        if "alphabet" not in model.task_params:
            raise TaskError(f"{type(self).__name__}: task_params has no 'alphabet' (or override domains)")
        return int(model.task_params["alphabet"])

    def domains(self, model: Any) -> Domains:
        T = self.length(model)
        return Domains([np.arange(self.alphabet(model), dtype=np.int64)], np.zeros(T, dtype=np.int64))

    # ---- encoding -------------------------------------------------------------------------------------
    def encode_arrays(self, model: Any, x: np.ndarray) -> np.ndarray:
        return np.atleast_2d(np.asarray(x, dtype=np.int64))

    def to_arrays(self, model: Any, examples: list[Any]) -> tuple[np.ndarray, ...]:
        T, dom = self.length(model), self.domains(model)
        try:
            x = np.asarray(examples, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise TaskError(f"an input is a list of {T} token ids (integers)") from None
        if x.ndim != 2 or x.shape[1] != T:
            raise TaskError(f"an input is a list of {T} token ids, got shape {list(x.shape)[1:]}")
        for d, values in enumerate(dom.values):
            at = np.flatnonzero(dom.of == d)
            bad = ~np.isin(x[:, at], values)
            if bad.any():
                b, i = np.argwhere(bad)[0]
                raise TaskError(f"the token at position {int(at[i])} must be one of {_shown(values)}, "
                                f"got {int(x[b, at[i]])}")
        return (x,)

    # ---- inputs ---------------------------------------------------------------------------------------
    def _sizes(self, model: Any) -> tuple[Domains, np.ndarray]:
        dom = self.domains(model)
        return dom, np.array([len(dom[t]) for t in range(len(dom))], dtype=np.int64)

    def count(self, model: Any) -> int | PowerCount:
        dom, sizes = self._sizes(model)
        if np.all(sizes == sizes[0]):
            return power_count(int(sizes[0]), int(sizes.size))
        return math.prod(int(s) for s in sizes)

    def exhaustive(self, model: Any, batch: int = 4096) -> Iterator[Batch]:
        """Every input in counting order (position 0 most significant)."""
        dom, sizes = self._sizes(model)
        total = math.prod(int(s) for s in sizes)
        weights = [math.prod(int(s) for s in sizes[t + 1:]) for t in range(sizes.size)]
        for lo in range(0, total, batch):
            idx = np.arange(lo, min(total, lo + batch), dtype=object)
            x = np.stack([np.asarray(dom[t])[((idx // w) % int(s)).astype(np.int64)]
                          for t, (w, s) in enumerate(zip(weights, sizes))], axis=1) if sizes.size else np.zeros((idx.size, 0))
            yield self.batch(model, x.astype(np.int64), kind="exhaustive")

    def sample(self, model: Any, count: int, seed: int, batch: int = 1024) -> Iterator[Batch]:
        """``count`` inputs, every token uniform in its domain, from ``np.random.default_rng(seed)``."""
        rng = np.random.default_rng(seed)
        dom, sizes = self._sizes(model)
        for done in range(0, count, batch):
            b = min(batch, count - done)
            pick = (rng.random((b, sizes.size)) * sizes).astype(np.int64)
            x = np.stack([np.asarray(dom[t])[pick[:, t]] for t in range(sizes.size)], axis=1)
            yield self.batch(model, x, kind="sample")

    def adversarial(self, model: Any, count: int, seed: int) -> Iterator[Batch]:
        """Constant inputs (every position its domain's i-th token) and, from a seeded draw, inputs
        alternating between two tokens: the inputs where the most positions look alike."""
        rng = np.random.default_rng(seed)
        dom, sizes = self._sizes(model)
        top = int(sizes.max()) if sizes.size else 0
        rows = [[int(dom[t][i % sizes[t]]) for t in range(sizes.size)] for i in range(min(top, count))]
        while len(rows) < count and top > 1:
            i, j = rng.integers(0, top, size=2)
            rows.append([int(dom[t][(i if t % 2 else j) % sizes[t]]) for t in range(sizes.size)])
        if rows:
            yield self.batch(model, np.array(rows[:count], dtype=np.int64), kind="constant, alternating")


def _shown(values: np.ndarray) -> str:
    v = np.asarray(values)
    if v.size and np.array_equal(v, np.arange(v[0], v[0] + v.size)):
        return f"{int(v[0])} .. {int(v[-1])}"
    return ", ".join(str(int(u)) for u in v[:8]) + (" ..." if v.size > 8 else "")


# ------------------------------------------------------------------------------------------------
# rules: the shape of the answer, its table from the truth
# ------------------------------------------------------------------------------------------------


class Rule:
    """Which tokens a :class:`SequenceTask`'s answer depends on (module docstring)."""

    at: int = -1

    @abstractmethod
    def resolve(self, task: SequenceTask, model: Any) -> Spec:
        """The specification: this shape, its table from ``task.truth``."""

    @staticmethod
    def _position(p: int, T: int, what: str) -> int:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not -T <= p < T:
            raise RuleError(f"{what} must be a position in [{-T}, {T}) (inputs have {T} tokens), got {p!r}")
        return int(p) % T


def _answers(task: SequenceTask, model: Any, x: np.ndarray) -> tuple[np.ndarray, tuple]:
    """The truth on inputs ``x`` as answer indices, and the answers they index (sorted where they sort)."""
    got = list(np.asarray(task.truth(model, x), dtype=object).reshape(len(x), -1)[:, 0])
    distinct = list(dict.fromkeys(got))
    try:
        distinct = sorted(distinct)
    except TypeError:
        pass
    index = {v: i for i, v in enumerate(distinct)}
    return np.array([index[v] for v in got], dtype=np.int64), tuple(distinct)


def _base(task: SequenceTask, model: Any) -> tuple[Domains, np.ndarray]:
    """The domains and one input (every token the first of its domain) to vary."""
    dom = task.domains(model)
    return dom, np.array([int(dom[t][0]) for t in range(len(dom))], dtype=np.int64)


def _combinations(count: int, what: str) -> None:
    if count > MAX_COMBINATIONS:
        raise RuleError(f"{what}: {count} combinations of the tokens it reads, more than the {MAX_COMBINATIONS} "
                        "a rule derives its table from")


@dataclass(frozen=True)
class FunctionOf(Rule):
    """The answer (read at ``at``) is a function of the tokens at ``positions``."""

    positions: tuple[int, ...]
    at: int = -1

    def __init__(self, *positions: int, at: int = -1):
        object.__setattr__(self, "positions", tuple(positions))
        object.__setattr__(self, "at", at)

    def resolve(self, task: SequenceTask, model: Any) -> Reads:
        T = task.length(model)
        at = self._position(self.at, T, "at")
        ps = list(dict.fromkeys(self._position(p, T, f"position {p}") for p in self.positions))  # each read once
        dom, base = _base(task, model)
        axes = [np.asarray(dom[p], dtype=np.int64) for p in ps]
        _combinations(math.prod(len(a) for a in axes), type(self).__name__)
        combos = np.array(list(itertools.product(*axes)), dtype=np.int64).reshape(-1, len(ps))
        x = np.repeat(base[None, :], len(combos), axis=0)
        for i, p in enumerate(ps):
            x[:, p] = combos[:, i]
        index, values = _answers(task, model, x)
        table = index.reshape(tuple(len(a) for a in axes)) if ps else np.asarray(index[0])
        return Reads(at, tuple(("tok", p) for p in ps), tuple(axes), table, values)


class TokenAt(FunctionOf):
    """The answer (read at ``at``) is a function of the token at ``position`` (a copy: the identity)."""

    def __init__(self, position: int, at: int = -1):
        super().__init__(position, at=at)


@dataclass(frozen=True)
class TokenAtPointer(Rule):
    """The answer (read at ``at``) is a function of the token at the position that the token at
    ``query`` names: ``pointer(u)`` is the position token u names (-1: none)."""

    query: int
    pointer: Callable[[int], int]
    at: int = -1

    def resolve(self, task: SequenceTask, model: Any) -> Select:
        T = task.length(model)
        at, q = self._position(self.at, T, "at"), self._position(self.query, T, "query")
        dom, base = _base(task, model)
        d_vocab = int(max(int(np.max(v)) for v in dom.values)) + 1
        pointer = np.full(d_vocab, -1, dtype=np.int64)
        for u in np.asarray(dom[q]).tolist():
            p = self.pointer(int(u))
            if p is not None and p >= 0:
                pointer[u] = self._position(p, T, f"pointer({u})")
        named = np.unique(pointer[pointer >= 0])
        if named.size == 0:
            raise RuleError(f"TokenAtPointer: no token at position {q} names a position")
        tokens = np.unique(np.concatenate([dom[int(p)] for p in named]))
        _combinations(int(tokens.size), "TokenAtPointer")
        u0 = int(np.flatnonzero(pointer >= 0)[0])
        x = np.repeat(base[None, :], tokens.size, axis=0)
        x[:, q] = u0
        x[:, pointer[u0]] = tokens
        index, values = _answers(task, model, x)
        answer_of = np.full(d_vocab, -1, dtype=np.int64)
        answer_of[tokens] = index
        return Select(at, q, pointer, answer_of, values)


@dataclass(frozen=True)
class CountOver(Rule):
    """The answer (read at ``at``) is a function of how many of ``positions`` hold a token with the
    ``feature`` (a predicate on token ids, or the set of token ids that have it)."""

    positions: Sequence[int]
    feature: Any
    at: int = -1

    def _has(self, tokens: np.ndarray) -> np.ndarray:
        f = self.feature
        if callable(f):
            return np.array([bool(f(int(u))) for u in tokens], dtype=bool)
        return np.isin(tokens, np.asarray(list(f), dtype=np.int64))

    def resolve(self, task: SequenceTask, model: Any) -> CountOf:
        T = task.length(model)
        at = self._position(self.at, T, "at")
        ps = sorted({self._position(p, T, f"position {p}") for p in self.positions})
        if not ps:
            raise RuleError("CountOver: positions must name at least one position")
        dom, base = _base(task, model)
        features, yes, no = [], [], []
        for p in ps:
            d = np.asarray(dom[p], dtype=np.int64)
            has = self._has(d)
            if has.all() or not has.any():
                raise RuleError(f"CountOver: position {p} allows tokens {_shown(d)}, "
                                f"{'all' if has.all() else 'none'} of which have the feature: the count would not vary there")
            features.append((np.array([[p]]), has.astype(np.int64)))
            yes.append(int(d[has][0]))
            no.append(int(d[~has][0]))
        x = np.repeat(base[None, :], len(ps) + 1, axis=0)
        for k in range(len(ps) + 1):  # k positions with the feature: the first k
            x[k, ps] = yes[:k] + no[k:]
        index, values = _answers(task, model, x)
        return CountOf(at, features, index, values)
