"""Saved files of a :class:`~exactformer.constructions.core.ir.CompiledModel` and loading them.

``save(model, out_dir)`` writes three files (docs/exports.md describes them in full):

* ``model.safetensors``: float64 tensors under TransformerLens ``HookedTransformer`` state-dict
  names and shapes (``embed.W_E``, ``pos_embed.W_pos``, ``blocks.{l}.attn.W_Q`` ...,
  ``unembed.W_U``, ``unembed.b_U``) and nothing else, so TransformerLens' strict loaders accept it.
  Every value is the correctly rounded float64 of the exact rational weight. The compact form
  (``dense=False``) leaves out ``W_E`` and ``W_pos``: their rows are generated from the recorded
  position codes (as they are in the dense form beyond ``materialize_limit`` entries).
* ``model.exact.safetensors``: int64 numerators of every exact tensor, the index tables and stored
  vectors of codes that are not generated, and (metadata) the digests of every manifest field.
* ``manifest.json``: metadata, vocabularies, how an input is encoded, the TransformerLens config,
  the embedding layout with the position codes' recipes, the denominators, the sha256 of both
  weight files.

``load(out_dir)`` checks everything it reads (:func:`~exactformer.constructions.export.manifest.read_manifest`:
a modified file or manifest field is refused with a :class:`ManifestError` naming it) and rebuilds
the exact model with its embeddings generated on demand (the float forward passes are
:mod:`~exactformer.constructions.export.torch_module` and :mod:`~exactformer.constructions.export.lens`).
"""

from __future__ import annotations

import importlib.metadata

import contextlib
import functools
import json
import math
import os
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from exactformer.constructions.export.codes import CodeRecord, rebuild
from exactformer.constructions.export.floats import (
    ExportError,
    embedding_float,
    embedding_rows_float,
    pad,
    tl_config,
    tl_shape,
    tl_state_dict,
    to_float64,
)
from exactformer.constructions.export.manifest import (
    DIGESTS_KEY,
    EXACT_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    MODEL_FIELDS,
    READOUT,
    WEIGHTS_FILE,
    ManifestError,
    code_of,
    dumps_manifest,
    encoding_of,
    field_digests,
    frac_str,
    jsonable,
    read_manifest,
    require_code,
    sha256_file,
)
from exactformer.constructions.core.ir import (
    MLP,
    ModelIR,
    Attention,
    TransformerBlock,
    CodeBlock,
    CompiledModel,
    Embedding,
    ExactTensor,
    IRError,
    check_shapes,
)

__all__ = [
    "save",
    "load",
    "read_manifest",
    "tl_config",
    "tl_state_dict",
    "ExportError",
    "ManifestError",
    "DEFAULT_MATERIALIZE_LIMIT",
    "WEIGHTS_FILE",
    "EXACT_FILE",
    "MANIFEST_FILE",
]

#: dense form: W_E / W_pos are materialised in model.safetensors up to this many entries (2^26 float64 = 512 MiB)
DEFAULT_MATERIALIZE_LIMIT = 1 << 26
SAMPLE_ROWS = 256  # random embedding rows compared with a materialised W_E / W_pos (plus every block's ends)
_INT64_MAX = (1 << 63) - 1
_MAX_LISTED_INEXACT = 64  # inexact values listed per tensor in the manifest (all are in the exact file)
CERTIFIED_KEYS = ("certified", "not_certified")
EXACTNESS_NOTE = (
    "model.safetensors (dense form) holds the correctly rounded float64 of each exact weight num/den (numerators in "
    "model.exact.safetensors, den in this manifest); weights_exact_in_float64 (per tensor: exact_in_float64) says "
    "whether that float64 is the weight itself. It says nothing about arithmetic: the construction is proved for "
    "the fixed-point format `precision`, and a float32 or float64 forward pass with these exact weights may "
    "answer differently; certified_arithmetics lists what was checked."
)


# ------------------------------------------------------------------------------------------------
# save
# ------------------------------------------------------------------------------------------------


