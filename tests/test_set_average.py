"""SetAverage: one head averaging over a set of positions (a 0/1 member column of the positional
embedding), its local certificate and the models it refuses.

* exact in fixed point where the set size divides a power of two (every member's weight 1/m, every
  other position's 0), within the stated margin otherwise, designed for the format, real, float64
  and float32 (certified in all three, agreeing with every input);
* wrong models are refused: a member entry that is not 0 or 1, a query that depends on the input
  (W_Q != 0), a set the input can change (the token embedding writes the member column), a key bias on
  the member dim, a causal layer (the block proves bidirectional heads only), a set other than the
  task's, weaker attention (eta lowered): certify never passes a model that exhaustive enumeration
  finds wrong, and the refusal names what is wrong;
* build errors name the block: an empty set, a member slot the token embedding writes, a given eta
  below the condition.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest

import exactformer as xf
import exactformer.construct as public
from exactformer.constructions.core.ir import ExactTensor, IRError
from tutorial import registered


@pytest.fixture(scope="module")
def mean():
    with registered():
        yield "mean-over-set"


def _head(report) -> dict:
    return next(h for h in report.details["heads"] if h["block"] == "SetAverage")


@pytest.mark.parametrize("n,positions", [(8, [1, 3, 4, 6]), (8, [0, 5, 7]), (12, [2]), (10, list(range(10)))])
def test_certified_and_exact_where_the_size_divides_a_power_of_two(mean, n, positions):
    m = xf.build(mean, n=n, positions=positions)
    k = len(positions)
    for arithmetic in ("fixed", "float64", "float32"):
        r = m.verify(mode="certify", arithmetic=arithmetic)
        assert r.passed, (arithmetic, r.reason)
        if arithmetic == "fixed":
            lo, hi = (Fraction(w) for w in _head(r)["member_weight"])
            assert lo == hi
            if k & (k - 1) == 0:
                assert lo == Fraction(1, k) and (_head(r)["other_weight"] == "0")
            else:  # within the stated margin
                assert k * abs(lo - Fraction(1, k)) + (n - k) * Fraction(_head(r)["other_weight"]) <= Fraction(1, 8 * k * k)
    assert m.verify(mode="exhaustive").passed


def _judged(m) -> str:
    """Certify ``m``; where it passes, every input must be right. Returns the certificate's reason."""
    cert = m.verify(mode="certify", search_seconds=30)
    if cert.passed:
        exh = m.verify(mode="exhaustive")
        assert exh.passed, f"certified a wrong model: {exh.counterexample}"
    return cert.reason


def _with_table(m, fn):
    c = m.compiled
    num = c.pos_embed.table.num.copy()
    fn(num, c.layout)
    new = dataclasses.replace(c, pos_embed=dataclasses.replace(c.pos_embed, table=ExactTensor(num, c.pos_embed.table.den)))
    return xf.Model(new)


def _with_weight(m, name, fn):
    t = m.compiled.tensors()[name]
    num = t.num.copy()
    fn(num, m.compiled.layout)
    return xf.Model(m.compiled.replace_weight(name, ExactTensor(num, t.den)))


def test_a_member_entry_other_than_0_or_1_is_refused(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])

    def twice(num, layout):
        num[3 - m.compiled.pos_embed.table_first_row, layout["member"][0]] *= 2

    reason = _judged(_with_table(m, twice))
    assert "the member column holds 2 at position 3, not 0 or 1" in reason, reason


def test_a_query_that_depends_on_the_input_is_refused(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])

    def reads_x(num, layout):
        num[0, layout["x"][0], 0] = 1

    reason = _judged(_with_weight(m, "blocks.0.attn.W_Q", reads_x))
    assert "W_Q must be 0" in reason, reason


def test_a_set_the_input_changes_is_refused(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])
    c = m.compiled
    num = c.embed.table.num.copy()
    num[1, c.layout["member"][0]] = num[1, c.layout["x"][0]]  # token 1 joins the set wherever it is
    mutant = xf.Model(dataclasses.replace(c, embed=dataclasses.replace(c.embed, table=ExactTensor(num, c.embed.table.den))))
    reason = _judged(mutant)
    assert "the token embedding writes into the member column" in reason, reason


