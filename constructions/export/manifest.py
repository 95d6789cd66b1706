"""The manifest of an export: its files, the CompiledModel fields it records, how an input is
encoded, and the integrity check that protects every field ``load`` reads.

Integrity. ``save`` computes the sha256 of the canonical JSON (sorted keys, no whitespace) of every
field of the manifest: each entry of each object, and each element of a list that holds objects (a
list without objects, such as ``vocab``, is one field). The digests are stored in the metadata of
``model.exact.safetensors`` (key ``manifest_digests``), whose sha256 and size are in the manifest.
:func:`read_manifest` checks that file first, then recomputes the digests: a field that was
modified, added or removed is refused with a :class:`ManifestError` naming it. To go unnoticed an
edit has to change three things consistently: the field, the digests inside the exact file and that
file's sha256 in the manifest. The two fields that describe the exact file itself
(``files["model.exact.safetensors"].sha256`` and ``.bytes``) cannot be inside it; they are checked
against the file. Nothing else is exempt, so a field added to the manifest is covered without a
line of code here.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable

import numpy as np
from safetensors import safe_open

from exactformer.constructions.core import registry
from exactformer.constructions.core.builder import Placement
from exactformer.constructions.blocks import block_from_json
from exactformer.constructions.core.ir import Param, VectorInput
from exactformer.constructions.core.vocab import vocab_from_json, vocab_json

FORMAT_NAME = "exactformer-export"
FORMAT_VERSION = 2  # 2: per-field digests, encoding, codes as generators / views / stored vectors
WEIGHTS_FILE = "model.safetensors"
EXACT_FILE = "model.exact.safetensors"
MANIFEST_FILE = "manifest.json"
DIGESTS_KEY = "manifest_digests"  # metadata key of the exact file
#: the manifest fields that describe the exact file itself, checked against that file
CHECKED_AGAINST_EXACT_FILE = (("files", EXACT_FILE, "sha256"), ("files", EXACT_FILE, "bytes"))


class ManifestError(ValueError):
    """An export directory that is inconsistent: missing files, a sha256 mismatch, a modified,
    added or removed manifest field, a malformed or unsupported manifest, or weights that disagree
    with their exact values. The message names the file and, for the manifest, the field."""


# ------------------------------------------------------------------------------------------------
# JSON
# ------------------------------------------------------------------------------------------------


def frac_str(f: Fraction) -> str:
    return f"{f.numerator}/{f.denominator}"


def json_default(o: Any) -> Any:
    if isinstance(o, Fraction):
        return frac_str(o) if o.denominator != 1 else o.numerator
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


def jsonable(o: Any) -> Any:
    """``o`` as it reads back from JSON (numpy values, Fractions, tuples converted)."""
    return json.loads(json.dumps(o, default=json_default))


def dumps_manifest(o: Any, indent: int = 0) -> str:
    """JSON text of a manifest: objects and lists of objects one entry per line, every other list
    on one line (so each line is about one field of the integrity check)."""
    pad = " " * (indent + 1)
    if isinstance(o, dict) and o:
        items = [f"{pad}{json.dumps(k)}: {dumps_manifest(v, indent + 1)}" for k, v in o.items()]
    elif isinstance(o, list) and any(isinstance(v, dict) for v in o):
        items = [pad + dumps_manifest(v, indent + 1) for v in o]
    else:
        return json.dumps(o, separators=(",", ":"))
    open_, close = ("{", "}") if isinstance(o, dict) else ("[", "]")
    return open_ + "\n" + ",\n".join(items) + "\n" + " " * indent + close


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=json_default)


def canonical(o: Any) -> bytes:
    """Canonical JSON: sorted keys, no whitespace."""
    return _CANONICAL.encode(o).encode()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------
# the CompiledModel fields the manifest records
# ------------------------------------------------------------------------------------------------


def _param_json(p: Param) -> dict[str, Any]:
    v = p.value
    if isinstance(v, Fraction):
        typ, val = "Fraction", frac_str(v)
    elif isinstance(v, bool) or v is None:
        typ, val = type(v).__name__, v
    elif isinstance(v, (int, np.integer)):
        typ, val = "int", int(v)
    elif isinstance(v, (float, np.floating)):
        typ, val = "float", float(v)
    elif isinstance(v, str):
        typ, val = "str", v
    else:
        typ, val = "json", jsonable(v)
    return {"value": val, "formula": p.formula, "type": typ}


def _param_from_json(d: dict[str, Any]) -> Param:
    v, typ = d["value"], d["type"]
    return Param(Fraction(str(v)) if typ == "Fraction" else v, d["formula"])


def _answers_json(answers: list[Any]) -> dict[str, Any]:
    """Answers as JSON when they survive a round trip (ints, strings, ...); Fractions (an average's
    answers) as their text with ``"type": "Fraction"``; anything else as its str()."""
    if any(isinstance(a, Fraction) for a in answers) and all(isinstance(a, (Fraction, int)) and not isinstance(a, bool)
                                                               for a in answers):
        return {"values": [frac_str(Fraction(a)) for a in answers], "exact": True, "type": "Fraction"}
    try:
        vals = jsonable(list(answers))
        if vals == list(answers):
            return {"values": vals, "exact": True}
    except (TypeError, ValueError):
        pass
    return {"values": [str(a) for a in answers], "exact": False}


def _optional_str(v: Any) -> str | None:
    return None if v is None else str(v)


#: CompiledModel fields the manifest holds as plain JSON: name -> (to JSON, from JSON). ``save``
#: writes each under its own name and ``load`` passes each back to CompiledModel; the integrity
#: check covers every manifest field, so a new CompiledModel field is this one line.
MODEL_FIELDS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "construction": (str, str),
    "theorem": (str, str),
    "n": (int, int),
    "precision": (_optional_str, _optional_str),
    "params": (lambda ps: {k: _param_json(p) for k, p in ps.items()},
               lambda d: {k: _param_from_json(v) for k, v in d.items()}),
    "task_params": (jsonable, dict),
    "vocab": (vocab_json, vocab_from_json),
    "answers": (_answers_json, lambda d: [Fraction(v) for v in d["values"]] if d.get("type") == "Fraction"
                else list(d["values"])),
    "answer_positions": (lambda a: None if a is None else [int(t) for t in a],
                         lambda a: None if a is None else tuple(int(t) for t in a)),
    "layout": (lambda d: {k: [int(v[0]), int(v[1])] for k, v in d.items()}, dict),
    "plan": (lambda plan: [_placement_json(p) for p in plan], lambda d: [_placement_from_json(p) for p in d]),
    "vector_input": (lambda v: None if v is None else v.to_json(), VectorInput.from_json),
}
def _placement_json(p: Placement) -> dict[str, Any]:
    return {"block": p.block.to_json(), "kind": p.kind, "layer": int(p.layer),
            "index": None if p.index is None else (list(p.index) if isinstance(p.index, tuple) else int(p.index))}


def _placement_from_json(d: dict[str, Any]) -> Placement:
    index = d["index"]
    return Placement(block_from_json(d["block"]), d["kind"], int(d["layer"]),
                     tuple(index) if isinstance(index, list) else index)


#: CompiledModel fields recorded as weights (manifest ``tensors``, ``embedding``, ``codes``, ``layers``) and
#: as a code record (``position_code``: the manifest's ``model_code``)
WEIGHT_FIELDS = ("embed", "pos_embed", "blocks", "W_U", "b_U", "position_code")

#: how the model's answer is read (the same for every construction; CompiledModel.decode)
READOUT = ("the logits at each answer position (answer_positions, 0-based; null: the last position), "
           "[d_vocab_out] each; the answer is answers.values[i] for the largest logit i (a tie is no "
           "answer); output_vocab[i] is its str()")


def code_of(model: Any) -> list[dict[str, Any]]:
    """The modules outside exactformer that define ``model``'s construction and the blocks of its
    plan, in the order met: ``{"module": name, "file": its path or None, "defines": [...]}`` each.
    :func:`require_code` imports them on load, where the caller allows it."""
    found: dict[str, dict[str, Any]] = {}

    def note(obj: Any, what: str) -> None:
        module = getattr(obj, "__module__", "") or ""
        if module.startswith("exactformer.") or module == "exactformer":
            return
        entry = found.setdefault(module, {"module": module, "file": getattr(sys.modules.get(module), "__file__", None),
                                          "defines": []})
        if what not in entry["defines"]:
            entry["defines"].append(what)

    if model.construction in registry.names():
        c = registry.get(model.construction)
        note(c.builder, f"construction {c.name}")
        note(type(c.task), f"task {type(c.task).__name__}")
    for p in getattr(model, "plan", []):
        note(type(p.block), f"block {type(p.block).__name__}")
    return [dict(e, file=None if e["file"] is None else str(Path(e["file"]).resolve())) for e in found.values()]


class UntrustedCode(ManifestError):
    """A saved model whose construction or blocks are defined in a module that is not imported, and
    the caller did not allow loading to import it (``trust_code``)."""


def require_code(out_dir: Path, man: dict[str, Any], trust_code: bool) -> None:
    """Make the construction and the blocks a manifest names available: those registered already
    need nothing; the modules of its ``code`` field that define the others are imported only when
    ``trust_code`` (importing a module runs its code, as Hugging Face's ``trust_remote_code``);
    else :class:`UntrustedCode` names the module and the option."""
    from exactformer.constructions.blocks import BLOCKS

    def missing() -> list[str]:
        out = [] if man.get("construction") in registry.names() else [f"construction {man.get('construction')!r}"]
        names = {p["block"]["block"] for p in man.get("plan") or [] if isinstance(p, dict) and isinstance(p.get("block"), dict)}
        return out + [f"block {b!r}" for b in sorted(names) if b not in BLOCKS]

    if not missing():
        return
    for entry in man.get("code") or []:
        module, file = entry.get("module"), entry.get("file")
        if not trust_code:
            raise UntrustedCode(f"the model needs module {module!r} ({file or 'no file recorded'}), which "
                                f"defines {', '.join(entry.get('defines') or ['its code'])}; loading imports it (running "
                                "its code) only with trust_code=True (command line: --trust-code), or import it first")
        try:
            registry.import_code(module, file)
        except ImportError as e:
            raise ManifestError(f"{out_dir}: {e}") from None
    gone = missing()
    if gone:
        raise ManifestError(f"{out_dir}: {', '.join(gone)} is not registered (no imported module defines it; the manifest "
                            f"names {', '.join(e.get('module', '?') for e in man.get('code') or []) or 'no module'})")


def encoding_of(construction: str) -> dict[str, Any] | None:
    """The construction module's ``ENCODING`` (how a natural input becomes token ids), or None for
    a construction the registry does not know."""
    try:
        task = registry.get(construction).task
    except registry.UnknownConstruction:
        return None
    return jsonable(task.ENCODING)


# ------------------------------------------------------------------------------------------------
# integrity: per-field digests
# ------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _key_name(parent: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{parent}[{key}]"
    if _IDENT.match(key):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{json.dumps(key)}]"


def field_name(path: tuple) -> str:
    """A field path as the messages write it: ``params.eta.value``, ``codes[0].generator.k``,
    ``files["model.safetensors"].sha256``."""
    out = ""
    for key in path:
        out = _key_name(out, key)
    return out


def _is_inside(inner: str, outer: str) -> bool:
    return outer == "" or (inner != outer and inner.startswith(outer) and inner[len(outer)] in ".[")


def _protected(man: dict[str, Any]) -> dict[str, Any]:
    """``man`` without the fields checked against the exact file (copies only along their path)."""
    man = dict(man)
    for path in CHECKED_AGAINST_EXACT_FILE:
        parent = man
        for key in path[:-1]:
            child = parent.get(key)
            if not isinstance(child, dict):
                break
            parent[key] = parent = dict(child)
        else:
            parent.pop(path[-1], None)
    return man


def _walk(node: Any, name: str, out: dict[str, tuple[str, Any]]) -> str:
    """Record ``name -> (digest, node)`` for ``node`` and every field inside it; returns the digest.
    A leaf's digest is the sha256 of its canonical JSON; an object's (a list of objects') digest is
    the sha256 of its children's names and digests (a Merkle tree: each value is serialised once)."""
    if isinstance(node, dict):
        parts = [[k, _walk(v, _key_name(name, k), out)] for k, v in node.items()]
        digest = hashlib.sha256(b"{" + canonical(sorted(parts))).hexdigest()
    elif isinstance(node, list) and any(isinstance(v, dict) for v in node):
        parts = [_walk(v, _key_name(name, i), out) for i, v in enumerate(node)]
        digest = hashlib.sha256(b"[" + canonical(parts)).hexdigest()
    else:
        digest = hashlib.sha256(canonical(node)).hexdigest()
    out[name] = (digest, node)
    return digest


def field_digests(man: dict[str, Any]) -> dict[str, str]:
    """Field name -> digest (see :func:`_walk`) of every field of ``man``; the whole manifest is the
    field ``""``."""
    out: dict[str, tuple[str, Any]] = {}
    _walk(_protected(man), "", out)
    return {k: v[0] for k, v in out.items()}


def _outermost(names: list[str]) -> list[str]:
    return [f for f in names if not any(_is_inside(f, g) for g in names)]


def check_fields(man: dict[str, Any], recorded: dict[str, str], mpath: Path) -> None:
    """Raise :class:`ManifestError` naming a field of ``man`` that was removed or added (the
    outermost such field) or modified (the innermost field whose digest differs from ``recorded``)."""
    current: dict[str, tuple[str, Any]] = {}
    _walk(_protected(man), "", current)
    removed = _outermost([f for f in recorded if f not in current])
    added = _outermost([f for f in current if f not in recorded])
    modified = [f for f, d in recorded.items() if f in current and current[f][0] != d]
    modified = [f for f in modified if not any(_is_inside(g, f) for g in modified + removed + added)]
    bad = removed + added + modified
    if not bad:
        return
    f = bad[0]
    if f in removed:
        what = "was removed"
    elif f in added:
        what = "was added (it is not part of the manifest that was saved)"
    else:
        text = json.dumps(current[f][1], default=json_default)
        what = f"was modified (it now reads {text[:80] + ('...' if len(text) > 80 else '')})"
    more = f"; {len(bad) - 1} other field(s) differ too" if len(bad) > 1 else ""
    raise ManifestError(
        f"{mpath}: field {f} {what}{more}. Every field is covered by digests stored in {EXACT_FILE} at save "
        "time; restore the manifest or export the model again"
    )


def read_manifest(out_dir: str | Path) -> dict[str, Any]:
    """The manifest of export directory ``out_dir``, after checking that it and both weight files
    are as saved (see the module docstring). Raises :class:`ManifestError` naming the file and field."""
    d = Path(out_dir)
    mpath = d / MANIFEST_FILE
    if not mpath.is_file():
        raise ManifestError(f"{mpath}: no such file (not an exactformer export directory)")
    try:
        man = json.loads(mpath.read_text())
    except (OSError, ValueError) as e:
        raise ManifestError(f"{mpath}: cannot parse: {e}") from e
    if not isinstance(man, dict) or man.get("format") != FORMAT_NAME:
        got = man.get("format") if isinstance(man, dict) else type(man).__name__
        raise ManifestError(f"{mpath}: field format is {got!r}, not {FORMAT_NAME!r}: not an exactformer export manifest")
    if man.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{mpath}: field format_version {man.get('format_version')!r} is not supported "
                            f"(this exactformer reads {FORMAT_VERSION}; export the model again)")

    epath = d / EXACT_FILE
    files = man.get("files") if isinstance(man.get("files"), dict) else {}
    entry = files.get(EXACT_FILE) if isinstance(files.get(EXACT_FILE), dict) else {}
    sha_field, bytes_field = (field_name(p) for p in CHECKED_AGAINST_EXACT_FILE)
    if not epath.is_file():
        raise ManifestError(f"{epath}: no such file (listed in {mpath})")
    actual = sha256_file(epath)
    if actual != entry.get("sha256"):
        raise ManifestError(
            f"{epath}: sha256 {actual} does not match {entry.get('sha256')!r} recorded in {mpath} (field {sha_field}); "
            "the file or the field was modified, or the file belongs to another export"
        )
    size = epath.stat().st_size
    if entry.get("bytes") != size:
        raise ManifestError(f"{mpath}: field {bytes_field} was modified (it reads {entry.get('bytes')!r}; "
                            f"{epath} has {size} bytes)")
    with safe_open(str(epath), framework="np") as f:
        meta = f.metadata() or {}
    try:
        recorded = json.loads(meta[DIGESTS_KEY])
    except (KeyError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):
        raise ManifestError(f"{epath}: metadata holds no valid {DIGESTS_KEY!r}; export the model again")
    check_fields(man, recorded, mpath)

    wpath = d / WEIGHTS_FILE
    if WEIGHTS_FILE in man["files"]:  # the dense form's float file
        if not wpath.is_file():
            raise ManifestError(f"{wpath}: no such file (listed in {mpath})")
        actual = sha256_file(wpath)
        if actual != man["files"][WEIGHTS_FILE]["sha256"]:
            raise ManifestError(
                f"{wpath}: sha256 {actual} does not match {man['files'][WEIGHTS_FILE]['sha256']} recorded in {mpath}; "
                "the file was modified or belongs to another export"
            )
    return man
