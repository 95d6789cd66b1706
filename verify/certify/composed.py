"""The composed certificate: a proof for all inputs from the blocks' local certificates.

``certify(model, fmt)`` follows the residual stream layer by layer, holding views (see
:mod:`exactformer.constructions.core.views`) of every position it still needs:

1. **Coverage.** Every attention head of the model is owned by a block of the model's plan or
   writes nothing (zero output weights, or zero values); the plan is a witness, each block's
   certificate checks its facts on the weights. MLPs and the unembedding are certified from their
   weights directly (:func:`~exactformer.constructions.blocks.mlp.mlp_image`).
2. **Views after the embedding**: each position's tracked columns as a function of its token
   (tracked: every column some later read needs, except code columns read only by the queries
   and keys of blocks that derive their logits from the codes' generators).
3. **Each layer**: every head's local certificate gives its output at the needed positions as
   boxes over views; the views are joined with the residual, the output projection and the MLP are
   applied exactly over the boxes.
4. **Readout**: the logits' boxes at every answer position for every assignment of its view; the
   answer is proved where the correct logit's lower bound exceeds every other upper bound.
5. **Specification**: the proved answer (a table over the view's variables) is compared with the
   task's specification (:mod:`exactformer.constructions.core.spec`), which states the ground truth in
   the same terms.

A failing step raises ``Unproven``; then candidate inputs (the task's adversarial inputs, inputs
planted from the failing step's hint, seeded samples) run through the executor, and the first wrong
answer is returned as a counterexample. Otherwise the result is "unproven" with the reason -- a
failure, never a pass. ``certify`` never raises on a well-formed model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.blocks.base import CertContext, Unproven
from exactformer.constructions.blocks.mlp import mlp_image
from exactformer.constructions.core.ir import CompiledModel, IRError
from exactformer.constructions.core.pointers import PointerContext
from exactformer.constructions.core.views import Box, Group, State, initial_groups, unique_rows
from exactformer.constructions.core.views_ops import join_views
from exactformer.precision import Format, float_format
from exactformer.precision.boxes import arithmetic as make_arithmetic
from exactformer.verify.certify import pointer

CANDIDATES = 2048  # inputs the counterexample search runs when a proof step fails


@dataclass
class CertificateResult:
    passed: bool
    proved: bool  # passed by proof
    reason: str
    min_margin: Fraction | None  # smallest (correct logit's lower bound - every other's upper bound)
    counterexample: dict | None = None
    details: dict = field(default_factory=dict)
    seconds: float = 0.0


def certify(model: CompiledModel, fmt: Format, task: Any, device: str = "cpu",
            run_candidates: Callable[[CompiledModel, Any], dict | None] | None = None,
            progress: Callable[[str], None] | None = None, arithmetic: str | None = None) -> CertificateResult:
    """Prove ``model`` computes ``task`` on every input, or say why not. ``arithmetic``: "fixed"
    (the fixed-point format ``fmt``, the default for fixed-point formats), "real", or a float dtype
    -- float64, float32, bfloat16, float16, float8_e4m3, float8_e5m2 -- (what torch computes with
    the exported weights on the CPU; see precision/boxes.py)."""
    t0 = time.perf_counter()
    details: dict[str, Any] = {}
    arithmetic = arithmetic or ("fixed" if fmt.is_exact else fmt.name)
    details["arithmetic"] = arithmetic if arithmetic != "fixed" else fmt.name
    try:
        margin = _prove(model, fmt, task, device, details, progress or (lambda s: None), arithmetic)
        return CertificateResult(True, True, "proved for all inputs", margin, None, _public(details),
                                 time.perf_counter() - t0)
    except Unproven as e:
        reason, hint = e.reason, e.hint
    except (IRError, ValueError) as e:
        reason, hint = f"{type(e).__name__}: {e}", {}
    except Exception as e:  # a certificate never raises on a model; a bug here is reported, never a pass
        reason, hint = f"internal error {type(e).__name__}: {e}", {}
    cex, searched = None, "no counterexample search (no runner)"
    if run_candidates is not None:
        cex, searched = _search(model, task, hint, run_candidates)
    if cex is not None:
        return CertificateResult(False, False, f"counterexample found ({reason})", None, cex, _public(details),
                                 time.perf_counter() - t0)
    return CertificateResult(False, False, f"unproven: {reason}; {searched}", None, None, _public(details),
                             time.perf_counter() - t0)


def _public(details: dict) -> dict:
    return {k: v for k, v in details.items() if not k.startswith("_")}


# ------------------------------------------------------------------------------------------------
# the proof
# ------------------------------------------------------------------------------------------------


def _prove(model: CompiledModel, fmt: Format, task: Any, device: str, details: dict, progress,
           arithmetic: str) -> Fraction:
    arith = make_arithmetic(arithmetic, fmt)
    W = {name: _weight(arith, t) for name, t in model.tensors().items()}
    read_fmt = fmt if arithmetic == "fixed" else float_format("float64" if arithmetic == "real" else arithmetic)
    T = task.length(model)
    if T > model.n_ctx:
        raise Unproven(f"the task's inputs have {T} tokens but the model's context is {model.n_ctx}")
    domains = task.domains(model)
    answer_pos = model.answer_positions_for(T)
    owners = _owners(model, W)
    engines = {block.engine for heads in owners.values() for block in heads.values()}
    if "pointers" in engines:  # heads that follow pointers: the pointer certificate (verify/certify/pointer.py)
        if engines != {"pointers"}:
            raise Unproven("the plan mixes heads of the pointer certificate and of the view certificate")
        return pointer.prove(PointerContext(model, arith, W, domains, T, device, details, fmt=read_fmt), owners, task,
                             progress)
    ctx = CertContext(model, arith, W, domains, T, device, details)
    ctx.written = _written_before(model, W)
    tracked = _tracked_columns(model, W, owners)
    details["tracked_columns"] = int(tracked.size)
    if model.vector_input is not None and np.any(np.isin(tracked, np.asarray(model.vector_input.cols))):
        raise Unproven("a view would hold input-vector columns; only blocks that bound the vectors themselves "
                       "(through the task's precondition) may read them")
    E, P = model.embed.raw_reader(read_fmt), model.pos_embed.raw_reader(read_fmt)
    if arithmetic == "real":
        for emb in (model.embed, model.pos_embed):
            vals = emb.table.distinct_values() + [b.scale for b in emb.blocks]
            if any(Fraction(float(v)) != v for v in vals):
                raise Unproven("the real-arithmetic certificate needs embedding entries that are float64 values")
    state = State(initial_groups(arith, E, P, domains, np.arange(T), tracked), tracked)
    nL = len(model.blocks)
    needs = _needed_positions(W, ctx.written, answer_pos, T, nL)
    for li in range(nL):
        progress(f"layer {li}")
        state = _layer(ctx, li, owners.get(li, {}), state, needs[li])
    progress("readout")
    return _readout(ctx, state, task)


def _weight(arith: Any, t: Any) -> np.ndarray:
    """``arith.weight`` of an exact tensor, entry by entry: for a mostly-zero tensor only its nonzero
    entries are converted (a zero weight is 0 in every arithmetic)."""
    num = t.num
    if num.dtype == object or num.size <= 1 << 16 or 4 * np.count_nonzero(num) >= num.size:
        return arith.weight(num, t.den)
    nz = np.flatnonzero(num)
    vals = arith.weight(num.reshape(-1)[nz], t.den)
    out = np.zeros(num.size, dtype=np.asarray(arith.weight(np.zeros(1, dtype=num.dtype), t.den)).dtype)
    out[nz] = vals
    return out.reshape(num.shape)


def _owners(model: CompiledModel, W: dict) -> dict[int, dict[int, Any]]:
    """layer -> head -> owning block; a head without a block must write nothing."""
    owners: dict[int, dict[int, Any]] = {}
    for p in model.plan:
        if p.kind == "head":
            owners.setdefault(p.layer, {})[p.index] = p.block
    for li, blk in enumerate(model.blocks):
        for h in range(blk.attn.n_heads):
            if h in owners.get(li, {}):
                continue
            pre = f"blocks.{li}.attn."
            silent = not np.any(W[pre + "W_O"][h]) or (not np.any(W[pre + "W_V"][h]) and not np.any(W[pre + "b_V"][h]))
            if not silent:
                raise Unproven(f"blocks.{li}.attn head {h} writes to the residual stream but no block of the plan owns it")
    return owners


def _written_before(model: CompiledModel, W: dict) -> list[np.ndarray]:
    """For each layer, the residual columns some earlier layer writes (the rest still hold their
    embedding values)."""
    out, acc = [], np.zeros(model.d_model, dtype=bool)
    for li in range(len(model.blocks)):
        out.append(acc.copy())
        pre = f"blocks.{li}."
        acc = acc | np.any(W[pre + "attn.W_O"] != 0, axis=(0, 1)) | (W[pre + "attn.b_O"] != 0)
        acc = acc | np.any(W[pre + "mlp.W_out"] != 0, axis=0) | (W[pre + "mlp.b_out"] != 0)
    return out


def _needed_positions(W: dict, written: list[np.ndarray], answer_pos: np.ndarray, T: int, nL: int) -> list[np.ndarray]:
    """The positions whose views each layer must compute: the answer positions in the last layer;
    in an earlier layer those of the next one, or every position when a later key or value reads a
    column this layer or an earlier one writes (the executor's rule, verify/executor/exact.py)."""
    needs = [np.arange(T)] * nL
    needs[-1] = answer_pos
    for li in range(nL - 2, -1, -1):
        pre = f"blocks.{li + 1}.attn."
        kv = np.any(W[pre + "W_K"] != 0, axis=(0, 2)) | np.any(W[pre + "W_V"] != 0, axis=(0, 2))
        full = np.any(kv & written[li + 1]) or needs[li + 1].size == T
        needs[li] = np.arange(T) if full else needs[li + 1]
    return needs


def _tracked_columns(model: CompiledModel, W: dict, owners: dict) -> np.ndarray:
    """Columns some read needs: read by a value, an MLP, the unembedding, or a query/key of a head
    whose block does not derive its logits from code columns. A block with ``view_columns`` derives
    everything its head reads from the weights, the codes and the task's precondition, except those
    columns, which it reads from views."""
    d = model.d_model
    read = np.any(W["unembed.W_U"] != 0, axis=1)
    for li, blk in enumerate(model.blocks):
        pre = f"blocks.{li}."
        read |= np.any(W[pre + "mlp.W_in"] != 0, axis=1)
        for h in range(blk.attn.n_heads):
            owner = owners.get(li, {}).get(h)
            hw = {w: W[pre + "attn." + w][h] for w in ("W_Q", "W_K", "W_V")}
            if owner is not None:
                read |= owner.view_columns(model, hw)
            else:  # a head no block owns writes nothing (checked by _owners), but its reads are tracked
                read |= np.any(hw["W_V"] != 0, axis=1) | np.any(hw["W_Q"] != 0, axis=1) | np.any(hw["W_K"] != 0, axis=1)
    return np.flatnonzero(read[:d]).astype(np.int64)


class _SparseProducts:
    """``arith`` whose ``matmul``/``affine`` form only the products of each column's nonzero
    weights (a zero weight's product is exactly 0 and adds nothing): the same boxes as the dense
    image, held as [..., m, r] for at most r nonzero weights per column instead of [..., n, m]
    (views with many classes through a sparse W_O or MLP). Everything else is ``arith``'s."""

    def __init__(self, arith: Any):
        self._arith = arith

    def __getattr__(self, name: str) -> Any:
        return getattr(self._arith, name)

    def matmul(self, x: Box, W: np.ndarray) -> Box:
        W = np.asarray(W)
        nz = W != 0
        r = int(nz.sum(axis=0).max()) if W.size else 0
        if r == 0 or x.is_point() or 4 * r >= W.shape[0]:
            return self._arith.matmul(x, W)
        rows = np.argsort(~nz, axis=0, kind="stable")[:r].T  # [m, r]: each column's nonzero rows first
        vals = np.where(np.take_along_axis(nz, rows.T, axis=0).T, np.take_along_axis(W, rows.T, axis=0).T, 0)
        g = Box(np.asarray(x.lo)[..., rows], np.asarray(x.hi)[..., rows])
        prod = self._arith.mul(g, Box.point(vals.astype(W.dtype)))
        if r == 1:  # a sum of one rounded (and saturated) product is that product
            return Box(np.asarray(prod.lo)[..., 0], np.asarray(prod.hi)[..., 0])
        return self._arith.sum(prod, axis=-1)

    def affine(self, x: Box, W: np.ndarray, b: np.ndarray) -> Box:
        b = np.asarray(b)
        return self._arith.add(self.matmul(x, W), Box(b, b))


def _layer(ctx: CertContext, li: int, owners: dict[int, Any], state: State, need: np.ndarray) -> State:
    W = ctx.W
    arith = _SparseProducts(ctx.arith)
    pre = f"blocks.{li}."
    heads = []  # (head index, its output views)
    for h, block in sorted(owners.items()):
        heads.append((h, block.certify_head(ctx, li, h, state, need)))
    # the residual's views at the needed positions
    g_of, m_of = state.group_of(need)
    residual = []
    for g in np.unique(g_of):
        sel = g_of == g
        G = state.groups[g]
        residual.append(Group(need[sel], [v.take(m_of[sel]) for v in G.vars], G.table))
    # join: residual + every head, position by position
    parts_by_pos = _align(need, residual, [out for _, out in heads])
    cols = state.cols
    new_groups = []
    # the layer's weights as the loop over view groups reads them (the same for every group)
    W_O = W[pre + "attn.W_O"]
    b_O = W[pre + "attn.b_O"][cols]
    W_rows = [W_O[h][np.flatnonzero(np.any(W[pre + "attn.W_V"][h] != 0, axis=0) | (W[pre + "attn.b_V"][h] != 0))][:, cols]
              for h, _ in heads]
    W_heads = np.concatenate(W_rows, axis=0) if W_rows else None
    rows = np.flatnonzero(np.any(W[pre + "mlp.W_in"] != 0, axis=1))
    ci = state.col_index(rows)
    W_in, b_in = W[pre + "mlp.W_in"][rows], W[pre + "mlp.b_in"]
    W_out, b_out = W[pre + "mlp.W_out"][:, cols], W[pre + "mlp.b_out"][cols]
    for parts in parts_by_pos:
        for group, tables in join_views(parts):
            x, zs = tables[0], tables[1:]
            shape = np.broadcast_shapes(*[np.shape(t.lo)[:-1] for t in tables])
            x = Box(np.broadcast_to(x.lo, shape + (cols.size,)), np.broadcast_to(x.hi, shape + (cols.size,)))
            if zs:
                zcat = Box(np.concatenate([np.broadcast_to(z.lo, shape + z.lo.shape[-1:]) for z in zs], axis=-1),
                           np.concatenate([np.broadcast_to(z.hi, shape + z.hi.shape[-1:]) for z in zs], axis=-1))
                attn = arith.affine(zcat, W_heads, b_O)
            else:
                attn = Box.point(np.broadcast_to(b_O, shape + (cols.size,)))
            x = arith.add(x, attn)
            mlp = mlp_image(arith, x[..., ci], W_in, b_in, W_out, b_out)
            x = arith.add(x, mlp)
            new_groups.append(Group(group.pos, group.vars, x))
    if li == len(ctx.model.blocks) - 1:  # the readout reads the answer positions only
        return State(new_groups, cols, state.info)
    return State(new_groups + _not_computed(ctx, li, state, need), cols, state.info)


def _not_computed(ctx: CertContext, li: int, state: State, need: np.ndarray) -> list[Group]:
    """The views of the positions layer ``li`` does not compute (no later query reads them; later
    keys and values read only columns no layer up to ``li`` writes, see :func:`_needed_positions`):
    their views before the layer, with every column the layer writes widened to the whole range."""
    pre, W, arith = f"blocks.{li}.", ctx.W, ctx.arith
    writes = np.any(W[pre + "attn.W_O"] != 0, axis=(0, 1)) | (W[pre + "attn.b_O"] != 0)
    writes |= np.any(W[pre + "mlp.W_out"] != 0, axis=0) | (W[pre + "mlp.b_out"] != 0)
    wide = writes[state.cols]
    out = []
    for g in state.groups:
        members = np.flatnonzero(~np.isin(g.pos, need))
        if members.size == 0:
            continue
        lo = np.where(wide, arith.min_raw, np.asarray(g.table.lo)).astype(np.asarray(g.table.lo).dtype)
        hi = np.where(wide, arith.max_raw, np.asarray(g.table.hi)).astype(np.asarray(g.table.hi).dtype)
        out.append(Group(g.pos[members], [v.take(members) for v in g.vars], Box(lo, hi)))
    return out


def _align(need: np.ndarray, residual: list[Group], heads: list[list[tuple[Group, Box]]]) -> list[list[tuple[Group, Box]]]:
    """Split ``need`` into sets of positions covered by one residual group and one output group of
    every head; each set as a list of (group restricted to it, table) parts in the same order."""
    key = np.zeros((need.size, 1 + len(heads)), dtype=np.int64)
    order = np.argsort(need, kind="stable")

    def label(groups: list[Group], col: int) -> None:
        for gi, g in enumerate(groups):
            key[order[np.searchsorted(need, g.pos, sorter=order)], col] = gi

    label(residual, 0)
    for hi, out in enumerate(heads):
        label([g for g, _ in out], 1 + hi)
    ukey, inv = unique_rows(key)
    result = []
    for k in range(ukey.shape[0]):
        positions = need[inv.reshape(-1) == k]
        parts = []
        for col, groups in enumerate([[(g, g.table) for g in residual]] + heads):
            g, t = groups[ukey[k, col]]
            members = np.searchsorted(g.pos, positions) if np.all(np.diff(g.pos) > 0) else \
                np.array([int(np.flatnonzero(g.pos == p)[0]) for p in positions])
            parts.append((Group(positions, [v.take(members) for v in g.vars], t), t))
        result.append(parts)
    return result


def _readout(ctx: CertContext, state: State, task: Any) -> Fraction:
    arith, W, model = ctx.arith, ctx.W, ctx.model
    ci = state.col_index(np.flatnonzero(np.any(W["unembed.W_U"] != 0, axis=1)))
    rows = state.cols[ci]
    spec = task.spec(model)
    margin = None
    for g in state.groups:
        logits = arith.affine(g.table[..., ci], W["unembed.W_U"][rows], W["unembed.b_U"])
        lo, hi = np.asarray(logits.lo).astype(object), np.asarray(logits.hi).astype(object)
        V = lo.shape[-1]
        best = np.argmax(lo, axis=-1)
        ohi = np.where(np.arange(V) == best[..., None], arith.min_raw - 1, hi).max(axis=-1)
        mg = np.take_along_axis(lo, best[..., None], axis=-1)[..., 0] - ohi
        mn = np.min(mg) if mg.size else 0
        if mn <= 0:
            bad = np.argwhere(mg <= 0)[0]
            raise Unproven(f"at position {int(g.pos[0])} the answer is not determined for view assignment "
                           f"{bad.tolist()} (margin {arith.to_fraction(np.array(mn))})",
                           {"positions": [int(g.pos[0])]})
        margin = mn if margin is None else min(margin, mn)
        spec.check(g, best.astype(np.int64), ctx.domains)
    return Fraction(arith.to_fraction(np.array(margin)))


# ------------------------------------------------------------------------------------------------
# counterexample search
# ------------------------------------------------------------------------------------------------


def _search(model: CompiledModel, task: Any, hint: dict, run: Callable) -> tuple[dict | None, str]:
    """Run the task's candidate inputs (planted from the hint first) until one is answered wrong."""
    n = 0
    try:
        for batch in task.candidates(model, hint, CANDIDATES):
            n += len(batch)
            cex = run(model, batch)
            if cex is not None:
                return cex, f"{n} candidate inputs run"
    except (ValueError, IRError) as e:
        return None, f"the counterexample search stopped: {e}"
    except MemoryError:  # an input too large to run here is no answer either way: never a traceback
        return None, f"the counterexample search stopped: out of memory after {n} candidate inputs"
    return None, f"no counterexample among {n} candidate inputs (adversarial, planted and sampled)"
