"""Exports of a :class:`~exactformer.constructions.ir.CompiledModel`: files, plain torch, TransformerLens.

``save(model, out_dir)`` writes three files (docs/exports.md describes them in full):

* ``model.safetensors``: float64 tensors under TransformerLens ``HookedTransformer`` state-dict
  names and shapes (``embed.W_E``, ``pos_embed.W_pos``, ``blocks.{l}.attn.W_Q`` ...,
  ``unembed.W_U``, ``unembed.b_U``) and nothing else, so TransformerLens' strict loaders accept it.
  Every value is the correctly rounded float64 of the exact rational weight; the manifest says,
  per tensor, whether that rounding was exact (it is for every dyadic weight of moderate size).
* ``model.exact.safetensors``: int64 numerators of every exact tensor (the embedding tables, and
  the full embeddings when they are not generated from a position code); with the denominators in
  the manifest they give every weight exactly.
* ``manifest.json``: metadata, vocabularies, the TransformerLens config, the embedding layout with
  the position codes' generators, the denominators and the sha256 of both weight files.

``W_E``/``W_pos`` are written to ``model.safetensors`` only when they have at most
``materialize_limit`` entries (default 2^26, i.e. 512 MiB of float64); beyond, the rows are
regenerated on demand from the recorded position-code generators.

``load(out_dir)`` refuses (:class:`ManifestError`, naming the file) a directory whose files do not
match the manifest's sha256, and rebuilds the exact model. ``to_torch(model)`` gives the float
forward pass as a ``torch.nn.Module``; ``to_transformer_lens(model)`` a TransformerLens 4.x
``TransformerBridge`` (optional extra ``exactformer[lens]``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from exactformer.constructions.ir import (
    MLP,
    Attention,
    Block,
    CodeBlock,
    CompiledModel,
    Embedding,
    ExactTensor,
    IRError,
    Param,
    check_shapes,
)
from exactformer.constructions.export_float import (
    ExportError,
    embedding_float,
    embedding_rows_float,
    pad,
    tl_config,
    tl_shape,
    tl_state_dict,
    to_float64,
)
from exactformer.constructions.export_lens import to_transformer_lens
from exactformer.constructions.export_torch import to_torch

__all__ = [
    "save",
    "load",
    "to_torch",
    "to_transformer_lens",
    "tl_config",
    "tl_state_dict",
    "ExportError",
    "ManifestError",
    "DEFAULT_MATERIALIZE_LIMIT",
    "WEIGHTS_FILE",
    "EXACT_FILE",
    "MANIFEST_FILE",
]

FORMAT_NAME = "exactformer-export"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
EXACT_FILE = "model.exact.safetensors"
MANIFEST_FILE = "manifest.json"
#: W_E / W_pos are materialised in model.safetensors up to this many entries (2^26 float64 = 512 MiB).
DEFAULT_MATERIALIZE_LIMIT = 1 << 26
SAMPLE_ROWS = 256  # random embedding rows compared when regenerating (plus every block's ends)
_INT64_MAX = (1 << 63) - 1
_MAX_LISTED_INEXACT = 64  # inexact values listed per tensor in the manifest (all are in the exact file)


class ManifestError(ValueError):
    """An export directory that is inconsistent: missing files, a sha256 mismatch, a malformed or
    unsupported manifest, or weights that disagree with their exact values. The message names
    the file."""


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


def _frac_str(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}"


def _json_default(o: Any) -> Any:
    if isinstance(o, Fraction):
        return _frac_str(o) if o.denominator != 1 else o.numerator
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


def _jsonable(o: Any) -> Any:
    return json.loads(json.dumps(o, default=_json_default))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# position-code generators
# ------------------------------------------------------------------------------------------------

_REGEN_KEYS = ("family", "n", "k", "m", "d", "seed", "max_inner")


def _regenerate_code(gen: dict[str, Any]) -> Any:
    """The position code a manifest generator describes (see docs/exports.md)."""
    from exactformer.constructions import position_codes as pc

    fam = gen.get("family")
    n = int(gen["n"])
    mi = Fraction(str(gen["max_inner"])) if gen.get("max_inner") is not None else Fraction(1, 4)
    if fam == "reed-solomon":
        code = pc.ReedSolomonCode(n, int(gen["m"]), int(gen["d"]), mi)
    elif fam == "random":
        code = pc.RandomSignCode(n, int(gen["k"]), int(gen["seed"] or 0), mi)
    elif fam == "onehot":
        code = pc.OneHotCode(n, mi)
    else:
        code = pc.position_codes(n, max_inner=mi, family=fam, seed=int(gen.get("seed") or 0))
    if int(code.k) != int(gen["k"]):
        raise ValueError(f"regenerated code has k = {code.k}, the manifest says {gen['k']}")
    return code


def _code_rows(code: Any, idx: np.ndarray) -> np.ndarray:
    """The code's integer vectors at ``idx`` (numerators where the code has them, else signs)."""
    fn = getattr(code, "numerators", None) or code.signs
    return np.asarray(fn(idx))


