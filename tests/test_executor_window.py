"""The windowed attention (verify/executor/window.py) is the whole rows' result, bit for bit.

* Unit: on hand-built keys (codes with and without a tail of near matches, exceptional keys, a
  shared partial that grows or stays flat, codes at distance 1, 2 and 3, small and large query
  scales) each row the window certifies equals the whole fixed-point row -- weights, saturations and
  underflows -- and where a pruned key would not be 0 the window refuses (returns None).
* Models: every registered weight construction, k-hop weight mutants and random inputs give the
  same logits and the same event counts with the window on and off, and the window is taken where
  it should be (the pointer heads of induction heads and k-hop).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import exactformer as xf
import exactformer.verify.executor.exact as executor
from exactformer.constructions.core.ir import ExactTensor
from exactformer.constructions.codes.positions import BinaryCode, CodeView, RandomSignCode, ReedSolomonCode
from exactformer.constructions.core.registry import task_of
from exactformer.constructions.theorems.index_lookup import index_lookup
from exactformer.precision import FixedPoint, parse_format
from exactformer.verify.executor import window
from registered import small_build, weight_constructions

FMT = FixedPoint.binary(int_bits=12, frac_bits=2)


def _whole_row(fmt, q, keys, p, last):
    """The forward pass's row: logits over keys 0..last (rounded products, exact sum, + p), then the
    rounded softmax. Returns (weights [last + 1], (saturations, underflows))."""
    fmt.reset_counts()
    part = fmt.matmul(q[None], keys[: last + 1].T)[0]
    logits = part if p is None else fmt.add(p[: last + 1], part)
    a = fmt.softmax(logits)
    return a, (fmt.counts.saturations, fmt.counts.underflows)


def _window_row(fmt, win, i, last):
    fmt.reset_counts()
    a = fmt.softmax(win.logits[i : i + 1])[0]
    und = fmt.counts.underflows + int(win.pruned[i]) - int(np.count_nonzero(~win.ok[i]))
    row = np.zeros(last + 1, dtype=np.int64)
    row[win.pos[i][win.ok[i]]] = a[win.ok[i]]
    return row, (fmt.counts.saturations, und)


def _keys(rng, T, bits, S, distinct):
    """+-S codes of ``bits`` dims (binary counting code of the positions when ``distinct``, else
    random symbols from an 8-letter balanced code), one exceptional key with a flag at 0."""
    if distinct:
        codes = ((np.arange(T)[:, None] >> np.arange(bits)) & 1) * 2 - 1
    else:
        book = np.array([[1, 1, -1, -1], [1, -1, 1, -1], [1, -1, -1, 1], [-1, 1, 1, -1], [-1, 1, -1, 1],
                         [-1, -1, 1, 1], [1, 1, 1, 1], [-1, -1, -1, -1]])[:, :bits]
        codes = book[rng.integers(0, len(book), T)]
    flag = np.zeros((T, 1), dtype=np.int64)
    flag[0] = 3 * S
    return np.concatenate([codes * S, flag], axis=1).astype(np.int64)


CASES = [  # (distinct codes, bits, query scale in units, shared partial: None | "rising" | "flat")
    (True, 6, 3, None), (True, 6, 1, None), (True, 6, 8, "rising"),
    (False, 4, 6, "rising"), (False, 4, 6, "flat"), (False, 4, 1, "rising"), (False, 4, 12, None),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_certified_rows_equal_the_whole_rows(case):
    distinct, bits, scale, shared = CASES[case]
    rng = np.random.default_rng(case)
    T, S = 40, FMT.scale
    keys = _keys(rng, T, bits, S, distinct)
    p = None if shared is None else (np.arange(T) * (2 if shared == "rising" else 0) - 5).astype(np.int64)
    index = window.index_keys(keys[None], p)
    assert index is not None and list(index.O) == [bits]  # the flag dim is the exceptional one
    q = np.concatenate([keys[rng.integers(0, T, 60), :bits] // S * scale * S,
                        np.full((60, 1), S)], axis=1)  # a key's code, scaled, and the flag's query
    q[::7, :bits] = rng.choice([-1, 1], (len(q[::7]), bits)) * scale * S  # a pattern no key may have
    last = rng.integers(0, T, 60)
    certified = 0
    for i in range(60):
        t = int(last[i])
        win = window.window_rows(index, q[i : i + 1], np.zeros(1, np.int64), last[i : i + 1], p, S, FMT.max_raw,
                                 FMT.min_raw, FMT.exp_zero_below())
        match = np.any(np.all(np.sign(keys[1 : t + 1, :bits]) == np.sign(q[i, :bits]), axis=1))
        if win is None:  # refused: a pruned key might not be 0 (no match to anchor the row, or a near one)
            assert not (match and distinct and scale >= 3 and shared is None), f"refused a row it should certify: {i}"
            continue
        certified += 1
        whole, ev = _whole_row(FMT, q[i], keys, p, t)
        got, ev2 = _window_row(FMT, win, 0, t)
        assert np.array_equal(whole, got) and ev == ev2, (i, t)
    assert certified > 0 or scale <= 1


def test_a_near_tail_is_refused_not_cut():
    """Many earlier matches within the exp window (a flat shared partial, the same code everywhere):
    the window must refuse rather than keep only its TAIL latest keys."""
    fmt = FixedPoint.binary(int_bits=12, frac_bits=8)
    S = fmt.scale
    keys = np.full((30, 2), S, dtype=np.int64)
    p = np.zeros(30, dtype=np.int64)
    index = window.index_keys(keys[None], p)
    q = np.full((5, 2), 4 * S, dtype=np.int64)
    last = np.array([3, 10, 20, 29, 29])
    win = window.window_rows(index, q, np.zeros(5, np.int64), last, p, S, fmt.max_raw, fmt.min_raw,
                             fmt.exp_zero_below())
    assert win is None
    whole, _ = _whole_row(fmt, q[1], keys, p, 10)
    assert np.count_nonzero(whole) == 11  # the rows really have more than TAIL nonzero weights


def test_a_query_off_the_codes_is_refused():
    """A query with a 0 entry on a code dim has no sign pattern: refused."""
    S = FMT.scale
    keys = _keys(np.random.default_rng(0), 16, 4, S, True)[None]
    index = window.index_keys(keys, None)
    q = np.zeros((1, 5), dtype=np.int64)
    q[0, :4] = [S, 0, S, S]
    assert window.window_rows(index, q, np.zeros(1, np.int64), np.array([15]), None, S, FMT.max_raw,
                              FMT.min_raw, FMT.exp_zero_below()) is None


def test_distance_bound():
    assert window.distance_bound(np.array([0b000, 0b001]), 3) == 1
    assert window.distance_bound(np.array([0b0011, 0b0101, 0b0110]), 4) == 2
    assert window.distance_bound(np.array([0b000, 0b111]), 3) == 3


def _both_ways(model, tokens, monkeypatch):
    """(run with the window, run with every row formed whole, how many heads took the window)."""
    fmt = parse_format(model.precision)
    taken = []
    real = window.window_rows

    def counting(*a, **kw):
        w = real(*a, **kw)
        taken.append(w is not None)
        return w

    executor._PLAN_CACHE.clear()
    monkeypatch.setattr(executor, "window_rows", counting)
    on = executor.run(model, tokens, fmt)
    executor._PLAN_CACHE.clear()
    monkeypatch.setattr(executor, "window_rows", lambda *a, **kw: None)
    off = executor.run(model, tokens, fmt)
    executor._PLAN_CACHE.clear()
    return on, off, sum(taken)


@pytest.mark.parametrize("name", weight_constructions())
def test_every_construction_the_same_with_and_without_the_window(name, monkeypatch):
    m = small_build(name).compiled
    task = task_of(m)
    taken = 0
    for b in list(task.sample(m, 6, 0)) + list(task.adversarial(m, 6, 1)):
        on, off, t = _both_ways(m, b.tokens, monkeypatch)
        assert np.array_equal(on.logits, off.logits) and on.counts == off.counts
        taken += t
    if name in ("induction-heads", "k-hop"):
        assert taken > 0


@pytest.mark.parametrize("seed", range(8))
def test_k_hop_mutants_the_same_with_and_without_the_window(seed, monkeypatch):
    m = xf.build("k-hop", n=12, k=3, alphabet=3).compiled
    rng = np.random.default_rng(seed)
    names = [n for n, t in m.tensors().items() if np.any(t.num != 0) and n.startswith("blocks")]
    name = names[int(rng.integers(len(names)))]
    t = m.tensors()[name]
    idx = tuple(np.argwhere(t.num != 0)[int(rng.integers(np.count_nonzero(t.num)))])
    num = t.num.copy()
    num[idx] = num[idx] * 2 if seed % 2 else -num[idx]
    mutant = m.replace_weight(name, ExactTensor(num, t.den))
    w = rng.integers(0, 3, (16, 12))
    tokens = task_of(m).encode_arrays(m, w)
    on, off, _ = _both_ways(mutant, tokens, monkeypatch)
    assert np.array_equal(on.logits, off.logits) and on.counts == off.counts, (name, idx)


# ------------------------------------------------------------------------------------------------
# keys that are a position code: decoded, never formed
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [ReedSolomonCode.for_max_inner(1 << 20), ReedSolomonCode(5000, 3, 5), BinaryCode(1000)],
                         ids=["rs-2^20", "rs-q8-d5", "binary"])
def test_decoding_names_the_codeword_or_none(code):
    rng = np.random.default_rng(0)
    i = rng.integers(0, code.n, 300)
    signs = code.numerators(i).astype(np.int64)
    assert np.array_equal(code.decode(signs), i)
    bent = signs.copy()
    bent[:, 0] *= -1
    got = code.decode(bent)
    named = got >= 0  # a bent word decodes only to a codeword that is exactly it
    assert np.array_equal(code.numerators(got[named]).astype(np.int64), bent[named])
    if code.family == "reed-solomon":
        assert not named.any()  # distance >= 2: one flip is never a codeword


def test_a_code_without_a_decoder_says_so():
    code = RandomSignCode(64, 16)
    assert code.decode(code.numerators(np.arange(4)).astype(np.int64)) is None


def test_index_lookup_keys_are_decoded_not_formed(monkeypatch):
    """Index Lookup's keys (the Reed-Solomon code of every position) are read through the decoder:
    the row is the whole row, and no key array of the length is formed."""
    m = index_lookup(4096, 4, positions="reed-solomon")
    batch = next(iter(task_of(m).sample(m, 8, 0)))
    formed = []
    real = window.index_keys
    monkeypatch.setattr(executor, "index_keys", lambda *a: formed.append(a[0].shape) or real(*a))
    on, off, taken = _both_ways(m, batch.tokens, monkeypatch)
    assert taken > 0 and formed == []
    assert np.array_equal(on.logits, off.logits) and on.counts == off.counts


def test_index_lookup_with_a_wide_exp_window_is_formed_whole(monkeypatch):
    """With 12 fraction bits the exp window is wider than the code's gap: the other keys are not 0,
    so the window refuses and the rows are formed whole (the same logits and counts)."""
    m = index_lookup(64, 4, positions="reed-solomon", precision="binary:int=8,frac=12")
    batch = next(iter(task_of(m).sample(m, 8, 0)))
    on, off, taken = _both_ways(m, batch.tokens, monkeypatch)
    assert taken == 0
    assert np.array_equal(on.logits, off.logits) and on.counts == off.counts


@pytest.mark.parametrize("change", ["both permuted", "keys permuted", "one key dim unused", "a key dim doubled",
                                    "the key block's scale negated", "a code view of the key block"])
def test_coded_keys_under_changed_key_maps(change, monkeypatch):
    """W_K's code columns permuted (with W_Q: the same model; alone: a wrong one whose queries are
    no codeword), one key dim dropped (an unused dim) or one doubled (no longer +-s), the key
    block's scale negated (every key flipped: the sign comes from the block, not only W_K), the
    block's code replaced by a view of it (no proved distance: not decoded): each run equals the
    whole rows, logits and counts."""
    m = index_lookup(64, 4, positions="reed-solomon")
    if change in ("the key block's scale negated", "a code view of the key block"):
        (kb,) = m.pos_embed.blocks
        kb = dataclasses.replace(kb, scale=-kb.scale) if "negated" in change else dataclasses.replace(
            kb, code=CodeView(kb.code))
        mutant = dataclasses.replace(m, pos_embed=dataclasses.replace(m.pos_embed, blocks=(kb,)))
        batch = next(iter(task_of(m).sample(m, 8, 0)))
        on, off, _ = _both_ways(mutant, batch.tokens, monkeypatch)
        assert np.array_equal(on.logits, off.logits) and on.counts == off.counts
        return
    t = m.tensors()
    WQ, WK = t["blocks.0.attn.W_Q"], t["blocks.0.attn.W_K"]
    perm = np.random.default_rng(0).permutation(WK.num.shape[2])
    qn, kn = WQ.num.copy(), WK.num.copy()
    if change in ("both permuted", "keys permuted"):
        kn = kn[..., perm]
        if change == "both permuted":
            qn = qn[..., perm]
    elif change == "one key dim unused":
        kn[..., 3] = 0
    else:
        kn[..., 5] *= 2
    mutant = m.replace_weight("blocks.0.attn.W_Q", ExactTensor(qn, WQ.den)).replace_weight(
        "blocks.0.attn.W_K", ExactTensor(kn, WK.den))
    batch = next(iter(task_of(m).sample(m, 8, 0)))
    on, off, taken = _both_ways(mutant, batch.tokens, monkeypatch)
    assert np.array_equal(on.logits, off.logits) and on.counts == off.counts
    if change == "both permuted":
        assert taken > 0 and on.answers == executor.run(m, batch.tokens, parse_format(m.precision)).answers
