"""Pointers and slot facts: what the pointer certificate knows about the residual stream.

The view certificate (:mod:`exactformer.constructions.core.views`) tracks each position's columns as
functions of a few input variables; that cannot follow a pointer through a pointer (P2's k-hop:
the token at sigma(sigma(p)) ranges over N^2 pairs of positions per query). The pointer certificate
(:mod:`exactformer.verify.certify.pointer`) tracks instead one *fact* per residual column, the
same at every position:

* :class:`Copy` ``(source, ptr)``: the column holds exactly the embedding's entry ``source`` at
  the position ``ptr(p)`` -- the token embedding's column for the token there (``"tok"``) or the
  positional embedding's column of that position (``"pos"``);
* :class:`Noisy` ``(copy, cases)``: a head's output: for every raw value v the copied entry can
  take, the column lies in the box ``cases[v]``;
* :class:`Zero`: exactly 0.

A **pointer** maps each position p to a position ``ptr(p) <= p``; it is a tuple of atoms, the
outermost first (``(a, b)`` is a(b(p)); ``()`` is the identity). Atoms:

* :class:`Shift`: ``p -> p + delta`` on segments (the previous position, a fixed offset);
* :class:`Latest`: sigma of P2 Def. 5.3 in general form: the largest candidate ``j`` in
  ``[first, p]`` whose key token (the token at ``key(j)``) equals the token at ``p``, else
  ``default``.

Pointers compare by value: the certificate derives a pointer from the weights and the task states
the one its answer follows (:class:`TokenAt`), so the comparison is between two such tuples
(``sigma^k`` is ``(sigma,) * k``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.spec import Spec
from exactformer.precision.boxes import Box

END = 1 << 62  # the end of a last segment: every position


# ------------------------------------------------------------------------------------------------
# pointers
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shift:
    """``p -> p + delta`` for p in ``[lo, hi)`` of each segment ``(lo, hi, delta)``; the identity
    elsewhere. Canonical: segments sorted, disjoint, delta != 0, adjacent equal deltas merged."""

    segments: tuple[tuple[int, int, int], ...]

    @staticmethod
    def of(segments: Any) -> "Shift":
        out: list[list[int]] = []
        for lo, hi, d in sorted((int(a), int(b), int(c)) for a, b, c in segments if int(b) > int(a) and int(c) != 0):
            if out and out[-1][1] > lo:
                raise ValueError(f"overlapping shift segments {out[-1]} and {(lo, hi, d)}")
            if out and out[-1][1] == lo and out[-1][2] == d:
                out[-1][1] = hi
            else:
                out.append([lo, hi, d])
        return Shift(tuple(tuple(s) for s in out))

    def apply(self, p: np.ndarray) -> np.ndarray:
        p = np.asarray(p, dtype=np.int64)
        out = p.copy()
        for lo, hi, d in self.segments:
            sel = (p >= lo) & (p < hi)
            out[sel] = p[sel] + d
        return out

    @property
    def backward(self) -> bool:
        """ptr(p) <= p and >= 0 everywhere."""
        return all(d < 0 and lo + d >= 0 for lo, hi, d in self.segments)

    def describe(self) -> str:
        return "; ".join(f"p{d:+d} on [{lo}, {'N' if hi >= END else hi})" for lo, hi, d in self.segments) or "p"


@dataclass(frozen=True)
class Latest:
    """The largest j in ``[first, p]`` whose key token -- the token at ``key(j)`` -- equals the
    token at p; ``default`` where there is none."""

    key: tuple
    first: int
    default: int

    def describe(self) -> str:
        return f"latest j in [{self.first}, p] with token(({describe(self.key)})(j)) = token(p), else {self.default}"


Atom = Union[Shift, Latest]
Pointer = tuple  # of atoms, outermost first
IDENTITY: Pointer = ()


def compose(outer: Pointer, inner: Pointer) -> Pointer:
    """outer(inner(p)), canonical: adjacent shifts merged, identity shifts dropped."""
    out: list[Atom] = []
    for atom in (*outer, *inner):
        if isinstance(atom, Shift) and out and isinstance(out[-1], Shift):
            atom = _compose_shifts(out.pop(), atom)
        if not (isinstance(atom, Shift) and not atom.segments):
            out.append(atom)
    return tuple(out)


def _compose_shifts(outer: Shift, inner: Shift) -> Shift:
    """outer(inner(p)) as one shift: piecewise constant delta between the breakpoints."""
    points = {0}
    for lo, hi, d in inner.segments:
        points |= {lo, hi}
    for lo, hi, _ in outer.segments:
        points |= {lo, hi}
        for ilo, ihi, d in inner.segments:  # preimages of outer's breakpoints
            points |= {x - d for x in (lo, hi) if ilo <= x - d < ihi}
    cuts = sorted(p for p in points if 0 <= p < END) + [END]
    segs = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        d = int(outer.apply(inner.apply(np.array([a])))[0]) - a
        segs.append((a, b, d))
    return Shift.of(segs)


def backward(ptr: Pointer) -> bool:
    """Whether ptr(p) <= p at every position (a causal head can reach it)."""
    return all(atom.backward if isinstance(atom, Shift) else True for atom in ptr)


def evaluate(ptr: Pointer, tokens: np.ndarray) -> np.ndarray:
    """ptr(p) at every position of every input ``tokens`` [B, T] (for tests and counterexamples)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    B, T = tokens.shape
    pos = np.broadcast_to(np.arange(T, dtype=np.int64), (B, T)).copy()
    for atom in reversed(ptr):
        if isinstance(atom, Shift):
            pos = atom.apply(pos)
        else:
            pos = np.take_along_axis(_latest(atom, tokens), pos, axis=1)
    return pos


