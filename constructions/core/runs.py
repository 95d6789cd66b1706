"""Views of the residual stream over runs of positions: what the run certificate knows, in space
that does not grow with N.

The view certificate (:mod:`exactformer.constructions.core.views`) holds arrays over positions;
the run certificate (:mod:`exactformer.verify.certify.runs`) holds *segments*: a range of positions
[start, stop) whose views are one function of input variables described by position-independent
*reads*:

* :class:`TokVar`: the token at position ``slope * p + offset`` (slope 1: at a fixed offset from
  the member p, e.g. the partner x_{i - N/2} of Theorem 6; slope 0: at one fixed position, e.g. BOS);
* :class:`PtrVar`: the token at the position chosen by the token u of another variable (its
  *base*): position ``u + offset`` for u in each of a few token runs (Index Lookup's index token);
* :class:`CountVar`: the number S of positions whose feature (a function of their own view) is 1,
  after a uniform average; its values come in intervals.

Every variable has :class:`Classes`: runs of its domain (token ids, or counts) with a table index
each; tables are boxes ``[*classes of each variable, columns]``. Segments whose variables coincide
are joined with :func:`join` (variables unified by their reads, classes refined).

The tasks state their inputs and specification here in the same terms: :class:`DomainRuns` (the
token ids allowed at each position, as runs), :class:`Lookup` (Index Lookup's Select) and
:class:`Counting` (a threshold of a count of features, each feature a run of positions read at
fixed offsets). Small tasks derive them from their array forms (:func:`domain_runs`,
:func:`lookup_of`, :func:`counting_of`); large ones state them directly.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.core.spec import CountThreshold, Select
from exactformer.constructions.core.views import broadcast, unique_rows
from exactformer.precision.boxes import Box

_UIDS = itertools.count()



class Declined(Exception):
    """The run certificate does not describe this model (a code read through an index table, a
    code without a closed-form algebra, a block without a run certificate ...): the view
    certificate decides it."""


#: token domains up to this size are expanded value by value where a feature or a spec reads them
EXPAND_LIMIT = 1 << 16


class RunConstantCode:
    """A position 'code' whose vectors are constant on runs of indices: vector i is ``rows[r]`` for
    ``starts[r] <= i < starts[r + 1]`` (``starts[0] == 0``; ``n`` vectors in all). :meth:`numerators`
    is defined here, once, from those two arrays, so the run certificate may read one vector per
    run (:meth:`breaks`) of a code block that sits on columns its views track: it accepts only codes
    that keep this :meth:`numerators` (:func:`run_constant`). Theorem 13's type-sign columns are one."""

    family = "run-constant"
    bound = None

    def __init__(self, starts: np.ndarray, rows: np.ndarray, n: int):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.rows = np.asarray(rows, dtype=np.int8)
        if self.starts.ndim != 1 or self.rows.ndim != 2 or len(self.starts) != len(self.rows) or not len(self.starts) \
                or self.starts[0] != 0 or np.any(np.diff(self.starts) <= 0) or self.starts[-1] >= n:
            raise ValueError("a run-constant code needs increasing run starts from 0 below n and one row per run")
        self.n, self.k = int(n), int(self.rows.shape[1])
        self.is_sign_code = bool(np.all(np.abs(self.rows) == 1))

    def numerators(self, idx) -> np.ndarray:
        return self.rows[np.searchsorted(self.starts, np.asarray(idx, dtype=np.int64), side="right") - 1]

    def signs(self, idx) -> np.ndarray:
        return self.numerators(idx)

    def breaks(self, lo: int, hi: int) -> np.ndarray:
        """The indices in (lo, hi) where a new run starts (the vector may change there)."""
        return self.starts[(self.starts > lo) & (self.starts < hi)]

    def generator_key(self) -> tuple:
        return (self.family, self.n, self.k, self.starts.tobytes(), self.rows.tobytes())

    def describe(self) -> dict:
        return {"family": self.family, "n": self.n, "k": self.k, "runs": int(len(self.starts))}


def run_constant(code: Any) -> bool:
    """Whether ``code`` is a :class:`RunConstantCode` whose vectors are the class's own
    :meth:`~RunConstantCode.numerators` (a subclass that redefines them is not trusted)."""
    return (isinstance(code, RunConstantCode) and type(code).numerators is RunConstantCode.numerators
            and type(code).signs is RunConstantCode.signs and type(code).breaks is RunConstantCode.breaks)


