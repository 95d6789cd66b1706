"""A :class:`~exactformer.constructions.core.ir.CompiledModel` as a TransformerLens 4.x
``TransformerBridge`` (optional extra ``exactformer[lens]``; the loading path is described in
docs/exports.md, "TransformerLens 4.x")."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from exactformer.constructions.export.floats import ExportError, tl_config, tl_state_dict, warn_arithmetic
from exactformer.constructions.core.ir import CompiledModel

LENS_HINT = "pip install 'exactformer[lens]'"


@functools.singledispatch
def to_transformer_lens(model: Any, dtype: Any = None, device: Any = None):
    """A TransformerLens 4.x ``TransformerBridge`` running ``model``: transformers only (a
    recurrent model has no TransformerLens form; ``to_torch`` gives its ``torch.nn.RNN``)."""
    raise ExportError(f"model: {getattr(model, 'construction', type(model).__name__)} is not a transformer: "
                      "TransformerLens runs transformers only (to_torch gives its torch module)")


@to_transformer_lens.register
def to_transformer_lens_transformer(model: CompiledModel, dtype: Any = None, device: Any = None):
    """A TransformerLens 4.x ``TransformerBridge`` running ``model`` (optional extra ``[lens]``).

    Built with ``TransformerBridge.boot_native`` on a ``TransformerBridgeConfig(...,
    architecture="TransformerLensNative")``; the float64 HookedTransformer-format state dict is
    converted with ``convert_tl_checkpoint`` and loaded strictly. The native bridge divides
    attention scores by sqrt(d_head) (it refuses ``attn_scale=1`` for d_head > 1), so sqrt(d_head)
    is folded into ``W_Q`` and ``b_Q``: scores are then the construction's unscaled scores up to
    float rounding (the float certificates allow for it). Embeddings are materialised in full
    (TransformerLens needs dense tables). Warns (``ArithmeticWarning``) when the build did not
    check ``dtype``'s arithmetic.
    """
    try:  # optional dependency: the extra [lens]
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.model_bridge import TransformerBridge
        from transformer_lens.utilities.tl_checkpoint_conversion import convert_tl_checkpoint
    except ImportError as e:
        raise ImportError(
            f"to_transformer_lens needs TransformerLens 4.x ({e}); install it with: {LENS_HINT}"
        ) from e

    cfg_d = tl_config(model)
    if cfg_d["attention_dir"] == "mixed":
        raise ExportError("TransformerLens cannot express layers that mix causal and bidirectional attention")
    dtype = torch.float64 if dtype is None else dtype
    warn_arithmetic(model, str(dtype).removeprefix("torch."), "to_transformer_lens")
    sd = tl_state_dict(model)
    scale = math.sqrt(model.d_head)
    for l in range(model.n_layers):
        sd[f"blocks.{l}.attn.W_Q"] = sd[f"blocks.{l}.attn.W_Q"] * scale
        sd[f"blocks.{l}.attn.b_Q"] = sd[f"blocks.{l}.attn.b_Q"] * scale
    cfg = TransformerBridgeConfig(
        d_model=cfg_d["d_model"],
        d_head=cfg_d["d_head"],
        n_layers=cfg_d["n_layers"],
        n_ctx=cfg_d["n_ctx"],
        n_heads=cfg_d["n_heads"],
        d_mlp=cfg_d["d_mlp"],
        d_vocab=cfg_d["d_vocab"],
        d_vocab_out=cfg_d["d_vocab_out"],
        act_fn="relu",
        normalization_type=None,
        attention_dir=cfg_d["attention_dir"],
        positional_embedding_type="standard",
        architecture="TransformerLensNative",
        dtype=dtype,
        init_weights=False,
    )
    bridge = TransformerBridge.boot_native(cfg, device=device, dtype=dtype)
    tsd = {k: torch.as_tensor(v, dtype=dtype) for k, v in sd.items()}
    converted = convert_tl_checkpoint(tsd, cfg)
    bridge.load_state_dict(converted, strict=True)
    bridge.eval()
    return bridge
