"""Vector inputs, reduced positions and shared logit dims in the executor (issue 11's IR/executor
extensions): the executor equals the plain forward pass bit for bit on random models built to
exercise them, and the shortcuts are really taken.

* Vector inputs: token ids 0 and 1 carry a 2-vector placed in residual columns 8-9.
* Shared logit dims: head dims whose query and key read only positional columns (a position code),
  beside dims that read the vectors.
* Reduced positions: the second block's keys and values read only columns no block writes, so the
  first block is computed only at the answer positions.
"""

from __future__ import annotations


import numpy as np
import pytest

import exactformer.verify.executor.exact as executor
from exactformer.constructions.core.ir import (MLP, Attention, TransformerBlock, CompiledModel, Embedding, ExactTensor, Inputs,
                                          VectorInput)
from exactformer.precision import FixedPoint
from exactformer.verify.executor.forward import forward_reference

FMT = FixedPoint.binary(int_bits=8, frac_bits=4)
D, DH, T = 12, 4, 7
TOK, POS, VEC, WORK = np.arange(0, 4), np.arange(4, 8), np.arange(8, 10), np.arange(10, 12)


def _rand(rng, shape, rows=None, den=4, mag=8):
    num = rng.integers(-mag, mag + 1, size=shape)
    if rows is not None:
        keep = np.zeros(shape[-2], bool)
        keep[rows] = True
        num = num * keep[:, None]
    return ExactTensor(num.astype(np.int64), den)


def vector_model(seed: int, causal: bool, answers: tuple[int, ...]) -> CompiledModel:
    """Two blocks, one head each. Transformerblock 0: query/key dims 0-1 read positional columns only
    (shared), dims 2-3 the vector (and token) columns; values read everything; it writes the work
    columns. block 1: query reads the work columns, keys and values only token/positional columns."""
    rng = np.random.default_rng(seed)
    table = np.zeros((5, D), np.int64)
    table[:, TOK] = rng.integers(-4, 5, (5, 4))
    pos = np.zeros((T, D), np.int64)
    pos[:, POS] = rng.integers(-4, 5, (T, 4))
    z = lambda *s: ExactTensor(np.zeros(s, np.int64))

    def qk(rng):
        W = np.zeros((1, D, DH), np.int64)
        W[0][np.ix_(POS, [0, 1])] = rng.integers(-6, 7, (4, 2))
        W[0][np.ix_(np.r_[VEC, TOK[:2]], [2, 3])] = rng.integers(-6, 7, (4, 2))
        return ExactTensor(W, 4)

    wo = np.zeros((1, DH, D), np.int64)
    wo[0][:, WORK] = rng.integers(-4, 5, (DH, 2))
    a0 = Attention(qk(rng), qk(rng), _rand(rng, (1, D, DH)), ExactTensor(wo, 4), z(1, DH), z(1, DH), z(1, DH), z(D), causal)
    a1 = Attention(_rand(rng, (1, D, DH), WORK), _rand(rng, (1, D, DH), np.r_[TOK, POS]), _rand(rng, (1, D, DH), TOK),
                   ExactTensor(np.pad(rng.integers(-4, 5, (1, DH, 2)), ((0, 0), (0, 0), (10, 0))), 4),
                   z(1, DH), z(1, DH), z(1, DH), z(D), causal)
    def mlp() -> MLP:  # writes the work columns
        return MLP(_rand(rng, (D, 3)), ExactTensor(rng.integers(-4, 5, 3), 4),
                   ExactTensor(np.pad(rng.integers(-4, 5, (3, 2)), ((0, 0), (10, 0))), 4), z(D))

    return CompiledModel("test-vectors", "none", T, Embedding(5, D, ExactTensor(table, 4)), Embedding(T, D, ExactTensor(pos, 4)),
                         [TransformerBlock(a0, mlp()), TransformerBlock(a1, mlp())], _rand(rng, (D, 3)), z(3), [f"t{i}" for i in range(5)],
                         [0, 1, 2], answer_positions=answers, vector_input=VectorInput((0, 1), 8, 2))


def inputs(rng, B: int) -> Inputs:
    tokens = rng.integers(0, 5, (B, T))
    vec = rng.integers(-16, 17, (B, T, 2)) * np.isin(tokens, [0, 1])[..., None]
    return Inputs(tokens, ExactTensor(vec, 16))


@pytest.mark.parametrize("seed", range(12))
def test_vector_models_equal_the_plain_forward(seed):
    causal = seed % 2 == 0
    answers = ((T - 1,), (2, 5), (0, 3, 6))[seed % 3]
    model = vector_model(seed, causal, answers)
    plan = executor.plan_for(model, FMT, "cpu", T)
    assert plan.layers[0]["qk_split"][0] is not None  # the shared dims are split off
    assert np.array_equal(plan.block_pos[0], np.array(answers))  # block 0 only where block 1 asks
    x = inputs(np.random.default_rng(seed), 9)
    ref = forward_reference(model, x, FMT)
    got = executor.run(model, x, FMT)
    assert np.array_equal(got.logits, ref)
    assert np.array_equal(executor.run(model, x, FMT, device="torch-cpu").logits, ref)
    for b in (1, 2, 7):  # batches of every size, and one input at a time: the same logits
        assert np.array_equal(executor.run(model, x, FMT, batch_size=b).logits, ref)
    assert np.array_equal(np.concatenate([executor.run(model, x[i], FMT).logits for i in range(len(x))]), ref)
    assert executor.run(model, x, FMT).counts == executor.run(model, x, FMT, batch_size=1).counts


def test_the_vector_changes_the_answer_and_is_required():
    model = vector_model(3, True, (T - 1,))
    x = inputs(np.random.default_rng(0), 40)
    with pytest.raises(executor.ExecutorError, match="Inputs"):
        executor.run(model, x.tokens, FMT)
    zero = Inputs(x.tokens, ExactTensor(np.zeros_like(x.vectors.num), 16))
    assert not np.array_equal(executor.run(model, x, FMT).logits, executor.run(model, zero, FMT).logits)
    bad = x.vectors.num.copy()
    bad[np.isin(x.tokens, [2, 3, 4])] = 1  # a vector where the token carries none
    with pytest.raises(executor.ExecutorError, match="zero"):
        executor.run(model, Inputs(x.tokens, ExactTensor(bad, 16)), FMT)
    with pytest.raises(executor.ExecutorError, match="representable"):
        executor.run(model, Inputs(x.tokens, ExactTensor(x.vectors.num, 64)), FMT)  # 1/64 is off the 1/16 grid


def test_a_saturating_shared_partial_sum_is_computed_whole(monkeypatch):
    """With weights large enough that partial logit sums saturate, the split would not be the
    forward pass's sum: the executor must fall back (and still equal the plain forward pass)."""
    fmt = FixedPoint.binary(int_bits=3, frac_bits=2)
    results = []
    split = executor._Plan._head_split
    monkeypatch.setattr(executor._Plan, "_head_split", lambda *a: results.append(split(*a)) or results[-1])
    for seed in range(8):
        model = vector_model(seed, True, (T - 1,))
        x = inputs(np.random.default_rng(seed), 6)
        x = Inputs(x.tokens, ExactTensor(x.vectors.num // 4, 4))
        ref = forward_reference(model, x, fmt)
        res = executor.run(model, x, fmt)
        assert np.array_equal(res.logits, ref)
        assert res.counts == executor.run(model, x, fmt, batch_size=1).counts
    assert any(r is None for r in results) and any(r is not None for r in results)  # both paths taken
