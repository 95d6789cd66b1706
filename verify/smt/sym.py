"""Symbolic values of the SMT encoding: one scalar of the forward pass as a function of the input.

A value is a :class:`Tab` -- an exact table (integers or booleans) over the domains of a few input
positions; a constant when it reads none -- or a :class:`Term`, a z3 bit-vector (or boolean)
expression with exact bounds ``lo <= value <= hi`` and, where few, its possible values ``vals``.
Every operation keeps its result a table while the table stays at most :data:`TAB_MAX` entries and
falls back to a term otherwise: whatever the input does not reach is computed here in Python,
exactly, and only the rest goes to the solver.

The input is held by an :class:`Enc`: the token ids allowed at each position (the task's domains),
the positions fixed by the current case (a case split sets a position's token), the z3 variable of
every free position (the index of its token in the position's domain) and the side constraints of
fresh variables (a row's maximum). Integer arithmetic is Python's / numpy's on exact integers; z3
terms are bit-vectors whose widths are chosen from the bounds, so that no term ever wraps.

Rounding (:func:`rnd`) is the format's: floor, or nearest with ties to even (docs/precision.md); it
is written here from that definition, sharing no code with the executor.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Sequence

import numpy as np
import z3

TAB_MAX = 1 << 12  # entries of the largest table kept in Python; larger functions of the input become terms
VALS_MAX = 256  # a term's possible values are tracked while there are at most this many
BIG = 1 << 62  # numpy int64 products and sums are used while magnitudes stay below this
LOOKUP_MAX = 1 << 16  # values of the largest table a term is looked up in (the exp over a window)


class NotCovered(ValueError):
    """The smt mode cannot encode this model, format or task (the message says why)."""


# ------------------------------------------------------------------------------------------------
# exact integer helpers
# ------------------------------------------------------------------------------------------------


def width(lo: int, hi: int) -> int:
    """Bits of the narrowest two's complement integer holding every value in [lo, hi]."""
    def bits(v: int) -> int:
        return (v if v >= 0 else -v - 1).bit_length() + 1
    return max(bits(int(lo)), bits(int(hi)), 2)


def rnd_int(p: int, s: int, nearest: bool) -> int:
    """p / s rounded (floor, or nearest with ties to even), s > 0."""
    q, r = divmod(int(p), s)
    if nearest and (2 * r > s or (2 * r == s and q % 2 == 1)):
        q += 1
    return q


def rnd_arr(p: np.ndarray, s: int, nearest: bool) -> np.ndarray:
    """Elementwise :func:`rnd_int` of an integer (int64 or object) array."""
    q, r = np.divmod(p, s)
    if nearest:
        q = q + ((2 * r > s) | ((2 * r == s) & (q % 2 == 1))).astype(np.int64)
    return q


def _magnitude(a: np.ndarray) -> int:
    return int(np.max(np.abs(a))) if a.size else 0


def wide(a: np.ndarray, bound: int) -> np.ndarray:
    """``a`` as Python ints (object) when results up to ``bound`` in magnitude could leave int64."""
    a = np.asarray(a)
    if a.dtype == object or bound < BIG:
        return a
    return a.astype(object)


def as_int(a: np.ndarray) -> np.ndarray:
    """An object array of small integers back to int64 (kept object when any value is large)."""
    a = np.asarray(a)
    if a.dtype != object:
        return a
    if a.size == 0 or _magnitude(a) < BIG:
        return a.astype(np.int64)
    return a


def prune(deps: tuple[int, ...], arr: np.ndarray) -> tuple[tuple[int, ...], np.ndarray]:
    """Drop the positions a table does not depend on (axes along which it is constant; the axes
    after the positions' are kept)."""
    keep = []
    for ax in range(len(deps)):
        if arr.shape[ax] > 1 and not np.all(arr == arr.take([0], axis=ax)):
            keep.append(ax)
    if len(keep) == len(deps):
        return deps, arr
    idx = tuple(slice(None) if ax in keep else 0 for ax in range(len(deps)))
    return tuple(deps[ax] for ax in keep), arr[idx]


# ------------------------------------------------------------------------------------------------
# the input and the values
# ------------------------------------------------------------------------------------------------

