"""The executor computes exactly the plain forward pass, and holds no state across inputs.

* Oracle: ``executor.run`` == ``forward.forward_reference`` bit for bit, on random hand-built
  models (every shortcut's structure: shared, per-token and embedded projections, unwritten
  columns, causal layers, several answer positions) and on every construction; on numpy and on
  the torch code path.
* State: one input at a time == one batch == batches of 1, 2, 7 == alternating inputs through one
  plan == a fresh process; a plan is keyed by the model's content, so a model changed in place
  gets a new plan.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import exactformer.verify.executor.exact as executor
from exactformer.constructions.theorems.equality import equality, inequality
from exactformer.constructions.theorems.index_lookup import index_lookup
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.core.registry import task_of
from exactformer.constructions.theorems.thresholds import disjointness, k_cnf
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.executor.forward import forward_reference
from random_models import random_model
from registered import small_build, weight_constructions


def encode(model, *arrays):
    """Token ids of natural inputs held as the task's arrays."""
    return task_of(model).encode_arrays(model, *arrays)


def _constructions():
    """(name, model, tokens [12, T]) for every construction at a small n."""
    rng = np.random.default_rng(0)
    m = index_lookup(16, 4, positions="reed-solomon")
    yield "index-lookup", m, encode(m, rng.integers(0, 4, (12, 16)), rng.integers(1, 17, 12))
    for name, build in (("equality", equality), ("inequality", inequality)):
        m = build(16)
        x = np.where(rng.integers(0, 2, (12, 16)) > 0, 1, -1)
        x[:4, 8:] = x[:4, :8]
        yield name, m, encode(m, x)
    for name, build in (("disjointness", disjointness), ("cnf", lambda n: k_cnf(n, [[1, -2], [3, 4, -5]]))):
        m = build(8)
        yield name, m, encode(m, rng.integers(0, 2, (12, 8)))


def _registered_inputs(name: str, seed: int = 0):
    """The build of ``name`` at a small n and 12 inputs: sampled and the task's adversarial ones."""
    m = small_build(name).compiled
    task = task_of(m)
    batches = list(task.sample(m, 6, seed)) + list(task.adversarial(m, 6, seed + 1))
    return m, batches


def _registered():
    for name in weight_constructions():
        m, batches = _registered_inputs(name)
        for i, b in enumerate(batches):
            yield f"registered-{name}-{i}", m, b.tokens


CONSTRUCTIONS = list(_constructions()) + list(_registered())


@pytest.mark.parametrize("seed", range(24))
def test_executor_equals_plain_forward_on_random_models(seed):
    model = random_model(seed, n_layers=1 + seed % 3, n_answers=1 + seed % 3, code=seed % 4 == 0,
                         T=4 if seed % 4 == 0 else 6)
    fmt = FixedPoint.binary(int_bits=8, frac_bits=4)
    tokens = np.random.default_rng(seed).integers(0, model.d_vocab, (9, model.n_ctx))
    ref = forward_reference(model, tokens, fmt)
    got = executor.run(model, tokens, fmt)
    assert np.array_equal(got.logits, ref)
    assert np.array_equal(executor.run(model, tokens, fmt, device="torch-cpu").logits, ref)


@pytest.mark.parametrize("name,model,tokens", CONSTRUCTIONS, ids=[c[0] for c in CONSTRUCTIONS])
def test_executor_equals_plain_forward_on_constructions(name, model, tokens):
    fmt = parse_format(model.precision)
    ref = forward_reference(model, tokens, fmt)
    assert np.array_equal(executor.run(model, tokens, fmt).logits, ref)
    assert np.array_equal(executor.run(model, tokens, fmt, device="torch-cpu").logits, ref)


@pytest.mark.parametrize("name,model,tokens", CONSTRUCTIONS, ids=[c[0] for c in CONSTRUCTIONS])
def test_one_at_a_time_equals_batches(name, model, tokens):
    fmt = parse_format(model.precision)
    whole = executor.run(model, tokens, fmt).logits
    singles = np.concatenate([executor.run(model, tokens[i], fmt).logits for i in range(len(tokens))])
    assert np.array_equal(whole, singles)
    for bs in (1, 2, 7):
        assert np.array_equal(executor.run(model, tokens, fmt, batch_size=bs).logits, whole)
    # alternating inputs through one plan: first, last, first, ... one at a time
    for i in (0, len(tokens) - 1, 0, min(3, len(tokens) - 1), len(tokens) - 1):
        assert np.array_equal(executor.run(model, tokens[i], fmt).logits[0], whole[i])


def test_index_lookup_single_inputs_after_other_queries():
    """The reported failure: single inputs with different p through one plan (a batch with p = 3
    followed by one with p = N) must each answer s_p."""
    for n in (64, 1024):
        model = index_lookup(n, 8)
        fmt = parse_format(model.precision)
        rng = np.random.default_rng(n)
        sy = rng.integers(0, 8, (30, n))
        p = rng.integers(1, n + 1, 30)
        for i in range(30):
            res = executor.run(model, encode(model, sy[i : i + 1], p[i : i + 1]), fmt)
            assert res.answers[0][0] == sy[i, p[i] - 1]
        for pp in (3, n):
            batch = encode(model, sy[:4], np.full(4, pp))
            assert [a[0] for a in executor.run(model, batch, fmt).answers] == sy[:4, pp - 1].tolist()


