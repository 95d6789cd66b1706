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

Where runs of positions describe the model -- every head's block has a run certificate, the task
states its inputs and specification as runs, the codes have closed-form histograms -- the same
five steps run over segments instead (:mod:`exactformer.verify.certify.runs`: cost independent of
N); ``details["engine"]`` says which ran, and why not the run certificate.

A failing step raises ``Unproven``; then candidate inputs (the task's adversarial inputs, inputs
planted from the failing step's hint, seeded samples) run through the executor, and the first wrong
answer is returned as a counterexample. Otherwise the result is "unproven" with the reason -- a
failure, never a pass. ``certify`` never raises on a well-formed model. The search stops after
``search_seconds`` (default :data:`SEARCH_SECONDS`), reports its progress through ``progress``
and says what it ran: how many inputs of each kind, in how long, and why it stopped.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.core.proof import CertContext, Unproven
from exactformer.constructions.core.ir import CompiledModel, IRError
from exactformer.constructions.core.pointers import PointerContext
from exactformer.constructions.core.runs import Declined
from exactformer.constructions.core.task import Batch
from exactformer.constructions.core.views import Box, Group, State, initial_groups, unique_rows
from exactformer.constructions.core.views_ops import join_views
from exactformer.precision import Format, float_format
from exactformer.precision.boxes import arithmetic as make_arithmetic
from exactformer.verify.certify import pointer, runs
from exactformer.verify.certify.spec_check import check_spec
from exactformer.verify.certify.layers import (LayerWeights, computes_all, follows_through, layer_image, owners,
                                               readout_table, task_answers, tracked_columns, weight, writes,
                                               written_before)

CANDIDATES = 2048  # inputs the counterexample search runs when a proof step fails
SEARCH_SECONDS = 10.0  # the counterexample search's default time budget (verify's search_seconds)
SEARCH_MAX_TOKENS = 1 << 20  # longer inputs are not run by the search (a failed proof stays "unproven")
SEARCH_BATCH = 256  # candidate inputs run together by the search


@dataclass
class CertificateResult:
    passed: bool
    proved: bool  # passed by proof
    reason: str
    min_margin: Fraction | None  # smallest (correct logit's lower bound - every other's upper bound)
    counterexample: dict | None = None
    details: dict = field(default_factory=dict)
    seconds: float = 0.0


@functools.singledispatch
def certify(model: Any, fmt: Format, task: Any, device: str = "cpu",
            run_candidates: Callable[[Any, Any], dict | None] | None = None,
            progress: Callable[[str], None] | None = None, arithmetic: str | None = None,
            search_seconds: float = SEARCH_SECONDS) -> CertificateResult:
    """Prove ``model`` computes ``task`` on every input, or say why not: the certificate of the
    model's kind (the composed one below for transformers; :mod:`exactformer.verify.certify.recurrent`
    for recurrent models), registered next to each implementation. Never raises on a model."""
    return CertificateResult(False, False, f"unproven: no certificate for a {type(model).__name__}", None)


@certify.register
def certify_transformer(model: CompiledModel, fmt: Format, task: Any, device: str = "cpu",
                        run_candidates: Callable[[CompiledModel, Any], dict | None] | None = None,
                        progress: Callable[[str], None] | None = None, arithmetic: str | None = None,
                        search_seconds: float = SEARCH_SECONDS) -> CertificateResult:
    """Prove ``model`` computes ``task`` on every input, or say why not. ``arithmetic``: "fixed"
    (the fixed-point format ``fmt``, the default for fixed-point formats), "real", or a float dtype
    -- float64, float32, bfloat16, float16, float8_e4m3, float8_e5m2 -- (what torch computes with
    the exported weights on the CPU; see precision/boxes.py)."""
    t0 = time.perf_counter()
    details: dict[str, Any] = {}
    arithmetic = arithmetic or ("fixed" if fmt.is_exact else fmt.name)
    details["arithmetic"] = arithmetic if arithmetic != "fixed" else fmt.name
    try:
        task.check_params(model)
        margin = _prove(model, fmt, task, device, details, progress or (lambda s: None), arithmetic)
        return CertificateResult(True, True, "proved for all inputs", margin, None, _public(details),
                                 time.perf_counter() - t0)
    except Unproven as e:
        reason, hint = e.reason, e.hint
    except (IRError, ValueError) as e:
        reason, hint = f"{type(e).__name__}: {e}", {}
    except KeyError as e:
        reason, hint = f"a field the certificate reads is missing: {e}", {}
    except Exception as e:  # a certificate never raises on a model; a bug here is reported, never a pass
        reason, hint = f"internal error {type(e).__name__}: {e}", {}
    return refuted(model, task, reason, hint, run_candidates, details, t0, search_seconds=search_seconds,
                   progress=progress)


def refuted(model: Any, task: Any, reason: str, hint: dict, run_candidates: Callable | None, details: dict,
            t0: float, candidates: Any = None, search_seconds: float = SEARCH_SECONDS,
            progress: Callable[[str], None] | None = None) -> CertificateResult:
    """The result of a failed proof step (``reason``): the first wrong answer among ``candidates``
    (batches; default the task's, planted from ``hint`` first) as a counterexample, else "unproven";
    the search runs for at most ``search_seconds`` and reports to ``progress``."""
    cex, searched = None, "no counterexample search (no runner)"
    if run_candidates is not None:
        cex, searched = _search(model, task, hint, run_candidates, candidates, search_seconds, progress)
    if cex is not None:
        details["counterexample_search"] = searched
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
    details["spec_check"] = check_spec(task, model)
    arith = make_arithmetic(arithmetic, fmt)
    W = {name: weight(arith, t) for name, t in model.tensors().items()}
    read_fmt = fmt if arithmetic == "fixed" else float_format("float64" if arithmetic == "real" else arithmetic)
    T = task.length(model)
    if T > model.n_ctx:
        raise Unproven(f"the task's inputs have {T} tokens but the model's context is {model.n_ctx}")
    heads = owners(model, W)
    engines = {block.engine for hs in heads.values() for block in hs.values()}
    if "pointers" in engines:  # heads that follow pointers: the pointer certificate (verify/certify/pointer.py)
        if engines != {"pointers"}:
            raise Unproven("the plan mixes heads of the pointer certificate and of the view certificate")
        return pointer.prove(PointerContext(model, arith, W, task.domains(model), T, device, details, fmt=read_fmt),
                             heads, task, progress)
    if arithmetic == "real":
        for emb in (model.embed, model.pos_embed):
            vals = emb.table.distinct_values() + [b.scale for b in emb.blocks]
            if any(Fraction(float(v)) != v for v in vals):
                raise Unproven("the real-arithmetic certificate needs embedding entries that are float64 values")
    written = written_before(model, W)
    found: dict[str, Any] = {"engine": "runs"}  # the run certificate's details, kept unless it declines
    try:  # the run certificate where runs of positions describe the model (verify/certify/runs.py)
        runs.applies(model, heads)
        ctx = runs.RunContext(model, arith, W, task.domain_runs(model), T, device, found, written, spec=task.spec_runs(model))
        return runs.prove(ctx, heads, read_fmt, progress)
    except Declined as e:
        found = {"engine": f"views (no run form: {e})"}
    finally:
        details.update(found)
    domains = task.domains(model)
    answer_pos = model.answer_positions_for(T)
    ctx = CertContext(model, arith, W, domains, T, device, details, written)
    tracked = tracked_columns(model, W, heads)
    details["tracked_columns"] = int(tracked.size)
    if model.vector_input is not None and np.any(np.isin(tracked, np.asarray(model.vector_input.cols))):
        raise Unproven("a view would hold input-vector columns; only blocks that bound the vectors themselves "
                       "(through the task's precondition) may read them")
    E, P = model.embed.raw_reader(read_fmt), model.pos_embed.raw_reader(read_fmt)
    state = State(initial_groups(arith, E, P, domains, np.arange(T), tracked, model.pos_embed.nonzero_columns()[tracked],
                                 model.embed.nonzero_columns()[tracked]), tracked)
    nL = len(model.blocks)
    needs = [np.arange(T) if full else answer_pos for full in computes_all(W, written, nL)]
    for li in range(nL):
        progress(f"layer {li}")
        state = _layer(ctx, li, heads.get(li, {}), state, needs[li])
    progress("readout")
    return _readout(ctx, state, task)


def _layer(ctx: CertContext, li: int, owners_: dict[int, Any], state: State, need: np.ndarray) -> State:
    heads = []  # (head index, its output views)
    for h, block in sorted(owners_.items()):
        if not block.reads_code_axis:
            read = state.col_index(np.intersect1d(np.flatnonzero(block.view_columns(ctx.model, ctx.head_weights(li, h))),
                                                  state.cols))
            if any(g.follows_any(read) for g in state.groups):
                raise Unproven(f"blocks.{li}.attn head {h}: {type(block).__name__} reads a column that follows a "
                               "code-held content pointer")
        heads.append((h, block.certify_head(ctx, li, h, state, need)))
    # the residual's views at the needed positions
    g_of, m_of = state.group_of(need)
    residual = []
    for g in np.unique(g_of):
        sel = g_of == g
        G = state.groups[g]
        residual.append(Group(need[sel], [v.take(m_of[sel]) for v in G.vars], G.table, G.follows))
    # join: residual + every head, position by position
    parts_by_pos = _align(need, residual, [out for _, out in heads])
    lw = LayerWeights.of(ctx.W, li, [h for h, _ in heads], state.cols, state.col_index)
    new_groups = []
    for parts in parts_by_pos:
        follows = _follows(ctx, parts, lw)  # from the parts' columns: the same for every joined group
        for group, tables in join_views(parts):
            new_groups.append(Group(group.pos, group.vars, layer_image(ctx.arith, tables, lw), follows))
    if li == len(ctx.model.blocks) - 1:  # the readout reads the answer positions only
        return State(new_groups, state.cols, state.info)
    return State(new_groups + _not_computed(ctx, li, state, need), state.cols, state.info)


def _follows(ctx: CertContext, parts: list[tuple[Group, Box]], lw: LayerWeights) -> dict[int, np.ndarray]:
    """The coordinates the layer's output columns follow, per code-held pointer of the parts
    (:func:`~exactformer.verify.certify.layers.follows_through`)."""
    uids = {u for g, _ in parts for u in g.follows}
    if not uids:
        return {}
    if not ctx.arith.exact:
        raise Unproven("a code-held content pointer is certified in fixed-point arithmetic only")
    out = {}
    for u in sorted(uids):
        own = [g.follows.get(u, np.full(np.shape(t.lo)[-1], -1, dtype=np.int64)) for g, t in parts]
        heads = np.concatenate(own[1:]) if len(own) > 1 else np.zeros(0, dtype=np.int64)
        f = follows_through(lw, own[0], heads)
        if np.any(f >= 0):
            out[u] = f
    return out


def _not_computed(ctx: CertContext, li: int, state: State, need: np.ndarray) -> list[Group]:
    """The views of the positions layer ``li`` does not compute (no later query reads them; later
    keys and values read only columns no layer up to ``li`` writes, see :func:`_needed_positions`):
    their views before the layer, with every column the layer writes widened to the whole range."""
    arith = ctx.arith
    wide = writes(ctx.W, li)[state.cols]
    out = []
    for g in state.groups:
        members = np.flatnonzero(~np.isin(g.pos, need))
        if members.size == 0:
            continue
        lo = np.where(wide, arith.min_raw, np.asarray(g.table.lo)).astype(np.asarray(g.table.lo).dtype)
        hi = np.where(wide, arith.max_raw, np.asarray(g.table.hi)).astype(np.asarray(g.table.hi).dtype)
        out.append(Group(g.pos[members], [v.take(members) for v in g.vars], Box(lo, hi), g.follows))
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
            parts.append((Group(positions, [v.take(members) for v in g.vars], t, g.follows), t))
        result.append(parts)
    return result


def _readout(ctx: CertContext, state: State, task: Any) -> Fraction:
    arith, W, model = ctx.arith, ctx.W, ctx.model
    ci = state.col_index(np.flatnonzero(np.any(W["unembed.W_U"] != 0, axis=1)))
    rows = state.cols[ci]
    spec = task.spec(model)
    labels = task_answers(model, spec, ctx.T)
    margin = None
    for g in state.groups:
        if g.follows_any(ci):
            raise Unproven(f"at position {int(g.pos[0])} the unembedding reads a column that follows a code-held content "
                           "pointer", {"positions": [int(g.pos[0])]})
        best, mn = readout_table(arith, g.table[..., ci], W["unembed.W_U"][rows], W["unembed.b_U"], int(g.pos[0]))
        margin = mn if margin is None else min(margin, mn)
        spec.check(g, labels[best], ctx.domains)
    return Fraction(arith.to_fraction(np.array(margin)))


# ------------------------------------------------------------------------------------------------
# counterexample search
# ------------------------------------------------------------------------------------------------


def _search(model: Any, task: Any, hint: dict, run: Callable, candidates: Any = None,
            seconds: float = SEARCH_SECONDS, progress: Callable[[str], None] | None = None) -> tuple[dict | None, str]:
    """Run ``candidates`` (default: the task's candidate inputs, planted from the hint first) until
    one is answered wrong or ``seconds`` have passed; say what ran (inputs of each kind, seconds)."""
    T = task.length(model) if candidates is None else 0
    if T > SEARCH_MAX_TOKENS:  # one candidate would hold a residual stream of T rows
        return None, f"no counterexample search: inputs of {T} tokens are longer than the {SEARCH_MAX_TOKENS} it runs"
    if seconds <= 0:
        return None, "no counterexample search (search_seconds is 0)"
    t0, n, tried, report = time.perf_counter(), 0, {}, 1.0

    def ran() -> str:
        kinds = ", ".join(f"{k} {v}" for k, v in tried.items())
        return f"{n} candidate inputs ({kinds}) in {time.perf_counter() - t0:.1f} s"

    try:
        for batch, kinds in _joined(candidates if candidates is not None else task.candidates(model, hint, CANDIDATES)):
            cex = run(model, batch)
            n += len(batch)
            for k, c in kinds:
                tried[k] = tried.get(k, 0) + c
            if cex is not None:
                return cex, f"found among {ran()}"
            elapsed = time.perf_counter() - t0
            if progress is not None and elapsed >= report:
                progress(f"counterexample search: {n} inputs in {elapsed:.0f} s (budget {seconds:g} s)")
                report *= 2
            if elapsed >= seconds:
                return None, (f"no counterexample among {ran()}: the search stopped at its time budget of {seconds:g} s "
                              "(search_seconds, --search-seconds, extends it)")
    except (ValueError, IRError, IndexError, KeyError) as e:  # candidates a corrupted task cannot even make
        return None, f"the counterexample search stopped: {type(e).__name__}: {e}"
    except MemoryError:  # an input too large to run here is no answer either way: never a traceback
        return None, f"the counterexample search stopped: out of memory after {n} candidate inputs"
    if candidates is None and set(tried) <= {"every input", "exhaustive"} and task.count(model) == n:
        return None, f"every one of the {n} inputs is answered right ({time.perf_counter() - t0:.1f} s)"
    return None, f"no counterexample among {ran()}"


def _joined(batches: Any, size: int = SEARCH_BATCH) -> Any:
    """``batches`` joined in order into batches of about ``size`` inputs (tasks plant candidates one or a
    few at a time; one executor run per candidate cost more than the run itself), each with the
    inputs of each kind it holds ([(kind, count)]; a batch naming no kind was planted from the
    failed step's hint). The first wrong answer of a joined batch is the first of the candidates in order."""
    held: list = []
    count = 0
    for b in (part for whole in batches for part in _split(whole, size)):
        if held and (count + len(b) > size or not Batch.joinable(held[-1], b)):
            yield Batch.join(held), [(h.kind or "planted", len(h)) for h in held]
            held, count = [], 0
        held.append(b)
        count += len(b)
    if held:
        yield Batch.join(held), [(h.kind or "planted", len(h)) for h in held]


def _split(batch: Batch, size: int) -> Any:
    """``batch`` in pieces of at most ``size`` inputs (the search's time budget is checked between them)."""
    if len(batch) <= size or not isinstance(batch.tokens, np.ndarray):
        yield batch
        return
    for lo in range(0, len(batch), size):
        yield batch.take(np.arange(lo, min(len(batch), lo + size)))