_VARS: dict[tuple[str, int], z3.BitVecRef] = {}


def variable(name: str, bits: int) -> z3.BitVecRef:
    key = (name, bits)
    v = _VARS.get(key)
    if v is None:
        v = _VARS[key] = z3.BitVec(name, bits)
    return v


class Tab:
    """An exact table over the domains of positions ``deps`` (sorted; the free positions the value
    reads): ``arr`` has one axis per position, of that position's domain size. ``deps == ()``: a
    constant (``arr`` 0-d). Integer tables are int64 (object where values are wide), boolean ones bool."""

    __slots__ = ("deps", "arr", "_lo", "_hi")

    def __init__(self, deps: tuple[int, ...], arr: np.ndarray):
        self.deps, self.arr = deps, arr
        self._lo = self._hi = None

    @property
    def is_bool(self) -> bool:
        return self.arr.dtype == bool

    @property
    def lo(self) -> int:
        if self._lo is None:
            self._lo = int(np.min(self.arr))
        return self._lo

    @property
    def hi(self) -> int:
        if self._hi is None:
            self._hi = int(np.max(self.arr))
        return self._hi

    @property
    def const(self) -> bool:
        return not self.deps

    def value(self) -> int | bool:
        """The constant's value."""
        v = self.arr[()]
        return bool(v) if self.is_bool else int(v)

    def vals(self) -> np.ndarray:
        return np.unique(self.arr)


class Term:
    """A z3 expression (bit-vector of width >= :func:`width` (lo, hi), or boolean) with exact bounds
    and, where at most :data:`VALS_MAX`, the sorted tuple of its possible values (a superset)."""

    __slots__ = ("expr", "lo", "hi", "vals_")

    def __init__(self, expr, lo: int, hi: int, vals: tuple[int, ...] | None = None):
        self.expr, self.lo, self.hi = expr, int(lo), int(hi)
        self.vals_ = vals if vals is None or len(vals) <= VALS_MAX else None

    @property
    def is_bool(self) -> bool:
        return z3.is_bool(self.expr)

    @property
    def const(self) -> bool:
        return False

    def vals(self) -> np.ndarray | None:
        return None if self.vals_ is None else np.asarray(self.vals_, dtype=object if max(
            abs(self.lo), abs(self.hi)) >= BIG else np.int64)


Sym = Tab | Term


def const(v: int | bool) -> Tab:
    if isinstance(v, (bool, np.bool_)):
        return Tab((), np.array(bool(v)))
    v = int(v)
    return Tab((), np.array(v, dtype=object if abs(v) >= BIG else np.int64))


ZERO = const(0)


def is_zero(s: Sym) -> bool:
    return isinstance(s, Tab) and s.const and not s.is_bool and s.value() == 0


