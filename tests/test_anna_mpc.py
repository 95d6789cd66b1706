"""P2 Thm 4.2 executed: ANNA-transformers (Alg. 1) compiled to MPC protocols, checked against Alg. 1
layer by layer with Def. 2.3's limits enforced by the runtime; the EMA round trip (protocol → EMA
program → protocol); the recursive Columnsort; broken simulations refused."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from exactformer.constructions.mpc.compile import compile_protocol
from exactformer.constructions.mpc.protocol import Protocol, ProtocolError, Round, Send, Step
from exactformer.constructions.mpc.sorting import columnsort_plan
from exactformer.precision import FixedPoint
from exactformer.verify.mpc import check as mpc_check
from exactformer.verify.mpc import protocol_run
from exactformer.verify.mpc.anna_check import ROUND_CONSTANT, check, round_bound
from exactformer.verify.mpc.anna_mpc import ANNAMPCError, compile_anna, plan
from exactformer.verify.mpc.anna_program import ANNAProgramError, from_program, planted_transformer, run


# ------------------------------------------------------------------------------------------------
# the recursive Columnsort
# ------------------------------------------------------------------------------------------------


def _sorted_by_plan(M: int, k: int, vals: np.ndarray) -> np.ndarray:
    """Run a Columnsort plan on values (inf = an empty slot): local sort, then each permutation."""
    a = vals.copy()
    for p in columnsort_plan(M, k).perms:
        a = np.sort(a.reshape(M, k), axis=1).reshape(-1)
        b = np.empty_like(a)
        b[p] = a
        a = b
    return np.sort(a.reshape(M, k), axis=1).reshape(-1)


@pytest.mark.parametrize("M,k", [(1, 4), (2, 2), (4, 2), (8, 4), (16, 4), (64, 4), (32, 32), (128, 16)])
def test_columnsort_plan_sorts_with_ties_and_empty_slots(M, k):
    rng = np.random.default_rng(M * 100 + k)
    for fill in (1.0, 0.5):
        vals = rng.integers(0, 4, M * k).astype(float)
        vals[rng.random(M * k) > fill] = np.inf
        assert np.array_equal(_sorted_by_plan(M, k, vals), np.sort(vals))


def test_columnsort_rounds_per_level():
    one, two = columnsort_plan(8, 128), columnsort_plan(32, 128)
    assert (one.levels, one.rounds) == (1, 4)  # Leighton's 4 permutations with one column per machine
    assert (two.levels, two.rounds) == (2, 16)  # 4 sorts of 4 rounds and 4 permutations, 2 of them composed
    assert columnsort_plan(1, 8).rounds == 0
    with pytest.raises(ProtocolError, match="power of two"):
        columnsort_plan(3, 4)


def test_columnsort_plan_refutes_a_broken_permutation():
    """The sort check is not vacuous: one transposition in a permutation leaves data unsorted."""
    M, k = 16, 4
    plan_ = columnsort_plan(M, k)
    bad = list(plan_.perms)
    p = bad[-1].copy()  # two items of the last permutation sent to each other's machine
    b = int(np.flatnonzero(p // k != p[0] // k)[0])
    p[[0, b]] = p[[b, 0]]
    bad[-1] = p
    rng = np.random.default_rng(0)
    fails = 0
    for _ in range(20):
        a = rng.permutation(M * k).astype(float)
        want = np.sort(a)
        for q in bad:
            a = np.sort(a.reshape(M, k), axis=1).reshape(-1)
            b = np.empty_like(a)
            b[q] = a
            a = b
        fails += not np.array_equal(np.sort(a.reshape(M, k), axis=1).reshape(-1), want)
    assert fails > 0


# ------------------------------------------------------------------------------------------------
# protocols with P machines for n words
# ------------------------------------------------------------------------------------------------


def test_protocol_with_more_machines_than_words():
    """Input words on machines 0..n−1, a helper machine n adds them up and sends the sum back."""
    n, P = 3, 4

    def init(x):
        out = np.full((x.shape[0], P), -1)
        out[:, :n] = x
        return {"x": out}

    def gather(mem):
        x = mem["x"]
        dest = np.where(np.arange(P) < n, n, -1)[None, :].repeat(x.shape[0], 0)
        return Step({"x": x}, send=Send(dest, np.broadcast_to(np.arange(P), x.shape) % n, np.maximum(x, 0)))

    def back(mem):  # the helper sends the sum to machines 0 .. n − 1, slot 0
        s = mem["inbox"][:, n, :].sum(axis=-1) % 16
        B = len(s)
        dest = np.full((B, P, n), -1)
        dest[:, n] = np.arange(n)
        return Step({}, send=Send(dest, np.zeros_like(dest), np.broadcast_to(s[:, None, None], dest.shape)))

    p = Protocol("sum", n, 4, 3, init, (Round("gather", gather, sends=1, slots=n),
                                        Round("back", back, sends=n, slots=1)),
                 lambda mem: mem["inbox"][:, :n, 0], machines=P)
    assert p.n_machines == 4 and "P=4" in repr(p)
    assert protocol_run.run(p, np.array([[1, 2, 3], [5, 6, 7]])).outputs.tolist() == [[6, 6, 6], [2, 2, 2]]
    with pytest.raises(ProtocolError, match="P = 4 machines for n = 3"):
        compile_protocol(p)
    wrong = dataclasses.replace(p, output=lambda mem: mem["inbox"][..., 0])  # [B, P]: not one answer per word
    with pytest.raises(protocol_run.MPCError, match=r"output must be an int array \[B=1, n=3\]"):
        protocol_run.run(wrong, np.array([[1, 2, 3]]))


# ------------------------------------------------------------------------------------------------
# Thm 4.2 on planted ANNA-transformers
# ------------------------------------------------------------------------------------------------


CASES = [  # (n, planted kwargs, eps', eps): workers or not, one or two sort levels, scans of depth 0..5
    (16, dict(layers=2, heads=2), 1.5, None),
    (64, dict(layers=2, heads=2, tables=6), 0.8, 0.4),
    (32, dict(layers=2, heads=2, tables=12), 0.5, 0.4),
    (64, dict(layers=1, heads=1, tables=24, hashes=3, family="hyperplane", dim=8), 0.45, 0.3),
    (128, dict(layers=2, heads=3, tables=3, family="cross-polytope", dim=8, value_words=2), 0.5, 0.3),
    (256, dict(layers=2, heads=1, tables=8), 0.5, 0.3),
]


@pytest.mark.parametrize("n,kw,ep,e", CASES)
def test_simulation_equals_alg1_layer_by_layer(n, kw, ep, e):
    T = planted_transformer(n, seed=n, **kw)
    sim = compile_anna(T, ep, e)
    r = check(sim, samples=12, seed=1)
    assert r.passed, r.reason
    assert r.inputs == 16 and r.sources["all-equal"] == 1  # 4 named inputs + 12 samples
    assert r.peak["memory"] <= r.memory and r.peak["sent"] <= r.memory and r.peak["received"] <= r.memory
    assert r.rounds == sim.plan.rounds <= round_bound(sim)
    assert r.machines == sim.plan.machines


def test_simulation_in_fixed_point_and_the_parts_it_uses():
    T = planted_transformer(64, layers=2, heads=2, tables=6, seed=4)
    for fmt in (FixedPoint.binary(12, 3), FixedPoint.binary(12, 3, rounding="nearest-even")):
        sim = compile_anna(T, 0.8, 0.4, fmt=fmt)
        assert check(sim, samples=10, seed=2).passed
    # the cases above use every part: workers and their tree, several tokens per machine, two sort levels
    lp = compile_anna(planted_transformer(32, layers=2, heads=2, tables=12, seed=32), 0.5, 0.4).plan.layers[0]
    assert lp.workers == 8 and lp.tree_levels == 2 and lp.tok_per == 4 and lp.sort.levels == 2
    assert lp.scan_levels == 3
    lp = compile_anna(planted_transformer(256, tables=8, seed=256), 0.5, 0.3).plan.layers[0]
    assert lp.workers == 0 and lp.sort.levels == 2 and lp.scan_levels == 5


def test_state_same_twice_one_and_many_and_fresh_process():
    T = planted_transformer(32, layers=2, heads=2, tables=5, seed=7)
    sim = compile_anna(T, 0.9, 0.5)
    x = np.random.default_rng(3).integers(0, 4, (6, 32))
    many = sim(x)
    assert np.array_equal(many, sim(x))  # the same thing twice
    assert np.array_equal(many[2], sim(x[2])[0])  # one input against many
    assert np.array_equal(many, run(T, x))
    code = ("import numpy as np\nfrom exactformer.verify.mpc.anna_program import planted_transformer\n"
            "from exactformer.verify.mpc.anna_mpc import compile_anna\n"
            "T = planted_transformer(32, layers=2, heads=2, tables=5, seed=7)\n"
            "x = np.random.default_rng(3).integers(0, 4, (6, 32))\n"
            "print(compile_anna(T, 0.9, 0.5)(x).tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert eval(out.stdout) == many.tolist()


def test_the_plan_against_the_theorem():
    """s = 8·⌈N^{ε′−ε}⌉·W; P counts token machines, workers and the sort / value groups."""
    T = planted_transformer(256, layers=1, heads=1, tables=4, seed=0)
    pl = plan(T, 0.75, 0.25)
    assert pl.fan == 16 and pl.base_memory == 8 * 16 * pl.width and pl.memory == pl.base_memory
    lp = pl.layers[0]
    assert pl.machines == pl.token_machines + lp.machines
    assert lp.machines == max(lp.workers * 256, lp.pairs * lp.sort_machines, lp.pairs * lp.value_machines)
    assert pl.word_bits >= T.value_bits + (256 * 4).bit_length() + 1  # sums of ℓ·N values, two's complement


# ------------------------------------------------------------------------------------------------
# the EMA special case: protocol -> EMA program (Thm 4.1) -> protocol (Thm 4.2)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,n,params", [
    ("k-hop", 16, dict(hops=3, alphabet=4)),
    ("induction-heads", 32, dict(alphabet=5)),
    ("match2", 16, dict(modulus=7)),
    ("prefix-sums", 16, dict(word_bits=4)),
    ("sort", 16, dict(value_bits=4)),
])
def test_round_trip_reproduces_the_first_protocol(name, n, params):
    m = mpc_check.build(name, n, **params)
    T = from_program(m.program)
    x = np.concatenate([x for _, x in m.application.named(m.compiled, 1)][:6]
                       + [m.application.draw(m.compiled, np.random.default_rng(0), 10)])
    want = protocol_run.run(m.protocol, x).outputs
    for fmt in (None, m.fmt):
        sim = compile_anna(T, 1.5, fmt=fmt)
        assert np.array_equal(sim(x), want)
        assert check(sim, [("mixed", x)]).passed


def test_round_trip_k_hop_with_branching_and_the_invariant():
    m = mpc_check.build("k-hop", 27, hops=5, alphabet=3, branching=3)
    sim = compile_anna(from_program(m.program), 1.8)
    r = check(sim, m.application.adversarial(m.compiled, 64, 2) and
              ((b.kind, b.arrays[0]) for b in m.application.adversarial(m.compiled, 64, 2)))
    assert r.passed and r.inputs > 10, r.reason
    assert r.layers == len(m.protocol.rounds)


# ------------------------------------------------------------------------------------------------
# broken simulations refused
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim():
    return compile_anna(planted_transformer(64, layers=2, heads=2, tables=6, seed=4), 0.8, 0.4)


def test_a_machine_over_its_memory_is_refused(sim):
    r = check(sim, samples=4)
    smaller = dataclasses.replace(sim, protocol=dataclasses.replace(sim.protocol, memory=max(r.peak.values()) - 1))
    bad = check(smaller, samples=4)
    assert not bad.passed and bad.counterexample.kind == "resource"
    assert f"s = {max(r.peak.values()) - 1} words" in bad.reason


def _with_step(sim, name, wrap):
    rounds = list(sim.protocol.rounds)
    j = next(i for i, r in enumerate(rounds) if r.name == name)
    rounds[j] = dataclasses.replace(rounds[j], step=wrap(rounds[j].step))
    return dataclasses.replace(sim, protocol=dataclasses.replace(sim.protocol, rounds=tuple(rounds)))


def test_a_dropped_message_is_refused(sim):
    def drop(step):
        def new(mem):
            st = step(mem)
            d = st.send.dest.copy()
            b, i, m = np.argwhere(d >= 0)[-1]
            d[b, i, m] = -1
            return Step(st.memory, Send(d, st.send.slot, st.send.word))
        return new

    bad = check(_with_step(sim, "L0.values", drop), samples=4)
    assert not bad.passed and bad.counterexample.kind == "head" and bad.counterexample.layer == 1
    assert "Alg. 1 gives" in bad.reason


def test_a_wrong_round_count_is_refused(sim):
    fewer = dataclasses.replace(sim, protocol=dataclasses.replace(sim.protocol, rounds=sim.protocol.rounds[:-1]))
    r = check(fewer, samples=2)
    assert not r.passed and r.counterexample.kind == "rounds" and "plan" in r.reason
    idle = Round("idle", lambda mem: Step({k: v for k, v in mem.items() if k != "inbox"}))
    more = dataclasses.replace(sim, protocol=dataclasses.replace(sim.protocol, rounds=(idle,) + sim.protocol.rounds))
    assert check(more, samples=2).counterexample.kind == "rounds"  # right answers, but not the plan's rounds
    assert np.array_equal(more(np.zeros((1, 64), dtype=np.int64)), sim(np.zeros((1, 64), dtype=np.int64)))
    over = dataclasses.replace(sim, plan=dataclasses.replace(sim.plan, eps_prime=sim.plan.eps + 100))
    r = check(over, samples=2)  # the same rounds against a bound C·L/(ε′ − ε) too small for them
    assert r.counterexample.kind == "rounds" and f"C = {ROUND_CONSTANT}" in r.reason


def test_a_wrong_head_semantics_is_refused():
    """The check compares with Alg. 1 in the semantics it is asked for: a protocol whose tokens round
    the head outputs to a nearest-even grid, checked as exact, differs where ⌊num/den⌋ and the
    rounded value's floor differ."""
    T = planted_transformer(32, layers=1, heads=1, tables=4, seed=2)
    sim = compile_anna(T, 1.0, 0.5, fmt=FixedPoint.binary(12, 2, rounding="nearest-even"))
    assert check(sim, samples=20).passed
    bad = check(dataclasses.replace(sim, fmt=None), samples=20)
    assert not bad.passed and bad.counterexample.kind == "output"


