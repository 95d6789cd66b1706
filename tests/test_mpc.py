"""The MPC protocol format and executor (L1): semantics and every resource check (P2 Def. 2.3)."""

from __future__ import annotations

import numpy as np
import pytest

from exactformer.constructions.mpc.protocol import Protocol, ProtocolError, Publish, Round, Send, Step, Table
from exactformer.verify.mpc.protocol_run import InputError, MPCError, run, trace

N = 6


def one_round(step, *, sends=0, slots=0, tables=(), memory=4, word_bits=4, n=N, init=None) -> Protocol:
    """A one-round protocol around ``step``; the output is field "x"."""
    return Protocol("t", n, word_bits, memory, init or (lambda x: {"x": x}),
                    (Round("r1", step, sends=sends, slots=slots, tables=tables),), lambda mem: mem["x"])


def ids():
    return np.arange(N)[None, :]


def x0(B=1):
    return np.zeros((B, N), dtype=np.int64)


def expect(protocol, inputs, *, round=1, machine=None, input=0, limit):
    with pytest.raises(MPCError) as e:
        run(protocol, inputs)
    err = e.value
    assert err.round == round and err.machine == machine and err.limit == limit
    if machine is not None:
        assert err.input == input and f"machine {machine}" in str(err)
    assert f"round {round}" in str(err) and limit in str(err)
    return err


# ------------------------------------------------------------------------------------------------
# semantics
# ------------------------------------------------------------------------------------------------


def test_send_lands_in_slots_and_memory_persists_only_when_returned():
    def step(mem):  # machine i sends x_i + 1 to machine (i + 1) mod N, slot 1
        x = mem["x"]
        return Step({"x": x, "keep": x + 2}, send=Send(np.broadcast_to((ids() + 1) % N, x.shape),
                                                     np.ones_like(x), x + 1))

    p = Protocol("t", N, 4, 5, lambda x: {"x": x}, (Round("a", step, sends=1, slots=2),
                                                     Round("b", lambda mem: Step({"x": mem["inbox"][..., 1]}))),
                 lambda mem: mem["x"])
    x = np.array([[1, 2, 3, 4, 5, 6]])
    states = list(trace(p, x))
    assert [s.name for s in states] == ["init", "a", "b"]
    a = states[1].memory
    assert a["inbox"][0, :, 0].tolist() == [-1] * N  # slot 0 empty (⊥)
    assert a["inbox"][0, :, 1].tolist() == [7, 2, 3, 4, 5, 6]
    assert a["keep"][0].tolist() == [3, 4, 5, 6, 7, 8]
    assert set(states[2].memory) == {"x"}  # inbox and "keep" were not returned: gone
    assert run(p, x).outputs.tolist() == [[7, 2, 3, 4, 5, 6]]
    u = states[1].usage
    assert (u.sent, u.received, u.destinations, u.senders, u.memory) == (1, 1, 1, 1, 3)


def test_tables_unique_exists_positional():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, publish={"u": Publish(words=np.stack([x, 2 * x], -1), key=x),
                                       "e": Publish(key=x % 3, present=(x % 2 == 0)),
                                       "pos": Publish(words=x)},
                    lookup={"u": np.stack([x + 1, np.full_like(x, -1)], -1), "e": (x % 3)[..., None],
                            "pos": np.stack([(ids() + 1) % N + 0 * x, np.full_like(x, 7)], -1)})

    tables = (Table("u", "unique", "got_u", lookups=2, value_words=2),
              Table("e", "exists", "got_e"), Table("pos", "unique", "got_p", lookups=2, key_words=0, value_words=1))
    p = one_round(step, tables=tables, memory=12)
    x = np.array([[0, 1, 2, 4, 5, 7]])
    mem = list(trace(p, x))[-1].memory
    # unique: key x+1 found for x = 0, 1, 4 (keys 1, 2, 5 exist); second lookup asked nothing (⊥)
    assert mem["got_u"][0].tolist() == [[1, 2, -1, -1], [2, 4, -1, -1], [-1, -1, -1, -1], [5, 10, -1, -1],
                                        [-1, -1, -1, -1], [-1, -1, -1, -1]]
    # exists: publishers are the even x (residues 0, 2, 1): every residue class is present
    assert mem["got_e"][0, :, 0].tolist() == [1, 1, 1, 1, 1, 1]
    # positional: word of machine (i + 1) mod N; position 7 >= N has no publisher
    assert mem["got_p"][0].tolist() == [[1, -1], [2, -1], [4, -1], [5, -1], [7, -1], [0, -1]]