def _int64(num: np.ndarray) -> np.ndarray | None:
    """``num`` as an int64 array, or None when an entry does not fit."""
    num = np.asarray(num)
    if num.dtype == np.int64:
        return np.ascontiguousarray(num)
    if num.dtype != object and np.issubdtype(num.dtype, np.integer):
        return np.ascontiguousarray(num.astype(np.int64))
    flat = [int(v) for v in num.reshape(-1)]
    if any(abs(v) > _INT64_MAX for v in flat):
        return None
    return np.array(flat, dtype=np.int64).reshape(num.shape)


def _embedding_exactness(emb: Embedding) -> tuple[int, list[Fraction]]:
    """(common denominator of the rows, distinct values float64 cannot hold exactly)."""
    den = math.lcm(int(emb.table.den), *[b.scale.denominator for b in emb.blocks])
    cands = {Fraction(int(v), emb.table.den) for v in np.unique(emb.table.num)} if emb.table.num.size else set()
    for b in emb.blocks:
        cands.update([b.scale, -b.scale])
    inexact = [f for f in sorted(cands) if Fraction(f.numerator / f.denominator) != f]
    return den, inexact


def tensor_entry(name: str, num: np.ndarray, den: int, inexact: list[Fraction], exact: dict, manifest_big: dict,
                  extra: dict | None = None) -> dict[str, Any]:
    """The manifest entry of an exact tensor ``num / den``, its nonzero numerators stored sparsely:
    flat indices ``{name}.index`` and numerators ``{name}.numerators`` (int64) in the exact file."""
    flat = np.asarray(num).reshape(-1)
    index = np.flatnonzero(flat).astype(np.int64)
    values = flat[index]
    entry: dict[str, Any] = {"shape": list(num.shape), "den": int(den), "exact_in_float64": not inexact}
    if inexact:
        entry["inexact_values"] = [frac_str(f) for f in inexact[:_MAX_LISTED_INEXACT]]
        entry["inexact_count"] = len(inexact)
    exact[f"{name}.index"] = index
    entry["nonzero"] = int(index.size)
    entry["index"] = f"{EXACT_FILE}:{name}.index"
    v64 = _int64(values)
    if v64 is not None:
        exact[f"{name}.numerators"] = v64
        entry["numerators"] = f"{EXACT_FILE}:{name}.numerators"
    else:  # numerators beyond int64: decimal strings in the manifest
        manifest_big[name] = [str(int(v)) for v in values]
        entry["numerators"] = f"{MANIFEST_FILE}:big_numerators.{name}"
    if extra:
        entry.update(extra)
    return entry


def certified_json(value: Any) -> dict[str, list[str]] | None:
    """``certified_arithmetics`` as the manifest records it (None: nothing recorded)."""
    if value is None:
        return None
    ok = isinstance(value, Mapping) and set(value) <= set(CERTIFIED_KEYS) and all(
        isinstance(v, (list, tuple)) and all(isinstance(s, str) for s in v) for v in value.values())
    if not ok:
        raise ExportError("certified_arithmetics must be None or a mapping {'certified': [names], 'not_certified': "
                          f"[names]}} of arithmetic names (e.g. format names), got {value!r}")
    return {k: list(value.get(k, ())) for k in CERTIFIED_KEYS}


