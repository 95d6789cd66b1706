"""Features of the Theorem 13 family as runs (a rule over positions, constructions/theorems/boolean_tasks.py):
Disjointness and thresholds given by runs are built, certified (the run certificate), saved and
loaded without one array of N rows, so N reaches 2^30.

* the runs give the same model as the features listed one by one (every block, weight and param);
* the query-code runs read from pieces equal the runs scanned position by position;
* the certificate agrees with exhaustive enumeration at small N (and with the view certificate:
  tests/test_run_certificate.py's regression table);
* wrong models are refuted: a query block one position off (the weights), features that the
  weights do not compute (the descriptor of a general threshold, which defines its task), type
  signs on the wrong runs; Disjointness's stored runs are not read at all (its task is defined by
  N); a code class that redefines its vectors is not read run by run;
* several function types: the type-sign columns are a code constant on runs, read once per run by
  the run certificate and saved as runs;
* N = 2^30: Disjointness and thresholds given by runs built + certified, saved compact, loaded
  and certified from the files (slow).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.theorems import boolean_tasks as bt
from exactformer.constructions.theorems import thresholds as th
from exactformer.precision import parse_format
from exactformer.verify.executor.exact import run
from exactformer.verify.verifier import verify

RUNS8 = [{"count": 2, "index": [1, 5], "g": "0110"}, {"count": 2, "index": [3], "g": "01"},
         {"count": 2, "index": [2, 7], "step": [0, 1], "g": "0001"}]


def _fingerprint(m):
    blocks = [(b.col, b.first_row, b.count, b.code_start, b.scale, getattr(b.code, "kind", None),
               getattr(b.code, "data", None) if getattr(b.code, "kind", None) == "constant" else None)
              for e in (m.embed, m.pos_embed) for b in e.blocks]
    weights = [np.asarray(x.num).tobytes() for blk in m.blocks
               for x in (blk.attn.W_Q, blk.attn.W_K, blk.attn.W_V, blk.attn.W_O, blk.mlp.W_in, blk.mlp.b_in, blk.mlp.W_out)]
    return blocks, weights, {k: str(v.value) for k, v in m.params.items()}


def test_runs_build_the_model_the_listed_features_build():
    listed = [[[1, 5], [0, 1, 1, 0]], [[2, 6], [0, 1, 1, 0]], [[3], [0, 1]], [[4], [0, 1]],
              [[2, 7], [0, 0, 0, 1]], [[2, 8], [0, 0, 0, 1]]]
    a = xf.build("threshold", n=8, features=RUNS8, b=2).compiled
    b = xf.build("threshold", n=8, features=listed, b=2).compiled
    assert _fingerprint(a) == _fingerprint(b)
    assert "feature_runs" in a.task_params and "feature_index" in b.task_params
    fa, fb = bt.stored_features(8, a.task_params), bt.stored_features(8, b.task_params)
    assert all(np.array_equal(x, y) for x, y in zip(fa.arrays(), fb.arrays())) and fa.types == fb.types
    x = np.array(list(itertools.product([0, 1], repeat=8)))
    ta, tb = registry.task_of(a), registry.task_of(b)
    assert np.array_equal(ta.truth(a, x), tb.truth(b, x))


def test_disjointness_stores_one_run():
    m = xf.build("disjointness", n=256).compiled
    assert m.task_params["feature_runs"] == [{"first": 1, "count": 128, "index": [1, 129], "step": [1, 1], "type": 0}]
    assert "feature_index" not in m.task_params
    assert len(m.pos_embed.blocks) == 6  # keys; head 1: T(0..N/2), T(0); head 2: T(0), T(N/2+1..N), T(0)


@pytest.mark.parametrize("seed", range(20))
def test_runs_from_pieces_equal_runs_scanned_by_position(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(2, 40))
    cuts = np.unique(np.r_[0, rng.integers(1, T, size=int(rng.integers(0, 6))), T])
    pieces = [(int(a), int(b), int(rng.integers(0, 2)), int(rng.integers(-3, 4)) if rng.random() < 0.5 else -int(a) + 2)
              for a, b in zip(cuts, cuts[1:])]
    table = np.concatenate([s * np.arange(a, b) + o for a, b, s, o in pieces])
    assert bt.greedy_runs(pieces, T) == bt.table_runs(table)


@pytest.mark.parametrize("features,b", [(RUNS8, 2), (RUNS8, 0), ([{"count": 4, "index": [1, 5], "g": "1110"}], 3),
                                        ([{"count": 3, "index": [2, 1, 4], "g": "01101001"}, {"count": 1, "index": []}], 1)])
def test_certificate_agrees_with_exhaustive_enumeration(features, b):
    m = xf.build("threshold", n=8, features=features, b=b).compiled
    c, e = verify(m, "certify"), verify(m, "exhaustive")
    assert c.details["engine"] == "runs", c.details["engine"]
    assert e.inputs_covered == 256 and c.passed == e.passed and c.passed, (c.reason, e.counterexample)


MIXED16 = [{"count": 4, "index": [1, 9], "g": "0110"}, {"count": 4, "index": [5], "g": "01"},
           {"count": 2, "index": [1, 5], "g": "0001"}]


def _type_block(m):
    (i,) = [i for i, b in enumerate(m.pos_embed.blocks) if isinstance(b.code, th.TypeSigns)]
    return i


def test_several_function_types_are_runs_of_type_signs(tmp_path):
    """Type-sign columns are a code constant on runs (one vector per run): the run certificate
    reads them (engine "runs"), the files record the runs (not a vector per position), and the
    loaded model certifies the same."""
    m = xf.build("threshold", n=16, features=MIXED16, b=3)
    code = m.compiled.pos_embed.blocks[_type_block(m.compiled)].code
    assert code.starts.tolist() == [0, 1, 5, 9, 11] and code.types.tolist() == [-1, 0, 1, 2, -1]
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason
    xf.save(m, tmp_path / "m")
    entries = json.loads((tmp_path / "m" / "manifest.json").read_text())["codes"]
    assert [e["runs"] for e in entries if "runs" in e] == [{"n": 17, "k": 3}]
    loaded = xf.load(tmp_path / "m")
    r2 = xf.verify(loaded, mode="certify")
    assert r2.passed and r2.details["engine"] == "runs" and r2.min_margin == r.min_margin


def test_wrong_or_untrusted_type_codes():
    """Type signs that put the XOR type on the positions of the single-bit features are refuted
    (the run certificate itself); a code class that redefines its vectors is not read run by run
    (declined to the view certificate, which reads every vector)."""
    from exactformer.constructions.core.runs import RunConstantCode

    m = xf.build("threshold", n=16, features=MIXED16, b=3).compiled
    i = _type_block(m)
    old = m.pos_embed.blocks[i].code
    bad = copy.copy(m)
    blocks = list(m.pos_embed.blocks)
    blocks[i] = dataclasses.replace(blocks[i], code=th.TypeSigns(old.starts, np.array([-1, 1, 0, 2, -1]), 3, old.n))
    bad.pos_embed = dataclasses.replace(m.pos_embed, blocks=tuple(blocks))
    r = verify(bad, "certify")
    assert not r.passed and r.details["engine"] == "runs" and r.counterexample is not None, r.reason

    class Sneaky(RunConstantCode):
        def numerators(self, idx):
            return super().numerators(idx)

    odd = copy.copy(m)
    blocks = list(m.pos_embed.blocks)
    blocks[i] = dataclasses.replace(blocks[i], code=Sneaky(old.starts, old.rows, old.n))
    odd.pos_embed = dataclasses.replace(m.pos_embed, blocks=tuple(blocks))
    r = verify(odd, "certify")
    assert r.passed and r.details["engine"].startswith("views"), r.details["engine"]


def _partner_block(m):
    """Head 2's affine query block of Disjointness (positions 1 .. N/2 read T(i + N/2))."""
    h = m.n // 2
    (i,) = [i for i, b in enumerate(m.pos_embed.blocks) if b.first_row == 1 and b.count == h and b.code_start == h + 1]
    return i


