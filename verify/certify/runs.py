"""The run certificate: the composed certificate over runs of positions, in time and memory that do
not grow with N (P1 Thm 1 at N = 2^30: a proof for 64^(2^30) * 2^30 inputs in seconds).

It follows the same steps as the view certificate (:mod:`exactformer.verify.certify.composed`) on
*segments* (:mod:`exactformer.constructions.core.runs`): ranges of positions whose views are one
function of position-independent reads.

1. **Coverage**: every head is owned by a block of the plan that has a run certificate
   (``certify_runs``) or writes nothing.
2. **Embedding**: positions are cut where the task's token domains, the positional table's rows on
   the tracked columns, the position-code blocks (and, inside a run-constant code block on tracked
   columns, its runs: :class:`~exactformer.constructions.core.runs.RunConstantCode`) or the answer
   positions change; each segment's
   view is a table over its own token's classes (tokens with equal embedding rows on the tracked
   columns share a class; the token runs outside the embedding's table share the zero row).
3. **Each layer**: each head's run certificate gives its output over segments (a retrieval's
   row histograms from the code's weight distribution, :mod:`exactformer.constructions.codes.weights`;
   a uniform average's count over the segments' features); the residual and the heads are joined
   segment by segment and W_O and the MLP applied exactly over the boxes
   (:func:`~exactformer.verify.certify.layers.layer_image`, shared with the view certificate).
4. **Readout** at the answer positions, and
5. **Specification**: the proved answers against the task's specification as runs
   (:class:`~exactformer.constructions.core.runs.Lookup`, :class:`~exactformer.constructions.core.runs.Counting`).

Nothing is ever listed per position or per token of a run. A model whose structure the runs do not
describe (a code whose vectors follow no run, a code without a closed-form algebra, a block without
a run certificate, a causal layer, input vectors, a specification without a run form) is
:class:`~exactformer.constructions.core.runs.Declined`: the view certificate decides it instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.runs import (Classes, Counting, CountVar, Declined, DomainRuns, FeatureKey, Lookup,
                                                 PtrVar, RunState, Segment, TokVar, join, run_constant)
from exactformer.constructions.core.views import unique_rows
from exactformer.precision.boxes import Box
from exactformer.verify.certify.layers import (LayerWeights, computes_all, layer_image, readout_table, task_answers,
                                               tracked_columns, writes)


@dataclass
class RunContext(CertContext):
    """:class:`CertContext` with the task's domains as runs (``domains``) and its specification
    as runs (``spec``), which picks where a count's classes split."""

    spec: Any = None

    def count_breaks(self, sources: Any) -> list[int]:
        """Count values at which a count variable over ``sources`` should start a new class: the
        counts either side of where the specification's answer changes get classes of their own
        (a proof strategy; every class is proved whole)."""
        if not isinstance(self.spec, Counting):
            return []
        model, task = FeatureKey(), FeatureKey()
        add_sources(model, sources)
        add_spec(task, self.spec, self.domains)
        last_no = self.spec.b + model.ones - task.ones  # the largest count the task answers "no" (negated: "yes")
        return [last_no, last_no + 1, last_no + 2]  # the two counts either side alone: their margins are the least


def applies(model: CompiledModel, owners: dict[int, dict[int, Any]]) -> None:
    """Declined unless every owned head has a run certificate and the model has no input vectors or
    causal layers."""
    if model.vector_input is not None:
        raise Declined("the model reads input vectors")
    if any(b.attn.causal for b in model.blocks):
        raise Declined("a causal layer")
    for li, heads in owners.items():
        for h, block in heads.items():
            if not hasattr(block, "certify_runs"):
                raise Declined(f"blocks.{li}.attn head {h}: {type(block).__name__} has no run certificate")


def prove(ctx: RunContext, owners: dict[int, dict[int, Any]], read_fmt: Any,
          progress: Callable[[str], None]) -> Fraction:
    """The proof (steps 2-5 of the module docstring); ``ctx.domains`` and ``ctx.spec`` in run form."""
    model, W, T = ctx.model, ctx.W, ctx.T
    if not isinstance(ctx.spec, (Lookup, Counting)):
        raise Declined(f"the specification {type(ctx.spec).__name__} has no run form")
    tracked = tracked_columns(model, W, owners)
    ctx.details["tracked_columns"] = int(tracked.size)
    for emb in (model.embed, model.pos_embed):
        for b in emb.blocks:
            if np.intersect1d(np.arange(b.col, b.col + b.code.k), tracked).size and not (
                    emb is model.pos_embed and run_constant(b.code)):
                raise Declined("a code block fills a column that views must track")
    labels = task_answers(model, ctx.spec, T)
    answers = model.answer_positions_for(T)
    state = RunState(initial_segments(ctx, read_fmt, tracked, answers), tracked)
    nL = len(model.blocks)
    full = computes_all(W, ctx.written, nL)
    answer_runs = [(int(p), int(p) + 1) for p in np.unique(answers)]
    for li in range(nL):
        progress(f"layer {li}")
        need = [(0, T)] if full[li] else answer_runs
        state = _layer(ctx, li, owners.get(li, {}), state, need, last=li == nL - 1)
    progress("readout")
    return _readout(ctx, state, answer_runs, labels)


