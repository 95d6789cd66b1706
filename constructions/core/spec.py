"""Task specifications in the certificate's terms, and their comparison with what was proved.

A task states its ground truth twice: as a function (``Task.truth``) and as a *specification* in
the vocabulary of views, which the composed certificate can compare with what it proved about
the model's answer (a table over the answer position's view). The framework checks the
specification against the truth before any certificate passes
(:mod:`exactformer.verify.certify.spec_check`). A task of one's own states its specification
declaratively and has its tables derived from its truth (:mod:`exactformer.constructions.core.sequence`).

* :class:`Select`: the answer is (the answer named by) the token at the position chosen by the
  token at the query position (Index Lookup: the p-th symbol);
* :class:`CountThreshold`: the answer is ``[sum_i f_i > b]`` (negated if ``negate``), each feature
  f_i a 0/1 function of the tokens at a few positions (Equality, thresholds of k-sparse features);
* :class:`CountOf`: the answer is any function of ``sum_i f_i`` (a count, an average over a set);
* :class:`Reads`: the answer is a function of the tokens at a few fixed positions and at positions
  that tokens point to (a copy, a function of several retrieved values);
* :class:`ExistsMatch`: the answer at position i is ``[#{j : key(tok_j) = query(tok_i)} >= 1]``
  (Match2, P2 Def. 5.1: does some token pair with this one);
* :class:`Automaton`: the answer after the last token is whether a finite automaton accepts the
  string (bounded Dyck, P1 App. E: "each Dyck-(n, k) is a regular language"); the recurrent
  certificate (:mod:`exactformer.verify.certify.recurrent`) compares a model with it on every
  string of every length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.core.views import Group


class Spec(ABC):
    """What every specification states besides its rule, from the task's definition alone (never
    from a model's labels or metadata): ``values``, the answer each of its answer indices names
    (Index Lookup: symbol s for index s; the boolean tasks: 0 and 1), and the positions of an
    input of T tokens where the answers are read, in the order the task's ``truth`` lists them.
    The certificates compare a model's answer labels and answer positions with these
    (:func:`exactformer.verify.certify.layers.task_answers`), and the framework compares the
    specification with the task's ``truth`` on inputs (:mod:`exactformer.verify.certify.spec_check`)."""

    values: tuple

    @abstractmethod
    def positions(self, T: int) -> np.ndarray:
        """The answer positions of an input of ``T`` tokens, in the order of the task's answers."""

    @abstractmethod
    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        """The answer indices [B, A] the specification gives inputs ``tokens`` (token ids [B, T], or
        :class:`~exactformer.constructions.core.ir.Inputs`) at :meth:`positions` (-1: an input
        outside the task's precondition)."""


