"""The Boolean tasks of Theorems 6 and 13: definitions, ground truths, input sources, specifications.

Equality / Inequality: EQ(x) = [x_{1..N/2} = x_{N/2+1..N}] for x in {-1, 1}^N (INEQ = 1 - EQ).
Thresholds of k-sparse features: Th_b(g_1(x_{I_1}), .., g_m(x_{I_m})) = [sum_j g_j(x_{I_j}) > b] for
x in {0, 1}^N, with the named cases Disjointness, k-DNF and k-CNF. Natural inputs are lists of N
ints; they are held as one array ``x [B, N]``.

Ground truths are computed from each task's own definition, not from a model's feature tables:
EQ / INEQ from the two halves, DISJ from the two halves, k-DNF / k-CNF from the clause lists in
``model.task_params["clauses"]``. Only the general THRES task reads its definition (index sets,
truth tables, b) from ``model.task_params``: that *is* its definition. Each task's specification
(:mod:`exactformer.constructions.core.spec`) restates its truth as a count of features compared with b.

Features (:class:`Features`) are listed one by one (:class:`FeatureTable`: index arrays, m <= 2^22)
or given as runs (:class:`FeatureRuns`: a rule over positions, e.g. Disjointness's one run "feature
i reads (i, i + N/2)"), which the builder, the specification as runs and the saved manifest hold
in O(runs), so N reaches 2^30.

Sources:

* ``exhaustive``: all 2^N inputs in counting order (x_1 is the most significant bit), vectorised.
* ``sample``: seeded; Equality draws half of the inputs uniformly and half as "first half copied,
  then (with probability 1/2) 1-3 random bits flipped"; thresholds draw each input with its own
  density p ~ U(0, 1).
* ``adversarial``: Equality: inputs with equal halves and every single-bit flip of them. Thresholds:
  inputs with exactly b and exactly b + 1 true features (found by a seeded local search) and all
  their single-bit neighbours.
* ``candidates`` (for a failed proof): inputs with the feature counts the proof named, then the
  adversarial and sampled ones.
"""

from __future__ import annotations

import bisect
import itertools
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.runs import EXPAND_LIMIT, Classes, Counting, Declined, DomainRuns, FeatureRun
from exactformer.constructions.core.spec import CountThreshold
from exactformer.constructions.core.task import Batch, Domains, PowerCount, Task, TaskError, power_count, redefines

MAX_K = 8  # heads = k; the MLP has up to 2 * G * 2^k units
MAX_LISTED = 1 << 22  # features listed one by one (index arrays [m, k]) up to this many


class ThresholdError(TaskError):
    """Bad features, clauses or inputs for the threshold family."""


# ------------------------------------------------------------------------------------------------
# features (the definition of the threshold family)
# ------------------------------------------------------------------------------------------------


def _table_of(g: Any, r: int, where: str) -> tuple[int, ...]:
    """A truth table of length 2^r in itertools.product order (first bit most significant)."""
    if callable(g):
        out = []
        for bits in itertools.product((0, 1), repeat=r):
            v = g(*bits)
            if v not in (0, 1, True, False):
                raise ThresholdError(f"{where}: g must return 0 or 1, got {v!r} for bits {bits}")
            out.append(int(v))
        return tuple(out)
    try:
        t = [int(v) for v in g]
    except TypeError:
        raise ThresholdError(f"{where}: g must be a truth table (sequence of 0/1) or a function of the bits") from None
    if len(t) != 1 << r:
        raise ThresholdError(f"{where}: the truth table has length {len(t)}, expected 2^{r} = {1 << r} for |I| = {r}")
    if any(v not in (0, 1) for v in t):
        raise ThresholdError(f"{where}: truth table entries must be 0 or 1")
    return tuple(t)


def _is_index_set(item: Any) -> bool:
    return isinstance(item, (list, tuple, np.ndarray)) and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in item)


def normalize_features(n: int, features: Sequence[Any], g: Any, k: int | None) -> tuple[np.ndarray, np.ndarray, list]:
    """Validate features; return (index [m, k] int64, 1-based, 0 = unused slot), (type [m] int64,
    -1 for an empty feature), and the list of types [(arity, table)]."""
    if not isinstance(features, (list, tuple)):
        raise ThresholdError("features must be a list of index sets (or of (index set, g) pairs)")
    m = len(features)
    if not 1 <= m <= n:
        raise ThresholdError(f"features: the number of features must lie in [1, n] = [1, {n}], got {m}")
    sets, gs = [], []
    for j, item in enumerate(features):
        if _is_index_set(item):
            sets.append([int(v) for v in item])
            gs.append(None)
        elif isinstance(item, (list, tuple)) and len(item) == 2 and _is_index_set(item[0]):
            sets.append([int(v) for v in item[0]])
            gs.append(item[1])
        else:
            raise ThresholdError(f"features[{j}] must be an index set (ints in [1, {n}]) or a pair (index set, g)")
    kmax = max((len(s) for s in sets), default=0)
    if k is None:
        k = max(1, kmax)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
        raise ThresholdError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
    k = int(k)
    types: list[tuple[int, tuple[int, ...]]] = []
    type_id: dict = {}
    tables: dict = {}  # (id(g), arity) -> table, so a shared g is evaluated once
    index = np.zeros((m, k), dtype=np.int64)
    ftype = np.full(m, -1, dtype=np.int64)
    for j, (s, gj) in enumerate(zip(sets, gs)):
        if len(s) > k:
            raise ThresholdError(f"features[{j}]: |I_j| = {len(s)} exceeds k = {k} (allowed: |I_j| <= k)")
        if any(not 1 <= v <= n for v in s):
            bad = next(v for v in s if not 1 <= v <= n)
            raise ThresholdError(f"features[{j}]: index {bad} out of range; indices must lie in [1, n] = [1, {n}]")
        if len(set(s)) != len(s):
            raise ThresholdError(f"features[{j}]: index set {s} repeats an index (indices must be distinct)")
        index[j, : len(s)] = s
        if not s:
            continue
        gg = gj if gj is not None else g
        if gg is None:
            raise ThresholdError(f"features[{j}]: no g given (pass g=... or (index set, g) pairs)")
        tk = (id(gg), len(s))
        if tk not in tables:
            tables[tk] = (gg, _table_of(gg, len(s), f"features[{j}]"))  # keep gg alive while its id is a key
        key = (len(s), tables[tk][1])
        if key not in type_id:
            type_id[key] = len(types)
            types.append(key)
        ftype[j] = type_id[key]
    return index, ftype, types