# ------------------------------------------------------------------------------------------------
# bad parameters
# ------------------------------------------------------------------------------------------------


def test_bad_parameters_name_the_parameter():
    T = planted_transformer(16, seed=0)
    with pytest.raises(ANNAMPCError, match=r"eps_prime: must be a number in \("):
        compile_anna(T, 0.1)  # below ε = log_N W
    with pytest.raises(ANNAMPCError, match=r"eps: must be a number"):
        compile_anna(T, 0.9, eps="x")
    with pytest.raises(ANNAMPCError, match=r"memory: s = 10 words"):
        compile_anna(T, 1.5, memory=10)
    with pytest.raises(ANNAMPCError, match=r"memory: must be an integer >= 1"):
        compile_anna(T, 1.5, memory=0)
    with pytest.raises(ANNAMPCError, match="T: must be an ANNATransformer"):
        compile_anna(object(), 0.5)
    with pytest.raises(ANNAProgramError, match="tables must be an integer >= 1"):
        planted_transformer(16, tables=0)
    with pytest.raises(ANNAProgramError, match="family must be one of"):
        planted_transformer(16, family="nope")


def test_values_beyond_the_declared_bits_are_refused():
    T = planted_transformer(16, value_bits=4, seed=0)
    T = dataclasses.replace(T, value_bits=2)  # the maps produce values up to 2^3
    with pytest.raises(ANNAProgramError, match="value_bits"):
        run(T, np.ones((1, 16), dtype=np.int64))


# ------------------------------------------------------------------------------------------------
# the goal's agreement run (slow; benchmarks/bench_anna_mpc.py --case agreement runs >= 10,000 inputs)
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_agreement_across_n_2_4_to_2_12():
    total = 0
    for e, (count, ep) in zip(range(4, 13), [(400, 1.2), (300, 1.0), (200, 0.9), (120, 0.8), (80, 0.8),
                                             (40, 0.75), (20, 0.75), (8, 0.75), (4, 0.75)]):
        n = 1 << e
        T = planted_transformer(n, layers=2, heads=2, tables=4, seed=e)
        r = check(compile_anna(T, ep, 0.3), samples=count, seed=e)
        assert r.passed, (n, r.reason)
        total += r.inputs
    assert total >= 1000
