"""Lower bounds of P1/P2 (verify/bounds/lower_bounds.py) against values computed by hand from the papers'
statements, at two N each (and the spec's Part C sample table, re-derived by hand)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from exactformer.verify.bounds import lower_bounds as lb

# (function, args, expected, how it was computed by hand)
HAND = [
    (lb.log2_ceil, (1,), 0, "log2 1 = 0"),
    (lb.log2_ceil, (1024,), 10, "2^10"),
    (lb.log2_ceil, (1025,), 11, "just above 2^10"),
    (lb.paper_precision_bits, (16,), 10, "2*16^2 + 1 = 513 values -> 10 bits = 2*4 + 2"),
    (lb.paper_precision_bits, (1 << 20,), 42, "2*2^40 + 1 values -> 42 bits"),
    (lb.paper_precision_bits, (16, 2), 18, "2*16^4 + 1 = 131073 values -> 18 bits"),
    (lb.paper_precision_bits, (3,), 5, "2*9 + 1 = 19 values -> 5 bits"),
    # Thm 3: m >= N/p
    (lb.rnn_index_lookup, (1 << 10, 10), 103, "1024/10 = 102.4"),
    (lb.rnn_index_lookup, (1 << 20, 42), 24967, "1048576/42 = 24966.10 (spec Part C: 24,967)"),
    (lb.rnn_index_lookup, (8192, 64), 128, "Sec. 6: m = 128, p = 64 suffices up to N = 8192"),
    (lb.rnn_index_lookup, (8193, 64), 129, "... and bites beyond"),
    # Prop. 9: m >= N/p, N pairs
    (lb.rnn_associative_recall, (1 << 12, 26), 158, "4096/26 = 157.54 (spec: 158)"),
    (lb.rnn_associative_recall, (1 << 16, 64), 1024, "65536/64"),
    # Thm 11: mp >= N/2
    (lb.rnn_inequality, (1 << 12, 26), 79, "2048/26 = 78.77 (spec: 79)"),
    (lb.rnn_inequality, (1 << 20, 64), 8192, "524288/64"),
    # Sec. 4.2, RNN: mp >= N/2
    (lb.rnn_disjointness, (1 << 16, 34), 964, "32768/34 = 963.76 (spec: 964)"),
    (lb.rnn_disjointness, (1 << 24, 64), 131072, "2^23/64"),
    # Thm 8: m >= N/2p
    (lb.rnn_nearest_neighbor, (1 << 30, 62), 8659209, "2^29/62 = 8659208.26 (spec: 8,659,209)"),
    (lb.rnn_nearest_neighbor, (1 << 8, 18), 8, "128/18 = 7.11"),
    # the last query only (Prop. 9 / INDEX): nearest neighbour min(N - 1, 2^15)/p, MQAR (N/2)/p
    (lb.rnn_nearest_neighbor_last, (1 << 8, 18), 15, "255/18 = 14.17"),
    (lb.rnn_nearest_neighbor_last, (1 << 20, 16), 2048, "min(2^20 - 1, 2^15)/16 = 2048"),
    (lb.rnn_nearest_neighbor_last, (1 << 15, 16), 2048, "32767/16 = 2047.94"),
    (lambda n, p: lb.rnn_nearest_neighbor_last(n, p, separated=1 << 30), (1 << 20, 16), 65536, "(2^20 - 1)/16"),
    (lb.rnn_mqar_last, (1 << 8, 18), 8, "128/18 = 7.11"),
    (lb.rnn_mqar_last, (1 << 20, 17), 30841, "524288/17 = 30840.47"),
    # k-hop induction heads (the project's INDEX reduction): min(floor((N - 2k + 1)/2), |Sigma| - k - 1)/p
    (lb.rnn_k_hop_index, (1025, 10, 1000), 52, "min(512, 998) pairs / 10 = 51.2"),
    (lb.rnn_k_hop_index, (1 << 20, 42, (1 << 19) + 1), 12484, "min(524287, 524287)/42 = 12483.02"),
    (lb.rnn_k_hop_index, (1 << 20, 42, 64), 2, "|Sigma| = 64 caps r at 62: 62/42 = 1.48"),
    (lb.rnn_k_hop_index, (1 << 12, 20, 64, 16), 3, "k = 16: min(2032, 47)/20 = 2.35"),
    (lb.rnn_k_hop_index, (33, 20, 64, 16), 1, "N = 2k + 1: r = 1"),
    (lb.k_hop_state_bits, (64,), 455, "(64 + 1) * 7"),
    (lb.k_hop_state_bits, (64, 16), 7175, "(16 * 64 + 1) * 7"),
    # Thm 4 as stated and itemised
    (lb.thm4_protocol_bits, (1, 42, 1, 1 << 20), 186, "3*1*(42 + 20)*1"),
    (lb.thm4_protocol_bits, (8, 10, 2, 1 << 10), 960, "3*8*(10 + 10)*2"),
    (lb.thm4_protocol_bits_itemised, (1, 1, 42, 1, 1 << 20), 418, "42 + (168 + 168 + 40)"),
    (lb.thm4_protocol_bits_itemised, (8, 16, 10, 2, 1 << 10), 920, "160 + 2*(320 + 40 + 20)"),
    # Thm 5 / 10: mH >= (N-1)/(3(p + log N))
    (lb.one_layer_dyck22, (1 << 20, 42), 5638, "1048575/186 = 5637.5 (spec: 5,638)"),
    (lb.one_layer_dyck22, (1 << 20, 64), 4162, "1048575/252 = 4161.01 (spec: 4,162)"),
    (lb.one_layer_dyck22, (1 << 12, 26), 36, "4095/114 = 35.92 (spec: 36)"),
    (lambda n, p: lb.one_layer_dyck22(n, p, itemised=True), (1 << 20, 42), 2509, "1048575/(378 + 40) = 2508.55"),
    (lambda n, p: lb.one_layer_dyck22(n, p, itemised=True), (1 << 12, 26), 16, "4095/(234 + 24) = 15.87"),
    # Thm 12 explicit: mH >= N/(6(p + log N))
    (lb.one_layer_equality, (1 << 20, 42), 2819, "524288/186 = 2818.75 (spec: 2,819)"),
    (lb.one_layer_equality, (1 << 16, 64), 137, "32768/240 = 136.53 (spec: 137)"),
    (lambda n, p: lb.one_layer_equality(n, p, itemised=True), (1 << 20, 42), 1255, "524288/418 = 1254.28"),
    (lambda n, p: lb.one_layer_equality(n, p, itemised=True), (1 << 16, 64), 54, "32768/608 = 53.89"),
    # Sec. 4.2 DISJ, one layer
    (lb.one_layer_disjointness, (1 << 24, 50), 37787, "2^23/222 = 37786.52 (spec: 37,787)"),
    (lb.one_layer_disjointness, (1 << 8, 18), 2, "128/78 = 1.64 (spec: 2)"),
    (lambda n, p: lb.one_layer_disjointness(n, p, itemised=True), (1 << 8, 18), 1, "128/(162 + 16) = 0.72"),
    (lambda n, p: lb.one_layer_disjointness(n, p, itemised=True), (1 << 24, 50), 16845, "2^23/(450 + 48) = 16844.59"),
    # conversions and alternatives
    (lb.one_layer_size_bits, (2819, 42), 473592, "4 * 2819 * 42"),
    (lb.rnn_units, (0, 7), 0, "no bits, no units"),
    (lb.tracr_index_lookup_width, (128,), 393, "reported: 393 at N = 128"),
    (lb.tracr_index_lookup_width, (1 << 20,), 3145737, "3 * 2^20 + 9"),
    (lb.dyck22_rnn_state_bits, (), 3, "ceil(log2 7)"),
]


@pytest.mark.parametrize("fn,args,expected,how", HAND, ids=[h[3] for h in HAND])
def test_hand_computed(fn, args, expected, how):
    assert fn(*args) == expected, how


def test_thm4_itemised_count_exceeds_the_stated_one():
    """Spec D.1.10, re-derived: with d = m and H = 1 the itemised count exceeds 3m(p + log N)H
    whenever p > 1.5 log2 N; for every H once p > 3 log2 N."""
    for e, m, h in itertools.product((4, 10, 20, 30), (1, 2, 16, 256), (1, 2, 8)):
        n, L = 1 << e, e
        for p in (3 * L // 2 + 1, 3 * L + 1, 64):
            stated = lb.thm4_protocol_bits(m, p, h, n)
            itemised = lb.thm4_protocol_bits_itemised(m, m, p, h, n)
            if h == 1 or p > 3 * L:
                assert itemised > stated, (e, m, h, p)


def test_itemised_bounds_are_weaker_and_stated_ones_tighter():
    for e in range(4, 31, 2):
        n = 1 << e
        for p in (lb.paper_precision_bits(n), 64):
            assert lb.one_layer_equality(n, p, itemised=True) <= lb.one_layer_equality(n, p)
            assert lb.one_layer_dyck22(n, p, itemised=True) <= lb.one_layer_dyck22(n, p)


def test_monotone_in_n_and_p():
    for fn in (lb.rnn_index_lookup, lb.rnn_inequality, lb.one_layer_equality, lb.one_layer_dyck22):
        vals = [fn(1 << e, 32) for e in range(4, 31)]
        assert vals == sorted(vals) and vals[-1] > vals[0]
        by_p = [fn(1 << 20, p) for p in (8, 16, 32, 64)]
        assert by_p == sorted(by_p, reverse=True)


@pytest.mark.parametrize("call", [
    lambda: lb.rnn_inequality(15, 8),  # halves of an odd N
    lambda: lb.one_layer_dyck22(9, 8),
    lambda: lb.rnn_index_lookup(1, 8),  # N < 2
    lambda: lb.rnn_index_lookup(16, 0),  # p < 1
    lambda: lb.rnn_index_lookup(16.0, 8),
    lambda: lb.paper_precision_bits(16, 0),
    lambda: lb.rnn_units(-1, 8),
    lambda: lb.rnn_mqar_last(15, 8),
    lambda: lb.rnn_nearest_neighbor_last(16, 8, separated=0),
    lambda: lb.rnn_k_hop_index(32, 8, 64, 16),  # N < 2k + 1: no instance of the reduction
    lambda: lb.rnn_k_hop_index(64, 8, 2),  # |Sigma| < k + 2
    lambda: lb.BOUNDS["rnn-k-hop-index"].arguments({"k": 2}),  # the alphabet is a required parameter
])
def test_bad_arguments(call):
    with pytest.raises(lb.BoundError):
        call()


def test_registry_is_consistent():
    for fam in lb.FAMILIES.values():
        for k in fam.bounds:
            assert k in lb.BOUNDS, (fam.key, k)
    for b in lb.BOUNDS.values():
        assert b.kind in ("lower", "upper", "alternative")
        assert re.search(r"\b(Sec|App|Thm|Prop|Lemma|Fact|Def)\.? ?[A-Z0-9]", b.source) or b.key.startswith("tracr"), b.key
        assert b.formula and b.precision and b.statement
        params = {name: 64 if v is lb.REQUIRED else v for name, v in b.params}
        if b.explicit:
            units, bits = lb.evaluate(b, 1 << 10, 22, params)
            assert isinstance(units, int) and units >= 1
            assert bits is None or bits >= units
        else:
            assert lb.evaluate(b, 1 << 10, 22, params) == (None, None)
    assert lb.evaluate(lb.BOUNDS["rnn-equality"], 15, 8) == (None, None)  # outside the domain: no value


def test_bits_follow_units():
    n, p = 1 << 16, 34
    assert lb.evaluate(lb.BOUNDS["rnn-index-lookup"], n, p) == (1928, 1928 * 34)  # spec: 1,928
    assert lb.evaluate(lb.BOUNDS["one-layer-equality"], n, p) == (219, 4 * 219 * 34)  # spec: 219


def test_every_registration_declares_its_claim_and_its_size_rows():
    """One registration carries the paper's claim and the size rows (or the reason there are none);
    a registration without them is refused."""
    from exactformer.constructions.core import registry
    from exactformer.constructions.core.registry import Claim, RegistryError, construction

    for name in registry.names():
        c = registry.get(name)
        assert isinstance(c.claim, Claim) and c.claim.source, name
        assert bool(c.sizes) != (c.no_sizes is not None), name
    with pytest.raises(RegistryError, match="claim must be a Claim"):
        construction("x", task=object(), theorem="Thm 0", claim="O(1)", sizes=())
    with pytest.raises(RegistryError, match="sizes must be SizeRows"):
        construction("x", task=object(), theorem="Thm 0", claim=Claim("s", "1", "1", "1", "1", "1"), sizes=())


# ------------------------------------------------------------------------------------------------
# the last-query reductions: the instances the bounds use are valid inputs of the built tasks
# ------------------------------------------------------------------------------------------------


def _even_weight(rng, count: int, d: int = 16) -> np.ndarray:
    """``count`` distinct sign vectors of even weight in {-1, +1}^d (as 0/1 bits, then signs)."""
    words = rng.choice(1 << (d - 1), size=count, replace=False)
    bits = (words[:, None] >> np.arange(d - 1)) & 1
    bits = np.concatenate([bits, bits.sum(axis=1, keepdims=True) % 2], axis=1)
    return 1 - 2 * bits


def test_nearest_neighbor_last_query_reduces_index():
    """lb.rnn_nearest_neighbor_last's reduction on the built spec (defaults: d' = 16, margin 1/4):
    Alice's bits as the labels of distinct even-weight sign vectors (+-1/4)^16, the zero vector
    with any label at the remaining pairs; for every index i the query x_N = v_i is a valid input
    (the task's precondition holds) whose answer is a_i. And the even-weight code's margin is what
    NN_SEPARATED_INPUTS claims."""
    from exactformer.constructions.core import registry

    n = 8
    model = registry.get("nearest-neighbor").builder(n)
    task = registry.task_of(model)
    assert (model.task_params["d_in"], model.task_params["margin"]) == (16, "1/4")
    assert list(model.answer_positions_for(2 * n - 1)) == [2 * n - 2]  # the last query only
    S, rng = task.scale(model), np.random.default_rng(0)
    for r in (n - 1, 4):  # every pair separated, and zero padding
        signs = _even_weight(rng, r)
        assert np.all(signs @ signs.T - 16 * np.eye(r, dtype=np.int64) <= 12)  # <v_i, v_j> <= 3/4
        a = rng.integers(0, 2, (n - 1,))
        X = np.zeros((r, n, 16), dtype=np.int64)
        X[:, :r] = signs * S // 4
        X[:, n - 1] = X[np.arange(r), np.arange(r)]  # Bob's query for index i: v_i
        truths = task.truth(model, X, np.broadcast_to(a, (r, n - 1)))
        assert truths[:, 0].tolist() == a[:r].tolist()


def test_mqar_last_query_reduces_index():
    """lb.rnn_mqar_last's reduction on the built spec: the first half holds Alice's bits as labels;
    Bob's second half is a permutation ending with the symbol of index i, with arbitrary labels;
    the answer at the last query is a_i for every i."""
    from exactformer.constructions.core import registry

    n = 8
    model = registry.get("mqar").builder(n)
    task = registry.task_of(model)
    assert list(model.answer_positions_for(2 * n - 1)) == [2 * n - 2]
    rng = np.random.default_rng(1)
    first = rng.permutation(n)[: n // 2]
    a = rng.integers(0, 2, n // 2)
    for i in range(n // 2):
        second = np.r_[np.delete(first, i)[rng.permutation(n // 2 - 1)], first[i]]
        labels = np.r_[a, rng.integers(0, 2, n // 2 - 1)]
        assert task.truth(model, np.r_[first, second][None], labels[None])[0, 0] == a[i]


# ------------------------------------------------------------------------------------------------
# k-hop induction heads: the project's INDEX reduction and the constant-state recurrent model
# ------------------------------------------------------------------------------------------------


def _k_hop_instance(bits: np.ndarray, q: int, n: int, k: int) -> np.ndarray:
    """The reduction of lb.k_hop_index_bits: labels 0 and 1, symbols x_j = 2 + j, z_i = 2 + r + i;
    Alice: label 0 as padding, then x_1 b_1 .. x_r b_r (N - 2k + 1 tokens); Bob: z_1 x_q z_2 z_1 ..
    z_{k-1} z_{k-2} z_{k-1} (2k - 1 tokens)."""
    r = len(bits)
    x, z = [2 + j for j in range(r)], [2 + r + i for i in range(k - 1)]
    alice = [0] * (n - 2 * k + 1 - 2 * r) + [t for j in range(r) for t in (x[j], int(bits[j]))]
    bob = [x[q]] if k == 1 else [z[0], x[q]] + [t for i in range(1, k - 1) for t in (z[i], z[i - 1])] + [z[k - 2]]
    assert len(alice) == n - 2 * k + 1 and len(bob) == 2 * k - 1
    return np.array(alice + bob)


@pytest.mark.parametrize("n,k,alphabet", [(9, 1, 6), (12, 1, 64), (16, 2, 8), (21, 3, 64), (30, 5, 9), (11, 5, 7),
                                          (40, 16, 64), (33, 16, 18)])
def test_k_hop_reduction_answers_alices_bit(n, k, alphabet):
    """The instances behind lb.rnn_k_hop_index are inputs of the task whose answer at the last
    position is Alice's bit b_q, for every q: the task's own ground truth (k_hop_truth) says so."""
    from exactformer.constructions.mpc.applications import k_hop_truth

    r = lb.k_hop_index_bits(n, k, alphabet)
    assert r == min((n - 2 * k + 1) // 2, alphabet - k - 1) >= 1
    rng = np.random.default_rng(n * k)
    for bits in (rng.integers(0, 2, r), 1 - rng.integers(0, 2, r)):
        w = np.stack([_k_hop_instance(bits, q, n, k) for q in range(r)])
        assert w.max() < alphabet  # r + k + 1 symbols
        assert k_hop_truth(w, k)[:, -1].tolist() == bits.tolist()


def _k_hop_by_state(w: np.ndarray, k: int, alphabet: int) -> tuple[list[int], int]:
    """lb.k_hop_state_bits's recurrent model: the previous symbol and, per symbol c, the answers of
    hops 1 .. k from its latest occurrence (None: "no answer"); returns the answers (-1 for none)
    and the number of state entries it keeps."""
    lists: list[list[int | None]] = [[None] * k for _ in range(alphabet)]
    prev, out = None, []
    for c in map(int, w):
        chain = [c] * k if prev == c else lists[c]  # w_{p-1} = c: sigma(p) = p, every hop stays at p
        out.append(-1 if chain[k - 1] is None else chain[k - 1])
        if prev is not None:
            lists[prev] = [c] + chain[: k - 1]
        prev = c
    return out, alphabet * k + 1


@pytest.mark.parametrize("k,alphabet", [(1, 2), (1, 5), (2, 3), (3, 4), (16, 5)])
def test_k_hop_constant_state_computes_the_task(k, alphabet):
    """The recurrent model of lb.k_hop_state_bits answers like the ground truth at every position,
    for every N tried, with (k |Sigma| + 1) entries of ceil(log2(|Sigma| + 1)) bits: at a fixed
    alphabet no RNN lower bound can grow with N."""
    from exactformer.constructions.mpc.applications import k_hop_truth

    rng = np.random.default_rng(k + 10 * alphabet)
    for n in (1, 7, 40, 300):
        w = rng.integers(0, alphabet, (20, n))
        truth = k_hop_truth(w, k)
        for row, t in zip(w, truth):
            answers, entries = _k_hop_by_state(row, k, alphabet)
            assert answers == t.tolist()
    assert entries * lb.log2_ceil(alphabet + 1) == lb.k_hop_state_bits(alphabet, k)
