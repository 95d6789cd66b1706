"""P2 Thm 4.4 executed: a low-rank attention transformer, its MPC simulation and the ANNA-transformer
Thm 4.1 compiles from it, on the same inputs; sizes against the theorem; the approximation allowed."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from exactformer.constructions.mpc.low_rank import LowRankError, head_out, low_rank_protocol, random_low_rank
from exactformer.constructions.mpc.protocol import Send, Step
from exactformer.precision import FixedPoint
from exactformer.verify.mpc.anna_check import check as check_anna
from exactformer.verify.mpc.anna_mpc import compile_anna, width_exponent
from exactformer.verify.mpc.anna_program import from_program
from exactformer.verify.mpc.low_rank import approximation, check, run, simulate


def test_def_4_3_head_output_by_hand():
    q = np.array([[[1, 2], [0, -1]]])  # [B=1, n=2, r=2]
    k = np.array([[[3, 0], [1, 1]]])
    v = np.array([[[2], [5]]])  # m = 1
    kv = np.einsum("bnr,bnm->brm", k, v)  # K′ᵀV = [[3·2 + 1·5], [0·2 + 1·5]] = [[11], [5]]
    assert kv.tolist() == [[[11], [5]]]
    assert head_out(q, kv, None).num.tolist() == [[[21], [-5]]]  # (1·11 + 2·5), (0·11 − 1·5)
    fmt = FixedPoint.binary(8, 1)  # S = 2: round(num / 4), floor
    assert head_out(q, kv, fmt).num.tolist() == [[[5], [-2]]]


@pytest.mark.parametrize("n,kw,ep", [(16, dict(layers=2, rank=2), 1.6), (64, dict(layers=3, heads=2, rank=3), 1.2),
                                     (256, dict(layers=2, rank=2, value_words=3), 0.9)])
def test_every_level_agrees(n, kw, ep):
    T = random_low_rank(n, seed=n, **kw)
    for fmt in (None, FixedPoint.binary(20, 3)):
        sim = simulate(T, ep, fmt=fmt)
        r = check(sim, samples=10, seed=1)
        assert r.passed, r.reason
        assert r.levels[:3] == ["low-rank", "mpc", "anna ideal"] and r.inputs == 13
        assert r.approximation["within"]


def test_sizes_against_the_theorem():
    T = random_low_rank(256, layers=2, rank=2, seed=0)
    sim = simulate(T, 0.9)
    z = sim.sizes()
    pl = sim.plan
    # depth: (⌈log_B N⌉ + ⌈log_b N⌉) ANNA layers per low-rank layer, B = ⌈N^{ε′−ε}⌉, b = max(2, ⌊N^{(ε′−ε)/4}⌋)
    assert z["anna_layers"] == 2 * (pl.up_levels + pl.down_levels) == len(sim.protocol.rounds)
    assert pl.up_fan == int(np.ceil(256 ** (pl.eps_prime - pl.eps) - 1e-9)) and pl.down_fan == 2
    assert z["max_heads"] == pl.down_fan - 1 <= max(1, z["heads_bound"])
    assert z["m"] == 2 * pl.up_fan * pl.matrix  # a send head's value: (indicator, word) per inbox slot
    assert sim.resources.is_mpc  # push only: a Def. 2.3 protocol, compiled head for head


def test_through_thm_4_2_as_well():
    """low-rank → MPC → ANNA (Thm 4.1) → MPC (Thm 4.2): the last protocol reproduces the first."""
    T = random_low_rank(32, layers=2, rank=2, seed=3)
    sim = simulate(T, 1.3)
    A = from_program(sim.program)
    back = compile_anna(A, width_exponent(A) + 0.4)
    x = np.random.default_rng(0).integers(0, 8, (6, 32))
    assert np.array_equal(back(x), run(T, x))
    assert check_anna(back, [("sample", x)]).passed


def test_approximation_allowed():
    T = random_low_rank(64, layers=2, rank=3, seed=1)
    x = np.random.default_rng(0).integers(0, 8, (8, 64))
    assert approximation(T, x, None) == {"max_steps": 0.0, "bound": 0.0, "within": True}
    floor = approximation(T, x, FixedPoint.binary(20, 3))
    near = approximation(T, x, FixedPoint.binary(20, 3, rounding="nearest-even"))
    assert 0.5 < floor["max_steps"] < 1 and floor["within"]  # one rounding to the grid, towards −∞
    assert 0 < near["max_steps"] <= 0.5 and near["within"]


def test_a_dropped_message_is_found_at_its_round():
    T = random_low_rank(16, layers=2, rank=2, seed=2)
    sim = simulate(T, 1.6)
    rounds = list(sim.protocol.rounds)
    step = rounds[0].step  # up-1: every machine sends its K′_i ⊗ V_i

    def drop(mem):
        st = step(mem)
        d = st.send.dest.copy()
        d[:, 1] = -1  # machine 1 sends nothing
        return Step(st.memory, Send(d, st.send.slot, st.send.word))

    rounds[0] = dataclasses.replace(rounds[0], step=drop)
    bad = dataclasses.replace(sim, protocol=dataclasses.replace(sim.protocol, rounds=tuple(rounds)))
    r = check(bad, samples=4)
    # the ANNA-transformer (compiled from the intact protocol) differs from the protocol's memory
    assert not r.passed and "after round 1 ('L0.up-1')" in r.reason


def test_the_same_twice_and_one_against_many():
    T = random_low_rank(32, layers=2, heads=2, rank=2, seed=5)
    sim = simulate(T, 1.3)
    x = np.random.default_rng(1).integers(0, 8, (5, 32))
    a = sim(x)
    assert np.array_equal(a, sim(x)) and np.array_equal(a[3], sim(x[3])[0])
    assert np.array_equal(a, sim(x, "mpc")) and np.array_equal(a, sim(x, "anna-fixed"))


def test_bad_parameters():
    T = random_low_rank(16, seed=0)
    with pytest.raises(LowRankError, match=r"eps_prime: must be a number in"):
        low_rank_protocol(T, 0.1)
    with pytest.raises(LowRankError, match="rank must be an integer >= 1"):
        random_low_rank(16, rank=0)
    with pytest.raises(LowRankError, match="level: must be one of"):
        simulate(T, 1.6)(np.zeros((1, 16), dtype=np.int64), "softmax")
    big = dataclasses.replace(T, factor_bits=1)
    with pytest.raises(LowRankError, match="break the bound"):
        run(big, np.ones((1, 16), dtype=np.int64))
