"""The tasks' ground truth as symbolic values (verify/smt): what the model must answer, as a function
of the tokens, written from each task's definition (its ``truth`` and its encoding), never from a
certificate's specification.

A :class:`Truth` says which inputs there are (the token ids allowed at each position and, where the
inputs are not every combination of those, constraints: MQAR's distinct keys) and, for each answer
(a column of the task's ``truth``), a value over those tokens: the index ("code") of the true
answer in :attr:`Truth.values`. It also maps a token row back to the task's arrays, so that a
counterexample is replayed through the task's own ``truth`` and ``encode_arrays``.

An encoding is registered for a task class with :func:`encodes`; it applies to a subclass only
where the subclass redefines none of the methods it was written from (``truth``, ``domains``,
``encode_arrays``, ``length``): a user's task that changes the encoding (the architecture page's
index-first lookup) gets :func:`table_truth` instead -- the task's own ``truth`` over every input,
where there are at most :data:`TABLE_LIMIT` -- or is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from exactformer.constructions.core.task import Task, redefines
from exactformer.verify.smt.sym import Enc, NotCovered, Sym, Tab, const, ite

TABLE_LIMIT = 1 << 16  # inputs (and token combinations) of a task without an encoding, tabulated from its truth


@dataclass
class Truth:
    """What the model must answer: ``domains`` (token ids per position), ``values`` (the true
    answers, by code), ``code(enc, a)`` (the code of answer a's truth), ``answers`` (how many
    answers), ``decode(tokens, vectors)`` (the task's arrays of one input: its token ids and the
    input vectors by position), ``constraints(enc)`` (booleans every input satisfies beyond its
    domains; none: the inputs are every combination), ``vectors`` (position -> (width, least, largest
    raw value) of the input vectors a ``VectorInput`` reads)."""

    domains: list[np.ndarray]
    values: list[Any]
    code: Callable[[Enc, int], Sym]
    answers: int
    decode: Callable[[np.ndarray, dict[int, np.ndarray]], tuple[np.ndarray, ...]]
    constraints: Callable[[Enc], list[Sym]] = field(default=lambda enc: [])
    how: str = "encoded from the task's definition"
    vectors: dict[int, tuple[int, int, int]] = field(default_factory=dict)


_ENCODERS: list[tuple[type, Callable[[Any, Any], Truth], tuple[str, ...]]] = []
READS = ("truth", "domains", "encode_arrays", "length")


def encodes(task_class: type, reads: tuple[str, ...] = READS) -> Callable:
    """Register ``fn(task, model) -> Truth`` for ``task_class`` (and its subclasses that redefine
    none of ``reads``)."""
    def deco(fn: Callable[[Any, Any], Truth]) -> Callable[[Any, Any], Truth]:
        _ENCODERS.append((task_class, fn, reads))
        return fn
    return deco


def truth_of(task: Task, model: Any) -> Truth:
    """The truth of ``task`` for ``model``: its registered encoding (:mod:`exactformer.verify.smt.tasks`
    registers the catalogue's when the prover imports it), else the table of its truth."""
    for cls, fn, reads in _ENCODERS:
        if isinstance(task, cls) and not any(redefines(task, cls, name) for name in reads):
            return fn(task, model)
    return table_truth(task, model)


def domain_list(task: Task, model: Any) -> list[np.ndarray]:
    d = task.domains(model)
    return [np.asarray(d[t], dtype=np.int64) for t in range(len(d))]


def as_code(enc: Enc, b: Sym) -> Sym:
    """A boolean as the code 1 (True) / 0 (False)."""
    return ite(enc, b, const(1), const(0))


def table_truth(task: Task, model: Any) -> Truth:
    """The task's own truth over every input, as tables over all positions: for a task without an
    encoding whose inputs (and token combinations) number at most :data:`TABLE_LIMIT`."""
    doms = domain_list(task, model)
    name = type(task).__name__
    if getattr(task.domains(model), "precondition", None) is not None:
        raise NotCovered(f"smt: {name} has a precondition on its inputs and no smt encoding")
    count = task.count(model)
    cells = int(np.prod([d.size for d in doms], dtype=object))
    if not count <= TABLE_LIMIT or cells > TABLE_LIMIT:
        raise NotCovered(f"smt: {name} has no smt encoding of its truth, and its {cells} token combinations exceed "
                         f"the {TABLE_LIMIT} it would tabulate from the task's truth (docs/smt.md)")
    free = [t for t, d in enumerate(doms) if d.size > 1]
    shape = tuple(doms[t].size for t in free)
    valid = np.zeros(shape, dtype=bool)
    codes: np.ndarray | None = None
    values: list[Any] = []
    index: dict[Any, int] = {}
    inputs: dict[int, tuple] = {}
    for batch in task.exhaustive(model):
        tok = np.asarray(batch.tokens)
        truth = np.asarray(batch.truth).reshape(len(tok), -1)
        if codes is None:
            codes = np.zeros((truth.shape[1],) + shape, dtype=np.int64)
        idx = tuple(np.searchsorted(doms[t], tok[:, t]) for t in free)
        valid[idx] = True
        for a in range(truth.shape[1]):
            col = [index.setdefault(v, len(index)) for v in truth[:, a].tolist()]
            codes[(a,) + idx] = col
        flat = np.ravel_multi_index(idx, shape) if free else np.zeros(len(tok), dtype=np.int64)
        for i, f in enumerate(flat.tolist()):
            inputs[f] = tuple(a[i : i + 1] for a in batch.arrays)
    values = sorted(index, key=index.get)
    deps = tuple(free)

    def restrict(enc: Enc, arr: np.ndarray) -> Tab:
        sel = tuple(enc.fixed[t] if t in enc.fixed else slice(None) for t in free)
        return Tab(tuple(t for t in free if t not in enc.fixed), arr[sel])

    def decode(tokens: np.ndarray, vectors: dict[int, np.ndarray]) -> tuple[np.ndarray, ...]:
        idx = tuple(int(np.searchsorted(doms[t], tokens[t])) for t in free)
        return inputs[int(np.ravel_multi_index(idx, shape)) if free else 0]

    assert codes is not None and deps is not None
    return Truth(doms, values, lambda enc, a: restrict(enc, codes[a]), codes.shape[0], decode,
                 lambda enc: [restrict(enc, valid)], how=f"tabulated from {name}.truth over its {count} inputs")

