"""MPC protocols (P2 Def. 2.3) in SPMD form: the input of the Thm 4.1 compiler.

A :class:`Protocol` runs on ``n`` machines, one per input word: machine ``i`` starts with input
word ``i`` and ends with output word ``i`` (the transformer's own layout; a Def-2.3 protocol that
wants its input on the first ceil(N/s) machines starts with the ``gather`` round of
:mod:`exactformer.constructions.mpc.library`). Words are integers in ``[0, 2^p)`` (``p`` =
``word_bits``); ``-1`` marks an empty word (⊥), which is stored nowhere and costs no memory.

Everything is vectorised over the machines and over a batch of ``B`` inputs: a machine's memory is
a set of named fields, and a :data:`Memory` maps each field to an ``int64`` array ``[B, n]`` (one
word) or ``[B, n, w]`` (``w`` words). A round (Def. 2.3 items 2–3) is

    step:      local computation of every machine, ``Memory -> Step`` (new memory + operations)
    delivery:  the operations' results land in the recipients' memory

with two kinds of operations:

* **push** — :class:`Send` ``(dest, slot, word)``: the word lands in inbox slot ``slot`` of machine
  ``dest`` (a Def-2.3 message). The receiver's inbox is the field ``Round.inbox`` ``[B, n, slots]``.
* **pull** — :class:`Publish` a record under a key into a :class:`Table`, and look keys up in the
  same round; results land in the field ``Table.into``. ``unique`` tables return the single
  publisher's words (two publishers of one key is a protocol error), ``exists`` tables return 1/0.
  A keyed read with unbounded fan-out is one EMA head but not a Def-2.3 round (a Def-2.3 machine
  cannot answer unboundedly many requests), so a protocol with tables is an *EMA protocol*;
  :attr:`Protocol.is_mpc` is True only for push-only protocols.

Memory persists across rounds only as far as ``step`` returns it; each round's inbox and lookup
results replace those of the previous round (a protocol keeps them by copying them into its new
memory). The executor (:func:`exactformer.verify.mpc.protocol_run.run`) checks every resource of every round and
names the machine, the round and the limit of the first violation:

* every word (memory, messages, keys, published words) is ``-1`` or in ``[0, 2^p)``; messages and
  keys hold no ⊥ (a key with a ⊥ word publishes / asks nothing);
* words sent per machine (messages + published key and record words) ``<= s``;
* words received per machine (inbox words + lookup results) ``<= s``;
* words held after the round (new memory + received) ``<= s``;
* distinct destinations per machine ``<= Round.sends`` (the declared α_r: the compiled layer has that
  many send heads); destinations in ``[0, n)``, slots in ``[0, Round.slots)``; no two messages into
  the same slot of the same machine;
* at most one record per machine per table; ``unique`` keys have one publisher; publishers matching
  one lookup ``<= Table.max_matches`` (the bound the fixed-point precision is derived from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

Memory = dict[str, np.ndarray]
TABLE_KINDS = ("unique", "exists")
RESERVED_PREFIX = "@"  # field names of the compiled program's transient per-layer data


class ProtocolError(ValueError):
    """A malformed protocol declaration (names, counts, sizes) found before anything runs."""


def check_count(value: Any, name: str, lo: int, what: str) -> int:
    """``value`` as an int >= ``lo``, else a :class:`ProtocolError` naming ``name``, the range and ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ProtocolError(f"{name} must be an integer >= {lo} ({what}), got {value!r}")
    return int(value)


def _check_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or value.startswith(RESERVED_PREFIX):
        raise ProtocolError(f"{what} must be a non-empty string not starting with {RESERVED_PREFIX!r}, got {value!r}")
    return value


@dataclass(frozen=True)
class Send:
    """Messages of every machine in one round: ``dest``, ``slot``, ``word`` are int arrays
    ``[B, n, m]`` (or ``[B, n]`` for ``m = 1``); message ``(b, i, k)`` exists iff ``dest >= 0``."""

    dest: np.ndarray
    slot: np.ndarray
    word: np.ndarray


@dataclass(frozen=True)
class Publish:
    """One record per machine for a table.

    ``words``: ``[B, n, w]`` (or ``[B, n]``) the record (``None`` for ``exists`` tables);
    ``key``: ``[B, n, κ]`` (or ``[B, n]`` for κ = 1); ``None`` for positional tables, whose key is the
    publisher's machine id; ``present``: ``[B, n]`` bool, who publishes (default: every machine
    whose key holds no ⊥)."""

    words: np.ndarray | None = None
    key: np.ndarray | None = None
    present: np.ndarray | None = None