# ------------------------------------------------------------------------------------------------
# classes over a domain held as runs
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Classes:
    """A class for every value of a domain of integers held as runs: the values
    [starts[i], stops[i]) (sorted, disjoint) have class ``cls[i]``."""

    starts: np.ndarray
    stops: np.ndarray
    cls: np.ndarray

    @staticmethod
    def of_values(values: np.ndarray, cls: np.ndarray | None = None) -> "Classes":
        """From sorted distinct values (each its own run unless consecutive values share a class)."""
        values = np.asarray(values, dtype=np.int64)
        cls = np.zeros(values.size, dtype=np.int64) if cls is None else np.asarray(cls, dtype=np.int64)
        if values.size == 0:
            return Classes(values, values, cls)
        brk = np.flatnonzero((np.diff(values) != 1) | (np.diff(cls) != 0)) + 1
        first = np.r_[0, brk]
        last = np.r_[brk, values.size]
        return Classes(values[first], values[last - 1] + 1, cls[first])

    @staticmethod
    def run(start: int, stop: int) -> "Classes":
        """The values [start, stop), one class."""
        return Classes(np.array([start], np.int64), np.array([stop], np.int64), np.zeros(1, np.int64))

    @property
    def ncls(self) -> int:
        return int(self.cls.max()) + 1 if self.cls.size else 0

    @property
    def size(self) -> int:
        return int(np.sum(self.stops - self.starts))

    def same_domain(self, other: "Classes") -> bool:
        a, b = self.merged(), other.merged()
        return np.array_equal(a.starts, b.starts) and np.array_equal(a.stops, b.stops)

    def merged(self) -> "Classes":
        """The domain alone: adjacent runs joined, one class."""
        if self.starts.size == 0:
            return self
        brk = np.flatnonzero(self.starts[1:] != self.stops[:-1]) + 1
        return Classes(self.starts[np.r_[0, brk]], self.stops[np.r_[brk - 1, self.stops.size - 1]],
                       np.zeros(brk.size + 1, np.int64))

    def contains(self, lo: int, hi: int) -> bool:
        """Whether every value of [lo, hi) is in the domain."""
        m = self.merged()
        i = int(np.searchsorted(m.stops, lo, side="right"))
        return hi <= lo or (i < m.starts.size and m.starts[i] <= lo and hi <= m.stops[i])

    def class_of(self, values: np.ndarray) -> np.ndarray:
        """The class of each value (each must lie in the domain)."""
        values = np.asarray(values, dtype=np.int64)
        i = np.searchsorted(self.stops, values, side="right")
        ok = (i < self.starts.size) & (self.starts[np.minimum(i, self.starts.size - 1)] <= values)
        if not np.all(ok):
            raise Unproven(f"value {int(values[~ok][0])} is outside the domain")
        return self.cls[i]

    def values(self) -> np.ndarray:
        """Every value (small domains only)."""
        if self.size > EXPAND_LIMIT:
            raise Unproven(f"a domain of {self.size} values is read value by value")
        return np.concatenate([np.arange(a, b) for a, b in zip(self.starts, self.stops)]) if self.starts.size \
            else np.zeros(0, np.int64)

    def representatives(self) -> np.ndarray:
        """One value of each class."""
        rep = np.zeros(self.ncls, dtype=np.int64)
        rep[self.cls[::-1]] = self.starts[::-1]
        return rep

    def split(self, breaks: np.ndarray) -> "Classes":
        """The same classes with runs cut at ``breaks``."""
        b = np.unique(np.asarray(breaks, dtype=np.int64))
        starts, stops, cls = [], [], []
        for s, e, c in zip(self.starts.tolist(), self.stops.tolist(), self.cls.tolist()):
            inner = b[(b > s) & (b < e)].tolist()
            edges = [s] + inner + [e]
            starts += edges[:-1]
            stops += edges[1:]
            cls += [c] * (len(edges) - 1)
        return Classes(np.array(starts, np.int64), np.array(stops, np.int64), np.array(cls, np.int64))

    def refine(self, other: "Classes") -> tuple["Classes", np.ndarray, np.ndarray]:
        """The common refinement of two class maps of one domain: (joint classes, each joint
        class's class in self, in other)."""
        if not self.same_domain(other):
            raise Unproven("internal: refining classes of different domains")
        cuts = np.concatenate([self.starts, self.stops, other.starts, other.stops])
        a, b = self.split(cuts), other.split(cuts)
        pair = np.stack([a.cls, b.cls], axis=1)
        upair, joint = unique_rows(pair)
        return Classes(a.starts, a.stops, joint.astype(np.int64)), upair[:, 0], upair[:, 1]

    def with_classes(self, new: np.ndarray) -> "Classes":
        """Runs kept, classes replaced (``new`` per run), renumbered densely."""
        _, inv = np.unique(np.asarray(new, dtype=np.int64), return_inverse=True)
        return Classes(self.starts, self.stops, inv.reshape(-1).astype(np.int64))


