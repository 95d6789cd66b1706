"""The Thm 4.1 compiler and the EMA-program executor: the simulation invariant on every input, mutants
the invariant must catch, fixed-point semantics, and the resource report."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from exactformer.constructions.mpc.program import HeadOut
from exactformer.constructions.mpc.compile import compile_protocol, resources
from exactformer.constructions.mpc.library import k_hop, prefix_sums, sort
from exactformer.precision import FixedPoint
from exactformer.verify.mpc import program_run as ema_program, protocol_run as mpc
from exactformer.constructions.mpc.applications import APPLICATIONS, k_hop_truth, restricted_growth_strings
from exactformer.verify.mpc.check import CheckError, build, check_batches, differential


# ------------------------------------------------------------------------------------------------
# the invariant on every input
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("branching", [2, 3])
@pytest.mark.slow
def test_invariant_on_every_equality_pattern(branching):
    """Every restricted growth string of length 8 (all strings over every alphabet, up to renaming):
    L1, L2 ideal and L2 in the coarsest exact format agree after every round, and with the truth."""
    n = 8
    x = np.concatenate(list(restricted_growth_strings(n)))
    for k in (1, 2, 3, 5, 9):
        p = k_hop(n, k, n, branching)
        prog = compile_protocol(p)
        cex = differential(p, prog, x, k_hop_truth(x, k), (None, prog.min_format()))
        assert cex is None, cex.describe()


@pytest.mark.slow
def test_induction_heads_on_all_bell_10_patterns():
    """Bell(10) = 115,975 equality patterns: every string of length 10 over every alphabet, through
    the five levels (protocol, ideal and fixed-point program, the weights, truth)."""
    rep = build("induction-heads", 10).verify("exhaustive")
    assert rep.passed and rep.inputs == 115975, rep.reason
    assert rep.levels[:3] == ["mpc", "ideal", "binary:int=4,frac=2"] and rep.levels[-1] == "truth"
    assert len(rep.levels) == 5 and rep.levels[3].startswith("softmax binary:"), rep.levels


def test_invariant_for_push_protocols():
    rng = np.random.default_rng(0)
    for p, x, truth in (
        (prefix_sums(37, 6, 3), rng.integers(0, 64, size=(20, 37)), None),
        (sort(50, 5), rng.integers(0, 32, size=(20, 50)), None),
        (sort(1, 3), rng.integers(0, 8, size=(5, 1)), None),
    ):
        prog = compile_protocol(p)
        truth = mpc.run(p, x).outputs
        for fmt in (None, prog.min_format()):
            assert differential(p, prog, x, truth, (fmt,)) is None


def test_fast_paths_equal_the_kernel():
    """Positional-key heads (gather) and positional-query heads (scatter) give the kernel's result."""
    rng = np.random.default_rng(1)
    for p in (k_hop(40, 6, 5, 2), prefix_sums(40, 6, 4), sort(40, 4)):
        prog = compile_protocol(p)
        x = rng.integers(0, 4, size=(6, 40))
        paths = set()
        for fmt in (None, prog.min_format(), FixedPoint.binary(12, 9)):
            for a, b in zip(ema_program.trace(prog, x, fmt), ema_program.trace(prog, x, fmt, generic=True)):
                assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)
                assert [h.max_count for h in a.heads] == [h.max_count for h in b.heads]
                assert [h.lost for h in a.heads] == [h.lost for h in b.heads]
                paths |= {h.path for h in a.heads}
                assert {h.path for h in b.heads} <= {"kernel"}
        assert paths & {"gather", "scatter"}


def test_head_out_decodes_exactly_in_both_semantics():
    num = np.array([[[3, 21, 0, 0]]])  # ideal: 3 senders' pairs summed? no: one pair (1, 7) seen by c = 3
    out = HeadOut(num, np.array([[3]]))
    assert out.pairs().tolist() == [[[7, -1]]] and out.word(1).tolist() == [[7]]
    S, w = 16, 16 // 3  # fixed point: ŵ = ⌊16/3⌋ = 5 raw; ŵ·7 = 35 exactly
    out = HeadOut(np.array([[[w, w * 7, 0, 0]]]), S)
    assert out.pairs().tolist() == [[[7, -1]]] and out.present().tolist() == [[True]]
    out = HeadOut(np.array([[[0, 0]]]), S)  # S < c: the weight 0 reads as no match
    assert out.word(1).tolist() == [[-1]] and not out.present().any()


# ------------------------------------------------------------------------------------------------
# mutants the invariant catches
# ------------------------------------------------------------------------------------------------


def mutate_key(program, layer: int, head: int, by: int = 1):
    """A copy of ``program`` whose head ``head`` of layer ``layer`` (0-based) adds ``by`` to the last
    word of every present key."""
    lay = program.layers[layer]
    h = lay.heads[head]

    def key(state, f=h.key):
        k = f(state).copy()
        k[..., -1] = np.where(k[..., -1] >= 0, k[..., -1] + by, -1)
        return k

    heads = lay.heads[:head] + (dataclasses.replace(h, key=key),) + lay.heads[head + 1:]
    layers = program.layers[:layer] + (dataclasses.replace(lay, heads=heads),) + program.layers[layer + 1:]
    return dataclasses.replace(program, layers=layers)