@dataclass(frozen=True)
class Step:
    """What a round's local computation returns: the new memory and the round's operations.

    ``lookup`` maps a table name to the keys every machine reads: ``[B, n, λ]`` for tables with
    one-word (or positional) keys, ``[B, n, λ, κ]`` otherwise; a key holding ⊥ asks nothing."""

    memory: Memory
    send: Send | None = None
    publish: Mapping[str, Publish] = field(default_factory=dict)
    lookup: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Table:
    """A keyed table of one round (pull communication).

    ``kind``: ``"unique"`` (result: the publisher's ``value_words`` words, ⊥ if none) or ``"exists"``
    (result: 1 or 0); ⊥ for a lookup that asked nothing. ``key_words`` = κ, 0 for a positional table
    (key = publisher's machine id). ``lookups`` = λ per machine; results land in field ``into``:
    ``[B, n, λ·value_words]`` (unique) or ``[B, n, λ]`` (exists). ``max_matches``: declared bound on
    the publishers of one key (``unique``: 1; ``exists``: default ``n``), checked by the executor."""

    name: str
    kind: str
    into: str
    lookups: int = 1
    key_words: int = 1
    value_words: int = 0
    max_matches: int | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "Table.name")
        _check_name(self.into, f"Table {self.name!r}: into")
        if self.kind not in TABLE_KINDS:
            raise ProtocolError(f"Table {self.name!r}: kind must be one of {TABLE_KINDS}, got {self.kind!r}")
        check_count(self.lookups, f"Table {self.name!r}: lookups", 1, "lookups per machine")
        check_count(self.key_words, f"Table {self.name!r}: key_words", 0, "0 = positional key")
        check_count(self.value_words, f"Table {self.name!r}: value_words", 0, "record words")
        if self.kind == "exists" and self.value_words:
            raise ProtocolError(f"Table {self.name!r}: an exists table has value_words = 0, got {self.value_words}")
        if self.kind == "unique" and not self.value_words:
            raise ProtocolError(f"Table {self.name!r}: a unique table needs value_words >= 1")
        if self.max_matches is not None:
            check_count(self.max_matches, f"Table {self.name!r}: max_matches", 1, "publishers per key")
            if self.kind == "unique" and self.max_matches != 1:
                raise ProtocolError(f"Table {self.name!r}: a unique table has max_matches = 1, got {self.max_matches}")

    @property
    def positional(self) -> bool:
        return self.key_words == 0

    def matches_bound(self, n: int) -> int:
        """The declared bound on publishers per key (what the fixed-point step must resolve)."""
        if self.kind == "unique":
            return 1
        return min(n, self.max_matches) if self.max_matches is not None else n

    @property
    def result_words(self) -> int:
        return self.lookups * (self.value_words if self.kind == "unique" else 1)


