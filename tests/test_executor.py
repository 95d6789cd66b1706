"""The executor: chunked attention and plan reuse give the same exact results."""

from __future__ import annotations

import numpy as np
import pytest

import exactformer.verify.executor as executor
from exactformer.constructions.equality import encode_arrays as eq_encode
from exactformer.constructions.equality import inequality
from exactformer.constructions.index_lookup import encode_arrays as il_encode
from exactformer.constructions.index_lookup import index_lookup
from exactformer.constructions.thresholds import disjointness
from exactformer.constructions.thresholds import encode_arrays as th_encode
from exactformer.precision import parse_format


def _models():
    rng = np.random.default_rng(0)
    m = inequality(32)
    yield m, eq_encode(m, np.where(rng.integers(0, 2, (6, 32)) > 0, 1, -1))
    m = disjointness(16)
    yield m, th_encode(m, rng.integers(0, 2, (6, 16)))
    m = index_lookup(16, 4, positions="reed-solomon")
    yield m, il_encode(m, rng.integers(0, 4, (6, 16)), rng.integers(1, 17, 6))


@pytest.mark.parametrize("case", range(3))
def test_chunked_attention_is_exact(case, monkeypatch):
    model, tokens = list(_models())[case]
    fmt = parse_format(model.precision)
    whole = executor.run(model, tokens, fmt)
    monkeypatch.setattr(executor, "ATTENTION_BLOCK_ENTRIES", 7)  # one query row per chunk
    executor._PLAN_CACHE.clear()
    chunked = executor.run(model, tokens, fmt)
    assert np.array_equal(whole.logits, chunked.logits) and whole.counts == chunked.counts


def test_plan_is_reused_and_replaced():
    model, tokens = list(_models())[2]
    fmt = parse_format(model.precision)
    executor.run(model, tokens, fmt)
    plan = executor._PLAN_CACHE[0][1]
    executor.run(model, tokens[:2], fmt)
    assert executor._PLAN_CACHE[0][1] is plan
    other = index_lookup(16, 4, positions="reed-solomon")
    executor.run(other, tokens, fmt)
    assert executor._PLAN_CACHE[0][1] is not plan and len(executor._PLAN_CACHE) == 1


@pytest.mark.parametrize("case", range(2))
def test_sparse_shared_attention_equals_dense(case, monkeypatch):
    """Shared first-block attention kept sparse (its zeros skipped) == the dense product."""
    model, tokens = list(_models())[case]
    fmt = parse_format(model.precision)
    executor._PLAN_CACHE.clear()
    sparse = executor.run(model, tokens, fmt)
    assert executor._PLAN_CACHE[0][1]._sparse_attn, "the one-hot first layer should be held sparse"
    monkeypatch.setattr(executor, "SPARSE_ATTENTION_ENTRIES", 0)
    executor._PLAN_CACHE.clear()
    dense = executor.run(model, tokens, fmt)
    assert not executor._PLAN_CACHE[0][1]._sparse_attn
    assert np.array_equal(sparse.logits, dense.logits) and sparse.counts == dense.counts
