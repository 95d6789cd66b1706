"""The float forward pass of a :class:`~exactformer.constructions.core.ir.CompiledModel` as a plain
``torch.nn.Module`` (HookedTransformer semantics, embedding rows generated per batch)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from exactformer.constructions.export.floats import ExportError, embedding_rows_float, to_float64, warn_arithmetic
from exactformer.constructions.core.ir import CompiledModel, Embedding, check_shapes
from exactformer.constructions.core.recurrent import RNNModel
from exactformer.constructions.export.recurrent import STATE_DICT, ZERO_BIAS, exact_tensors


@functools.singledispatch
def to_torch(model: Any, dtype: Any = None, device: Any = None) -> nn.Module:
    """The float forward pass of ``model`` as a ``torch.nn.Module``: the module of the model's kind
    (a transformer's :class:`ExactformerTorch`, a recurrent model's :class:`RecurrentTorch`)."""
    raise ExportError(f"model: no torch module for a {type(model).__name__}")


@to_torch.register
def to_torch_transformer(model: CompiledModel, dtype: Any = None, device: Any = None, positions: str | None = None,
                         query_chunk: int | None = None) -> nn.Module:
    """The float forward pass of ``model`` as a ``torch.nn.Module`` (default dtype float64).

    ``forward(tokens [B, T] long) -> logits [B, A, d_vocab_out]`` at the positions
    ``net.output_positions(T)`` with HookedTransformer semantics (no normalisation, no attention
    scaling, ReLU MLP, bidirectional unless the layer is causal). ``positions``: "answers" (the last
    layer is computed at the model's answer positions only, A of them) or "all" (every position,
    A = T, as HookedTransformer returns) or increasing positions to compute (k-hop at N = 2^16 answers
    at every position over 2^16 + 1 answers: its logits alone are 17 GB in float32; ``[T - 1]``
    computes the last); None: "answers" where the model answers at few positions
    (:func:`default_positions`). ``query_chunk``: query rows per attention block (None: sized so a
    block holds about :data:`SCORE_BLOCK` scores); memory is O(T d_model) plus one block.
    Weights are buffers named like TransformerLens' state dict (``blocks.0.attn.W_Q``, ...);
    embedding rows are generated for the distinct token ids and the positions of each batch, so
    no ``n x d_model`` table is built. Move it with ``.to("cuda")`` (or ``device="cuda"``). Warns
    (:class:`ArithmeticWarning`) when the build did not check ``dtype``'s arithmetic.
    """
    dtype = torch.float64 if dtype is None else dtype
    warn_arithmetic(model, str(dtype).removeprefix("torch."), "to_torch")
    return ExactformerTorch(model, dtype, device, positions, query_chunk)


#: scores per block of query rows ([B, H, rows, keys] entries): small enough for the block's mask,
#: softmax and weighted sum to run in cache (at T = 4097, 256 rows of k-hop ran 2.7x faster than one
#: block of every row), large enough to keep the blocks' overhead small
SCORE_BLOCK = 1 << 20
#: projections and attention rows that depend on the position alone are kept between calls up to
#: this many bytes (they are the same for every input; beyond it they are computed again per call)
POSITION_CACHE_BYTES = 1 << 28
#: positions per block where rows of W_pos are generated and projections computed
POSITION_CHUNK = 1 << 14
POSITIONS = ("answers", "all")
#: a block of at most this many query rows whose weights differ per input, over value rows that read
#: token columns only, sums its table rows weighted (``embedding_bag``) instead of gathering
#: [B, T, dv] values first (Index Lookup at N = 4096: 0.7 ms against 2.5-3.5 ms per 128 inputs)
BAG_ROWS = 16
#: the rest of a block (W_O, the residual adds, the MLP) runs over groups of at least this many query
#: rows as their attention rows are done, so that its [B, rows, columns] tensors stay in cache
ROW_GROUP = 256


def default_positions(model: CompiledModel) -> str:
    """"answers" where the model answers at few positions (one, or at most a quarter of its
    context), else "all"."""
    if model.answer_positions is None or 4 * len(model.answer_positions) <= model.n_ctx:
        return "answers"
    return "all"


class _Holder(nn.Module):
    def __init__(self, tensors: dict[str, Any]):
        super().__init__()
        for k, v in tensors.items():
            self.register_buffer(k, v)


@dataclass
class _Proj:
    """One projection of a layer restricted to what it reads and writes: ``rows`` of the residual
    stream read (the nonzero rows of its weight), its weight ``W`` [H, rows, dims] and bias ``b``
    [H, dims] on the kept dims, and where its input comes from: "position" (columns only the
    positional embedding fills: the same for every input), "token" (columns only the token
    embedding fills: the same at every occurrence of a token id) or "input"."""

    rows: Any
    W: Any
    b: Any
    source: str
    monomial: Any = None  # (source row, weight or None where every weight is 1) [H, dims] each where every column of W has one nonzero
    zero_bias: bool = False  # b is identically 0: not added (x + 0 = x exactly)


def _plus(x: Any, b: Any) -> Any:
    """x + b, or x where the bias is identically 0 (None): adding an exact 0 changes no float."""
    return x if b is None else x + b


@dataclass
class _TokenValues:
    """Value rows that read token columns only: ``table`` [U, H, dv] (x W_V + b_V per token id) and
    the ids ``ids`` [B, T] that index it; v = table[ids], gathered only where a block needs it."""

    table: Any
    ids: Any

    def gathered(self) -> Any:
        """v [B, H, T, dv]."""
        t, ids = self.table, self.ids
        return t.reshape(t.shape[0], -1).index_select(0, ids.reshape(-1)).view(ids.shape + t.shape[1:]).transpose(1, 2)

    def weighted(self, pattern: Any) -> Any:
        """z = pattern v for ``pattern`` [B, H, r, keys] (keys from position 0): per input, query row
        and head, the sum of its weights times their table rows ([B, H, r, dv]). The same products
        and sum as ``pattern @ v`` in another order (the float certificates enclose every order)."""
        B, H, r, keys = pattern.shape
        ids = self.ids[:, :keys]
        if r > 1:
            ids = ids[:, None].expand(B, r, keys).reshape(B * r, keys)
        z = [nn.functional.embedding_bag(ids, self.table[:, h].contiguous(), per_sample_weights=pattern[:, h].reshape(B * r, keys),
                                         mode="sum") for h in range(H)]
        return torch.stack(z, dim=1).view(B, r, H, -1).transpose(1, 2)


@dataclass
class _Layer:
    """A block restricted to the dims that can change its output and to the residual columns a
    later read needs (see :class:`ExactformerTorch`). ``*_at`` index the block's own column sets:
    ``live_in`` (held at its input), ``mid`` (after attention), ``live_out`` (after the MLP)."""

    causal: bool
    q: _Proj
    k: _Proj
    v: _Proj
    live_in: Any  # residual columns held at the block's input (absolute)
    mid_at: Any  # mid's columns in live_in
    W_O: Any  # [H, dv, |o_at|]
    o_pick: Any  # one head whose W_O copies value dims (one 1 per column): the dim each column copies, else None
    b_O: Any  # None where identically 0 (not added), likewise b_in and b_out
    o_at: Any  # the columns attention writes, in mid
    mlp_at: Any  # the MLP's input columns, in mid
    W_in: Any  # [|mlp_at|, units]
    b_in: Any
    W_out: Any  # [units, |out_at|]
    b_out: Any
    out_from_mid: Any  # live_out's columns in mid
    out_at: Any  # the columns the MLP writes, in live_out


class ExactformerTorch(nn.Module):
    """Float forward pass of an exactformer CompiledModel (see :func:`to_torch`).

    Every operation is HookedTransformer's, in its order (``q = x W_Q + b_Q``, ``scores = q k^T``,
    causal mask, ``softmax`` (max-subtracted), ``z = pattern v``, ``attn_out = z W_O + b_O``,
    ``resid_mid = resid_pre + attn_out``, likewise the MLP and the unembedding), computed without
    the terms that are exactly zero: a projection reads only the residual columns its weight has
    nonzero rows for, a head keeps only the dims both its query and key (its value and output)
    weights use, the MLP only units with weights on both sides, and additions go to the columns a
    block writes. A dropped term is a product with an exact 0 factor, and adding an exact 0 changes
    no float sum; the float certificates count only nonzero terms and enclose every summation order
    (docs/precision.md, "Float arithmetics"), so they cover this module, the dense recipe of
    docs/exports.md and TransformerLens alike. Bits may differ between them, and with the batch
    and the chunking: BLAS blocks a dot product by the shapes of the matrices.

    Memory: the residual stream [B, T, d_model] (the last layer at the answer positions only under
    ``positions="answers"``), the layer's projections, and one block of ``query_chunk`` query rows'
    scores. Queries and keys that depend on the position alone (columns only W_pos fills, before
    any block writes them) are computed once per length, without the batch, and kept up to
    :data:`POSITION_CACHE_BYTES` (with their softmax rows where both do); projections that read
    columns only the token embedding fills are computed once per token id and looked up by position
    (the same products and sums as at each position: the position adds exact zeros there) -- over
    the whole vocabulary, kept, where ``W_E`` takes at most 1/8 of the cache, else over the batch's
    distinct ids. Softmax rows of a query that reads token columns only against keys that depend on
    the position alone (unmasked) are computed once per distinct query id of a call; value rows
    that read token columns only are summed from their table with the weights of a block of few
    query rows (``embedding_bag``); zero biases are not added, unit weights not multiplied; the
    rest of a block runs over groups of :data:`ROW_GROUP` query rows. The float32 sampling
    benchmark (docs/benchmarks.md) measures what these buy.
    """

    def __init__(self, model: CompiledModel, dtype, device=None, positions: str | None = None,
                 query_chunk: int | None = None):
        super().__init__()
        check_shapes(model)
        if isinstance(positions, str) or positions is None:
            if positions is not None and positions not in POSITIONS:
                raise ExportError(f"positions must be one of {' | '.join(POSITIONS)} or positions to compute, "
                                  f"got {positions!r}")
        else:
            pos = np.asarray(positions)
            if pos.ndim != 1 or not pos.size or not np.issubdtype(pos.dtype, np.integer) or np.any(np.diff(pos) <= 0) \
                    or pos[0] < 0 or pos[-1] >= model.n_ctx:
                raise ExportError(f"positions: increasing integers in [0, n_ctx={model.n_ctx}), got {positions!r}")
            positions = pos.astype(np.int64)
        if query_chunk is not None and (isinstance(query_chunk, bool) or not isinstance(query_chunk, int)
                                        or query_chunk < 1):
            raise ExportError(f"query_chunk must be an integer >= 1 (query rows per attention block), got {query_chunk!r}")
        self.exact_model = model
        self.answers = list(model.answers)
        self.output_vocab = model.output_vocab
        self.n_ctx, self.d_vocab = model.n_ctx, model.d_vocab
        self.causal = [bool(b.attn.causal) for b in model.blocks]
        self.positions = default_positions(model) if positions is None else positions
        self.query_chunk = query_chunk
        f = lambda t: torch.as_tensor(to_float64(t.num, t.den)[0], dtype=dtype, device=device)  # noqa: E731
        blocks = []
        for b in model.blocks:
            blk = nn.Module()
            blk.attn = _Holder({k: f(getattr(b.attn, k)) for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")})
            blk.mlp = _Holder({k: f(getattr(b.mlp, k)) for k in ("W_in", "b_in", "W_out", "b_out")})
            blocks.append(blk)
        self.blocks = nn.ModuleList(blocks)
        self.unembed = _Holder({"W_U": f(model.W_U), "b_U": f(model.b_U)})
        self.e_cols = model.embed.nonzero_columns()
        self.p_cols = model.pos_embed.nonzero_columns()
        self.v_cols = np.zeros(model.d_model, dtype=bool)
        if model.vector_input is not None:
            self.v_cols[np.asarray(model.vector_input.cols)] = True
        self._plan: tuple[Any, tuple[list[_Layer], Any]] | None = None
        self._cache: dict[Any, Any] = {}  # position-only tensors, :data:`POSITION_CACHE_BYTES` in all

    def _keep(self, key: Any, value: Any, size: int) -> None:
        """Keep ``value`` (``size`` bytes) between calls while the cache stays within
        :data:`POSITION_CACHE_BYTES`."""
        used = self._cache.get("bytes", 0)
        if used + size <= POSITION_CACHE_BYTES:
            self._cache[key] = value
            self._cache["bytes"] = used + size

    # ---- what the forward pass computes, derived from the weights as they are now --------------
    def _key(self) -> tuple:
        """The buffers' device, dtype and versions: the plan is derived again when they change
        (``.to()``, ``load_state_dict``, an in-place edit)."""
        ref = self.unembed.W_U
        return (ref.device, ref.dtype) + tuple(b._version for b in self.buffers())

    def _layers(self) -> tuple[list[_Layer], Any]:
        key = self._key()
        if self._plan is None or self._plan[0] != key:
            self._plan = (key, self._derive())
            self._cache = {}
        return self._plan[1]

    def _derive(self) -> tuple[list[_Layer], Any]:
        """The layers and W_U on the rows the unembedding reads. Forward over
        the blocks: the dims and rows each projection uses and where its input comes from; backward:
        the columns each block must hold (the exact executor's live columns)."""
        nz = lambda t: (t != 0).cpu().numpy()  # noqa: E731
        dev = self.unembed.W_U.device
        idx = lambda a: torch.as_tensor(np.flatnonzero(a), dtype=torch.long, device=dev)  # noqa: E731
        at = lambda sub, sup: torch.as_tensor(np.searchsorted(np.flatnonzero(sup), np.flatnonzero(sub & sup)),  # noqa: E731
                                              dtype=torch.long, device=dev)
        d = self.exact_model.d_model
        written, parts = np.zeros(d, dtype=bool), []

        def source(rows: np.ndarray) -> str:
            if not np.any(rows & (written | self.e_cols | self.v_cols)):
                return "position"
            if not np.any(rows & (written | self.p_cols | self.v_cols)):
                return "token"
            return "input"

        for blk in self.blocks:
            a, m = blk.attn, blk.mlp
            uses = lambda W, b: nz(W).any(axis=1) | nz(b)  # noqa: E731  [H, d_head]: the dim is not identically 0
            qk = (uses(a.W_Q, a.b_Q) & uses(a.W_K, a.b_K)).any(axis=0)
            vd = (uses(a.W_V, a.b_V) & nz(a.W_O).any(axis=2)).any(axis=0)
            projs = []
            for W, b, dims in ((a.W_Q, a.b_Q, qk), (a.W_K, a.b_K, qk), (a.W_V, a.b_V, vd)):
                W, b = W[:, :, idx(dims)], b[:, idx(dims)]
                rows = nz(W).any(axis=(0, 2))
                projs.append((rows, W[:, idx(rows)], b, source(rows)))
            units = (nz(m.W_in).any(axis=0) | nz(m.b_in)) & nz(m.W_out).any(axis=1)
            W_in = m.W_in[:, idx(units)]
            o_cols = nz(a.W_O)[:, vd].any(axis=(0, 1)) | nz(a.b_O)
            out_cols = nz(m.W_out)[units].any(axis=0) | nz(m.b_out)
            parts.append((projs, vd, o_cols, nz(W_in).any(axis=1), units, out_cols))
            written |= o_cols | out_cols
        U = self.unembed
        need = nz(U.W_U).any(axis=1)
        u_rows = need.copy()
        layers: list[_Layer] = []
        for li in range(len(parts) - 1, -1, -1):
            (pq, pk, pv), vd, o_cols, mlp_rows, units, out_cols = parts[li]
            out, mid = need, need | mlp_rows
            live_in = mid.copy()
            if li:  # a later block's projections read the residual stream; the first's the embedding
                for rows, _, _, src in (pq, pk, pv):
                    live_in |= rows if src == "input" else False
            held = live_in if li else np.ones(d, dtype=bool)  # where a projection's rows are looked up

            def proj(p):
                rows, W, b, src = p
                nz = W != 0
                mono = None
                if W.shape[1] and W.shape[2] and int(nz.sum(dim=1).max()) <= 1:
                    first = nz.to(torch.int8).argmax(dim=1)  # [H, dims]: the row of each column's nonzero
                    weight = torch.gather(W, 1, first[:, None, :])[:, 0]
                    mono = (first, None if bool(torch.all(weight == 1)) else weight)  # x 1 = x exactly
                return _Proj(at(rows, held) if src == "input" and li else idx(rows), W, b, src, mono,
                             not bool(torch.any(b != 0)))

            a, m = self.blocks[li].attn, self.blocks[li].mlp
            nonzero = lambda b: b if bool(torch.any(b != 0)) else None  # noqa: E731  a zero bias is not added
            W_O = a.W_O[:, idx(vd)][:, :, idx(o_cols & mid)]
            pick = None
            if W_O.shape[0] == 1 and W_O.shape[1] and bool(torch.all((W_O[0] != 0).sum(dim=0) == 1)) \
                    and bool(torch.all((W_O[0] == 0) | (W_O[0] == 1))):
                pick = (W_O[0] != 0).to(torch.int8).argmax(dim=0)
            layers.insert(0, _Layer(self.causal[li], proj(pq), proj(pk), proj(pv), idx(live_in), at(mid, live_in),
                                    W_O, pick, nonzero(a.b_O[idx(o_cols & mid)]),
                                    at(o_cols, mid), at(mlp_rows, mid), m.W_in[idx(mlp_rows)][:, idx(units)],
                                    nonzero(m.b_in[idx(units)]), m.W_out[idx(units)][:, idx(out_cols & out)],
                                    nonzero(m.b_out[idx(out_cols & out)]),
                                    at(out, mid), at(out_cols, out)))
            need = live_in
        return layers, U.W_U[idx(u_rows)]  # the last block holds exactly the unembedding's rows at its output

    def output_positions(self, T: int) -> np.ndarray:
        """The positions whose logits :meth:`forward` returns for inputs of length ``T``: the
        model's answer positions under ``positions="answers"``, every position under "all", else
        the positions given."""
        if isinstance(self.positions, np.ndarray):
            if self.positions[-1] >= T:
                raise ValueError(f"positions reach {int(self.positions[-1])}, beyond an input of length {T}")
            return self.positions
        return self.exact_model.answer_positions_for(T) if self.positions == "answers" else np.arange(T)

    def memory(self, T: int, B: int = 1) -> int:
        """Bytes one call on ``B`` inputs of length ``T`` holds at its peak, estimated from the
        shapes (what the verifier's estimates and :func:`~exactformer.verify.executor.torch_run.run_torch`'s
        batches read): the residual stream, the largest layer's projections, one attention
        block's scores, the embedding rows generated at once and the position cache."""
        s, d = self.unembed.W_U.element_size(), self.exact_model.d_model
        R_last = len(self.output_positions(T))
        chunk = min(T, POSITION_CHUNK)
        fixed = POSITION_CACHE_BYTES + chunk * d * (16 + s) + min(B * T, self.d_vocab) * d * (16 + s)
        peak = 0
        layers = self._layers()[0]
        for li, L in enumerate(layers):
            R = R_last if li == len(layers) - 1 else T
            H, dqk, dv = L.q.W.shape[0], L.q.W.shape[2], L.v.W.shape[2]
            Bq, Bk, Bv = (1 if p.source == "position" else B for p in (L.q, L.k, L.v))  # position rows: one copy
            proj = 2 * H * (Bq * R * dqk + Bk * T * dqk + Bv * T * dv) \
                + B * chunk * max(len(L.q.rows), len(L.k.rows), len(L.v.rows), 1)
            rows = self.query_chunk or max(1, SCORE_BLOCK // (max(Bq, Bk) * H * T))  # as _attention blocks them
            attn = 3 * max(Bq, Bk) * H * min(rows, R) * T + 2 * B * H * R * dv
            mlp = B * R * (len(L.mlp_at) + 2 * L.W_in.shape[1] + 2 * len(L.out_at) + 2 * len(L.o_at))
            resid = B * (T * len(L.live_in) * (2 if li else 1) + 2 * R * len(L.mid_at))
            peak = max(peak, (proj + attn + mlp + resid) * s)
        logits = B * R_last * (2 * len(self.answers) + self._layers()[1].shape[0])  # x (its rows), x W_U, + b_U
        return int(fixed + max(peak, logits * s))

    # ---- embeddings ----------------------------------------------------------------------------
    def _pos_rows(self, at: Any) -> Any:
        """Rows of W_pos at ``at`` (a slice or a position array) in the module's dtype (the table
        up to the length asked for is kept while it fits :data:`POSITION_CACHE_BYTES`)."""
        ref = self.unembed.W_U
        stop = at.stop if isinstance(at, slice) else int(at.max(initial=-1)) + 1
        table = self._cache.get("W_pos")
        if table is None and stop * self.exact_model.d_model * ref.element_size() <= POSITION_CACHE_BYTES // 2:
            table = self._generated(np.arange(stop))
            self._keep("W_pos", table, table.numel() * table.element_size())
        if table is not None and table.shape[0] >= stop:
            return table[at] if isinstance(at, slice) else table[torch.as_tensor(at, device=ref.device)]
        return self._generated(np.arange(at.start, at.stop) if isinstance(at, slice) else at)

    def _generated(self, rows: np.ndarray) -> Any:
        ref = self.unembed.W_U
        return torch.as_tensor(embedding_rows_float(self.exact_model.pos_embed, rows), dtype=ref.dtype, device=ref.device)

    def _embedded(self, ctx: dict, at: Any, cols: Any) -> Any:
        """hook_embed + hook_pos_embed (and the input vectors) at positions ``at`` (a slice or a
        position array) on columns ``cols``: [B, len(at), len(cols)]."""
        E, inv = ctx["E"], ctx["inv"]
        ids = inv[:, at]
        x = E.index_select(1, cols).index_select(0, ids.reshape(-1)).view(ids.shape + (len(cols),)) \
            + self._pos_rows(at).index_select(1, cols)[None]
        vec = ctx["vectors"]
        if vec is not None:
            vi = self.exact_model.vector_input
            c = cols.cpu().numpy()
            inside = np.flatnonzero((c >= vi.col) & (c < vi.col + vi.width))
            if inside.size:
                sel = torch.as_tensor(inside, device=x.device)
                x[..., sel] = x[..., sel] + vec[:, at][..., torch.as_tensor(c[inside] - vi.col, device=x.device)]
        return x

    # ---- projections ---------------------------------------------------------------------------
    def _project(self, ctx: dict, li: int, p: _Proj, at: Any, x: Any) -> Any:
        """x W + b of projection ``p`` of layer ``li`` at positions ``at`` (a slice or an array):
        [1, H, R, dims] where its input depends on the position alone (computed once per length and
        kept while it fits), else [B, H, R, dims]."""
        if p.source == "position":
            key = ("proj", li, id(p), ctx["T"], repr(at) if isinstance(at, slice) else at.tobytes())
            out = self._cache.get(key)
            if out is None:
                out = self._affine(lambda s: self._pos_rows(s).index_select(1, p.rows)[None], p, at)
                self._keep(key, out, out.numel() * out.element_size())
            return out
        if p.source == "token":  # x W + b for each token id (of the vocabulary, kept; or of the batch), looked up
            table = self._token_table(ctx, li, p)
            ids = ctx["inv"][:, at]  # index_select: a plain gather (advanced indexing took 4x as long at T = 4097)
            return table.reshape(table.shape[0], -1).index_select(0, ids.reshape(-1)) \
                .view(ids.shape + table.shape[1:]).transpose(1, 2)
        if li == 0:
            return self._affine(lambda s: self._embedded(ctx, s, p.rows), p, at)
        return self._affine(lambda s: x[:, s].index_select(-1, p.rows), p, at)

    def _token_table(self, ctx: dict, li: int, p: _Proj) -> Any:
        """x W + b of a projection that reads token columns only, for each token id of ``ctx["E"]``
        (the vocabulary's, kept; or the batch's distinct ids): [U, H, dims]."""
        key = ("token", li, id(p))
        table = self._cache.get(key) if ctx["vocabulary"] else None
        if table is None:
            table = self._affine_block(ctx["E"].index_select(1, p.rows)[None], p)[0].transpose(0, 1)  # [U, H, dims]
            if ctx["vocabulary"]:
                self._keep(key, table, table.numel() * table.element_size())
        return table

    def _values(self, ctx: dict, li: int, p: _Proj, x: Any) -> Any:
        """The value rows of layer ``li`` at every position: [B or 1, H, T, dv], or, where they read
        token columns only, :class:`_TokenValues` (a table per token id, gathered where needed)."""
        if p.source == "token" and self.unembed.W_U.dtype in (torch.float32, torch.float64):
            return _TokenValues(self._token_table(ctx, li, p), ctx["inv"])
        return self._project(ctx, li, p, slice(0, ctx["T"]), x)

    def _affine(self, read, p: _Proj, at: Any) -> Any:
        """einsum(x, W) + b over blocks of :data:`POSITION_CHUNK` positions (``read(slice)`` gives
        the input rows [B, len, rows]); ``at`` an array of positions is read as one block."""
        if not isinstance(at, slice):
            return self._affine_block(read(at), p)
        parts = [self._affine_block(read(slice(s, min(at.stop, s + POSITION_CHUNK))), p)
                 for s in range(at.start, at.stop, POSITION_CHUNK)]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    @staticmethod
    def _affine_block(xr: Any, p: _Proj) -> Any:
        if p.rows.numel() == 0:  # a bias only: every product is 0
            return torch.zeros((1, p.W.shape[0], xr.shape[1], p.W.shape[2]), dtype=p.b.dtype, device=p.b.device) \
                + p.b[None, :, None, :]
        if p.monomial is not None:  # one nonzero per column: the sum is that product, rounded once either way
            src, weight = p.monomial
            cols = [xr.index_select(-1, s) for s in src]
            out = torch.stack(cols if weight is None else [c * w for c, w in zip(cols, weight)], dim=1)
        else:
            out = torch.einsum("btd,hde->bhte", xr, p.W)
        return out if p.zero_bias else out + p.b[None, :, None, :]

    # ---- attention -------------------------------------------------------------------------
    def _attention(self, ctx: dict, li: int, L: _Layer, q: Any, k: Any, v: Any, qpos: np.ndarray) -> Iterator[tuple[int, Any]]:
        """z = softmax(q k^T (masked)) v over blocks of query rows, yielded as ``(r0, z)`` for the
        rows ``qpos[r0 : r0 + z.shape[2]]`` (z: [B or 1, H, rows, dv]) in groups of at least
        :data:`ROW_GROUP` rows. A causal block reads the keys up to its last query only (the rest are
        masked: weight exactly 0)."""
        T, B = ctx["T"], ctx["B"]
        H, R = q.shape[1], q.shape[2]
        rows = self.query_chunk or max(1, SCORE_BLOCK // (max(q.shape[0], k.shape[0]) * H * T))
        shared = L.q.source == L.k.source == "position"  # rows that are the same for every input
        # rows that are the same for every occurrence of the query's token id (no mask: not its position)
        per_token = L.q.source == "token" and L.k.source == "position" and not L.causal
        key = ("rows", li, T, qpos.tobytes(), rows)
        cached = self._cache.get(key) if shared else None
        blocks, kept, size, group, g0 = 0, [], 0, [], 0
        for r0 in range(0, R, rows):
            qp = qpos[r0 : r0 + rows]
            end = int(qp[-1]) + 1 if L.causal else T
            if cached is not None:
                pattern = cached[blocks]
            elif per_token:
                pattern = self._token_rows(ctx, li, L, k, ctx["inv"][:, qp])
            else:
                s = self._product(q[:, :, r0 : r0 + rows], k[:, :, :end].transpose(-1, -2))  # no 1/sqrt(d_head)
                if L.causal:  # keys after a query get -inf; every key up to the block's first query is seen by all
                    lo = int(qp[0])
                    mask = torch.arange(lo, end, device=s.device)[None, :] > torch.as_tensor(qp, device=s.device)[:, None]
                    s[..., lo:end].masked_fill_(mask, float("-inf"))
                pattern = torch.softmax(s, dim=-1)
                if shared and kept is not None:
                    size += pattern.numel() * pattern.element_size()
                    kept = kept + [pattern] if size <= POSITION_CACHE_BYTES else None  # beyond: not kept
            blocks += 1
            if isinstance(v, _TokenValues) and pattern.shape[0] == v.ids.shape[0] and pattern.shape[2] <= BAG_ROWS:
                group.append(v.weighted(pattern))
            else:
                v = v.gathered() if isinstance(v, _TokenValues) else v
                group.append(self._product(pattern, v[:, :, :end]))
            if r0 + rows >= min(R, g0 + ROW_GROUP):
                yield g0, group[0] if len(group) == 1 else torch.cat(group, dim=2)
                group, g0 = [], r0 + rows
        if shared and cached is None and kept is not None:
            self._keep(key, kept, size)

    def _token_rows(self, ctx: dict, li: int, L: _Layer, k: Any, ids: Any) -> Any:
        """softmax(q k^T) for queries with token ids ``ids`` [B, r] (rows of ``ctx["E"]``), where the
        query reads token columns only and the keys [1, H, T, d] the position alone, unmasked: a
        row depends on the query's token id alone, so it is computed once per distinct id of the
        call and looked up: [B, H, r, T]."""
        uniq, inv = torch.unique(ids, return_inverse=True)
        q = self._token_table(ctx, li, L.q).index_select(0, uniq).transpose(0, 1)  # [H, M, d]
        rows = torch.softmax(q @ k[0].transpose(-1, -2), dim=-1).transpose(0, 1)  # [M, H, T], no 1/sqrt(d_head)
        return rows.index_select(0, inv.reshape(-1)).view(ids.shape + rows.shape[1:]).transpose(1, 2)

    @staticmethod
    def _product(a: Any, b: Any) -> Any:
        """a @ b for [Ba, H, m, k] @ [Bb, H, k, n] where a batch of 1 is shared by the other's
        batch: folded into the matrix rows (never copied per input), except a shared ``a`` of at most
        n rows, copied per input so that the larger ``b`` is read where it lies."""
        if a.shape[0] == b.shape[0]:
            return a @ b
        if a.shape[0] == 1:  # few rows of a (a query at the answer position): copied per input, b read in place
            return a @ b if a.shape[2] <= b.shape[3] else torch.einsum("hmk,bhkn->bhmn", a[0], b)
        return torch.einsum("bhmk,hkn->bhmn", a, b[0])

    # ---- the forward pass --------------------------------------------------------------------
    def forward(self, tokens, vectors=None):
        """Logits [B, A, d_vocab_out] at :meth:`output_positions` (T) for token ids [B, T] (or
        [T]). A model with vector inputs (Theorem 7: ``exact_model.vector_input``) also takes
        ``vectors`` [B, T, width], added to the embedding's vector columns (TransformerLens: a
        hook on ``hook_embed``)."""
        ref = self.unembed.W_U
        tokens = torch.as_tensor(tokens, device=ref.device)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.dtype in (torch.float16, torch.float32, torch.float64, torch.bool):
            raise ValueError(f"tokens must be an integer tensor [B, T], got {tuple(tokens.shape)} {tokens.dtype}")
        B, T = tokens.shape
        if not 1 <= T <= self.n_ctx:
            raise ValueError(f"sequence length T={T} must lie in [1, n_ctx={self.n_ctx}]")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.d_vocab):
            raise ValueError(f"token ids must lie in [0, d_vocab={self.d_vocab})")
        vi = self.exact_model.vector_input
        if (vi is None) != (vectors is None):
            raise ValueError("vectors: " + ("this model has no vector input" if vi is None else
                                            f"this model reads a vector of width {vi.width} at its vector tokens"))
        if vi is not None:
            vectors = torch.as_tensor(vectors, dtype=ref.dtype, device=ref.device)
            if vectors.dim() == 2:
                vectors = vectors[None]
            if tuple(vectors.shape) != (B, T, vi.width):
                raise ValueError(f"vectors must have shape {(B, T, vi.width)}, got {tuple(vectors.shape)}")
        layers, W_U = self._layers()
        E = self._cache.get("W_E")
        if E is None and self.d_vocab * self.exact_model.d_model * ref.element_size() <= POSITION_CACHE_BYTES // 8:
            E = torch.as_tensor(embedding_rows_float(self.exact_model.embed, np.arange(self.d_vocab)), dtype=ref.dtype,
                                device=ref.device)  # a small vocabulary: W_E kept, the token ids index it
            self._keep("W_E", E, E.numel() * E.element_size())
        if E is not None:
            inv = tokens.long()
        elif self.d_vocab <= 16 * tokens.numel():  # the distinct ids without a sort: a table over the vocabulary
            present = torch.zeros(self.d_vocab, dtype=torch.bool, device=ref.device)
            flat = tokens.reshape(-1).long()
            present.index_fill_(0, flat, True)
            uniq = torch.nonzero(present).flatten()
            lut = torch.zeros(self.d_vocab, dtype=torch.long, device=ref.device)
            lut[uniq] = torch.arange(uniq.numel(), device=ref.device)
            inv = lut.index_select(0, flat).view(tokens.shape)
        else:
            uniq, inv = torch.unique(tokens, return_inverse=True)
        vocabulary = E is not None and "W_E" in self._cache  # rows of the whole vocabulary: tables over it are kept
        if E is None:
            E = torch.as_tensor(embedding_rows_float(self.exact_model.embed, uniq.cpu().numpy()), dtype=ref.dtype,
                                device=ref.device)
        ctx = {"E": E, "inv": inv, "vectors": vectors, "T": T, "B": B, "vocabulary": vocabulary}
        every, out_pos = slice(0, T), self.output_positions(T)
        x = None  # the residual stream at every position on the block's live_in columns (before the last block)
        for li, L in enumerate(layers):
            qpos = out_pos if li == len(layers) - 1 else np.arange(T)
            at = every if qpos.size == T else qpos
            q = self._project(ctx, li, L.q, at, x)
            k = self._project(ctx, li, L.k, every, x)
            v = self._values(ctx, li, L.v, x)
            parts = []  # the rest of the block, over the query rows of each group of attention rows (in cache)
            for r0, z in self._attention(ctx, li, L, q, k, v, qpos):  # z: [B or 1, H, rows, dv]
                r1 = r0 + z.shape[2]
                rows = slice(int(qpos[r0]), int(qpos[r0]) + r1 - r0) if qpos.size == T else qpos[r0:r1]
                parts.append(self._block_out(ctx, L, x if li else None, rows, z))
            x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return x @ W_U + self.unembed.b_U

    def _block_out(self, ctx: dict, L: _Layer, x: Any, rows: Any, z: Any) -> Any:
        """The block's output (its live_out columns) at positions ``rows`` (a slice or an array)
        from its attention's z there [B or 1, H, rows, dv] and its input ``x`` (None: the embedding)."""
        if x is None:
            mid = self._embedded(ctx, rows, L.live_in)  # the first block's live_in is its mid
        else:
            mid = x[:, rows].index_select(-1, L.mid_at)
        # HookedTransformer's order of operations: attn_out = z W_O + b_O; resid_mid = resid_pre + attn_out
        zW = torch.einsum("bhte,hed->btd", z, L.W_O) if L.o_pick is None else z[:, 0].index_select(-1, L.o_pick)
        attn_out = _plus(zW, L.b_O)  # a copied dim is the sum z W_O: its other products are exact zeros
        mid = mid.index_add(-1, L.o_at, attn_out.expand(mid.shape[0], -1, -1))  # resid_pre + attn_out, one add
        mlp_out = _plus(torch.relu(_plus(mid.index_select(-1, L.mlp_at) @ L.W_in, L.b_in)) @ L.W_out, L.b_out)
        return mid.index_select(-1, L.out_from_mid).index_add(-1, L.out_at, mlp_out.expand(mid.shape[0], -1, -1))

    def dense_forward(self, tokens, vectors=None) -> tuple[Any, list[Any]]:
        """HookedTransformer's forward pass, dense, from the module's buffers as they are now:
        every product and bias at every position, nothing left out, kept or looked up (the plain
        recipe of docs/exports.md; O(T^2) memory, for small inputs). Returns the logits
        [B, T, d_vocab_out] and each layer's softmax weights [B, H, T, T] -- the reference the
        module's shortcuts are tested against, and what the attention figures show."""
        ref = self.unembed.W_U
        tokens = torch.as_tensor(tokens, device=ref.device)
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        B, T = tokens.shape
        rows = lambda emb, ids: torch.as_tensor(embedding_rows_float(emb, ids), dtype=ref.dtype, device=ref.device)  # noqa: E731
        x = rows(self.exact_model.embed, tokens.reshape(-1).cpu().numpy()).reshape(B, T, -1) \
            + rows(self.exact_model.pos_embed, np.arange(T))[None]
        if vectors is not None:
            vi = self.exact_model.vector_input
            x[..., vi.col : vi.col + vi.width] += torch.as_tensor(vectors, dtype=ref.dtype, device=ref.device)
        patterns = []
        for blk, causal in zip(self.blocks, self.causal):
            a, m = blk.attn, blk.mlp
            q, k, v = (torch.einsum("btd,hde->bhte", x, W) + b[:, None] for W, b in
                       ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)))
            s = q @ k.transpose(-1, -2)
            if causal:
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
            patterns.append(s.softmax(-1))
            x = x + torch.einsum("bhte,hed->btd", patterns[-1] @ v, a.W_O) + a.b_O
            x = x + torch.relu(x @ m.W_in + m.b_in) @ m.W_out + m.b_out
        return x @ ref + self.unembed.b_U, patterns

    def decode(self, logits) -> list[Any]:
        """Answers for logits [B, A, d_vocab_out] (the last of the returned positions; ties -> lowest index)."""
        return [self.answers[int(i)] for i in logits[:, -1, :].argmax(dim=-1).tolist()]