# ------------------------------------------------------------------------------------------------
# the embedding
# ------------------------------------------------------------------------------------------------


def initial_segments(ctx: RunContext, read_fmt: Any, cols: np.ndarray, answers: np.ndarray) -> list[Segment]:
    """Views right after the embedding (step 2 of the module docstring)."""
    model, arith, T, dom = ctx.model, ctx.arith, ctx.T, ctx.domains
    E, P = model.embed.raw_reader(read_fmt), model.pos_embed.raw_reader(read_fmt)
    pe = model.pos_embed
    tr = range(max(0, pe.table_first_row), min(T, pe.table_first_row + pe.table.shape[0]))
    cuts = {0, T, tr.start, tr.stop} | {int(x) for x in dom.breaks()} | {int(p) for p in answers} | {int(p) + 1 for p in answers}
    held = []  # run-constant code blocks on tracked columns: their rows are read once per run
    for b in pe.blocks:
        cuts |= {b.first_row, b.first_row + b.count}
        if np.intersect1d(np.arange(b.col, b.col + b.code.k), cols).size:
            held.append(b)
            cuts |= {int(x) + b.first_row - b.code_start for x in b.code.breaks(b.code_start, b.code_start + b.count)}
    rows = np.asarray(P(np.arange(tr.start, tr.stop), cols)) if len(tr) else np.zeros((0, cols.size), np.int64)
    if len(rows) > 1:
        cuts |= {tr.start + int(i) for i in np.flatnonzero(np.any(rows[1:] != rows[:-1], axis=1)) + 1}
    cuts = sorted(c for c in cuts if 0 <= c <= T)
    zero = np.asarray(P(np.array([0]), cols))[0] * 0
    tokens: dict[int, tuple[Classes, np.ndarray]] = {}
    out = []
    for a, b in zip(cuts, cuts[1:]):
        d = dom.uniform(a, b)
        if id(d) not in tokens:
            tokens[id(d)] = _token_classes(model.embed, E, d, cols, zero)
        classes, ucls = tokens[id(d)]
        if any(b.first_row <= a < b.first_row + b.count for b in held):
            prow = np.asarray(P(np.array([a]), cols))[0]  # the table's row and the run's vector
        else:
            prow = rows[a - tr.start] if tr.start <= a < tr.stop else zero
        table = arith.add(Box.point(ucls), Box.point(np.broadcast_to(prow, ucls.shape).copy()))
        out.append(Segment(a, b, [TokVar(1, 0, classes)], table))
    return out


def _token_classes(emb: Any, E: Any, domain: Classes, cols: np.ndarray, zero: np.ndarray) -> tuple[Classes, np.ndarray]:
    """Classes of a token domain by embedding row on ``cols`` (tokens outside the embedding's
    table have the zero row there: code blocks are off the tracked columns) and the rows."""
    t0, t1 = emb.table_first_row, emb.table_first_row + emb.table.shape[0]
    runs = domain.split(np.array([t0, t1]))
    starts, stops, rowlist = [], [], []
    for s, e in zip(runs.starts.tolist(), runs.stops.tolist()):
        if t0 <= s < t1:
            ids = np.arange(s, e)
            starts += ids.tolist()
            stops += (ids + 1).tolist()
            rowlist.append(np.asarray(E(ids, cols)))
        else:
            starts.append(s)
            stops.append(e)
            rowlist.append(zero[None, :])
    urows, cls = unique_rows(np.concatenate(rowlist))
    return Classes(np.array(starts, np.int64), np.array(stops, np.int64), cls.astype(np.int64)), urows


# ------------------------------------------------------------------------------------------------
# layers
# ------------------------------------------------------------------------------------------------


def _covering(segments: list[Segment], s: int) -> Segment:
    starts = [g.start for g in segments]
    i = int(np.searchsorted(starts, s, side="right")) - 1
    if i < 0 or not segments[i].start <= s < segments[i].stop:
        raise Unproven(f"internal: a head gives no output at position {s}")
    return segments[i]


