"""What a certificate knows about the residual stream: views of positions.

A certificate follows the residual stream block by block. At each point it holds, for every
position it still needs, a *view*: the tracked residual columns as boxes (see
:mod:`exactformer.precision.boxes`) that are functions of a few input *variables*:

* ``Var("tok")``: the token at an input position (``at[m]`` for member m of the group);
* ``Var("ptr")``: the token at a position chosen by the value of another variable of the view
  (``at[m, u]`` for member m and value index u of the base variable) -- a lookup by an index token;
* ``Var("count")``: the number of positions whose *feature* is 1, the feature of each position
  being a function of that position's own view (see :class:`Count`);
* ``Var("match")``: the number of key positions whose key id equals the query id of the member's
  own token (the view's ``tok`` variable at the member's position) -- the match count c of an
  exact-match head (see :class:`MatchCount`);
* ``Var("content")``: a *content pointer*: the position chosen by the content of the input (the
  nearest neighbour of the query's vector, or the position holding the query's symbol); its domain
  is the candidate positions and its meaning (:class:`ContentRule`) says which rule chooses, under
  which precondition of the task. A ``ptr`` variable may be based on it (the token at the position
  the content pointer chooses: the label next to the nearest neighbour). A content pointer may be
  held *by its code* (:class:`CodeAxis`): its table axis then has two classes, the two entries of a
  +-1 code, and each table column says which coordinate of the chosen candidate's code vector it
  follows (``Group.follows``) -- the address path of Theorem 7 in space that does not grow with N.

Every variable has a finite domain (token ids, or counts) and a class map ``cls`` from domain index
to table index: values that behave identically share a table entry. A :class:`Group` is a set of
positions whose views have the same variables (up to the positions they read) and the same table;
its ``table`` is a box of shape ``[*classes of each variable, columns]``.

Views are built from the embedding (:func:`initial_groups`) and transformed by the blocks' local
certificates; the composed certificate (:mod:`exactformer.verify.certify.composed`) reads the final views
at the answer positions and compares them with the task's specification.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from exactformer.precision.boxes import Arithmetic, Box


_UIDS = itertools.count()


@dataclass
class Count:
    """The count variable's meaning: S = sum over ``members`` (positions) of feature(view), where
    the feature of position members[i] is ``feature[i]`` evaluated on the view of group
    ``groups[i]`` (a 0/1 table over that group's classes) with that group's variables."""

    positions: np.ndarray  # [M] the positions summed over
    group_of: np.ndarray  # [M] index into ``groups``
    member_of: np.ndarray  # [M] member index within that group
    groups: list["Group"]  # the groups (their vars give each feature's inputs)
    features: list[np.ndarray]  # per group: 0/1 table over the group's class axes


@dataclass
class MatchCount:
    """The match variable's meaning: c = #{j : key_id(j, tok_j) = query_id(tok_i) >= 0}, i the
    member's own position (``Var.at``; its token is the view's tok variable at i). Ids are codes:
    equal ids, equal code vectors. Keys are listed per key group (positions sharing a domain and
    a key per token); a token's id -1 means no query / no real key (a default or silent key)."""

    query_tokens: np.ndarray  # the token ids allowed at the members' position
    query_id: np.ndarray  # the query id of each of those tokens
    key_positions: list[np.ndarray]  # per key group: its positions
    key_tokens: list[np.ndarray]  # per key group: the token ids allowed there
    key_id: list[np.ndarray]  # per key group: the key id of each of those tokens


@dataclass(frozen=True)
class ContentRule:
    """The meaning of a content pointer: at query position ``query``, the candidate position chosen
    by ``rule`` -- "nearest": the candidate whose input vector has the largest inner product with
    the query's vector, ahead of every other by at least ``margin``, every vector's squared norm
    at most ``max_norm_sq`` (the task's precondition); "equal": the unique candidate whose token
    equals the query's token (the task's precondition: exactly one does)."""

    rule: str
    query: int
    candidates: tuple[int, ...]
    margin: Any = None
    max_norm_sq: Any = None


@dataclass(frozen=True)
class CodeAxis:
    """A content pointer J held by the code vector it selects: candidate J carries vector
    ``J + offset`` of the +-1 code ``gen`` (read from the model's code blocks). The variable's table
    axis has two classes, entry -1 (class 0) and +1 (class 1); a table column that *follows*
    coordinate i (``Group.follows[uid][column] == i``) has, at class b, the value it takes for every
    J whose vector has entry class b at coordinate i; a column that follows -1 does not depend on J.
    Only operations that keep each column a function of at most one coordinate may read such a
    table (:func:`exactformer.verify.certify.layers.follows_through`)."""

    gen: Any
    offset: int


