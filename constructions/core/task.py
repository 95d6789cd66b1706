"""Tasks and the registry of constructions.

A :class:`Task` is the problem a construction solves, independent of any model: its natural
inputs (held as arrays), their encoding as tokens, the ground truth, input sources (all inputs,
seeded samples, adversarial inputs, candidates for a failed proof) and the specification the
certificate compares with (:mod:`exactformer.constructions.core.spec`).

Constructions register their builder with their task in :mod:`exactformer.constructions.core.registry`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.core.streams import GeneratedTokens


#: the verification modes, strongest first: a proof for every input, every input run, seeded samples
MODES = ("certify", "exhaustive", "sample")
EXHAUSTIVE_LIMIT = 1 << 22  # inputs; exhaustive mode refuses more

EXACT_DIGITS = 6  # counts below 10^6 are written out; larger ones as powers where they are products of powers
DECIMAL_LIMIT = 10**12  # a larger count that is no such product is written as "about 2^x"


def same_answer(a: Any, b: Any) -> bool:
    """Whether two answers are the same: a model's answer (None: "no answer", as k-hop's ⊥) and a
    truth (where "no answer" is -1, an array entry) compare as the verifier compares them."""
    a, b = (-1 if v is None else v for v in (a, b))
    return bool(a == b)


class TaskError(ValueError):
    """A natural input the task does not accept (the message names the parameter and the range)."""


def _power(count: int, base: int) -> tuple[int, int]:
    """(e, rest) with count = base^e * rest (count >= 1) and rest not divisible by base: by the
    squares base^(2^i) that divide it, largest first (O(log e) big divisions; one factor at a time
    was quadratic in the count's size: minutes for MQAR at N = 2^16)."""
    if base == 2:
        e = (count & -count).bit_length() - 1
        return e, count >> e
    squares = [base]
    while count % squares[-1] == 0:
        squares.append(squares[-1] * squares[-1])
    e = 0
    for i in range(len(squares) - 2, -1, -1):
        if count % squares[i] == 0:
            count //= squares[i]
            e += 1 << i
    return e, count


def _nth_root(count: int, n: int) -> int:
    """floor(count^(1/n)) for count >= 1."""
    b = max(1, int(round(2 ** (math.log2(count) / n))))
    while b > 1 and b**n > count:
        b -= 1
    while (b + 1) ** n <= count:
        b += 1
    return b


#: counts with more bits than this are held as :class:`PowerCount` (never multiplied out)
EXACT_BITS = 1 << 16


def redefines(obj: Any, cls: type, name: str) -> bool:
    """Whether ``type(obj)`` redefines method ``name`` of ``cls`` (a subclass's own array form means
    ``cls``'s O(1) run form no longer describes it)."""
    return getattr(type(obj), name) is not getattr(cls, name)


class PowerCount:
    """An input count ``base^exp * mult`` held as its factors: Index Lookup at N = 2^30 has
    64^(2^30) * 2^30 inputs, a number of 6 * 2^30 bits that no report needs written out.
    Compares with numbers (exactly while it has at most :data:`EXACT_BITS` bits, else by its log2)."""

    def __init__(self, base: int, exp: int, mult: int = 1):
        self.base, self.exp, self.mult = int(base), int(exp), int(mult)

    def log2(self) -> float:
        return self.exp * math.log2(self.base) + math.log2(self.mult)

    def small(self) -> bool:
        return self.log2() <= EXACT_BITS

    def __int__(self) -> int:
        if not self.small():
            raise OverflowError(f"{self} has more than 2^{EXACT_BITS.bit_length() - 1} bits")
        return self.base**self.exp * self.mult

    def _cmp(self, other: Any) -> int:
        if isinstance(other, PowerCount):
            a, b = (int(self), int(other)) if self.small() and other.small() else (self.log2(), other.log2())
        elif isinstance(other, float) and math.isinf(other):
            a, b = 0, 1 if other > 0 else -1
        elif self.small():
            a, b = int(self), other
        else:
            a, b = self.log2(), math.log2(other) if other > 0 else -math.inf
        return (a > b) - (a < b)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, (int, float, PowerCount)) and self._cmp(other) == 0

    def __lt__(self, other: Any) -> bool:
        return self._cmp(other) < 0

    def __le__(self, other: Any) -> bool:
        return self._cmp(other) <= 0

    def __gt__(self, other: Any) -> bool:
        return self._cmp(other) > 0

    def __ge__(self, other: Any) -> bool:
        return self._cmp(other) >= 0

    def __hash__(self) -> int:
        return hash((self.base, self.exp, self.mult))

    def __repr__(self) -> str:
        return f"{self.base}^{self.exp}" + (f"*{self.mult}" if self.mult != 1 else "")