def first_state_difference(protocol, program, x, fmt=None):
    """(round, input, machine) of the first L1/L2 difference, computed here independently."""
    for a, b in zip(mpc.trace(protocol, x), ema_program.trace(program, x, fmt)):
        diff = np.zeros(x.shape, dtype=bool)
        for k in a.memory:
            d = a.memory[k] != b.state[k]
            diff |= d.any(axis=-1) if d.ndim == 3 else d
        if diff.any():
            bb, i = np.argwhere(diff)[0]
            return a.round, int(bb), int(i)
    return None


@pytest.mark.parametrize("layer, head, field", [(1, 0, "left1"), (1, 3, "left4"), (0, 0, "right2"), (3, 0, "ptr")])
def test_key_off_by_one_is_caught_at_its_round(layer, head, field):
    n = 16
    model = build("k-hop", n, hops=3, alphabet=4)
    p = model.protocol
    bad = mutate_key(model.program, layer, head)
    x = np.concatenate([np.zeros((1, n), dtype=np.int64), (np.arange(n) % 3)[None, :],
                        np.random.default_rng(2).integers(0, 4, size=(30, n))])
    cex = differential(p, bad, x, k_hop_truth(x, 3), (None,))
    assert cex is not None and cex.kind == "invariant" and cex.level == "ideal"
    assert cex.round == layer + 1 and cex.round_name == p.rounds[layer].name and cex.field == field
    assert (cex.round, cex.index, cex.machine) == first_state_difference(p, bad, x)
    assert cex.expected != cex.got and f"round {layer + 1}" in cex.describe()
    assert differential(p, model.program, x, k_hop_truth(x, 3), (None,)) is None  # the original passes


def test_a_dropped_field_is_caught():
    model = build("induction-heads", 6)
    lay = model.program.layers[0]

    def post(state, outs, f=lay.post):
        return {k: v for k, v in f(state, outs).items() if k != "w"}

    bad = dataclasses.replace(model.program, layers=(dataclasses.replace(lay, post=post),) + model.program.layers[1:])
    cex = differential(model.protocol, bad, np.zeros((1, 6), dtype=np.int64), None)
    assert (cex.kind, cex.round, cex.field, cex.expected, cex.got) == ("invariant", 1, "w", "(shape [1, 6])", "(field missing)")


def test_fixed_point_below_the_match_count_is_caught():
    model = build("k-hop", 16, hops=2, alphabet=4)
    fmt = model.fmt
    assert fmt.name == "binary:int=5,frac=2"  # c_max = 4 (the level-2 blocks of the right search)
    coarse = FixedPoint.binary(5, 1)  # S = 2 < 4
    rep = model.verify("adversarial", formats=[None, coarse])
    c = rep.counterexample
    assert not rep.passed and c.kind == "invariant" and c.level == coarse.name
    assert (c.round, c.round_name, c.field) == (1, "next", "right2") and c.expected != c.got
    assert rep.lost_matches[coarse.name] > 0
    ok = model.verify("adversarial", formats=[None, fmt])
    assert ok.passed and ok.lost_matches[fmt.name] == 0 and ok.max_matches == 4
    # Match2 at the paper's N = 32: c = 32 on the all-zero input needs S >= 32
    m2 = build("match2", 32, modulus=37)
    assert m2.fmt.name == "binary:int=6,frac=5"
    rep = m2.verify("adversarial", formats=[FixedPoint.binary(6, 4)])
    assert not rep.passed and rep.counterexample.source == "all-zero" and rep.counterexample.field == "match"


def test_only_fixed_point_formats_are_semantics():
    from exactformer.precision import Float64
    from exactformer.verify.attention.ema import EMAError

    model = build("match2", 4, modulus=5)
    with pytest.raises(EMAError, match="FixedPoint"):
        ema_program.run(model.program, np.zeros((1, 4), dtype=np.int64), Float64)


def test_format_without_room_for_the_words_is_reported():
    model = build("k-hop", 8, hops=2, alphabet=16)  # p = 4: tokens up to 15 need 4 integer bits
    rep = model.verify("adversarial", formats=[FixedPoint.binary(3, 3)])
    assert not rep.passed and rep.counterexample.kind == "error" and "not representable" in rep.reason
    assert rep.counterexample.source == "max-token"


def test_protocol_errors_surface_as_counterexamples():
    model = build("k-hop", 8, hops=2, alphabet=8)
    small = dataclasses.replace(model.protocol, memory=3)  # "prev" publishes 3L = 9 words
    rep = check_batches(dataclasses.replace(model.compiled, protocol=small), [("sample", np.zeros((2, 8), np.int64))],
                        [None], "sample", 0)
    assert not rep.passed and rep.counterexample.kind == "error" and rep.counterexample.level == "mpc"
    assert "s = 3 words sent per machine" in rep.reason