def test_disjointness_pairing_one_off_is_refuted():
    """Head 2's queries read T(i + N/2 - 1): feature i is NAND(x_i, x_{i+N/2-1}), a wrong task."""
    m = xf.build("disjointness", n=6).compiled
    i = _partner_block(m)
    bad = copy.copy(m)
    blocks = list(m.pos_embed.blocks)
    blocks[i] = dataclasses.replace(blocks[i], code_start=blocks[i].code_start - 1)
    bad.pos_embed = dataclasses.replace(m.pos_embed, blocks=tuple(blocks))
    r = verify(bad, "certify")
    assert not r.passed and r.details["engine"] == "runs" and r.counterexample is not None, r.reason
    x = np.asarray([r.counterexample["input"]])
    task = registry.task_of(bad)
    assert int(task.truth(bad, x)[0]) == r.counterexample["expected"]
    assert run(bad, task.encode_arrays(bad, x), parse_format(bad.precision)).answers[0][0] != r.counterexample["expected"]
    assert not verify(bad, "exhaustive").passed


def test_stored_feature_runs_are_the_definition_of_a_threshold_not_of_disjointness():
    """A general threshold's runs define its task: runs that disagree with the weights (the query
    code reads (1, 5) but the runs say (1, 6)) are refuted. Disjointness's task is defined by N:
    its stored runs are never read (garbage there changes nothing), only its weights are."""
    m = xf.build("threshold", n=8, features=[{"count": 4, "index": [1, 5], "g": "1110"}], b=3).compiled
    assert verify(m, "certify").passed
    lie = copy.copy(m)
    lie.task_params = json.loads(json.dumps({k: v for k, v in m.task_params.items()}, default=str))
    lie.task_params["feature_runs"][0]["index"] = [1, 6]
    lie.task_params["feature_runs"][0]["count"] = 3
    r = verify(lie, "certify")
    assert not r.passed and r.counterexample is not None, r.reason
    d = xf.build("disjointness", n=8).compiled
    junk = copy.copy(d)
    junk.task_params = dict(d.task_params, feature_runs=[{"first": 1, "count": 1, "index": [2, 3], "step": [1, 1], "type": 0}])
    assert verify(junk, "certify").passed


