"""Files of a model with a billion positions: Index Lookup at N = 2^30 saved in the compact form
(the code generators, not 2^30 rows), loaded and certified from the files alone; the manifest says
that W_pos is not materialised and how a client regenerates its rows, and a client that follows
that statement with numpy alone gets the rows the exact executor reads."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.export import MANIFEST_FILE, WEIGHTS_FILE, embedding_rows, load, save
from exactformer.precision import parse_format

N = 1 << 30


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[object, Path]:
    model = xf.build("index-lookup", n=N).compiled
    return model, save(model, tmp_path_factory.mktemp("il30"), dense=False)


def _client_rows(man: dict, which: str, rows: np.ndarray) -> np.ndarray:
    """The manifest's statement, followed with numpy alone (no exactformer code)."""
    lay = man["embedding"][which]
    out = np.zeros((rows.size, lay["d_model"]))
    assert lay["table"]["nonzero"] == 0  # Index Lookup's W_pos has no table entries
    for blk in lay["blocks"]:
        gen = man["codes"][blk["code"]]["generator"]
        m, d, poly = gen["m"], gen["d"], lay["not_materialized"]["field_polys"][str(blk["code"])]
        q = 1 << m

        def mul(a: int, b: int) -> int:  # GF(2^m) modulo poly
            r = 0
            while b:
                if b & 1:
                    r ^= a
                b >>= 1
                a <<= 1
                if a & q:
                    a ^= poly
            return r

        scale = float(Fraction(blk["scale"]))
        for j, r in enumerate(rows.tolist()):
            if not blk["first_row"] <= r < blk["first_row"] + blk["count"]:
                continue
            i = blk["code_start"] + r - blk["first_row"]
            digits = [(i >> (m * t)) & (q - 1) for t in range(d)]
            for x in range(q):
                f = 0
                for c in reversed(digits):  # Horner
                    f = mul(f, x) ^ c
                for b in range(q):
                    out[j, blk["col"] + x * q + b] = scale * (-1) ** bin(f & b).count("1")
    return out


def test_compact_files_hold_generators_not_rows(saved):
    model, out = saved
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    assert WEIGHTS_FILE not in sizes and sum(sizes.values()) < 1 << 20, sizes  # 110 KB, not 17 TB
    man = json.loads((out / MANIFEST_FILE).read_text())
    lay = man["embedding"]["pos_embed"]
    assert lay["n_rows"] == N + 1 and lay["materialized"] is False
    note = lay["not_materialized"]
    assert "is not materialised in any file" in note["statement"] and "Row r is generated" in note["statement"]
    assert note["function"].startswith("exactformer.constructions.export.embedding_rows")
    assert man["vocab"] == {"runs": [["s{}", 0, 64], ["p{}", 1, N]]}


def test_rows_regenerated_by_a_client_equal_the_executors(saved):
    model, out = saved
    man = json.loads((out / MANIFEST_FILE).read_text())
    rows = np.array([0, 1, 12345, N // 2 + 7, N - 1])
    mine = embedding_rows(model, "pos_embed", rows)
    fmt = parse_format(model.precision)
    raw = model.pos_embed.raw_reader(fmt)(rows)  # what the exact executor reads
    assert np.array_equal(mine, raw.astype(np.float64) * float(fmt.step))
    assert np.array_equal(_client_rows(man, "pos_embed", rows), mine)


def test_load_and_certify_from_the_files(saved):
    model, out = saved
    loaded = load(out)
    assert loaded.fingerprint() == model.fingerprint() and loaded.vocab == model.vocab
    assert loaded.vocab[64] == "p1" and loaded.vocab[-1] == f"p{N}"
    r = xf.verify(loaded, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason


def test_dense_export_beyond_the_limit_says_so(tmp_path):
    model = xf.build("index-lookup", n=4096).compiled
    out = save(model, tmp_path / "m", materialize_limit=0)
    man = json.loads((out / MANIFEST_FILE).read_text())
    for which in ("embed", "pos_embed"):
        assert "is not materialised" in man["embedding"][which]["not_materialized"]["statement"]
    rows = np.arange(0, 4097, 511)
    assert np.array_equal(_client_rows(man, "pos_embed", rows), embedding_rows(model, "pos_embed", rows))


def test_the_docs_example_runs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "exports.md").read_text()
    section = text[text.index("### Generated rows"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[: code.index("```")]
    scope: dict = {}
    exec(compile(code, "docs/exports.md", "exec"), scope)
    assert scope["rows"].shape == (3, scope["m"].compiled.d_model)
