"""The pointer certificate: a proof for all inputs of models whose heads follow pointers (P2's
induction heads and k-hop as weights), composed from the blocks' local certificates.

It holds one fact per residual column, the same at every position
(:mod:`exactformer.constructions.core.pointers`: an exact copy of an embedding column at a pointer,
a head's output within boxes, or zero) and follows the model layer by layer:

1. **Embedding**: a column the token embedding alone writes copies the token's column at the
   position itself, one the positional embedding alone writes copies the position's; a column both
   write is refused.
2. **Each layer**: every head is owned by a :class:`~exactformer.constructions.blocks.base.PointerHead`
   of the plan (or writes nothing); its local certificate turns the facts of the columns it reads
   into facts of the columns it writes (each written by one head, into a column holding 0, with
   ``b_O`` zero). The MLP is certified from its weights: its units split into independent parts
   (a column and the units that read or write it belong together, the residual's own value
   included); for each part and each assignment of the values its columns can copy, the new value
   of each column it writes is computed exactly at the ends of the one box-valued input and at
   every kink between them (the weights are integers, so the map is piecewise linear there). A
   column that is then, in every case, exactly the value one input column copies becomes a copy of
   it; one that is 0 in every case, zero; anything else is refused.
3. **Readout**: the unembedding reads copies of the token embedding through one pointer; for every
   token that can sit there the logits are computed exactly and the largest must beat every other
   one; the answer each token gets is compared with the task's
   (:class:`~exactformer.constructions.core.pointers.TokenAt`), and the pointer with the task's
   pointer.

Fixed-point arithmetics only (the local certificates say so otherwise).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.blocks.base import PointerHead
from exactformer.constructions.core.proof import Unproven
from exactformer.constructions.codes.tokens import max_other_inner
from exactformer.constructions.core.pointers import Copy, Noisy, PointerContext, Source, TokenAt, Zero, describe
from exactformer.precision.boxes import Box
from exactformer.verify.certify.layers import task_answers

MAX_CASES = 1 << 12  # value assignments tried per MLP part


def prove(ctx: PointerContext, owners: dict[int, dict[int, Any]], task: Any, progress: Any) -> Fraction:
    """The pointer certificate (module docstring) on the context of the composed certificate; the
    smallest readout margin."""
    if not ctx.arith.exact:
        raise Unproven("the pointer certificate covers fixed-point arithmetic only")
    facts = _embedding_facts(ctx)
    for li, blk in enumerate(ctx.model.blocks):
        progress(f"layer {li}")
        facts = _layer(ctx, li, owners.get(li, {}), facts)
    progress("readout")
    return _readout(ctx, facts, task)


def _embedding_facts(ctx: PointerContext) -> dict[int, Any]:
    tok, pos = ctx.model.embed.nonzero_columns(), ctx.model.pos_embed.nonzero_columns()
    both = np.flatnonzero(tok & pos)
    if both.size:
        raise Unproven(f"the token and positional embeddings both write column {int(both[0])}")
    return {c: Copy(Source("tok", c), ()) if tok[c] else Copy(Source("pos", c), ()) if pos[c] else Zero()
            for c in range(ctx.model.d_model)}


def _layer(ctx: PointerContext, li: int, owners: dict[int, Any], facts: dict[int, Any]) -> dict[int, Any]:
    pre = f"blocks.{li}."
    W = ctx.W
    if np.any(W[pre + "attn.b_O"] != 0):
        raise Unproven(f"{pre}attn: b_O must be zero (a constant added to every position's copies)")
    written: dict[int, Any] = {}
    for h, block in sorted(owners.items()):
        if not isinstance(block, PointerHead):
            raise Unproven(f"{pre}attn head {h}: owned by {type(block).__name__}, not a pointer head")
        for col, fact in block.certify_pointer(ctx, li, h, facts).items():
            if col in written:
                raise Unproven(f"{pre}attn: two heads write column {col}")
            if not isinstance(facts[col], Zero):
                raise Unproven(f"{pre}attn head {h} writes into column {col}, which holds a value")
            written[col] = fact
    facts = {**facts, **written}
    return _mlp(ctx, li, facts)


# ------------------------------------------------------------------------------------------------
# the MLP, part by part
# ------------------------------------------------------------------------------------------------


def _parts(W_in: np.ndarray, W_out: np.ndarray, b_out: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP's independent parts: (columns, units), a column belonging with every unit that reads
    or writes it (a column a unit writes is also an input: the residual adds its value)."""
    d, U = W_in.shape
    parent = list(range(d + U))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for c, u in zip(*np.nonzero(W_in)):
        parent[find(int(c))] = find(d + int(u))
    for u, c in zip(*np.nonzero(W_out)):
        parent[find(int(c))] = find(d + int(u))
    active = set(np.flatnonzero(np.any(W_in != 0, axis=1)).tolist()) | set(np.flatnonzero(np.any(W_out != 0, axis=0)).tolist())
    active |= set(np.flatnonzero(b_out != 0).tolist())
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for c in sorted(active):
        groups.setdefault(find(c), ([], []))[0].append(c)
    for u in range(U):
        if np.any(W_in[:, u] != 0) or np.any(W_out[u] != 0):
            groups.setdefault(find(d + u), ([], []))[1].append(u)
    return [(np.array(cs, dtype=np.int64), np.array(us, dtype=np.int64)) for cs, us in groups.values()]