def feature_values(index: np.ndarray, ftype: np.ndarray, types: list, x: np.ndarray) -> np.ndarray:
    """g_j(x_{I_j}) for x [B, N] in {0, 1}: int64 [B, m] (vectorised per type)."""
    x = np.asarray(x, dtype=np.int64)
    B, m = x.shape[0], len(ftype)
    out = np.zeros((B, m), dtype=np.int64)
    for t, (r, table) in enumerate(types):
        sel = np.flatnonzero(ftype == t)
        if not sel.size:
            continue
        code = np.zeros((B, sel.size), dtype=np.int64)
        for h in range(r):
            code = code * 2 + x[:, index[sel, h] - 1]
        out[:, sel] = np.asarray(table, dtype=np.int64)[code]
    return out


def literal_features(n: int, clauses: Sequence[Sequence[int]], kind: str, k: int | None) -> tuple[list, int]:
    """(index set, table) pairs for DNF terms (AND of literals) or CNF clauses (OR of literals)."""
    if not isinstance(clauses, (list, tuple)) or not clauses:
        raise ThresholdError(f"{'terms' if kind == 'dnf' else 'clauses'} must be a non-empty list of literal lists")
    if len(clauses) > n:
        raise ThresholdError(f"at most n = {n} {'terms' if kind == 'dnf' else 'clauses'} are allowed, got {len(clauses)}")
    out = []
    for j, c in enumerate(clauses):
        if not _is_index_set(c) or not len(c):
            raise ThresholdError(f"clause {j}: must be a non-empty list of nonzero ints (literals +v / -v, v in [1, {n}])")
        lits = [int(v) for v in c]
        if any(v == 0 or abs(v) > n for v in lits):
            bad = next(v for v in lits if v == 0 or abs(v) > n)
            raise ThresholdError(f"clause {j}: literal {bad} out of range; literals are +v or -v with v in [1, n] = [1, {n}]")
        vars_ = [abs(v) for v in lits]
        if len(set(vars_)) != len(vars_):
            raise ThresholdError(f"clause {j}: {lits} repeats a variable")
        if k is not None and len(lits) > k:
            raise ThresholdError(f"clause {j}: {len(lits)} literals exceed k = {k} (allowed: at most k literals)")
        want = tuple(1 if v > 0 else 0 for v in lits)
        table = [0] * (1 << len(lits))
        for idx, bits in enumerate(itertools.product((0, 1), repeat=len(lits))):
            if kind == "dnf":
                table[idx] = int(bits == want)
            else:
                table[idx] = int(bits != tuple(1 - w for w in want))
        out.append((vars_, table))
    return out, len(clauses)


def random_clauses(n: int, m: int, k: int, seed: int) -> list[list[int]]:
    """m random clauses of k distinct variables with random signs (seeded)."""
    rng = np.random.default_rng(seed)
    k = min(k, n)
    out = []
    for _ in range(m):
        vs = rng.choice(n, size=k, replace=False) + 1
        sg = rng.choice([-1, 1], size=k)
        out.append([int(v * s) for v, s in zip(vs, sg)])
    return out


# ------------------------------------------------------------------------------------------------
# the features of a model: listed one by one, or as runs (a rule over positions)
# ------------------------------------------------------------------------------------------------

#: Pieces of a map from positions to code indices: (start, stop, slope, offset), index
#: slope * p + offset on [start, stop), slope 0 or 1, the pieces covering [0, T) in order.
Pieces = list[tuple[int, int, int, int]]


class Features(ABC):
    """The m <= N features of a threshold model, feature j (1-based) computed at position j: its
    index set I_j (ordered, at most ``k`` slots) and type (an index into ``types``, the distinct
    (arity, truth table) pairs; -1 for an empty feature)."""

    n: int
    k: int
    types: list[tuple[int, tuple[int, ...]]]

    @property
    @abstractmethod
    def m(self) -> int:
        """The number of features."""

    @abstractmethod
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(index [m, k] int64 1-based, 0 = unused slot; type [m] int64): every feature listed
        (ThresholdError beyond :data:`MAX_LISTED` features)."""

    @abstractmethod
    def code_runs(self, h: int, limit: int) -> list[tuple[str, int, int, int]] | None:
        """The code index head ``h`` queries at positions 0..N (I_j[h] at position j; 0, BOS's
        vector, at BOS, at positions without a feature and in unused slots) as maximal runs
        ("affine", start, stop, index at start) (index + 1 per position) or ("constant", start,
        stop, index), scanned left to right. Listed features: None when there are more than
        ``limit`` runs (a table of indices, :meth:`query_table`, is then cheaper); features as
        runs always give their runs (O(runs) of them, whatever N is)."""

    @abstractmethod
    def query_table(self, h: int) -> np.ndarray:
        """The code index head ``h`` queries at every position 0..N (int64 [N + 1])."""

    @abstractmethod
    def type_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, type) over positions 0..N: positions [starts[i], starts[i+1]) have feature type
        ``type[i]`` (-1: BOS, no feature, or an empty one)."""

    @abstractmethod
    def task_params(self) -> dict[str, Any]:
        """How ``model.task_params`` records the features (the general task's definition)."""


