"""docs/examples/transformer_lens_bridge.py — the TransformerLens 4.x recipe of docs/exports.md — run
as written: from a saved model's files alone (manifest.json, model.safetensors), in float32 and
float64, its answers equal the exact executor's, for a bidirectional and a causal model, several
answer positions, vector inputs and a tied maximum (no answer)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import exactformer as xf

pytest.importorskip("transformer_lens", reason="transformer_lens not installed (extra [lens])")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "examples" / "transformer_lens_bridge.py"
DOC = ROOT / "docs" / "exports.md"


def _recipe():
    spec = importlib.util.spec_from_file_location("transformer_lens_bridge", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _half_cube(rng, count: int) -> list[list[float]]:
    """``count`` distinct vectors of (+-1/2)^4: unit norm, pairwise inner product <= 1/2."""
    words = rng.choice(16, size=count, replace=False)
    return [[0.5 - ((w >> j) & 1) for j in range(4)] for w in words]


def _examples(name: str, rng) -> list:
    if name == "index-lookup":
        return [[rng.integers(0, 8, 16).tolist(), int(rng.integers(1, 17))] for _ in range(6)] + [[[7] * 16, 16]]
    if name == "mqar":
        out = []
        for _ in range(6):
            first = rng.permutation(8)[:4].tolist()
            out.append([first + rng.permutation(first).tolist(), rng.integers(0, 2, 7).tolist()])
        return out
    if name == "match2":
        return [rng.integers(0, 37, 8).tolist() for _ in range(6)] + [[0] * 8, list(range(8))]
    vectors = [_half_cube(rng, 4) for _ in range(6)]
    return [[v[:3] + [v[int(rng.integers(0, 3))]], rng.integers(0, 2, 3).tolist()] for v in vectors]


CASES = {  # bidirectional, last position | causal, interleaved | several answer positions | vector inputs
    "index-lookup": dict(n=16, alphabet=8),
    "mqar": dict(n=8),
    "match2": dict(n=8),
    "nearest-neighbor": dict(n=4, d_in=4, margin="1/2"),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (model dir, natural inputs, the exact executor's answers)."""
    out, rng = {}, np.random.default_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # match2 and nearest-neighbor are not certified in floats: said on save
        for name, kw in CASES.items():
            m = xf.build(name, **kw)
            d = tmp_path_factory.mktemp(name)
            m.save(d)
            examples = _examples(name, rng)
            out[name] = (d, examples, m([tuple(e) for e in examples] if isinstance(examples[0][0], list) else examples))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", list(CASES))
def test_recipe_answers_like_the_exact_executor(saved, name, dtype):
    model_dir, examples, exact = saved[name]
    assert _recipe().run(model_dir, json.loads(json.dumps(examples)), dtype) == exact


def test_recipe_reads_a_tie_as_no_answer():
    """manifest.readout: a tie for the largest logit is no answer, as in the exact executor."""
    import torch

    man = {"answer_positions": None, "answers": {"values": ["a", "b", "c"]}}
    logits = torch.tensor([[[0.0, 2.0, 2.0]], [[0.0, 2.0, 1.0]]])
    assert _recipe().read_answers(man, logits) == [None, "b"]
    man["answer_positions"] = [0, 1]
    logits = torch.tensor([[[1.0, 1.0, 0.0], [0.0, 0.0, 3.0]]])
    assert _recipe().read_answers(man, logits) == [[None, "c"]]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_recipe_runs_as_a_script_in_a_fresh_process(saved, tmp_path, dtype):
    """The command docs/exports.md shows, in a fresh process that never imports exactformer."""
    model_dir, examples, exact = saved["index-lookup"]
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps(examples))
    imports = [l for l in SCRIPT.read_text().splitlines() if l.startswith(("import ", "from "))]
    assert imports and not any("exactformer" in l for l in imports)
    res = subprocess.run([sys.executable, str(SCRIPT), str(model_dir), str(inputs), "--dtype", dtype],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == exact
    assert f"python docs/examples/transformer_lens_bridge.py il16 inputs.json --dtype {dtype}" in DOC.read_text()