def _mlp(ctx: PointerContext, li: int, facts: dict[int, Any]) -> dict[int, Any]:
    pre, W, arith = f"blocks.{li}.mlp.", ctx.W, ctx.arith
    W_in, b_in, W_out, b_out = W[pre + "W_in"], W[pre + "b_in"], W[pre + "W_out"], W[pre + "b_out"]
    new = dict(facts)
    for cols, units in _parts(W_in, W_out, b_out):
        if units.size == 0:
            raise Unproven(f"{pre}b_out: a constant added to columns {cols.tolist()} that no unit writes")
        writes = cols[np.any(W_out[np.ix_(units, cols)] != 0, axis=0) | (b_out[cols] != 0)]
        w_in, w_out = W_in[np.ix_(cols, units)], W_out[np.ix_(units, writes)]
        if np.any(w_in % arith.one() != 0) or np.any(w_out % arith.one() != 0):
            raise Unproven(f"{pre}: the weights of the units on columns {cols.tolist()} are not integers")
        new.update(_part_image(ctx, facts, cols, writes, w_in, b_in[units], w_out, b_out[writes], pre))
    return new


def _cases(ctx: PointerContext, facts: dict[int, Any], cols: np.ndarray, where: str):
    """Every assignment of the values the columns copy: (values per column, box column or -1)."""
    options = []
    for c in cols:
        f = facts[int(c)]
        if isinstance(f, Zero):
            options.append([0])
        elif isinstance(f, Copy):
            options.append([int(v) for v in ctx.values(f.source)])
        else:
            options.append([int(v) for v, _ in f.cases])
    total = int(np.prod([len(o) for o in options]))
    if total > MAX_CASES:
        raise Unproven(f"{where}: columns {cols.tolist()} take {total} value assignments (at most {MAX_CASES})")
    return itertools.product(*options)


def _part_image(ctx: PointerContext, facts: dict[int, Any], cols: np.ndarray, writes: np.ndarray, W_in: np.ndarray,
                b_in: np.ndarray, W_out: np.ndarray, b_out: np.ndarray, where: str) -> dict[int, Any]:
    arith, A = ctx.arith, ctx.arith.array
    noisy = [i for i, c in enumerate(cols) if isinstance(facts[int(c)], Noisy)]
    if len(noisy) > 1:
        raise Unproven(f"{where}: columns {cols[noisy].tolist()} are head outputs read by one part of the MLP")
    out_at = {int(c): i for i, c in enumerate(cols)}
    outcomes: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
    for case in _cases(ctx, facts, cols, where):
        x = np.array(case, dtype=object)
        if noisy:
            i = noisy[0]
            box = facts[int(cols[i])].box(case[i])
            points = _candidates(int(np.asarray(box.lo)), int(np.asarray(box.hi)), i, x, W_in, b_in, arith.one())
        else:
            i, points = -1, [None]
        values = []
        for u in points:
            xi = x.copy()
            if u is not None:
                xi[i] = u
            v = A(xi.astype(np.int64))
            h = arith.relu(arith.affine(Box.point(v), W_in, b_in))
            y = arith.affine(h, W_out, b_out) if W_out.size else Box.point(A(np.zeros(writes.size, dtype=np.int64)))
            res = arith.add(Box.point(v[[out_at[int(c)] for c in writes]]), y)
            values.append(np.asarray(res.lo))
        values = np.array(values)
        outcomes.append((case, values.min(axis=0), values.max(axis=0)))
    return {int(c): _classify(ctx, facts, cols, outcomes, k, int(c), where) for k, c in enumerate(writes)}


def _candidates(lo: int, hi: int, i: int, x: np.ndarray, W_in: np.ndarray, b_in: np.ndarray, S: int) -> list[int]:
    """The raw values of the box column i where the part's map can turn: its ends and, for every
    unit reading it, the raw values around the point where the unit's pre-activation crosses 0 (the
    weights are integers, so the pre-activations are exact and linear in the column)."""
    Wi = np.asarray(W_in, dtype=object) // S
    points = {lo, hi}
    for u in range(Wi.shape[1]):
        w = int(Wi[i, u])
        if w == 0:
            continue
        const = sum(int(x[c]) * int(Wi[c, u]) for c in range(Wi.shape[0]) if c != i) + int(b_in[u])
        root = Fraction(-const, w)
        for q in range(root.__floor__() - 1, root.__ceil__() + 2):
            if lo <= q <= hi:
                points.add(q)
    return sorted(points)