def test_exists_absent_query_is_bottom_and_missing_key_is_zero():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, publish={"e": Publish(key=x)},
                    lookup={"e": np.stack([x + 8 * (x > 4), np.where(ids() == 0, -1, x)], -1)})

    p = one_round(step, tables=(Table("e", "exists", "hit", lookups=2),), word_bits=4)
    mem = list(trace(p, np.array([[0, 1, 2, 3, 4, 5]])))[-1].memory
    assert mem["hit"][0].tolist() == [[1, -1], [1, 1], [1, 1], [1, 1], [1, 1], [0, 1]]


def test_batches_are_independent_and_runs_repeat():
    from exactformer.constructions.mpc.library import k_hop

    p = k_hop(12, 3, 4, 3)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(7, 12))
    full = run(p, x).outputs
    assert np.array_equal(run(p, x).outputs, full)
    for size in (1, 2, 7):
        parts = [run(p, x[i:i + size]).outputs for i in range(0, 7, size)]
        assert np.array_equal(np.concatenate(parts), full)
    assert np.array_equal(run(p, x[3]).outputs, full[3:4])  # a 1-D input is a batch of one


# ------------------------------------------------------------------------------------------------
# resource checks: each names the round, the machine (and input) and the limit
# ------------------------------------------------------------------------------------------------


def test_memory_overflow():
    def step(mem):
        x = mem["x"]
        extra = np.where(ids() == 3, 1, -1) + 0 * x  # only machine 3 stores 4 more words
        return Step({"x": x, "y": np.stack([extra] * 4, -1)})

    err = expect(one_round(step), x0(2), machine=3, limit="s = 4 words of memory")
    assert "holds words after the round: 5 > 4" in str(err)


def test_word_too_large():
    def step(mem):
        x = mem["x"]
        return Step({"x": np.where(ids() == 2, 16, x)})

    err = expect(one_round(step), x0(), machine=2, limit="words in [-1, 2^4)")
    assert "holds 16 >= 2^4" in str(err)


def test_negative_word_below_bottom():
    expect(one_round(lambda mem: Step({"x": mem["x"] - 2 * (ids() == 4)})), x0(), machine=4,
           limit="words in [-1, 2^4)")


def test_two_messages_into_one_slot():
    def step(mem):
        x = mem["x"]
        dest = np.where((ids() == 1) | (ids() == 4), 0, -1) + 0 * x
        return Step({"x": x}, send=Send(dest, 0 * x, x))

    err = expect(one_round(step, sends=1, slots=1), x0(), machine=0, limit="one message per inbox slot")
    assert "from machines 1 and 4" in str(err)


def test_too_many_destinations():
    def step(mem):
        x = mem["x"]
        five = ids() == 5
        dest = np.stack([np.where(five, 0, -1), np.where(five, 1, -1)], -1) + 0 * x[..., None]
        return Step({"x": x}, send=Send(dest, np.zeros_like(dest), np.zeros_like(dest)))

    err = expect(one_round(step, sends=1, slots=1), x0(3), machine=5, limit="declared destinations α = 1")
    assert "2 > 1" in str(err)


def test_sends_without_a_declared_inbox():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, send=Send(0 * x, 0 * x, x))

    expect(one_round(step), x0(), machine=0, limit="declared destinations α = 0")
    silent = Send(np.full((1, N), -1), np.zeros((1, N), np.int64), np.zeros((1, N), np.int64))
    run(one_round(lambda mem: Step(mem, send=silent)), x0())  # no message, no inbox needed


def test_too_many_words_sent_and_received():
    def step(mem):  # machine 0 sends 5 words (to 5 machines); s = 4
        x = mem["x"]
        m0 = (ids() == 0)[..., None]
        dest = np.where(m0, np.arange(1, 6), -1) + 0 * x[..., None]
        return Step({"x": x}, send=Send(dest, np.zeros_like(dest), np.ones_like(dest)))

    expect(one_round(step, sends=5, slots=1), x0(), machine=0, limit="s = 4 words sent per machine")

    def step2(mem):  # every machine sends one word to machine 2 (6 words received; s = 4)
        x = mem["x"]
        return Step({"x": x}, send=Send(2 + 0 * x, np.broadcast_to(ids(), x.shape), x))

    expect(one_round(step2, sends=1, slots=N), x0(), machine=2, limit="s = 4 words received per machine")


def test_destination_and_slot_ranges():
    def bad_dest(mem):
        x = mem["x"]
        return Step({"x": x}, send=Send(np.where(ids() == 1, N, -1) + 0 * x, 0 * x, x))

    expect(one_round(bad_dest, sends=1, slots=1), x0(), machine=1, limit=f"destinations in [0, {N})")

    def bad_slot(mem):
        x = mem["x"]
        return Step({"x": x}, send=Send(np.where(ids() == 2, 0, -1) + 0 * x, 3 + 0 * x, x))

    expect(one_round(bad_slot, sends=1, slots=2), x0(), machine=2, limit="inbox slots in [0, 2)")

    def bottom_word(mem):
        x = mem["x"]
        return Step({"x": x}, send=Send(np.where(ids() == 3, 0, -1) + 0 * x, 0 * x, x - 1))

    expect(one_round(bottom_word, sends=1, slots=1), x0(), machine=3, limit="message words in [0, 2^4)")


