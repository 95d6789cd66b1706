"""The compact export (``save(..., dense=False)``, ``exactformer build --compact``): no float file,
embedding rows generated from the recorded codes on load; torch and TransformerLens still work, and
the dense file can be made from it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from exactformer.constructions.export import (
    EXACT_FILE,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    ExportError,
    ManifestError,
    load,
    save,
    to_torch,
    to_transformer_lens,
)
from exactformer.constructions.export.manifest import sha256_file
from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup
from exactformer.constructions.theorems.thresholds import k_dnf
from exactformer.precision import parse_format
from exactformer.cli.main import app
from exactformer.verify.executor.exact import run


@pytest.fixture(scope="module")
def model():
    return index_lookup(32, 4, positions="reed-solomon")


def _tokens(model, B, seed):
    rng = np.random.default_rng(seed)
    S = len(model.answers)
    return IndexLookupTask().encode_arrays(model, rng.integers(0, S, (B, model.n)), rng.integers(1, model.n + 1, B))


def test_compact_files_and_round_trip(model, tmp_path: Path):
    dense, compact = save(model, tmp_path / "dense"), save(model, tmp_path / "compact", dense=False)
    assert sorted(p.name for p in compact.iterdir()) == [MANIFEST_FILE, EXACT_FILE]
    man = json.loads((compact / MANIFEST_FILE).read_text())
    assert man["dense"] is False and WEIGHTS_FILE not in man["files"]
    assert not any(lay["materialized"] for lay in man["embedding"].values())
    size = lambda d: sum(p.stat().st_size for p in d.iterdir())  # noqa: E731
    assert size(compact) * 5 < size(dense)
    m2 = load(compact)
    tokens = _tokens(model, 64, 0)
    fmt = parse_format(model.precision)
    r1, r2 = run(model, tokens, fmt), run(m2, tokens, fmt)
    assert np.array_equal(r1.logits, r2.logits) and r1.answers == r2.answers
    # the loader materialises on demand: torch from the compact export equals torch from the model
    for batch in (tokens[:1], tokens[:2], tokens[:7], tokens):
        assert torch.equal(to_torch(m2)(torch.as_tensor(batch)), to_torch(model)(torch.as_tensor(batch)))


def test_dense_file_made_from_compact(model, tmp_path: Path):
    """save(load(compact)) writes the same three files, byte for byte, as saving the model densely
    (exports are reproducible)."""
    compact = save(model, tmp_path / "compact", dense=False)
    again = save(load(compact), tmp_path / "dense-again")
    dense = save(model, tmp_path / "dense")
    for f in (WEIGHTS_FILE, EXACT_FILE, MANIFEST_FILE):
        assert sha256_file(again / f) == sha256_file(dense / f), f
    # and back to compact in the same directory: the stale float file is removed
    save(load(again), again, dense=False)
    assert not (again / WEIGHTS_FILE).exists()
    load(again)


def test_compact_views_and_stored_codes(tmp_path: Path):
    """Code views and stored codes (DNF) round-trip in the compact form and still certify."""
    from exactformer.verify.verifier import verify

    m = k_dnf(8, terms=[[1, -2], [3, 4, 5], [6]], positions="reed-solomon")
    m2 = load(save(m, tmp_path / "c", dense=False))
    rows = np.arange(m.n_ctx)
    assert np.array_equal(m.pos_embed.values(rows).num, m2.pos_embed.values(rows).num)
    assert verify(m2, mode="certify").passed


def test_compact_tampering_refused(model, tmp_path: Path):
    out = save(model, tmp_path / "c", dense=False)
    man = json.loads((out / MANIFEST_FILE).read_text())
    man["dense"] = True
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    with pytest.raises(ManifestError, match="field dense was modified"):
        load(out)


def test_compact_to_transformer_lens(model, tmp_path: Path):
    pytest.importorskip("transformer_lens", reason="transformer_lens not installed (extra [lens])")
    m2 = load(save(model, tmp_path / "c", dense=False))
    tokens = torch.as_tensor(_tokens(model, 16, 1))
    with torch.no_grad():
        logits = to_transformer_lens(m2)(tokens)
    ref = to_torch(model, positions="all")(tokens)  # every position, as TransformerLens returns
    scale = max(1.0, float(ref.abs().max()))
    assert torch.allclose(logits.double(), ref, rtol=0, atol=1e-5 * scale)


@pytest.mark.slow
def test_compact_load_in_fresh_process(model, tmp_path: Path):
    """The same logits from a compact export loaded in another process."""
    out = save(model, tmp_path / "c", dense=False)
    tokens = _tokens(model, 8, 2)
    np.save(tmp_path / "tokens.npy", tokens)
    code = ("import sys, numpy as np, torch; from exactformer.constructions.export import load, to_torch; "
            "m = load(sys.argv[1]); t = torch.as_tensor(np.load(sys.argv[2])); "
            "np.save(sys.argv[3], to_torch(m)(t).detach().numpy())")
    subprocess.run([sys.executable, "-c", code, str(out), str(tmp_path / "tokens.npy"), str(tmp_path / "l.npy")],
                   check=True, timeout=120)
    assert np.array_equal(np.load(tmp_path / "l.npy"), to_torch(model)(torch.as_tensor(tokens)).detach().numpy())


def test_save_arguments_and_certified_arithmetics(model, tmp_path: Path):
    for kw, pattern in (({"dense": "no"}, "dense must be True"), ({"materialize_limit": -1}, "materialize_limit"),
                        ({"certified_arithmetics": ["float64"]}, "certified_arithmetics must be"),
                        ({"certified_arithmetics": {"certified": "float64"}}, "certified_arithmetics must be"),
                        ({"certified_arithmetics": {"maybe": []}}, "certified_arithmetics must be")):
        with pytest.raises(ExportError, match=pattern):
            save(model, tmp_path / "bad", **kw)
    out = save(model, tmp_path / "m", dense=False,
               certified_arithmetics={"certified": [model.precision], "not_certified": ["float32"]})
    man = json.loads((out / MANIFEST_FILE).read_text())
    assert man["certified_arithmetics"] == {"certified": [model.precision], "not_certified": ["float32"]}
    man["certified_arithmetics"]["certified"].append("float32")
    (out / MANIFEST_FILE).write_text(json.dumps(man))
    with pytest.raises(ManifestError, match=r"field certified_arithmetics\.certified was modified"):
        load(out)


def test_cli_build_compact(tmp_path: Path):
    runner = CliRunner()
    res = runner.invoke(app, ["build", "index-lookup", "--n", "16", "--alphabet", "4", "--compact",
                              "--out", str(tmp_path / "c"), "--json"])
    assert res.exit_code == 0, res.output
    assert not (tmp_path / "c" / WEIGHTS_FILE).exists()
    res = runner.invoke(app, ["verify", str(tmp_path / "c"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["passed"] is True
