"""Ground truths and input sources, one entry per construction.

A task knows the natural inputs of its construction: how to enumerate all of them (exhaustive),
draw seeded random ones (sample), and build adversarial ones; and the ground-truth answer.
Inputs are handled in vectorised form (arrays), converted to token ids by the construction's
``encode_arrays``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from exactformer.constructions.ir import CompiledModel


@dataclass
class Batch:
    """A batch of natural inputs: ``arrays`` (task specific), their token ids and true answers."""

    arrays: tuple[np.ndarray, ...]
    tokens: np.ndarray  # [B, T]
    truth: np.ndarray  # [B]

    def example(self, i: int) -> Any:
        return tuple(a[i].tolist() if a.ndim > 1 else int(a[i]) for a in self.arrays)


P_GROUP = 16  # sampled Index Lookup inputs share p in groups of this size


class IndexLookupTask:
    """IdxL(s, p) = s_p (1-based p)."""

    name = "index-lookup"

    @staticmethod
    def truth(symbols: np.ndarray, p: np.ndarray) -> np.ndarray:
        return symbols[np.arange(len(p)), p - 1]

    def _batch(self, model: CompiledModel, symbols: np.ndarray, p: np.ndarray) -> Batch:
        from exactformer.constructions.index_lookup import encode_arrays

        return Batch((symbols, p), encode_arrays(model, symbols, p), self.truth(symbols, p))

    def count(self, model: CompiledModel) -> int:
        return len(model.answers) ** model.n * model.n

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        """Every (s, p): |Sigma|^N * N inputs."""
        S, n = len(model.answers), model.n
        all_s = itertools.product(range(S), repeat=n)
        while True:
            chunk = list(itertools.islice(all_s, max(1, batch // n)))
            if not chunk:
                return
            sy = np.repeat(np.asarray(chunk, dtype=np.int64), n, axis=0)
            p = np.tile(np.arange(1, n + 1), len(chunk))
            yield self._batch(model, sy, p)

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 1024) -> Iterator[Batch]:
        """``count`` inputs from ``np.random.default_rng(seed)``: p uniform in [1, N] for each group
        of ``P_GROUP`` consecutive inputs (the group shares its attention row, which depends on p
        only), symbols uniform and independent for every input."""
        rng = np.random.default_rng(seed)
        S, n = len(model.answers), model.n
        done = 0
        while done < count:
            b = min(batch, count - done)
            p = np.repeat(rng.integers(1, n + 1, size=-(-b // P_GROUP)), P_GROUP)[:b]
            yield self._batch(model, rng.integers(0, S, size=(b, n), dtype=np.int32), p)
            done += b

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 1024) -> Iterator[Batch]:
        """s constant except at p: s_p = a and every other symbol the bitwise complement of a
        (the symbol farthest from a in Hamming distance when the complement is not a symbol);
        p shared by groups of ``P_GROUP`` inputs as in :meth:`sample`."""
        rng = np.random.default_rng(seed)
        S, n = len(model.answers), model.n
        far = _farthest_symbols(S)
        done = 0
        while done < count:
            b = min(batch, count - done)
            a = rng.integers(0, S, size=b)
            p = np.repeat(rng.integers(1, n + 1, size=-(-b // P_GROUP)), P_GROUP)[:b]
            sy = np.repeat(far[a][:, None], n, axis=1)
            sy[np.arange(b), p - 1] = a
            yield self._batch(model, sy, p)
            done += b


def _farthest_symbols(S: int) -> np.ndarray:
    m = max(1, (S - 1).bit_length())
    s = np.arange(S)
    comp = (~s) & ((1 << m) - 1)
    dist = np.array([[bin(x ^ y).count("1") for y in range(S)] for x in range(S)]) if S <= 4096 else None
    if dist is None:
        return np.where(comp < S, comp, (comp & (S - 1)))
    return np.where(comp < S, comp, dist.argmax(axis=1))


TASKS: dict[str, Any] = {"index-lookup": IndexLookupTask()}

from exactformer.verify.tasks_boolean import TASKS_BOOLEAN  # noqa: E402  (EQ, INEQ, DISJ, DNF, CNF, THRES)

TASKS.update(TASKS_BOOLEAN)


def task_for(model: CompiledModel):
    if model.construction not in TASKS:
        raise ValueError(f"no ground truth registered for construction {model.construction!r}")
    return TASKS[model.construction]
