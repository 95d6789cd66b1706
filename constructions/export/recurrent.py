"""Saved files of a recurrent model (:class:`~exactformer.constructions.core.recurrent.RNNModel`).

``save`` (registered on :func:`exactformer.constructions.export.files.save`) writes the same three
files as for a transformer (docs/exports.md):

* ``model.safetensors``: the float64 state dict of the module
  :func:`exactformer.constructions.export.to_torch` gives, a ``torch.nn.RNN`` (``relu``, one layer,
  ``batch_first``) between an embedding and a linear readout: ``embed.weight`` [d_vocab, d_input],
  ``rnn.weight_ih_l0`` [H, d_input], ``rnn.weight_hh_l0`` [H, H] (dense), ``rnn.bias_ih_l0`` [H]
  (b), ``rnn.bias_hh_l0`` [H] (zeros), ``h0`` [H], ``readout.weight`` [d_vocab_out, H],
  ``readout.bias`` [d_vocab_out]. Written in the dense form only, and only while H^2 is at most
  ``materialize_limit`` entries.
* ``model.exact.safetensors``: int64 numerators of every exact tensor (nonzero entries only).
* ``manifest.json``: ``architecture: "recurrent"``, the model's fields, the ``torch`` config of the
  module, how an input is encoded and the answer read, the denominators and digests.

``load`` (registered in :data:`exactformer.constructions.export.files.LOADERS`) rebuilds the exact
model after the same integrity checks, and compares every float64 weight with its exact value.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.core.recurrent import RNNModel, SparseRows
from exactformer.constructions.export.files import (DEFAULT_MATERIALIZE_LIMIT, LOADERS, EXACTNESS_NOTE, atomic_write,
                                                    certified_json, check_save_options, exact_reader, out_directory, save,
                                                    tensor_entry)
from exactformer.constructions.export.floats import ExportError, to_float64
from exactformer.constructions.export.manifest import (DIGESTS_KEY, EXACT_FILE, FORMAT_NAME, FORMAT_VERSION,
                                                       MANIFEST_FILE, MODEL_FIELDS, READOUT, WEIGHTS_FILE,
                                                       ManifestError, code_of, dumps_manifest, encoding_of, field_digests,
                                                       jsonable, sha256_file)

#: the RNNModel fields the manifest holds as plain JSON (the transformer's, less its plan and vector input)
RECURRENT_FIELDS = {k: v for k, v in MODEL_FIELDS.items() if k not in ("plan", "vector_input")}
#: exact tensor name -> (state-dict name in model.safetensors, transposed there)
STATE_DICT = {"embed": ("embed.weight", False), "W_ih": ("rnn.weight_ih_l0", False), "W_hh": ("rnn.weight_hh_l0", False),
              "b": ("rnn.bias_ih_l0", False), "h0": ("h0", False), "W_U": ("readout.weight", True),
              "b_U": ("readout.bias", False)}
ZERO_BIAS = "rnn.bias_hh_l0"
SEMANTICS = ("x_t = embed.weight[token_t]; h_t = relu(W_ih x_t + W_hh h_{t-1} + b_ih + b_hh) (torch.nn.RNN, "
             "h_0 = h0); logits_t = readout(h_t). In the fixed-point format `precision` the pre-activation is one "
             "matmul of [x_t, h_{t-1}, 1] with [W_ih | W_hh | b_ih] (rounded products, summed exactly, saturated "
             "once), then relu")


def exact_tensors(model: RNNModel) -> dict[str, ExactTensor]:
    """Every exact tensor of ``model`` by name (W_hh dense)."""
    return model.tensors() | {"W_hh": model.W_hh.dense()}


def torch_config(model: RNNModel) -> dict[str, Any]:
    """How ``model.safetensors`` loads into torch (the module :func:`~exactformer.constructions.export.to_torch` builds)."""
    return {"module": "torch.nn.RNN", "input_size": model.d_input, "hidden_size": model.hidden, "num_layers": 1,
            "nonlinearity": "relu", "bias": True, "batch_first": True, "state_dict_prefix": "rnn.",
            "embedding": "embed.weight", "initial_state": "h0", "readout": ["readout.weight", "readout.bias"],
            "semantics": SEMANTICS}


@save.register
def save_recurrent(model: RNNModel, out_dir: str | os.PathLike, dense: bool = True,
                   materialize_limit: int = DEFAULT_MATERIALIZE_LIMIT,
                   certified_arithmetics: Mapping[str, list[str]] | None = None) -> Path:
    """Write ``model`` to ``out_dir`` (module docstring); ``dense=False`` writes no float file.
    ExportError when the dense float file would hold W_hh with more than ``materialize_limit``
    entries."""
    model.check()
    check_save_options(dense, materialize_limit)
    if dense and model.hidden**2 > materialize_limit:
        raise ExportError(f"materialize_limit: the dense float file holds rnn.weight_hh_l0 with H^2 = {model.hidden ** 2} "
                          f"entries, above {materialize_limit}; save with dense=False (the exact file only)")
    certified = certified_json(certified_arithmetics)
    out = out_directory(out_dir)
    floats: dict[str, np.ndarray] = {}
    exact: dict[str, np.ndarray] = {}
    big: dict[str, list[str]] = {}
    tensors: dict[str, Any] = {}
    for name, t in exact_tensors(model).items():
        f, inexact = to_float64(t.num, t.den)
        key, transposed = STATE_DICT[name]
        if dense:
            floats[key] = np.ascontiguousarray(f.T if transposed else f)
        tensors[name] = tensor_entry(name, t.num, t.den, inexact, exact, big, {"state_dict": key, "transposed": transposed})
    if dense:
        floats[ZERO_BIAS] = np.zeros(model.hidden)
    wpath, epath = out / WEIGHTS_FILE, out / EXACT_FILE
    files: dict[str, Any] = {}
    if dense:
        atomic_write(wpath, lambda p: save_file(floats, str(p), metadata={"format": "pt"}))
        files[WEIGHTS_FILE] = {"sha256": sha256_file(wpath), "bytes": wpath.stat().st_size,
                               "keys": {k: "float64" for k in sorted(floats)}}
    elif wpath.exists():
        wpath.unlink()
    files[EXACT_FILE] = {"keys": {k: str(exact[k].dtype) for k in sorted(exact)}}
    manifest = jsonable({
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "exactformer_version": importlib.metadata.version("exactformer"),
        "architecture": "recurrent",
        **{name: to_json(getattr(model, name)) for name, (to_json, _) in RECURRENT_FIELDS.items()},
        "summary": model.summary(),
        "output_vocab": model.output_vocab,
        "encoding": encoding_of(model.construction),
        "code": code_of(model),
        "readout": READOUT,
        "certified_arithmetics": certified,
        "exactness": {"weights_exact_in_float64": all(e["exact_in_float64"] for e in tensors.values()),
                      "note": EXACTNESS_NOTE},
        "files": files,
        "torch": torch_config(model),
        "dense": dense,
        "materialize_limit": int(materialize_limit),
        "tensors": tensors,
        **({"big_numerators": big} if big else {}),
    })
    digests = json.dumps(field_digests(manifest), separators=(",", ":"))
    atomic_write(epath, lambda p: save_file(exact, str(p), metadata={DIGESTS_KEY: digests}))
    manifest["files"][EXACT_FILE].update(sha256=sha256_file(epath), bytes=epath.stat().st_size)
    text = dumps_manifest(manifest)
    atomic_write(out / MANIFEST_FILE, lambda p: p.write_text(text))
    return out


def load_recurrent(d: Path, man: dict[str, Any]) -> RNNModel:
    """The recurrent model of export directory ``d`` (its manifest already checked): the exact
    tensors, each float64 weight of a dense export compared with its exact value."""
    wpath, epath = d / WEIGHTS_FILE, d / EXACT_FILE
    tensor = exact_reader(d, man, load_file(str(epath)))
    weights = {name: tensor(entry, name) for name, entry in man["tensors"].items()}
    if WEIGHTS_FILE in man["files"]:
        floats = load_file(str(wpath))
        for name, entry in man["tensors"].items():
            t, key = weights[name], entry["state_dict"]
            expect = to_float64(t.num, t.den)[0]
            got = floats.get(key)
            if got is None or not np.array_equal(got.T if entry["transposed"] else got, expect):
                raise ManifestError(f"{wpath}: {key} differs from its exact value in {epath}")
        if not np.array_equal(floats.get(ZERO_BIAS), np.zeros(len(weights["b"].num))):
            raise ManifestError(f"{wpath}: {ZERO_BIAS} must be zero (the bias is rnn.bias_ih_l0)")
    hh = weights.pop("W_hh")
    rows, cols = np.nonzero(hh.num)
    W_hh = SparseRows.from_entries(rows, cols, hh.num[rows, cols], hh.shape, hh.den)
    model = RNNModel(W_hh=W_hh, **weights, **{name: from_json(man[name]) for name, (_, from_json) in RECURRENT_FIELDS.items()})
    model.check()
    return model


LOADERS["recurrent"] = load_recurrent
