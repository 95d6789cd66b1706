"""Integrity of exports: every field of manifest.json is protected (a modification, addition or
removal is refused naming the field), and every CompiledModel field is recorded."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from exactformer.constructions.export import EXACT_FILE, MANIFEST_FILE, WEIGHTS_FILE, ManifestError, load, save
from exactformer.constructions.export.manifest import MODEL_FIELDS, WEIGHT_FIELDS, field_name
from exactformer.constructions.theorems.index_lookup import index_lookup
from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.theorems.thresholds import k_dnf


def _leaves(node, path=()):
    """Every leaf of a JSON tree: every entry of every object, every element of a list of objects,
    and the first and last element of other lists (the digests treat such a list as one field)."""
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(node, list) and node:
        ends = range(len(node)) if any(isinstance(v, dict) for v in node) else sorted({0, len(node) - 1})
        for i in ends:
            yield from _leaves(node[i], path + (i,))
    else:
        yield path


def _get(node, path):
    for key in path:
        node = node[key]
    return node


def _set(node, path, value):
    _get(node, path[:-1])[path[-1]] = value


def _edited(v):
    """A different value of a plausible type."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, (int, float)):
        return v + 1
    if isinstance(v, str):
        return v + "x"
    if v is None:
        return 0
    return [0] if v == [] else {"x": 0}


def _expected_name(man, path):
    """The field a modification of leaf ``path`` must be reported under: the path itself, or the
    outermost list below it that holds no objects (such a list is one field)."""
    node = man
    for i, key in enumerate(path):
        if isinstance(node, list) and not any(isinstance(v, dict) for v in node):
            return field_name(path[:i])
        node = node[key]
    return field_name(path)


@pytest.fixture(scope="module", params=["index-lookup-random", pytest.param("dnf-views", marks=pytest.mark.slow)])
def export(request, tmp_path_factory):
    """A dense export with a certified random code (describe() with a certificate), and one with
    code views (constant and table) and a code held as runs (the DNF's type signs)."""
    if request.param == "index-lookup-random":
        m = index_lookup(16, 4, positions="random")
    else:
        m = k_dnf(8, terms=[[1, -2], [3, 4, 5], [6]], positions="reed-solomon")
    out = save(m, tmp_path_factory.mktemp(request.param) / "m")
    return out, (out / MANIFEST_FILE).read_text()


def test_codes_recorded_as_expected(export):
    out, text = export
    kinds = [next(iter(c)) for c in json.loads(text)["codes"]]
    assert kinds in (["generator"], ["generator"] + ["view"] * 10 + ["runs"])


@pytest.mark.slow
def test_every_field_is_protected(export):
    """Walk the whole manifest: changing any leaf is refused with a message naming its field."""
    out, text = export
    man = json.loads(text)
    paths = list(_leaves(man))
    assert len(paths) > 250
    try:
        for path in paths:
            edited = json.loads(text)
            _set(edited, path, _edited(_get(edited, path)))
            (out / MANIFEST_FILE).write_text(json.dumps(edited))
            with pytest.raises(ManifestError) as e:
                load(out)
            assert re.search(rf"field {re.escape(_expected_name(man, path))}[ )]", str(e.value)), (path, str(e.value))
    finally:
        (out / MANIFEST_FILE).write_text(text)
    load(out)  # the restored manifest loads again


def test_removed_and_added_fields_refused(export):
    out, text = export
    man = json.loads(text)
    try:
        for key in man:
            if key in ("format", "format_version"):
                continue  # checked first, with their own message (below)
            edited = json.loads(text)
            del edited[key]
            (out / MANIFEST_FILE).write_text(json.dumps(edited))
            with pytest.raises(ManifestError, match=rf"field {key} was removed|field files\[") as e:
                load(out)
            assert key in str(e.value)
        for where in ((), ("params",), ("embedding", "embed")):
            edited = json.loads(text)
            _get(edited, where)["extra"] = 1
            (out / MANIFEST_FILE).write_text(json.dumps(edited))
            with pytest.raises(ManifestError, match=rf"field {field_name(where + ('extra',))} was added"):
                load(out)
        for key, pattern in (("format", "field format is"), ("format_version", "field format_version 3")):
            edited = json.loads(text)
            edited[key] = 3
            (out / MANIFEST_FILE).write_text(json.dumps(edited))
            with pytest.raises(ManifestError, match=pattern):
                load(out)
    finally:
        (out / MANIFEST_FILE).write_text(text)


def test_reformatting_is_not_a_modification(export):
    """Key order and whitespace are not fields: a re-serialised manifest still loads."""
    out, text = export
    try:
        (out / MANIFEST_FILE).write_text(json.dumps(json.loads(text), sort_keys=True))
        load(out)
    finally:
        (out / MANIFEST_FILE).write_text(text)


def test_issue_examples_refused(tmp_path: Path):
    """The edits of the issue: eta, precision, n, construction."""
    out = save(index_lookup(16, 4), tmp_path / "m")
    text = (out / MANIFEST_FILE).read_text()
    for path, value in ((("params", "eta", "value"), 99), (("precision",), "binary:int=9,frac=9"), (("n",), 8),
                        (("construction",), "equality")):
        man = json.loads(text)
        _set(man, path, value)
        (out / MANIFEST_FILE).write_text(json.dumps(man))
        with pytest.raises(ManifestError, match=rf"field {field_name(path)} was modified \(it now reads"):
            load(out)
    assert {EXACT_FILE, WEIGHTS_FILE} <= set(json.loads(text)["files"])


def test_every_compiled_model_field_is_recorded():
    """A CompiledModel field that is neither a weight nor in MODEL_FIELDS would be lost by save():
    adding one to CompiledModel needs its line in MODEL_FIELDS."""
    fields = {f.name for f in dataclasses.fields(CompiledModel)}
    assert fields == set(MODEL_FIELDS) | set(WEIGHT_FIELDS)


def test_exact_file_without_digests_refused(tmp_path: Path):
    """An exact file rewritten without the digests (its sha256 and size fixed up in the manifest,
    which the digests cannot cover) is refused; so is a wrong size."""
    from safetensors.numpy import load_file, save_file

    from exactformer.constructions.export.manifest import sha256_file

    out = save(index_lookup(8, 2), tmp_path / "m", dense=False)
    epath = out / EXACT_FILE
    text = (out / MANIFEST_FILE).read_text()
    man = json.loads(text)
    man["files"][EXACT_FILE]["bytes"] += 1
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    with pytest.raises(ManifestError, match=r'field files\["model.exact.safetensors"\]\.bytes was modified'):
        load(out)
    for meta in ({"format": "pt"}, {"manifest_digests": "[1, 2]"}):
        save_file(load_file(str(epath)), str(epath), metadata=meta)
        man = json.loads(text)
        man["files"][EXACT_FILE].update(sha256=sha256_file(epath), bytes=epath.stat().st_size)
        (out / MANIFEST_FILE).write_text(json.dumps(man))
        with pytest.raises(ManifestError, match="metadata holds no valid 'manifest_digests'"):
            load(out)