class Enc:
    """The input of one case: token ids allowed per position (``domains``), positions fixed to one of
    them (``fixed``: position -> index in its domain), the solver variables of the others, and the
    side constraints of fresh variables."""

    def __init__(self, domains: Sequence[np.ndarray], fixed: dict[int, int] | None = None, tab_max: int = TAB_MAX,
                 vectors: dict[int, tuple[int, int, int]] | None = None, fixed_vectors: dict[int, np.ndarray] | None = None):
        self.domains = [np.asarray(d, dtype=np.int64) for d in domains]
        self.fixed = dict(fixed or {})
        self.tab_max = tab_max
        self.vectors = dict(vectors or {})  # position -> (width, least, largest raw value) of its input vector
        self.fixed_vectors = dict(fixed_vectors or {})
        self.side: list[z3.BoolRef] = []
        self._exprs: dict[tuple, z3.ExprRef] = {}
        self._fresh = itertools.count()

    # ---- positions --------------------------------------------------------------------------
    def free(self, p: int) -> bool:
        return p not in self.fixed and self.domains[p].size > 1

    def size(self, p: int) -> int:
        return self.domains[p].size if self.free(p) else 1

    def var(self, p: int) -> z3.BitVecRef:
        """The index of position p's token in its domain."""
        return variable(f"x{p}", max(1, (self.domains[p].size - 1).bit_length()))

    def token(self, p: int) -> Tab:
        """The token id at position p."""
        d = self.domains[p]
        if not self.free(p):
            return const(int(d[self.fixed.get(p, 0)]))
        return Tab((p,), d)

    def vector(self, p: int) -> list[Sym]:
        """The input vector at position p (raw values of the format): constants where the case fixes
        it, else one variable per entry."""
        width, lo, hi = self.vectors[p]
        if p in self.fixed_vectors:
            return [const(int(v)) for v in self.fixed_vectors[p]]
        return [Term(self.vector_var(p, c), lo, hi) for c in range(width)]

    def vector_var(self, p: int, c: int) -> z3.BitVecRef:
        _, lo, hi = self.vectors[p]
        return variable(f"v{p}_{c}", width(lo, hi))

    def constraints(self) -> list[z3.BoolRef]:
        """Every free position's index lies in its domain, every vector entry in its range; the side
        constraints."""
        out = []
        for p in range(len(self.domains)):
            n = self.domains[p].size
            if self.free(p) and n & (n - 1):
                out.append(z3.ULE(self.var(p), n - 1))
        for p, (w, lo, hi) in self.vectors.items():
            if p not in self.fixed_vectors:
                out += [z3.And(self.vector_var(p, c) >= lo, self.vector_var(p, c) <= hi) for c in range(w)]
        return out + self.side

    def fresh(self, prefix: str, bits: int) -> z3.BitVecRef:
        return z3.BitVec(f"{prefix}{next(self._fresh)}", bits)

    def cells(self, deps: tuple[int, ...]) -> int:
        return int(np.prod([self.size(p) for p in deps], dtype=object)) if deps else 1

    # ---- tables ---------------------------------------------------------------------------------
    def align(self, tabs: Sequence[Tab]) -> tuple[tuple[int, ...], list[np.ndarray]]:
        """The union of the tables' positions and each table's array shaped to broadcast over it."""
        deps = tuple(sorted(set().union(*[t.deps for t in tabs])))
        out = []
        for t in tabs:
            if t.deps == deps:
                out.append(t.arr)
                continue
            shape = tuple(self.size(p) if p in t.deps else 1 for p in deps)
            out.append(t.arr.reshape(shape + t.arr.shape[len(t.deps):]))
        return deps, out

    def union_cells(self, syms: Iterable[Sym]) -> int:
        deps = set()
        for s in syms:
            if isinstance(s, Term):
                return self.tab_max + 1
            deps |= set(s.deps)
        return self.cells(tuple(deps))

    # ---- to z3 ----------------------------------------------------------------------------------
    def expr(self, s: Sym, w: int | None = None):
        """s as a z3 expression: booleans as Bool, integers as a bit-vector of width ``w`` (default:
        the narrowest holding s's bounds; wider by sign extension)."""
        if s.is_bool:
            return s.expr if isinstance(s, Term) else self.tab_expr(s.deps, s.arr, None)
        need = width(s.lo, s.hi)
        w = need if w is None else w
        if w < need:
            raise ValueError(f"width {w} < {need} for bounds [{s.lo}, {s.hi}]")
        if isinstance(s, Tab):
            return self.tab_expr(s.deps, s.arr, w)
        have = s.expr.size()
        return z3.SignExt(w - have, s.expr) if w > have else _narrow(s.expr, have, w)

    def tab_expr(self, deps: tuple[int, ...], arr: np.ndarray, w: int | None,
                 leaf: Callable[[object], z3.ExprRef] | None = None):
        """A nested if-then-else over the positions' indices with the table's entries as leaves
        (``leaf(value)`` when given, else the constant; equal sub-tables share one branch)."""
        key = (deps, arr.dtype.str, arr.shape, arr.tobytes() if arr.dtype != object else tuple(arr.reshape(-1).tolist()),
               w, None if leaf is None else id(leaf))
        got = self._exprs.get(key) if leaf is None else None
        if got is not None:
            return got
        if not deps:
            v = arr[()]
            e = leaf(v) if leaf is not None else (z3.BoolVal(bool(v)) if w is None else z3.BitVecVal(int(v), w))
        else:
            var = self.var(deps[0])
            groups: dict[bytes | tuple, list[int]] = {}
            for k in range(arr.shape[0]):
                a = arr[k]
                groups.setdefault(a.tobytes() if a.dtype != object else tuple(a.reshape(-1).tolist()), []).append(k)
            order = sorted(groups.values(), key=len)
            e = self.tab_expr(deps[1:], arr[order[-1][0]], w, leaf)
            for ks in order[:-1]:
                cond = z3.Or([var == k for k in ks]) if len(ks) > 1 else var == ks[0]
                e = z3.If(cond, self.tab_expr(deps[1:], arr[ks[0]], w, leaf), e)
        if leaf is None:
            self._exprs[key] = e
        return e


