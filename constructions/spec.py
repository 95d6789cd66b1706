"""Task specifications in the certificate's terms, and their comparison with what was proved.

A task states its ground truth twice: as a function (``Task.truth``) and as a *specification* in
the vocabulary of views, which the composed certificate can compare with what it proved about
the model's answer (a table over the answer position's view). The tests check, for every task, that
the specification evaluates to the ground truth on all inputs at small N.

* :class:`Select`: the answer is (the answer named by) the token at the position chosen by the
  token at the query position (Index Lookup: the p-th symbol);
* :class:`CountThreshold`: the answer is ``[sum_i f_i > b]`` (negated if ``negate``), each feature
  f_i a 0/1 function of the tokens at a few positions (Equality, thresholds of k-sparse features).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import Unproven
from exactformer.constructions.views import Group


@dataclass
class Select:
    answer_position: int
    query_position: int
    pointer: np.ndarray  # [d_vocab] position chosen by each query token (-1: not a query token)
    answer_of: np.ndarray  # [d_vocab] index of the answer each token names (-1: none)

    def evaluate(self, tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens)
        pos = self.pointer[t[:, self.query_position]]
        return self.answer_of[t[np.arange(len(t)), pos]]

    def check(self, group: Group, answer: np.ndarray, domains: list[np.ndarray]) -> None:
        """``answer``: the proved answer index per class assignment of ``group``'s variables."""
        vars_ = group.vars
        base = [i for i, v in enumerate(vars_) if v.kind == "tok" and int(v.at[0]) == self.query_position]
        ptrs = [i for i, v in enumerate(vars_) if v.kind == "ptr"]
        if len(base) != 1 or len(ptrs) != 1 or vars_[ptrs[0]].base != base[0]:
            raise Unproven("the answer is not a lookup by the query token (no pointer variable in its view)")
        b, p = base[0], ptrs[0]
        bv, pv = vars_[b], vars_[p]
        want = self.pointer[bv.domain]
        if np.any(pv.at[0] != want):
            u = int(np.flatnonzero(pv.at[0] != want)[0])
            raise Unproven(f"query token {int(bv.domain[u])} looks up position {int(pv.at[0][u])}, not "
                           f"{int(want[u])}", {"positions": [int(want[u])]})
        for i, v in enumerate(vars_):  # any further variable must not change the answer
            if i not in (b, p) and np.any(np.ptp(answer, axis=i) != 0):
                raise Unproven("the answer depends on positions other than the looked-up one")
        got = np.moveaxis(answer, [b, p], [0, 1]).reshape(answer.shape[b], answer.shape[p], -1)[..., 0]
        got = got[np.unique(bv.cls)][:, pv.cls]  # [base classes present, ptr domain]
        exp = self.answer_of[pv.domain][None, :]
        if np.any(got != exp):
            c, s = np.argwhere(got != exp)[0]
            u = int(np.flatnonzero(bv.cls == np.unique(bv.cls)[c])[0])
            raise Unproven(f"with query token {int(bv.domain[u])} and looked-up token {int(pv.domain[s])} the proved "
                           f"answer is {int(got[c, s])}, the task's is {int(exp[0, s])}")


