"""The lower bounds' communication protocols run on built models (P1 Thm 4, App. D; Thm 2, Sec. 3)
and Lemma 1's fooling set for Dyck-(2, 2) (App. E): each protocol's answer equals the executor's
on every input at small N, for every split tried; its messages have the same length on every
input; the fooling set is checked on every pair."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

import exactformer as xf
from exactformer.constructions.core import registry
from exactformer.constructions.theorems.dyck import dyck_member
from exactformer.precision import parse_format
from exactformer.verify.bounds import lower_bounds as lb
from exactformer.verify.bounds import separations
from exactformer.verify.bounds.protocols import (ProtocolError, distinct_messages, one_layer_protocol,
                                                 recurrent_protocol)
from exactformer.verify.executor.exact import run
from random_models import random_model


def every_input(model) -> np.ndarray:
    """Token ids [B, T] of every input of ``model``'s task (its exhaustive enumeration)."""
    task = registry.task_of(model)
    return np.concatenate([b.tokens for b in task.exhaustive(model)])


def splits(T: int, seed: int = 0) -> list[np.ndarray]:
    """Alice's positions: the first half, every other position, and a seeded random half."""
    half = np.arange(T) < T // 2
    odd = np.arange(T) % 2 == 1
    rand = np.random.default_rng(seed).permutation(T) < T // 2
    return [half, odd, rand]


# ------------------------------------------------------------------------------------------------
# Thm 4: one-layer transformers
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [
    pytest.param(lambda: xf.build("index-lookup", n=4, alphabet=2).compiled, id="index-lookup N=4 (every input)"),
    pytest.param(lambda: xf.build("match2", n=4, modulus=3).compiled, id="match2 N=4 M=3 (every input)"),
    pytest.param(lambda: random_model(3, n_layers=1, vocab=3, T=4, n_answers=2), id="random one layer (every input)"),
    pytest.param(lambda: random_model(4, n_layers=1, vocab=3, T=5, causal=True), id="random causal layer (every input)",
                 marks=pytest.mark.slow),
    pytest.param(lambda: random_model(5, n_layers=1, vocab=3, T=5, n_answers=2), id="random, 5 positions (every input)",
                 marks=pytest.mark.slow),
])
@pytest.mark.slow
def test_thm4_protocol_equals_the_executor_on_every_input(model):
    m = model()
    fmt = parse_format(m.precision or "binary:int=4,frac=2")
    tokens = every_input(m) if m.construction != "random" else np.array(
        list(itertools.product(range(m.d_vocab), repeat=m.n_ctx)), dtype=np.int64)
    want = run(m, tokens, fmt)
    for alice in splits(tokens.shape[1]):
        bits = set()
        for i, t in enumerate(tokens):
            r = one_layer_protocol(m, t, alice, fmt)
            assert np.array_equal(r.logits, want.logits[i]) and r.answers == want.answers[i], (i, alice)
            assert {msg.sender for msg in r.messages} <= {"Alice", "Bob"}
            bits.add(r.bits)
        assert len(bits) == 1  # the messages' length does not depend on the input


def test_thm4_messages_are_counted_per_head_and_step():
    """Per answer position: the holder's token, then per head two largest logits (p bits each),
    two parts of Z and two parts of the attention output (d_head entries each)."""
    m = xf.build("index-lookup", n=8, alphabet=4).compiled
    t = next(registry.task_of(m).sample(m, 1, 0)).tokens[0]
    r = one_layer_protocol(m, t, np.arange(t.size) < 8)
    kinds = [msg.what.split(": ")[-1] if "head" in msg.what else "token" for msg in r.messages]
    H = m.blocks[0].attn.n_heads
    assert kinds == ["token"] + ["largest logit (step 2)"] * 2 * H + ["part of Z (step 3)"] * 2 * H \
        + ["part of the attention output (step 4)"] * 2 * H
    p = parse_format(m.precision).bits
    assert all(msg.bits == p for msg in r.messages if "largest" in msg.what)
    assert r.bits == sum(msg.bits for msg in r.messages)


def test_thm4_refuses_what_it_does_not_cover():
    two = xf.build("equality", n=8).compiled
    with pytest.raises(ProtocolError, match="one-layer transformers"):
        one_layer_protocol(two, np.zeros(8, np.int64), np.zeros(8, bool))
    one = xf.build("index-lookup", n=4, alphabet=2).compiled
    with pytest.raises(ProtocolError, match="alice: a boolean mask of the 5 positions"):
        one_layer_protocol(one, np.zeros(5, np.int64), np.zeros(4, bool))
    with pytest.raises(ProtocolError, match="fmt: a fixed-point format"):
        one_layer_protocol(one, np.zeros(5, np.int64), np.zeros(5, bool), "float64")


