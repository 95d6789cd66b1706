"""Recurrent models that meet P1's recurrent lower bounds up to a constant: the losing side of the
separations, built (P1 Thm 3, Thm 11, Thm 8; Sec. 2's RNN).

P1 proves that a recurrent model with m hidden units of p bits needs m >= N/p for Index Lookup
(Thm 3), mp >= N/2 for Equality (Thm 11) and m >= N/(2p) for nearest neighbour / MQAR with every
query answered (Thm 8). Each model here has exact integer weights, O(N) units of a constant number
of bits, and is verified by running it (exhaustively at small N, by seeded samples); no
certificate proves it for all inputs (its reachable hidden states grow as |Sigma|^N, so the
automaton product of :mod:`exactformer.verify.certify.recurrent` does not close).

* ``index-lookup-rnn`` (Thm 3's task): a shift register of N + 1 slots of ceil(log2 |Sigma|) bits
  (slot i holds the symbol read i steps ago); the index token p, read last, keeps only the slot
  that holds s_p (its two base-ceil(sqrt N) digits against each slot's, :func:`~exactformer.constructions.blocks.recurrent.two_digit_match`),
  and the readout decodes the bits: m = (N + 1) ceil(log2 |Sigma|) units.
* ``equality-rnn`` (Thm 11's task, EQ on {-1, 1}^N): a shift register of N/2 slots of one unit
  (0 empty, 1 for -1, 2 for +1); three units compare the slot read N/2 steps ago with the current
  symbol (mismatch = u1 + u2 - 2 u3) and a flag g, 1 at the start, stays 1 while nothing
  mismatched (g_t = relu(g_{t-1} - mismatch_{t-1})); EQ iff g - mismatch > 1 - g + mismatch:
  m = N/2 + 4.
* ``mqar-rnn`` (Thm 8's setting, P1 App. G.1: MQAR answering every query): per key k of the
  alphabet a one-step register (the key just read), a written-flag, and per label bit a write unit,
  a stored bit and a read unit; the write happens once, at the key's first occurrence:
  m = |Sigma| (2 + 3 ceil(log2 L)) units, with |Sigma| = N/2 by default.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from exactformer.constructions.blocks.recurrent import digit_base, digit_columns, integer_format, shift_register, two_digit_match
from exactformer.constructions.core.ir import Param
from exactformer.constructions.core.recurrent import RecurrentBuilder, RNNModel, shape_only
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.task import Batch
from exactformer.constructions.theorems.boolean_tasks import EqualityTask, ThresholdError
from exactformer.constructions.theorems.index_lookup import IndexLookupError, IndexLookupTask, MAX_ALPHABET, symbol_bits
from exactformer.constructions.theorems.mqar import MQARError, MQARTask
from exactformer.constructions.theorems.nearest_neighbor import QUERIES, answer_positions, check_int
from exactformer.precision import Format

MAX_N = 1 << 20
#: verified by running: no certificate (module docstring)
RUN_MODES = ("exhaustive", "sample")
#: the size tables build these rows at N <= 2^10 and compute larger ones shapes-only
BUILD_MAX_N = 1 << 10
#: ``verify all`` runs them at N <= 2^8 (MQAR, whose cost per input grows as N^2 with |Sigma| = N/2: 2^6), under a second for the three
ALL_MAX_N = 1 << 8


def _bits_of(values: np.ndarray, width: int) -> np.ndarray:
    """[len(values), width] 0/1, bit j of each value."""
    return (np.asarray(values, dtype=np.int64)[:, None] >> np.arange(width)) & 1


def _symbol_readout(rb: RecurrentBuilder, bit_units: np.ndarray, n_answers: int) -> None:
    """logit_s = sum_j (2 bit_j(s) - 1) B_j + (zeros of s) with B_j the sum of ``bit_units[..., j]``:
    the number of bits where s agrees with B (one of them 1 at a time: the answer's bits)."""
    width = bit_units.shape[-1]
    bits = _bits_of(np.arange(n_answers), width)  # [A, width]
    units = bit_units.reshape(-1, width)
    for j in range(width):
        rb.readout(units[:, j][:, None], np.arange(n_answers)[None, :], (2 * bits[:, j] - 1)[None, :])
    rb.readout_bias(width - bits.sum(axis=1))


def _params(hidden: int, fmt: Format, formula: str, bound: str) -> dict[str, Param]:
    return {"hidden": Param(hidden, formula),
            "precision_bits": Param(fmt.bits, "bits of one number in the format"),
            "state_bits": Param(hidden * fmt.bits, f"m p: the hidden state Thm 2's protocol sends ({bound})"),
            "arithmetics": Param([fmt.name, "real", "float64", "float32"],
                                 "integer weights and small integer values: every step is exact in each of them")}


# ------------------------------------------------------------------------------------------------
# Index Lookup (Thm 3)
# ------------------------------------------------------------------------------------------------


class RecurrentIndexLookupTask(IndexLookupTask):
    """Index Lookup (P1 Sec. 3) for a recurrent model: Theorem 1's task, verified by running."""

    modes = RUN_MODES


@construction("index-lookup-rnn", task=RecurrentIndexLookupTask(), theorem="Thm 3 met: Index Lookup by an RNN, Bhattamishra et al. 2024",
              claim=Claim("P1 Thm 3 (Sec. 3; App. C.1): any RNN needs m >= N/p", "1 (recurrent)", "-",
                          "m >= N/p (lower bound); built: (N + 1) ceil(log2 |Sigma|)", "p: a constant",
                          "m p >= N state bits"),
              sizes=SizeRows("index-lookup", (("alphabet", 2),), name="index-lookup-rnn", build_max_n=BUILD_MAX_N,
                             bounds=("rnn-index-lookup",), note="the recurrent model meeting Thm 3"),
              example=dict(n=6, alphabet=2), all_max_n=ALL_MAX_N)
def index_lookup_rnn(n: int, alphabet: int = 2, precision: Format | str | None = None) -> RNNModel:
    """Index Lookup by a ReLU RNN: a shift register of every symbol, the index read last (meets P1 Thm 3).

    Parameters
    ----------
    n : int in [2, 2^20]. N, the number of symbols.
    alphabet : int in [2, 2^16]. |Sigma|. Default: 2 (Thm 3's reduction from INDEX uses two symbols).
    precision : a fixed-point format that holds -2 .. ceil(log2 |Sigma|). Default: the fewest-bit
        binary:int=I,frac=0 that does.
    """
    n = check_int("n", n, 2, MAX_N, err=IndexLookupError)
    S = check_int("alphabet", alphabet, 2, MAX_ALPHABET, err=IndexLookupError)
    b = symbol_bits(S)
    fmt = integer_format(-2, b, precision, IndexLookupError)
    r = digit_base(n)
    flag = b + 2 * r
    theorem = "Thm 3 met: Index Lookup by an RNN, Bhattamishra et al. 2024"
    params = _params((n + 1) * b, fmt, "(N + 1) ceil(log2 |Sigma|): N + 1 slots of the symbol's bits",
                     f"Thm 3: m p >= N = {n}")
    fields = dict(construction="index-lookup-rnn", theorem=theorem, n=n, precision=fmt.name, params=params,
                  task_params={"n": n, "alphabet": S})
    shape = shape_only((n + 1) * b, flag + 1, S + n, S, **fields)
    if shape is not None:  # the size tables' shapes-only path: no weights assembled
        return shape  # type: ignore[return-value]
    embed = np.zeros((S + n, flag + 1), dtype=np.int64)
    embed[:S, :b] = _bits_of(np.arange(S), b)  # symbol s: its bits
    hi, lo = digit_columns(np.arange(n), r, b)  # index token p (id S + p - 1): the digits of p - 1 and the flag
    embed[S + np.arange(n), hi], embed[S + np.arange(n), lo], embed[S:, flag] = 1, 1, 1
    rb = RecurrentBuilder(embed)
    slots = shift_register(rb, "slots", n + 1, np.arange(b))
    # slot i (>= 1) holds s_p at the index step for p = N + 1 - i: the index token keeps it, clears the others
    two_digit_match(rb, slots[1:], (n - np.arange(1, n + 1))[:, None], r, b, flag)
    _symbol_readout(rb, slots[1:], S)
    return rb.build(list(range(S)), [f"s{s}" for s in range(S)] + [f"p{p}" for p in range(1, n + 1)], **fields)


# ------------------------------------------------------------------------------------------------
# Equality (Thm 11)
# ------------------------------------------------------------------------------------------------


class RecurrentEqualityTask(EqualityTask):
    """EQ on {-1, 1}^N (P1 Sec. 4.2) for a recurrent model: Theorem 6's task, verified by running."""

    modes = RUN_MODES


@construction("equality-rnn", task=RecurrentEqualityTask(complement=False),
              theorem="Thm 11 met: Equality by an RNN, Bhattamishra et al. 2024",
              claim=Claim("P1 Thm 11 (App. F.1): any RNN computing INEQ (or EQ) needs mp >= N/2", "1 (recurrent)", "-",
                          "m >= N/(2p) (lower bound); built: N/2 + 4", "p: a constant", "m p >= N/2 state bits"),
              sizes=SizeRows("equality", name="equality-rnn", build_max_n=BUILD_MAX_N, bounds=("rnn-equality",),
                             note="the recurrent model meeting Thm 11"),
              example=dict(n=8), all_max_n=ALL_MAX_N)
def equality_rnn(n: int, precision: Format | str | None = None) -> RNNModel:
    """Equality of the two halves of x in {-1, 1}^N by a ReLU RNN with N/2 + 4 units (meets P1 Thm 11).

    Parameters
    ----------
    n : int in [2, 2^20], even. N.
    precision : a fixed-point format that holds -3 .. 2. Default: binary:int=2,frac=0 (3 bits).
    """
    n = check_int("n", n, 2, MAX_N, even=True, err=ThresholdError)
    fmt = integer_format(-3, 2, precision, ThresholdError)
    h = n // 2
    theorem = "Thm 11 met: Equality by an RNN, Bhattamishra et al. 2024"
    params = _params(h + 4, fmt, "N/2 slots, 3 comparison units, 1 flag", f"Thm 11: m p >= N/2 = {h}")
    fields = dict(construction="equality-rnn", theorem=theorem, n=n, precision=fmt.name, params=params,
                  task_params={"n": n, "answer": "EQ"})
    shape = shape_only(h + 4, 2, 2, 2, **fields)
    if shape is not None:  # the size tables' shapes-only path: no weights assembled
        return shape  # type: ignore[return-value]
    embed = np.array([[1, 0], [2, 1]], dtype=np.int64)  # token 0 (-1): code 1; token 1 (+1): code 2, plus = 1
    rb = RecurrentBuilder(embed)
    slots = shift_register(rb, "slots", h, np.array([0]))[:, 0]
    u1, u2, u3 = rb.units("compare", 3)
    (g,) = rb.units("flag", 1)
    last = slots[-1]  # at step t it holds x_{t - N/2} (0 while t <= N/2)
    for u, plus, bias in ((u1, -2, -1), (u2, 2, -2), (u3, 1, -2)):  # u1 + u2 - 2 u3 = [x_{t-N/2} != x_t], 0 if empty
        rb.recur(u, last, 1)
        rb.read(u, 1, plus)
        rb.bias(u, bias)
    rb.recur(g, [g, u1, u2, u3], [1, -1, -1, 2])  # g_t = relu(g_{t-1} - mismatch_{t-1})
    rb.start(g, 1)
    rb.readout([g, u1, u2, u3], 1, [1, -1, -1, 2])  # EQ: g - mismatch; not EQ: 1 - g + mismatch
    rb.readout([g, u1, u2, u3], 0, [-1, 1, 1, -2])
    rb.readout_bias([1, 0])
    return rb.build([0, 1], ["-1", "+1"], **fields)


# ------------------------------------------------------------------------------------------------
# MQAR, every query answered (Thm 8's setting)
# ------------------------------------------------------------------------------------------------


class RecurrentMQARTask(MQARTask):
    """MQAR (P1 App. G) for a recurrent model: the lean variant's tokens, verified by running."""

    modes = RUN_MODES

    def adversarial(self, model: RNNModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """MQAR's adversarial kinds an RNN can meet, cycled per batch: matches at the first and last
        first-half position ("edges"), maximal label interference ("labels"), random (the
        transformer's "code-worst" inputs are about its symbol code; an RNN has none)."""
        kinds = ("edges", "labels", "random")
        yield from self._batches(model, count, seed, min(batch, max(1, count // len(kinds))), kinds)


@construction("mqar-rnn", task=RecurrentMQARTask(), theorem="Thm 8 met: MQAR by an RNN, Bhattamishra et al. 2024",
              claim=Claim("P1 Thm 8 (Sec. 5.2; App. G.1, proved on MQAR): an RNN answering every query needs "
                          "m >= N/(2p)", "1 (recurrent)", "-", "m >= N/(2p) (lower bound); built: |Sigma| (2 + 3 "
                          "ceil(log2 L))", "p: a constant", "m p >= N/2 state bits"),
              sizes=SizeRows("nearest-neighbor", name="mqar-rnn", build_max_n=BUILD_MAX_N,
                             bounds=("rnn-nearest-neighbor",),
                             note="the recurrent model meeting Thm 8: every query answered, |Sigma| = N/2, 2 labels"),
              example=dict(n=4), all_max_n=ALL_MAX_N // 4)
def mqar_rnn(n: int, alphabet: int | None = None, labels: int = 2, queries: str = "all",
             precision: Format | str | None = None) -> RNNModel:
    """MQAR answering every query by a ReLU RNN that stores one label per key (meets P1 Thm 8).

    Parameters
    ----------
    n : int in [2, 2^20], even. N, the number of symbols (2N - 1 tokens).
    alphabet : int in [N/2, 2^16]. |Sigma|, the keys. Default: N/2 (Thm 8's setting: N/2 distinct keys).
    labels : int in [2, 2^16]. L, the label alphabet. Default: 2.
    queries : all | last. all (Thm 8's setting): answer every query of the second half; last: the
        last one only. Default: all.
    precision : a fixed-point format that holds -3 .. max(2, ceil(log2 L)). Default: the fewest-bit
        binary:int=I,frac=0 that does.
    """
    n = check_int("n", n, 2, MAX_N, even=True, err=MQARError)
    S = n // 2 if alphabet is None else check_int("alphabet", alphabet, max(2, n // 2), 1 << 16, err=MQARError)
    L = check_int("labels", labels, 2, 1 << 16, err=MQARError)
    if queries not in QUERIES:
        raise MQARError(f"queries must be one of {', '.join(QUERIES)}, got {queries!r}")
    b = symbol_bits(L)
    fmt = integer_format(-3, max(2, b), precision, MQARError)
    r = digit_base(S)
    key_flag, label_cols = 2 * r, 2 * r + 1 + np.arange(b)
    theorem = "Thm 8 met: MQAR by an RNN, Bhattamishra et al. 2024"
    params = _params(S * (2 + 3 * b), fmt, "|Sigma| (2 + 3 ceil(log2 L)): key, written; write, stored, read per bit",
                     f"Thm 8: m p >= N/2 = {n // 2}")
    fields = dict(construction="mqar-rnn", theorem=theorem, n=n, precision=fmt.name, params=params,
                  answer_positions=answer_positions(n, queries),
                  task_params={"n": n, "alphabet": S, "labels": L, "queries": queries, "variant": "lean"})
    shape = shape_only(S * (2 + 3 * b), 2 * r + 1 + b, S + L, L, **fields)
    if shape is not None:  # the size tables' shapes-only path: no weights assembled
        return shape  # type: ignore[return-value]
    embed = np.zeros((S + L, 2 * r + 1 + b), dtype=np.int64)
    hi, lo = digit_columns(np.arange(S), r, 0)  # key s: its two digits and the key flag
    embed[np.arange(S), hi], embed[np.arange(S), lo], embed[:S, key_flag] = 1, 1, 1
    embed[S:, label_cols] = _bits_of(np.arange(L), b)  # label y: its bits
    rb = RecurrentBuilder(embed)
    keys = np.arange(S)
    reg = rb.units("key", S)  # 1 on the key just read
    written = rb.units("written", S)  # 0 before the key's first label, then 1 (2 after the second)
    write, stored, read = (rb.units(name, S * b).reshape(S, b) for name in ("write", "stored", "read"))
    rb.read(reg[:, None], np.stack([hi, lo], axis=1), 1)
    rb.bias(reg, -1)
    rb.recur(written[:, None], np.stack([written, reg], axis=1), 1)
    rb.recur(write, np.broadcast_to(reg[:, None], write.shape), 1)  # the label after key k's first occurrence
    rb.recur(write, np.broadcast_to(written[:, None], write.shape), -1)
    rb.read(write, np.broadcast_to(label_cols[None, :], write.shape), 1)
    rb.bias(write, -1)
    rb.recur(stored, stored, 1)
    rb.recur(stored, write, 1)
    rb.recur(read, stored, 1)
    rb.recur(read, write, 1)
    two_digit_match(rb, read, keys[:, None], r, 0, key_flag)  # at key k: its stored bits, 0 elsewhere
    _symbol_readout(rb, read, L)
    return rb.build(list(range(L)), [f"s{s}" for s in range(S)] + [f"y{y}" for y in range(L)], **fields)
