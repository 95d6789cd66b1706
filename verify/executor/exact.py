"""The executor: runs a :class:`~exactformer.constructions.core.ir.CompiledModel` under a number format.

The semantics is the plain forward pass of :mod:`exactformer.verify.executor.forward` (every step the
format's operation, in TransformerLens order); this module computes the same logits at the model's
answer positions, bit for bit, with shortcuts that provably change nothing:

* **Live columns.** Only the residual columns that a later read needs are carried (a column that no
  later projection, MLP or unembedding reads cannot change the logits), and each projection
  multiplies only the rows of its weight that are nonzero (zero rows add products that are 0).
* **Answer positions.** The last block is computed only at the answer positions; an earlier block
  at every position when a later block's keys or values read a column it writes, else only at the
  positions the later blocks' queries need (a column no later key or value reads is needed only at
  the positions whose queries read it).
* **Shared logit dims.** Head dims whose query and key both depend on the position alone
  contribute a partial logit sum that is the same for every input: it is computed once per plan
  and added (exactly, then saturated once, as ``fmt.matmul`` sums) to the other dims' sum, which is
  computed per input; if either partial sum saturates, the row is computed whole instead.
* **Vector inputs.** A model with a ``VectorInput`` takes :class:`~exactformer.constructions.core.ir.Inputs`:
  the exact vectors are added to the token embedding's columns (``hook_embed``); a projection that
  reads those columns depends on the input, never on the token or the position alone.
* **Sharing without the input.** In the first block a projection whose weight rows read only
  columns that the token embedding leaves zero depends on the position alone ("shared"); one that
  reads only columns the positional embedding leaves zero depends on the token alone ("per token",
  computed once per distinct token id); in later blocks a projection that reads no column is its
  bias. An attention row whose query and keys are both shared is the same for every input: it is
  computed once per plan and may be held sparse. Rows whose keys are shared but whose query is not
  are computed once per distinct query vector *within one call* (inputs with equal query vectors
  have equal rows) and applied to each input's own values. Nothing that depends on an input is
  kept between calls.
* **Windowed rows.** In fixed point (numpy) a head whose keys are codes is tried through each
  row's window first (:mod:`exactformer.verify.executor.window`): a rounded softmax entry far enough
  below its row's maximum is exactly 0, so a row is formed from the few keys a hash of the query's
  sign pattern names, once every other key is certified 0 from bounds (each pruned key counted as
  the underflow the whole row counts); where that cannot be certified for some row, or a
  precondition fails, the attempt's events are discarded and the rows are formed whole.
* **Sparse rows.** A rounded attention row is applied through its nonzero weights only (zero
  weights give products that are exactly 0); the sum is exact and saturated once, as in
  ``fmt.matmul``.

A plan (raw weights, live columns, shared projections and shared attention rows) is cached under
the model's content fingerprint, the format, the device and the input length.

Backends: numpy on the CPU; torch (``device="cuda"``, or ``"torch-cpu"`` to run the torch code on
the CPU, as the tests do) with the same exact integer results.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.constructions.core.ir import CompiledModel, IRError, split_inputs
from exactformer.precision import FixedPoint, Format, Prepared, cuda_available
from exactformer.verify.executor.window import CodedKeys, Keys, index_keys, window_rows

DEVICES = ("cpu", "cuda", "torch-cpu")
TOKEN_TABLE_ENTRIES = 1 << 24  # per-token tables indexed by token id up to this size (else compacted)
ATTENTION_BLOCK_ENTRIES = 1 << 24  # attention entries per query chunk (rows x keys x inputs)
SPARSE_FRACTION = 8  # a row block is held sparse when at most 1/SPARSE_FRACTION of it is nonzero
PLAN_CACHE_SIZE = 4
RESIDUAL_BUDGET = 1 << 25  # residual entries per batch chunk (inputs x positions x live columns)
WINDOW_ROWS = 1 << 15  # query rows per block of the windowed attention


class ExecutorError(ValueError):
    """Bad arguments to :func:`run` (shapes, token ids, device)."""


@dataclass
class RunResult:
    """Outputs of :func:`run` for B inputs and A answer positions.

    ``logits``: raw values of the format, [B, A, d_vocab_out].
    ``answers``: decoded answers [B][A] (strict argmax; ``None`` where the maximum is tied).
    ``margin``: [B, A] raw: the best logit minus the runner-up (0 on a tie).
    ``counts``: the format's event counts for this run (saturations, underflows).
    """

    logits: np.ndarray
    answers: list[list[Any]]
    margin: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)


def decode_logits(model: CompiledModel, logits: np.ndarray) -> tuple[list[list[Any]], np.ndarray]:
    """Strict argmax decoding of [B, A, V] logits; ties decode to ``None``."""
    B, A, V = logits.shape
    if V == 1:
        return [[model.answers[0]] * A for _ in range(B)], np.full((B, A), np.inf)
    top = np.argmax(logits, axis=-1)  # the first largest, as a stable sort's first
    best = np.take_along_axis(logits, top[..., None], axis=-1)[..., 0]
    low = logits.min()  # the largest of the others: the best replaced by a value no logit is below
    second = np.where(np.arange(V) == top[..., None], low, logits).max(axis=-1)
    margin = best - second
    names = np.empty(V + 1, dtype=object)  # answer i's value at i, None at V (element by element: answers may be tuples)
    for i in range(V):
        names[i] = model.answers[i]
    answers = names[np.where(margin > 0, top, V)].tolist()  # index V: None on a tie
    return answers, margin


def logits_memory(B: int, A: int, V: int, itemsize: int) -> int:
    """Bytes the [B, A, V] logits of one call hold at their peak: the parts and their concatenation,
    then :func:`decode_logits`'s copy (``np.where``) and its mask -- three arrays of ``itemsize``
    and one of bools (k-hop answers at every position over N + 1 answers: 134 MB per input at
    N = 4096 in int64, more than the rest of the run)."""
    return B * A * V * (3 * itemsize + 1)


@functools.singledispatch
def run(model: Any, tokens: Any, fmt: Format, device: str = "cpu", batch_size: int | None = None) -> RunResult:
    """Run ``model`` on token ids ``tokens`` [B, T] (or [T]) under ``fmt``: the executor of the model's
    kind (the transformer's below, :mod:`exactformer.verify.executor.recurrent` for recurrent models),
    registered next to each implementation."""
    raise ExecutorError(f"no executor for a {type(model).__name__}")


@functools.singledispatch
def memory_estimate(model: Any, fmt: Format, T: int, batch: int, device: str = "cpu") -> int:
    """Bytes :func:`run` holds at its peak on ``batch`` inputs of length ``T`` (besides the inputs
    themselves), estimated from the executor's own budgets: the estimate of the model's kind; 0 for a
    kind that registers none (an EMA program's run holds its inputs' size)."""
    return 0


@memory_estimate.register
def _memory_transformer(model: CompiledModel, fmt: Format, T: int, batch: int, device: str = "cpu") -> int:
    return plan_for(model, fmt, device, T).memory(batch)


@run.register
def run_transformer(model: CompiledModel, tokens: Any, fmt: Format, device: str = "cpu",
                    batch_size: int | None = None, progress: Any = None) -> RunResult:
    """Run ``model`` on token ids ``tokens`` [B, T] (or [T]) under ``fmt``.

    ``T`` must not exceed ``model.n_ctx``; ids must lie in ``[0, model.d_vocab)``. A model with a
    ``vector_input`` takes :class:`~exactformer.constructions.core.ir.Inputs` (token ids and exact
    vectors, which must be representable in ``fmt``). Returns the logits at the model's answer
    positions (see :class:`RunResult`). ``batch_size`` bounds the inputs processed at once
    (default: chosen so the live residual stays near 2^25 entries); ``progress(k)`` is called with
    the k inputs of each part done.
    """
    try:
        tokens, vectors = split_inputs(model, tokens)
    except IRError as e:
        raise ExecutorError(str(e)) from None
    if tokens.ndim == 1:
        tokens = tokens[None, :]
        vectors = None if vectors is None else vectors[None]
    if tokens.ndim != 2 or not (np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0):
        raise ExecutorError(f"tokens must be an integer array [B, T], got dtype {tokens.dtype} shape {tokens.shape}")
    if tokens.dtype.itemsize > 8 or not np.issubdtype(tokens.dtype, np.signedinteger):
        tokens = tokens.astype(np.int64)
    B, T = tokens.shape
    if not 1 <= T <= model.n_ctx:
        raise ExecutorError(f"sequence length T={T} must lie in [1, n_ctx={model.n_ctx}]")
    if B and (tokens.min() < 0 or tokens.max() >= model.d_vocab):
        raise ExecutorError(f"token ids must lie in [0, d_vocab={model.d_vocab})")
    vec = None
    if vectors is not None:
        try:
            vec = vectors.raw(fmt)  # [B, T, width], checked exact in fmt
        except IRError as e:
            raise ExecutorError(f"input vectors: {e}") from None
    plan = plan_for(model, fmt, device, T)
    plan.fmt = fmt  # a plan is shared by equal formats; events are counted on the caller's object
    if batch_size is None:
        batch_size = max(1, RESIDUAL_BUDGET // max(1, plan.entries_per_input))
    fmt.reset_counts()
    parts = []
    for s in range(0, B, batch_size):
        parts.append(plan.be.get(plan.forward(tokens[s : s + batch_size], None if vec is None else vec[s : s + batch_size])))
        if progress is not None:
            progress(min(B, s + batch_size) - s)
    logits = np.concatenate(parts, axis=0) if parts else np.zeros((0, plan.answer_pos.size, len(model.answers)), np.int64)
    answers, margin = decode_logits(model, logits)
    return RunResult(logits, answers, margin, fmt.counts.as_dict())


_PLAN_CACHE: "OrderedDict[tuple, _Plan]" = OrderedDict()


def plan_for(model: CompiledModel, fmt: Format, device: str, T: int) -> "_Plan":
    """The input-independent precomputation for (model content, format, device, length)."""
    key = (model.fingerprint(), fmt.name, device, T)
    plan = _PLAN_CACHE.get(key)
    if plan is None:
        plan = _Plan(model, fmt, _Backend(device, fmt.is_exact), T)
        _PLAN_CACHE[key] = plan
        while len(_PLAN_CACHE) > PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    _PLAN_CACHE.move_to_end(key)
    return plan


# ---------------------------------------------------------------------------------------------
# backend shim: numpy, or torch on CPU/CUDA; the format's ops accept either
# ---------------------------------------------------------------------------------------------


class _Backend:
    def __init__(self, device: str, exact: bool):
        if device not in DEVICES:
            raise ExecutorError(f"device must be one of {DEVICES}, got {device!r}")
        self.device = device
        self.torch = device != "cpu"
        if self.torch:
            if device == "cuda" and not cuda_available():
                raise ExecutorError("device='cuda' requested but torch.cuda.is_available() is False")
            import torch

            self.t = torch
            self.tdev = torch.device("cuda" if device == "cuda" else "cpu")

    def put(self, a):
        if not self.torch:
            return np.asarray(a)
        a = np.ascontiguousarray(a)
        if a.dtype.kind in "iu" and a.dtype != np.int64:
            a = a.astype(np.int64)  # torch indexes with int64
        return self.t.as_tensor(a, device=self.tdev)

    def get(self, a) -> np.ndarray:
        return a.detach().cpu().numpy() if self.torch else np.asarray(a)

    def cat(self, arrays, axis: int):
        return self.t.cat(list(arrays), dim=axis) if self.torch else np.concatenate(arrays, axis=axis)

    def swap(self, a):
        return a.transpose(-1, -2) if self.torch else np.swapaxes(a, -1, -2)

    def zeros(self, shape, like):
        return self.t.zeros(shape, dtype=like.dtype, device=like.device) if self.torch else np.zeros(shape, like.dtype)

    def expand(self, a, B: int):
        return a.expand(B, *a.shape[1:]) if self.torch else np.broadcast_to(a, (B,) + a.shape[1:])

    def repeat(self, a, counts):
        return self.t.repeat_interleave(a, counts) if self.torch else np.repeat(a, counts)

    def cumsum0(self, a, axis: int):
        """Exact cumulative sums along ``axis`` with a leading 0 (int64)."""
        if self.torch:
            c = self.t.cumsum(a, dim=axis)
            pad = list(c.shape)
            pad[axis] = 1
            return self.t.cat([self.t.zeros(pad, dtype=c.dtype, device=c.device), c], dim=axis)
        c = np.cumsum(a, axis=axis)
        pad = list(c.shape)
        pad[axis] = 1
        return np.concatenate([np.zeros(pad, dtype=c.dtype), c], axis=axis)

    def unique_rows(self, a):
        """(unique rows, inverse) of a 2-D integer array."""
        if self.torch:
            u, inv = self.t.unique(a, dim=0, return_inverse=True)
            return u, inv
        u, inv = np.unique(a, axis=0, return_inverse=True)
        return u, inv.reshape(-1)


def _at(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """tokens[:, positions] for strictly increasing ``positions`` (every caller's: query, key and
    answer positions), a view when they are a contiguous range (then the ends say so)."""
    if positions.size and positions[-1] - positions[0] == positions.size - 1:
        return tokens[:, int(positions[0]) : int(positions[-1]) + 1]
    return tokens[:, positions]


def _unique_ids(ids: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(ids, return_inverse=True) for ids in [0, size): without sorting (O(ids + size)), or
    by sorting when the ids are few beside the range."""
    if ids.size * 16 < size:
        uniq, inv = np.unique(ids, return_inverse=True)
        return uniq, inv.reshape(ids.shape)
    present = np.zeros(size, dtype=bool)
    present[ids.reshape(-1)] = True
    uniq = np.flatnonzero(present)
    lut = np.zeros(size, dtype=np.int64)
    lut[uniq] = np.arange(uniq.size)
    return uniq, lut[ids]


# ---------------------------------------------------------------------------------------------
# projections and attention rows
# ---------------------------------------------------------------------------------------------


@dataclass
class _Proj:
    """A projection at some positions, held as cheaply as its dependence allows:
    ``shared`` [1, P, d] (position only), ``token`` table [U, d] with ``idx`` [B, P], or ``full``
    [B, P, d]."""

    kind: str
    arr: Any
    idx: Any = None

    def dense(self, be: _Backend, B: int):
        if self.kind == "shared":
            return be.expand(self.arr, B)
        if self.kind == "token":
            return self.arr[self.idx]
        return self.arr

    def operand(self, be: _Backend, B: int):
        """A right operand for matmul against [B, R, T] rows: shared values as one [P, d] matrix
        (broadcast by matmul, never materialised B times), else :meth:`dense`."""
        return self.arr[0] if self.kind == "shared" else self.dense(be, B)

    def rows_at(self, be: _Backend, b, cols):
        """Values at (input b[i], position cols[i]) -> [len, d] (b, cols backend int arrays)."""
        if self.kind == "shared":
            return self.arr[0][cols]
        if self.kind == "token":
            return self.arr[self.idx[b, cols]]
        return self.arr[b, cols]


@dataclass
class _Rows:
    """Attention rows: dense [R, T] raw weights, or CSR (starts [R+1], cols, vals)."""

    dense: Any = None
    starts: Any = None
    cols: Any = None
    vals: Any = None


class _Plan:
    """Input-independent precomputation for one (model, format, device, length)."""

    def __init__(self, model: CompiledModel, fmt: Format, be: _Backend, T: int):
        self.model, self.fmt, self.be, self.T = model, fmt, be, T
        self.answer_pos = model.answer_positions_for(T)
        if np.any(np.diff(self.answer_pos) <= 0):  # every position array here is strictly increasing
            raise ExecutorError(f"answer positions must be strictly increasing, got {list(self.answer_pos[:8])}")
        self.e_cols = model.embed.nonzero_columns()
        self.p_cols = model.pos_embed.nonzero_columns()
        self.v_cols = np.zeros(model.d_model, dtype=bool)  # columns that input vectors fill
        if model.vector_input is not None:
            self.v_cols[np.asarray(model.vector_input.cols)] = True
            self.e_cols = self.e_cols | self.v_cols
        self.P = model.pos_embed.raw_reader(fmt)  # (positions, cols) -> raw rows, generated on demand
        self.E = model.embed.raw_reader(fmt)  # (token ids, cols) -> raw rows
        self.layers = [self._prepare(b.attn, b.mlp) for b in model.blocks]
        self._live_columns()
        self._live_positions()
        self._shared_dims()
        self.W_U = be.put(model.W_U.raw(fmt)[self.live_out[-1]])
        self.b_U = be.put(model.b_U.raw(fmt))
        self.entries_per_input = T * (4 + max(self._materialised_width(li) for li in range(len(self.layers))))
        self._shared_proj: dict[tuple, Any] = {}
        self._shared_rows: dict[tuple, _Rows] = {}
        self._token_tables: dict[tuple, Any] = {}
        self._prepared: dict[int, tuple] = {}  # id(shared keys) -> (keys, Prepared); the keys are held
        # the windowed attention (verify/executor/window.py): numpy fixed point with an exp zero
        self._d0 = fmt.exp_zero_below() if isinstance(fmt, FixedPoint) and not be.torch else None
        self._key_index: dict[tuple, Any] = {}  # per (layer, head): shared keys' index; values free of events

    def memory(self, batch: int) -> int:
        """Bytes a call on ``batch`` inputs holds at its peak (besides the token ids), from the
        budgets it runs under: a part of the batch whose live residual stays near
        :data:`RESIDUAL_BUDGET` entries and an attention block of :data:`ATTENTION_BLOCK_ENTRIES`,
        each with a few int64 temporaries. A one-block model whose heads read their keys through
        windows (numpy fixed point) holds per input only its answer positions' rows, never T."""
        part = min(batch, max(1, RESIDUAL_BUDGET // max(1, self.entries_per_input)))
        per_input = self.entries_per_input
        if self._d0 is not None and all(pos.size < self.T for pos in self.block_pos):
            per_input = per_input // self.T * int(self.answer_pos.size)
        return 8 * 4 * (part * per_input + ATTENTION_BLOCK_ENTRIES) + \
            logits_memory(batch, int(self.answer_pos.size), len(self.model.answers), 8)

    @functools.cached_property
    def allpos(self) -> np.ndarray:
        """Every position 0 .. T-1, formed when a block or a head needs them (a one-block model
        answering at a few positions through windowed rows never does: Index Lookup at N = 2^30)."""
        a = np.arange(self.T)
        a.flags.writeable = False
        return a

    # ---- structure ----------------------------------------------------------------------------
    def _prepare(self, attn, mlp) -> dict[str, Any]:
        fmt = self.fmt
        L: dict[str, Any] = {"causal": attn.causal, "H": attn.n_heads}
        for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
            L[w] = getattr(attn, w).raw(fmt)
        L["reads"] = {w: [np.flatnonzero(np.any(getattr(attn, w).num[h] != 0, axis=1)) for h in range(attn.n_heads)]
                      for w in ("W_Q", "W_K", "W_V")}
        # value dims that are identically zero (weights and bias) are dropped per head
        L["v_dims"] = [np.flatnonzero(np.any(attn.W_V.num[h] != 0, axis=0) | (attn.b_V.num[h] != 0))
                       for h in range(attn.n_heads)]
        W_O = attn.W_O.raw(fmt)
        L["W_O_cat"] = np.concatenate([W_O[h][L["v_dims"][h]] for h in range(attn.n_heads)], axis=0)
        L["b_O"] = attn.b_O.raw(fmt)
        for w in ("W_in", "b_in", "W_out", "b_out"):
            L[w] = getattr(mlp, w).raw(fmt)
        L["mlp_reads"] = np.flatnonzero(np.any(mlp.W_in.num != 0, axis=1))
        return L

    def _live_columns(self) -> None:
        """Columns needed at each block's input, middle and output (a column no later read needs
        cannot change the logits)."""
        need = np.flatnonzero(np.any(self.model.W_U.num != 0, axis=1))
        self.live_in, self.live_mid, self.live_out = [], [], []
        for L in reversed(self.layers):
            mid = np.union1d(need, L["mlp_reads"])
            reads = np.concatenate([np.concatenate(L["reads"][w]) for w in ("W_Q", "W_K", "W_V")] + [mid])
            self.live_out.insert(0, need)
            self.live_mid.insert(0, mid)
            self.live_in.insert(0, np.unique(reads).astype(np.int64))
            need = self.live_in[0]
        # columns written by the blocks before each block (the rest still hold embedding values)
        self.written, acc = [], np.zeros(self.model.d_model, dtype=bool)
        for blk in self.model.blocks:
            self.written.append(acc.copy())
            a, m = blk.attn, blk.mlp
            acc |= np.any(a.W_O.num != 0, axis=(0, 1)) | (a.b_O.num != 0)
            acc |= np.any(m.W_out.num != 0, axis=0) | (m.b_out.num != 0)
        be = self.be
        for li, L in enumerate(self.layers):
            L["W_O_mid"] = be.put(L["W_O_cat"][:, self.live_mid[li]])
            L["b_O_mid"] = be.put(L["b_O"][self.live_mid[li]])
            rows = L["mlp_reads"]
            L["W_in_r"], L["b_in_t"] = be.put(L["W_in"][rows]), be.put(L["b_in"])
            L["mlp_pos"] = be.put(np.searchsorted(self.live_mid[li], rows))
            L["W_out_o"], L["b_out_o"] = be.put(L["W_out"][:, self.live_out[li]]), be.put(L["b_out"][self.live_out[li]])
            L["mid_from_in"] = be.put(np.searchsorted(self.live_in[li], self.live_mid[li]))
            L["out_from_mid"] = be.put(np.searchsorted(self.live_mid[li], self.live_out[li]))

    def _live_positions(self) -> None:
        """``block_pos[li]``: the positions at which block li is computed (see the module
        docstring): the answer positions for the last block; for an earlier block the positions
        of the next one, or every position when a later key or value reads a column it writes."""
        nL, T = len(self.layers), self.T
        self.block_pos = [self.answer_pos] * nL
        for li in range(nL - 2, -1, -1):
            L = self.layers[li + 1]
            kv = np.concatenate([np.concatenate(L["reads"][w]) for w in ("W_K", "W_V")]).astype(np.int64)
            if np.any(self.written[li + 1][kv]) or self.block_pos[li + 1].size == T:
                self.block_pos[li] = self.allpos
            else:
                self.block_pos[li] = self.block_pos[li + 1]

    def _shared_dims(self) -> None:
        """Per head: (dims whose query and key both depend on the position only, the other dims), or
        None when the head has no such split (all dims shared, or none)."""
        for li, L in enumerate(self.layers):
            L["qk_split"] = []
            for h in range(L["H"]):
                shared = np.array([self._source(li, np.flatnonzero(L["W_Q"][h][:, d] != 0)) == "shared"
                                   and self._source(li, np.flatnonzero(L["W_K"][h][:, d] != 0)) == "shared"
                                   for d in range(L["W_Q"].shape[2])], dtype=bool)
                used = np.any(L["W_Q"][h] != 0, axis=0) | (L["b_Q"][h] != 0)
                used &= np.any(L["W_K"][h] != 0, axis=0) | (L["b_K"][h] != 0)
                sd, od = np.flatnonzero(shared & used), np.flatnonzero(~shared & used)
                L["qk_split"].append((sd, od) if sd.size and od.size else None)

    def _source(self, li: int, rows: np.ndarray) -> str:
        """How a projection reading residual ``rows`` at block ``li`` depends on the input: "shared"
        (position only, or its bias when it reads nothing), "token" (token only), "embed" (the
        embedding at each position) or "resid" (the residual stream). Columns that no earlier
        block writes still hold their embedding values, so the first three apply to them too."""
        if rows.size == 0:
            return "shared"
        if np.any(self.written[li][rows]):
            return "resid"
        if np.any(self.v_cols[rows]):
            return "embed"  # input vectors: neither the token nor the position alone
        if not np.any(self.e_cols[rows]):
            return "shared"
        if not np.any(self.p_cols[rows]):
            return "token"
        return "embed"

    def _materialised_width(self, li: int) -> int:
        """Residual columns held per input and position in block ``li`` (projections computed from
        the embedding or the residual, and the residual itself after the first block); shared and
        per-token projections hold no such array."""
        L = self.layers[li]
        held = len(self.block_pos[li - 1]) if li > 0 else 0  # positions the residual is held at
        width = len(self.live_in[li]) * held // self.T if li > 0 else 0
        for w in ("W_Q", "W_K", "W_V"):
            for h, rows in enumerate(L["reads"][w]):
                split = L["qk_split"][h] if w != "W_V" else None
                if split is not None:  # only the other dims are materialised per input
                    rows = rows[np.any(L[w][h][rows][:, split[1]] != 0, axis=1)]
                if self._source(li, rows) in ("embed", "resid"):
                    width = max(width, len(rows))
        return width

    def _affine(self, x, W, b):
        """add(x @ W, b) for x [..., n] (n may be 0: then the bias, broadcast)."""
        fmt, be = self.fmt, self.be
        if x.shape[-1] == 0:
            return fmt.add(be.zeros(tuple(x.shape[:-1]) + (W.shape[-1],), b), b)
        return fmt.add(fmt.matmul(x, W), b)

    # ---- the forward pass ---------------------------------------------------------------------
    def forward(self, tokens: np.ndarray, vec: np.ndarray | None = None):
        self._vec = vec  # this call's input vectors [B, T, width] (raw) or None, dropped on return
        try:
            return self._forward(tokens)
        finally:
            self._vec = None

    def _forward(self, tokens: np.ndarray):
        fmt, be = self.fmt, self.be
        x = None  # live residual [B, len(block_pos[li-1]), live_in[li]] for li >= 1
        for li, L in enumerate(self.layers):
            q_pos = self.block_pos[li]
            z = be.cat([self._head(li, L, h, tokens, x, q_pos) for h in range(L["H"])], axis=-1)
            x_mid = fmt.add(self._residual(li, tokens, x, q_pos), self._affine(z, L["W_O_mid"], L["b_O_mid"]))
            pre = self._affine(x_mid[..., L["mlp_pos"]], L["W_in_r"], L["b_in_t"])
            mlp = self._affine(fmt.relu(pre), L["W_out_o"], L["b_out_o"])
            x = fmt.add(x_mid[..., L["out_from_mid"]], mlp)  # [B, Q, live_out] = the next live_in
        return self._affine(x, self.W_U, self.b_U)  # [B, A, V]

    def _embedded(self, tokens: np.ndarray, positions: np.ndarray, cols: np.ndarray):
        """add(E[token], P[position]) on ``cols`` at ``positions``: [B, len(positions), len(cols)]."""
        be = self.be
        uniq, inv = _unique_ids(_at(tokens, positions), self.model.d_vocab)
        E = be.put(self.E(uniq, cols))[be.put(inv)]
        vin = self.model.vector_input
        if vin is not None and np.any(self.v_cols[cols]):  # hook_embed = W_E[token] + vector (exact add)
            at = np.flatnonzero(self.v_cols[cols])
            src = cols[at] - vin.col
            vals = _at(self._vec, positions)
            if not (src.size == vals.shape[-1] and np.array_equal(src, np.arange(src.size))):
                vals = vals[..., src]
            run = at.size == at[-1] - at[0] + 1  # E is a fresh array (a gather): written in place
            sel = slice(int(at[0]), int(at[-1]) + 1) if run else be.put(at)
            E[..., sel] = self.fmt.add(E[..., sel], be.put(vals))
        return self.fmt.add(E, be.put(self.P(positions, cols))[None])

    def _residual(self, li: int, tokens: np.ndarray, x, q_pos: np.ndarray):
        """The block input at the query positions, on the block's middle columns."""
        if li == 0:
            return self._embedded(tokens, q_pos, self.live_mid[0])
        return self._resid_at(li, x, q_pos)[..., self.layers[li]["mid_from_in"]]

    def _resid_at(self, li: int, x, positions: np.ndarray):
        """Block li's input residual ``x`` (held at ``block_pos[li - 1]``) at ``positions``."""
        held = self.block_pos[li - 1]
        if positions.size == held.size and np.array_equal(positions, held):
            return x
        return x[:, self.be.put(np.searchsorted(held, positions))]

    def _proj(self, li: int, L, h: int, which: str, tokens: np.ndarray, x, positions: np.ndarray,
              dims: np.ndarray | None = None) -> _Proj:
        be = self.be
        rows, Wr, bb, mono = self._proj_weights(L, li, h, which, dims)
        src = self._source(li, rows)
        B = tokens.shape[0]
        if src == "shared":
            key = (li, h, which, positions.tobytes(), None if dims is None else dims.tobytes())
            if key not in self._shared_proj:
                self._shared_proj[key] = self._counted(
                    lambda: self._project(be.put(self.P(positions, rows))[None], Wr, bb, mono))
            val, delta = self._shared_proj[key]
            self._charge(delta, B)
            return _Proj("shared", val)
        if src == "token":
            return self._token_proj(li, h, which, dims, _at(tokens, positions), rows, Wr, bb)
        if src == "embed":
            return _Proj("full", self._project(self._embedded(tokens, positions, rows), Wr, bb, mono))
        xs = self._resid_at(li, x, positions)
        return _Proj("full", self._project(xs[..., be.put(np.searchsorted(self.live_in[li], rows))], Wr, bb, mono))

    def _proj_weights(self, L, li: int, h: int, which: str, dims: np.ndarray | None) -> tuple:
        """(rows read, W[rows] and b on the backend) of a projection, restricted to ``dims``; kept
        in the plan (input-independent)."""
        key = ("weights", li, h, which, None if dims is None else dims.tobytes())
        if key not in self._shared_proj:
            rows = L["reads"]["W_" + which][h]
            W, b = L["W_" + which][h], L["b_" + which][h]
            if dims is not None:
                W, b = W[rows][:, dims], b[dims]
                keep = np.any(W != 0, axis=1)
                rows, W = rows[keep], W[keep]
            else:
                W = W[rows]
            self._shared_proj[key] = (rows, self.be.put(W), self.be.put(b), self._monomial(W))
        return self._shared_proj[key]

    def _monomial(self, W: np.ndarray) -> tuple | None:
        """(source row, weight) per column when every column of W has at most one nonzero entry: then
        x @ W + b is add(mul(x[..., source], weight), b) exactly (a sum of one rounded product,
        saturated once, is that product; the zero weights' products are 0 and count no event)."""
        if W.ndim != 2 or 0 in W.shape or np.any(np.count_nonzero(W, axis=0) > 1):
            return None
        src = np.argmax(W != 0, axis=0)
        return self.be.put(src), self.be.put(W[src, np.arange(W.shape[1])])

    def _project(self, x, Wr, bb, mono):
        """add(x @ Wr, bb), through :meth:`_monomial` when it applies."""
        if mono is None or x.shape[-1] == 0:
            return self._affine(x, Wr, bb)
        return self.fmt.add(self.fmt.mul(x[..., mono[0]], mono[1]), bb)

    def _token_proj(self, li, h, which, dims, ids: np.ndarray, rows, Wr, bb) -> _Proj:
        """A projection that depends on the token only: a table over token ids, each row charged
        once per occurrence. The table over the whole vocabulary is kept in the plan when it is
        small and computing it counted no event (then occurrences need not be counted at all)."""
        be = self.be
        key = (li, h, which, None if dims is None else dims.tobytes())
        V = self.model.d_vocab
        if key not in self._token_tables and V * int(Wr.shape[1]) <= TOKEN_TABLE_ENTRIES:
            table, delta = self._counted(lambda: self._affine(be.put(self.E(np.arange(V), rows)), Wr, bb))
            self._token_tables[key] = table if delta == (0, 0) else None
        table = self._token_tables.get(key)
        if table is not None:
            return _Proj("token", table, be.put(ids))
        mult = np.bincount(ids.reshape(-1), minlength=V)
        uniq, ids = _unique_ids(ids, V)
        table = self._per_multiplicity(mult[uniq], lambda sel: self._affine(
            be.put(self.E(uniq[be.get(sel)], rows)), Wr, bb))
        return _Proj("token", table, be.put(ids))

    def _head(self, li: int, L, h: int, tokens: np.ndarray, x, q_pos: np.ndarray):
        """The head's output z [B, len(q_pos), |v_dims|]."""
        be = self.be
        B = tokens.shape[0]
        if L["v_dims"][h].size == 0:  # the head writes nothing
            return be.put(np.zeros((B, q_pos.size, 0), dtype=np.int64 if self.fmt.is_exact else np.float64))
        for attempt, applies in ((self._window_head, self._d0 is not None), (self._head_split, L["qk_split"][h] is not None)):
            out = self._attempt(attempt, li, L, h, tokens, x, q_pos) if applies else None
            if out is not None:
                return out
        k = self._proj(li, L, h, "K", tokens, x, self.allpos)
        v = self._proj(li, L, h, "V", tokens, x, self.allpos, dims=L["v_dims"][h])
        outs = []
        # query rows in chunks so an attention block stays near ATTENTION_BLOCK_ENTRIES entries
        per_row = self.T * (1 if k.kind == "shared" else B)
        chunk = max(1, ATTENTION_BLOCK_ENTRIES // per_row)
        for c0 in range(0, q_pos.size, chunk):
            qp = q_pos[c0 : c0 + chunk]
            q = self._proj(li, L, h, "Q", tokens, x, qp)
            if q.kind == "shared" and k.kind == "shared":
                rows = self._shared_rows_for(li, h, qp, q, k, L["causal"], B)
                outs.append(self._apply_shared(rows, v, B))
            elif k.kind == "shared":
                outs.append(self._grouped(q, k, v, qp, L["causal"], B))
            else:
                outs.append(self._dense(q, k, v, qp, L["causal"], B))
        return outs[0] if len(outs) == 1 else be.cat(outs, axis=1)

    def _attempt(self, method, *args):
        """``method(*args)``, a faster way to the head's output (windowed rows, split logits); where
        it gives up (None) the events it counted are discarded, since the output is then computed
        whole and counts them again."""
        c = self.fmt.counts
        before = (c.saturations, c.underflows)
        out = method(*args)
        if out is None:
            c.saturations, c.underflows = before
        return out

    def _window_head(self, li: int, L, h: int, tokens: np.ndarray, x, q_pos: np.ndarray):
        """The head's output through each row's window (module docstring of
        :mod:`exactformer.verify.executor.window`), bit for bit the whole rows' result with the same
        events, or None when a row's window cannot be certified (then the rows are formed whole).
        The projections are those the whole computation makes (the other dims' and, where the
        head splits, the shared dims' partial logits, which must be the same for every query)."""
        fmt, be = self.fmt, self.be
        B = tokens.shape[0]
        split = L["qk_split"][h]
        dims = None if split is None else split[1]
        kinds = [self._source(li, self._proj_weights(L, li, h, w, dims)[0]) for w in ("Q", "K")]
        if kinds == ["shared", "shared"]:
            return None  # rows shared by every input: formed once per plan
        p = None
        if split is not None:
            k_sh = self._proj(li, L, h, "K", tokens, x, self.allpos, dims=split[0])
            q_sh = self._proj(li, L, h, "Q", tokens, x, q_pos, dims=split[0])
            if q_sh.kind != "shared" or k_sh.kind != "shared" or np.any(q_sh.arr[0] != q_sh.arr[0][:1]):
                return None
            row, delta = self._counted(lambda: fmt.matmul(q_sh.arr[0][:1], be.swap(k_sh.arr[0])))
            if delta != (0, 0) or row.dtype == object:
                return None
            p = row[0]
        index = self._shared_keys(li, L, h, dims, p) if kinds[1] == "shared" else None
        if index is None:
            k = self._proj(li, L, h, "K", tokens, x, self.allpos, dims=dims)
            index = index_keys(np.asarray(k.dense(be, B)), p) if k.kind != "shared" else None
        if index is None:
            return None
        q = self._proj(li, L, h, "Q", tokens, x, q_pos, dims=dims).dense(be, B)
        R = q_pos.size
        rows = np.asarray(q).reshape(B * R, -1)
        b_of_row = np.repeat(np.arange(B), R)
        last = np.tile(q_pos if L["causal"] else np.full(R, self.T - 1), B)
        vd = L["v_dims"][h]
        # values at the candidates only where no position's value can count an event (else at every
        # position, as the whole rows do, so that the counts are theirs)
        v = None if self._token_free(li, L, h, vd) else self._proj(li, L, h, "V", tokens, x, self.allpos, dims=vd)
        dv = vd.size
        out = []
        for r0 in range(0, B * R, WINDOW_ROWS):
            sl = slice(r0, r0 + WINDOW_ROWS)
            win = window_rows(index, rows[sl], b_of_row[sl], last[sl], p, fmt.scale, fmt.max_raw, fmt.min_raw,
                              self._d0)
            if win is None:
                return None
            a = fmt.softmax(win.logits, axis=-1)  # the candidates' weights, events counted
            fmt.counts.underflows += int(win.pruned.sum()) - int(np.count_nonzero(~win.ok))
            N, K = win.pos.shape
            bsel, psel = np.repeat(b_of_row[sl], K), win.pos.reshape(-1)
            if v is None:  # per-token values at the positions the windows read
                at = np.unique(psel)
                vals = self._proj(li, L, h, "V", tokens, x, at, dims=vd).rows_at(be, bsel, np.searchsorted(at, psel))
            else:
                vals = v.rows_at(be, bsel, psel)
            vals = vals.reshape(N, K, dv)
            out.append(fmt.matmul(a[:, None, :], vals)[:, 0])
        return np.concatenate(out, axis=0).reshape(B, R, dv)

    def _token_free(self, li: int, L, h: int, dims) -> bool:
        """Whether the head's value projection depends on the token alone and counts no event for any
        token: each product of an embedding value and a weight exact (a multiple of the scale, from
        the gcd of the column's values: its table entries and code block magnitudes) and no sum
        able to saturate (from the columns' largest values). Kept in the plan."""
        key = ("free", li, h)
        if key not in self._key_index:
            rows, Wr, bb, _ = self._proj_weights(L, li, h, "V", dims)
            free = self._source(li, rows) == "token" and self.model.vector_input is None
            if free:
                E = self.model.embed
                vals = [np.abs(E.table.raw(self.fmt)[:, rows]).astype(object)] if E.table.shape[0] else []
                for b in E.blocks:
                    m = abs(int(self.fmt.quantize(np.array([b.scale], dtype=object))[0]))
                    inside = (rows >= b.col) & (rows < b.col + b.code.k)
                    vals.append(np.where(inside, m, 0)[None].astype(object))
                A = np.concatenate(vals, axis=0) if vals else np.zeros((1, rows.size), dtype=object)
                g = np.array([int(np.gcd.reduce(A[:, i].astype(np.int64))) for i in range(rows.size)], dtype=object)
                W = np.asarray(Wr).astype(object)
                exact = not np.any((g[:, None] * W) % self.fmt.scale != 0)
                reach = (A.max(axis=0)[:, None] * np.abs(W)).sum(axis=0) // self.fmt.scale + np.abs(np.asarray(bb))
                free = exact and int(reach.max(initial=0)) <= self.fmt.max_raw
            self._key_index[key] = free
        return self._key_index[key]

    def _shared_keys(self, li: int, L, h: int, dims, p) -> Keys | None:
        """The index of keys that depend on the position only, kept in the plan: a position code
        read from the embedding's generator (:class:`CodedKeys`: no key is formed), else the keys
        formed once and grouped (:func:`index_keys`)."""
        key = (li, h)
        if key not in self._key_index:
            rows, Wr, bb, _ = self._proj_weights(L, li, h, "K", dims)
            index = CodedKeys.from_embedding(self.model.pos_embed, rows, np.asarray(Wr), np.asarray(bb),
                                             self.fmt.scale, self.fmt.max_raw, self.P)
            if index is None:
                k, delta = self._counted(lambda: self._proj(li, L, h, "K", np.zeros((1, self.T), np.int64), None,
                                                            self.allpos, dims=dims))
                index = index_keys(np.asarray(k.arr), p) if delta == (0, 0) else None
            self._key_index[key] = index
        return self._key_index[key]

    # ---- attention rows -------------------------------------------------------------------------
    def _softmax_rows(self, logits, qp: np.ndarray, causal: bool):
        """Rounded softmax of logit rows [..., R, T] (row r is query position qp[r])."""
        fmt, be = self.fmt, self.be
        if not causal:
            return fmt.softmax(logits, axis=-1)
        out = be.zeros(tuple(logits.shape), logits)
        for r, t in enumerate(qp):
            out[..., r, : t + 1] = fmt.softmax(logits[..., r, : t + 1], axis=-1)
        return out

    def _to_rows(self, a) -> _Rows:
        """Dense [R, T] rows, held sparse when at most 1/SPARSE_FRACTION of the weights are nonzero."""
        be = self.be
        if be.torch:
            nz = a.nonzero(as_tuple=False)
            nzr, nzc = nz[:, 0], nz[:, 1]
        else:
            if a.dtype == object:
                return _Rows(dense=a)
            nzr, nzc = np.nonzero(a)
        if int(nzr.shape[0]) * SPARSE_FRACTION > int(np.prod(tuple(a.shape))):
            return _Rows(dense=a)
        counts = be.t.bincount(nzr, minlength=a.shape[0]) if be.torch else np.bincount(nzr, minlength=a.shape[0])
        starts = be.cumsum0(counts, 0)
        return _Rows(starts=starts, cols=nzc, vals=a[nzr, nzc])

    def _shared_rows_for(self, li, h, qp, q: _Proj, k: _Proj, causal: bool, B: int) -> _Rows:
        key = (li, h, qp.tobytes())
        if key not in self._shared_rows:
            self._shared_rows[key] = self._counted(lambda: self._to_rows(
                self._softmax_rows(self.fmt.matmul(q.arr[0], self.be.swap(k.arr[0])), qp, causal)))
        rows, delta = self._shared_rows[key]
        self._charge(delta, B)
        return rows

    def _apply_shared(self, rows: _Rows, v: _Proj, B: int):
        """z [B, R, dv] for rows shared by every input."""
        fmt, be = self.fmt, self.be
        if rows.dense is not None:
            if v.kind == "shared":
                out, delta = self._counted(lambda: fmt.matmul(rows.dense[None], v.arr))
                self._charge(delta, B)
                return be.expand(out, B)
            return fmt.matmul(rows.dense[None], v.dense(be, B))
        # every input b, row r: sum over the row's nonzero columns j of mul(a_rj, v[b, j]); values
        # shared by the batch are multiplied once
        Bv = 1 if v.kind == "shared" else B
        nnz, dv = int(rows.cols.shape[0]), int(v.arr.shape[-1])
        tile = (lambda a: be.t.tile(a, (Bv,))) if be.torch else (lambda a: np.tile(a, Bv))
        bidx = be.repeat(self._arange(Bv), self._full(Bv, nnz))
        vals = v.rows_at(be, bidx, tile(rows.cols))  # [Bv*nnz, dv]
        out, delta = self._counted(lambda: self._segment_sum(
            fmt.mul(tile(rows.vals)[:, None], vals).reshape(Bv, nnz, dv), rows.starts, axis=1))
        self._charge(delta, B // Bv)
        return be.expand(out, B) if Bv != B else out

    def _prepared_keys(self, k: _Proj) -> Prepared:
        """The shared keys as a prepared right operand k^T (analysed once per plan)."""
        key = id(k.arr)
        if key not in self._prepared:
            self._prepared[key] = (k.arr, Prepared(self.fmt, self.be.swap(k.arr[0])))
        return self._prepared[key][1]

    def _grouped(self, q: _Proj, k: _Proj, v: _Proj, qp: np.ndarray, causal: bool, B: int):
        """Keys shared, queries not: one row per distinct (query vector[, position if causal])
        within this call, each applied to its inputs' own values."""
        fmt, be = self.fmt, self.be
        R = qp.size
        kT = self._prepared_keys(k)
        if q.kind == "token":
            qtab, gid = q.arr, q.idx  # [U, d], [B, R]
        else:
            flat = q.arr.reshape(B * R, -1)
            qtab, gid = be.unique_rows(flat)
            gid = gid.reshape(B, R)
        if causal:  # the row also depends on the query position
            pos_id = be.put(np.broadcast_to(np.arange(R), (B, R)).copy())
            pair = gid * R + pos_id
            uniq, inv = (be.t.unique(pair.reshape(-1), return_inverse=True) if be.torch
                         else np.unique(pair.reshape(-1), return_inverse=True))
            qsel, psel = uniq // R, be.get(uniq % R)
            group = inv.reshape(B, R)

            def rows_of(sel):
                logits = kT.matmul(qtab[qsel[sel]], fmt)
                a = be.zeros(tuple(logits.shape), logits)
                ps = psel[be.get(sel)]
                for t in np.unique(ps):
                    r = be.put(np.flatnonzero(ps == t))
                    a[r, : int(qp[t]) + 1] = fmt.softmax(logits[r, : int(qp[t]) + 1], axis=-1)
                return a
        else:
            group = gid

            def rows_of(sel):
                return fmt.softmax(kT.matmul(qtab[sel], fmt), axis=-1)
        mult = np.bincount(be.get(group).reshape(-1), minlength=int(qtab.shape[0]) if not causal else int(uniq.shape[0]))
        rows = self._to_rows(self._per_multiplicity(mult, rows_of))
        if rows.dense is not None:
            return fmt.matmul(rows.dense[group], v.operand(be, B))
        # CSR rows applied per (input, query row): gather each pair's nonzero columns
        g = group.reshape(-1)
        lens = rows.starts[1:][g] - rows.starts[:-1][g]
        total = int(lens.sum())
        pair = be.repeat(self._arange(B * R), lens)
        first = be.repeat(rows.starts[:-1][g], lens)
        offs = self._arange(total) - be.repeat(be.cumsum0(lens, 0)[:-1], lens)
        ent = first + offs
        vals = v.rows_at(be, pair // R, rows.cols[ent])
        prods = fmt.mul(rows.vals[ent][:, None], vals).reshape(1, total, int(v.arr.shape[-1]))
        out = self._segment_sum(prods, be.cumsum0(lens, 0), axis=1)[0]  # [B*R, dv]
        return out.reshape(B, R, int(v.arr.shape[-1]))

    def _head_split(self, li: int, L, h: int, tokens: np.ndarray, x, q_pos: np.ndarray):
        """The head's output with the shared dims' partial logits computed once per plan (module
        docstring): logits = add(shared partial, this call's partial over the other dims). None when
        a partial sum saturates (then the split is not the forward pass's sum)."""
        fmt, be = self.fmt, self.be
        B, allpos = tokens.shape[0], self.allpos
        sd, od = L["qk_split"][h]
        k = self._proj(li, L, h, "K", tokens, x, allpos, dims=od)
        k_sh = self._proj(li, L, h, "K", tokens, x, allpos, dims=sd)
        v = self._proj(li, L, h, "V", tokens, x, allpos, dims=L["v_dims"][h])
        outs = []
        chunk = max(1, ATTENTION_BLOCK_ENTRIES // (self.T * B))
        for c0 in range(0, q_pos.size, chunk):
            qp = q_pos[c0 : c0 + chunk]
            q_sh = self._proj(li, L, h, "Q", tokens, x, qp, dims=sd)
            if q_sh.kind != "shared" or k_sh.kind != "shared":
                return None
            key = ("partial", li, h, qp.tobytes())
            if key not in self._shared_rows:
                P, delta = self._counted(lambda: fmt.matmul(q_sh.arr[0], be.swap(k_sh.arr[0])))
                self._shared_rows[key] = (P, delta) if delta[0] == 0 else None
            shared = self._shared_rows[key]
            if shared is None:
                return None
            self._charge(shared[1], B)
            q = self._proj(li, L, h, "Q", tokens, x, qp, dims=od)
            part, delta = self._counted(lambda: fmt.matmul(q.dense(be, B), be.swap(k.dense(be, B))))
            if delta[0]:
                return None
            self._charge(delta, 1)
            logits = fmt.add(shared[0][None], part)  # exact sum of the two partial sums, saturated once
            outs.append(fmt.matmul(self._softmax_rows(logits, qp, L["causal"]), v.operand(be, B)))
        return outs[0] if len(outs) == 1 else be.cat(outs, axis=1)

    def _dense(self, q: _Proj, k: _Proj, v: _Proj, qp: np.ndarray, causal: bool, B: int):
        fmt, be = self.fmt, self.be
        logits = fmt.matmul(q.dense(be, B), be.swap(k.dense(be, B)))  # [B, R, T]
        a = self._softmax_rows(logits, qp, causal)
        return fmt.matmul(a, v.operand(be, B))

    # ---- event counts: every input is charged for the work it needs, shared or not ----------
    def _counted(self, fn):
        """``fn()`` with the events it counts taken back out of ``fmt.counts``:
        (result, (saturations, underflows))."""
        c = self.fmt.counts
        s0, u0 = c.saturations, c.underflows
        result = fn()
        delta = (c.saturations - s0, c.underflows - u0)
        c.saturations, c.underflows = s0, u0
        return result, delta

    def _charge(self, delta: tuple[int, int], times: int) -> None:
        self.fmt.counts.saturations += delta[0] * times
        self.fmt.counts.underflows += delta[1] * times

    def _per_multiplicity(self, mult: np.ndarray, fn):
        """Rows computed once and used ``mult[i]`` times: ``fn(row indices)`` is evaluated per class
        of equal multiplicity and its events charged that many times, so the counts of a run do
        not depend on how its inputs were batched; rows with multiplicity 0 are not computed."""
        be = self.be
        out = None
        for m in np.unique(mult[mult > 0]):
            sel = np.flatnonzero(mult == m)
            part, delta = self._counted(lambda: fn(be.put(sel)))
            self._charge(delta, int(m))
            if out is None:
                out = be.zeros((mult.size,) + tuple(part.shape[1:]), part)
            out[be.put(sel)] = part
        return out

    # ---- helpers ---------------------------------------------------------------------------------
    def _arange(self, n: int):
        return self.be.t.arange(n, device=self.be.tdev) if self.be.torch else np.arange(n)

    def _full(self, n: int, value: int):
        return self.be.t.full((n,), value, device=self.be.tdev) if self.be.torch else np.full(n, value)

    def _segment_sum(self, prods, starts, axis: int):
        """Exact sums of ``prods`` [B, M, dv] over segments [starts[i], starts[i+1]) of axis 1,
        saturated once (the rounded products of a row summed as ``fmt.matmul`` does)."""
        fmt, be = self.fmt, self.be
        if not be.torch and prods.dtype != object:
            bound = int(np.abs(prods).max()) if prods.size else 0
            if bound * max(1, prods.shape[1]) >= 1 << 62:
                prods = prods.astype(object)
        elif be.torch and prods.numel():
            bound = int(prods.abs().max())
            if bound * max(1, prods.shape[1]) >= 1 << 62:
                raise ExecutorError("attention sums may exceed int64 on the torch backend; use device='cpu'")
        c = be.cumsum0(prods, axis)
        s = c[:, starts[1:]] - c[:, starts[:-1]]
        return fmt.add(s, be.zeros((), s) if be.torch else np.zeros((), dtype=s.dtype))