# ------------------------------------------------------------------------------------------------
# operations
# ------------------------------------------------------------------------------------------------


def _vals_of(s: Sym) -> np.ndarray | None:
    v = s.vals()
    return v if v is not None and v.size <= VALS_MAX else None


def apply(enc: Enc, syms: Sequence[Sym], np_fn: Callable, z3_fn: Callable, bounds: Callable | None,
          vals_fn: Callable | None = None) -> Sym:
    """The elementwise function of ``syms``: a table (``np_fn`` of the aligned arrays) while their
    positions' joint table stays small, else a term: ``z3_fn(exprs, w)`` of the operands at a common
    width ``w`` with result bounds ``bounds(los, his)`` (None: boolean), and possible values
    ``vals_fn(vals lists)`` where the operands' are known."""
    if all(isinstance(s, Tab) for s in syms) and enc.union_cells(syms) <= enc.tab_max:
        deps, arrs = enc.align(syms)
        out = np.asarray(np_fn(*arrs))
        return Tab(*prune(deps, np.broadcast_to(out, tuple(enc.size(p) for p in deps))))
    if bounds is None:
        ints = [s for s in syms if not s.is_bool]
        w = max([width(s.lo, s.hi) for s in ints], default=2) + 1
        return Term(z3_fn([enc.expr(s, None if s.is_bool else w) for s in syms], w), 0, 1)
    lo, hi = bounds([s.lo for s in syms], [s.hi for s in syms])
    w = max([width(lo, hi)] + [width(s.lo, s.hi) for s in syms if not s.is_bool])
    vals = None
    if vals_fn is not None:
        vs = [_vals_of(s) for s in syms]
        if all(v is not None for v in vs) and int(np.prod([v.size for v in vs])) <= VALS_MAX * 16:
            vals = tuple(sorted({int(x) for x in np.asarray(vals_fn(*np.meshgrid(*vs, indexing="ij"))).reshape(-1)}))
    return Term(z3_fn([enc.expr(s, None if s.is_bool else w) for s in syms], w), lo, hi, vals)


def add(enc: Enc, a: Sym, b: Sym) -> Sym:
    return apply(enc, (a, b), lambda x, y: as_int(wide(x, 1 << 63) + y), lambda e, w: e[0] + e[1],
                 lambda lo, hi: (lo[0] + lo[1], hi[0] + hi[1]), lambda x, y: x + y)


def sub(enc: Enc, a: Sym, b: Sym) -> Sym:
    return apply(enc, (a, b), lambda x, y: as_int(wide(x, 1 << 63) - y), lambda e, w: e[0] - e[1],
                 lambda lo, hi: (lo[0] - hi[1], hi[0] - lo[1]), lambda x, y: x - y)


def clip(enc: Enc, s: Sym, lo: int, hi: int) -> Sym:
    """min(max(s, lo), hi) (the format's saturation when lo, hi are its range)."""
    if s.lo >= lo and s.hi <= hi:
        return s
    if isinstance(s, Tab):
        return Tab(s.deps, np.clip(s.arr, lo, hi) if s.arr.dtype != object else
                   np.minimum(np.maximum(s.arr, lo), hi))
    w = width(min(s.lo, lo), max(s.hi, hi))
    e = enc.expr(s, w)
    if s.lo < lo:
        e = z3.If(e < lo, z3.BitVecVal(lo, w), e)
    if s.hi > hi:
        e = z3.If(e > hi, z3.BitVecVal(hi, w), e)
    nlo, nhi = max(min(s.lo, hi), lo), min(max(s.hi, lo), hi)
    vals = None if s.vals_ is None else tuple(sorted({min(max(v, lo), hi) for v in s.vals_}))
    return Term(_narrow(e, w, width(nlo, nhi)), nlo, nhi, vals)