@dataclass
class Var:
    """An input variable (see the module docstring)."""

    kind: str  # "tok" | "ptr" | "count" | "match" | "content"
    at: np.ndarray | None  # tok: [P] positions; ptr: [P, n_base_values] positions; count: None; match, content: [P] members
    domain: np.ndarray  # token ids (tok, ptr), count values (count, match) or candidate positions (content)
    cls: np.ndarray  # [len(domain)] table index of each value
    base: int = -1  # ptr: index of the base variable in the group
    count: Count | None = None
    uid: int = field(default_factory=lambda: next(_UIDS))  # identity of ptr / count / match variables
    match: MatchCount | None = None
    content: ContentRule | None = None  # content: the rule that chooses the position
    code: CodeAxis | None = None  # content: held by its code (two classes: the code's entries)

    @property
    def ncls(self) -> int:
        return int(self.cls.max()) + 1 if self.cls.size else 0

    def take(self, members: np.ndarray) -> "Var":
        """The variable for a subset of the group's members."""
        return replace(self, at=None if self.at is None else self.at[members])


@dataclass
class Group:
    """Positions whose views share variables (up to positions read) and table."""

    pos: np.ndarray  # [P] member positions
    vars: list[Var]
    table: Box  # [*ncls per var, C]
    follows: dict[int, np.ndarray] = field(default_factory=dict)  # uid of a CodeAxis variable -> [C] coordinate

    def take(self, members: np.ndarray) -> "Group":
        return Group(self.pos[members], [v.take(members) for v in self.vars], self.table, self.follows)

    def follows_any(self, columns: np.ndarray) -> bool:
        """Whether any of the table's ``columns`` (indices) depends on a code-held variable."""
        return any(np.any(f[columns] >= 0) for f in self.follows.values())

    @property
    def axes(self) -> int:
        return len(self.vars)