@dataclass(frozen=True)
class Round:
    """One round: ``step`` (local computation) and the declared communication.

    ``sends`` = α_r, the most distinct destinations of one machine; ``slots`` = s_in, the inbox size
    (field ``inbox``, ``[B, n, slots]``, present iff ``slots > 0``); ``tables`` for pull reads."""

    name: str
    step: Callable[[Memory], Step]
    sends: int = 0
    slots: int = 0
    inbox: str = "inbox"
    tables: tuple[Table, ...] = ()

    def __post_init__(self) -> None:
        _check_name(self.name, "Round.name")
        if not callable(self.step):
            raise ProtocolError(f"Round {self.name!r}: step must be callable")
        check_count(self.sends, f"Round {self.name!r}: sends", 0, "distinct destinations per machine")
        check_count(self.slots, f"Round {self.name!r}: slots", 0, "inbox slots per machine")
        _check_name(self.inbox, f"Round {self.name!r}: inbox")
        if self.sends and not self.slots:
            raise ProtocolError(f"Round {self.name!r}: sends = {self.sends} needs slots >= 1")
        names = [t.name for t in self.tables]
        if len(set(names)) != len(names):
            raise ProtocolError(f"Round {self.name!r}: table names must be distinct, got {names}")
        outs = [t.into for t in self.tables] + ([self.inbox] if self.slots else [])
        if len(set(outs)) != len(outs):
            raise ProtocolError(f"Round {self.name!r}: inbox and table result fields must be distinct, got {outs}")

    @property
    def delivered_fields(self) -> tuple[str, ...]:
        return ((self.inbox,) if self.slots else ()) + tuple(t.into for t in self.tables)

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True)
class Protocol:
    """An R-round protocol on ``n`` input words with ``word_bits`` = p and local memory ``memory`` = s.

    ``machines`` = P, the number of machines (default ``n``: one machine per input word, machine i
    starting with word i). ``init(inputs [B, n]) -> Memory`` with every field ``[B, P, …]``;
    ``output(Memory) -> [B, n]`` int64 answers (−1 = ⊥), the row-wise output map ψ of Def. 2.2
    applied after the last round. ``params`` records the builder's parameters (for reports). Only
    protocols with P = n compile to EMA programs (Thm 4.1: one token per machine); P > n is the
    shape of Thm 4.2's simulations (docs/mpc.md, "Thm 4.2")."""

    name: str
    n: int
    word_bits: int
    memory: int
    init: Callable[[np.ndarray], Memory]
    rounds: tuple[Round, ...]
    output: Callable[[Memory], np.ndarray]
    params: Mapping[str, Any] = field(default_factory=dict)
    machines: int | None = None

    def __post_init__(self) -> None:
        _check_name(self.name, "Protocol.name")
        check_count(self.n, "n", 1, "input words")
        if self.machines is not None:
            check_count(self.machines, "machines", 1, "P, the number of machines")
        check_count(self.word_bits, "word_bits", 1, "p, bits per word")
        if self.word_bits > 62:
            raise ProtocolError(f"word_bits must be <= 62 (int64 words), got {self.word_bits}")
        check_count(self.memory, "memory", 1, "s, words of local memory")
        if not isinstance(self.rounds, tuple) or not all(isinstance(r, Round) for r in self.rounds):
            raise ProtocolError("rounds must be a tuple of Round")
        names = [r.name for r in self.rounds]
        if len(set(names)) != len(names):
            raise ProtocolError(f"round names must be distinct, got {names}")
        for r in self.rounds:
            for t in r.tables:
                if t.max_matches is not None and t.max_matches > self.n_machines:
                    what = "n" if self.machines is None else "P"
                    raise ProtocolError(f"Round {r.name!r}, table {t.name!r}: max_matches {t.max_matches} > "
                                        f"{what} = {self.n_machines}")

    @property
    def n_machines(self) -> int:
        """P: ``machines``, or ``n`` (one machine per input word)."""
        return self.n if self.machines is None else self.machines

    @property
    def is_mpc(self) -> bool:
        """True for push-only protocols: every round is a Def-2.3 round."""
        return all(not r.tables for r in self.rounds)

    @property
    def word_limit(self) -> int:
        return 1 << self.word_bits

    def __repr__(self) -> str:
        kind = "MPC" if self.is_mpc else "EMA"
        P = "" if self.machines is None else f", P={self.machines}"
        return (f"<{kind} protocol {self.name!r}: n={self.n}{P}, p={self.word_bits}, s={self.memory}, "
                f"R={len(self.rounds)}>")


def present_rows(a: np.ndarray) -> np.ndarray:
    """Rows (last axis) of a key or query array that hold no ⊥ word (a loop over the short last axis
    is much faster than a reduction over it)."""
    out = a[..., 0] >= 0
    for j in range(1, a.shape[-1]):
        out &= a[..., j] >= 0
    return out


def bits_for(count: int) -> int:
    """Bits of a word that can hold every integer in ``[0, count)`` (at least 1)."""
    return max(1, (int(count) - 1).bit_length())


def twos(v: np.ndarray, p: int) -> np.ndarray:
    """Signed integers as p-bit words (Def. 2.3: elements of Z_{2^p}), two's complement."""
    return np.asarray(v, dtype=np.int64) & ((1 << p) - 1)


def signed(w: np.ndarray, p: int) -> np.ndarray:
    """p-bit words as signed integers (two's complement); ⊥ (−1: nothing there) reads as 0."""
    w = np.where(w < 0, 0, w)
    return np.where(w >= 1 << (p - 1), w - (1 << p), w)
