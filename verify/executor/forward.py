"""The forward pass in its plainest form, with every activation kept under its TransformerLens
hook name.

This is the executor's semantics written out once, position by position and head by head, with
no shortcut: every arithmetic step is the format's operation, in the order of a TransformerLens
``HookedTransformer`` forward pass without normalisation (see :mod:`exactformer.constructions.core.ir`).
:func:`exactformer.verify.executor.exact.run` computes the same logits with shortcuts that provably do
not change them; the tests compare the two bit for bit.

Hook names and shapes (B inputs, T positions, H heads)::

    hook_embed, hook_pos_embed                      [B, T, d_model]
    blocks.{l}.hook_resid_pre                       [B, T, d_model]
    blocks.{l}.attn.hook_q / hook_k / hook_v        [B, T, H, d_head]
    blocks.{l}.attn.hook_attn_scores                [B, H, T, T]   (masked entries: the format's minimum)
    blocks.{l}.attn.hook_pattern                    [B, H, T, T]
    blocks.{l}.attn.hook_z                          [B, T, H, d_head]
    blocks.{l}.hook_attn_out, hook_resid_mid        [B, T, d_model]
    blocks.{l}.mlp.hook_pre / hook_post             [B, T, d_mlp]
    blocks.{l}.hook_mlp_out, hook_resid_post        [B, T, d_model]
    unembed.hook_logits                             [B, T, d_vocab_out]

Values are raw values of the format (numpy ``int64``, or ``object`` for very wide formats; plain
floats for float formats); :class:`Cache` turns them into exact :class:`ExactTensor` values.

A model with a ``vector_input`` takes :class:`~exactformer.constructions.core.ir.Inputs`: ``hook_embed``
is then ``add(W_E[token], vector)`` (the vector's values in the declared columns, zero elsewhere).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.constructions.core.ir import CompiledModel, ExactTensor, split_inputs
from exactformer.precision import Format


@dataclass(eq=False)
class Cache(Mapping):
    """Activations of one forward pass by hook name (raw values of ``fmt``), a read-only mapping like
    TransformerLens's ``ActivationCache``: ``cache[name]``, ``name in cache``, ``len(cache)``,
    iteration over the hook names in forward order, ``keys()``, ``values()``, ``items()``."""

    fmt: Format
    raw: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> ExactTensor | np.ndarray:
        """The activation as an exact tensor (fixed point) or float array (float formats)."""
        r = self.raw[name]
        if not self.fmt.is_exact:
            return np.asarray(r)
        return ExactTensor(np.asarray(r), int(self.fmt.scale))

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


@functools.singledispatch
def forward_with_cache(model: Any, tokens: Any, fmt: Format) -> tuple[np.ndarray, Cache]:
    """All logits [B, T, d_vocab_out] (raw) and the cache of every activation, by the plain forward
    pass of the model's kind (the transformer's below; a recurrent model's in
    :mod:`exactformer.verify.executor.recurrent`)."""
    raise TypeError(f"no forward pass for a {type(model).__name__}")


@forward_with_cache.register
def forward_transformer(model: CompiledModel, tokens: Any, fmt: Format) -> tuple[np.ndarray, Cache]:
    """All logits [B, T, d_vocab_out] (raw) and the cache of every activation, for token ids [B, T]
    (or :class:`~exactformer.constructions.core.ir.Inputs` for a model that reads input vectors)."""
    tokens, vectors = split_inputs(model, tokens)
    tokens = np.asarray(tokens, dtype=np.int64)
    B, T = tokens.shape
    cache = Cache(fmt)
    keep = cache.raw
    E = model.embed.raw(tokens.reshape(-1), fmt).reshape(B, T, -1)
    if vectors is not None:
        vi = model.vector_input
        E = np.array(E)
        E[..., vi.col : vi.col + vi.width] = np.asarray(fmt.add(E[..., vi.col : vi.col + vi.width], vectors.raw(fmt)))
    P = model.pos_embed.raw(np.arange(T), fmt)[None].repeat(B, axis=0)
    keep["hook_embed"], keep["hook_pos_embed"] = E, P
    x = np.asarray(fmt.add(E, P))
    for l, blk in enumerate(model.blocks):
        a, m = blk.attn, blk.mlp
        pre = f"blocks.{l}."
        keep[pre + "hook_resid_pre"] = x
        heads = {w: [] for w in ("q", "k", "v", "z")}
        scores, patterns = [], []
        for h in range(a.n_heads):
            q = np.asarray(fmt.add(fmt.matmul(x, a.W_Q.raw(fmt)[h]), a.b_Q.raw(fmt)[h]))
            k = np.asarray(fmt.add(fmt.matmul(x, a.W_K.raw(fmt)[h]), a.b_K.raw(fmt)[h]))
            v = np.asarray(fmt.add(fmt.matmul(x, a.W_V.raw(fmt)[h]), a.b_V.raw(fmt)[h]))
            s = np.asarray(fmt.matmul(q, np.swapaxes(k, -1, -2)))  # [B, T, T]
            if a.causal:
                pat = np.zeros_like(s)
                for t in range(T):
                    pat[:, t, : t + 1] = np.asarray(fmt.softmax(s[:, t, : t + 1], axis=-1))
                s = np.where(np.tril(np.ones((T, T), dtype=bool))[None], s, fmt.min_raw if fmt.is_exact else -np.inf)
            else:
                pat = np.asarray(fmt.softmax(s, axis=-1))
            z = np.asarray(fmt.matmul(pat, v))
            for name, val in (("q", q), ("k", k), ("v", v), ("z", z)):
                heads[name].append(val)
            scores.append(s)
            patterns.append(pat)
        for name in ("q", "k", "v", "z"):
            keep[pre + f"attn.hook_{name}"] = np.stack(heads[name], axis=2)
        keep[pre + "attn.hook_attn_scores"] = np.stack(scores, axis=1)
        keep[pre + "attn.hook_pattern"] = np.stack(patterns, axis=1)
        z_cat = keep[pre + "attn.hook_z"].reshape(B, T, -1)
        W_O = a.W_O.raw(fmt).reshape(-1, model.d_model)
        attn_out = np.asarray(fmt.add(fmt.matmul(z_cat, W_O), a.b_O.raw(fmt)))
        keep[pre + "hook_attn_out"] = attn_out
        x = np.asarray(fmt.add(x, attn_out))
        keep[pre + "hook_resid_mid"] = x
        hpre = np.asarray(fmt.add(fmt.matmul(x, m.W_in.raw(fmt)), m.b_in.raw(fmt)))
        hpost = np.asarray(fmt.relu(hpre))
        mlp_out = np.asarray(fmt.add(fmt.matmul(hpost, m.W_out.raw(fmt)), m.b_out.raw(fmt)))
        keep[pre + "mlp.hook_pre"], keep[pre + "mlp.hook_post"], keep[pre + "hook_mlp_out"] = hpre, hpost, mlp_out
        x = np.asarray(fmt.add(x, mlp_out))
        keep[pre + "hook_resid_post"] = x
    logits = np.asarray(fmt.add(fmt.matmul(x, model.W_U.raw(fmt)), model.b_U.raw(fmt)))
    keep["unembed.hook_logits"] = logits
    return logits, cache


def forward_reference(model: Any, tokens: Any, fmt: Format) -> np.ndarray:
    """Logits at the model's answer positions [B, A, d_vocab_out] by the plain forward pass."""
    logits, _ = forward_with_cache(model, tokens, fmt)
    return logits[:, model.answer_positions_for(logits.shape[1]), :]