# ------------------------------------------------------------------------------------------------
# variables
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokVar:
    """The token at position ``slope * p + offset`` of the member p (slope 0 or 1)."""

    slope: int
    offset: int
    classes: Classes

    @property
    def key(self) -> tuple:
        return ("tok", self.slope, self.offset)

    def at(self, p: int) -> int:
        return self.slope * p + self.offset


@dataclass(frozen=True)
class PtrVar:
    """The token at position ``u + offset`` for the token u of the base variable (``base``: its
    key), u in [u0, u1) of ``maps`` = ((u0, u1, offset), ...)."""

    base: tuple
    maps: tuple[tuple[int, int, int], ...]
    classes: Classes

    @property
    def key(self) -> tuple:
        return ("ptr", self.base, self.maps)


@dataclass(frozen=True)
class FeatureSource:
    """Positions [start, stop) whose feature is ``table`` (0/1 over the classes of ``reads``,
    the variables of their segment)."""

    start: int
    stop: int
    reads: tuple[Any, ...]
    table: np.ndarray


@dataclass(frozen=True)
class CountVar:
    """The number of positions whose feature is 1 (``sources``); ``classes`` are intervals of counts."""

    classes: Classes
    sources: tuple[FeatureSource, ...]
    uid: int = field(default_factory=lambda: next(_UIDS))

    @property
    def key(self) -> tuple:
        return ("count", self.uid)


def shifted(var: Any, slope: int, delta: int) -> Any:
    """A variable of the segment holding position p' seen from the member p that reads it, p' =
    p + delta (``slope`` 1) or p' = delta (``slope`` 0)."""
    if isinstance(var, TokVar):
        return TokVar(var.slope * slope, var.offset + var.slope * delta, var.classes)
    if isinstance(var, PtrVar):
        base = ("tok", var.base[1] * slope, var.base[2] + var.base[1] * delta) if var.base[0] == "tok" else var.base
        return replace(var, base=base)
    return var


@dataclass
class Segment:
    """Positions [start, stop) with one view: ``table`` [*ncls of each of ``vars``, columns]."""

    start: int
    stop: int
    vars: list[Any]
    table: Box

    @property
    def length(self) -> int:
        return self.stop - self.start

    def piece(self, start: int, stop: int) -> "Segment":
        return Segment(start, stop, self.vars, self.table)


@dataclass
class RunState:
    """Segments (sorted, disjoint) of the positions a certificate still needs, over the tracked
    columns ``cols``."""

    segments: list[Segment]
    cols: np.ndarray

    def pieces(self, start: int, stop: int) -> list[Segment]:
        """The segments' parts inside [start, stop) (Unproven where a position has no segment)."""
        out, p = [], start
        starts = [s.start for s in self.segments]
        i = max(0, int(np.searchsorted(starts, start, side="right")) - 1)
        while p < stop:
            if i >= len(self.segments) or not self.segments[i].start <= p < self.segments[i].stop:
                raise Unproven(f"internal: position {p} has no view")
            s = self.segments[i]
            e = min(stop, s.stop)
            out.append(s.piece(p, e))
            p, i = e, i + 1
        return out

    @property
    def groups(self) -> list[Segment]:
        """The segments (what :func:`~exactformer.constructions.core.views_ops.value_tables` reads)."""
        return self.segments

    def col_index(self, cols: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.cols, cols)
        if np.any(idx >= self.cols.size) or np.any(self.cols[np.minimum(idx, self.cols.size - 1)] != cols):
            raise KeyError(f"columns {np.setdiff1d(cols, self.cols)[:5]} are not tracked")
        return idx


def join(parts: list[tuple[list[Any], Box]]) -> tuple[list[Any], list[Box]]:
    """Views of the same positions from several sources on common variables: variables with the
    same key are one variable (classes refined to the common refinement); each table broadcast to
    the joint variables (in first-seen order)."""
    keys: list[tuple] = []
    joint: dict[tuple, Any] = {}
    for vars_, _ in parts:
        for v in vars_:
            if v.key not in joint:
                keys.append(v.key)
                joint[v.key] = v
            else:
                c, _, _ = joint[v.key].classes.refine(v.classes)
                joint[v.key] = replace(joint[v.key], classes=c)
    jvars = [joint[k] for k in keys]
    tables = []
    for vars_, tab in parts:
        axes = []
        for i, v in enumerate(vars_):
            jv = joint[v.key]
            _, _, own = jv.classes.refine(v.classes)
            tab = Box(np.take(tab.lo, own, axis=i), np.take(tab.hi, own, axis=i))
            axes.append(keys.index(v.key))
        tables.append(broadcast(tab, axes, len(keys)))
    return jvars, tables


