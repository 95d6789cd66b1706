"""Exact weights as float64 under TransformerLens ``HookedTransformer`` names.

* :func:`to_float64`: the correctly rounded float64 of ``num / den`` and the values it cannot hold;
* :func:`tl_config`, :func:`tl_shape`: the HookedTransformer config and per-weight shapes (layers
  narrower than the widest are zero-padded, which is exactly neutral);
* :func:`embedding_float`, :func:`embedding_rows_float`: embedding rows generated on demand;
* :func:`tl_state_dict`: the whole state dict (numpy float64), shared by the float file of an
  export and the TransformerLens bridge.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from typing import Any

import numpy as np

from exactformer.constructions.core.ir import CompiledModel, Embedding

_CHUNK = 1 << 20  # entries per chunk when materialising an embedding


class ExportError(ValueError):
    """The model cannot be exported as asked (a weight beyond float64, bad save() arguments, a
    layout TransformerLens cannot express)."""


class ArithmeticWarning(UserWarning):
    """A float export in an arithmetic the build's sufficient conditions were not checked in."""


def warn_arithmetic(model: CompiledModel, dtype_name: str, where: str) -> None:
    """Warn when ``model`` is exported to run in ``dtype_name`` ("float32" / "float64") but its
    build did not check that arithmetic (``params["arithmetics"]``): the float forward pass may then
    answer differently from the fixed-point model; ``xf.verify(m, arithmetic=...)`` decides."""
    param = model.params.get("arithmetics")
    checked = list(param.value) if param is not None else []
    if dtype_name not in checked:
        warnings.warn(f"{where}: {model.construction} was built for {', '.join(checked) or model.precision} and its "
                      f"sufficient conditions were not checked in {dtype_name}; it may answer differently there "
                      f"(xf.verify(m, arithmetic={dtype_name!r}) certifies or refutes it)", ArithmeticWarning,
                      stacklevel=3)


def _is_pow2(d: int) -> bool:
    return d > 0 and d & (d - 1) == 0


def to_float64(num: np.ndarray, den: int) -> tuple[np.ndarray, list[Fraction]]:
    """Correctly rounded float64 of ``num / den`` and the distinct values float64 cannot hold.

    Fast path: a power-of-two denominator and |num| <= 2^53 make ``num / den`` exact in float64.
    Otherwise each distinct value is rounded once with Python's correctly rounded int division.
    """
    num = np.asarray(num)
    den = int(den)
    if num.size == 0:
        return np.zeros(num.shape, np.float64), []
    if num.dtype != object and _is_pow2(den) and den < 2**1000:
        if int(np.abs(num.astype(np.int64)).max()) <= 1 << 53:
            return num.astype(np.float64) / float(den), []
    uniq, inv = np.unique(num.reshape(-1), return_inverse=True)
    vals = np.empty(len(uniq), np.float64)
    inexact: list[Fraction] = []
    for i, u in enumerate(uniq):
        f = Fraction(int(u), den)
        try:
            v = int(u) / den  # correctly rounded
        except OverflowError as e:
            raise ExportError(f"weight value {f} does not fit in float64") from e
        vals[i] = v
        if Fraction(v) != f:
            inexact.append(f)
    return vals[inv.reshape(-1)].reshape(num.shape), inexact


def _attention_dir(model: CompiledModel) -> str:
    causal = {b.attn.causal for b in model.blocks}
    if causal == {True}:
        return "causal"
    if causal <= {False}:
        return "bidirectional"
    return "mixed"