def _code_indices(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = {0, n - 1, n // 2}
    idx.update(int(i) for i in rng.integers(0, n, size=min(n, SAMPLE_ROWS)))
    return np.array(sorted(i for i in idx if 0 <= i < n), dtype=np.int64)


def _code_generator(code: Any) -> tuple[dict | None, str | None]:
    """(generator dict, None) if ``code`` can be regenerated from its describe(), else (None, why).

    Regeneration is checked at save time on a sample of indices, so a saved generator is known to
    reproduce the code's signs."""
    try:
        desc = code.describe()
    except Exception as e:  # noqa: BLE001 - any code object without a working describe()
        return None, f"describe() failed: {e}"
    if not isinstance(desc, dict) or "family" not in desc or "n" not in desc or "k" not in desc:
        return None, "describe() lacks family/n/k"
    gen = {k: desc.get(k) for k in _REGEN_KEYS}
    try:
        regen = _regenerate_code(gen)
        idx = _code_indices(int(desc["n"]))
        if not np.array_equal(_code_rows(regen, idx), _code_rows(code, idx)):
            return None, "regenerated vectors differ from the code's"
    except Exception as e:  # noqa: BLE001
        return None, f"cannot regenerate: {e}"
    return {"generator": gen, "describe": _jsonable(desc)}, None


# ------------------------------------------------------------------------------------------------
# save
# ------------------------------------------------------------------------------------------------


def _param_json(p: Param) -> dict[str, Any]:
    v = p.value
    if isinstance(v, Fraction):
        typ, val = "Fraction", _frac_str(v)
    elif isinstance(v, bool) or v is None:
        typ, val = type(v).__name__, v
    elif isinstance(v, (int, np.integer)):
        typ, val = "int", int(v)
    elif isinstance(v, (float, np.floating)):
        typ, val = "float", float(v)
    elif isinstance(v, str):
        typ, val = "str", v
    else:
        typ, val = "json", _jsonable(v)
    return {"value": val, "formula": p.formula, "type": typ}


def _param_from_json(d: dict[str, Any]) -> Param:
    v, typ = d.get("value"), d.get("type")
    if typ == "Fraction":
        v = Fraction(str(v))
    return Param(v, d.get("formula", ""))


def _sample_rows(emb: Embedding, seed: int = 0) -> np.ndarray:
    """Rows compared between regenerated and stored embeddings: every dense-table row (up to
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


def _embedding_exactness(emb: Embedding) -> tuple[int, list[Fraction]]:
    """(common denominator of the rows, distinct values float64 cannot hold exactly)."""
    den = math.lcm(int(emb.table.den), *[b.scale.denominator for b in emb.blocks])
    cands = {Fraction(int(v), emb.table.den) for v in np.unique(emb.table.num)} if emb.table.num.size else set()
    for b in emb.blocks:
        cands.update([b.scale, -b.scale])
    inexact = [f for f in sorted(cands) if Fraction(f.numerator / f.denominator) != f]
    return den, inexact


def _tensor_entry(name: str, num: np.ndarray, den: int, inexact: list[Fraction], exact: dict, manifest_big: dict,
                  extra: dict | None = None) -> dict[str, Any]:
    n64 = _int64(num)
    entry: dict[str, Any] = {"shape": list(num.shape), "den": int(den), "float64_exact": not inexact}
    if inexact:
        entry["inexact_values"] = [_frac_str(f) for f in inexact[:_MAX_LISTED_INEXACT]]
        entry["inexact_count"] = len(inexact)
    if n64 is not None:
        exact[name] = n64
        entry["numerators"] = f"{EXACT_FILE}:{name}"
    else:  # numerators beyond int64: decimal strings in the manifest
        manifest_big[name] = [str(int(v)) for v in np.asarray(num).reshape(-1)]
        entry["numerators"] = f"{MANIFEST_FILE}:big_numerators.{name}"
    if extra:
        entry.update(extra)
    return entry


def save(model: CompiledModel, out_dir: str | os.PathLike, materialize_limit: int = DEFAULT_MATERIALIZE_LIMIT) -> Path:
    """Write ``model`` to ``out_dir`` (created if needed); returns the directory as a Path.

    Files: ``model.safetensors`` (float64, TransformerLens names only), ``model.exact.safetensors``
    (int64 numerators), ``manifest.json`` (see the module docstring and docs/exports.md).
    ``W_E`` / ``W_pos`` go into ``model.safetensors`` when they have at most ``materialize_limit``
    entries (default 2^26); larger ones are regenerated from position codes on load.
    """
    from safetensors.numpy import save_file

    check_shapes(model)
    if not isinstance(materialize_limit, (int, np.integer)) or materialize_limit < 0:
        raise ExportError(f"materialize_limit must be an integer >= 0, got {materialize_limit!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    floats: dict[str, np.ndarray] = {}
    exact: dict[str, np.ndarray] = {}
    big: dict[str, list[str]] = {}
    tensors: dict[str, Any] = {}

    # ---- position codes (deduplicated by identity so shared codes stay shared on load) ----------
    codes: list[dict[str, Any]] = []
    code_index: dict[int, int | None] = {}
    code_why: dict[int, str] = {}

    def code_ref(code: Any) -> int | None:
        if id(code) not in code_index:
            gen, why = _code_generator(code)
            if gen is None:
                code_index[id(code)] = None
                code_why[id(code)] = why or "unknown"
            else:
                code_index[id(code)] = len(codes)
                codes.append(gen)
        return code_index[id(code)]

    # ---- embeddings ----------------------------------------------------------------------------
    layout: dict[str, Any] = {}
    for prefix, key, emb in (("embed", "embed.W_E", model.embed), ("pos_embed", "pos_embed.W_pos", model.pos_embed)):
        entries = emb.n_rows * emb.d_model
        materialized = entries <= materialize_limit
        den, inexact = _embedding_exactness(emb)
        refs = [code_ref(b.code) for b in emb.blocks]
        generated = all(r is not None for r in refs)
        lay: dict[str, Any] = {
            "key": key,
            "n_rows": emb.n_rows,
            "d_model": emb.d_model,
            "materialized": materialized,
            "den": int(den),
            "float64_exact": not inexact,
        }
        if inexact:
            lay["inexact_values"] = [_frac_str(f) for f in inexact[:_MAX_LISTED_INEXACT]]
        if generated:
            lay["mode"] = "generated"
            lay["table"] = _tensor_entry(f"{prefix}.table", emb.table.num, emb.table.den, to_float64(emb.table.num, emb.table.den)[1],
                                         exact, big, {"first_row": emb.table_first_row})
            lay["blocks"] = [
                {"code": r, "first_row": b.first_row, "count": b.count, "col": b.col, "code_start": b.code_start,
                 "scale": _frac_str(Fraction(b.scale))}
                for r, b in zip(refs, emb.blocks)
            ]
        else:
            why = "; ".join(code_why[id(b.code)] for b, r in zip(emb.blocks, refs) if r is None)
            if not materialized:
                raise ExportError(
                    f"{key} has {entries} entries > materialize_limit {materialize_limit} and its position code "
                    f"cannot be regenerated ({why}); raise materialize_limit to store it densely"
                )
            full = emb.values(np.arange(emb.n_rows))
            lay["mode"] = "dense"
            lay["dense_reason"] = why
            lay["dense"] = _tensor_entry(f"{prefix}.dense", full.num, full.den, inexact, exact, big)
        if materialized:
            floats[key] = embedding_float(emb)
        layout[prefix] = lay

    # ---- non-embedding weights --------------------------------------------------------------------
    for name, t in model.tensors().items():
        f, inexact = to_float64(t.num, t.den)
        floats[name] = np.ascontiguousarray(pad(f, tl_shape(model, name)))
        tensors[name] = _tensor_entry(name, t.num, t.den, inexact, exact, big, {"tl_shape": list(tl_shape(model, name))})

    # ---- model.code (the construction's code, when it is one of the block codes or regenerable) --
    model_code = None
    if getattr(model, "code", None) is not None:
        model_code = code_ref(model.code)

    layers = [
        {"causal": bool(b.attn.causal), "n_heads": b.attn.n_heads, "d_head": b.attn.d_head, "d_mlp": b.mlp.d_mlp}
        for b in model.blocks
    ]
    answers = _answers_json(model.answers)
    structure = _structure_digest(layers, tensors, layout, codes, model_code, list(model.vocab), answers, big)

    # ---- write the weight files -----------------------------------------------------------------
    wpath, epath = out / WEIGHTS_FILE, out / EXACT_FILE
    meta = {"format": "pt", "exactformer": FORMAT_NAME, "manifest": MANIFEST_FILE}
    _atomic(wpath, lambda p: save_file({k: np.ascontiguousarray(v) for k, v in floats.items()}, str(p), metadata=meta))
    _atomic(epath, lambda p: save_file(exact, str(p), metadata=meta | {"structure_sha256": structure}))

    try:
        from exactformer import __version__ as version
    except ImportError:  # pragma: no cover
        version = None
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "exactformer_version": version,
        "construction": model.construction,
        "theorem": model.theorem,
        "n": model.n,
        "precision": model.precision,
        "params": {k: _param_json(p) for k, p in model.params.items()},
        "summary": _jsonable(model.summary()),
        "task_params": _jsonable(model.task_params),
        "files": {
            WEIGHTS_FILE: {"sha256": _sha256(wpath), "bytes": wpath.stat().st_size, "dtype": "float64",
                           "keys": sorted(floats)},
            EXACT_FILE: {"sha256": _sha256(epath), "bytes": epath.stat().st_size, "dtype": "int64",
                         "keys": sorted(exact)},
        },
        "vocab": list(model.vocab),
        "output_vocab": model.output_vocab,
        "answers": answers,
        "transformer_lens_config": tl_config(model),
        "layers": layers,
        "materialize_limit": int(materialize_limit),
        "embedding": layout,
        "codes": codes,
        "model_code": model_code,
        "tensors": tensors,
        "structure_sha256": structure,
        "exactness": {
            "float64_exact": all(e["float64_exact"] for e in tensors.values())
            and all(layout[p]["float64_exact"] for p in layout),
            "note": "model.safetensors holds the correctly rounded float64 of each exact weight num/den; "
            "float64_exact says whether that is the weight itself. The exact value is always "
            "numerators (model.exact.safetensors) / den (this manifest).",
        },
    }
    if big:
        manifest["big_numerators"] = big
    text = json.dumps(manifest, indent=1, default=_json_default)
    _atomic(out / MANIFEST_FILE, lambda p: p.write_text(text))
    return out


def _structure_digest(layers, tensors, layout, codes, model_code, vocab, answers, big) -> str:
    """sha256 of the manifest fields that define the exact model (layers, denominators, embedding
    layout, code generators, vocabularies). It is stored in model.exact.safetensors' metadata, whose
    own sha256 is in the manifest, so a hand-edited manifest is refused on load."""
    doc = {
        "layers": layers,
        "tensors": tensors,
        "embedding": layout,
        "codes": [c["generator"] for c in codes],
        "model_code": model_code,
        "vocab": vocab,
        "answers": answers,
        "big_numerators": big,
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256(text.encode()).hexdigest()


def _answers_json(answers: list[Any]) -> dict[str, Any]:
    """Answers as JSON when they survive a round trip (ints, strings, ...), else their str()."""
    try:
        vals = _jsonable(list(answers))
        if vals == list(answers):
            return {"values": vals, "exact": True}
    except (TypeError, ValueError):
        pass
    return {"values": [str(a) for a in answers], "exact": False}


def _atomic(path: Path, write) -> None:
    """Write via a temporary file and rename, with the usual umask-based permissions."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# load
# ------------------------------------------------------------------------------------------------


def load(out_dir: str | os.PathLike) -> CompiledModel:
    """Rebuild the exact model saved by :func:`save` in ``out_dir``.

    Checks, each failure a :class:`ManifestError` naming the file: the manifest parses and has
    this format; both weight files exist and match their sha256; every float64 weight in
    ``model.safetensors`` equals the correctly rounded exact weight; regenerated embedding rows
    equal the stored ``W_E``/``W_pos`` rows on a sample (when materialised). Position codes are
    regenerated from their recorded generators (blocks that shared a code share it again).
    """
    from safetensors import safe_open
    from safetensors.numpy import load_file

    d = Path(out_dir)
    mpath = d / MANIFEST_FILE
    if not mpath.is_file():
        raise ManifestError(f"{mpath}: no such file (not an exactformer export directory)")
    try:
        man = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"{mpath}: cannot parse: {e}") from e
    if not isinstance(man, dict) or man.get("format") != FORMAT_NAME:
        raise ManifestError(f"{mpath}: not an {FORMAT_NAME} manifest")
    if man.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{mpath}: format_version {man.get('format_version')!r} is not supported (expected {FORMAT_VERSION})")
    try:
        return _load(d, mpath, man, safe_open, load_file)
    except ManifestError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, IRError) as e:
        raise ManifestError(f"{mpath}: malformed or inconsistent manifest: {type(e).__name__}: {e}") from e