@to_torch.register
def to_torch_recurrent(model: RNNModel, dtype: Any = None, device: Any = None) -> nn.Module:
    """The float forward pass of a recurrent model (default dtype float64): a ``torch.nn.RNN``
    between an embedding and a linear readout, with exactly the state dict of ``model.safetensors``
    (:mod:`exactformer.constructions.export.recurrent`). Warns (:class:`ArithmeticWarning`) when the
    build did not check ``dtype``'s arithmetic."""
    dtype = torch.float64 if dtype is None else dtype
    warn_arithmetic(model, str(dtype).removeprefix("torch."), "to_torch")
    return RecurrentTorch(model, dtype, device)


class RecurrentTorch(nn.Module):
    """``forward(tokens [B, T] long) -> logits [B, T, d_vocab_out]``: embed, ``torch.nn.RNN``
    (relu, one layer, batch_first) from the initial state ``h0``, then ``readout`` at every position."""

    def __init__(self, model: RNNModel, dtype, device=None):
        super().__init__()
        model.check()
        self.exact_model = model
        self.answers = list(model.answers)
        self.embed = nn.Embedding(model.d_vocab, model.d_input, dtype=dtype, device=device)
        self.rnn = nn.RNN(model.d_input, model.hidden, num_layers=1, nonlinearity="relu", bias=True, batch_first=True,
                          dtype=dtype, device=device)
        self.readout = nn.Linear(model.hidden, len(model.answers), dtype=dtype, device=device)
        self.register_buffer("h0", torch.zeros(model.hidden, dtype=dtype, device=device))
        state = {ZERO_BIAS: torch.zeros(model.hidden, dtype=dtype)}
        for name, t in exact_tensors(model).items():
            key, transposed = STATE_DICT[name]
            f = to_float64(t.num, t.den)[0]
            state[key] = torch.as_tensor(f.T if transposed else f, dtype=dtype)
        self.load_state_dict(state, strict=True)
        self.requires_grad_(False)

    def forward(self, tokens):
        tokens = torch.as_tensor(tokens, device=self.h0.device)
        if tokens.dim() == 1:
            tokens = tokens[None]
        if tokens.dim() != 2 or tokens.shape[1] < 1 or tokens.dtype in (torch.float16, torch.float32, torch.float64,
                                                                          torch.bool):
            raise ValueError(f"tokens must be an integer tensor [B, T], T >= 1, got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.embed.num_embeddings):
            raise ValueError(f"token ids must lie in [0, d_vocab={self.embed.num_embeddings})")
        h, _ = self.rnn(self.embed(tokens), self.h0.expand(1, tokens.shape[0], -1).contiguous())
        return self.readout(h)