def _layer(ctx: RunContext, li: int, owners: dict[int, Any], state: RunState, need: list[tuple[int, int]],
           last: bool) -> RunState:
    heads = sorted(owners.items())
    outs = [sorted(block.certify_runs(ctx, li, h, state, need), key=lambda g: g.start) for h, block in heads]
    lw = LayerWeights.of(ctx.W, li, [h for h, _ in heads], state.cols, state.col_index)
    new: list[Segment] = []
    for a, b in need:
        residual = state.pieces(a, b)
        cuts = {a, b} | {g.start for g in residual} | {g.stop for g in residual}
        for out in outs:
            cuts |= {max(a, min(b, x)) for g in out for x in (g.start, g.stop)}
        cuts_ = sorted(cuts)
        for s, e in zip(cuts_, cuts_[1:]):
            parts = [(g.vars, g.table) for g in [_covering(residual, s)] + [_covering(out, s) for out in outs]]
            jvars, tables = join(parts)
            new.append(Segment(s, e, jvars, layer_image(ctx.arith, tables, lw)))
    if not last:
        new += _not_computed(ctx, li, state, need)
    return RunState(sorted(new, key=lambda g: g.start), state.cols)


def _not_computed(ctx: RunContext, li: int, state: RunState, need: list[tuple[int, int]]) -> list[Segment]:
    """The positions layer ``li`` does not compute (only their queries could differ, and no later
    query reads them): their views before the layer, every column it writes widened to the range."""
    wide = writes(ctx.W, li)[state.cols]
    arith = ctx.arith
    out = []
    for g in state.segments:
        p = g.start
        for a, b in sorted(need) + [(g.stop, g.stop)]:
            if b <= p or a >= g.stop:
                continue
            if a > p:
                out.append(g.piece(p, min(a, g.stop)))
            p = max(p, b)
        if p < g.stop:
            out.append(g.piece(p, g.stop))
    for g in out:
        lo = np.where(wide, arith.min_raw, np.asarray(g.table.lo)).astype(np.asarray(g.table.lo).dtype)
        hi = np.where(wide, arith.max_raw, np.asarray(g.table.hi)).astype(np.asarray(g.table.hi).dtype)
        g.table = Box(lo, hi)
    return out


# ------------------------------------------------------------------------------------------------
# readout and specification
# ------------------------------------------------------------------------------------------------


def _readout(ctx: RunContext, state: RunState, answer_runs: list[tuple[int, int]], labels: np.ndarray) -> Fraction:
    """The proved answers (``labels``: the task's index of each logit's answer, :func:`task_answers`)
    at every answer run against the specification; the smallest margin."""
    arith, W = ctx.arith, ctx.W
    rows = np.flatnonzero(np.any(W["unembed.W_U"] != 0, axis=1))
    ci = state.col_index(np.intersect1d(rows, state.cols))
    if ci.size != rows.size:
        raise Unproven("the unembedding reads a column no view tracks")
    margin = None
    for a, b in answer_runs:
        for g in state.pieces(a, b):
            best, mn = readout_table(arith, g.table[..., ci], W["unembed.W_U"][rows], W["unembed.b_U"], g.start)
            margin = mn if margin is None else min(margin, mn)
            check_spec(ctx.spec, g, labels[best], ctx.domains)
    return Fraction(arith.to_fraction(np.array(margin)))


def add_sources(key: FeatureKey, sources: Any) -> None:
    """The features a count variable counts, into ``key`` (tables over the reads' domain indices)."""
    for src in sources:
        reads, table = [], src.table
        for axis, v in enumerate(src.reads):
            varies = np.any(np.ptp(table, axis=axis) != 0) if table.size else False
            if not isinstance(v, TokVar):
                if varies:
                    raise Unproven("a counted feature depends on a variable that is not a token")
                table = np.take(table, [0], axis=axis)
                reads.append(None)
                continue
            table = np.take(table, v.classes.class_of(v.classes.values()) if varies else [0], axis=axis)
            reads.append((v.slope, v.offset))
        keep = [i for i, r in enumerate(reads) if r is not None]
        table = table.reshape([table.shape[i] for i in keep]) if keep else table.reshape(())
        key.add(src.start, src.stop, [reads[i] for i in keep], table)


def add_spec(key: FeatureKey, spec: Counting, domains: DomainRuns) -> None:
    """The specification's features into ``key`` (their tables over the read positions' domain
    indices, each read's domain the same along the run)."""
    for f in spec.features:
        for o, n in zip(f.offsets, np.shape(f.table)):
            if domains.uniform(f.start + o, f.stop + o).size != n:
                raise Unproven(f"the task's feature at positions {f.start + o}.. has a table of the wrong size")
        key.add(f.start, f.stop, [(1, o) for o in f.offsets], f.table)


