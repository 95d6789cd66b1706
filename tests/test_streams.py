"""Inputs generated on demand (constructions/core/streams.py): Index Lookup's sampled and
adversarial inputs from N + 1 >= 2^25 tokens are never formed; the executor reads the positions it
needs. Forced here at small N (the threshold patched), they must be the inputs they describe:
formed, encoded and run, they give what the generated ones give."""

from __future__ import annotations

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import streams
from exactformer.constructions.core.streams import GeneratedTokens, counter_hash, uniform_symbols
from exactformer.constructions.theorems import index_lookup as il
from exactformer.precision import parse_format
from exactformer.verify.executor.exact import run


@pytest.fixture
def streamed(monkeypatch):
    """Index Lookup at N = 64 with its inputs generated on demand."""
    monkeypatch.setattr(il, "STREAM_TOKENS", 8)
    m = xf.build("index-lookup", n=64, alphabet=8)
    assert m.task.generated(m.compiled)
    return m


def _batches(m, count=40, seed=0):
    return list(m.task.adversarial(m.compiled, count, seed + 1)) + list(m.task.sample(m.compiled, count, seed))


def test_generated_inputs_are_the_inputs_they_describe(streamed):
    m, task = streamed, streamed.task
    for b in _batches(m):
        assert isinstance(b.tokens, GeneratedTokens) and b.tokens.shape == (len(b), 65)
        symbols, p = np.asarray(b.arrays[0]), b.arrays[1]
        formed = np.asarray(b.tokens)
        assert np.array_equal(formed, task.encode_arrays(m.compiled, symbols, p))  # the task's own encoding
        assert np.array_equal(b.truth, task.truth(m.compiled, symbols, p))
        pos = np.array([0, 3, 17, 63, 64])
        assert np.array_equal(b.tokens[:, pos], formed[:, pos]) and np.array_equal(b.tokens[:, 5:9], formed[:, 5:9])
        sub = b.take(np.array([1, 0]))
        assert np.array_equal(np.asarray(sub.tokens), formed[[1, 0]]) and list(sub.truth) == list(b.truth[[1, 0]])
        assert formed.min() >= b.tokens.min() and formed.max() <= b.tokens.max()
        d = b.example(0)
        assert d["p"] == int(p[0]) and "symbols" in d


def test_the_same_seed_gives_the_same_inputs(streamed):
    first = [np.asarray(b.tokens) for b in _batches(streamed, 20, 0)]
    again = [np.asarray(b.tokens) for b in _batches(streamed, 20, 0)]
    other = [np.asarray(b.tokens) for b in _batches(streamed, 20, 5)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_the_executor_reads_generated_inputs_as_formed_ones(streamed):
    model = streamed.compiled
    fmt = parse_format(model.precision)
    for b in _batches(streamed, 24):
        lazy, formed = run(model, b.tokens, fmt), run(model, np.asarray(b.tokens), fmt)
        assert np.array_equal(lazy.logits, formed.logits) and lazy.counts == formed.counts
        assert [a[0] for a in lazy.answers] == list(b.truth)


def test_a_wrong_model_is_refuted_on_generated_inputs(streamed):
    from exactformer.constructions.core.ir import ExactTensor

    model = streamed.compiled
    bump = np.zeros(len(model.answers), dtype=np.int64)
    bump[0] = 4  # symbol 0 wins wherever its logit was within 4 of the best
    bad = model.replace_weight("unembed.b_U", ExactTensor(bump))
    r = xf.verify(bad, mode="sample", samples=32)
    assert not r.passed and r.counterexample is not None
    assert "p" in r.counterexample["input"] and "symbols" in r.counterexample["input"]
    assert xf.verify(streamed, mode="sample", samples=32).passed


def test_uniform_symbols():
    keys = np.array([1, 2, 3], dtype=np.uint64)
    pos = np.arange(20000)
    s = uniform_symbols(keys, pos, 8)
    assert s.shape == (3, 20000) and s.min() == 0 and s.max() == 7
    counts = np.bincount(s.reshape(-1), minlength=8)
    assert np.all(np.abs(counts - 7500) < 400)  # 60000 draws over 8 symbols: ~ +-4.4 sigma
    assert np.array_equal(uniform_symbols(keys, pos[[5, 19999]], 8), s[:, [5, 19999]])  # any position alone
    assert counter_hash(keys, pos).dtype == np.uint64
    assert np.all(uniform_symbols(keys, pos, 5) < 5)


def test_forming_a_long_generated_input_is_refused():
    g = GeneratedTokens(lambda rows, pos: np.zeros((rows.size, pos.size), np.int64), 1, streams.FORM_LIMIT + 1, 0, 0,
                        lambda r: {})
    with pytest.raises(ValueError, match="not formed as an array"):
        np.asarray(g)
    assert g[:, [0, 5]].shape == (1, 2)


def test_index_lookup_sampled_at_two_to_the_thirty():
    """N = 2^30: the inputs are generated, the executor reads a few positions of each (the memory
    and speed goal is a benchmark: benchmarks/bench_sample.py)."""
    m = xf.build("index-lookup", n=1 << 30)
    batch = next(iter(m.task.sample(m.compiled, 4, 0)))
    assert isinstance(batch.tokens, GeneratedTokens)
    r = xf.verify(m, mode="sample", samples=4, seed=0)
    assert r.passed and r.inputs_covered == 8, r.reason