def tl_config(model: CompiledModel) -> dict[str, Any]:
    """The HookedTransformer config that runs ``model`` (as stored in the manifest).

    Layers with fewer heads, a smaller d_head or d_mlp than the widest are zero-padded in the
    float export (exactly neutral). ``attention_dir`` is "mixed" when layers disagree, which
    TransformerLens cannot express.
    """
    return {
        "n_layers": model.n_layers,
        "d_model": model.d_model,
        "d_head": model.d_head,
        "n_heads": model.n_heads,
        "d_mlp": model.d_mlp,
        "d_vocab": model.d_vocab,
        "d_vocab_out": len(model.answers),
        "n_ctx": model.n_ctx,
        "act_fn": "relu",
        "normalization_type": None,
        "attention_dir": _attention_dir(model),
        "use_attn_scale": False,
        "positional_embedding_type": "standard",
        "original_architecture": "exactformer",
        "dtype": "float64",
    }


def pad(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Zero-pad ``a`` at the end of each axis to ``shape``."""
    if tuple(a.shape) == tuple(shape):
        return a
    out = np.zeros(shape, dtype=a.dtype)
    out[tuple(slice(0, s) for s in a.shape)] = a
    return out


def tl_shape(model: CompiledModel, name: str) -> tuple[int, ...]:
    """The TransformerLens shape of non-embedding weight ``name`` (uniform over layers)."""
    H, dh, d, dm = model.n_heads, model.d_head, model.d_model, model.d_mlp
    leaf = name.split(".")[-1]
    return {
        "W_Q": (H, d, dh), "W_K": (H, d, dh), "W_V": (H, d, dh), "W_O": (H, dh, d),
        "b_Q": (H, dh), "b_K": (H, dh), "b_V": (H, dh), "b_O": (d,),
        "W_in": (d, dm), "b_in": (dm,), "W_out": (dm, d), "b_out": (d,),
        "W_U": (d, len(model.answers)), "b_U": (len(model.answers),),
    }[leaf]


def embedding_float(emb: Embedding) -> np.ndarray:
    """The full [n_rows, d_model] embedding in float64 (callers check the size first)."""
    out = np.empty((emb.n_rows, emb.d_model), np.float64)
    step = max(1, _CHUNK // max(1, emb.d_model))
    for s in range(0, emb.n_rows, step):
        rows = np.arange(s, min(emb.n_rows, s + step))
        v = emb.values(rows)
        out[rows] = to_float64(v.num, v.den)[0]
    return out


def embedding_rows_float(emb: Embedding, rows: np.ndarray) -> np.ndarray:
    """Float64 rows ``[len(rows), d_model]`` generated on demand."""
    v = emb.values(np.asarray(rows, dtype=np.int64))
    return to_float64(v.num, v.den)[0]


def embedding_rows(model: Any, which: str, rows: Any) -> np.ndarray:
    """Float64 rows ``[len(rows), d_model]`` of ``model``'s ``which`` ("embed": W_E, "pos_embed":
    W_pos), generated from the code blocks' generators (:meth:`Embedding.values`, which the exact
    executor's :meth:`Embedding.raw_reader` mirrors in the format): what a client of a file whose
    embedding is not materialised calls instead of indexing a table (the torch module does)."""
    if which not in ("embed", "pos_embed"):
        raise ExportError(f"which must be 'embed' or 'pos_embed', got {which!r}")
    return embedding_rows_float(getattr(getattr(model, "compiled", model), which), np.asarray(rows, dtype=np.int64))


def tl_state_dict(model: CompiledModel, materialize_limit: int | None = None) -> dict[str, np.ndarray]:
    """HookedTransformer state dict (numpy float64, TL names and shapes, correctly rounded).

    ``embed.W_E`` / ``pos_embed.W_pos`` are included when their entry count is at most
    ``materialize_limit`` (None: always).
    """
    sd: dict[str, np.ndarray] = {}
    for key, emb in (("embed.W_E", model.embed), ("pos_embed.W_pos", model.pos_embed)):
        if materialize_limit is None or emb.n_rows * emb.d_model <= materialize_limit:
            sd[key] = embedding_float(emb)
    for name, t in model.tensors().items():
        sd[name] = pad(to_float64(t.num, t.den)[0], tl_shape(model, name))
    return sd
