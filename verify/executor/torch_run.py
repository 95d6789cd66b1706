"""Running a model as users run it: the exported float forward pass in torch.

:func:`run_torch` gives the same :class:`~exactformer.verify.executor.exact.RunResult` as the exact
executor, computed by :func:`exactformer.constructions.export.to_torch` in float32 or float64 (the
module the float certificates describe, HookedTransformer's order of operations). Modules are kept
per (model content fingerprint, dtype).
"""

from __future__ import annotations

import functools
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from exactformer.constructions.export import to_torch
from exactformer.constructions.export.floats import ArithmeticWarning
from exactformer.constructions.core.ir import CompiledModel, Inputs
from exactformer.constructions.core.recurrent import RNNModel
from exactformer.verify.executor.exact import RunResult, decode_logits
from exactformer.verify.executor.recurrent import check_tokens

#: float32/float64 are the arithmetics the float certificates cover; bfloat16/float16 run for
#: measurement only (benchmarks/bench_float_samples.py): nothing certifies them.
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
MEMORY_BUDGET = 1 << 30  # bytes a batch of the transformer's forward pass may hold (its own estimate); batches are sized to it
BATCH = 128  # inputs per batch at most (Index Lookup and Equality at N = 4096: 128 ran 5-10 % faster than 64 or 256)
RECURRENT_BUDGET = 1 << 32  # multiply-adds of one input in the dense torch.nn.RNN (T H^2); above: refused
_MODULES: "OrderedDict[tuple, torch.nn.Module]" = OrderedDict()


@functools.singledispatch
def run_torch(model: Any, tokens: np.ndarray, dtype: str = "float64", device: str = "cpu", progress: Any = None) -> RunResult:
    """Logits at the answer positions [B, A, V] by the exported float forward pass of the model's
    kind (the transformer's below; a recurrent model's in :mod:`exactformer.verify.executor.recurrent`)."""
    raise ValueError(f"no float forward pass for a {type(model).__name__}")


def torch_module(model: Any, dtype: str, device: str = "cpu") -> torch.nn.Module:
    """The exported float module of ``model`` (:func:`exactformer.constructions.export.to_torch`)
    on ``device``, kept per (content fingerprint, dtype, device)."""
    key = (model.fingerprint(), dtype, device)
    module = _MODULES.get(key)
    if module is None:
        with warnings.catch_warnings():  # the arithmetic warning is for users; running it here is the check
            warnings.simplefilter("ignore", ArithmeticWarning)
            module = to_torch(model, dtype=DTYPES[dtype], device=device)
        _MODULES[key] = module
        while len(_MODULES) > 4:
            _MODULES.popitem(last=False)
    return module


def _batch_size(module: torch.nn.Module, T: int) -> int:
    """Inputs per call of ``module`` so that its own estimate stays under :data:`MEMORY_BUDGET`."""
    one = module.memory(T, 1)
    per_input = max(1, module.memory(T, 2) - one)
    return max(1, min(BATCH, int((MEMORY_BUDGET - one) // per_input) + 1))


@functools.singledispatch
def torch_memory(model: Any, dtype: str, device: str, T: int, batch: int) -> int:
    """Bytes :func:`run_torch` holds at its peak on ``batch`` inputs of length ``T`` (the module's
    weights and its own estimate for the batches it runs); ValueError where it refuses the run."""
    raise ValueError(f"no float forward pass for a {type(model).__name__}")


@torch_memory.register
def _memory_transformer(model: CompiledModel, dtype: str, device: str, T: int, batch: int) -> int:
    module = torch_module(model, _dtype(dtype), device)
    weights = sum(b.numel() * b.element_size() for b in module.buffers())
    # the logits of every input as float64, decoded (decode_logits: a copy and a mask), and one module
    # batch's logits at the answer positions (a copy) before they are written there
    A, V, bs = len(model.answer_positions_for(T)), len(model.answers), min(batch, _batch_size(module, T))
    logits = batch * A * V * (2 * 8 + 1) + bs * A * V * max(8, DTYPES[_dtype(dtype)].itemsize)
    return weights + module.memory(T, bs) + logits


@torch_memory.register
def _memory_recurrent(model: RNNModel, dtype: str, device: str, T: int, batch: int) -> int:
    _check_recurrent(model, T)
    return 3 * T * batch * (model.hidden + model.d_input + len(model.answers)) * DTYPES[_dtype(dtype)].itemsize


def _dtype(arithmetic: str) -> str:
    """The dtype that runs ``arithmetic`` (the exact reals' closest is float64)."""
    return arithmetic if arithmetic in DTYPES else "float64"


def _check_recurrent(model: RNNModel, T: int) -> None:
    if T * model.hidden**2 > RECURRENT_BUDGET:
        raise ValueError(f"an input of length {T} needs {T * model.hidden ** 2:.3g} multiply-adds in the dense "
                         f"torch.nn.RNN (H = {model.hidden}; budget 2^32)")


@run_torch.register
def run_torch_transformer(model: CompiledModel, tokens: np.ndarray, dtype: str = "float64",
                          device: str = "cpu", progress: Any = None) -> RunResult:
    """Logits at the answer positions [B, A, V] (float64 values of the dtype's results) by the
    exported module on ``device``, in batches whose memory (the module's own estimate,
    :meth:`~exactformer.constructions.export.torch_module.ExactformerTorch.memory`) stays under
    :data:`MEMORY_BUDGET`."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    vectors = None
    if isinstance(tokens, Inputs):  # vector inputs (Theorem 7): exact values, rounded once to dtype
        vectors, tokens = tokens.vectors.num / tokens.vectors.den, tokens.tokens
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.ndim == 1:
        tokens, vectors = tokens[None], None if vectors is None else vectors[None]
    module = torch_module(model, dtype, device)
    T = tokens.shape[1]
    batch_size = _batch_size(module, T)
    pos = model.answer_positions_for(T)
    out_pos = module.output_positions(T)
    at = None if np.array_equal(out_pos, pos) else torch.as_tensor(np.searchsorted(out_pos, pos))
    logits = np.empty((len(tokens), pos.size, len(model.answers)), np.float64)  # filled batch by batch
    with torch.no_grad():
        for s in range(0, len(tokens), batch_size):
            vec = None if vectors is None else torch.as_tensor(vectors[s : s + batch_size], dtype=torch.float64)
            out = module(torch.as_tensor(tokens[s : s + batch_size]), vec)
            out = (out if at is None else out[:, at.to(out.device)]).cpu()
            logits[s : s + len(out)] = (out if out.dtype in (torch.float32, torch.float64) else out.double()).numpy()
            if progress is not None:
                progress(len(out))
    answers, margin = decode_logits(model, logits)
    return RunResult(logits, answers, margin, {})


@run_torch.register
def run_torch_recurrent(model: RNNModel, tokens: np.ndarray, dtype: str = "float64", device: str = "cpu",
                        progress: Any = None) -> RunResult:
    """The exported recurrent module (``torch.nn.RNN`` between the embedding and the readout,
    :func:`exactformer.constructions.export.to_torch`) in ``dtype``: logits at the answer positions.
    An input whose dense run needs more than 2^32 multiply-adds (T H^2) is refused, not run."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    tokens = check_tokens(model, tokens)
    T = tokens.shape[1]
    _check_recurrent(model, T)
    pos = model.answer_positions_for(T)
    with torch.no_grad():
        out = torch_module(model, dtype, device)(torch.as_tensor(tokens))[:, torch.as_tensor(pos)].double().cpu().numpy()
    answers, margin = decode_logits(model, out)
    return RunResult(out, answers, margin, {})