# ------------------------------------------------------------------------------------------------
# models: answers, state, resources
# ------------------------------------------------------------------------------------------------


def test_model_answers_the_paper_example():
    w = [0, 0, 1, 2, 1, 0, 1, 2, 0]  # aabcbabca
    ih = build("induction-heads", 9, alphabet=3)
    assert ih(w) == [None, 0, None, None, 2, 1, 0, 1, 1]  # position 9: b
    two = build("k-hop", 9, hops=2, alphabet=3)
    for how in (None, "default", two.fmt, two.fmt.name):
        assert two(w, fmt=how)[8] == 0  # a
    assert two(w) == two.mpc(w) == two.truth(w) == [None, 0, None, None, None, None, 1, 2, 0]
    with pytest.raises(CheckError, match="tokens must lie in"):
        two([0, 0, 1, 2, 1, 0, 1, 2, 3])
    with pytest.raises(CheckError, match="shape"):
        two([0, 1])


def test_batches_repeat_and_a_fresh_process_agrees():
    model = build("k-hop", 24, hops=5, alphabet=3, branching=3)
    x = np.random.default_rng(3).integers(0, 3, size=(7, 24))
    full = model(x)
    assert model(x) == full
    for size in (1, 2, 7):
        assert sum((model(x[i:i + size]) for i in range(0, 7, size)), []) == full
    code = ("import numpy as np; from exactformer.verify.mpc.check import build; "
            "m = build('k-hop', 24, hops=5, alphabet=3, branching=3); "
            "print(m(np.random.default_rng(3).integers(0, 3, size=(7, 24))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(full)


def test_tokens_enter_only_through_equality():
    """Renaming the tokens renames the answers (what makes the RGS enumeration exhaustive)."""
    model = build("k-hop", 20, hops=3, alphabet=50)
    rng = np.random.default_rng(4)
    x = rng.integers(0, 5, size=(10, 20))
    perm = rng.permutation(50)
    got = np.array([[-1 if a is None else a for a in row] for row in model(perm[x])])
    want = np.array([[-1 if a is None else perm[a] for a in row] for row in model(x)])
    assert np.array_equal(got, want)


def test_match2_paper_setting():
    """P2 Thm 5.2 at the N = 32, M = 37 of P2 §5.3: one layer, one head, width 1."""
    m = build("match2", 32, modulus=37)
    r = m.resources
    assert (r.layers, r.max_heads, r.key_words, r.value_words, r.m) == (1, 1, 1, 1, 1)
    rep = m.verify("sample", samples=300, seed=7)
    assert rep.passed and rep.inputs > 300 and rep.seed == 7 and rep.levels == ["mpc", "ideal", m.fmt.name, f"softmax {m.fmt.name}", "truth"]
    assert m([0] * 31 + [5]) == [1] * 31 + [0]


def test_resource_report():
    r = resources(k_hop(1 << 16, 1024, 1 << 16))
    rows = dict((q, b) for q, b, _ in r.rows())
    assert r.layers == r.rounds == 14 and r.max_heads == 16 and r.word_bits == 17
    assert r.min_format == "binary:int=17,frac=14" and r.max_matches == 1 << 14
    assert "16" in rows["heads per layer H"] and not r.is_mpc
    assert 0 < r.eps < r.eps_prime_needed
    p = resources(prefix_sums(1 << 10, 16, 4))
    assert p.is_mpc and p.layers == 10 and p.heads == (1,) * 5 + (3,) * 5 and p.value_words == 8
    s = resources(sort(1024, 10))
    assert s.is_mpc and s.heads == (1, 8, 8, 2, 128) and s.memory == 130


def test_verify_reports():
    m = build("induction-heads", 6)
    rep = m.verify("exhaustive")
    assert rep.passed and rep.inputs == 203 and rep.sources == {"exhaustive": 203} and rep.seed is None
    assert rep.to_json()["reason"] == "every input correct"
    a, b = m.verify("sample", samples=40, seed=3), m.verify("sample", samples=40, seed=3)
    assert a.passed and a.inputs == b.inputs and a.sources == b.sources and a.sources["sample"] == 40
    with pytest.raises(CheckError, match="mode must be one of"):
        m.verify("certify")
    with pytest.raises(CheckError, match="samples must be"):
        m.verify("sample", samples=-1)
    with pytest.raises(CheckError, match="exceed the limit"):
        build("k-hop", 16, hops=2).verify("exhaustive")
    with pytest.raises(CheckError, match="application must be one of"):
        build("k_hop", 8)
    with pytest.raises(CheckError, match=r"unknown parameter\(s\) \['k'\]; allowed: \['hops', 'alphabet', 'branching'\]"):
        build("k-hop", 8, k=2)
    with pytest.raises(CheckError, match="hops = 1"):
        build("induction-heads", 8, hops=2)
    assert sorted(APPLICATIONS) == ["induction-heads", "k-hop", "match2", "prefix-sums", "sort"]