@dataclass
class State:
    """Views of the positions a certificate still needs, over the tracked columns ``cols``."""

    groups: list[Group]
    cols: np.ndarray  # global residual column of each table column
    info: dict[str, Any] = field(default_factory=dict)

    def group_of(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(group index, member index) of each position (-1 where no group holds it)."""
        g_of = np.full(int(positions.max()) + 1 if positions.size else 0, -1, dtype=np.int64)
        m_of = np.full_like(g_of, -1)
        for gi, g in enumerate(self.groups):
            sel = g.pos[g.pos < g_of.size]
            g_of[sel] = gi
            m_of[sel] = np.flatnonzero(g.pos < g_of.size)
        return g_of[positions], m_of[positions]

    def col_index(self, cols: np.ndarray) -> np.ndarray:
        """Table column index of global columns ``cols`` (all must be tracked)."""
        idx = np.searchsorted(self.cols, cols)
        if np.any(idx >= self.cols.size) or np.any(self.cols[np.minimum(idx, self.cols.size - 1)] != cols):
            raise KeyError(f"columns {np.setdiff1d(cols, self.cols)[:5]} are not tracked")
        return idx


# ------------------------------------------------------------------------------------------------
# tables over variables
# ------------------------------------------------------------------------------------------------


def broadcast(table: Box, axes_of: list[int], n_axes: int) -> Box:
    """A table over some variables seen as a table over ``n_axes`` variables: table axis i is
    variable ``axes_of[i]``; variables it does not depend on get axes of size 1."""
    k = len(axes_of)
    order = list(np.argsort(axes_of))  # table axes in increasing variable order
    lo = np.moveaxis(np.asarray(table.lo), order, list(range(k)))
    hi = np.moveaxis(np.asarray(table.hi), order, list(range(k)))
    present = sorted(axes_of)
    shape = [lo.shape[present.index(a)] if a in present else 1 for a in range(n_axes)] + list(lo.shape[k:])
    return Box(lo.reshape(shape), hi.reshape(shape))


def expand_to(table: Box, shape: tuple[int, ...]) -> Box:
    return Box(np.broadcast_to(table.lo, shape), np.broadcast_to(table.hi, shape))


def refine(var: Var, new_cls: np.ndarray, tables: list[tuple[Box, int]]) -> tuple[Var, list[Box]]:
    """Split the classes of ``var`` by ``new_cls`` (a class per domain value): the joint classes are
    the distinct pairs (old, new). Each (table, axis) in ``tables`` is re-indexed along ``axis``
    (its axis over ``var``'s old classes) to the joint classes."""
    pair = var.cls.astype(np.int64) * (int(new_cls.max()) + 1 if new_cls.size else 1) + new_cls
    uniq, joint = np.unique(pair, return_inverse=True)
    old_of_joint = np.zeros(uniq.size, dtype=np.int64)
    old_of_joint[joint] = var.cls
    out = []
    for t, axis in tables:
        out.append(Box(np.take(t.lo, old_of_joint, axis=axis), np.take(t.hi, old_of_joint, axis=axis)))
    return replace(var, cls=joint.reshape(-1)), out


def unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, axis=0, return_inverse=True)`` for a 2-D integer array, fast: rows are encoded
    as one int64 (mixed radix over each column's range) when the ranges allow, so the sort is over
    integers; the encoding is a bijection, so the result is exact."""
    a = np.asarray(a)
    if a.ndim != 2:
        raise ValueError("unique_rows needs a 2-D array")
    if a.shape[0] == 0:
        return a, np.zeros(0, dtype=np.int64)
    if a.dtype != object and np.issubdtype(a.dtype, np.integer):
        if a.shape[1] == 0 or np.all(a == a[:1]):
            return a[:1], np.zeros(a.shape[0], dtype=np.int64)
        lo = a.min(axis=0).astype(object)
        span = a.max(axis=0).astype(object) - lo + 1
        total = 1
        for s in span:
            total *= int(s)
        if total < 1 << 62:
            code = np.zeros(a.shape[0], dtype=np.int64)
            for j in range(a.shape[1]):
                code = code * int(span[j]) + (a[:, j] - int(lo[j])).astype(np.int64)
            _, first, inv = np.unique(code, return_index=True, return_inverse=True)
            return a[first], inv.reshape(-1)
    if a.dtype == object:  # Python integers beyond int64: exact tuples as keys
        first: dict[tuple, int] = {}
        keys = [tuple(r) for r in a.tolist()]
        for i, kk in enumerate(keys):
            first.setdefault(kk, i)
        order = sorted(first)
        rank = {kk: j for j, kk in enumerate(order)}
        return a[[first[kk] for kk in order]], np.array([rank[kk] for kk in keys], dtype=np.int64)
    u, inv = np.unique(a, axis=0, return_inverse=True)
    return u, inv.reshape(-1)


def new_cls_of(values: np.ndarray) -> np.ndarray:
    """Class index per domain value for arbitrary per-value keys (rows of ``values``)."""
    v = np.asarray(values)
    if v.ndim == 1:
        v = v[:, None]
    return unique_rows(v)[1]


# ------------------------------------------------------------------------------------------------
# the initial views: the embedding
# ------------------------------------------------------------------------------------------------


def initial_groups(arith: Arithmetic, E_rows, P_rows, domains: Any, positions: np.ndarray,
                   cols: np.ndarray, pos_cols: np.ndarray | None = None, tok_cols: np.ndarray | None = None) -> list[Group]:
    """Views at ``positions`` right after the embedding: each position depends on its own token.

    ``E_rows(ids, cols)`` / ``P_rows(positions, cols)``: exact values (the arithmetic's
    representation) of token / positional embedding rows on ``cols``; ``domains``: the token ids
    allowed at each position (:class:`~exactformer.constructions.core.task.Domains`). Positions with the same domain and the same positional row share a group;
    within it tokens with the same embedding row share a class. ``pos_cols`` / ``tok_cols`` (bool
    [len(cols)]): the columns where the positional / token embedding may be nonzero (default all);
    the others are 0 and are not read per position or token (arrays of zeros of 2^21 positions or
    2^20 tokens by hundreds of columns at N = 2^20)."""
    groups: list[Group] = []
    pos_cols = np.ones(cols.size, dtype=bool) if pos_cols is None else np.asarray(pos_cols, dtype=bool)
    tok_cols = np.ones(cols.size, dtype=bool) if tok_cols is None else np.asarray(tok_cols, dtype=bool)
    P_nz = np.asarray(P_rows(positions, cols[pos_cols]))  # [positions, nonzero columns]
    merged = {d: np.flatnonzero(domains.of[positions] == d) for d in np.unique(domains.of[positions])}
    for d, members in merged.items():
        dom = np.asarray(domains.values[int(d)])
        E_nz = np.asarray(E_rows(dom, cols[tok_cols]))  # [|dom|, nonzero columns]
        u_nz, cls = unique_rows(E_nz)
        ucls = np.zeros((u_nz.shape[0], cols.size), dtype=u_nz.dtype)
        ucls[:, tok_cols] = u_nz
        urows, rinv = unique_rows(P_nz[members])
        for r in range(urows.shape[0]):
            mem = members[rinv.reshape(-1) == r]
            prow = np.zeros(cols.size, dtype=np.result_type(ucls.dtype, urows.dtype))
            prow[pos_cols] = urows[r]
            tab = arith.add(Box.point(ucls), Box.point(np.broadcast_to(prow, ucls.shape).copy()))
            var = Var("tok", positions[mem].astype(np.int64), dom.astype(np.int64), cls.astype(np.int64))
            groups.append(Group(positions[mem].astype(np.int64), [var], tab))
    return groups