def atomic_write(path: Path, write) -> None:
    """Write via a temporary file and rename, with the usual umask-based permissions."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


@functools.singledispatch
def save(model: Any, out_dir: str | os.PathLike, dense: bool = True, materialize_limit: int = DEFAULT_MATERIALIZE_LIMIT,
         certified_arithmetics: Mapping[str, list[str]] | None = None) -> Path:
    """Write ``model`` to ``out_dir``: the files of the model's kind (a transformer's below; a
    recurrent model's in :mod:`exactformer.constructions.export.recurrent`), registered next to
    each implementation."""
    raise ExportError(f"model: no export for a {type(model).__name__}")


def check_save_options(dense: Any, materialize_limit: Any) -> None:
    """``dense`` a bool and ``materialize_limit`` an integer >= 0, or ExportError naming them."""
    if not isinstance(dense, bool):
        raise ExportError(f"dense must be True (dense float file) or False (compact), got {dense!r}")
    if isinstance(materialize_limit, bool) or not isinstance(materialize_limit, (int, np.integer)) or materialize_limit < 0:
        raise ExportError(f"materialize_limit must be an integer >= 0, got {materialize_limit!r}")


def out_directory(out_dir: str | os.PathLike) -> Path:
    """``out_dir`` as the directory a save writes, created if missing (an earlier export's files in it
    are replaced); ExportError naming ``out_dir`` where it is an existing file or cannot be created
    (mkdir raised a bare FileExistsError before)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ExportError(f"out_dir: {str(out)!r} is an existing file, not a directory; give a directory (created "
                          "if missing; the files of an earlier export in it are replaced)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"out_dir: cannot create {str(out)!r}: {e.strerror}") from None
    return out


@save.register
def save_transformer(model: CompiledModel, out_dir: str | os.PathLike, dense: bool = True,
                     materialize_limit: int = DEFAULT_MATERIALIZE_LIMIT,
                     certified_arithmetics: Mapping[str, list[str]] | None = None) -> Path:
    """Write ``model`` to ``out_dir`` (created if needed); returns the directory as a Path.

    Files: ``model.safetensors`` (float64, TransformerLens names only), ``model.exact.safetensors``
    (int64 numerators, code tables, manifest digests), ``manifest.json`` (see docs/exports.md).

    ``dense``: True writes ``W_E`` / ``W_pos`` into ``model.safetensors`` when they have at most
    ``materialize_limit`` entries (default 2^26), so TransformerLens and plain torch load it without
    exactformer; False is the compact form: they are never written, and :func:`load` generates
    their rows from the recorded position codes. ``certified_arithmetics``: the arithmetics the
    model is certified in and those it is not, ``{"certified": [names], "not_certified": [names]}``,
    recorded as given (default None: the manifest claims nothing).
    """
    check_shapes(model)
    check_save_options(dense, materialize_limit)
    certified = certified_json(certified_arithmetics)
    out = out_directory(out_dir)

    floats: dict[str, np.ndarray] = {}
    exact: dict[str, np.ndarray] = {}
    big: dict[str, list[str]] = {}
    codes = CodeRecord()

    # ---- embeddings: dense table + code blocks (codes recorded once, shared ones shared on load) --
    layout: dict[str, Any] = {}
    for prefix, key, emb in (("embed", "embed.W_E", model.embed), ("pos_embed", "pos_embed.W_pos", model.pos_embed)):
        materialized = dense and emb.n_rows * emb.d_model <= materialize_limit
        den, inexact = _embedding_exactness(emb)
        t = emb.table
        layout[prefix] = {
            "key": key,
            "n_rows": emb.n_rows,
            "d_model": emb.d_model,
            "materialized": materialized,
            "den": int(den),
            "exact_in_float64": not inexact,
            **({"inexact_values": [frac_str(f) for f in inexact[:_MAX_LISTED_INEXACT]]} if inexact else {}),
            "table": tensor_entry(f"{prefix}.table", t.num, t.den, to_float64(t.num, t.den)[1], exact, big,
                                   {"first_row": emb.table_first_row}),
            "blocks": [{"code": codes.ref(b.code, b.code_start + b.count), "first_row": b.first_row, "count": b.count,
                        "col": b.col, "code_start": b.code_start, "scale": frac_str(Fraction(b.scale))}
                       for b in emb.blocks],
        }
        if materialized:
            floats[key] = embedding_float(emb)
        else:
            layout[prefix]["not_materialized"] = not_materialized(key, emb, layout[prefix]["blocks"])

    # ---- non-embedding weights --------------------------------------------------------------------
    tensors: dict[str, Any] = {}
    for name, t in model.tensors().items():
        f, inexact = to_float64(t.num, t.den)
        if dense:
            floats[name] = np.ascontiguousarray(pad(f, tl_shape(model, name)))
        tensors[name] = tensor_entry(name, t.num, t.den, inexact, exact, big, {"tl_shape": list(tl_shape(model, name))})

    # ---- the construction's position code ------------------------------------------------------------
    code = model.position_code
    model_code = None if code is None else codes.ref(code, int(getattr(code, "n", 0)))
    exact.update(codes.arrays)

    # ---- files: the float file (dense form), then the manifest's digests into the exact file ------
    wpath, epath = out / WEIGHTS_FILE, out / EXACT_FILE
    meta = {"format": "pt"}  # one key each: safetensors writes metadata in arbitrary order, files stay reproducible
    files: dict[str, Any] = {}
    if dense:
        atomic_write(wpath, lambda p: save_file({k: np.ascontiguousarray(v) for k, v in floats.items()}, str(p), metadata=meta))
        files[WEIGHTS_FILE] = {"sha256": sha256_file(wpath), "bytes": wpath.stat().st_size,
                               "keys": {k: "float64" for k in sorted(floats)}}
    elif wpath.exists():  # a dense export's float file would no longer match the exact one
        wpath.unlink()
    files[EXACT_FILE] = {"keys": {k: str(exact[k].dtype) for k in sorted(exact)}}
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "exactformer_version": importlib.metadata.version("exactformer"),
        "architecture": "transformer",
        **{name: to_json(getattr(model, name)) for name, (to_json, _) in MODEL_FIELDS.items()},
        "summary": model.summary(),
        "output_vocab": model.output_vocab,
        "encoding": encoding_of(model.construction),
        "code": code_of(model),
        "readout": READOUT,
        "certified_arithmetics": certified,
        "exactness": {
            "weights_exact_in_float64": all(e["exact_in_float64"] for e in tensors.values())
            and all(lay["exact_in_float64"] for lay in layout.values()),
            "note": EXACTNESS_NOTE,
        },
        "files": files,
        "transformer_lens_config": tl_config(model),
        "layers": [{"causal": bool(b.attn.causal), "n_heads": b.attn.n_heads, "d_head": b.attn.d_head,
                    "d_mlp": b.mlp.d_mlp} for b in model.blocks],
        "dense": dense,
        "materialize_limit": int(materialize_limit),
        "embedding": layout,
        "codes": codes.entries,
        "model_code": model_code,
        "tensors": tensors,
        **({"big_numerators": big} if big else {}),
    }
    manifest = jsonable(manifest)  # exactly what load() will read back
    digests = json.dumps(field_digests(manifest), separators=(",", ":"))
    atomic_write(epath, lambda p: save_file(exact, str(p), metadata={DIGESTS_KEY: digests}))
    manifest["files"][EXACT_FILE].update(sha256=sha256_file(epath), bytes=epath.stat().st_size)
    text = dumps_manifest(manifest)
    atomic_write(out / MANIFEST_FILE, lambda p: p.write_text(text))
    return out


