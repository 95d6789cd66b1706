"""The smt prover: for every answer position, is there an input whose answer differs from the truth?

For each answer a (at the model's answer position for it) the forward pass is evaluated
symbolically (:mod:`exactformer.verify.smt.transformer`, :mod:`exactformer.verify.smt.recurrent`)
and set beside the truth's code (:mod:`exactformer.verify.smt.truth`). The answer is right when the
logits have a strict maximum (a tie is wrong: no answer) whose label ``model.answers[i]`` is the
true value. The question "is there an input in the task's domain where it is wrong?" is then:

* decided in Python when every value involved is a table (the joint table is searched), or
* handed to z3 (quantifier-free bit-vectors) with the domains, the task's constraints and the side
  constraints of fresh variables: unsat is a proof for every input, sat a counterexample, and a
  time-out "unknown" -- a failure, never a pass.

Where an attention row depends on the tokens at a few positions only and its weighted sum would read
many more (Index Lookup's query row), the check splits into one case per token at those positions
(:class:`~exactformer.verify.smt.transformer.NeedSplit`): in each case the row is a constant, so
the sum reads only the positions the row selects. At most :data:`SPLIT_MAX` cases per answer.

A counterexample is replayed before it is reported: through the exact executor (it must answer it
wrong there, else the encoding disagrees with the executor and the run fails saying so), through the
task's own ``truth`` (its value must be the encoded one) and through the exported float64 torch
module (recorded: a fixed-point counterexample may be right in floats).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import z3

from exactformer.constructions.core.task import Task
from exactformer.verify.executor.exact import run
from exactformer.verify.smt import recurrent, tasks, transformer  # noqa: F401  (register their evaluators and encodings)
from exactformer.verify.smt.sym import Enc, NotCovered, Sym, Tab, all_of, any_of, cmp, const, lookup, not_, select
from exactformer.verify.smt.transformer import NeedSplit
from exactformer.verify.smt.truth import Truth, truth_of
from exactformer.verify.smt.vectors import evaluator

SPLIT_MAX = 1 << 12  # cases per answer position
ALTERNATIVES = 8  # counterexamples replayed per case, looking for one the float torch module answers wrong too


@dataclass
class Outcome:
    """``status``: "proved", "counterexample", "refuted" (without an input: the model has another
    number of answers than its task), "unknown" (the time ran out, or z3 gave up) or "disagreement"
    (a solver counterexample that the executor answers right: an encoding error)."""

    status: str
    reason: str
    counterexample: dict | None = None
    details: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.status == "proved"


def label(v: Any) -> Any:
    """An answer or a truth value as the verifier compares them (None as -1, numpy scalars as Python's)."""
    if v is None:
        return -1
    return v.item() if isinstance(v, np.generic) else v


# ------------------------------------------------------------------------------------------------
# the prover
# ------------------------------------------------------------------------------------------------


class Prover:
    """One smt run (module docstring). ``progress(text)`` is called as answers and cases go by
    (at most once a second); ``timeout`` bounds the whole run in seconds."""

    def __init__(self, model: Any, fmt: Any, task: Task, timeout: float,
                 progress: Callable[[str], None] | None = None):
        self.model, self.fmt, self.task = model, fmt, task
        self.truth: Truth = truth_of(task, model)
        self.T = int(task.length(model))
        self.make = evaluator(model, fmt, self.T)
        self.timeout, self.deadline = float(timeout), time.monotonic() + float(timeout)
        self.progress, self._said = progress, 0.0
        self.shared: dict = {}
        self.stats = {"cases": 0, "solver_calls": 0, "solver_seconds": 0.0, "decided_in_python": 0}
        labels = [label(x) for x in model.answers]
        self.match = [[i for i, x in enumerate(labels) if x == label(v)] for v in self.truth.values]

    def say(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._said >= 1.0):
            self._said = now
            self.progress(text)

    def run(self) -> Outcome:
        positions = self.model.answer_positions_for(self.T)
        if len(positions) != self.truth.answers:
            return Outcome("refuted", f"the model answers at {len(positions)} positions, its task has "
                                      f"{self.truth.answers} answers per input")
        self.base = Enc(self.truth.domains, vectors=self.truth.vectors)
        self.base_fwd: Callable[[int], list[Sym]] | None = None
        for a, pos in enumerate(positions):
            self.say(f"answer {a + 1}/{len(positions)} (position {int(pos)})", force=True)
            try:
                out = self.check(a, int(pos), {}, f"answer {a + 1}/{len(positions)}")
            except NotCovered as e:  # found only while encoding: not a proof
                out = Outcome("unknown", f"unknown: {e}; not a proof")
            if out is not None:
                out.details.update(self.stats)
                return out
        return Outcome("proved", f"proved for all inputs: no input of the task's domain where an answer differs "
                                 f"from the truth ({self.truth.how})", details=dict(self.stats))

    def _enc(self, fixed: dict[int, int]) -> Enc:
        return self.base if not fixed else Enc(self.truth.domains, fixed, vectors=self.truth.vectors)

    def check(self, a: int, pos: int, fixed: dict[int, int], where: str, cases: int = 1) -> Outcome | None:
        """None when answer a is right on every input of this case, else the outcome to report."""
        if time.monotonic() > self.deadline:
            return self._unknown(f"the time budget of {self.timeout:g} s ran out at {where}")
        enc = self._enc(fixed)
        self.stats["cases"] += 1
        try:
            if fixed:
                logits = self.make(enc, self.shared, True)(pos)
            else:  # the unsplit pass is shared by every answer position
                if self.base_fwd is None:
                    self.base_fwd = self.make(enc, self.shared, True)
                logits = self.base_fwd(pos)
        except NeedSplit as e:
            split = [p for p in e.positions if enc.free(p)]
            n = int(np.prod([enc.size(p) for p in split]))
            if cases * n > SPLIT_MAX:
                logits = self.make(enc, self.shared, False)(pos)
            else:
                combos = list(itertools.product(*[range(enc.size(p)) for p in split]))
                for c, combo in enumerate(combos):
                    here = f"{where}, case {c + 1}/{len(combos)} (tokens at positions {split})"
                    self.say(here)
                    out = self.check(a, pos, fixed | dict(zip(split, combo)), here, cases * n)
                    if out is not None:
                        return out
                return None
        code = self.truth.code(enc, a)
        wrong = self.wrong(enc, logits, code)
        cons = self.truth.constraints(enc)
        return self.decide(enc, a, pos, wrong, cons, where)

    def wrong(self, enc: Enc, logits: list[Sym], code: Sym) -> Sym:
        """A boolean: the answer is wrong. The answer is decoded as the executor decodes it: the
        label of the strict maximum; a tie is wrong whatever the truth (the verifier's rule:
        torch's argmax would pick the lowest index where the executor says None)."""
        V = len(logits)
        codes = range(len(self.truth.values))
        if isinstance(code, Tab):
            codes = [int(k) for k in np.unique(code.arr)]
        if V == 1:  # one logit: always its label
            ok = any_of(enc, [cmp(enc, "==", code, const(k)) for k in codes if self.match[k]])
            return not_(enc, ok)
        if all(isinstance(s, Tab) for s in logits + [code]) and enc.union_cells(logits + [code]) <= enc.tab_max:
            deps, arrs = enc.align(logits + [code])
            shape = tuple(enc.size(p) for p in deps)
            L = np.stack([np.broadcast_to(x, shape) for x in arrs[:-1]], axis=-1)
            best = np.argmax(L, axis=-1)
            top = np.take_along_axis(L, best[..., None], axis=-1)
            strict = np.sum(L == top, axis=-1) == 1
            table = np.zeros((len(self.truth.values), V), dtype=bool)
            for k, idx in enumerate(self.match):
                table[k, idx] = True
            c = np.broadcast_to(arrs[-1], shape)
            ok = strict & table[c, best]
            return Tab(deps, ~ok)
        if all(len(self.match[k]) <= 1 for k in codes):  # one label per truth: its logit against each other, O(V)
            index = np.array([m[0] if m else -1 for m in self.match], dtype=np.int64)
            t = lookup(enc, lambda c: index[np.asarray(c, dtype=np.int64)], code)
            top = select(enc, t, logits)
            ok = all_of(enc, [cmp(enc, "!=", t, const(-1))] + [
                any_of(enc, [cmp(enc, "==", t, const(j)), cmp(enc, ">", top, logits[j])]) for j in range(V)])
            return not_(enc, ok)
        strict = [all_of(enc, [cmp(enc, ">", logits[i], logits[j]) for j in range(V) if j != i]) for i in range(V)]
        alts = []
        for k in codes:
            right = [strict[i] for i in self.match[k]]
            if right:
                alts.append(all_of(enc, [cmp(enc, "==", code, const(k)), any_of(enc, right)]))
        return not_(enc, any_of(enc, alts))

    def decide(self, enc: Enc, a: int, pos: int, wrong: Sym, cons: list[Sym], where: str) -> Outcome | None:
        """None where no input of this case is answered wrong, else the outcome to report."""
        if not enc.vectors and all(isinstance(s, Tab) for s in [wrong] + cons) and \
                enc.union_cells([wrong] + cons) <= enc.tab_max:
            self.stats["decided_in_python"] += 1
            deps, arrs = enc.align([wrong] + cons)
            bad = np.broadcast_to(arrs[0], tuple(enc.size(p) for p in deps)).copy()
            for c in arrs[1:]:
                bad &= c
            hits = np.argwhere(bad)[:ALTERNATIVES]
            rows = [(self.tokens(enc, lambda p, idx=dict(zip(deps, (int(v) for v in h))): idx.get(p, 0)), {}) for h in hits]
            return self.report(a, pos, iter(rows), where) if rows else None
        if isinstance(wrong, Tab) and wrong.const and not wrong.value():
            return None
        solver = z3.SolverFor("QF_BV")
        solver.add(*enc.constraints())
        solver.add(*[enc.expr(c) for c in cons])
        solver.add(enc.expr(wrong))
        first = self._solve(solver, enc, where)
        if not isinstance(first, tuple):
            return first
        return self.report(a, pos, itertools.chain([first], self._more(solver, enc, first, where)), where)

    def _solve(self, solver: z3.Solver, enc: Enc, where: str) -> tuple | Outcome | None:
        """The solver's next counterexample (token ids, input vectors by position), None (unsat) or an
        unknown outcome."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return self._unknown(f"the time budget of {self.timeout:g} s ran out at {where}")
        solver.set("timeout", max(1, int(left * 1000)))
        t0 = time.monotonic()
        self.say(f"{where}: z3")
        res = solver.check()
        self.stats["solver_calls"] += 1
        self.stats["solver_seconds"] = round(self.stats["solver_seconds"] + time.monotonic() - t0, 3)
        if res == z3.unsat:
            return None
        if res == z3.unknown:
            return self._unknown(f"z3 returned unknown at {where} ({solver.reason_unknown()})")
        m = solver.model()
        vectors = {p: np.array([m.eval(enc.vector_var(p, c), model_completion=True).as_signed_long()
                                for c in range(w)], dtype=np.int64) for p, (w, _, _) in enc.vectors.items()}
        return self.tokens(enc, lambda p: m.eval(enc.var(p), model_completion=True).as_long()), vectors

    def _more(self, solver: z3.Solver, enc: Enc, first: np.ndarray, where: str):
        """Further counterexamples of the same case, each one excluded before the next."""
        tokens, vectors = first
        while True:
            other = [enc.var(p) != int(np.searchsorted(self.truth.domains[p], tokens[p]))
                     for p in range(len(tokens)) if enc.free(p)]
            other += [enc.vector_var(p, c) != int(v) for p, vec in vectors.items() for c, v in enumerate(vec)]
            if not other:
                return
            solver.add(z3.Or(other))
            nxt = self._solve(solver, enc, where)
            if not isinstance(nxt, tuple):
                return
            tokens, vectors = nxt
            yield nxt

    def report(self, a: int, pos: int, rows, where: str) -> Outcome:
        """Replay counterexamples (at most :data:`ALTERNATIVES`): the first that the float64 torch module
        answers wrong too, else the first (a fixed-point-only error: the torch replay says so)."""
        first = None
        for i, (tokens, vectors) in enumerate(itertools.islice(rows, ALTERNATIVES)):
            out = self.replay(a, pos, tokens, vectors, where)
            if out.status != "counterexample" or out.counterexample["torch_float64"].get("wrong", True):
                if first is not None and out.status == "counterexample":
                    out.counterexample["fixed_point_only_before"] = i
                return out
            first = first or out
        first.counterexample["torch_float64"]["note"] = (
            "the float64 torch module answers this input right: the error is the fixed-point format's rounding")
        return first

    def tokens(self, enc: Enc, index_of: Callable[[int], int]) -> np.ndarray:
        doms = self.truth.domains
        return np.array([int(d[enc.fixed[p]]) if p in enc.fixed else int(d[index_of(p)]) if enc.free(p) else int(d[0])
                         for p, d in enumerate(doms)], dtype=np.int64)

    def _unknown(self, reason: str) -> Outcome:
        return Outcome("unknown", f"unknown: {reason}; not a proof (raise the time budget, --smt-timeout)")

    # ---- replay ------------------------------------------------------------------------------------
    def replay(self, a: int, pos: int, tokens: np.ndarray, vectors: dict[int, np.ndarray], where: str) -> Outcome:
        """The counterexample through the task, the executor and torch (module docstring)."""
        model, task = self.model, self.task
        arrays = self.truth.decode(tokens, vectors)
        try:
            batch = task.batch(model, *arrays)
        except ValueError as e:  # the task refuses the input: it is outside the task's inputs
            return Outcome("disagreement", f"smt: the task refuses the solver's input ({e}): an encoding error")
        ids = getattr(batch.tokens, "tokens", batch.tokens)
        vecs = getattr(batch.tokens, "vectors", None)
        if not np.array_equal(np.asarray(ids).reshape(-1), tokens) or (vecs is not None and not all(
                np.array_equal(vecs.num[0, p] * (self.fmt.scale // vecs.den), v) for p, v in vectors.items())):
            return Outcome("disagreement", f"smt: the counterexample's tokens {tokens.tolist()} do not round-trip through "
                                           "the task's encoding (an encoding error)")
        truth = np.asarray(batch.truth).reshape(1, -1)[0, a]
        full = Enc(self.truth.domains, {p: int(np.searchsorted(d, tokens[p])) for p, d in enumerate(self.truth.domains)},
                   vectors=self.truth.vectors, fixed_vectors=vectors)
        encoded = self.truth.values[self.truth.code(full, a).value()]
        if label(encoded) != label(truth):
            return Outcome("disagreement", f"smt: the encoded truth {encoded!r} differs from the task's truth {truth!r} on "
                                           f"{batch.example(0)} (an encoding error)")
        res = run(model, batch.tokens, self.fmt)
        got, ok = self._answer(res.logits[0, a])
        cex = {"input": batch.example(0), "expected": label(truth), "got": None if got is None else label(got),
               "answer_position": pos if self.truth.answers > 1 else None,
               "logits": [str(self.fmt.to_fraction(int(v))) for v in res.logits[0, a]], "arithmetic": self.fmt.name,
               "found": where}
        if ok(label(truth)):
            return Outcome("disagreement", f"smt: the solver's counterexample {batch.example(0)} is answered right by the "
                                           "executor (an encoding error)", cex)
        cex["torch_float64"] = self._torch(batch.tokens, a, label(truth))
        return Outcome("counterexample", "counterexample found (replayed wrong through the executor)", cex)

    def _answer(self, logits: np.ndarray) -> tuple[Any, Callable[[Any], bool]]:
        """(the answer as the executor decodes it -- None on a tie --, is-right(truth): never on a tie)."""
        L = np.asarray(logits)
        best = int(np.argmax(L))
        strict = L.size == 1 or int(np.sum(L == L[best])) == 1
        got = self.model.answers[best] if strict else None
        return got, lambda t: strict and label(got) == t

    def _torch(self, tokens: Any, a: int, truth: Any) -> dict:
        from exactformer.verify.executor.torch_run import run_torch  # torch is imported when a counterexample is found

        try:
            res = run_torch(self.model, tokens, "float64")
        except ValueError as e:
            return {"ran": False, "reason": str(e)}
        got, ok = self._answer(res.logits[0, a])
        return {"ran": True, "got": None if got is None else label(got), "wrong": not ok(truth)}


def prove(model: Any, fmt: Any, task: Task, timeout: float,
          progress: Callable[[str], None] | None = None) -> Outcome:
    """Prove ``model`` right on every input of ``task`` in the fixed-point format ``fmt``, or find a
    counterexample (module docstring). Raises :class:`NotCovered` for what is not encoded."""
    return Prover(model, fmt, task, timeout, progress).run()


def covers(model: Any, task: Task) -> str | None:
    """Why the smt mode cannot encode ``model`` with ``task`` (one line), or None."""
    from exactformer.constructions.core.ir import IRError
    from exactformer.precision import parse_format

    try:
        make = evaluator(model, parse_format(model.precision), int(task.length(model)))
        truth = truth_of(task, model)
        make(Enc(truth.domains, vectors=truth.vectors), {}, False)
    except NotCovered as e:
        return str(e)
    except IRError:  # weights the format cannot hold: the verifier reports them
        return None
    return None