# ------------------------------------------------------------------------------------------------
# the task's side: input domains and specifications as runs
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainRuns:
    """The token ids allowed at each position: positions [starts[i], starts[i+1]) (the last run
    ends at ``T``) allow the tokens of ``values[which[i]]`` (a :class:`Classes`, one class)."""

    starts: np.ndarray
    which: np.ndarray
    values: list[Classes]
    T: int

    def breaks(self) -> np.ndarray:
        return np.r_[self.starts, self.T]

    def at(self, p: int) -> Classes:
        return self.values[int(self.which[int(np.searchsorted(self.starts, p, side="right")) - 1])]

    def uniform(self, lo: int, hi: int) -> Classes:
        """The domain shared by positions [lo, hi) (Unproven when they differ)."""
        i = int(np.searchsorted(self.starts, lo, side="right")) - 1
        j = int(np.searchsorted(self.starts, hi - 1, side="right")) - 1
        if lo < 0 or hi > self.T or len({int(w) for w in self.which[i : j + 1]}) != 1:
            raise Unproven(f"positions [{lo}, {hi}) do not share one token domain")
        return self.values[int(self.which[i])]


def domain_runs(domains: Any) -> DomainRuns:
    """A task's :class:`~exactformer.constructions.core.task.Domains` as runs (O(T); tasks with
    large T state theirs directly)."""
    of = np.asarray(domains.of, dtype=np.int64)
    brk = np.r_[0, np.flatnonzero(np.diff(of) != 0) + 1]
    return DomainRuns(brk.astype(np.int64), of[brk], [Classes.of_values(v) for v in domains.values], int(of.size))