def not_materialized(key: str, emb: Embedding, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """What the manifest says of an embedding left out of ``model.safetensors``: that it is not
    materialised (its size), how a client regenerates row r, and the function that does it."""
    entries = emb.n_rows * emb.d_model
    polys = {str(rec["code"]): int(b.code.field.poly) for rec, b in zip(blocks, emb.blocks) if hasattr(b.code, "field")}
    return {
        "statement": (f"{key} [{emb.n_rows} x {emb.d_model}] ({entries} float64 entries, {8 * entries} bytes) is not "
                      "materialised in any file. Row r is generated: the table row r - table.first_row (where r "
                      "lies in the table), plus, for every block with first_row <= r < first_row + count, scale "
                      "times vector code_start + r - first_row of codes[code] in columns col .. col + k - 1 (a "
                      "Reed-Solomon∘Hadamard vector i: entry x*q + b is (-1)^popcount(f_i(x) & b), f_i the "
                      "polynomial over GF(2^m) whose coefficients are the base-q digits of i, the field taken "
                      "modulo field_polys[code]; docs/exports.md, 'Generated rows')."),
        "function": "exactformer.constructions.export.embedding_rows(model, which, rows)",
        "field_polys": polys,
    }


# ------------------------------------------------------------------------------------------------
# load
# ------------------------------------------------------------------------------------------------


def _sample_rows(emb: Embedding, seed: int = 0) -> np.ndarray:
    """Rows compared between generated and stored embeddings: every dense-table row (up to
    4096), the first, middle and last row of every code block, and SAMPLE_ROWS random rows."""
    rows: set[int] = set()
    tr = emb.table_rows
    if len(tr) <= 4096:
        rows.update(tr)
    else:
        rows.update([tr.start, tr.stop - 1])
    for b in emb.blocks:
        rows.update([b.first_row, b.first_row + b.count // 2, b.first_row + b.count - 1])
    rng = np.random.default_rng(seed)
    rows.update(int(r) for r in rng.integers(0, emb.n_rows, size=min(emb.n_rows, SAMPLE_ROWS)))
    return np.array(sorted(r for r in rows if 0 <= r < emb.n_rows), dtype=np.int64)


def load(out_dir: str | os.PathLike, trust_code: bool = False) -> ModelIR:
    """Rebuild the exact model saved by :func:`save` in ``out_dir`` (the manifest's ``architecture``
    picks the loader, :data:`LOADERS`). A construction or block defined outside exactformer comes
    from the module the manifest's ``code`` field names, imported only with ``trust_code``
    (:func:`~exactformer.constructions.export.manifest.require_code`).

    Checks, each failure a :class:`ManifestError` naming the file (and the field): both weight
    files match their sha256 and every manifest field its digest (:func:`read_manifest`); every
    float64 weight in ``model.safetensors`` equals the correctly rounded exact weight; a
    materialised ``W_E``/``W_pos`` equals the generated rows on a sample. Position codes are
    rebuilt from their recipes (blocks that shared a code share it again); embedding rows are
    generated on demand, never materialised.
    """
    d = Path(out_dir)
    man = read_manifest(d)
    require_code(d, man, trust_code)
    architecture = man.get("architecture", "transformer")
    if architecture not in LOADERS:
        raise ManifestError(f"{d / MANIFEST_FILE}: field architecture {architecture!r} is not one of {sorted(LOADERS)}")
    try:
        return LOADERS[architecture](d, man)
    except ManifestError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, IRError) as e:
        raise ManifestError(f"{d / MANIFEST_FILE}: malformed or inconsistent manifest: {type(e).__name__}: {e}") from e


def exact_reader(d: Path, man: dict[str, Any], exact: dict[str, np.ndarray]) -> Callable[[dict[str, Any], str], ExactTensor]:
    """A function ``(manifest entry, where) -> ExactTensor`` reading a tensor written by
    :func:`tensor_entry` from the exact file's arrays ``exact`` (or the manifest's big numerators)."""
    epath = d / EXACT_FILE
    big = man.get("big_numerators", {})

    def stored(ref: str, where: str) -> np.ndarray:
        src, _, key = ref.partition(":")
        if src == EXACT_FILE:
            if key not in exact:
                raise ManifestError(f"{epath}: missing tensor {key!r} ({where})")
            return exact[key]
        return np.array([int(v) for v in big[key.split(".", 1)[1]]], dtype=object)

    def tensor(entry: dict[str, Any], where: str) -> ExactTensor:
        shape = tuple(int(s) for s in entry["shape"])
        size = math.prod(shape)
        index, values = stored(entry["index"], where), stored(entry["numerators"], where)
        if index.shape != values.shape or index.ndim != 1 or (index.size and not 0 <= index.min() <= index.max() < size):
            raise ManifestError(f"{epath}: the nonzero indices of {where} do not fit its numerators or shape {list(shape)}")
        num = np.zeros(size, dtype=object if values.dtype == object else np.int64)
        num[index] = values
        return ExactTensor(num.reshape(shape), int(entry["den"]))

    return tensor


def _build(d: Path, man: dict[str, Any]) -> CompiledModel:
    """The transformer of an export directory (its manifest already checked)."""
    wpath, epath = d / WEIGHTS_FILE, d / EXACT_FILE
    exact = load_file(str(epath))
    tensor = exact_reader(d, man, exact)

    codes = rebuild(man["codes"], exact)
    dense_file = WEIGHTS_FILE in man["files"]
    with safe_open(str(wpath), framework="np") if dense_file else contextlib.nullcontext() as wf:
        wkeys = set(wf.keys()) if dense_file else set()
        # ---- weights, cross-checked against the float file (dense form) -------------------------
        weights: dict[str, ExactTensor] = {}
        for name, entry in man["tensors"].items():
            t = tensor(entry, name)
            if dense_file:
                if name not in wkeys:
                    raise ManifestError(f"{wpath}: missing tensor {name!r}")
                expect = pad(to_float64(t.num, t.den)[0], tuple(entry["tl_shape"]))
                got = wf.get_tensor(name)
                if got.shape != expect.shape or not np.array_equal(got, expect):
                    raise ManifestError(f"{wpath}: {name} differs from its exact value in {epath}")
            weights[name] = t

        # ---- embeddings: table + code blocks; a materialised copy is compared on a sample ------------
        embs = {}
        for prefix in ("embed", "pos_embed"):
            lay = man["embedding"][prefix]
            n_rows, dm = int(lay["n_rows"]), int(lay["d_model"])
            blocks = tuple(
                CodeBlock(codes[b["code"]], int(b["first_row"]), int(b["count"]), int(b["col"]),
                          int(b["code_start"]), Fraction(str(b["scale"])))
                for b in lay["blocks"]
            )
            emb = Embedding(n_rows, dm, tensor(lay["table"], f"{prefix}.table"), int(lay["table"]["first_row"]), blocks)
            if lay["materialized"]:
                key = lay["key"]
                if key not in wkeys:
                    raise ManifestError(f"{wpath}: missing {key} (the manifest says it is materialised)")
                sl = wf.get_slice(key)
                if tuple(sl.get_shape()) != (n_rows, dm):
                    raise ManifestError(f"{wpath}: {key} has shape {sl.get_shape()}, expected {[n_rows, dm]}")
                rows = _sample_rows(emb)
                got = np.stack([sl[int(r) : int(r) + 1][0] for r in rows]) if rows.size else np.zeros((0, dm))
                if not np.array_equal(got, embedding_rows_float(emb, rows)):
                    raise ManifestError(f"{wpath}: {key} rows differ from the rows generated from {MANIFEST_FILE}/{EXACT_FILE}")
            embs[prefix] = emb

    # ---- the model -------------------------------------------------------------------------------
    blocks = []
    for l, lay in enumerate(man["layers"]):
        w = lambda n: weights[f"blocks.{l}.{n}"]  # noqa: E731
        attn = Attention(w("attn.W_Q"), w("attn.W_K"), w("attn.W_V"), w("attn.W_O"),
                         w("attn.b_Q"), w("attn.b_K"), w("attn.b_V"), w("attn.b_O"), causal=bool(lay["causal"]))
        blocks.append(TransformerBlock(attn, MLP(w("mlp.W_in"), w("mlp.b_in"), w("mlp.W_out"), w("mlp.b_out"))))
    model = CompiledModel(
        embed=embs["embed"],
        pos_embed=embs["pos_embed"],
        blocks=blocks,
        W_U=weights["unembed.W_U"],
        b_U=weights["unembed.b_U"],
        **{name: from_json(man[name]) for name, (_, from_json) in MODEL_FIELDS.items()},
    )
    model.position_code = None if man["model_code"] is None else codes[man["model_code"]]
    check_shapes(model)
    return model



#: the manifest's ``architecture`` -> the loader of its models ``(directory, manifest) -> model``
#: (:mod:`exactformer.constructions.export.recurrent` adds "recurrent" next to its implementation)
LOADERS: dict[str, Callable[[Path, dict[str, Any]], ModelIR]] = {"transformer": _build}
