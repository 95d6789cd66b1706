"""The specification against the task's truth: the premise of every certificate's last step.

A certificate proves that a model answers as its task's *specification* says (a rule in the
certificate's terms: :mod:`exactformer.constructions.core.spec`); exhaustive and sampled runs compare
the model with the task's *truth* (a function of the natural input). The two are written separately,
so nothing but a check makes them the same task. Before a certificate passes, :func:`check_spec`
compares them on inputs, with the specification's answer indices read through its ``values`` and at
its ``positions`` -- the same answers, at the same positions, that the executor's answers are
compared with:

1. **at a small N of the same construction** (the registry's ``small`` build, or its ``example``),
   on every input where there are at most :data:`SMALL_INPUTS`, else on :data:`SAMPLED_INPUTS`
   adversarial and as many seeded random ones; once per process and construction, and not where
   step 2 ran every input of the model itself;
2. **at the model's own N and task parameters**, on every input where there are at most
   :data:`EXHAUSTIVE_INPUTS`, else on :data:`MODEL_SAMPLED_INPUTS` adversarial and as many random
   ones (seed :data:`SEED`), where inputs are at most :data:`MAX_TOKENS` tokens long (the truth and
   the specification of some tasks cost O(T^2) per input: k-hop's pointers).

A disagreement is ``Unproven`` naming the first differing input, the specification's answer and the
truth; what was checked is recorded in the certificate's ``details["spec_check"]``.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterable

import numpy as np

from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.core.task import same_answer

SMALL_INPUTS = 1 << 16  # every input of the small build below this many
EXHAUSTIVE_INPUTS = 1 << 12  # every input of the model's own N below this many
SAMPLED_INPUTS = 256  # else this many adversarial and as many random inputs (the small build)
MODEL_SAMPLED_INPUTS = 64  # the same at the model's own N
SEED = 0
MAX_TOKENS = 1 << 8  # inputs longer than this are checked at the small build only

_SMALL_DONE: dict[str, tuple[Any, str]] = {}  # construction -> (its registry entry, what was checked)


def check_spec(task: Any, model: Any) -> str:
    """Compare ``task.spec(model)`` with ``task.truth`` (module docstring); return what was checked."""
    from exactformer.constructions.core import registry  # the registry imports the constructions

    said = []
    if task.length(model) <= MAX_TOKENS:
        said.append(_check_model(task, model, EXHAUSTIVE_INPUTS, MODEL_SAMPLED_INPUTS))
    else:
        said.append(f"not at N = {model.n} (inputs of {task.length(model)} tokens)")
    if said[0].startswith("specification = truth on every input"):
        return said[0]  # every input of the model itself: the small build would add nothing
    entry = registry.get(model.construction) if model.construction in registry.names() else None
    if entry is not None and entry.task is task:
        known = _SMALL_DONE.get(entry.name)
        if known is None or known[0] is not entry:
            small = entry.builder(**(entry.small or entry.example))
            known = _SMALL_DONE[entry.name] = (entry, _check_model(task, small, SMALL_INPUTS, SAMPLED_INPUTS))
        said.insert(0, known[1])
    return "; ".join(said)


def _check_model(task: Any, model: Any, limit: int, sampled: int) -> str:
    count = task.count(model)
    if count <= limit:
        batches: Iterable[Any] = task.exhaustive(model)
        how = "every input"
    else:
        batches = itertools.chain(task.adversarial(model, sampled, SEED + 1), task.sample(model, sampled, SEED))
        how = f"{sampled} adversarial and {sampled} random inputs (seed {SEED})"
    spec = task.spec(model)
    domains = task.domains(model)
    values = np.empty(len(spec.values) + 1, dtype=object)
    values[:-1] = list(spec.values)
    values[-1] = _Outside()  # index -1: the specification gives no answer
    seen = 0
    for b in batches:
        tokens = b.tokens
        T = np.shape(getattr(tokens, "tokens", tokens))[1]
        idx = np.asarray(spec.indices(tokens, domains), dtype=np.int64)
        truth = np.asarray(b.truth, dtype=object).reshape(len(b), -1)
        if idx.shape != truth.shape:
            raise Unproven(f"the task's specification gives {idx.shape[1]} answers per input (positions "
                           f"{spec.positions(T).tolist()[:6]}), its truth {truth.shape[1]}")
        got = values[np.where((idx >= 0) & (idx < len(spec.values)), idx, -1)]
        same = np.frompyfunc(_same, 2, 1)(got, truth).astype(bool)
        if not same.all():
            i, a = (int(x) for x in np.argwhere(~same)[0])
            raise Unproven(f"the task's specification disagrees with its truth at N = {model.n}: on input "
                           f"{b.example(i)!r} it answers {got[i, a]!r} at position {int(spec.positions(T)[a])}, the "
                           f"truth is {truth[i, a]!r}", {})
        seen += len(b)
    return f"specification = truth on {how} at N = {model.n} ({seen})"


class _Outside:
    """The answer of an index the specification does not name (equal to no truth)."""

    def __repr__(self) -> str:
        return "no answer of the task"


def _same(a: Any, b: Any) -> bool:
    return not isinstance(a, _Outside) and same_answer(a, b)

