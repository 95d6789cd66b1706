"""Exports of a built model: files, plain torch, TransformerLens (docs/exports.md).

| module | what |
|---|---|
| ``files`` | ``save`` / ``load``: the float and exact safetensors files and the manifest |
| ``recurrent`` | the same files for a recurrent model (a ``torch.nn.RNN`` state dict), registered on ``save`` / ``load`` |
| ``manifest`` | the manifest's fields, digests and refusals of modified files |
| ``codes`` | position codes recorded as generators (or stored vectors) |
| ``floats`` | weights as float64, the TransformerLens config and state-dict names, padding, ``embedding_rows`` (rows generated, not stored) |
| ``torch_module`` | ``to_torch``: the float forward pass as a ``torch.nn.Module`` (a recurrent model: ``torch.nn.RNN``) |
| ``lens`` | ``to_transformer_lens``: a TransformerLens 4 ``TransformerBridge`` |

``to_torch`` and ``to_transformer_lens`` are imported when first asked for: they need torch, whose
import takes seconds, and saving, loading or verifying a model does not.
"""

from typing import Any

from exactformer.constructions.export.files import (DEFAULT_MATERIALIZE_LIMIT, EXACT_FILE, MANIFEST_FILE, WEIGHTS_FILE,
                                                    ExportError, ManifestError, load, read_manifest, save, tl_config,
                                                    tl_state_dict)
from exactformer.constructions.export import recurrent  # noqa: F401  (registers the recurrent files)
from exactformer.constructions.export.floats import embedding_rows
from exactformer.constructions.export.manifest import UntrustedCode

__all__ = ["save", "load", "read_manifest", "to_torch", "to_transformer_lens", "tl_config", "tl_state_dict",
           "embedding_rows", "ExportError", "ManifestError", "UntrustedCode", "DEFAULT_MATERIALIZE_LIMIT", "WEIGHTS_FILE", "EXACT_FILE", "MANIFEST_FILE"]


def __getattr__(name: str) -> Any:
    if name == "to_torch":
        from exactformer.constructions.export.torch_module import to_torch

        return to_torch
    if name == "to_transformer_lens":
        from exactformer.constructions.export.lens import to_transformer_lens

        return to_transformer_lens
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