class ArrangementCount(PowerCount):
    """``base^exp * perm(a, h) * h!`` held as its factors: MQAR's first halves (h distinct symbols of
    a), their orders in the second half and the labels; at N = 2^20 a number of some 2^24 bits
    whose factorials alone take seconds to multiply out. log2 from ``math.lgamma``."""

    def __init__(self, base: int, exp: int, a: int, h: int):
        super().__init__(base, exp, 1)
        self.a, self.h = int(a), int(h)

    def log2(self) -> float:
        return self.exp * math.log2(self.base) + (math.lgamma(self.a + 1) - math.lgamma(self.a - self.h + 1)
                                                  + math.lgamma(self.h + 1)) / math.log(2)

    def __int__(self) -> int:
        if not self.small():
            raise OverflowError(f"{self} has more than 2^{EXACT_BITS.bit_length() - 1} bits")
        return self.base**self.exp * math.perm(self.a, self.h) * math.factorial(self.h)

    def __hash__(self) -> int:
        return hash((self.base, self.exp, self.a, self.h))

    def __repr__(self) -> str:
        return f"{self.base}^{self.exp}*perm({self.a},{self.h})*{self.h}!"


def arrangement_count(base: int, exp: int, a: int, h: int) -> int | ArrangementCount:
    """``base^exp * perm(a, h) * h!``: an int while it has at most :data:`EXACT_BITS` bits, else held
    as its factors (:class:`ArrangementCount`)."""
    c = ArrangementCount(base, exp, a, h)
    return int(c) if c.small() else c


def power_count(base: int, exp: int, mult: int = 1) -> int | PowerCount:
    """``base^exp * mult``: an int while it has at most :data:`EXACT_BITS` bits, else a :class:`PowerCount`."""
    c = PowerCount(base, exp, mult)
    return int(c) if c.small() else c


def format_count(count: int | float | PowerCount, n: int | None = None) -> str:
    """An input count, short: written out below 10^6; else exactly as powers -- ``b^N*m`` when
    ``n`` = N is given and count = b^N * m with m < 10^6 (Index Lookup's ``64^4096*4096``), else
    ``p^e*m`` for p in 2, 3, 5, 7 and m < 10^6 (``2^4096``); else written out below 10^12;
    else ``about 2^x`` (x = log2 to one decimal). ``math.inf`` (a count too large to compute --
    :func:`~exactformer.constructions.mpc.applications.count_rgs` above 2^1000 -- or inputs that no finite
    family enumerates, as the grid vectors of nearest neighbour) is ``too many to count``. Never a
    number with more digits than that (Python refuses to print ints above 4300 digits). A
    :class:`PowerCount` too large to multiply out is ``b^e*m`` as it is held; an int of more than
    :data:`EXACT_BITS` bits is tried as ``2^e*m`` only."""
    if isinstance(count, PowerCount):
        if not count.small():
            return repr(count)
        count = int(count)
    if isinstance(count, float):
        if math.isinf(count):
            return "too many to count"
        count = int(count)
    small = 10**EXACT_DIGITS
    if count < small:
        return str(count)
    if count.bit_length() > EXACT_BITS:  # a multiplied-out count (MQAR's permutations): the power
        e = (count & -count).bit_length() - 1  # forms below cost seconds of big divisions; base 2 only
        rest = count >> e
        return f"2^{e}" + (f"*{rest}" if rest > 1 else "") if rest < small else f"about 2^{math.log2(count):.1f}"
    if n is not None and n >= 2:
        b = _nth_root(count, n)
        if b >= 2 and count % b**n == 0 and count // b**n < small:
            m = count // b**n
            return f"{b}^{n}" + (f"*{m}" if m > 1 else "")
    e, p = max((_power(count, p)[0], p) for p in (2, 3, 5, 7))
    rest = count // p**e
    if e > 1 and rest < small:
        return f"{p}^{e}" + (f"*{rest}" if rest > 1 else "")
    if count < DECIMAL_LIMIT:
        return str(count)
    return f"about 2^{math.log2(count):.1f}"