@dataclass(frozen=True)
class Lookup:
    """Select as runs: at ``answer_position`` the answer is named by the token at position
    u + offset, u the token at ``query_position``, for u in [u0, u1) of ``pointer``; token v in
    [v0, v1) of ``answers`` names answer a0 + (v - v0)."""

    answer_position: int
    query_position: int
    pointer: tuple[tuple[int, int, int], ...]
    answers: tuple[tuple[int, int, int], ...]
    values: tuple  # the answer each index names (Select.values)

    def positions(self, T: int) -> np.ndarray:
        return np.array([self.answer_position], dtype=np.int64)

    def answer_of(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        out = np.full(tokens.shape, -1, dtype=np.int64)
        for v0, v1, a0 in self.answers:
            sel = (tokens >= v0) & (tokens < v1)
            out[sel] = a0 + tokens[sel] - v0
        return out


def _affine_runs(keys: np.ndarray, values: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """(k0, k1, v0) runs of a map defined on sorted keys with value v0 + (k - k0) on each run."""
    if keys.size == 0:
        return ()
    brk = np.flatnonzero((np.diff(keys) != 1) | (np.diff(values - keys) != 0)) + 1
    first, last = np.r_[0, brk], np.r_[brk, keys.size] - 1
    return tuple((int(keys[a]), int(keys[b]) + 1, int(values[a])) for a, b in zip(first, last))


def lookup_of(select: Select) -> Lookup:
    """A Select specification (arrays over the vocabulary) as runs."""
    q = np.flatnonzero(select.pointer >= 0)
    a = np.flatnonzero(select.answer_of >= 0)
    ptr = _affine_runs(q, select.pointer[q])
    return Lookup(int(select.answer_position), int(select.query_position),
                  tuple((u0, u1, p0 - u0) for u0, u1, p0 in ptr), _affine_runs(a, select.answer_of[a]), tuple(select.values))


@dataclass(frozen=True)
class FeatureRun:
    """Features at base positions p in [start, stop): ``table`` (0/1, one axis per read, over the
    domain indices of the read positions) of the tokens at p + offsets[0], p + offsets[1], ..."""

    start: int
    stop: int
    offsets: tuple[int, ...]
    table: np.ndarray


@dataclass(frozen=True)
class Counting:
    """CountThreshold as runs: answer = [S > b] (negated if ``negate``), S the number of features
    of ``features`` equal to 1."""

    answer_position: int
    features: tuple[FeatureRun, ...]
    b: int
    negate: bool
    answer_index: tuple[int, int]
    values: tuple = (0, 1)  # the answer each index names (CountThreshold.values)

    def positions(self, T: int) -> np.ndarray:
        return np.array([self.answer_position], dtype=np.int64)


def spec_runs(spec: Any) -> Lookup | Counting:
    """A task's array specification as runs (:class:`Lookup` for Select, :class:`Counting` for
    CountThreshold); any other kind has no run form: Declined."""
    if isinstance(spec, Select):
        return lookup_of(spec)
    if isinstance(spec, CountThreshold):
        return counting_of(spec)
    raise Declined(f"a {type(spec).__name__} specification has no run form")


def counting_of(spec: CountThreshold) -> Counting:
    """A CountThreshold specification (feature batches) as runs of single features."""
    runs = []
    for positions, table in spec.features:
        positions = np.asarray(positions, dtype=np.int64).reshape(len(positions), -1)
        for row in positions:
            runs.append(FeatureRun(int(row[0]), int(row[0]) + 1, tuple(int(p - row[0]) for p in row),
                                   np.asarray(table, dtype=np.int64)))
    return Counting(int(spec.answer_position), tuple(runs), int(spec.b), bool(spec.negate), tuple(spec.answer_index),
                    tuple(spec.values))


# ------------------------------------------------------------------------------------------------
# canonical features: a multiset of features compared without listing them
# ------------------------------------------------------------------------------------------------


@dataclass
class FeatureKey:
    """Canonical features: key (table bytes and shape, offsets between the sorted reads) -> base
    intervals with multiplicity; ``ones``: features that are constantly 1."""

    runs: dict[tuple, list[tuple[int, int, int]]] = field(default_factory=dict)
    ones: int = 0

    def add(self, start: int, stop: int, positions: list[tuple[int, int]], table: np.ndarray) -> None:
        """Features at p in [start, stop) reading positions ``slope * p + offset`` (pairs) with
        ``table`` over the reads' domain indices."""
        table = np.asarray(table, dtype=np.int64)
        if stop <= start:
            return
        keep = [i for i in range(table.ndim) if np.any(np.ptp(table, axis=i) != 0)]
        if not keep:
            self.ones += int(table.reshape(-1)[0]) * (stop - start) if table.size else 0
            return
        table = table[tuple(slice(None) if i in keep else 0 for i in range(table.ndim))]
        positions = [positions[i] for i in keep]
        if any(s == 0 for s, _ in positions):  # a read at a fixed position: the features one by one
            if stop - start > EXPAND_LIMIT:
                raise Unproven("a counted feature reads a fixed position along a long run of positions")
            for p in range(start, stop):
                self.add(p, p + 1, [(1, s * p + o - p) for s, o in positions], table)
            return
        order = sorted(range(len(positions)), key=lambda i: positions[i][1])
        offs = [positions[i][1] for i in order]
        table = np.transpose(table, order)
        while len(set(offs)) < len(offs):  # one position read twice: its diagonal
            i = next(i for i in range(len(offs) - 1) if offs[i] == offs[i + 1])
            table = np.moveaxis(np.diagonal(table, axis1=i, axis2=i + 1), -1, i)
            offs.pop(i + 1)
        if not any(np.any(np.ptp(table, axis=i) != 0) for i in range(table.ndim)):
            self.ones += int(table.reshape(-1)[0]) * (stop - start)
            return
        key = (np.ascontiguousarray(table).tobytes(), table.shape, tuple(o - offs[0] for o in offs))
        self.runs.setdefault(key, []).append((start + offs[0], stop + offs[0], 1))

    def canonical(self) -> dict[tuple, list[tuple[int, int, int]]]:
        """Per key the base positions as disjoint sorted intervals with their multiplicity,
        adjacent intervals of equal multiplicity merged."""
        out = {}
        for key, ivs in self.runs.items():
            events: dict[int, int] = {}
            for a, b, mult in ivs:
                events[a] = events.get(a, 0) + mult
                events[b] = events.get(b, 0) - mult
            merged: list[tuple[int, int, int]] = []
            level, prev = 0, None
            for x in sorted(events):
                if prev is not None and level and x > prev:
                    if merged and merged[-1][1] == prev and merged[-1][2] == level:
                        merged[-1] = (merged[-1][0], x, level)
                    else:
                        merged.append((prev, x, level))
                level += events[x]
                prev = x
            out[key] = merged
        return out
