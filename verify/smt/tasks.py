"""The registered constructions' tasks, encoded for the smt mode (:mod:`exactformer.verify.smt.truth`).

Each encoding is written from the task's ``truth`` and ``encode_arrays`` (cited per function);
``tests/test_smt.py`` compares every one with the task's ``truth`` on all inputs at small N and
checks that its domains and constraints admit exactly the task's inputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from exactformer.constructions.theorems.boolean_tasks import EqualityTask, ThresholdTask, threshold_spec
from exactformer.constructions.theorems.dyck import DyckTask
from exactformer.constructions.theorems.index_lookup import IndexLookupTask
from exactformer.constructions.theorems.induction_heads import KHopTask
from exactformer.constructions.theorems.match2 import Match2Task
from exactformer.constructions.theorems.mpc_simulation import PrefixSumsTask
from exactformer.constructions.theorems.mqar import MQARTask
from exactformer.constructions.theorems.nearest_neighbor import NearestNeighborTask
from exactformer.verify.smt.sym import (Enc, Sym, all_of, any_of, cmp, const, ite, lookup, lookup_n, mul_const, not_,
                                        prod_rnd, select, sub, total)
from exactformer.verify.smt.truth import NotCovered, Truth, as_code, domain_list, encodes


@encodes(IndexLookupTask)
def index_lookup(task: IndexLookupTask, model: Any) -> Truth:
    """IdxL(s, p) = s_p: tokens s_1 .. s_N, then the index token |Sigma| + p - 1; one answer."""
    S, n = task.alphabet(model), model.n

    def code(enc: Enc, a: int) -> Sym:
        return select(enc, sub(enc, enc.token(n), const(S)), [enc.token(j) for j in range(n)])

    return Truth(domain_list(task, model), list(range(S)), code, 1,
                 lambda tok, vec: (tok[None, :n], np.array([int(tok[n]) - S + 1])))


@encodes(EqualityTask)
def equality(task: EqualityTask, model: Any) -> Truth:
    """EQ(x) = [x_{1..N/2} = x_{N/2+1..N}] (INEQ = 1 - EQ); x_i = +1 is token 1, -1 token 0, no BOS."""
    n, h = model.n, model.n // 2

    def code(enc: Enc, a: int) -> Sym:
        eq = all_of(enc, [cmp(enc, "==", enc.token(i), enc.token(i + h)) for i in range(h)])
        return as_code(enc, not_(enc, eq) if task.complement else eq)

    return Truth(domain_list(task, model), [0, 1], code, 1, lambda tok, vec: ((2 * tok[None, :n] - 1),))


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

    return Truth(domain_list(task, model), [0, 1], code, 1, lambda tok, vec: (tok[None, 1 : n + 1],))



@encodes(Match2Task)
def match2(task: Match2Task, model: Any) -> Truth:
    """P2 Def. 5.1: answer i is 1{exists j (j = i allowed): x_i + x_j = 0 mod M}; BOS (id M) at 0, x_i at i."""
    M, n = task.modulus(model), model.n

    def code(enc: Enc, a: int) -> Sym:
        want = lookup(enc, lambda u: (M - np.asarray(u)) % M, enc.token(a + 1))
        return as_code(enc, any_of(enc, [cmp(enc, "==", enc.token(j + 1), want) for j in range(n)]))

    return Truth(domain_list(task, model), [0, 1], code, n, lambda tok, vec: (tok[None, 1:],))


@encodes(KHopTask)
def k_hop(task: KHopTask, model: Any) -> Truth:
    """P2 Defs. 5.3, 5.5: answer p is w at sigma^k(p), or -1 (no answer) where a hop has none; sigma(p)
    = 1 + (the last q < p with w_q = w_p), none if there is no such q (0-based); BOS at 0, w_p at p + 1."""
    S, n, k = task.symbols(model), model.n, int(model.task_params["k"])
    none = const(-1)

    def code(enc: Enc, a: int) -> Sym:
        w = [enc.token(p + 1) for p in range(n)]
        sigma = []
        for p in range(n):
            s: Sym = none
            for q in range(p):
                s = ite(enc, cmp(enc, "==", w[q], w[p]), const(q + 1), s)
            sigma.append(s)
        cur: Sym = const(a)
        for _ in range(k):
            cur = ite(enc, cmp(enc, "==", cur, none), none, select(enc, cur, sigma))
        return ite(enc, cmp(enc, "==", cur, none), const(S), select(enc, cur, w))

    return Truth(domain_list(task, model), list(range(S)) + [-1], code, n, lambda tok, vec: (tok[None, 1:],))


@encodes(PrefixSumsTask)
def prefix_sums(task: PrefixSumsTask, model: Any) -> Truth:
    """y_i = (x_1 + ... + x_i) mod 2^p; BOS at 0, the words at 1..N."""
    D, n = task.symbols(model), model.n

    def code(enc: Enc, a: int) -> Sym:
        return lookup(enc, lambda u: np.asarray(u) % D, total(enc, [enc.token(i + 1) for i in range(a + 1)]))

    return Truth(domain_list(task, model), list(range(D)), code, n, lambda tok, vec: (tok[None, 1:],))


@encodes(MQARTask)
def mqar(task: MQARTask, model: Any) -> Truth:
    """MQAR (lean variant): tokens s_1, y_1, s_2, ..., s_N (symbol ids, label ids |Sigma| + y); the
    first half's symbols distinct, the second half a permutation of them (the precondition); the
    answer at each of the task's query positions q (its parameter ``queries``) is the label of the
    first-half key equal to s at q."""
    if task.variant(model) == "nn":
        raise NotCovered("smt: MQAR's nn variant (symbols as hypercube vectors) has no smt encoding (docs/smt.md)")
    S, L, n = task.alphabet(model), task.labels(model), model.n
    h, T = n // 2, 2 * n - 1
    qs = [int(q) // 2 for q in task.nn.queries(model)]

    def code(enc: Enc, a: int) -> Sym:
        q = enc.token(2 * qs[a])
        out: Sym = sub(enc, enc.token(1), const(S))
        for j in reversed(range(h)):  # argmax: the first match wins (0 where none, which the precondition excludes)
            out = ite(enc, cmp(enc, "==", enc.token(2 * j), q), sub(enc, enc.token(2 * j + 1), const(S)), out)
        return out

    def constraints(enc: Enc) -> list[Sym]:
        s = [enc.token(2 * i) for i in range(n)]
        first, second = s[:h], s[h:]
        out = [cmp(enc, "!=", x, y) for half in (first, second) for i, x in enumerate(half) for y in half[i + 1:]]
        return out + [any_of(enc, [cmp(enc, "==", x, y) for y in first]) for x in second]

    def decode(tok: np.ndarray, vec: dict) -> tuple[np.ndarray, ...]:
        return tok[None, 0::2], tok[None, 1::2] - S

    return Truth(domain_list(task, model), list(range(L)), code, len(qs), decode, constraints)


@encodes(DyckTask)
def dyck(task: DyckTask, model: Any) -> Truth:
    """Membership in Dyck-(k, D) of the whole string (the answer at the last position): the stack of
    open bracket types (token 2t opens type t, 2t + 1 closes it), refused past depth D or on a
    mismatched close, accepted when empty at the end -- states numbered here, one per stack."""
    k, D = task.params(model)
    n = task.length(model)
    stacks = [()]
    for d in range(D):
        stacks += [s + (t,) for s in stacks if len(s) == d for t in range(k)]
    number = {s: i for i, s in enumerate(stacks)}
    reject = len(stacks)
    step = np.full((reject + 1, 2 * k), reject, dtype=np.int64)
    for s, i in number.items():
        for tok in range(2 * k):
            kind, opening = tok // 2, tok % 2 == 0
            if opening and len(s) < D:
                step[i, tok] = number[s + (kind,)]
            elif not opening and s and s[-1] == kind:
                step[i, tok] = number[s[:-1]]

    def code(enc: Enc, a: int) -> Sym:
        state: Sym = const(number[()])
        for j in range(n):
            state = lookup_n(enc, lambda x, y: step[x, y], [state, enc.token(j)])
        return as_code(enc, cmp(enc, "==", state, const(number[()])))

    return Truth(domain_list(task, model), [0, 1], code, 1, lambda tok, vec: (tok[None, :],))


@encodes(NearestNeighborTask)
def nearest_neighbor(task: NearestNeighborTask, model: Any) -> Truth:
    """NSTNB on grid vectors (P1 Sec. 5.2): token "x" (id 0) at position 2i carrying x_{i+1} (raw values
    over the format's scale), label tokens 1 + y at the odd positions; the answer at each of the
    task's query positions q (its parameter ``queries``) is the label of the candidate j < q/2 whose inner product with
    x_{q/2} is largest. The precondition as constraints: every ||x||^2 <= max_norm_sq, and the
    nearest candidate leads every other by the margin (exact integers: values times S^2)."""
    n, S = model.n, task.scale(model)
    pre = task.precondition(model)
    T, d = 2 * n - 1, pre.d_in
    norm = pre.max_norm_sq * S * S  # ||x||^2 <= norm in raw units
    bound = math.isqrt(int(norm))  # so every entry is within [-bound, bound]
    fmt_lo, fmt_hi = -(1 << 62), 1 << 62
    vectors = {2 * i: (d, max(-bound, fmt_lo), min(bound, fmt_hi)) for i in range(n)}
    qs = [int(q) // 2 for q in task.queries(model)]

    def dot(enc: Enc, i: int, j: int) -> Sym:
        x, y = enc.vector(2 * i), enc.vector(2 * j)
        return total(enc, [prod_rnd(enc, a, b, 1, False) for a, b in zip(x, y)])

    def leads(enc: Enc, K: int) -> list[Sym]:  # candidate j leads every other by the margin
        ips = [mul_const(enc, dot(enc, j, K), pre.margin.denominator) for j in range(K)]
        m = const(pre.margin.numerator * S * S)
        return [all_of(enc, [cmp(enc, ">=", sub(enc, ips[j], ips[i]), m) for i in range(K) if i != j])
                for j in range(K)]

    def code(enc: Enc, a: int) -> Sym:
        K = qs[a]
        win = leads(enc, K)
        out: Sym = sub(enc, enc.token(1), const(1))
        for j in range(1, K):  # under the precondition exactly one candidate leads
            out = ite(enc, win[j], sub(enc, enc.token(2 * j + 1), const(1)), out)
        return out

    def constraints(enc: Enc) -> list[Sym]:
        out = [cmp(enc, "<=", mul_const(enc, dot(enc, i, i), norm.denominator), const(norm.numerator)) for i in range(n)]
        return out + [any_of(enc, leads(enc, K)) for K in sorted(set(qs)) if K > 1]

    def decode(tok: np.ndarray, vec: dict) -> tuple[np.ndarray, ...]:
        return np.stack([vec[2 * i] for i in range(n)])[None], tok[None, 1::2] - 1

    return Truth(domain_list(task, model), list(range(task.labels(model))), code, len(qs), decode, constraints,
                 vectors=vectors)
