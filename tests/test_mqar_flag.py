"""The lean MQAR build's flag FX as one positional run (constructions/theorems/mqar.py, ``_lean``).

FX used to be written on the second-half input positions N, N + 2, .., 2N - 2 row by row
(``position_rows``): a dense positional table of N - 1 rows over d_model columns (34 GiB at
N = 2^20). It is now a :class:`~exactformer.constructions.core.runs.RunConstantCode` of one run of
1s on positions N .. 2N - 2 (the rows below N are not covered: 0), so the second-half labels carry
FX = 1 (token) + 1 (position) = 2 where the dense rows gave them 1 (a positional vector constant
on [N, T) cannot tell inputs from labels there; FX only enters the first layer's logits, as
-eta1 c_label FX, and a lower logit for a label changes no answer). The tests compare the flag
at every position and token with the dense reference the old builder wrote, run the old model
(rebuilt here with its dense table) beside the new one, and round-trip the run through a
compact save and a fresh process.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core.ir import Embedding, ExactTensor
from exactformer.constructions.core.registry import task_of
from exactformer.constructions.core.runs import RunConstantCode, run_constant
from exactformer.constructions.theorems.mqar import mqar
from exactformer.precision import parse_format
from exactformer.verify.executor.exact import run

CASES = [dict(n=4, alphabet=4, labels=3), dict(n=6, alphabet=4, queries="all"), dict(n=16, labels=5, queries="all")]


def _fx_col(model) -> int:
    first, width = model.layout["FX"]
    assert width == 1
    return int(first)


def _old_pos_embed(model) -> Embedding:
    """The positional embedding the dense builder wrote: FX = 1 on rows N, N + 2, .., T - 1 (the
    second-half inputs) in a table, the model's other code blocks unchanged."""
    pe, n, col = model.pos_embed, model.n, _fx_col(model)
    rows = np.arange(n, 2 * n - 1, 2)
    table = np.zeros((rows[-1] - n + 1, pe.d_model), dtype=np.int64)
    table[rows - n, col] = 1
    blocks = tuple(b for b in pe.blocks if b.col != col)
    return Embedding(pe.n_rows, pe.d_model, ExactTensor(table, 1), n, blocks)


def _flag(model, pos_embed: Embedding, fmt) -> np.ndarray:
    """FX [T] at every position with the token the position holds (inputs: symbol 0, labels: label 0;
    the flag does not depend on which symbol or label), raw in ``fmt``."""
    T, S, col = 2 * model.n - 1, int(model.task_params["alphabet"]), np.array([_fx_col(model)])
    pos = np.arange(T)
    tok = np.where(pos % 2 == 0, 0, S)
    return (np.asarray(model.embed.raw(tok, fmt, col)) + np.asarray(pos_embed.raw(pos, fmt, col)))[:, 0]


@pytest.mark.parametrize("kw", CASES, ids=str)
def test_flag_at_every_position_equals_the_dense_builder_but_second_half_labels(kw):
    m = mqar(**kw)
    fmt = parse_format(m.precision)
    n, T, one = m.n, 2 * m.n - 1, int(fmt.scale)
    new, old = _flag(m, m.pos_embed, fmt), _flag(m, _old_pos_embed(m), fmt)
    pos = np.arange(T)
    reference = np.where(pos % 2 == 1, one, np.where(pos >= n, one, 0))  # labels 1, second-half inputs 1, else 0
    assert np.array_equal(old, reference)
    second_labels = (pos >= n) & (pos % 2 == 1)
    assert np.array_equal(new[~second_labels], reference[~second_labels])  # every input, every first-half label
    assert np.array_equal(new[second_labels], np.full(n // 2 - 1, 2 * one))  # 1 (token) + 1 (the run)
    # the same through the exact values every export reads (Embedding.values): no rounding involved
    col = _fx_col(m)
    exact = m.pos_embed.values(pos)
    assert exact.den == 1 and np.array_equal(exact.num[:, col], (pos >= n).astype(np.int64))


@pytest.mark.parametrize("kw", CASES, ids=str)
def test_the_positional_embedding_holds_no_dense_rows(kw):
    m = mqar(**kw)
    assert m.pos_embed.table.shape[0] == 0
    col, n, T = _fx_col(m), m.n, 2 * m.n - 1
    (blk,) = [b for b in m.pos_embed.blocks if b.col == col]
    assert run_constant(blk.code)
    assert (blk.first_row, blk.count, blk.code.k, blk.scale) == (n, T - n, 1, 1)
    assert blk.code.starts.tolist() == [0] and blk.code.rows.tolist() == [[1]]
    assert m.shape().table_rows == int(m.task_params["labels"])  # the label rows of the token table only


def test_no_dense_positional_rows_at_a_larger_n():
    m = mqar(1 << 12)
    assert m.pos_embed.table.shape[0] == 0 and m.embed.table.shape[0] == 2
    assert sum(b.code.family == "run-constant" for b in m.pos_embed.blocks) == 1


@pytest.mark.parametrize("kw", CASES, ids=str)
def test_same_answers_and_logits_as_the_dense_builder(kw):
    """The old model (dense FX rows) and the new one answer every sampled and adversarial input
    alike (every input for the smallest case), with equal logits, and certify."""
    m = mqar(**kw)
    old = dataclasses.replace(m, pos_embed=_old_pos_embed(m))
    fmt, task = parse_format(m.precision), task_of(m)
    batches = (list(task.exhaustive(m)) if task.count(m) <= 1 << 14
               else list(task.sample(m, 256, 0)) + list(task.adversarial(m, 256, 1)))
    for b in batches:
        a, o = run(m, b.tokens, fmt), run(old, b.tokens, fmt)
        assert np.array_equal(a.logits, o.logits)
        assert np.array_equal(np.asarray(a.answers), b.truth)
    assert xf.verify(m, mode="certify").passed


def test_compact_save_records_the_run_and_a_fresh_process_loads_it(tmp_path):
    m = xf.build("mqar", n=16, labels=3, queries="all")
    xf.save(m, tmp_path / "m", certify=False, dense=False)
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    runs = [c for c in manifest["codes"] if "runs" in c]
    assert [c["runs"] for c in runs] == [{"n": 15, "k": 1}]
    task = task_of(m.compiled)
    b = next(task.sample(m.compiled, 32, 5))
    inputs = [b.example(i) for i in range(len(b))]
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "import exactformer as xf\n"
        "from exactformer.constructions.core.runs import run_constant\n"
        "m = xf.load(sys.argv[1]); c = m.compiled\n"
        "col = c.layout['FX'][0]\n"
        "(blk,) = [b for b in c.pos_embed.blocks if b.col == col]\n"
        "print(json.dumps({'runs': run_constant(blk.code), 'starts': blk.code.starts.tolist(),\n"
        "                  'rows': blk.code.rows.tolist(), 'first': blk.first_row, 'count': blk.count,\n"
        "                  'table_rows': int(c.pos_embed.table.shape[0]),\n"
        "                  'fx': c.pos_embed.values(np.arange(31)).num[:, col].tolist(),\n"
        "                  'answers': m.run(json.loads(sys.argv[2])).answers,\n"
        "                  'certified': xf.verify(m, mode='certify').passed}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m"), json.dumps(inputs, default=int)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["runs"] and got["starts"] == [0] and got["rows"] == [[1]] and (got["first"], got["count"]) == (16, 15)
    assert got["table_rows"] == 0 and got["fx"] == [0] * 16 + [1] * 15
    assert got["answers"] == json.loads(json.dumps(m.run(inputs).answers, default=int))
    assert got["certified"]
