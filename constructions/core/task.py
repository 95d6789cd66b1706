"""Tasks and the registry of constructions.

A :class:`Task` is the problem a construction solves, independent of any model: its natural
inputs (held as arrays), their encoding as tokens, the ground truth, input sources (all inputs,
seeded samples, adversarial inputs, candidates for a failed proof) and the specification the
certificate compares with (:mod:`exactformer.constructions.core.spec`).

Constructions register their builder with their task in :mod:`exactformer.constructions.core.registry`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.core.ir import CompiledModel


#: the verification modes, strongest first: a proof for every input, every input run, seeded samples
MODES = ("certify", "exhaustive", "sample")
EXHAUSTIVE_LIMIT = 1 << 22  # inputs; exhaustive mode refuses more

EXACT_DIGITS = 6  # counts below 10^6 are written out; larger ones as powers where they are products of powers
DECIMAL_LIMIT = 10**12  # a larger count that is no such product is written as "about 2^x"


class TaskError(ValueError):
    """A natural input the task does not accept (the message names the parameter and the range)."""


def _power(count: int, base: int) -> tuple[int, int]:
    """(e, rest) with count = base^e * rest and rest not divisible by base."""
    e = 0
    while count % base == 0:
        count //= base
        e += 1
    return e, count


def _nth_root(count: int, n: int) -> int:
    """floor(count^(1/n)) for count >= 1."""
    b = max(1, int(round(2 ** (math.log2(count) / n))))
    while b > 1 and b**n > count:
        b -= 1
    while (b + 1) ** n <= count:
        b += 1
    return b


def format_count(count: int | float, n: int | None = None) -> str:
    """An input count, short: written out below 10^6; else exactly as powers -- ``b^N*m`` when
    ``n`` = N is given and count = b^N * m with m < 10^6 (Index Lookup's ``64^4096*4096``), else
    ``p^e*m`` for p in 2, 3, 5, 7 and m < 10^6 (``2^4096``); else written out below 10^12;
    else ``about 2^x`` (x = log2 to one decimal). ``math.inf`` (a count too large to compute --
    :func:`~exactformer.constructions.mpc.applications.count_rgs` above 2^1000 -- or inputs that no finite
    family enumerates, as the grid vectors of nearest neighbour) is ``too many to count``. Never a
    number with more digits than that (Python refuses to print ints above 4300 digits)."""
    if isinstance(count, float):
        if math.isinf(count):
            return "too many to count"
        count = int(count)
    small = 10**EXACT_DIGITS
    if count < small:
        return str(count)
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


def inputs_phrase(count: int | float, n: int | None = None) -> str:
    """``"<count> inputs"`` written short (:func:`format_count`), or ``"too many inputs to count"``."""
    if isinstance(count, float) and math.isinf(count):
        return "too many inputs to count"
    return f"{format_count(count, n)} inputs"


def count_log2(count: int | float) -> float | None:
    """log2 of an input count (None for ``math.inf``, a count too large to compute), 3 decimals."""
    return None if isinstance(count, float) and math.isinf(count) else round(math.log2(count), 3)


class Verifiable:
    """What the verifier reads from the task of any construction, weight model or EMA program
    (:class:`Task`, :class:`~exactformer.constructions.mpc.applications.Application`): the verification
    modes it has (declared, never inferred from a failed proof) and its number of inputs."""

    #: the modes of :data:`MODES` this task's constructions can be verified in (strongest first)
    modes: tuple[str, ...] = MODES

    def count(self, model: Any) -> int | float:
        """The number of distinct inputs (``math.inf`` where too large to compute)."""
        raise NotImplementedError


@dataclass
class Batch:
    """Natural inputs (task-specific arrays), their token ids and true answers ([B] or [B, A])."""

    arrays: tuple[np.ndarray, ...]
    tokens: np.ndarray
    truth: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def example(self, i: int) -> Any:
        """Input i as the task's natural form (what ``Task.encode`` accepts)."""
        vals = tuple(a[i].tolist() if np.ndim(a) > 1 else a[i].item() for a in self.arrays)
        return vals[0] if len(vals) == 1 else vals

    def take(self, idx: np.ndarray) -> "Batch":
        return Batch(tuple(a[idx] for a in self.arrays), self.tokens[idx], self.truth[idx])


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


class Task(Verifiable):
    """The interface every task implements (see the module docstring). Weight models have all
    three modes: a certificate (:mod:`exactformer.verify.certify.composed`), every input, samples."""

    #: how a natural input becomes tokens, for exports (schema in docs/exports.md)
    ENCODING: dict[str, Any] = {}

    # ---- definition ---------------------------------------------------------------------------------
    def length(self, model: CompiledModel) -> int:
        """Tokens per input."""
        raise NotImplementedError

    def domains(self, model: CompiledModel) -> Domains:
        """The token ids allowed at each position."""
        raise NotImplementedError

    def truth(self, model: CompiledModel, *arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def spec(self, model: CompiledModel) -> Any:
        """The ground truth in the certificate's terms (from the task definition, not the weights)."""
        raise NotImplementedError

    # ---- encoding ---------------------------------------------------------------------------------------
    def encode_arrays(self, model: CompiledModel, *arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray, ...]:
        """Natural inputs (as users write them) -> the task's arrays, validated."""
        raise NotImplementedError

    def batch(self, model: CompiledModel, *arrays: np.ndarray) -> Batch:
        return Batch(tuple(arrays), self.encode_arrays(model, *arrays), self.truth(model, *arrays))

    def encode(self, model: CompiledModel, example: Any) -> np.ndarray:
        return self.encode_arrays(model, *self.to_arrays(model, [example]))[0]

    def encode_batch(self, model: CompiledModel, examples: list[Any]) -> np.ndarray:
        return self.encode_arrays(model, *self.to_arrays(model, list(examples)))

    # ---- input sources ------------------------------------------------------------------------------------
    def count(self, model: CompiledModel) -> int:
        """The number of distinct inputs."""
        raise NotImplementedError

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        raise NotImplementedError

    def sample(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        raise NotImplementedError

    def adversarial(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        raise NotImplementedError

    def candidates(self, model: CompiledModel, hint: dict, count: int) -> Iterator[Batch]:
        """Inputs to try when a proof step fails: planted from ``hint`` first, then adversarial,
        then sampled (seeded)."""
        yield from self.adversarial(model, count, seed=1)
        yield from self.sample(model, count, seed=2)