def _load(d: Path, mpath: Path, man: dict, safe_open, load_file) -> CompiledModel:
    files = man["files"]
    for fname in (WEIGHTS_FILE, EXACT_FILE):
        p = d / fname
        if fname not in files:
            raise ManifestError(f"{mpath}: lists no sha256 for {fname}")
        if not p.is_file():
            raise ManifestError(f"{p}: no such file (listed in {mpath})")
        actual = _sha256(p)
        if actual != files[fname]["sha256"]:
            raise ManifestError(
                f"{p}: sha256 {actual} does not match {files[fname]['sha256']} recorded in {mpath}; "
                "the file was modified or belongs to another export"
            )
    wpath, epath = d / WEIGHTS_FILE, d / EXACT_FILE
    exact = load_file(str(epath))
    big = man.get("big_numerators", {})
    with safe_open(str(epath), framework="np") as ef:
        recorded = (ef.metadata() or {}).get("structure_sha256")
    structure = _structure_digest(man["layers"], man["tensors"], man["embedding"], man["codes"], man.get("model_code"),
                                  man["vocab"], man["answers"], big)
    if recorded != structure:
        raise ManifestError(
            f"{mpath}: the model structure (layers, denominators, embedding layout, code generators, vocabularies) "
            f"has sha256 {structure}, but {epath} was written for {recorded}; the manifest was edited"
        )

    def tensor(entry: dict[str, Any], where: str) -> ExactTensor:
        src, _, key = entry["numerators"].partition(":")
        shape = tuple(entry["shape"])
        if src == EXACT_FILE:
            if key not in exact:
                raise ManifestError(f"{epath}: missing tensor {key!r} ({where})")
            num = exact[key]
        else:
            num = np.array([int(v) for v in big[key.split(".", 1)[1]]], dtype=object)
        if int(np.prod(shape)) != num.size:
            raise ManifestError(f"{epath}: tensor {key!r} has {num.size} entries, manifest shape {list(shape)}")
        return ExactTensor(num.reshape(shape), int(entry["den"]))

    # ---- weights, cross-checked against the float file -------------------------------------------
    with safe_open(str(wpath), framework="np") as wf:
        wkeys = set(wf.keys())
        weights: dict[str, ExactTensor] = {}
        for name, entry in man["tensors"].items():
            t = tensor(entry, name)
            if name not in wkeys:
                raise ManifestError(f"{wpath}: missing tensor {name!r}")
            stored = wf.get_tensor(name)
            expect = pad(to_float64(t.num, t.den)[0], tuple(entry["tl_shape"]))
            if stored.shape != expect.shape or not np.array_equal(stored, expect):
                raise ManifestError(f"{wpath}: {name} differs from its exact value in {epath}")
            weights[name] = t

        # ---- position codes ------------------------------------------------------------------------
        codes = []
        for i, c in enumerate(man["codes"]):
            try:
                codes.append(_regenerate_code(c["generator"]))
            except Exception as e:  # noqa: BLE001
                raise ManifestError(f"{mpath}: codes[{i}] cannot be regenerated: {e}") from e

        # ---- embeddings ----------------------------------------------------------------------------
        embs = {}
        for prefix in ("embed", "pos_embed"):
            lay = man["embedding"][prefix]
            n_rows, dm = int(lay["n_rows"]), int(lay["d_model"])
            if lay["mode"] == "generated":
                tbl = tensor(lay["table"], f"{prefix}.table")
                blocks = tuple(
                    CodeBlock(codes[b["code"]], int(b["first_row"]), int(b["count"]), int(b["col"]),
                              int(b["code_start"]), Fraction(str(b["scale"])))
                    for b in lay["blocks"]
                )
                emb = Embedding(n_rows, dm, tbl, int(lay["table"]["first_row"]), blocks)
            elif lay["mode"] == "dense":
                emb = Embedding(n_rows, dm, tensor(lay["dense"], f"{prefix}.dense"), 0, ())
            else:
                raise ManifestError(f"{mpath}: embedding.{prefix}.mode {lay['mode']!r} is unknown")
            if lay["materialized"]:
                key = lay["key"]
                if key not in wkeys:
                    raise ManifestError(f"{wpath}: missing {key} (the manifest says it is materialised)")
                sl = wf.get_slice(key)
                if tuple(sl.get_shape()) != (n_rows, dm):
                    raise ManifestError(f"{wpath}: {key} has shape {sl.get_shape()}, expected {[n_rows, dm]}")
                rows = _sample_rows(emb)
                stored = np.stack([sl[int(r) : int(r) + 1][0] for r in rows]) if rows.size else np.zeros((0, dm))
                if not np.array_equal(stored, embedding_rows_float(emb, rows)):
                    raise ManifestError(f"{wpath}: {key} rows differ from the rows regenerated from {mpath}/{EXACT_FILE}")
            embs[prefix] = emb

    # ---- the model ---------------------------------------------------------------------------------
    blocks = []
    for l, lay in enumerate(man["layers"]):
        w = lambda n: weights[f"blocks.{l}.{n}"]  # noqa: E731
        attn = Attention(w("attn.W_Q"), w("attn.W_K"), w("attn.W_V"), w("attn.W_O"),
                         w("attn.b_Q"), w("attn.b_K"), w("attn.b_V"), w("attn.b_O"), causal=bool(lay["causal"]))
        blocks.append(Block(attn, MLP(w("mlp.W_in"), w("mlp.b_in"), w("mlp.W_out"), w("mlp.b_out"))))
    model = CompiledModel(
        construction=man["construction"],
        theorem=man["theorem"],
        n=int(man["n"]),
        embed=embs["embed"],
        pos_embed=embs["pos_embed"],
        blocks=blocks,
        W_U=weights["unembed.W_U"],
        b_U=weights["unembed.b_U"],
        vocab=list(man["vocab"]),
        answers=list(man["answers"]["values"]),
        params={k: _param_from_json(v) for k, v in man.get("params", {}).items()},
        precision=man.get("precision"),
        task_params=man.get("task_params", {}),
    )
    check_shapes(model)
    if model.output_vocab != list(man["output_vocab"]):
        raise ManifestError(f"{mpath}: output_vocab disagrees with answers")
    if man.get("model_code") is not None:
        model.code = codes[man["model_code"]]  # type: ignore[attr-defined]
    return model