def inputs_phrase(count: int | float | PowerCount, n: int | None = None) -> str:
    """``"<count> inputs"`` written short (:func:`format_count`), or ``"too many inputs to count"``."""
    if isinstance(count, float) and math.isinf(count):
        return "too many inputs to count"
    return f"{format_count(count, n)} inputs"


def count_log2(count: int | float | PowerCount) -> float | None:
    """log2 of an input count (None for ``math.inf``, a count too large to compute), 3 decimals."""
    if isinstance(count, PowerCount):
        return round(count.log2(), 3)
    return None if isinstance(count, float) and math.isinf(count) else round(math.log2(count), 3)


@dataclass
class Batch:
    """Natural inputs (task-specific arrays), their token ids and true answers ([B] or [B, A])."""

    arrays: tuple[np.ndarray, ...]
    tokens: np.ndarray
    truth: np.ndarray
    kind: str = ""  # where the inputs come from: "exhaustive", "sample" or an adversarial kind

    def __len__(self) -> int:
        return len(self.tokens)

    def example(self, i: int) -> Any:
        """Input i as the task's natural form (what ``Task.encode`` accepts); an input generated on
        demand (:class:`~exactformer.constructions.core.streams.GeneratedTokens`) as how it is generated."""
        if isinstance(self.tokens, GeneratedTokens):
            return self.tokens.describe(i)
        vals = tuple(a[i].tolist() if np.ndim(a) > 1 else a[i].item() for a in self.arrays)
        return vals[0] if len(vals) == 1 else vals

    def take(self, idx: np.ndarray) -> "Batch":
        return Batch(tuple(a[idx] for a in self.arrays), self.tokens[idx], self.truth[idx], self.kind)

    @staticmethod
    def joinable(a: "Batch", b: "Batch") -> bool:
        """Whether :meth:`join` can put ``a`` and ``b`` in one batch (token arrays and arrays of the same
        shapes past the batch axis)."""
        return (isinstance(a.tokens, np.ndarray) and isinstance(b.tokens, np.ndarray) and a.tokens.shape[1:] == b.tokens.shape[1:]
                and len(a.arrays) == len(b.arrays) and np.shape(a.truth)[1:] == np.shape(b.truth)[1:]
                and all(np.shape(x)[1:] == np.shape(y)[1:] for x, y in zip(a.arrays, b.arrays)))

    @staticmethod
    def join(batches: list["Batch"]) -> "Batch":
        """One batch holding ``batches`` in order (each pair :meth:`joinable`)."""
        if len(batches) == 1:
            return batches[0]
        kinds = sorted({b.kind for b in batches if b.kind})
        return Batch(tuple(np.concatenate(parts) for parts in zip(*(b.arrays for b in batches))),
                     np.concatenate([b.tokens for b in batches]), np.concatenate([np.asarray(b.truth) for b in batches]),
                     "+".join(kinds))