@pytest.mark.parametrize("features,word", [
    ([{"count": 0, "index": [1]}], "count"),
    ([{"count": 2, "index": [8]}], "out of range"),
    ([{"count": 3, "index": [1, 3], "step": [1, 0]}], "meet"),
    ([{"count": 2, "index": [1], "step": [2]}], "step"),
    ([{"count": 2, "index": [1], "g": "01"}, [3]], "either every item"),
    ([{"count": 9, "index": [1], "g": "01"}], "[1, n]"),
    ([{"count": 1, "index": [1], "gee": "01"}], "keys"),
    ([{"count": 1, "index": [1, 2]}], "no g"),
])
def test_bad_runs_are_one_line_errors(features, word):
    with pytest.raises(bt.ThresholdError) as e:
        xf.build("threshold", n=8, features=features, b=0)
    assert word in str(e.value) and "\n" not in str(e.value)


def test_listed_features_stay_capped():
    with pytest.raises(ValueError, match=r"2\^22"):
        xf.build("dnf", n=1 << 23)
    with pytest.raises(ValueError, match=r"even integer in \[2, 2\^30\]"):
        xf.build("disjointness", n=(1 << 30) + 2)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # float32 / float64 at 2^30: NaN bounds, caught
def test_disjointness_at_a_billion_positions(tmp_path):
    """Built and certified by the run certificate at N = 2^30 (2^(2^30) inputs), saved in the
    compact form (no table of N rows), loaded and certified from the files."""
    m = xf.build("disjointness", n=1 << 30)
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason
    xf.save(m, tmp_path / "d", dense=False)
    files = sum(p.stat().st_size for p in (tmp_path / "d").iterdir())
    assert files < 1 << 20, files
    loaded = xf.load(tmp_path / "d")
    assert loaded.compiled.task_params["feature_runs"][0]["count"] == 1 << 29
    r2 = xf.verify(loaded, mode="certify")
    assert r2.passed and r2.details["engine"] == "runs", r2.reason
    # a wrong pairing at 2^30: never passed (no counterexample of 2^30 tokens is run)
    bad = copy.copy(m.compiled)
    i = _partner_block(bad)
    blocks = list(bad.pos_embed.blocks)
    blocks[i] = dataclasses.replace(blocks[i], code_start=blocks[i].code_start - 1)
    bad.pos_embed = dataclasses.replace(bad.pos_embed, blocks=tuple(blocks))
    rb = verify(bad, "certify")
    assert not rb.passed and rb.details["engine"] == "runs", rb.reason


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_thresholds_given_by_runs_at_a_billion_positions(tmp_path):
    n = 1 << 30
    m = xf.build("threshold", n=n, features=[{"count": n // 2, "index": [1, n // 2 + 1], "g": "0110"}], b=7)
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason
    h = n // 2  # three function types: type-sign columns as runs, saved as runs
    mixed = [{"count": h // 2, "index": [1, h + 1], "g": "0110"}, {"count": h // 2, "index": [h // 2 + 1], "g": "01"},
             {"count": 2, "index": [1, 5], "g": "0001"}]
    m = xf.build("threshold", n=n, features=mixed, b=3)
    r = xf.verify(m, mode="certify")
    assert r.passed and r.details["engine"] == "runs", r.reason
    xf.save(m, tmp_path / "m", dense=False)
    assert sum(p.stat().st_size for p in (tmp_path / "m").iterdir()) < 1 << 20
    r2 = xf.verify(xf.load(tmp_path / "m"), mode="certify")
    assert r2.passed and r2.details["engine"] == "runs", r2.reason