@dataclass
class CountThreshold:
    answer_position: int
    features: list[tuple[tuple[int, ...], np.ndarray]]  # (positions, 0/1 table over their domains' indices)
    b: int
    negate: bool
    answer_index: tuple[int, int]  # answer index of "false", "true"

    def evaluate(self, tokens: np.ndarray, domains: list[np.ndarray]) -> np.ndarray:
        t = np.asarray(tokens)
        S = np.zeros(len(t), dtype=np.int64)
        for pos, table in self.features:
            idx = tuple(np.searchsorted(domains[p], t[:, p]) for p in pos)
            S += table[idx]
        truth = (S > self.b) != self.negate
        return np.where(truth, self.answer_index[1], self.answer_index[0])

    def check(self, group: Group, answer: np.ndarray, domains: list[np.ndarray]) -> None:
        counts = [i for i, v in enumerate(group.vars) if v.kind == "count"]
        if len(counts) != 1:
            raise Unproven("the answer is not a threshold of a count (no count variable in its view)")
        ci = counts[0]
        cv = group.vars[ci]
        model_feats, const_model = _model_features(cv.count, domains)
        spec_feats, const_spec = _canonical(self.features, domains)
        if sorted(model_feats) != sorted(spec_feats):
            extra = sorted(set(model_feats) - set(spec_feats))[:1] or sorted(set(spec_feats) - set(model_feats))[:1]
            raise Unproven(f"the features the model counts differ from the task's (e.g. a feature on positions "
                           f"{list(extra[0][0]) if extra else '?'})",
                           {"positions": list(extra[0][0]) if extra else []})
        # every achievable count, every assignment of the rest of the view: the task's answer
        S = cv.domain
        truth = ((S - const_model + const_spec) > self.b) != self.negate
        want = np.where(truth, self.answer_index[1], self.answer_index[0])
        got = np.moveaxis(answer, ci, -1)
        got = np.take(got, cv.cls, axis=-1)
        bad = np.argwhere(got != want)
        if bad.size:
            s = int(S[bad[0][-1]])
            raise Unproven(f"with {s} counted features the proved answer is {int(got[tuple(bad[0])])}, the task's is "
                           f"{int(want[bad[0][-1]])}", {"counts": [s]})


def _reduce(positions: tuple[int, ...], table: np.ndarray) -> tuple[tuple[int, ...], tuple] | int:
    """A 0/1 function of tokens at ``positions`` without the positions it ignores, with positions
    sorted: (positions, table as nested tuples), or the constant 0/1 it is."""
    table = np.asarray(table, dtype=np.int64)
    pos = list(positions)
    # merge repeated positions (the same token read twice): keep the diagonal
    while len(set(pos)) < len(pos):
        for i in range(len(pos)):
            js = [j for j in range(i + 1, len(pos)) if pos[j] == pos[i]]
            if js:
                j = js[0]
                table = np.diagonal(table, axis1=i, axis2=j)
                table = np.moveaxis(table, -1, i)
                pos.pop(j)
                break
    keep = [i for i in range(table.ndim) if np.any(np.ptp(table, axis=i) != 0)]
    for i in sorted(set(range(table.ndim)) - set(keep), reverse=True):
        table = np.take(table, 0, axis=i)
    pos = [pos[i] for i in keep]
    if not pos:
        return int(table)
    order = np.argsort(pos)
    table = np.transpose(table, order)
    return tuple(pos[i] for i in order), _nested(table)


def _nested(a: np.ndarray) -> tuple:
    return tuple(_nested(x) for x in a) if a.ndim > 1 else tuple(int(x) for x in a)


def _canonical(features: list[tuple[tuple[int, ...], np.ndarray]], domains: list[np.ndarray]) -> tuple[list, int]:
    out, const = [], 0
    for pos, table in features:
        r = _reduce(tuple(pos), table)
        if isinstance(r, int):
            const += r
        else:
            out.append(r)
    return out, const


def _model_features(count: Any, domains: list[np.ndarray]) -> tuple[list, int]:
    """The count's features as (positions, table over the positions' domain indices)."""
    feats = []
    for gi, g in enumerate(count.groups):
        table = count.features[gi]
        if not np.any(table):
            continue
        for m in range(g.pos.size):
            pos, idx = [], []
            for v in g.vars:
                if v.kind != "tok":
                    raise Unproven("a counted feature depends on a variable that is not a token")
                pos.append(int(v.at[m]))
                idx.append(v.cls)
            feats.append((tuple(pos), table[np.ix_(*idx)] if idx else table))
    return _canonical(feats, domains)


__all__ = ["Select", "CountThreshold"]
_ = itertools  # noqa