@dataclass
class Domains:
    """The token ids allowed at each position, as a few distinct sets: position t allows
    ``values[of[t]]`` (sorted)."""

    values: list[np.ndarray]
    of: np.ndarray  # [T]
    precondition: Any = None  # what the task assumes beyond the token domains (e.g. a margin on input vectors)

    def __getitem__(self, t: int) -> np.ndarray:
        return self.values[int(self.of[t])]

    def __len__(self) -> int:
        return int(self.of.size)

    def pairs(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (position, token) with the token allowed there, ordered by position: (t, u)."""
        positions = np.asarray(positions, dtype=np.int64)
        sizes = np.array([v.size for v in self.values], dtype=np.int64)[self.of[positions]]
        t = np.repeat(positions, sizes)
        u = np.empty(t.size, dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        for d, vals in enumerate(self.values):
            sel = np.flatnonzero(self.of[positions] == d)
            if sel.size:
                u[(starts[sel][:, None] + np.arange(vals.size)[None, :]).reshape(-1)] = np.tile(vals, sel.size)
        return t, u


class Task(ABC):
    """The interface every task implements (see the module docstring): the task of a weight model
    (all three modes: a certificate, :mod:`exactformer.verify.certify`, every input, samples) and
    of an EMA program (:class:`~exactformer.constructions.mpc.applications.Application`: no
    certificate) alike. The modes are declared, never inferred from a failed proof."""

    #: how a natural input becomes tokens, for exports (schema in docs/exports.md)
    ENCODING: dict[str, Any] = {}
    #: the modes of :data:`MODES` this task's models can be verified in (strongest first)
    modes: tuple[str, ...] = MODES

    # ---- definition ---------------------------------------------------------------------------------
    @abstractmethod
    def length(self, model: Any) -> int:
        """Tokens per input."""

    @abstractmethod
    def domains(self, model: Any) -> Domains:
        """The token ids allowed at each position."""

    @abstractmethod
    def truth(self, model: Any, *arrays: np.ndarray) -> np.ndarray:
        """The true answers of the inputs held as the task's arrays."""

    def check_params(self, model: Any) -> None:
        """Raise :class:`TaskError` (or a ValueError) naming a task parameter of ``model`` that does not
        fit the task (a corrupted feature run reading past N); the verifier reports it instead of
        running. Tasks whose parameters hold more than sizes override it."""

    def spec(self, model: Any) -> Any:
        """The ground truth in the certificate's terms (from the task definition, not the weights);
        a task whose ``modes`` include certify must give one."""
        raise NotImplementedError(f"{type(self).__name__} has no specification (no certify mode)")

    def domain_runs(self, model: Any) -> Any:
        """:meth:`domains` as runs of positions (:class:`~exactformer.constructions.core.runs.DomainRuns`,
        what the run certificate reads); tasks whose inputs are long state them in O(1)."""
        from exactformer.constructions.core.runs import domain_runs

        return domain_runs(self.domains(model))

    def spec_runs(self, model: Any) -> Any:
        """:meth:`spec` as runs (:func:`~exactformer.constructions.core.runs.spec_runs`); tasks
        whose inputs are long state it in O(1)."""
        from exactformer.constructions.core.runs import spec_runs

        return spec_runs(self.spec(model))

    # ---- encoding ---------------------------------------------------------------------------------------
    @abstractmethod
    def encode_arrays(self, model: Any, *arrays: np.ndarray) -> np.ndarray:
        """The task's arrays -> token ids [B, T]."""

    @abstractmethod
    def to_arrays(self, model: Any, examples: list[Any]) -> tuple[np.ndarray, ...]:
        """Natural inputs (as users write them) -> the task's arrays, validated."""

    def groups(self, model: Any, examples: list[Any]) -> list[list[int]]:
        """The indices of ``examples`` that run as one array (default: all of them; a task whose
        model runs on inputs of several lengths groups them by length)."""
        return [list(range(len(examples)))]

    def batch(self, model: Any, *arrays: np.ndarray, kind: str = "") -> Batch:
        """The inputs held as ``arrays``, their tokens and their truth (as an array: a truth may be a list)."""
        return Batch(tuple(arrays), self.encode_arrays(model, *arrays), np.asarray(self.truth(model, *arrays)), kind)

    def encode(self, model: Any, example: Any) -> np.ndarray:
        return self.encode_arrays(model, *self.to_arrays(model, [example]))[0]

    def encode_batch(self, model: Any, examples: list[Any]) -> np.ndarray:
        return self.encode_arrays(model, *self.to_arrays(model, list(examples)))

    # ---- input sources ------------------------------------------------------------------------------------
    @abstractmethod
    def count(self, model: Any) -> int | float | PowerCount:
        """The number of distinct inputs (``math.inf`` where too large to compute; a
        :class:`PowerCount` where too large to multiply out)."""

    @abstractmethod
    def exhaustive(self, model: Any, batch: int = 4096) -> Iterator[Batch]:
        """Every input, in batches."""

    @abstractmethod
    def sample(self, model: Any, count: int, seed: int) -> Iterator[Batch]:
        """``count`` random inputs from ``np.random.default_rng(seed)``."""

    @abstractmethod
    def adversarial(self, model: Any, count: int, seed: int) -> Iterator[Batch]:
        """Named hard inputs (deterministic given the seed), at most ``count``; ``Batch.kind`` names them."""

    def input_bytes(self, model: Any) -> int:
        """Bytes one input of a batch from :meth:`sample`, :meth:`adversarial` or :meth:`exhaustive`
        holds (token ids, the natural arrays and the truth): what a run's memory estimate counts
        (``verify/estimate.py``). Default: int64 ids and arrays, 16 bytes a token."""
        return 16 * self.length(model) + 64

    def batch_inputs(self, model: Any, batch: int = 1024) -> int:
        """Inputs per batch of :meth:`sample` and :meth:`adversarial` (at most; what a run's memory
        estimate counts). Default: ``batch``."""
        return batch

    def candidates(self, model: Any, hint: dict, count: int) -> Iterator[Batch]:
        """Inputs to try when a proof step fails: every input where there are at most ``count`` of
        them (the search is then complete: a wrong answer is found wherever there is one), else
        planted from ``hint`` first (subclasses), then adversarial, then sampled (seeded)."""
        if self.count(model) <= count:
            yield from _named(self.exhaustive(model), "every input")
            return
        yield from _named(self.adversarial(model, count, seed=1), "adversarial")
        yield from _named(self.sample(model, count, seed=2), "sampled")


def _named(batches: Iterator[Batch], kind: str) -> Iterator[Batch]:
    """``batches`` with ``kind`` where they name none (what a counterexample search says it tried)."""
    for b in batches:
        b.kind = b.kind or kind
        yield b


class SymbolsTask(Task):
    """A task whose input is N symbols in [0, D): tokens BOS (id D) at position 0, then the symbols
    (id = symbol), answers at positions 1..N; inputs held as one array [B, N]. Subclasses give D
    (:meth:`symbols`), the parameter that sets it (:attr:`domain_param`: named in error messages)
    and the error class."""

    #: what the symbols are called in messages ("tokens", "words")
    noun: str = "symbols"
    #: the task parameter that sets D, for messages ("alphabet = 3")
    domain_param: str = ""
    error: type[TaskError] = TaskError

    @abstractmethod
    def symbols(self, model: Any) -> int:
        """D: the symbols are integers in [0, D)."""

    def length(self, model: Any) -> int:
        return model.n + 1

    def domains(self, model: Any) -> Domains:
        D = self.symbols(model)
        return Domains([np.array([D]), np.arange(D)], np.r_[0, np.ones(model.n, np.int64)])

    def encode_arrays(self, model: Any, x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, dtype=np.int64))
        return np.hstack([np.full((x.shape[0], 1), self.symbols(model), dtype=np.int64), x])

    def to_arrays(self, model: Any, examples: list[Any]) -> tuple[np.ndarray, ...]:
        try:
            x = np.asarray(examples, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise self.error(f"inputs must be lists of {model.n} {self.noun} (integers)") from None
        D = self.symbols(model)
        if x.ndim != 2 or x.shape[1] != model.n:
            raise self.error(f"an input must be {model.n} {self.noun}, got shape {list(x.shape)[1:]}")
        if x.size and (x.min() < 0 or x.max() >= D):
            raise self.error(f"{self.noun} must lie in [0, {D}) ({self.domain_param} = "
                             f"{model.task_params[self.domain_param]}), got values in [{x.min()}, {x.max()}]")
        return (x,)

    def count(self, model: Any) -> int | PowerCount:
        return power_count(self.symbols(model), model.n)

    def exhaustive(self, model: Any, batch: int = 4096) -> Iterator[Batch]:
        """Every input in counting order (the first symbol most significant)."""
        D, n = self.symbols(model), model.n
        for lo in range(0, D**n, batch):
            idx = np.arange(lo, min(D**n, lo + batch), dtype=np.int64)
            yield self.batch(model, (idx[:, None] // D ** np.arange(n - 1, -1, -1, dtype=np.int64)) % D)