@pytest.mark.slow
def test_every_construction_gives_the_same_logits_in_a_fresh_process():
    """Every registered weight construction: built, its inputs drawn (same seeds) and run in a
    fresh interpreter gives the logits of this process, whose plans have already served other
    inputs and models."""
    names = weight_constructions()
    here = {}
    for name in names:
        m, batches = _registered_inputs(name)
        fmt = parse_format(m.precision)
        here[name] = [executor.run(m, b.tokens, fmt).logits.tolist() for b in batches]
    code = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from test_executor import _registered_inputs\n"
        "from exactformer.precision import parse_format\n"
        "from exactformer.verify.executor.exact import run\n"
        "out = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    m, batches = _registered_inputs(name)\n"
        "    out[name] = [run(m, b.tokens, parse_format(m.precision)).logits.tolist() for b in batches]\n"
        "print(json.dumps(out))\n"
    )
    import pathlib
    res = subprocess.run([sys.executable, "-c", code, json.dumps(names), str(pathlib.Path(__file__).parent)],
                         capture_output=True, text=True, check=True)
    assert json.loads(res.stdout) == json.loads(json.dumps(here))


def test_fresh_process_gives_the_same_logits(tmp_path):
    name, model, tokens = CONSTRUCTIONS[0]
    fmt = parse_format(model.precision)
    here = executor.run(model, tokens, fmt).logits
    code = (
        "import json, sys, numpy as np\n"
        "from exactformer.constructions.theorems.index_lookup import index_lookup\n"
        "from exactformer.precision import parse_format\n"
        "from exactformer.verify.executor.exact import run\n"
        "m = index_lookup(16, 4, positions='reed-solomon')\n"
        "t = np.array(json.loads(sys.argv[1]))\n"
        "print(json.dumps(run(m, t, parse_format(m.precision)).logits.tolist()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(tokens.tolist())], capture_output=True, text=True,
                         check=True)
    assert np.array_equal(np.array(json.loads(out.stdout)), here)


def test_plan_is_keyed_by_content_not_identity():
    model = random_model(3, n_layers=2)
    fmt = FixedPoint.binary(int_bits=8, frac_bits=4)
    tokens = np.random.default_rng(1).integers(0, model.d_vocab, (5, model.n_ctx))
    before = executor.run(model, tokens, fmt).logits
    plan = executor.plan_for(model, fmt, "cpu", model.n_ctx)
    assert executor.plan_for(model, fmt, "cpu", model.n_ctx) is plan  # reused while unchanged
    # change a weight in place: the same object must now run the new weights
    blk = model.blocks[0]
    b_O = blk.attn.b_O.num.copy()
    b_O[:] += 4  # +1 on every residual column after the first attention
    model.blocks[0] = dataclasses.replace(blk, attn=dataclasses.replace(blk.attn, b_O=ExactTensor(b_O, 4)))
    model.b_U.num[0] += 8  # and +2 on one logit, in place inside the tensor
    after = executor.run(model, tokens, fmt).logits
    assert np.array_equal(after, forward_reference(model, tokens, fmt))
    assert not np.array_equal(before, after)
    assert executor.plan_for(model, fmt, "cpu", model.n_ctx) is not plan


@pytest.mark.parametrize("name,model,tokens", CONSTRUCTIONS[:3], ids=[c[0] for c in CONSTRUCTIONS[:3]])
def test_chunked_and_dense_paths_are_exact(name, model, tokens, monkeypatch):
    fmt = parse_format(model.precision)
    whole = executor.run(model, tokens, fmt)
    executor._PLAN_CACHE.clear()
    monkeypatch.setattr(executor, "ATTENTION_BLOCK_ENTRIES", 7)  # one query row per chunk
    chunked = executor.run(model, tokens, fmt)
    executor._PLAN_CACHE.clear()
    monkeypatch.setattr(executor, "SPARSE_FRACTION", 1 << 40)  # never sparse
    dense = executor.run(model, tokens, fmt)
    executor._PLAN_CACHE.clear()
    for r in (chunked, dense):
        assert np.array_equal(whole.logits, r.logits) and whole.counts == r.counts


def test_counts_are_per_run():
    model = index_lookup(16, 4, positions="reed-solomon")
    fmt = parse_format(model.precision)
    t = encode(model, np.zeros((3, 16), np.int64), np.array([1, 2, 3]))
    a = executor.run(model, t, fmt).counts
    assert executor.run(model, t, fmt).counts == a  # not accumulated across runs


@pytest.mark.parametrize("bad,match", [
    (np.zeros((2, 40), np.int64), "sequence length"),
    (np.full((1, 17), 99), "token ids"),
    (np.zeros((1, 17)) + 0.5, "integer array"),
])
def test_bad_tokens_are_refused(bad, match):
    model = index_lookup(16, 4, positions="reed-solomon")
    with pytest.raises(executor.ExecutorError, match=match):
        executor.run(model, bad, parse_format(model.precision))
    with pytest.raises(executor.ExecutorError, match="device"):
        executor.run(model, np.zeros((1, 17), np.int64), parse_format(model.precision), device="tpu")


def test_fraction_weights_keep_exact_semantics():
    """A run under a format too coarse for the answer still agrees with the plain forward pass."""
    model = random_model(7, n_layers=2)
    fmt = FixedPoint.binary(int_bits=3, frac_bits=2)  # saturates and rounds a lot
    tokens = np.random.default_rng(2).integers(0, model.d_vocab, (6, model.n_ctx))
    ref = forward_reference(model, tokens, fmt)
    got = executor.run(model, tokens, fmt)
    assert np.array_equal(got.logits, ref) and got.counts["saturations"] > 0
