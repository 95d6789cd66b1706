"""The executor: runs a :class:`~exactformer.constructions.ir.CompiledModel` under a number format.

Every arithmetic step goes through the format's operations (:mod:`exactformer.precision`), in the
order of a TransformerLens HookedTransformer forward pass without normalisation; each step is
rounded and saturated exactly as the format prescribes, and the format counts every saturation and
underflow. The semantics, per block (all ops are the format's; ``@`` is ``fmt.matmul``, which rounds
every product and saturates the exact sum once)::

    x      = add(E[token], P[pos])
    q      = add(x @ W_Q[h], b_Q[h])          (likewise k, v)
    a      = softmax(q @ k^T)                 row-wise, App. D (max subtracted, exp, sum, divide)
    z      = a @ v
    attn   = add(concat_h(z) @ concat_h(W_O), b_O)
    x      = add(x, attn)
    x      = add(x, add(relu(add(x @ W_in, b_in)) @ W_out, b_out))
    logits = add(x[last] @ W_U, b_U)

Work that provably does not change the result is skipped, never approximated:

* only the last position is computed in the last block (other positions only feed its keys and
  values), and only the rows a later block needs are kept;
* in the first block a projection whose nonzero weight rows only read columns that the token
  embedding leaves zero depends on the position alone and is computed once per batch (likewise a
  projection that only reads token columns is computed once per distinct token): the residual
  entries it reads are then exactly the positional (or token) entries, and zero weight rows add
  products that are exactly 0;
* attention rows whose query vector and keys are shared by several inputs are computed once;
* value columns whose weights and bias are zero are dropped (their products are exactly 0).

No ``n x d`` embedding table is ever built: embedding rows are generated from position codes for
the rows a batch uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.constructions.ir import Attention, CompiledModel, Embedding, ExactTensor
from exactformer.precision import Format

DEVICES = ("cpu", "cuda")
ATTENTION_BLOCK_ENTRIES = 1 << 25  # query rows are processed in chunks of about this many weights
SPARSE_ATTENTION_ENTRIES = 1 << 26  # nonzero weights of shared attention blocks kept per plan


class ExecutorError(ValueError):
    """Bad arguments to :func:`run` (shapes, token ids, device)."""


@dataclass
class RunResult:
    """Outputs of :func:`run`.

    ``logits``: raw values of the format at the last position, numpy [B, d_vocab_out].
    ``answers``: decoded answers (strict argmax; ``None`` where the maximum is tied).
    ``margin``: numpy [B] raw: logit of the best answer minus the runner-up (0 on a tie).
    ``counts``: the format's op counts for this run (saturations, underflows).
    """

    logits: np.ndarray
    answers: list[Any]
    margin: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# backend shim: numpy on the CPU, torch on CPU or CUDA; the format's ops accept either
# ---------------------------------------------------------------------------------------------


class _Backend:
    def __init__(self, device: str, exact: bool):
        if device not in DEVICES:
            raise ExecutorError(f"device must be one of {DEVICES}, got {device!r}")
        self.device = device
        self.torch = device == "cuda"
        if self.torch:
            import torch

            if not torch.cuda.is_available():
                raise ExecutorError("device='cuda' requested but torch.cuda.is_available() is False")
            self.t = torch
        self.dtype = np.int64 if exact else np.float64

    def put(self, a: np.ndarray):
        if not self.torch:
            return a
        return self.t.as_tensor(np.ascontiguousarray(a), device=self.device)

    def get(self, a) -> np.ndarray:
        if not self.torch:
            return np.asarray(a)
        return a.detach().cpu().numpy()

    def concat(self, arrays, axis: int):
        return self.t.cat(list(arrays), dim=axis) if self.torch else np.concatenate(arrays, axis=axis)

    def transpose_last(self, a):
        return a.transpose(-1, -2) if self.torch else np.swapaxes(a, -1, -2)

    def unique_inverse(self, a):
        if self.torch:
            u, inv = self.t.unique(a, return_inverse=True)
            return u, inv
        return np.unique(a, return_inverse=True)


# ---------------------------------------------------------------------------------------------
# the forward pass
# ---------------------------------------------------------------------------------------------


def run(
    model: CompiledModel,
    tokens: np.ndarray,
    fmt: Format,
    device: str = "cpu",
    batch_size: int | None = None,
) -> RunResult:
    """Run ``model`` on token ids ``tokens`` [B, T] (or [T]) under ``fmt``.

    ``T`` must not exceed ``model.n_ctx``; ids must lie in ``[0, model.d_vocab)``. Returns the
    last-position logits and decoded answers (see :class:`RunResult`). ``batch_size`` bounds the
    inputs processed at once (default: chosen so the residual stream stays near 256 MiB).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None, :]
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise ExecutorError(f"tokens must be an integer array [B, T], got dtype {tokens.dtype} shape {tokens.shape}")
    B, T = tokens.shape
    if not 1 <= T <= model.n_ctx:
        raise ExecutorError(f"sequence length T={T} must lie in [1, n_ctx={model.n_ctx}]")
    if B and (tokens.min() < 0 or tokens.max() >= model.d_vocab):
        raise ExecutorError(f"token ids must lie in [0, d_vocab={model.d_vocab})")
    plan = _plan_for(model, fmt, device, T)
    be = plan.be
    if batch_size is None:
        per_input = T * max(model.d_model, 1) * (len(model.blocks) > 1) + T * 8 + 1
        batch_size = int(max(1, min(B, (32 << 20) // per_input)))
    fmt.reset_counts()
    logits = []
    for s in range(0, B, batch_size):
        logits.append(be.get(plan.forward(tokens[s : s + batch_size])))
    counts = fmt.counts.as_dict()
    out = np.concatenate(logits, axis=0) if logits else np.zeros((0, len(model.answers)))
    answers, margin = decode_logits(model, out)
    return RunResult(out, answers, margin, counts)


_PLAN_CACHE: list[tuple[tuple, "_Plan"]] = []


def _plan_for(model: CompiledModel, fmt: Format, device: str, T: int) -> "_Plan":
    """The run's precomputation, reused while the same model object runs under the same format on
    the same device and length (verification runs many batches; the position-only tensors such as
    all keys are computed once). One entry: a new model replaces it."""
    key = (id(model), fmt.name, device, T)
    for k, plan in _PLAN_CACHE:
        if k == key and plan.model is model:
            return plan
    plan = _Plan(model, fmt, _Backend(device, fmt.is_exact), T)
    _PLAN_CACHE[:] = [(key, plan)]
    return plan


def decode_logits(model: CompiledModel, logits: np.ndarray) -> tuple[list[Any], np.ndarray]:
    """Strict argmax decoding of [B, d_vocab_out] logits; ties decode to ``None``."""
    if logits.shape[1] == 1:
        return [model.answers[0]] * logits.shape[0], np.full(logits.shape[0], np.inf)
    order = np.argsort(-logits, axis=1, kind="stable")
    best = logits[np.arange(len(logits)), order[:, 0]]
    second = logits[np.arange(len(logits)), order[:, 1]]
    margin = best - second
    answers = [model.answers[int(i)] if m > 0 else None for i, m in zip(order[:, 0], margin)]
    return answers, margin


def _unique_ids(ids: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(ids, return_inverse=True) for ids in [0, size) without sorting (O(ids + size))."""
    present = np.zeros(size, dtype=bool)
    present[ids.reshape(-1)] = True
    uniq = np.flatnonzero(present)
    lut = np.zeros(size, dtype=np.int64)
    lut[uniq] = np.arange(uniq.size)
    return uniq, lut[ids]


class _Plan:
    """Per-run precomputation: raw weights, structural facts, position-only tensors."""

    def __init__(self, model: CompiledModel, fmt: Format, be: _Backend, T: int):
        self.model, self.fmt, self.be, self.T = model, fmt, be, T
        self.pos = np.arange(T)
        self.P = be.put(model.pos_embed.raw(self.pos, fmt))  # [T, d_model]
        self.e_cols = model.embed.nonzero_columns()
        self.p_cols = model.pos_embed.nonzero_columns()
        self.layers = [self._prepare(b.attn, b.mlp) for b in model.blocks]
        self.W_U = be.put(model.W_U.raw(fmt))
        self.W_U_rows = np.flatnonzero(np.any(model.W_U.num != 0, axis=1))
        self.b_U = be.put(model.b_U.raw(fmt))
        self._pos_cache: dict[tuple, Any] = {}
        self._sparse_attn: dict[tuple, tuple] = {}
        self._sparse_budget = SPARSE_ATTENTION_ENTRIES

    def _prepare(self, attn: Attention, mlp) -> dict[str, Any]:
        be, fmt = self.be, self.fmt
        L: dict[str, Any] = {"causal": attn.causal, "H": attn.n_heads}
        for w in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
            L[w] = be.put(getattr(attn, w).raw(fmt))
        # value columns that are identically zero (weights and bias) are dropped per head
        L["v_cols"] = [np.flatnonzero(np.any(attn.W_V.num[h] != 0, axis=0) | (attn.b_V.num[h] != 0))
                       for h in range(attn.n_heads)]
        W_O = attn.W_O.raw(fmt)  # [H, d_head, d_model]
        L["W_O_cat"] = be.put(np.concatenate([W_O[h][L["v_cols"][h]] for h in range(attn.n_heads)], axis=0))
        L["b_O"] = be.put(attn.b_O.raw(fmt))
        # which residual columns each projection reads
        for w in ("W_Q", "W_K", "W_V"):
            L[w + "_rows"] = [np.flatnonzero(np.any(getattr(attn, w).num[h] != 0, axis=1)) for h in range(attn.n_heads)]
        for w in ("W_in", "b_in", "W_out", "b_out"):
            L[w] = be.put(getattr(mlp, w).raw(fmt))
        # the MLP reads only the residual columns where W_in has a nonzero row
        L["W_in_rows"] = np.flatnonzero(np.any(mlp.W_in.num != 0, axis=1))
        return L

    # ---- embeddings -------------------------------------------------------------------------
    def token_rows(self, ids: np.ndarray):
        """Raw embedding rows for token ids (numpy ids), cached per id within the run."""
        return self.be.put(self.model.embed.raw(ids, self.fmt))

    def residual0(self, tokens: np.ndarray):
        """Full first residual stream [B, T, d_model] = add(E[tok], P[pos])."""
        uniq, inv = _unique_ids(tokens, self.model.d_vocab)
        E = self.token_rows(uniq)
        inv_b = self.be.put(inv)
        return self.fmt.add(E[inv_b], self.P[None, :, :])

    # ---- projections --------------------------------------------------------------------------
    def _project(self, x, W, b, rows=None):
        """add(x @ W, b) with x [..., d_model] restricted to ``rows`` of W when given."""
        if rows is not None:
            rows_b = self.be.put(rows)
            return self.fmt.add(self.fmt.matmul(x[..., rows_b], W[rows_b]), b)
        return self.fmt.add(self.fmt.matmul(x, W), b)

    def _source(self, rows: np.ndarray) -> str:
        """'pos' if these residual columns carry only positional entries, 'tok' if only token
        entries, else 'full' (first block only)."""
        if rows.size == 0:
            return "pos"
        if not np.any(self.e_cols[rows]):
            return "pos"
        if not np.any(self.p_cols[rows]):
            return "tok"
        return "full"

    def forward(self, tokens: np.ndarray):
        fmt, be = self.fmt, self.be
        B, T = tokens.shape
        nL = len(self.layers)
        x = None  # residual [B, T or 1, d_model]; None while still "embedding only" (block 0)
        for li, L in enumerate(self.layers):
            last_only = li == nL - 1
            q_pos = np.array([T - 1]) if last_only else self.pos
            heads_z = []
            for h in range(L["H"]):
                kh = self._head_proj(L, h, "K", tokens, x, self.pos)
                vcols = L["v_cols"][h]
                vh = self._head_proj(L, h, "V", tokens, x, self.pos, cols=vcols)
                if vh.shape[0] == 1 and B > 1:
                    vh = vh.expand(B, *vh.shape[1:]) if be.torch else np.broadcast_to(vh, (B,) + vh.shape[1:])
                # query rows in chunks, so an attention block [B|1, chunk, T] stays near 2^25 entries
                chunk = max(1, ATTENTION_BLOCK_ENTRIES // (self.T * max(1, B if x is not None else 1)))
                parts = []
                for q0 in range(0, q_pos.size, chunk):
                    qp = q_pos[q0 : q0 + chunk]
                    key = (id(L), h, int(qp[0]), qp.size)
                    if key in self._sparse_attn:  # a shared, mostly-zero block computed earlier
                        parts.append(self._sparse_apply(self._sparse_attn[key], vh))
                        continue
                    qh = self._head_proj(L, h, "Q", tokens, x, qp)  # [B|1, len(qp), dh]
                    a = self._attention(qh, kh, L["causal"], qp, B)  # [B|1, len(qp), T]
                    if a.shape[0] == 1 and x is None and not be.torch:
                        sp = self._sparsify(a[0])
                        if sp is not None:
                            self._sparse_attn[key] = sp
                            parts.append(self._sparse_apply(sp, vh))
                            continue
                    parts.append(fmt.matmul(a, vh))  # [B, len(qp), |vcols|]
                heads_z.append(parts[0] if len(parts) == 1 else be.concat(parts, axis=1))
            z = be.concat(heads_z, axis=-1)
            attn_out = fmt.add(fmt.matmul(z, L["W_O_cat"]), L["b_O"])  # [B, Tq, d_model]
            resid = self._residual_at(tokens, x, q_pos)
            x_mid = fmt.add(resid, attn_out)
            pre = self._project(x_mid, L["W_in"], L["b_in"], L["W_in_rows"])
            mlp_out = fmt.add(fmt.matmul(fmt.relu(pre), L["W_out"]), L["b_out"])
            x = fmt.add(x_mid, mlp_out)
        return self._project(x[:, -1, :], self.W_U, self.b_U, self.W_U_rows)

    def _residual_at(self, tokens, x, q_pos):
        if x is not None:
            return x[:, q_pos[0] :, :] if q_pos.size == 1 else x
        if q_pos.size == 1:
            E = self.token_rows(tokens[:, q_pos[0]])
            return self.fmt.add(E, self.P[int(q_pos[0])][None, :])[:, None, :]
        return self.residual0(tokens)

    def _head_proj(self, L, h, which, tokens, x, positions, cols=None):
        """Projection ``which`` of head h at ``positions``: [1 or B, len(positions), d_head'].

        Returns a tensor whose leading dim is 1 when it is shared by the whole batch. For the first
        block, a 'tok' projection of the query is returned with leading dim B (computed per
        distinct token).
        """
        be = self.be
        W = L["W_" + which][h]
        b = L["b_" + which][h]
        if cols is not None:
            cb = be.put(cols)
            W, b = W[:, cb], b[cb]
        rows = L["W_" + which + "_rows"][h]
        if x is not None:  # later blocks: the residual stream is data dependent
            xs = x if positions.size == x.shape[1] else x[:, int(positions[0]) : int(positions[-1]) + 1, :]
            return self._project(xs, W, b, rows)
        src = self._source(rows)
        if src == "pos":  # depends on positions only: computed once per plan
            key = (id(L), h, which, int(positions[0]), positions.size)
            if key not in self._pos_cache:
                self._pos_cache[key] = self._project(self.P[be.put(positions)], W, b, rows)[None]
            return self._pos_cache[key]
        if src == "tok":
            toks = tokens[:, positions]
            uniq, inv = _unique_ids(toks, self.model.d_vocab)
            per_tok = self._project(self.token_rows(uniq), W, b, rows)
            return per_tok[be.put(inv)]
        x0 = self.residual0(tokens)[:, int(positions[0]) : int(positions[-1]) + 1, :]
        return self._project(x0, W, b, rows)

    def _sparsify(self, a: np.ndarray):
        """A shared attention block [rows, T] as (row_starts, cols, vals) when at most 1/8 of its
        rounded weights are nonzero and the plan's budget allows; else None."""
        if a.dtype == object:
            return None
        nz_r, nz_c = np.nonzero(a)
        if nz_r.size * 8 > a.size or nz_r.size > self._sparse_budget:
            return None
        self._sparse_budget -= nz_r.size
        starts = np.searchsorted(nz_r, np.arange(a.shape[0] + 1))
        return starts, nz_c, a[nz_r, nz_c]

    def _sparse_apply(self, sp, v):
        """fmt.matmul(a, v) for a block held sparse: zero weights give products that are exactly
        0, so only the nonzero ones are rounded (fmt.mul), summed exactly per row and saturated
        once (the same values and counts as the dense product). v: [B, T, dv] -> [B, rows, dv]."""
        fmt = self.fmt
        starts, cols, vals = sp
        rows = starts.size - 1
        B, _, dv = v.shape
        out = np.zeros((B, rows, dv), dtype=np.int64)
        if cols.size:
            prods = np.asarray(fmt.mul(vals[None, :, None], np.asarray(v)[:, cols, :]))
            wide = prods.dtype == object or int(np.abs(prods).max()) * cols.size >= 2**62  # exact prefix sums
            csum = np.zeros((B, cols.size + 1, dv), dtype=object if wide else np.int64)
            np.cumsum(prods, axis=1, out=csum[:, 1:])
            out = csum[:, starts[1:]] - csum[:, starts[:-1]]
        return fmt.add(out, np.zeros((), dtype=out.dtype))

    def _attention(self, q, k, causal: bool, q_pos: np.ndarray, B: int):
        """Softmax rows [B, Tq, T] (leading dim 1 when shared by the batch)."""
        fmt, be = self.fmt, self.be
        kt = be.transpose_last(k)  # [1|B, dh, T]
        if q.shape[0] > 1 and k.shape[0] == 1:
            # rows depend on the query vector only: compute once per distinct query vector
            qn = be.get(q).reshape(q.shape[0], -1)
            uniq, first, inv = np.unique(qn, axis=0, return_index=True, return_inverse=True)
            if len(first) < q.shape[0]:
                a_u = self._attention(q[be.put(first)], k, causal, q_pos, len(first))
                return a_u[be.put(inv.reshape(-1))]
        if q.shape[1] == 1 and kt.shape[0] == 1:  # one query row per input, shared keys: one GEMM
            logits = fmt.matmul(q[:, 0, :], kt[0])[:, None, :]
        else:
            logits = fmt.matmul(q, kt)  # [.., Tq, T]
        if not causal:
            return fmt.softmax(logits, axis=-1)
        rows = []
        for i, t in enumerate(q_pos):
            r = fmt.softmax(logits[:, i : i + 1, : t + 1], axis=-1)
            pad_shape = (r.shape[0], 1, self.T - t - 1)
            pad = be.put(np.zeros(pad_shape, dtype=be.get(r).dtype)) if pad_shape[2] else None
            rows.append(be.concat([r, pad], axis=-1) if pad is not None else r)
        return be.concat(rows, axis=1)
