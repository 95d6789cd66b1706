"""The float forward pass of a :class:`~exactformer.constructions.core.ir.CompiledModel` as a plain
``torch.nn.Module`` (HookedTransformer semantics, embedding rows generated per batch)."""

from __future__ import annotations

import functools
from typing import Any

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
def to_torch_transformer(model: CompiledModel, dtype: Any = None, device: Any = None) -> nn.Module:
    """The float forward pass of ``model`` as a ``torch.nn.Module`` (default dtype float64).

    ``forward(tokens [B, T] long) -> logits [B, T, d_vocab_out]`` with HookedTransformer semantics
    (no normalisation, no attention scaling, ReLU MLP, bidirectional unless the layer is causal).
    Weights are buffers named like TransformerLens' state dict (``blocks.0.attn.W_Q``, ...);
    embedding rows are generated for the distinct token ids and the positions of each batch, so
    no ``n x d_model`` table is built. Move it with ``.to("cuda")`` as usual. Warns
    (:class:`ArithmeticWarning`) when the build did not check ``dtype``'s arithmetic.
    """
    dtype = torch.float64 if dtype is None else dtype
    warn_arithmetic(model, str(dtype).removeprefix("torch."), "to_torch")
    return ExactformerTorch(model, dtype, device)


class _Holder(nn.Module):
    def __init__(self, tensors: dict[str, Any]):
        super().__init__()
        for k, v in tensors.items():
            self.register_buffer(k, v)


class ExactformerTorch(nn.Module):
    """Float forward pass of an exactformer CompiledModel (see :func:`to_torch`)."""

    def __init__(self, model: CompiledModel, dtype, device=None):
        super().__init__()
        check_shapes(model)
        self.exact_model = model
        self.answers = list(model.answers)
        self.output_vocab = model.output_vocab
        self.n_ctx, self.d_vocab = model.n_ctx, model.d_vocab
        self.causal = [bool(b.attn.causal) for b in model.blocks]
        f = lambda t: torch.as_tensor(to_float64(t.num, t.den)[0], dtype=dtype, device=device)  # noqa: E731
        blocks = []
        for b in model.blocks:
            blk = nn.Module()
            blk.attn = _Holder({k: f(getattr(b.attn, k)) for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")})
            blk.mlp = _Holder({k: f(getattr(b.mlp, k)) for k in ("W_in", "b_in", "W_out", "b_out")})
            blocks.append(blk)
        self.blocks = nn.ModuleList(blocks)
        self.unembed = _Holder({"W_U": f(model.W_U), "b_U": f(model.b_U)})
        self._pos_cache: dict[Any, Any] = {}

    def _rows(self, emb: Embedding, ids) -> Any:
        ref = self.unembed.W_U
        return torch.as_tensor(embedding_rows_float(emb, ids), dtype=ref.dtype, device=ref.device)

    def _positions(self, T: int):
        ref = self.unembed.W_U
        key = (ref.device, ref.dtype)
        P = self._pos_cache.get(key)
        if P is None or P.shape[0] < T:
            P = self._rows(self.exact_model.pos_embed, np.arange(T))
            self._pos_cache = {key: P}
        return P[:T]

    def forward(self, tokens, vectors=None):
        """Logits [B, T, d_vocab_out] for token ids [B, T] (or [T]). A model with vector inputs
        (Theorem 7: ``exact_model.vector_input``) also takes ``vectors`` [B, T, width], added to
        the embedding's vector columns (TransformerLens: a hook on ``hook_embed``)."""
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
        uniq, inv = torch.unique(tokens, return_inverse=True)
        E = self._rows(self.exact_model.embed, uniq.cpu().numpy())
        x = E[inv] + self._positions(T)[None]
        vi = self.exact_model.vector_input
        if (vi is None) != (vectors is None):
            raise ValueError("vectors: " + ("this model has no vector input" if vi is None else
                                            f"this model reads a vector of width {vi.width} at its vector tokens"))
        if vi is not None:
            vectors = torch.as_tensor(vectors, dtype=x.dtype, device=x.device)
            if vectors.dim() == 2:
                vectors = vectors[None]
            if tuple(vectors.shape) != (B, T, vi.width):
                raise ValueError(f"vectors must have shape {(B, T, vi.width)}, got {tuple(vectors.shape)}")
            x = x.clone()
            x[..., vi.col : vi.col + vi.width] += vectors
        for blk, causal in zip(self.blocks, self.causal):
            a, m = blk.attn, blk.mlp
            q = torch.einsum("btd,hde->bhte", x, a.W_Q) + a.b_Q[None, :, None, :]
            k = torch.einsum("btd,hde->bhte", x, a.W_K) + a.b_K[None, :, None, :]
            v = torch.einsum("btd,hde->bhte", x, a.W_V) + a.b_V[None, :, None, :]
            s = q @ k.transpose(-1, -2)  # no 1/sqrt(d_head)
            if causal:
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                s = s.masked_fill(mask, float("-inf"))
            z = torch.softmax(s, dim=-1) @ v  # [B, H, T, d_head]
            # HookedTransformer's order of operations (float certificates model exactly this order):
            # attn_out = z W_O + b_O; resid_mid = resid_pre + attn_out; likewise the MLP
            x = x + (torch.einsum("bhte,hed->btd", z, a.W_O) + a.b_O)
            x = x + (torch.relu(x @ m.W_in + m.b_in) @ m.W_out + m.b_out)
        return x @ self.unembed.W_U + self.unembed.b_U

    def decode(self, logits) -> list[Any]:
        """Answers for logits [B, T, d_vocab_out] (last position; ties -> lowest index)."""
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