def _latest(atom: Latest, tokens: np.ndarray) -> np.ndarray:
    B, T = tokens.shape
    key_tok = np.take_along_axis(tokens, evaluate(atom.key, tokens), axis=1)  # [B, T]: token at key(j)
    out = np.full((B, T), atom.default, dtype=np.int64)
    for p in range(T):
        j = np.arange(atom.first, p + 1)
        hit = key_tok[:, atom.first:p + 1] == tokens[:, p:p + 1]
        any_hit = hit.any(axis=1)
        if any_hit.any():  # (no key before p at all: hit has no columns)
            out[any_hit, p] = j[hit.shape[1] - 1 - np.argmax(hit[any_hit, ::-1], axis=1)]
    return out


def describe(ptr: Pointer) -> str:
    if not ptr:
        return "p"
    parts = []
    for atom in ptr:
        if parts and parts[-1][0] == atom:
            parts[-1][1] += 1
        else:
            parts.append([atom, 1])
    text = " o ".join(f"({a.describe()})" + (f"^{e}" if e > 1 else "") for a, e in parts)
    return text


# ------------------------------------------------------------------------------------------------
# facts
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """An embedding column: ``table`` "tok" (the token embedding) or "pos" (the positional one)."""

    table: str
    col: int


@dataclass(frozen=True)
class Copy:
    """The column holds exactly ``source`` at the position ``ptr(p)``."""

    source: Source
    ptr: Pointer


@dataclass(frozen=True)
class Zero:
    """The column holds exactly 0."""


@dataclass(frozen=True)
class Noisy:
    """A head's output: the column lies in ``cases[v]`` when the copied entry is v (raw)."""

    copy: Copy
    cases: tuple[tuple[Any, Box], ...]

    def box(self, v: Any) -> Box:
        return dict(self.cases)[v]


Fact = Union[Copy, Zero, Noisy]


# ------------------------------------------------------------------------------------------------
# the positional embedding as a codebook
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeRun:
    """Rows ``[lo, hi)`` of the positional embedding hold ``scale * code(row + offset)`` on the
    columns asked for (one code block, its columns exactly those, in order)."""

    lo: int
    hi: int
    code: Any
    offset: int
    scale: Any


def code_runs(embedding: Any, cols: np.ndarray, where: str) -> list[CodeRun]:
    """How the positional embedding fills ``cols`` at every row: code blocks whose column range is
    exactly ``cols`` (in order), covering every row, the table zero there. Read from the
    embedding's own descriptors (the executor generates the rows from them)."""
    cols = np.asarray(cols, dtype=np.int64)
    if embedding.table.shape[0] and np.any(embedding.table.num[:, cols] != 0):
        raise Unproven(f"{where}: the positional table has entries on the code columns")
    runs = []
    for b in embedding.blocks:
        mine = (cols >= b.col) & (cols < b.col + b.code.k)
        if not mine.any():
            continue
        if not (mine.all() and cols.size == b.code.k and np.array_equal(cols, np.arange(b.col, b.col + b.code.k))):
            raise Unproven(f"{where}: a code block covers the columns only in part")
        runs.append(CodeRun(b.first_row, b.first_row + b.count, b.code, b.code_start - b.first_row, b.scale))
    runs.sort(key=lambda r: r.lo)
    covered = 0
    for r in runs:
        if r.lo != covered:
            raise Unproven(f"{where}: positions {covered}..{r.lo - 1} hold no code vector")
        covered = r.hi
    if covered < embedding.n_rows:
        raise Unproven(f"{where}: positions {covered}..{embedding.n_rows - 1} hold no code vector")
    return runs