def check_spec(spec: Any, g: Segment, answer: np.ndarray, domains: DomainRuns) -> None:
    """The proved answers of the answer segment ``g`` against the specification."""
    if isinstance(spec, Lookup):
        _check_lookup(spec, g, answer)
    else:
        _check_counting(spec, g, answer, domains)


def _other_axes_constant(answer: np.ndarray, keep: list[int], what: str) -> np.ndarray:
    for i in range(answer.ndim):
        if i not in keep and np.any(np.ptp(answer, axis=i) != 0):
            raise Unproven(what)
    idx = tuple(slice(None) if i in keep else 0 for i in range(answer.ndim))
    return np.moveaxis(answer[idx], [keep.index(k) for k in keep], list(range(len(keep))))


def _check_lookup(spec: Lookup, g: Segment, answer: np.ndarray) -> None:
    q = g.start
    if g.stop != q + 1:
        raise Unproven("internal: an answer segment of several positions")
    base = [i for i, v in enumerate(g.vars) if isinstance(v, TokVar) and v.at(q) == spec.query_position]
    ptrs = [i for i, v in enumerate(g.vars) if isinstance(v, PtrVar) and base and v.base == g.vars[base[0]].key]
    if len(base) != 1 or len(ptrs) != 1:
        raise Unproven("the answer is not a lookup by the query token (no pointer variable in its view)")
    bv, pv = g.vars[base[0]], g.vars[ptrs[0]]
    dom = bv.classes.merged()
    ends = [np.array([a, b]) for a, b, _ in pv.maps + spec.pointer]
    cuts = np.unique(np.concatenate([dom.starts, dom.stops] + ends))
    for u0, u1 in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        if not dom.contains(u0, u1):
            continue
        mine = [o for a, b, o in pv.maps if a <= u0 and u1 <= b]
        want = [o for a, b, o in spec.pointer if a <= u0 and u1 <= b]
        if mine != want or len(mine) != 1:
            raise Unproven(f"query token {u0} looks up position {u0 + mine[0] if mine else None}, not "
                           f"{u0 + want[0] if want else None}", {"positions": [u0 + want[0]] if want else []})
    got = _other_axes_constant(answer, [base[0], ptrs[0]], "the answer depends on positions other than the looked-up one")
    pc = pv.classes
    for c in range(pc.ncls):
        sel = pc.cls == c
        tokens = int(np.sum(pc.stops[sel] - pc.starts[sel]))
        v = int(pc.starts[sel][0])
        want_a = int(spec.answer_of(np.array([v]))[0])
        if tokens != 1 or want_a < 0:
            raise Unproven(f"looked-up token {v} shares its view with {tokens - 1} others or names no answer")
        bad = np.flatnonzero(got[:, c] != want_a)
        if bad.size:
            raise Unproven(f"with looked-up token {v} the proved answer is {int(got[bad[0], c])}, the task's is {want_a}")


def _check_counting(spec: Counting, g: Segment, answer: np.ndarray, domains: DomainRuns) -> None:
    counts = [i for i, v in enumerate(g.vars) if isinstance(v, CountVar)]
    if len(counts) != 1:
        raise Unproven("the answer is not a threshold of a count (no count variable in its view)")
    ci = counts[0]
    cv = g.vars[ci]
    model, task = FeatureKey(), FeatureKey()
    add_sources(model, cv.sources)
    add_spec(task, spec, domains)
    mine, want = model.canonical(), task.canonical()
    if mine != want:
        diff = sorted(set(mine) ^ set(want)) or [k for k in mine if mine[k] != want[k]]
        ivs = (mine.get(diff[0]) or want.get(diff[0]) or [(0, 0, 0)])
        base = ivs[0][0]
        raise Unproven(f"the features the model counts differ from the task's (e.g. a feature at positions "
                       f"{[base + o for o in diff[0][2]]})", {"positions": [base + o for o in diff[0][2]]})
    shift = task.ones - model.ones
    cls = cv.classes
    got = np.moveaxis(answer, ci, -1)
    for s, e, c in zip(cls.starts.tolist(), cls.stops.tolist(), cls.cls.tolist()):
        for S in {s, e - 1}:
            truth = ((S + shift) > spec.b) != spec.negate
            want_a = spec.answer_index[1] if truth else spec.answer_index[0]
            bad = np.argwhere(got[..., c] != want_a)
            if bad.size:
                raise Unproven(f"with {S} counted features the proved answer is {int(got[..., c][tuple(bad[0])])}, "
                               f"the task's is {want_a}", {"counts": [S]})