def _classify(ctx: PointerContext, facts: dict[int, Any], cols: np.ndarray, outcomes: list, k: int, col: int,
              where: str) -> Any:
    """The fact of a written column from its value in every case: zero, or the copy of one input."""
    if all(lo[k] == 0 == hi[k] for _, lo, hi in outcomes):
        return Zero()
    for i, c in enumerate(cols):
        f = facts[int(c)]
        copy = f if isinstance(f, Copy) else f.copy if isinstance(f, Noisy) else None
        if copy is not None and all(lo[k] == case[i] == hi[k] for case, lo, hi in outcomes):
            return copy
    case, lo, hi = next((o for o in outcomes if o[1][k] != o[2][k]), outcomes[0])
    raise Unproven(f"{where}: column {col} is not an exact copy after the MLP (inputs {dict(zip(cols.tolist(), case))}: "
                   f"[{ctx.arith.to_fraction(np.array(lo[k]))}, {ctx.arith.to_fraction(np.array(hi[k]))}])",
                   {"kinds": ["all-equal", "periodic"]})


# ------------------------------------------------------------------------------------------------
# the readout
# ------------------------------------------------------------------------------------------------


def _readout(ctx: PointerContext, facts: dict[int, Any], task: Any) -> Fraction:
    arith, W = ctx.arith, ctx.W
    rows = np.flatnonzero(np.any(W["unembed.W_U"] != 0, axis=1))
    sources, ptr = ctx.copies(rows, facts, "readout", "unembed")
    if any(s.table != "tok" for s in sources):
        raise Unproven("unembed: the answer must be read from copies of the token embedding")
    spec = task.spec(ctx.model)
    if not isinstance(spec, TokenAt):
        raise Unproven("the task's specification is not an answer read at a pointer")
    labels = task_answers(ctx.model, spec, ctx.T)
    X = ctx.tok_raw(np.array([s.col for s in sources]))  # [d_vocab, |rows|]
    tokens = np.unique(np.concatenate([np.asarray(v) for v in ctx.domains.values]))
    answers, margin = _code_answers(arith, X, W["unembed.W_U"][rows], W["unembed.b_U"], tokens)
    spec.check(ptr, {t: int(labels[a]) for t, a in answers.items()})
    ctx.details["answer_pointer"] = describe(ptr)
    return Fraction(arith.to_fraction(np.array(margin)))


def _code_answers(arith: Any, X: np.ndarray, W_U: np.ndarray, b_U: np.ndarray, tokens: np.ndarray) -> tuple[dict, int]:
    """Each token's answer and the smallest margin, when the unembedding's columns are the tokens'
    +-codes (one entry size each side, b_U constant): the logit of a token's own column is p r + b,
    of every other at most p I + b (I the largest inner product of two different codes)."""
    s, w = np.abs(X[X != 0]), np.abs(W_U[W_U != 0])
    if X.size == 0 or np.any(X == 0) or np.any(W_U == 0) or np.unique(s).size != 1 or np.unique(w).size != 1 \
            or np.unique(b_U).size != 1:
        raise Unproven("unembed: its columns are not the tokens' +-codes with one scale")
    sx, sw = np.sign(X).astype(np.int8), np.sign(W_U.T).astype(np.int8)
    column = {row.tobytes(): a for a, row in enumerate(sw)}
    answers = {int(t): column.get(sx[t].tobytes(), -1) for t in tokens}
    missing = [t for t, a in answers.items() if a < 0]
    if missing:
        raise Unproven(f"unembed: token {missing[0]}'s code has no answer column")
    A = arith.array
    p_pos, p_neg = (int(np.asarray(arith.mul(Box.point(A(x)), Box.point(A(int(w[0])))).lo)) for x in (int(s[0]), -int(s[0])))
    if p_neg != -p_pos:
        raise Unproven("unembed: the products of +- code entries are not symmetric")
    r, b = X.shape[1], int(np.asarray(b_U).reshape(-1)[0])
    answer_tokens = np.array([t for t, a in sorted(answers.items(), key=lambda kv: kv[1])])
    other = max_other_inner(sx.astype(np.int64), tokens, answer_tokens)
    if abs(p_pos) * r + abs(b) > arith.max_raw:
        raise Unproven("unembed: the logits may saturate")
    margin = p_pos * (r - other)
    if margin <= 0:
        raise Unproven("unembed: a token's own code does not score above every other code")
    return answers, margin