def _narrow(e, have: int, want: int):
    """A bit-vector known to fit ``want`` bits, cut to them."""
    return z3.Extract(want - 1, 0, e) if want < have else e


def mul_const(enc: Enc, s: Sym, c: int) -> Sym:
    """s * c exactly."""
    c = int(c)
    if c == 0:
        return ZERO
    if c == 1:
        return s
    if isinstance(s, Tab):
        return Tab(s.deps, as_int(wide(s.arr, _magnitude(s.arr) * abs(c)) * c))
    lo, hi = sorted((s.lo * c, s.hi * c))
    w = max(width(lo, hi), width(s.lo, s.hi), width(c, c))
    vals = None if s.vals_ is None else tuple(sorted(v * c for v in s.vals_))
    return Term(enc.expr(s, w) * z3.BitVecVal(c, w), lo, hi, vals)


def rnd(enc: Enc, s: Sym, S: int, nearest: bool) -> Sym:
    """s / S rounded (floor, or nearest with ties to even), exactly."""
    if S == 1:
        return s
    if isinstance(s, Tab):
        return Tab(s.deps, as_int(rnd_arr(s.arr, S, nearest)))
    lo, hi = rnd_int(s.lo, S, nearest), rnd_int(s.hi, S, nearest)
    w = max(width(s.lo, s.hi), width(S, S))
    p = enc.expr(s, w)
    k = S.bit_length() - 1
    if S == 1 << k:
        q = p >> k  # arithmetic shift: floor
        r = z3.ZeroExt(w - k, z3.Extract(k - 1, 0, p))
    else:
        r = p % z3.BitVecVal(S, w)  # bvsmod: in [0, S), the sign follows the divisor
        q = (p - r) / z3.BitVecVal(S, w)  # exact signed division
    if nearest:  # 2r < 2S fits w + 1 bits
        r2, half = z3.ZeroExt(1, r) * 2, z3.BitVecVal(S, w + 1)
        up = z3.Or(z3.UGT(r2, half), z3.And(r2 == half, z3.Extract(0, 0, q) == 1))
        q = q + z3.If(up, z3.BitVecVal(1, w), z3.BitVecVal(0, w))
    vals = None if s.vals_ is None else tuple(sorted({rnd_int(v, S, nearest) for v in s.vals_}))
    return Term(_narrow(q, w, width(lo, hi)), lo, hi, vals)