# ------------------------------------------------------------------------------------------------
# Thm 2: recurrent models
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,kw", [("dyck-rnn", dict(n=4)), ("index-lookup-rnn", dict(n=4)),
                                     ("equality-rnn", dict(n=6)), ("mqar-rnn", dict(n=4)),
                                     pytest.param("dyck-rnn", dict(n=6), marks=pytest.mark.slow)])
def test_thm2_protocol_equals_the_executor_on_every_input(name, kw):
    """Alice runs the prefix and sends the hidden state (m p bits, one way); Bob continues: the same
    answers and logits as the executor on every input, at every split that leaves Bob the answers."""
    m = xf.build(name, **kw).compiled
    fmt = parse_format(m.precision)
    tokens = every_input(m)
    want = run(m, tokens, fmt)
    last = int(m.answer_positions_for(tokens.shape[1]).min())
    for split in range(last + 1):
        for i, t in enumerate(tokens):
            r = recurrent_protocol(m, t, split)
            assert np.array_equal(r.logits, want.logits[i]) and r.answers == want.answers[i], (split, i)
            assert [msg.sender for msg in r.messages] == ["Alice"] and r.bits == m.hidden * fmt.bits
    with pytest.raises(ProtocolError, match="split: an integer in"):
        recurrent_protocol(m, tokens[0], last + 1)


def test_thm2_messages_tell_the_fooling_set_apart():
    """Over Lemma 1's fooling set at N = 8, the Dyck RNN's hidden state after the first half takes
    few values (a constant-size state), while INDEX's reduction needs 2^N distinct messages from
    the recurrent Index Lookup: it sends them (every prefix of symbols a different state)."""
    d = xf.build("dyck-rnn", n=8).compiled
    s = lb.dyck22_fooling_set(8)
    assert distinct_messages(d, s[:, :4]) <= d.hidden + 1
    il = xf.build("index-lookup-rnn", n=6).compiled
    prefixes = np.array(list(itertools.product(range(2), repeat=6)), dtype=np.int64)
    assert distinct_messages(il, prefixes) == 2**6


# ------------------------------------------------------------------------------------------------
# Lemma 1: the fooling set for Dyck-(2, 2)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 6, 8, 10])
def test_lemma1_fooling_set_is_checked_on_every_pair(n):
    s = lb.dyck22_fooling_set(n)
    assert len(s) == 2 ** (n - 1) == len({tuple(r) for r in s.tolist()})
    assert lb.check_fooling_set(s) == (True, "")
    assert lb.cc_dyck22_from_fooling_set(n) == n - 1 == lb.cc_dyck22(n)


def test_lemma1_by_hand_at_n_6():
    """Definition 1 checked pair by pair with plain loops (independent of the vectorised check):
    x = the symbols at odd positions, y = those at even positions (1-based)."""
    s = lb.dyck22_fooling_set(6).tolist()

    def member(x, y):
        z = [v for pair in zip(x, y) for v in pair]
        return bool(dyck_member(np.array([z]), 2, 2)[0])

    xs, ys = [r[0::2] for r in s], [r[1::2] for r in s]
    assert all(member(x, y) for x, y in zip(xs, ys))
    for i, j in itertools.combinations(range(len(s)), 2):
        assert not (member(xs[i], ys[j]) and member(xs[j], ys[i])), (s[i], s[j])


def test_a_set_that_does_not_fool_is_rejected():
    s = lb.dyck22_fooling_set(6)
    ok, why = lb.check_fooling_set(np.r_[s, s[:1]])  # a repeated string: both crossings are in the language
    assert not ok and "not distinguished" in why
    bad = s.copy()
    bad[0, -1] = 0  # no longer balanced
    ok, why = lb.check_fooling_set(bad)
    assert not ok and "not in Dyck-(2, 2)" in why
    with pytest.raises(lb.BoundError, match="at most 14"):
        lb.dyck22_fooling_set(16)


# ------------------------------------------------------------------------------------------------
# docs/separations.md
# ------------------------------------------------------------------------------------------------

SEPARATIONS_DOC = Path(__file__).resolve().parents[1] / "docs" / "separations.md"


def test_the_separations_page_runs_as_written():
    """Every python block of docs/separations.md, in order, each in a fresh namespace."""
    blocks = re.findall(r"```python\n(.*?)```", SEPARATIONS_DOC.read_text(), re.S)
    assert len(blocks) == 3
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/separations.md block {i}", "exec"), {})


@pytest.mark.slow
def test_the_separations_table_is_the_committed_data():
    """The generated block is what the committed size data and the protocol runs give now."""
    doc = json.loads((SEPARATIONS_DOC.parent / "figures" / "sizes.json").read_text())
    text = SEPARATIONS_DOC.read_text()
    assert separations.update_doc(text, doc, "figures") == text