def greedy_runs(pieces: Pieces, T: int) -> list[tuple[str, int, int, int]]:
    """The runs :meth:`Features.code_runs` describes, from pieces of the index map, without listing
    positions: a run starting at i is affine when the index at i + 1 is one more, and then
    extends while the index keeps growing by one, else constant while it stays equal (whole
    pieces of the matching slope are taken at once)."""
    starts = [p[0] for p in pieces]

    def piece(i: int) -> tuple[int, int, int, int]:
        return pieces[bisect.bisect_right(starts, i) - 1]

    def at(i: int) -> int:
        _, _, slope, off = piece(i)
        return slope * i + off

    runs, i = [], 0
    while i < T:
        v, j = at(i), i + 1
        kind, step = ("affine", 1) if j < T and at(j) == v + 1 else ("constant", 0)
        while j < T:
            _, stop, slope, off = piece(j)
            if slope * j + off != v + step * (j - i):
                break
            j = stop if slope == step else j + 1
        runs.append((kind, i, j, v))
        i = j
    return runs


def table_runs(qidx: np.ndarray) -> list[tuple[str, int, int, int]]:
    """:func:`greedy_runs` of an index table (one entry per position)."""
    T, runs, i = len(qidx), [], 0
    while i < T:
        j = i + 1
        if j < T and qidx[j] == qidx[i] + 1:
            while j < T and qidx[j] == qidx[j - 1] + 1:
                j += 1
            runs.append(("affine", i, j, int(qidx[i])))
        else:
            while j < T and qidx[j] == qidx[i]:
                j += 1
            runs.append(("constant", i, j, int(qidx[i])))
        i = j
    return runs


class FeatureTable(Features):
    """Features listed one by one (:func:`normalize_features`): index [m, k] and type [m] arrays."""

    def __init__(self, n: int, index: np.ndarray, ftype: np.ndarray, types: list):
        self.n, self.index, self.ftype, self.types = int(n), index, ftype, types
        self.k = int(index.shape[1])

    @property
    def m(self) -> int:
        return int(len(self.ftype))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.index, self.ftype

    def query_table(self, h: int) -> np.ndarray:
        out = np.zeros(self.n + 1, dtype=np.int64)
        out[1 : self.m + 1] = self.index[:, h]
        return out

    def code_runs(self, h: int, limit: int) -> list[tuple[str, int, int, int]] | None:
        runs = table_runs(self.query_table(h))
        return runs if len(runs) <= limit else None

    def type_runs(self) -> tuple[np.ndarray, np.ndarray]:
        tpos = np.full(self.n + 1, -1, dtype=np.int64)
        tpos[1 : self.m + 1] = self.ftype
        starts = np.r_[0, np.flatnonzero(np.diff(tpos) != 0) + 1].astype(np.int64)
        return starts, tpos[starts]

    def task_params(self) -> dict[str, Any]:
        return {"feature_index": self.index, "feature_type": self.ftype}


@dataclass(frozen=True)
class FeatureBlock:
    """Features ``first`` .. ``first + count - 1``: feature first + t has index set
    (start[0] + step[0] t, start[1] + step[1] t, ...) (step 0 or 1 per slot) and type ``type``."""

    first: int
    count: int
    start: tuple[int, ...]
    step: tuple[int, ...]
    type: int

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "count": self.count, "index": list(self.start), "step": list(self.step),
                "type": self.type}


class FeatureRuns(Features):
    """Features as runs (:class:`FeatureBlock`, consecutive from feature 1): a rule over positions,
    held in O(runs) whatever N is. Disjointness is one run: feature i reads (i, i + N/2)."""

    def __init__(self, n: int, k: int, blocks: Sequence[FeatureBlock], types: list):
        self.n, self.k, self.blocks, self.types = int(n), int(k), tuple(blocks), types

    @property
    def m(self) -> int:
        return sum(b.count for b in self.blocks)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.m > MAX_LISTED:
            raise ThresholdError(f"listing the features one by one needs m <= 2^22 features, got m = {self.m}")
        index = np.zeros((self.m, self.k), dtype=np.int64)
        ftype = np.empty(self.m, dtype=np.int64)
        for b in self.blocks:
            t = np.arange(b.count, dtype=np.int64)
            for h, (s, d) in enumerate(zip(b.start, b.step)):
                index[b.first - 1 : b.first - 1 + b.count, h] = s + d * t
            ftype[b.first - 1 : b.first - 1 + b.count] = b.type
        return index, ftype

    def pieces(self, h: int) -> Pieces:
        """The index head ``h`` queries, as pieces over positions 0..N (see :data:`Pieces`)."""
        out: Pieces = [(0, 1, 0, 0)]
        for b in self.blocks:
            if h < len(b.start):
                out.append((b.first, b.first + b.count, b.step[h], b.start[h] - b.step[h] * b.first))
            else:
                out.append((b.first, b.first + b.count, 0, 0))
        if self.m < self.n:
            out.append((self.m + 1, self.n + 1, 0, 0))
        return out

    def code_runs(self, h: int, limit: int) -> list[tuple[str, int, int, int]]:
        return greedy_runs(self.pieces(h), self.n + 1)

    def query_table(self, h: int) -> np.ndarray:
        if self.n + 1 > MAX_LISTED:
            raise ThresholdError(f"a table of query indices needs N <= 2^22, got N = {self.n}")
        p = np.arange(self.n + 1, dtype=np.int64)
        out = np.zeros(self.n + 1, dtype=np.int64)
        for a, b, slope, off in self.pieces(h):
            out[a:b] = slope * p[a:b] + off
        return out

    def type_runs(self) -> tuple[np.ndarray, np.ndarray]:
        starts, types = [0], [-1]
        for b in self.blocks:
            if b.type != types[-1]:
                starts.append(b.first)
                types.append(b.type)
        if self.m < self.n and types[-1] != -1:
            starts.append(self.m + 1)
            types.append(-1)
        return np.array(starts, np.int64), np.array(types, np.int64)

    def task_params(self) -> dict[str, Any]:
        return {"feature_runs": [b.to_json() for b in self.blocks]}

    def counting(self) -> tuple[FeatureRun, ...] | None:
        """The features as :class:`~exactformer.constructions.core.runs.FeatureRun` (reads at
        p + offsets, p the feature's position; input bit i is token position i): a run whose slots
        all step by 1 is one FeatureRun; a run with a slot of step 0 (a fixed position) is one
        FeatureRun per feature, up to ``EXPAND_LIMIT`` features (None beyond)."""
        out = []
        for b in self.blocks:
            if b.type < 0:
                continue
            r, table = self.types[b.type]
            table = np.asarray(table, dtype=np.int64).reshape((2,) * r)
            if all(d == 1 for d in b.step):
                out.append(FeatureRun(b.first, b.first + b.count, tuple(s - b.first for s in b.start), table))
            elif b.count <= EXPAND_LIMIT:
                out += [FeatureRun(p, p + 1, tuple(s + d * (p - b.first) - p for s, d in zip(b.start, b.step)), table)
                        for p in range(b.first, b.first + b.count)]
            else:
                return None
        return tuple(out)