def prod_rnd(enc: Enc, a: Sym, b: Sym, S: int, nearest: bool) -> Sym:
    """a * b / S rounded: the format's rounded product of two raw values."""
    if is_zero(a) or is_zero(b):
        return ZERO
    if isinstance(a, Tab) and isinstance(b, Tab) and enc.union_cells((a, b)) <= enc.tab_max:
        deps, (x, y) = enc.align((a, b))
        x = wide(x, max(abs(a.lo), abs(a.hi)) * max(abs(b.lo), abs(b.hi)))
        return Tab(deps, as_int(rnd_arr(x * y, S, nearest)))
    for x, y in ((a, b), (b, a)):
        if isinstance(y, Tab) and y.const:
            return rnd(enc, mul_const(enc, x, y.value()), S, nearest)
    # a table (or a term with few values) times anything: one branch per value
    for x, y in ((a, b), (b, a)):
        if isinstance(y, Tab) and (isinstance(x, Term) or y.vals().size <= 16):
            return _by_values(enc, y, lambda c: rnd(enc, mul_const(enc, x, c), S, nearest))
    for x, y in ((a, b), (b, a)):
        if isinstance(y, Term) and y.vals_ is not None and len(y.vals_) <= 16:
            return _by_term_values(enc, y, lambda c: rnd(enc, mul_const(enc, x, c), S, nearest))
    lo = min(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
    hi = max(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi)
    w = max(width(lo, hi), width(a.lo, a.hi), width(b.lo, b.hi))
    return rnd(enc, Term(enc.expr(a, w) * enc.expr(b, w), lo, hi), S, nearest)


def _by_values(enc: Enc, y: Tab, f: Callable[[int], Sym]) -> Sym:
    """f(y) for a table y: f at each of y's values, selected by y's positions."""
    outs = {int(c): f(int(c)) for c in y.vals()}
    if all(isinstance(o, Tab) and o.const for o in outs.values()):
        lut = {c: o.value() for c, o in outs.items()}
        return Tab(y.deps, as_int(np.vectorize(lut.__getitem__, otypes=[object])(y.arr)))
    lo, hi = min(o.lo for o in outs.values()), max(o.hi for o in outs.values())
    w = width(lo, hi)
    cache = {c: enc.expr(o, w) for c, o in outs.items()}
    e = enc.tab_expr(y.deps, y.arr, w, leaf=lambda v: cache[int(v)])
    return Term(e, lo, hi, _union_vals(outs.values()))


def _by_term_values(enc: Enc, y: Term, f: Callable[[int], Sym]) -> Sym:
    """f(y) for a term y with few possible values: an if-then-else over them."""
    outs = [(c, f(c)) for c in y.vals_]
    lo, hi = min(o.lo for _, o in outs), max(o.hi for _, o in outs)
    w = width(lo, hi)
    wy = width(y.lo, y.hi)
    ye = enc.expr(y, wy)
    e = enc.expr(outs[-1][1], w)
    for c, o in outs[:-1]:
        e = z3.If(ye == c, enc.expr(o, w), e)
    return Term(e, lo, hi, _union_vals(o for _, o in outs))


def _union_vals(syms: Iterable[Sym]) -> tuple[int, ...] | None:
    out: set[int] = set()
    for s in syms:
        v = s.vals()
        if v is None:
            return None
        out |= {int(x) for x in v}
        if len(out) > VALS_MAX:
            return None
    return tuple(sorted(out))


def lookup(enc: Enc, table: Callable[[np.ndarray], np.ndarray], s: Sym, window: tuple[int, int] | None = None) -> Sym:
    """table(s) for a function ``table`` defined on integer arrays: a table where s is one, else a
    term selecting among ``table`` at s's possible values -- or, where those are unknown, over the
    values in ``window`` = (lo, hi), outside of which ``table`` is constant (runs of equal values
    become comparisons)."""
    if isinstance(s, Tab):
        u, inv = np.unique(s.arr, return_inverse=True)
        return Tab(s.deps, as_int(np.asarray(table(u), dtype=object)[inv.reshape(s.arr.shape)]))
    vals = s.vals()
    if vals is not None:
        out = np.asarray(table(vals), dtype=object)
        return _by_term_values(enc, s, lambda c: const(int(out[int(np.searchsorted(vals, c))])))
    lo, hi = window if window is not None else (s.lo, s.hi)
    lo, hi = max(lo, s.lo), min(hi, s.hi)
    if lo > hi:  # every value of s lies outside the window, on one side: one constant
        return const(int(table(np.array([s.lo], dtype=np.int64))[0]))
    if hi - lo >= LOOKUP_MAX:
        raise NotCovered(f"smt: a table of {hi - lo + 1} values (the exp of a softmax whose logits take too many "
                         f"values to track) exceeds {LOOKUP_MAX}")
    xs = np.arange(lo, hi + 1, dtype=np.int64)
    ys = [int(v) for v in table(xs)]
    below = int(table(np.array([s.lo], dtype=np.int64))[0]) if s.lo < lo else ys[0]
    above = int(table(np.array([s.hi], dtype=np.int64))[0]) if s.hi > hi else ys[-1]
    se = enc.expr(s, width(s.lo, s.hi))
    values = ys + [below, above]
    wo = width(min(values), max(values))
    runs = [(int(xs[0]), ys[0])] + [(int(xs[i]), ys[i]) for i in range(1, len(ys)) if ys[i] != ys[i - 1]]
    e = z3.BitVecVal(runs[0][1], wo)
    for start, value in runs[1:]:  # the highest run whose start s reaches wins
        e = z3.If(se >= start, z3.BitVecVal(value, wo), e)
    if s.hi > hi:
        e = z3.If(se > hi, z3.BitVecVal(above, wo), e)
    if s.lo < lo:
        e = z3.If(se < lo, z3.BitVecVal(below, wo), e)
    return Term(e, min(values), max(values), tuple(sorted(set(values))))


def lookup_n(enc: Enc, fn: Callable[..., np.ndarray], syms: Sequence[Sym]) -> Sym:
    """fn(*syms) for an elementwise integer function ``fn`` of several values: a table where their
    joint table is small, else a branch per possible value of the first value that is not a
    constant (its table's values, or a term's tracked ones)."""
    if all(isinstance(s, Tab) for s in syms) and enc.union_cells(syms) <= enc.tab_max:
        return apply(enc, syms, lambda *a: as_int(np.asarray(fn(*a))), None, None)
    for i, s in enumerate(syms):
        if isinstance(s, Tab) and s.const:
            continue
        rest = list(syms)

        def fix(c: int, i: int = i) -> Sym:
            rest[i] = const(c)
            return lookup_n(enc, fn, list(rest))
        if isinstance(s, Tab):
            return _by_values(enc, s, fix)
        if s.vals_ is None:
            raise ValueError("lookup_n: a term with unknown values")
        return _by_term_values(enc, s, fix)
    return const(int(np.asarray(fn(*[s.arr for s in syms]))))


# ---- booleans ----------------------------------------------------------------------------------


def cmp(enc: Enc, op: str, a: Sym, b: Sym) -> Sym:
    """a op b for op in ==, !=, <, <=, >, >= (signed integers), a boolean."""
    np_ops = {"==": np.equal, "!=": np.not_equal, "<": np.less, "<=": np.less_equal, ">": np.greater,
              ">=": np.greater_equal}
    z3_ops = {"==": lambda x, y: x == y, "!=": lambda x, y: x != y, "<": lambda x, y: x < y,
              "<=": lambda x, y: x <= y, ">": lambda x, y: x > y, ">=": lambda x, y: x >= y}
    return apply(enc, (a, b), np_ops[op], lambda e, w: z3_ops[op](e[0], e[1]), None)


def all_of(enc: Enc, syms: Sequence[Sym]) -> Sym:
    """The conjunction (True for none)."""
    return _fold(enc, syms, True)


def any_of(enc: Enc, syms: Sequence[Sym]) -> Sym:
    """The disjunction (False for none)."""
    return _fold(enc, syms, False)


def _fold(enc: Enc, syms: Sequence[Sym], unit: bool) -> Sym:
    tabs = [s for s in syms if isinstance(s, Tab)]
    consts = [s.value() for s in tabs if s.const]
    if any(c != unit for c in consts):
        return const(not unit)
    rest = [s for s in syms if not (isinstance(s, Tab) and s.const)]
    if not rest:
        return const(unit)
    op = np.logical_and if unit else np.logical_or
    # fold tables together while they stay small; the rest are joined in z3
    merged: list[Sym] = []
    for s in rest:
        for i, m in enumerate(merged):
            if isinstance(m, Tab) and isinstance(s, Tab) and enc.union_cells((m, s)) <= enc.tab_max:
                merged[i] = apply(enc, (m, s), op, None, None)
                break
        else:
            merged.append(s)
    if len(merged) == 1:
        return merged[0]
    es = [enc.expr(s) for s in merged]
    return Term(z3.And(es) if unit else z3.Or(es), 0, 1)


def not_(enc: Enc, s: Sym) -> Sym:
    if isinstance(s, Tab):
        return Tab(s.deps, ~s.arr)
    return Term(z3.Not(s.expr), 0, 1)


def ite(enc: Enc, c: Sym, a: Sym, b: Sym) -> Sym:
    """a where c else b (integers, or booleans)."""
    if isinstance(c, Tab) and c.const:
        return a if c.value() else b
    if a.is_bool:
        return apply(enc, (c, a, b), np.where, lambda e, w: z3.If(e[0], e[1], e[2]), None)
    return apply(enc, (c, a, b), lambda x, y, z: as_int(np.where(x, y, z)), lambda e, w: z3.If(e[0], e[1], e[2]),
                 lambda lo, hi: (min(lo[1], lo[2]), max(hi[1], hi[2])),
                 lambda x, y, z: np.concatenate([y.reshape(-1), z.reshape(-1)]))


def select(enc: Enc, index: Sym, options: Sequence[Sym]) -> Sym:
    """options[index] (index an integer value in [0, len(options)), any value outside reads options[0])."""
    if isinstance(index, Tab) and index.const:
        return options[index.value()]
    out = options[0]
    vals = index.vals()
    ks = range(1, len(options)) if vals is None else [int(k) for k in vals if 0 < int(k) < len(options)]
    for k in ks:
        out = ite(enc, cmp(enc, "==", index, const(k)), options[k], out)
    return out


def total(enc: Enc, syms: Sequence[Sym]) -> Sym:
    """The exact sum (0 for none)."""
    acc = Acc(enc, 1)
    for s in syms:
        acc.add_sym(0, s)
    return acc.result()[0]


# ------------------------------------------------------------------------------------------------
# exact sums of many values
# ------------------------------------------------------------------------------------------------


class Acc:
    """Exact sums of ``k`` columns: tables grouped by the positions they read, plus terms, per
    column. :meth:`result` joins tables while their joint table stays small and sums the rest in
    z3 (the sum is exact: no saturation here)."""

    def __init__(self, enc: Enc, k: int):
        self.enc, self.k = enc, k
        self.parts: dict[tuple[int, ...], np.ndarray] = {}
        self.terms: list[list[Term]] = [[] for _ in range(k)]

    def add(self, deps: tuple[int, ...], arr: np.ndarray) -> None:
        """A table of all k columns, [cells of deps..., k]."""
        have = self.parts.get(deps)
        if have is None:
            self.parts[deps] = arr
        else:
            self.parts[deps] = as_int(wide(have, _magnitude(have) + _magnitude(arr)) + arr)

    def add_sym(self, j: int, s: Sym) -> None:
        """One value to column j."""
        if is_zero(s):
            return
        if isinstance(s, Term):
            self.terms[j].append(s)
            return
        arr = np.zeros(s.arr.shape + (self.k,), dtype=object if s.arr.dtype == object else np.int64)
        arr[..., j] = s.arr
        self.add(s.deps, arr)

    def result(self) -> list[Sym]:
        enc = self.enc
        groups: list[tuple[tuple[int, ...], np.ndarray]] = []
        for deps, arr in sorted(self.parts.items(), key=lambda kv: enc.cells(kv[0])):
            for i, (gd, ga) in enumerate(groups):
                u = tuple(sorted(set(gd) | set(deps)))
                if enc.cells(u) <= enc.tab_max:
                    _, (x, y) = enc.align((Tab(gd, ga), Tab(deps, arr)))
                    groups[i] = (u, as_int(wide(x, _magnitude(ga) + _magnitude(arr)) + y))
                    break
            else:
                groups.append((deps, arr))
        if not any(self.terms) and len(groups) <= 1:
            if not groups:
                return [ZERO] * self.k
            deps, arr = groups[0]
            return [Tab(*prune(deps, arr[..., j])) for j in range(self.k)]
        out: list[Sym] = []
        for j in range(self.k):
            pieces: list[Sym] = []
            for deps, arr in groups:
                col = arr[..., j]
                if np.any(col != 0):
                    pieces.append(Tab(deps, col))
            pieces += self.terms[j]
            out.append(_sum_terms(enc, pieces))
        return out


def _sum_terms(enc: Enc, pieces: list[Sym]) -> Sym:
    if not pieces:
        return ZERO
    if len(pieces) == 1:
        return pieces[0]
    lo, hi = sum(p.lo for p in pieces), sum(p.hi for p in pieces)
    w = max([width(lo, hi)] + [width(p.lo, p.hi) for p in pieces])
    vals: set[int] | None = {0}
    for p in pieces:
        v = p.vals()
        if vals is None or v is None or len(vals) * v.size > VALS_MAX * 16:
            vals = None
            break
        vals = {a + int(b) for a in vals for b in v}
        if len(vals) > VALS_MAX:
            vals = None
            break
    return Term(z3.Sum([enc.expr(p, w) for p in pieces]), lo, hi, None if vals is None else tuple(sorted(vals)))