def lookup_shift(query: list[CodeRun], key: list[CodeRun], where: str) -> Shift:
    """The pointer L with key codeword L(a) = query codeword a, for every position a: one code
    (the same generator and scale on both sides), and the key side's code indices distinct."""
    codes = {(r.code.generator_key(), r.scale) for r in (*query, *key)}
    if len(codes) != 1:
        raise Unproven(f"{where}: the query and key codes differ (generator or scale)")
    starts = sorted((r.lo + r.offset, r.hi + r.offset, r.offset) for r in key)  # code index ranges of the keys
    for (a0, a1, _), (b0, _, _) in zip(starts, starts[1:]):
        if b0 < a1:
            raise Unproven(f"{where}: two key positions hold the same codeword")
    segs = []
    for r in query:
        for c0, c1, koff in starts:  # query code index a + r.offset in [c0, c1): key position a + r.offset - koff
            lo, hi = max(r.lo, c0 - r.offset), min(r.hi, c1 - r.offset)
            if lo < hi:
                segs.append((lo, hi, r.offset - koff))
        total = sum(min(r.hi, c1 - r.offset) - max(r.lo, c0 - r.offset)
                    for c0, c1, _ in starts if max(r.lo, c0 - r.offset) < min(r.hi, c1 - r.offset))
        if total != r.hi - r.lo:
            raise Unproven(f"{where}: a query codeword (positions {r.lo}..{r.hi - 1}) is held by no key")
    return Shift.of(segs)


# ------------------------------------------------------------------------------------------------
# the specification
# ------------------------------------------------------------------------------------------------


@dataclass
class TokenAt(Spec):
    """The answer at every answer position p is the one the token at ``ptr(p)`` names:
    ``answer_of[token]`` (the tokens' answers, -1 for a token that names none), ``values[i]``
    the answer index i names."""

    ptr: Pointer
    answer_of: np.ndarray
    answer_positions: tuple[int, ...]
    values: tuple

    def positions(self, T: int) -> np.ndarray:
        return np.asarray(self.answer_positions, dtype=np.int64)

    def indices(self, tokens: Any, domains: Any) -> np.ndarray:
        return self.evaluate(tokens)

    def evaluate(self, tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens)
        at = np.take_along_axis(t, evaluate(self.ptr, t), axis=1)[:, self.positions(t.shape[1])]
        return self.answer_of[at]

    def check(self, ptr: Pointer, answers: dict[int, int]) -> None:
        """``ptr``: the pointer the certificate derived for the answer; ``answers``: the proved
        answer index for each token that can sit there."""
        if ptr != self.ptr:
            raise Unproven(f"the answer is the token at {describe(ptr)}, the task's at {describe(self.ptr)}")
        for t, a in answers.items():
            if a != int(self.answer_of[t]):
                raise Unproven(f"with token {t} at the pointer the proved answer is {a}, the task's is "
                               f"{int(self.answer_of[t])}")


# ------------------------------------------------------------------------------------------------
# what local certificates read
# ------------------------------------------------------------------------------------------------


@dataclass
class PointerContext(CertContext):
    """A :class:`~exactformer.constructions.blocks.base.CertContext` with the embeddings read in the
    arithmetic: what the pointer certificate's local certificates need."""

    fmt: Any = None
    _tok: dict = field(default_factory=dict)  # column -> the token embedding's raw column (read once)

    def tok_raw(self, cols: np.ndarray) -> np.ndarray:
        """The token embedding's raw entries ``[d_vocab, len(cols)]``."""
        cols = [int(c) for c in np.asarray(cols).reshape(-1)]
        missing = [c for c in cols if c not in self._tok]
        if missing:
            table = np.asarray(self.model.embed.raw(np.arange(self.model.d_vocab), self.fmt, np.array(missing)))
            self._tok.update({c: table[:, i] for i, c in enumerate(missing)})
        return np.stack([self._tok[c] for c in cols], axis=1) if cols else np.zeros((self.model.d_vocab, 0), np.int64)

    def values(self, source: Source) -> np.ndarray:
        """Every raw value the embedding column ``source`` takes (sorted; a superset for code blocks:
        both signs of the block's scale)."""
        if source.table == "tok":
            return np.unique(self.tok_raw(np.array([source.col])))
        emb = self.model.pos_embed
        out = [np.asarray(emb.table.raw(self.fmt))[:, source.col]] if emb.table.shape[0] else []
        covered = sum(b.count for b in emb.blocks if b.col <= source.col < b.col + b.code.k) + emb.table.shape[0]
        for b in emb.blocks:
            if b.col <= source.col < b.col + b.code.k:
                out.append(np.asarray(self.fmt.quantize(np.array([b.scale, -b.scale], dtype=object)), dtype=np.int64))
        if covered < emb.n_rows:
            out.append(np.zeros(1, dtype=np.int64))
        return np.unique(np.concatenate(out)) if out else np.zeros(1, dtype=np.int64)

    def copies(self, cols: np.ndarray, facts: dict[int, Fact], what: str, where: str) -> tuple[list[Source], Pointer]:
        """The sources of ``cols`` whose facts must be exact copies through one pointer, and that pointer."""
        got = [facts.get(int(c)) for c in cols]
        if not all(isinstance(f, Copy) for f in got):
            bad = next(int(c) for c, f in zip(cols, got) if not isinstance(f, Copy))
            raise Unproven(f"{where}: the {what} column {bad} is not an exact copy of an embedding column")
        ptrs = {f.ptr for f in got}
        if len(ptrs) != 1:
            raise Unproven(f"{where}: the {what} columns copy through different pointers")
        return [f.source for f in got], got[0].ptr