def feature_runs(n: int, runs: Sequence[Any], g: Any, k: int | None) -> FeatureRuns:
    """Validate features given as runs: a list of {"count": c, "index": [i_1, ..], "step": [0|1, ..]
    (default all 1), "g": truth table (default the shared ``g``)}; run r holds the next c
    features, feature t of the run (t = 0 .. c - 1) reading (i_1 + step_1 t, i_2 + step_2 t, ..)."""
    items = []
    for r, item in enumerate(runs):
        where = f"features[{r}]"
        if not isinstance(item, dict) or set(item) - {"count", "index", "step", "g"} or not {"count", "index"} <= set(item):
            raise ThresholdError(f"{where}: a run is an object with keys count, index and optionally step, g")
        c, idx = item["count"], item["index"]
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise ThresholdError(f"{where}: count must be an integer >= 1, got {c!r}")
        if not _is_index_set(idx):
            raise ThresholdError(f"{where}: index must be a list of ints in [1, {n}]")
        step = item.get("step", [1] * len(idx))
        if not _is_index_set(step) or len(step) != len(idx) or any(int(d) not in (0, 1) for d in step):
            raise ThresholdError(f"{where}: step must list 0 or 1 for each of the {len(idx)} indices")
        items.append((int(c), [int(v) for v in idx], [int(d) for d in step], item.get("g", g), where))
    if not items:
        raise ThresholdError("features must be a list of index sets (or of (index set, g) pairs), or of runs")
    m = sum(c for c, *_ in items)
    if m > n:
        raise ThresholdError(f"features: the number of features must lie in [1, n] = [1, {n}], got {m}")
    kmax = max(len(idx) for _, idx, *_ in items)
    k = max(1, kmax) if k is None else k
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
        raise ThresholdError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
    types: list[tuple[int, tuple[int, ...]]] = []
    blocks, first = [], 1
    for c, idx, step, gg, where in items:
        if len(idx) > k:
            raise ThresholdError(f"{where}: |I_j| = {len(idx)} exceeds k = {k} (allowed: |I_j| <= k)")
        for s, d in zip(idx, step):
            for v in (s, s + d * (c - 1)):
                if not 1 <= v <= n:
                    raise ThresholdError(f"{where}: index {v} out of range; indices must lie in [1, n] = [1, {n}]")
        for a in range(len(idx)):
            for b in range(a + 1, len(idx)):
                gap, rate = idx[b] - idx[a], step[a] - step[b]
                if (rate == 0 and gap == 0) or (rate != 0 and gap % rate == 0 and 0 <= gap // rate < c):
                    raise ThresholdError(f"{where}: index sets repeat an index (slots {a} and {b} meet)")
        t = -1
        if idx:
            if gg is None:
                raise ThresholdError(f"{where}: no g given (pass g=... or a g in the run)")
            key = (len(idx), _table_of(gg, len(idx), where))
            if key not in types:
                types.append(key)
            t = types.index(key)
        blocks.append(FeatureBlock(first, c, tuple(idx), tuple(step), t))
        first += c
    return FeatureRuns(n, int(k), blocks, types)


def features_of(n: int, features: Sequence[Any], g: Any, k: int | None) -> Features:
    """A builder's ``features`` argument validated: runs (every item an object, :func:`feature_runs`)
    or features listed one by one (:func:`normalize_features`)."""
    if isinstance(features, (list, tuple)) and features and all(isinstance(f, dict) for f in features):
        return feature_runs(n, features, g, k)
    if isinstance(features, (list, tuple)) and any(isinstance(f, dict) for f in features):
        raise ThresholdError("features: either every item is a run (an object) or none is")
    if isinstance(features, (list, tuple)) and len(features) > MAX_LISTED:
        raise ThresholdError(f"features: at most 2^22 features listed one by one (give runs for more), got {len(features)}")
    return FeatureTable(n, *normalize_features(n, features, g, k))


def disjointness_features(n: int) -> FeatureRuns:
    """DISJ's N/2 features NAND(x_i, x_{i+N/2}), i = 1 .. N/2: one run."""
    h = n // 2
    return FeatureRuns(n, 2, [FeatureBlock(1, h, (1, 1 + h), (1, 1), 0)], [(2, (1, 1, 1, 0))])


def stored_features(n: int, tp: dict[str, Any]) -> Features:
    """The features ``task_params`` records (:meth:`Features.task_params`; JSON lists after loading),
    checked to fit N: ThresholdError naming the task parameter otherwise (a corrupted run that
    reads past N is a failed report, never an IndexError)."""
    types = [(int(a), tuple(int(v) for v in t)) for a, t in tp["types"]]
    for i, (a, t) in enumerate(types):
        if a < 0 or len(t) != 1 << a or any(v not in (0, 1) for v in t):
            raise ThresholdError(f"task_params.types[{i}]: a 0/1 table of 2^{a} entries, got {len(t)} entries")
    k = int(tp["k"])
    if "feature_runs" in tp:
        blocks = [FeatureBlock(int(b["first"]), int(b["count"]), tuple(int(v) for v in b["index"]),
                               tuple(int(v) for v in b["step"]), int(b["type"])) for b in tp["feature_runs"]]
        first = 1
        for i, b in enumerate(blocks):
            last = [s + d * (b.count - 1) for s, d in zip(b.start, b.step)]
            if (b.first != first or b.count < 1 or len(b.start) != len(b.step) or len(b.start) > k
                    or any(d not in (0, 1) for d in b.step) or min(b.start, default=1) < 1 or max(last, default=1) > n
                    or not (b.type == -1 and not b.start or 0 <= b.type < len(types) and types[b.type][0] == len(b.start))):
                raise ThresholdError(f"task_params.feature_runs[{i}]: features {b.first} .. {b.first + b.count - 1} must "
                                     f"follow feature {first - 1} and read indices in [1, {n}] with a type of their arity "
                                     "(-1: an empty feature)")
            first += b.count
        if first - 1 > n:
            raise ThresholdError(f"task_params.feature_runs: {first - 1} features, at most N = {n}")
        return FeatureRuns(n, k, blocks, types)
    index = np.asarray(tp["feature_index"], dtype=np.int64).reshape(-1, k)
    ftype = np.asarray(tp["feature_type"], dtype=np.int64)
    if index.shape[0] != ftype.size or index.shape[0] > n or (index.size and (index.min() < 0 or index.max() > n)) \
            or (ftype.size and (ftype.min() < -1 or ftype.max() >= len(types))):
        raise ThresholdError(f"task_params.feature_index / feature_type: at most N = {n} features reading indices in "
                             f"[1, {n}] (0: an unused slot), each of a type in [-1, {len(types)})")
    return FeatureTable(n, index, ftype, types)


def _bits_of(ints: np.ndarray, n: int) -> np.ndarray:
    """[B] ints -> [B, n] bits, bit 0 of the input = most significant."""
    shifts = np.arange(n - 1, -1, -1, dtype=np.int64)
    return ((ints[:, None] >> shifts[None, :]) & 1).astype(np.int64)


class _BooleanTask(Task):
    """Inputs x [B, N] of N bits (values in {-1, 1} when ``pm1``, else {0, 1}); ``bos``: a BOS
    token (id 2) precedes the bits. Token ids: bit value v -> 0 (v = -1 or 0) / 1 (v = 1)."""

    pm1 = False
    bos = False

    def length(self, model: CompiledModel) -> int:
        return model.n + int(self.bos)

    def domains(self, model: CompiledModel) -> Domains:
        of = np.ones(self.length(model), dtype=np.int64)
        if self.bos:
            of[0] = 0
        return Domains([np.array([2]), np.array([0, 1])], of)

    def encode_arrays(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        n = model.n
        allowed = (-1, 1) if self.pm1 else (0, 1)
        if x.ndim != 2 or x.shape[1] != n:
            raise ThresholdError(f"inputs must have shape [B, {n}] (N = {n} values each), got {x.shape}")
        if x.size and not np.all(np.isin(x, allowed)):
            raise ThresholdError(f"input values must lie in {{{allowed[0]}, {allowed[1]}}}")
        tok = (x == 1).astype(np.int32)
        if self.bos:
            tok = np.concatenate([np.full((len(x), 1), 2, dtype=np.int32), tok], axis=1)
        return tok

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray]:
        rows = []
        allowed = (-1, 1) if self.pm1 else (0, 1)
        for e in examples:
            e = e[0] if isinstance(e, tuple) and len(e) == 1 else e
            if not isinstance(e, (list, tuple, np.ndarray)) or len(e) != model.n:
                raise ThresholdError(f"an input is a list of N = {model.n} values in {{{allowed[0]}, {allowed[1]}}}")
            if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v not in allowed for v in e):
                raise ThresholdError(f"input values must be the integers {allowed[0]} or {allowed[1]}")
            rows.append([int(v) for v in e])
        return (np.asarray(rows, dtype=np.int64).reshape(len(rows), model.n),)

    def batch(self, model: CompiledModel, x: np.ndarray) -> Batch:
        x = np.asarray(x, dtype=np.int64)
        return Batch((x,), self.encode_arrays(model, x), self.truth(model, x).astype(np.int64))

    def count(self, model: CompiledModel) -> int | PowerCount:
        return power_count(2, model.n)

    def domain_runs(self, model: CompiledModel) -> DomainRuns:
        """:meth:`domains` in O(1): BOS (token 2) at position 0 when ``bos``, the bits {0, 1} elsewhere."""
        if redefines(self, _BooleanTask, "domains"):
            return super().domain_runs(model)
        bits, T = Classes.run(0, 2), self.length(model)
        if self.bos:
            return DomainRuns(np.array([0, 1], np.int64), np.array([0, 1], np.int64), [Classes.run(2, 3), bits], T)
        return DomainRuns(np.array([0], np.int64), np.array([0], np.int64), [bits], T)

    def _from_bits(self, bits: np.ndarray) -> np.ndarray:
        return 2 * bits - 1 if self.pm1 else bits

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        """All 2^N inputs, in counting order."""
        n = model.n
        total = 1 << n
        for s in range(0, total, batch):
            ints = np.arange(s, min(total, s + batch), dtype=np.int64)
            yield self.batch(model, self._from_bits(_bits_of(ints, n)))

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for done in range(0, count, batch):
            yield self.batch(model, self._draw(model, rng, min(batch, count - done)))

    def _draw(self, model: CompiledModel, rng: np.random.Generator, b: int) -> np.ndarray:
        p = rng.random((b, 1))
        return self._from_bits((rng.random((b, model.n)) < p).astype(np.int64))

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """Rounds of adversarial inputs (see each task's ``_adversarial_round``), streamed: a round
        is a list of arrays or of iterables of arrays, consumed lazily, so single-bit flips of an
        N-bit input never form an N x N array."""
        rng = np.random.default_rng(seed)
        done = 0
        while done < count:
            produced = False
            for part in self._adversarial_round(model, rng):
                for arr in ([part] if isinstance(part, np.ndarray) else part):
                    for s in range(0, len(arr), batch):
                        if done >= count:
                            return
                        b = min(batch, count - done, len(arr) - s)
                        yield self.batch(model, arr[s : s + b])
                        done += b
                        produced = True
            if not produced:
                return

    def candidates(self, model: CompiledModel, hint: dict, count: int) -> Iterator[Batch]:
        if hint.get("counts"):
            x = self.with_count(model, np.asarray(hint["counts"][:16], dtype=np.int64), np.random.default_rng(5))
            if len(x):
                yield self.batch(model, x)
        yield from super().candidates(model, hint, count)

    def with_count(self, model: CompiledModel, targets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Inputs whose feature count equals one of ``targets`` (best effort)."""
        raise NotImplementedError

    def _adversarial_round(self, model, rng) -> list[np.ndarray]:
        raise NotImplementedError


def _single_flips(x: np.ndarray, pm1: bool, chunk: int = 256) -> Iterator[np.ndarray]:
    """[B, n] -> chunks of at most ``chunk`` rows, together every input with exactly one bit
    flipped (input-major order), generated lazily."""
    B, n = x.shape
    for i in range(B):
        for s in range(0, n, chunk):
            j = np.arange(s, min(n, s + chunk))
            out = np.repeat(x[i : i + 1], len(j), axis=0)
            rows = np.arange(len(j))
            out[rows, j] = -out[rows, j] if pm1 else 1 - out[rows, j]
            yield out


# ------------------------------------------------------------------------------------------------
# Equality / Inequality
# ------------------------------------------------------------------------------------------------


class EqualityTask(_BooleanTask):
    """EQ(x) = [x_{1..N/2} = x_{N/2+1..N}] (``complement``: INEQ = 1 - EQ), x in {-1, 1}^N."""

    pm1 = True
    ENCODING = {"inputs": [{"name": "x", "type": "N ints in {-1, 1}"}],
                "tokens": [{"for_each": "x", "token": "{:+d}"}]}

    def __init__(self, complement: bool = False):
        self.complement = complement

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        h = x.shape[1] // 2
        eq = np.all(x[:, :h] == x[:, h:], axis=1).astype(np.int64)
        return 1 - eq if self.complement else eq

    def spec(self, model: CompiledModel) -> CountThreshold:
        """[#{i <= N/2 : x_i != x_{i+N/2}} > 0], negated for EQ."""
        h = model.n // 2
        xor = np.array([[0, 1], [1, 0]], dtype=np.int64)
        pairs = np.stack([np.arange(h), np.arange(h) + h], axis=1)
        return CountThreshold(model.n - 1, [(pairs, xor)], 0, not self.complement, (0, 1))

    def spec_runs(self, model: CompiledModel) -> Counting:
        """:meth:`spec` in O(1): one run of features [x_i != x_{i+N/2}], i in [0, N/2)."""
        if redefines(self, EqualityTask, "spec"):
            return super().spec_runs(model)
        h = model.n // 2
        xor = np.array([[0, 1], [1, 0]], dtype=np.int64)
        return Counting(model.n - 1, (FeatureRun(0, h, (0, h), xor),), 0, not self.complement, (0, 1))

    def _draw(self, model, rng, b):
        n, h = model.n, model.n // 2
        x = rng.choice(np.array([-1, 1]), size=(b, n))
        copy = rng.random(b) < 0.5
        x[copy, h:] = x[copy, :h]
        flips = np.where(rng.random(b) < 0.5, 0, rng.integers(1, 4, size=b)) * copy
        for i in np.flatnonzero(flips):
            j = rng.choice(n, size=min(int(flips[i]), n), replace=False)
            x[i, j] *= -1
        return x

    def _adversarial_round(self, model, rng):
        """One input with equal halves, then all N single-bit flips of it."""
        n, h = model.n, model.n // 2
        base = rng.choice(np.array([-1, 1]), size=(1, n))
        base[:, h:] = base[:, :h]
        return [base, _single_flips(base, True)]

    def with_count(self, model: CompiledModel, targets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Inputs with exactly ``targets[r]`` mismatched pairs (with and without the last pair)."""
        n, h = model.n, model.n // 2
        rows = []
        for t in targets:
            t = int(min(max(t, 0), h))
            for last in (True, False):
                x = rng.choice(np.array([-1, 1]), size=n)
                x[h:] = x[:h]
                pairs = np.arange(h) if t == 0 else (
                    np.r_[h - 1, rng.permutation(h - 1)[: t - 1]] if last else rng.permutation(h)[:t])
                x[h + pairs[:t]] *= -1
                rows.append(x)
        return np.asarray(rows)


def threshold_spec(model: CompiledModel) -> tuple[Features, int]:
    """(features, b) of a threshold model, re-derived from the clause list for DNF / CNF and from N
    for Disjointness (so the spec does not depend on stored feature tables); read from
    ``task_params`` for general THRES (listed or as runs)."""
    tp = model.task_params
    kind, n = tp.get("kind", "threshold"), model.n
    if kind == "disjointness":
        return disjointness_features(n), n // 2 - 1
    if kind in ("dnf", "cnf"):
        feats, m = literal_features(n, tp["clauses"], kind, None)
        return FeatureTable(n, *normalize_features(n, feats, None, int(tp.get("k", 0)) or None)), (0 if kind == "dnf" else m - 1)
    return stored_features(n, tp), int(tp["b"])


def _arrays(features: Features) -> tuple[np.ndarray, np.ndarray, list]:
    return (*features.arrays(), features.types)


class ThresholdTask(_BooleanTask):
    """Th_b over k-sparse features, x in {0, 1}^N, a BOS token first. ``kind`` selects the ground
    truth: "threshold" (the stored definition), "disjointness", "dnf", "cnf" (their definitions)."""

    bos = True
    ENCODING = {"inputs": [{"name": "x", "type": "N ints in {0, 1}"}],
                "tokens": [{"token": "BOS"}, {"for_each": "x", "token": "{}"}]}

    def __init__(self, kind: str = "threshold"):
        if kind not in ("threshold", "disjointness", "dnf", "cnf"):
            raise ValueError(f"kind must be one of threshold, disjointness, dnf, cnf; got {kind!r}")
        self.kind = kind

    def _spec(self, model):
        return threshold_spec(model)

    def check_params(self, model: CompiledModel) -> None:
        """The stored features fit N (:func:`stored_features`)."""
        self._spec(model)

    def feature_counts(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        return feature_values(*_arrays(self._spec(model)[0]), x).sum(axis=1)

    def spec(self, model: CompiledModel) -> CountThreshold:
        """[sum_j g_j(x_{I_j}) > b]; input bit i (1-based) is token position i (BOS at 0)."""
        features, b = self._spec(model)
        idx, ft, types = _arrays(features)
        feats = [(idx[ft == tau, :r], np.asarray(table, dtype=np.int64).reshape((2,) * r))
                 for tau, (r, table) in enumerate(types)]
        return CountThreshold(model.n, feats, b, False, (0, 1))

    def spec_runs(self, model: CompiledModel) -> Counting:
        """:meth:`spec` as runs; Disjointness's in O(1): NAND(x_i, x_{i+N/2}) at positions (i, i + N/2),
        i in [1, N/2] (BOS at 0), b = N/2 - 1; a general threshold's features given as runs in
        O(runs) (:meth:`FeatureRuns.counting`)."""
        if redefines(self, ThresholdTask, "spec"):
            return super().spec_runs(model)
        if self.kind == "disjointness":
            h = model.n // 2
            nand = np.array([[1, 1], [1, 0]], dtype=np.int64)
            return Counting(model.n, (FeatureRun(1, h + 1, (0, h), nand),), h - 1, False, (0, 1))
        features, b = self._spec(model)
        runs = features.counting() if isinstance(features, FeatureRuns) else None
        if runs is not None:
            return Counting(model.n, runs, b, False, (0, 1))
        if features.m > MAX_LISTED:
            raise Declined("a run of features reads a fixed position (a slot of step 0) along more than 2^22 features")
        return super().spec_runs(model)

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        n = model.n
        if self.kind == "disjointness":
            h = n // 2
            return (~np.any((x[:, :h] == 1) & (x[:, h:] == 1), axis=1)).astype(np.int64)
        if self.kind in ("dnf", "cnf"):
            out = np.zeros(len(x), dtype=bool) if self.kind == "dnf" else np.ones(len(x), dtype=bool)
            for c in model.task_params["clauses"]:
                lits = np.asarray(c, dtype=np.int64)
                vals = np.where(lits[None, :] > 0, x[:, np.abs(lits) - 1] == 1, x[:, np.abs(lits) - 1] == 0)
                if self.kind == "dnf":
                    out |= np.all(vals, axis=1)
                else:
                    out &= np.any(vals, axis=1)
            return out.astype(np.int64)
        b = self._spec(model)[1]
        return (self.feature_counts(model, x) > b).astype(np.int64)

    def with_count(self, model: CompiledModel, targets: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        x, found = self.search_count(model, targets, rng)
        return x[found]

    def search_count(self, model: CompiledModel, targets: np.ndarray, rng: np.random.Generator,
                     rounds: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """Seeded search for inputs whose feature count S equals ``targets`` [R].

        1. Bisection along a random path: draw u and v (random densities) and a random order of the
           bits; x(t) takes v's first t bits (in that order) and u's others. When S(u) and S(v) lie
           on both sides of the target, bisection on t finds adjacent t, t + 1 whose counts straddle
           it, so S(x(t)) is within one bit's degree (features per bit) of the target.
        2. Finish by best single flips (exact deltas from the bit -> features incidence), with a
           random flip when no flip improves.
        Returns (x [R, N], found [R] bool). Best effort: exact counts can be NP-hard to reach (e.g.
        all clauses of a CNF true), so callers use what is found."""
        idx, ft, types = _arrays(self._spec(model)[0])
        n = model.n
        targets = np.asarray(targets, dtype=np.int64)
        R = len(targets)
        S_of = lambda x: feature_values(idx, ft, types, x).sum(axis=1)  # noqa: E731
        best = (rng.random((R, n)) < 0.5).astype(np.int64)
        found = np.zeros(R, dtype=bool)
        for _ in range(rounds):
            todo = np.flatnonzero(~found)
            if not todo.size:
                break
            r = len(todo)
            u = (rng.random((r, n)) < rng.random((r, 1))).astype(np.int64)
            v = (rng.random((r, n)) < rng.random((r, 1))).astype(np.int64)
            if rng.random() < 0.5:
                u[: r // 2], v[: r // 2] = 0, 1  # the extreme path all-0 -> all-1 for half of the rows
            rank = np.argsort(rng.random((r, n)), axis=1).argsort(axis=1)
            tgt = targets[todo]
            lo, hi = np.zeros(r, dtype=np.int64), np.full(r, n, dtype=np.int64)
            s_lo, s_hi = S_of(u) - tgt, S_of(v) - tgt
            ok = np.sign(s_lo) * np.sign(s_hi) <= 0
            while np.any(ok & (hi - lo > 1)):
                mid = (lo + hi) // 2
                s_mid = S_of(np.where(rank < mid[:, None], v, u)) - tgt
                go_hi = np.sign(s_mid) * np.sign(s_lo) > 0  # same side as lo: move lo up
                act = ok & (hi - lo > 1)
                lo = np.where(act & go_hi, mid, lo)
                s_lo = np.where(act & go_hi, s_mid, s_lo)
                hi = np.where(act & ~go_hi, mid, hi)
                s_hi = np.where(act & ~go_hi, s_mid, s_hi)
            t = np.where(np.abs(s_lo) <= np.abs(s_hi), lo, hi)
            x = np.where(rank < t[:, None], v, u)
            x = self._finish(model, x, tgt, rng)
            hit = S_of(x) == tgt
            best[todo[hit]] = x[hit]
            found[todo[hit]] = True
        return best, found

    def _finish(self, model, x, targets, rng, steps: int = 24) -> np.ndarray:
        """Best single flips toward the targets (exact deltas via the incidence of bits in features)."""
        idx, ft, types = _arrays(self._spec(model)[0])
        n, m = model.n, len(ft)
        if not m:
            return x
        # incidence: features containing each bit, padded with -1
        rows_f = np.repeat(np.arange(m), idx.shape[1])
        vars_ = idx.reshape(-1) - 1
        keep = vars_ >= 0
        rows_f, vars_ = rows_f[keep], vars_[keep]
        order = np.argsort(vars_, kind="stable")
        rows_f, vars_ = rows_f[order], vars_[order]
        deg = np.bincount(vars_, minlength=n)
        D = max(1, int(deg.max()) if deg.size else 1)
        inc = np.full((n, D), -1, dtype=np.int64)
        slot = np.arange(len(vars_)) - np.repeat(np.cumsum(deg) - deg, deg)
        inc[vars_, slot] = rows_f
        x = x.copy()
        for i in range(len(x)):
            for _ in range(steps):
                g = feature_values(idx, ft, types, x[i : i + 1])[0]
                S = int(g.sum())
                if S == targets[i]:
                    break
                # value of every incident feature with bit j flipped: bit c of the input with bit
                # r flipped is x[c] ^ (r == c) (no N x N array of flipped inputs)
                xi = x[i]
                f_ids = inc.reshape(-1)
                valid = f_ids >= 0
                new_vals = np.zeros(n * D, dtype=np.int64)
                rows = np.repeat(np.arange(n), D)[valid]
                sub_idx, sub_ft = idx[f_ids[valid]], ft[f_ids[valid]]
                for tau, (ar, table) in enumerate(types):
                    sel = sub_ft == tau
                    if not np.any(sel):
                        continue
                    code = np.zeros(int(sel.sum()), dtype=np.int64)
                    for h in range(ar):
                        col = sub_idx[sel, h] - 1
                        code = code * 2 + (xi[col] ^ (rows[sel] == col))
                    tmp = np.zeros(int(valid.sum()), dtype=np.int64)
                    tmp[sel] = np.asarray(table, dtype=np.int64)[code]
                    new_vals[np.flatnonzero(valid)[sel]] = tmp[sel]
                old_vals = np.where(valid, g[np.maximum(f_ids, 0)], 0)
                delta = (new_vals - old_vals).reshape(n, D).sum(axis=1)
                dist = np.abs(S + delta - targets[i])
                cand = np.flatnonzero(dist == dist.min())
                if dist.min() >= abs(S - targets[i]):
                    cand = np.arange(n)  # stuck: random flip
                x[i, int(rng.choice(cand))] ^= 1
        return x

    def _adversarial_round(self, model, rng):
        """Inputs with exactly b and b + 1 true features and all their single-bit flips."""
        features, b = self._spec(model)
        m = features.m
        targets = np.array([t for t in (b, b + 1) if 0 <= t <= m] * 2, dtype=np.int64)
        x = self.with_count(model, targets, rng)
        if not len(x):  # nothing reachable: fall back to random inputs so the source never stalls
            return [self._draw(model, rng, 8)]
        return [x, _single_flips(x, False)]


def parse_clauses(text: str, name: str = "clauses") -> list[list[int]]:
    """'1,-2;3,4' -> [[1, -2], [3, 4]] (the CLI's --clauses / --terms; ``name`` is named in errors)."""
    form = f"{name} must look like '1,-2;3,4' (literals +v / -v separated by ',', {name} separated by ';')"
    if not isinstance(text, str) or not text.strip():
        raise ThresholdError(form)
    try:
        out = [[int(v) for v in part.split(",")] for part in text.split(";")]
    except ValueError:
        raise ThresholdError(f"{form}, got {text!r}") from None
    return out