@dataclass
class Select(Spec):
    answer_position: int
    query_position: int
    pointer: np.ndarray  # [d_vocab] position chosen by each query token (-1: not a query token)
    answer_of: np.ndarray  # [d_vocab] index of the answer each token names (-1: none)
    values: tuple  # the answer each index names

    def positions(self, T: int) -> np.ndarray:
        return np.array([self.answer_position], dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        return self.evaluate(tokens)[:, None]

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
class _Counted(Spec):
    """What :class:`CountThreshold` and :class:`CountOf` share: the answer at ``answer_position`` is
    a function of S, the number of features equal to 1.

    ``features``: batches (positions [M, r], table): M features, each the 0/1 function ``table``
    (r axes over the domains' indices) of the tokens at its row of positions."""

    answer_position: int
    features: list[tuple[np.ndarray, np.ndarray]]

    @abstractmethod
    def index_of(self, S: np.ndarray) -> np.ndarray:
        """The answer index for counts ``S``."""

    def positions(self, T: int) -> np.ndarray:
        return np.array([self.answer_position], dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        return self.evaluate(tokens, domains)[:, None]

    def evaluate(self, tokens: np.ndarray, domains: Any) -> np.ndarray:
        t = np.asarray(tokens)
        S = np.zeros(len(t), dtype=np.int64)
        for positions, table in self.features:
            for row in np.asarray(positions):
                S += np.asarray(table)[tuple(np.searchsorted(domains[int(p)], t[:, int(p)]) for p in row)]
        return self.index_of(S)

    def check(self, group: Group, answer: np.ndarray, domains: Any) -> None:
        counts = [i for i, v in enumerate(group.vars) if v.kind == "count"]
        if len(counts) != 1:
            raise Unproven("the answer is not a function of a count (no count variable in its view)")
        ci = counts[0]
        cv = group.vars[ci]
        tables: dict[bytes, int] = {}
        model_rows, const_model = _model_features(cv.count, tables)
        spec_rows, const_spec = _canonical_batches(self.features, tables)
        if model_rows.shape != spec_rows.shape or not np.array_equal(model_rows, spec_rows):
            diff = _first_difference(model_rows, spec_rows)
            raise Unproven(f"the features the model counts differ from the task's (e.g. a feature on positions {diff})",
                           {"positions": diff})
        # every achievable count and every assignment of the rest of the view: the task's answer
        S = cv.domain
        want = self.index_of(S - const_model + const_spec)
        got = np.take(np.moveaxis(answer, ci, -1), cv.cls, axis=-1)
        bad = np.argwhere(got != want)
        if bad.size:
            s = int(S[bad[0][-1]])
            raise Unproven(f"with {s} counted features the proved answer is {int(got[tuple(bad[0])])}, the task's is "
                           f"{int(want[bad[0][-1]])}", {"counts": [s]})


@dataclass
class CountThreshold(_Counted):
    """``answer = [S > b]`` (negated if ``negate``), S = the number of features equal to 1
    (:class:`_Counted`)."""

    b: int
    negate: bool
    answer_index: tuple[int, int]  # answer index of "false", "true"
    values: tuple = (0, 1)  # the answer each index names

    def index_of(self, S: np.ndarray) -> np.ndarray:
        return np.where((np.asarray(S) > self.b) != self.negate, self.answer_index[1], self.answer_index[0])


@dataclass
class CountOf(_Counted):
    """``answer = answer_of_count[S]``, S = the number of features equal to 1 (:class:`_Counted`):
    a count, an average, a majority over a set of positions. ``answer_of_count`` [max S + 1]: the
    answer index of each count (-1: none)."""

    answer_of_count: np.ndarray
    values: tuple  # the answer each index names

    def index_of(self, S: np.ndarray) -> np.ndarray:
        S = np.asarray(S, dtype=np.int64)
        top = len(self.answer_of_count)
        return np.where((S >= 0) & (S < top), np.asarray(self.answer_of_count)[np.clip(S, 0, top - 1)], -1)


@dataclass
class Reads(Spec):
    """At ``answer_position`` the answer is a function of the tokens at a few *reads*: a read is a
    position (``("tok", p)``: the token at p) or a pointer (``("ptr", q, pointer)``: the token at
    position ``pointer[u]``, u the token at q; ``pointer`` [d_vocab], -1 where u names no position).
    ``axes[i]``: the token ids read i may hold (sorted); ``table`` [len(axes[0]), len(axes[1]), ...]:
    the answer index for every combination (-1: none).

    ``check`` finds every read among the view's variables (a token variable at p; a pointer variable
    based on the token at q that looks up ``pointer`` of every token its base allows), requires the
    proved answer to depend on nothing else, and compares it with ``table`` on every combination the
    variables' domains allow."""

    answer_position: int
    reads: tuple
    axes: tuple
    table: np.ndarray
    values: tuple  # the answer each index names

    def positions(self, T: int) -> np.ndarray:
        return np.array([self.answer_position], dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        t = np.asarray(tokens, dtype=np.int64)
        rows = np.arange(len(t))
        idx, ok = [], np.ones(len(t), dtype=bool)
        for read, axis in zip(self.reads, self.axes):
            if read[0] == "tok":
                tok = t[:, read[1]]
            else:
                pos = np.asarray(read[2])[t[:, read[1]]]
                ok &= (pos >= 0) & (pos < t.shape[1])
                tok = t[rows, np.clip(pos, 0, t.shape[1] - 1)]
            i = np.searchsorted(axis, tok)
            ok &= (i < len(axis)) & (np.asarray(axis)[np.minimum(i, len(axis) - 1)] == tok)
            idx.append(np.minimum(i, len(axis) - 1))
        out = np.asarray(self.table)[tuple(idx)] if idx else np.full(len(t), int(np.asarray(self.table)))
        return np.where(ok, out, -1)[:, None]

    def check(self, group: Group, answer: np.ndarray, domains: Any) -> None:
        members = np.flatnonzero(group.pos == self.answer_position)
        if members.size == 0:
            raise Unproven(f"position {self.answer_position} is not among the answer's views")
        m = int(members[0])
        vars_ = group.vars
        found = []
        for read in self.reads:
            if read[0] == "tok":
                hit = [i for i, v in enumerate(vars_) if v.kind == "tok" and int(v.at[m]) == read[1]]
                what = f"the token at position {read[1]}"
            else:
                hit = [i for i, v in enumerate(vars_) if v.kind == "ptr" and 0 <= v.base < len(vars_)
                       and vars_[v.base].kind == "tok" and int(vars_[v.base].at[m]) == read[1]
                       and np.array_equal(v.at[m], np.asarray(read[2])[vars_[v.base].domain])]
                what = f"the token at the position the token at {read[1]} names"
            if len(hit) != 1:
                raise Unproven(f"at position {self.answer_position} the answer does not read {what} (no such variable "
                               "in its view)", {"positions": [int(read[1])]})
            found.append(hit[0])
        for i in range(len(vars_)):  # nothing else may change the answer
            if i not in found and np.any(np.ptp(answer, axis=i) != 0):
                v = vars_[i]
                raise Unproven(f"at position {self.answer_position} the answer depends on a {v.kind} variable the "
                               "task's answer does not read", {"positions": [int(v.at[m])] if v.kind == "tok" else []})
        got = np.moveaxis(answer, found, list(range(len(found))))
        got = got.reshape(got.shape[:len(found)] + (-1,))[..., 0]
        for ax, i in enumerate(found):  # over domain values instead of classes
            got = np.take(got, vars_[i].cls, axis=ax)
        pick = []
        for ax, i in enumerate(found):
            dom, axis = vars_[i].domain, np.asarray(self.axes[ax])
            j = np.searchsorted(axis, dom)
            if np.any(j >= len(axis)) or np.any(axis[np.minimum(j, len(axis) - 1)] != dom):
                raise Unproven(f"at position {self.answer_position}: read {ax} may hold tokens the task's table does not "
                               "cover")
            pick.append(j)
        want = np.asarray(self.table)[np.ix_(*pick)] if pick else np.asarray(self.table)
        bad = np.argwhere(got != want)
        if bad.size:
            combo = {f"read {ax}": int(vars_[i].domain[bad[0][ax]]) for ax, i in enumerate(found)}
            raise Unproven(f"at position {self.answer_position} with tokens {combo} the proved answer is "
                           f"{int(got[tuple(bad[0])])}, the task's is {int(want[tuple(bad[0])])}")


def _canonical_batches(batches: list[tuple[np.ndarray, np.ndarray]], tables: dict[bytes, int]) -> tuple[np.ndarray, int]:
    """Features as canonical rows [table id, positions sorted, -1 padded to 8], sorted, and the
    number of constant-1 features. A feature is canonical once the positions it ignores are
    dropped, a position read twice is read once, and its positions are in increasing order (the
    table transposed accordingly); ``tables`` maps canonical tables to ids (shared by both sides)."""
    rows, const = [], 0
    for positions, table in batches:
        positions = np.asarray(positions, dtype=np.int64).reshape(len(positions), -1)
        table = np.asarray(table, dtype=np.int64)
        if positions.shape[0] == 0:
            continue
        # positions repeated within a row: read once (the diagonal), row by row (rare)
        rep = np.any(np.diff(np.sort(positions, axis=1), axis=1) == 0, axis=1)
        for i in np.flatnonzero(rep):
            p, t = _merge_repeats(list(positions[i]), table)
            r, c = _canonical_batches([(np.array([p]), t)], tables)
            rows.append(r)
            const += c
        positions = positions[~rep]
        keep = [i for i in range(table.ndim) if np.any(np.ptp(table, axis=i) != 0)]
        if not keep:
            const += int(table.reshape(-1)[0]) * len(positions)
            continue
        reduced = table[tuple(slice(None) if i in keep else 0 for i in range(table.ndim))]
        pos = positions[:, keep]
        perms = np.argsort(pos, axis=1, kind="stable")
        uperm, inv = np.unique(perms, axis=0, return_inverse=True)
        ids = np.empty(len(uperm), dtype=np.int64)
        for j, perm in enumerate(uperm):
            t = np.ascontiguousarray(np.transpose(reduced, perm))
            key = t.tobytes() + repr(t.shape).encode()
            ids[j] = tables.setdefault(key, len(tables))
        sorted_pos = np.take_along_axis(pos, perms, axis=1)
        out = np.full((len(pos), 9), -1, dtype=np.int64)
        out[:, 0] = ids[inv.reshape(-1)]
        out[:, 1 : 1 + sorted_pos.shape[1]] = sorted_pos
        rows.append(out)
    allrows = np.concatenate(rows) if rows else np.zeros((0, 9), dtype=np.int64)
    order = np.lexsort(allrows.T[::-1])
    return allrows[order], const


def _merge_repeats(pos: list[int], table: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The same function reading each position once (the diagonal of the repeated axes)."""
    while len(set(pos)) < len(pos):
        i = next(i for i in range(len(pos)) if pos[i] in pos[i + 1:])
        j = pos.index(pos[i], i + 1)
        table = np.moveaxis(np.diagonal(table, axis1=i, axis2=j), -1, i)
        pos.pop(j)
    return pos, table


def _model_features(count: Any, tables: dict[bytes, int]) -> tuple[np.ndarray, int]:
    """The count's features (per group: its feature table over the domains of its token variables,
    at every member's positions) in canonical form."""
    batches = []
    for g, table in zip(count.groups, count.features):
        if any(v.kind != "tok" for v in g.vars):
            if np.any(table):
                raise Unproven("a counted feature depends on a variable that is not a token")
            continue
        dom_table = table[np.ix_(*[v.cls for v in g.vars])] if g.vars else table
        positions = np.stack([v.at for v in g.vars], axis=1) if g.vars else np.zeros((g.pos.size, 0), np.int64)
        batches.append((positions, dom_table))
    return _canonical_batches(batches, tables)


def _first_difference(a: np.ndarray, b: np.ndarray) -> list[int]:
    sa = {tuple(r) for r in a.tolist()}
    sb = {tuple(r) for r in b.tolist()}
    diff = sorted(sa ^ sb)
    return [int(p) for p in diff[0][1:] if p >= 0] if diff else []


@dataclass
class ExistsMatch(Spec):
    """``answer_i = [#{j : key(tok_j) = query(tok_i)} >= 1]`` at every answer position i (j ranges
    over all positions, i included). ``query_of_token`` / ``key_of_token`` [d_vocab]: the task's
    query and key of each token id (-1: none -- a token without a key is never counted, one
    without a query never matches).

    ``check`` compares the view's match variable (:class:`~exactformer.constructions.core.views.MatchCount`)
    with the task: the model must count the same relation -- for every query token and every key
    token its domains allow, the model's ids are equal iff the task's are -- and the proved answer
    must be ``[c >= 1]`` for every count c of the variable (only c = 0 for tokens that can match
    no key)."""

    query_of_token: np.ndarray
    key_of_token: np.ndarray
    answer_index: tuple[int, int]  # answer index of "false", "true"
    answer_positions: tuple[int, ...]  # where the task reads answers
    values: tuple = (0, 1)  # the answer each index names

    def positions(self, T: int) -> np.ndarray:
        return np.asarray(self.answer_positions, dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        return self.evaluate(tokens)[:, self.positions(np.shape(tokens)[1])]

    def evaluate(self, tokens: np.ndarray) -> np.ndarray:
        """Answer indices [B, T] at every position of token ids [B, T]."""
        t = np.asarray(tokens, dtype=np.int64)
        q, k = self.query_of_token[t], self.key_of_token[t]
        top = int(max(q.max(initial=0), k.max(initial=0))) + 2
        rows = np.arange(len(t), dtype=np.int64)[:, None] * top
        keys = np.sort(np.where(k >= 0, k + rows, -1).ravel())
        want = (q + rows).ravel()
        count = np.searchsorted(keys, want, side="right") - np.searchsorted(keys, want, side="left")
        hit = (count.reshape(q.shape) >= 1) & (q >= 0)
        return np.where(hit, self.answer_index[1], self.answer_index[0])

    def check(self, group: Group, answer: np.ndarray, domains: Any) -> None:
        vars_ = group.vars
        ms = [i for i, v in enumerate(vars_) if v.kind == "match"]
        if len(ms) != 1:
            raise Unproven("the answer is not a function of a match count (no match variable in its view)")
        mi = ms[0]
        mv = vars_[mi]
        own = [i for i, v in enumerate(vars_) if v.kind == "tok" and np.array_equal(v.at, mv.at)]
        if len(own) != 1 or not np.array_equal(vars_[own[0]].domain, mv.match.query_tokens):
            raise Unproven("the match count's query token is not a variable of the view")
        bi = own[0]
        bv = vars_[bi]
        can = self._same_relation(mv.match)  # per token of the base domain: some key can match it
        can_cls = np.zeros(bv.ncls, dtype=bool)
        np.logical_or.at(can_cls, bv.cls, can)
        got = np.take(np.moveaxis(answer, [bi, mi], [0, -1]), mv.cls, axis=-1)  # [base classes, ..., counts]
        c = mv.domain
        want = np.where(c >= 1, self.answer_index[1], self.answer_index[0])
        shape = (-1,) + (1,) * (got.ndim - 1)
        checked = can_cls.reshape(shape) | (c == 0)
        bad = np.argwhere((got != want) & checked)
        if bad.size:
            s = int(c[bad[0][-1]])
            raise Unproven(f"with {s} matching keys the proved answer is {int(got[tuple(bad[0])])}, the task's is "
                           f"{int(want[bad[0][-1]])}", {"counts": [s]})

    def _same_relation(self, meaning: Any) -> np.ndarray:
        """Whether the model's ids and the task's maps define the same match relation on every
        (query token, key token) pair the domains allow; returns, per query token, whether some
        key token matches it."""
        qt = np.asarray(meaning.query_tokens, dtype=np.int64)
        mq, tq = np.asarray(meaning.query_id, dtype=np.int64), self.query_of_token[qt]
        by_model: dict[int, set] = {}  # key id -> the (key group, token) pairs holding it
        by_task: dict[int, set] = {}
        for g, (toks, ids) in enumerate(zip(meaning.key_tokens, meaning.key_id)):
            toks = np.asarray(toks, dtype=np.int64)
            for v, a, x in zip(toks.tolist(), np.asarray(ids).tolist(), self.key_of_token[toks].tolist()):
                if a >= 0:
                    by_model.setdefault(a, set()).add((g, v))
                if x >= 0:
                    by_task.setdefault(x, set()).add((g, v))
        can = np.zeros(qt.size, dtype=bool)
        seen: dict[tuple[int, int], bool] = {}
        for r, (u, a, x) in enumerate(zip(qt.tolist(), mq.tolist(), tq.tolist())):
            if (a, x) not in seen:
                hm = by_model.get(a, set()) if a >= 0 else set()
                ht = by_task.get(x, set()) if x >= 0 else set()
                if hm != ht:
                    g, v = min(hm ^ ht)
                    pos = int(np.asarray(meaning.key_positions[g])[0])
                    raise Unproven(f"query token {u} and key token {v} at position {pos}: the model "
                                   f"{'counts' if (g, v) in hm else 'does not count'} the pair, the task "
                                   f"{'does' if (g, v) in ht else 'does not'}", {"tokens": [u, v], "positions": [pos]})
                seen[(a, x)] = bool(ht)
            can[r] = seen[(a, x)]
        return can


@dataclass
class NearestLabel(Spec):
    """At answer position q the answer is (the answer named by) the token at the *label position*
    of the candidate chosen by a content rule (Theorem 7 and associative recall; see
    :class:`~exactformer.constructions.core.views.ContentRule`): "nearest" -- the candidate whose input
    vector has the largest inner product with the query's (the task's precondition: unique, ahead
    by ``margin``, squared norms <= ``max_norm_sq``); "equal" -- the candidate whose token equals
    the query's (the precondition: exactly one).

    ``candidates[q]``: the candidate positions of answer position q; ``label_of[t]``: the label
    position of candidate t; ``answer_of[v]``: the answer index token v names (-1: none).

    ``check`` requires the view's content variable to carry this rule at q over exactly these
    candidates (for "nearest": a margin and norm bound the task's precondition implies), a pointer
    variable based on it reading ``label_of`` of every candidate, and the proved answer to be
    ``answer_of`` of the pointed-to token for every class, whatever the other variables."""

    rule: str
    candidates: dict[int, np.ndarray]
    label_of: np.ndarray
    answer_of: np.ndarray
    values: tuple  # the answer each index names
    margin: Any = None
    max_norm_sq: Any = None

    def positions(self, T: int) -> np.ndarray:
        return np.array(sorted(self.candidates), dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        if self.rule == "nearest":
            return self.evaluate(tokens.tokens, tokens.vectors.num, tokens.vectors.den)
        return self.evaluate(tokens)

    def evaluate(self, tokens: np.ndarray, vectors: np.ndarray | None = None, scale: int | None = None) -> np.ndarray:
        """Answer indices [B, A] (answer positions in increasing order); ``vectors`` [B, T, d] exact
        (integers, the grid values times ``scale``) for "nearest". Inputs that break the
        precondition give -1."""
        t = np.asarray(tokens)
        out = np.full((len(t), len(self.candidates)), -1, dtype=np.int64)
        for a, q in enumerate(sorted(self.candidates)):
            C = np.asarray(self.candidates[q])
            if self.rule == "equal":
                hit = t[:, C] == t[:, [q]]
                ok = hit.sum(axis=1) == 1
                j = C[np.argmax(hit, axis=1)]
            else:
                v = np.asarray(vectors)
                v = v if v.dtype.kind in "iu" and np.abs(v).max(initial=0) < 1 << 28 else v.astype(object)
                ip = np.einsum("btd,bd->bt", v[:, C], v[:, q])
                order = np.argsort(-ip, axis=1, kind="stable")
                best = ip[np.arange(len(t)), order[:, 0]]
                second = ip[np.arange(len(t)), order[:, 1]] if C.size > 1 else None
                scale = Fraction(1) if scale is None else Fraction(scale)
                ok = np.ones(len(t), bool) if second is None else \
                    np.array([Fraction(int(b) - int(s)) / scale**2 >= self.margin for b, s in zip(best, second)])
                j = C[order[:, 0]]
            lab = t[np.arange(len(t)), self.label_of[j]]
            out[:, a] = np.where(ok, self.answer_of[lab], -1)
        return out

    def check(self, group: Group, answer: np.ndarray, domains: Any) -> None:
        vars_ = group.vars
        cs = [i for i, v in enumerate(vars_) if v.kind == "content"]
        if len(cs) != 1 or group.pos.size != 1:
            raise Unproven("the answer is not read through one content pointer (no content variable in its view)")
        ci, q = cs[0], int(group.pos[0])
        cv = vars_[ci]
        rule = cv.content
        want = np.asarray(self.candidates.get(q, np.zeros(0, np.int64)))
        if rule is None or rule.rule != self.rule or rule.query != q:
            raise Unproven(f"at position {q} the content pointer follows rule {getattr(rule, 'rule', None)!r} "
                           f"for query {getattr(rule, 'query', None)}, the task's is {self.rule!r} at {q}", {"positions": [q]})
        if not np.array_equal(np.asarray(rule.candidates), want) or not np.array_equal(cv.domain, want):
            raise Unproven(f"at position {q} the content pointer chooses among other positions than the task's "
                           f"candidates", {"positions": [q]})
        if self.rule == "nearest" and not (rule.margin is not None and self.margin >= rule.margin
                                           and rule.max_norm_sq is not None and self.max_norm_sq <= rule.max_norm_sq):
            raise Unproven(f"the model is proved for margin >= {rule.margin} and norms^2 <= {rule.max_norm_sq}, "
                           f"the task allows margin {self.margin} and norms^2 {self.max_norm_sq}")
        ps = [i for i, v in enumerate(vars_) if v.kind == "ptr" and v.base == ci]
        if len(ps) != 1:
            raise Unproven(f"at position {q} the answer is not the token at a position the content pointer chooses")
        pi = ps[0]
        pv = vars_[pi]
        if not np.array_equal(pv.at[0], self.label_of[cv.domain]):
            u = int(np.flatnonzero(pv.at[0] != self.label_of[cv.domain])[0])
            raise Unproven(f"candidate {int(cv.domain[u])} leads to position {int(pv.at[0][u])}, not to its label "
                           f"{int(self.label_of[cv.domain[u]])}", {"positions": [int(cv.domain[u])]})
        for i in range(len(vars_)):
            if i not in (ci, pi) and np.any(np.ptp(answer, axis=i) != 0):
                raise Unproven(f"at position {q} the answer depends on more than the chosen label")
        got = np.moveaxis(answer, [ci, pi], [0, 1]).reshape(answer.shape[ci], answer.shape[pi], -1)[..., 0]
        if cv.code is not None:  # held by its code: its classes are code entries, not candidates
            if np.any(got != got[:1]):
                raise Unproven(f"at position {q} the answer depends on the chosen candidate's code, not only on its label")
            got = np.broadcast_to(got[:1], (cv.domain.size, got.shape[1]))
        else:
            got = got[cv.cls]
        got = got[:, pv.cls]  # [candidates, label tokens]
        exp = self.answer_of[pv.domain][None, :]
        if np.any(got != exp):
            c, s = np.argwhere(got != exp)[0]
            raise Unproven(f"at position {q} with candidate {int(cv.domain[c])} and label token {int(pv.domain[s])} the "
                           f"proved answer is {int(got[c, s])}, the task's is {int(exp[0, s])}", {"positions": [q]})


REJECT = -1  # the automaton's reject sink: no transition leaves it and it accepts nothing


@dataclass
class Automaton(Spec):
    """A deterministic finite automaton over token ids: ``delta[q, token]`` is the next state
    (:data:`REJECT`: the reject sink), ``start`` the start state, ``accept[q]`` whether q accepts;
    ``answer_index`` the answer index of (reject, accept)."""

    delta: np.ndarray  # [Q, d_vocab] int64
    start: int
    accept: np.ndarray  # [Q] bool
    answer_index: tuple[int, int]
    values: tuple = (False, True)  # the answer each index names

    def positions(self, T: int) -> np.ndarray:
        """After the last token."""
        return np.array([T - 1], dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        return self.evaluate(tokens)[:, None]

    @property
    def states(self) -> int:
        return int(self.delta.shape[0])

    def run(self, tokens: np.ndarray) -> np.ndarray:
        """The state after each string of ``tokens`` [B, T] (REJECT once rejected)."""
        t = np.asarray(tokens, dtype=np.int64)
        q = np.full(len(t), self.start, dtype=np.int64)
        for j in range(t.shape[1]):
            live = q != REJECT
            q = np.where(live, self.delta[np.where(live, q, 0), t[:, j]], REJECT)
        return q

    def accepts(self, states: np.ndarray) -> np.ndarray:
        """Whether each of ``states`` (REJECT allowed) accepts."""
        states = np.asarray(states, dtype=np.int64)
        return np.where(states == REJECT, False, self.accept[np.where(states == REJECT, 0, states)])

    def evaluate(self, tokens: np.ndarray) -> np.ndarray:
        """The answer index for each string of ``tokens`` [B, T]."""
        return np.where(self.accepts(self.run(tokens)), self.answer_index[1], self.answer_index[0])
