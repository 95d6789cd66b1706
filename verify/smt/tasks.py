"""The registered constructions' tasks, encoded for the smt mode (:mod:`exactformer.verify.smt.truth`).

Each encoding is written from the task's ``truth`` and ``encode_arrays`` (cited per function);
``tests/test_smt.py`` compares every one with the task's ``truth`` on all inputs at small N and
checks that its domains and constraints admit exactly the task's inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactformer.constructions.theorems.boolean_tasks import EqualityTask, ThresholdTask, threshold_spec
from exactformer.constructions.theorems.index_lookup import IndexLookupTask
from exactformer.verify.smt.sym import Enc, Sym, all_of, any_of, cmp, const, lookup, mul_const, not_, select, sub, total
from exactformer.verify.smt.truth import Truth, as_code, domain_list, encodes


@encodes(IndexLookupTask)
def index_lookup(task: IndexLookupTask, model: Any) -> Truth:
    """IdxL(s, p) = s_p: tokens s_1 .. s_N, then the index token |Sigma| + p - 1; one answer."""
    S, n = len(model.answers), model.n

    def code(enc: Enc, a: int) -> Sym:
        return select(enc, sub(enc, enc.token(n), const(S)), [enc.token(j) for j in range(n)])

    return Truth(domain_list(task, model), list(range(S)), code, 1,
                 lambda tok: (tok[None, :n], np.array([int(tok[n]) - S + 1])))


@encodes(EqualityTask)
def equality(task: EqualityTask, model: Any) -> Truth:
    """EQ(x) = [x_{1..N/2} = x_{N/2+1..N}] (INEQ = 1 - EQ); x_i = +1 is token 1, -1 token 0, no BOS."""
    n, h = model.n, model.n // 2

    def code(enc: Enc, a: int) -> Sym:
        eq = all_of(enc, [cmp(enc, "==", enc.token(i), enc.token(i + h)) for i in range(h)])
        return as_code(enc, not_(enc, eq) if task.complement else eq)

    return Truth(domain_list(task, model), [0, 1], code, 1, lambda tok: ((2 * tok[None, :n] - 1),))


@encodes(ThresholdTask)
def threshold(task: ThresholdTask, model: Any) -> Truth:
    """Th_b, Disjointness, DNF, CNF on x in {0, 1}^N: BOS at position 0, x_i (1-based) at position i."""
    n, h = model.n, model.n // 2
    tp = model.task_params

    def bit(enc: Enc, i: int) -> Sym:  # x_i == 1, i 1-based
        return cmp(enc, "==", enc.token(i), const(1))

    def literal(enc: Enc, v: int) -> Sym:
        return bit(enc, v) if v > 0 else not_(enc, bit(enc, -v))

    def code(enc: Enc, a: int) -> Sym:
        if task.kind == "disjointness":
            return as_code(enc, not_(enc, any_of(enc, [all_of(enc, [bit(enc, i), bit(enc, i + h)])
                                                       for i in range(1, h + 1)])))
        if task.kind == "dnf":
            return as_code(enc, any_of(enc, [all_of(enc, [literal(enc, int(v)) for v in c]) for c in tp["clauses"]]))
        if task.kind == "cnf":
            return as_code(enc, all_of(enc, [any_of(enc, [literal(enc, int(v)) for v in c]) for c in tp["clauses"]]))
        features, b = threshold_spec(model)
        index, ftype = features.arrays()
        terms = []
        for j in range(len(ftype)):
            r, table = features.types[int(ftype[j])]
            word = total(enc, [mul_const(enc, enc.token(int(index[j, s])), 1 << (r - 1 - s)) for s in range(r)])
            tab = np.asarray(table, dtype=np.int64)
            terms.append(lookup(enc, lambda u, tab=tab: tab[np.asarray(u, dtype=np.int64)], word))
        return as_code(enc, cmp(enc, ">", total(enc, terms), const(int(b))))

    return Truth(domain_list(task, model), [0, 1], code, 1, lambda tok: (tok[None, 1 : n + 1],))