def test_a_key_bias_on_the_member_dim_is_refused(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])

    def bias(num, layout):
        num[0, 0] = 1

    reason = _judged(_with_weight(m, "blocks.0.attn.b_K", bias))
    assert "exactly one head dim must read the member column, with b_K = 0 there" in reason, reason


def test_a_causal_layer_is_refused(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])
    c = m.compiled
    mutant = xf.Model(dataclasses.replace(c, blocks=[dataclasses.replace(b, attn=dataclasses.replace(b.attn, causal=True))
                                                     for b in c.blocks]))
    reason = _judged(mutant)
    assert "SetAverage is proved for bidirectional attention, the layer is causal" in reason, reason


def test_a_set_other_than_the_tasks_is_refuted(mean):
    m = xf.build(mean, n=8, positions=[1, 3, 4, 6])
    m.compiled.task_params = dict(m.compiled.task_params, positions=[1, 3, 4, 7])
    r = m.verify(mode="certify")
    assert not r.passed and r.counterexample is not None, r.reason
    assert "the features the model counts differ from the task's" in r.reason


@pytest.mark.parametrize("divide", [2, 4, 16])
def test_weaker_attention_is_never_certified_wrong(mean, divide):
    """eta lowered: the other positions' weight no longer rounds to 0 (the margin grows): certify
    proves the model only where every answer is still right."""
    m = xf.build(mean, n=8, positions=[0, 5, 7])
    b_Q = m.compiled.tensors()["blocks.0.attn.b_Q"]
    weak = xf.Model(m.compiled.replace_weight("blocks.0.attn.b_Q", ExactTensor(b_Q.num, b_Q.den * divide)))
    fmt = xf.FixedPoint.binary(int_bits=12, frac_bits=12)  # holds the lowered eta
    cert = weak.verify(mode="certify", fmt=fmt, search_seconds=30)
    if cert.passed:
        assert weak.verify(mode="exhaustive", fmt=fmt).passed


def test_build_errors_name_the_block(mean):
    def builder(rows, token_member=False, eta=None, precision=None):
        mb = public.ModelBuilder(public.Layout(x=1, member=1, mean=1), n_layers=1, d_vocab=2, n_ctx=6)
        mb.token_rows([0, 1], "x", np.array([[0], [1]]))
        if rows:
            mb.position_rows(rows, "member", np.ones((len(rows), 1), dtype=np.int64))
        if token_member:
            mb.token_rows([1], "member", np.array([[1]]))
        public.SetAverage("member", "x", "mean", eta=eta).emit(mb, 0)
        public.AverageReadout("mean", max(1, len(rows))).emit(mb)
        return mb.build(answers=list(range(max(1, len(rows)) + 1)), precision=precision, construction="mean-over-set",
                        theorem="t", n=6)

    with pytest.raises(IRError, match="^SetAverage: member slot 'member' holds no 1: the set is empty$"):
        builder([])
    with pytest.raises(IRError, match="^SetAverage: member slot 'member' must be written by position_rows alone$"):
        builder([0, 2], token_member=True)
    with pytest.raises(IRError, match=r"^build: no binary format up to 48 bits allows the model: at the largest, block "
                                      r"SetAverage: its sufficient condition fails in binary:int=\d+,frac=\d+$"):
        builder([0, 2, 3], eta=Fraction(1, 2))  # a given eta too small for any format: the others keep weight
    mb = public.ModelBuilder(public.Layout(x=2, member=1, mean=1), n_layers=1, d_vocab=2, n_ctx=6)
    with pytest.raises(IRError, match="^SetAverage in layer 0: value slot 'x' has width 2, out slot 'mean' 1$"):
        public.SetAverage("member", "x", "mean").emit(mb, 0)
    with pytest.raises(IRError, match="^SetAverage in layer 0: member slot 'x' must have width 1, has 2$"):
        public.SetAverage("x", "mean", "mean").emit(mb, 0)