def test_unique_table_with_two_publishers_of_one_key():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, publish={"u": Publish(words=x, key=np.where(ids() >= 4, 9, ids()) + 0 * x)})

    err = expect(one_round(step, tables=(Table("u", "unique", "got", value_words=1),)), x0(),
                 machine=5, limit="one publisher per key of a unique table")
    assert "machines 4 and 5" in str(err)


def test_declared_match_bound():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, publish={"e": Publish(key=x)}, lookup={"e": x[..., None]})

    expect(one_round(step, tables=(Table("e", "exists", "hit", max_matches=5),)), x0(), machine=0,
           limit="max_matches = 5 of table 'e'")


def test_undeclared_table_and_wrong_shapes():
    def step(mem):
        x = mem["x"]
        return Step({"x": x}, lookup={"nope": x[..., None]})

    expect(one_round(step), x0(), limit="declared tables")

    def step2(mem):
        x = mem["x"]
        return Step({"x": x}, lookup={"e": np.stack([x, x], -1)})

    expect(one_round(step2, tables=(Table("e", "exists", "hit"),)), x0(), limit="λ = 1 lookups")
    expect(one_round(lambda mem: Step({"x": mem["x"][:, :3]})), x0(), limit="shapes")
    expect(one_round(lambda mem: Step({"x": mem["x"].astype(float)})), x0(), limit="int arrays")
    expect(one_round(lambda mem: Step({"inbox": mem["x"]}), sends=1, slots=1), x0(), limit="field names")
    expect(one_round(lambda mem: {"x": mem["x"]}), x0(), limit="Step")


def test_init_is_checked_as_round_zero():
    p = one_round(lambda mem: Step(mem), init=lambda x: {"x": x, "y": np.stack([x] * 4, -1)})
    expect(p, x0(), round=0, machine=0, limit="s = 4 words of memory")


def test_bad_inputs():
    p = one_round(lambda mem: Step(mem))
    with pytest.raises(InputError, match=r"inputs\[0, 2\] = 16"):
        run(p, np.array([[0, 0, 16, 0, 0, 0]]))
    with pytest.raises(InputError, match="shape"):
        run(p, np.zeros((2, N + 1), dtype=np.int64))
    with pytest.raises(InputError, match="integers"):
        run(p, np.zeros((1, N)))


@pytest.mark.parametrize("make, match", [
    (lambda: Round("r", lambda m: m, sends=1), "needs slots >= 1"),
    (lambda: Round("r", lambda m: m, tables=(Table("a", "exists", "o"), Table("a", "exists", "p"))), "distinct"),
    (lambda: Round("r", lambda m: m, slots=1, inbox="o", tables=(Table("a", "exists", "o"),)), "distinct"),
    (lambda: Round("@r", lambda m: m), "not starting with '@'"),
    (lambda: Table("a", "mean", "o"), "kind must be one of"),
    (lambda: Table("a", "unique", "o"), "value_words >= 1"),
    (lambda: Table("a", "exists", "o", value_words=2), "value_words = 0"),
    (lambda: Table("a", "unique", "o", value_words=1, max_matches=2), "max_matches = 1"),
    (lambda: Table("a", "exists", "o", lookups=0), "lookups must be an integer >= 1"),
    (lambda: Protocol("p", 4, 63, 2, None, (), None), "word_bits must be <= 62"),
    (lambda: Protocol("p", 0, 4, 2, None, (), None), "n must be an integer >= 1"),
    (lambda: Protocol("p", 4, 4, 2, None, (Round("a", lambda m: m), Round("a", lambda m: m)), None), "distinct"),
    (lambda: Protocol("p", 4, 4, 2, None, (Round("a", lambda m: m, tables=(Table("t", "exists", "o", max_matches=5),)),),
                      None), "max_matches 5 > n = 4"),
])
def test_malformed_declarations(make, match):
    with pytest.raises(ProtocolError, match=match):
        make()


def test_is_mpc_only_for_push_only_protocols():
    from exactformer.constructions.mpc.library import k_hop, prefix_sums, sort

    assert prefix_sums(8, 4).is_mpc and sort(20, 4).is_mpc
    assert not k_hop(8, 2, 3).is_mpc
    assert "MPC protocol" in repr(prefix_sums(8, 4)) and "EMA protocol" in repr(k_hop(8, 2, 3))
