"""Bounded Dyck languages by a constant-size ReLU RNN (P1 App. E, after Thm 10; Sec. 4.1).

Task: Dyck-(k, D), the well-matched strings over k bracket types in which no prefix has more than D
brackets open (P1 Sec. 4.1, "Task"). The brackets are ``()[]{}<>`` in order of type: token 2i opens
type i, token 2i + 1 closes it. The paper's separation: a one-layer transformer deciding
Dyck-(2, 2) on length N needs mH >= (N - 1)/(3(p + log N)) (Thm 5, from Lemma 1's fooling set and
Thm 4's protocol), while "the language Dyck-(2, 2) considered here can be represented by a DFA with
just 7 states", so a recurrent model of constant size recognises it at every length.

The automaton (:func:`dyck_automaton`): one state per stack of at most D brackets (1 + k + ... + k^D
states; 7 for Dyck-(2, 2)), a reject sink besides them (which the RNN holds as the zero state), the
empty stack starting and accepting. The RNN (:func:`~exactformer.constructions.blocks.recurrent.automaton_units`):
one unit per (state, symbol) pair the symbol can lead to, 2k (1 + k + ... + k^(D-1)) units (12 for
Dyck-(2, 2)), integer weights in {-1, 0, 1}, every value in [-1, 1]: exact in the 2-bit format
``binary:int=1,frac=0`` and in every float arithmetic. The certificate
(:mod:`exactformer.verify.certify.recurrent`) proves for every length that the hidden state after
each prefix is the one-hot (state, last symbol) of the automaton given by the task's definition.
"""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.blocks.recurrent import automaton_units, integer_format
from exactformer.constructions.core.ir import Param
from exactformer.constructions.core.recurrent import RecurrentBuilder, RNNModel
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.scan import run_machine
from exactformer.constructions.core.spec import REJECT, Automaton
from exactformer.constructions.core.streams import (Deferred, GeneratedTokens, SequentialFill,
                                                    counter_hash, draw_keys, uniform_symbols)
from exactformer.constructions.core.task import Batch, Domains, PowerCount, Task, TaskError, power_count
from exactformer.precision import Format

THEOREM = "Thm 5's separation, the RNN side (App. E: a DFA), Bhattamishra et al. 2024"
BRACKETS = "()[]{}<>"
MAX_TYPES = len(BRACKETS) // 2
MAX_DEPTH = 8
MAX_HIDDEN = 4096
MAX_N = 1 << 30
ANSWERS = [False, True]
GENERATED_BATCH = 16  # strings per batch of generated ones
GENERATED_FROM = 1 << 16  # strings at least this long are generated on demand


class DyckError(TaskError):
    """Bad parameters for :func:`dyck_rnn` or a bad input string."""


def stack_states(types: int, depth: int) -> list[tuple[int, ...]]:
    """Every stack of at most ``depth`` open brackets (bottom first), the empty one first."""
    return [s for d in range(depth + 1) for s in itertools.product(range(types), repeat=d)]


def hidden_units(types: int, depth: int) -> int:
    """The RNN's units: 2k (1 + k + ... + k^(D-1)) (module docstring)."""
    return 2 * types * sum(types**d for d in range(depth))


def dyck_automaton(types: int, depth: int) -> Automaton:
    """The automaton of Dyck-(k, D) from its definition: states are the stacks of at most D open
    brackets; an open bracket pushes (past depth D: reject), a close bracket pops its own type
    (another type or an empty stack: reject); the empty stack starts and accepts."""
    states = stack_states(types, depth)
    index = {s: i for i, s in enumerate(states)}
    delta = np.full((len(states), 2 * types), REJECT, dtype=np.int64)
    for s, q in index.items():
        for t in range(types):
            if len(s) < depth:
                delta[q, 2 * t] = index[s + (t,)]
            if s and s[-1] == t:
                delta[q, 2 * t + 1] = index[s[:-1]]
    accept = np.array([len(s) == 0 for s in states])
    return Automaton(delta, index[()], accept, (0, 1))


def dyck_member(strings: np.ndarray, types: int, depth: int) -> np.ndarray:
    """Whether each string of token ids [B, L] is in Dyck-(k, D), with an unbounded stack (the
    definition; independent of :func:`dyck_automaton`)."""
    s = np.asarray(strings, dtype=np.int64)
    B, L = s.shape
    stack = np.zeros((B, L + 1), dtype=np.int64)
    top = np.zeros(B, dtype=np.int64)
    ok = np.ones(B, dtype=bool)
    rows = np.arange(B)
    for j in range(L):
        kind, opening = s[:, j] // 2, s[:, j] % 2 == 0
        push = ok & opening
        stack[rows[push], top[push]] = kind[push]
        top = top + push
        ok &= ~(push & (top > depth))
        pop = ok & ~opening
        bad = pop & ((top == 0) | (stack[rows, np.maximum(top - 1, 0)] != kind))
        ok &= ~bad
        top = top - (pop & ~bad)
    return ok & (top == 0)


def member_machine(types: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`DyckTask.members`'s walk as a machine over the stacks (:func:`stack_states`): symbol
    ``(coin k + bracket)(D + 2) + e`` for a coin flip, a bracket type and e = min(positions left
    after this one, D + 1); returns (next stack [S, A], emitted token [S, A]). It opens where it
    can still close within the length and either the coin says so or nothing is open; else it
    closes the top bracket."""
    states = stack_states(types, depth)
    index = {s: i for i, s in enumerate(states)}
    A = 2 * types * (depth + 2)
    nxt, emit = np.zeros((len(states), A), np.int64), np.zeros((len(states), A), np.int64)
    for s, q in index.items():
        for coin, bracket, e in itertools.product(range(2), range(types), range(depth + 2)):
            a = (coin * types + bracket) * (depth + 2) + e
            can_open, can_close = len(s) < depth and len(s) + 1 <= e, len(s) > 0
            if (can_open and (not can_close or coin)) or not can_close:
                nxt[q, a], emit[q, a] = index[s + (bracket,)], 2 * bracket
            else:
                nxt[q, a], emit[q, a] = index[s[:-1]], 2 * s[-1] + 1
    return nxt, emit


def check_types_depth(types: int, depth: int) -> None:
    for name, v, hi in (("types", types, MAX_TYPES), ("depth", depth, MAX_DEPTH)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise DyckError(f"{name}: an integer in [1, {hi}], got {v!r}")
    if hidden_units(types, depth) > MAX_HIDDEN:
        raise DyckError(f"depth: at most {max(d for d in range(1, MAX_DEPTH + 1) if hidden_units(types, d) <= MAX_HIDDEN)} "
                        f"for types={types} (the RNN's 2k(1 + k + ... + k^(D-1)) units must be <= {MAX_HIDDEN}), "
                        f"got {depth}")


class DyckTask(Task):
    """Membership in Dyck-(k, D) (module docstring). Natural input: a string over the first 2k
    brackets of ``()[]{}<>`` (or a list of token ids) of any length >= 0 (the empty string is a
    member); a call's strings may differ in length (:meth:`groups`); the verifier's exhaustive and
    sampled inputs have length N. Answer: True / False."""

    ENCODING = {
        "inputs": [{"name": "s", "type": "a string over the first 2*types brackets of ()[]{}<>, any length >= 0"}],
        "tokens": [{"for_each": "s", "token": "{}"}],
    }

    @staticmethod
    def params(model: Any) -> tuple[int, int]:
        return int(model.task_params["types"]), int(model.task_params["depth"])

    def length(self, model: Any) -> int:
        return int(model.n)

    def domains(self, model: Any) -> Domains:
        k, _ = self.params(model)
        return Domains([np.arange(2 * k)], np.zeros(self.length(model), dtype=np.int64))

    def truth(self, model: Any, strings: np.ndarray) -> np.ndarray:
        return dyck_member(strings, *self.params(model)).astype(np.int64)

    def spec(self, model: Any) -> Automaton:
        return dyck_automaton(*self.params(model))

    def encode_arrays(self, model: Any, strings: np.ndarray) -> np.ndarray:
        k, _ = self.params(model)
        s = np.asarray(strings)
        if s.ndim != 2 or (s.size and (not np.issubdtype(s.dtype, np.integer) or s.min() < 0 or s.max() >= 2 * k)):
            raise DyckError(f"s: strings of token ids in [0, {2 * k}) of one length, shape [B, L], got {s.shape}")
        return s.astype(np.int32)

    def groups(self, model: Any, examples: list[Any]) -> list[list[int]]:
        """The examples of one length together (each group one array; the model runs on any length)."""
        by_length: dict[int, list[int]] = {}
        for i, e in enumerate(examples):
            e = self._unwrap(e)
            by_length.setdefault(len(e) if isinstance(e, (str, list, tuple, np.ndarray)) else -1, []).append(i)
        return list(by_length.values())

    @staticmethod
    def _unwrap(e: Any) -> Any:
        return e[0] if isinstance(e, tuple) and len(e) == 1 else e

    def to_arrays(self, model: Any, examples: list[Any]) -> tuple[np.ndarray]:
        k, _ = self.params(model)
        alphabet = BRACKETS[: 2 * k]
        rows = []
        for e in examples:
            e = self._unwrap(e)
            if isinstance(e, str):
                bad = [c for c in e if c not in alphabet]
                if bad:
                    raise DyckError(f"s: a string over {alphabet!r}, got the character {bad[0]!r}")
                e = [alphabet.index(c) for c in e]
            if not isinstance(e, (list, tuple, np.ndarray)) or any(
                    isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 2 * k for v in e):
                raise DyckError(f"s: a string over {alphabet!r} or a list of token ids in [0, {2 * k})")
            rows.append([int(v) for v in e])
        lengths = sorted({len(r) for r in rows})
        if len(lengths) > 1:  # xf.Model runs the groups of :meth:`groups` one by one
            raise DyckError(f"s: the strings of one array must have one length (xf.Model runs them by length), got "
                            f"lengths {lengths[0]} and {lengths[1]}")
        return (np.asarray(rows, dtype=np.int64).reshape(len(rows), lengths[0] if lengths else 0),)

    # ---- inputs ---------------------------------------------------------------------------------
    def count(self, model: Any) -> int | PowerCount:
        return power_count(2 * self.params(model)[0], self.length(model))  # held as its factors beyond 2^16 bits

    def exhaustive(self, model: Any, batch: int = 4096) -> Iterator[Batch]:
        """Every string of length N, in counting order."""
        V, n = 2 * self.params(model)[0], self.length(model)
        total = V**n
        for start in range(0, total, batch):
            ints = np.arange(start, min(total, start + batch), dtype=np.int64)
            yield self.batch(model, (ints[:, None] // V ** np.arange(n - 1, -1, -1)[None, :]) % V)

    def members(self, model: Any, rng: np.random.Generator, b: int) -> np.ndarray:
        """``b`` random strings of length N in Dyck-(k, D) (N even): each step picks uniformly among
        the brackets after which the string can still be completed within N (not uniform over the
        language); all-reject rows when N is odd."""
        k, D = self.params(model)
        n = self.length(model)
        out = np.zeros((b, n), dtype=np.int64)
        stack = np.zeros((b, D + 1), dtype=np.int64)
        top = np.zeros(b, dtype=np.int64)
        rows = np.arange(b)
        for j in range(n):
            left = n - j - 1
            can_open = (top < D) & (top + 1 <= left)
            can_close = top > 0
            pick_open = (can_open & (~can_close | (rng.random(b) < 0.5))) | ~can_close  # N odd: no member
            kind = np.where(pick_open, rng.integers(0, k, size=b), stack[rows, np.maximum(top - 1, 0)])
            out[:, j] = 2 * kind + np.where(pick_open, 0, 1)
            stack[rows[pick_open], top[pick_open]] = kind[pick_open]
            top = top + np.where(pick_open, 1, -1)
        return out

    def _draw(self, model: Any, rng: np.random.Generator, b: int, kind: str) -> np.ndarray:
        V = 2 * self.params(model)[0]
        if kind == "uniform":
            return rng.integers(0, V, size=(b, self.length(model)))
        x = self.members(model, rng, b)
        if kind == "corrupted":  # one symbol of each string replaced by a different one
            j, rows = rng.integers(0, x.shape[1], size=b), np.arange(b)
            x[rows, j] = (x[rows, j] + rng.integers(1, max(2, V), size=b)) % V
        return x

    def _batches(self, model: Any, count: int, seed: int, kinds: tuple[str, ...], batch: int) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        if self.generated(model):
            batch = min(batch, GENERATED_BATCH)
        done, i = 0, 0
        while done < count:
            b, kind = min(batch, count - done), kinds[i % len(kinds)]
            yield (self._generated(model, rng, b, kind) if self.generated(model) else
                   self.batch(model, self._draw(model, rng, b, kind), kind=kind))
            done, i = done + b, i + 1

    # ---- inputs generated on demand (N >= 2^16) ----------------------------------------------------
    def generated(self, model: Any) -> bool:
        """Whether sampled and adversarial strings are generated on demand, never formed: from
        N >= :data:`GENERATED_FROM` (drawing a member one position at a time costs some 20 us a
        position: minutes at 2^24)."""
        return self.length(model) >= GENERATED_FROM

    def input_bytes(self, model: Any) -> int:
        return 64 if self.generated(model) else 32 * self.length(model)  # int64 and int32 ids, the truth's stack

    def batch_inputs(self, model: Any, batch: int = 256) -> int:
        return min(batch, GENERATED_BATCH) if self.generated(model) else batch

    def _generated(self, model: Any, rng: np.random.Generator, b: int, kind: str) -> Batch:
        """``b`` strings of ``kind`` generated chunk by chunk, never formed: uniform symbols, or
        members drawn as :meth:`members` draws them, their coin flips and bracket types read from
        :func:`counter_hash` of per-string keys (the stack's walk run by
        :func:`~exactformer.constructions.core.scan.run_machine`), one symbol changed for
        "corrupted". The truth is the task's automaton run on the same pass (checked against
        :func:`dyck_member`, the definition, on every string up to length 12 by the tests)."""
        k, D = self.params(model)
        n, V = self.length(model), 2 * k
        keys = draw_keys(rng, b)
        spot = rng.integers(0, n, size=b) if kind == "corrupted" else None
        shift = rng.integers(1, max(2, V), size=b) if kind == "corrupted" else None
        walk_next, walk_emit = member_machine(k, D)
        dfa = dyck_automaton(k, D)
        Q = dfa.states
        dfa_next = np.vstack([np.where(dfa.delta == REJECT, Q, dfa.delta), np.full((1, V), Q)])  # row Q: the sink

        def advance(rows: np.ndarray, state: tuple, a: int, z: int) -> tuple[np.ndarray, tuple]:
            walk, q = state
            pos = np.arange(a, z)
            if kind == "uniform":
                ids = uniform_symbols(keys[rows], pos, V)
            else:
                coin = (counter_hash(keys[rows], 2 * pos) >> np.uint64(63)).astype(np.int64)
                bracket = uniform_symbols(keys[rows] ^ np.uint64(0x5851F42D4C957F2D), pos, k)
                left = np.minimum(n - 1 - pos, D + 1)
                sym = (coin * k + bracket) * (D + 2) + left[None, :]
                _, _, after = run_machine(walk_next, None, walk, sym, every=True)
                ids = walk_emit[np.concatenate([walk[:, None], after[:, :-1]], axis=1), sym]
                walk = after[:, -1]
                if spot is not None:
                    hit = (spot[rows] >= a) & (spot[rows] < z)
                    r, j = np.flatnonzero(hit), spot[rows][hit] - a
                    ids[r, j] = (ids[r, j] + shift[rows][hit]) % V
            q, _, _ = run_machine(dfa_next, None, q, ids)
            return ids, (walk, q)

        fill = SequentialFill(advance, lambda rows: (np.zeros(len(rows), np.int64), np.full(len(rows), dfa.start)))

        def truth() -> np.ndarray:
            rows = np.arange(b)
            pos, (_, q) = fill.reached(rows)
            if pos != n:
                _, q = fill.run_to(rows, n)
            return dfa.accepts(np.where(q == Q, REJECT, q)).astype(np.int64)

        def what(r: int) -> dict:
            d = {"strings": f"{kind}, key {int(keys[r])}, length {n} (DyckTask._generated)"}
            return d if spot is None else d | {"changed": {"position": int(spot[r]), "by": int(shift[r])}}

        tokens = GeneratedTokens(fill, b, n, 0, V - 1, what)
        return Batch((tokens,), tokens, Deferred(truth, b), kind)

    def sample(self, model: Any, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """``count`` strings (``np.random.default_rng(seed)``), batches cycling: uniformly random
        strings, random members (:meth:`members`), members with one symbol changed."""
        yield from self._batches(model, count, seed, ("uniform", "member", "corrupted"), batch)

    def adversarial(self, model: Any, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """Members and members with one symbol changed (a closing bracket of the wrong type, an
        opening one past depth D, a close on the empty stack), alternating."""
        yield from self._batches(model, count, seed, ("member", "corrupted"), min(batch, max(1, count // 2)))


def build_from_automaton(dfa: Automaton, n: int, types: int, depth: int, fmt: Format, construction_name: str,
                         theorem: str) -> RNNModel:
    """The RNN of ``dfa`` (:func:`~exactformer.constructions.blocks.recurrent.automaton_units`) on the
    Dyck task's tokens (one-hot inputs), recorded as construction ``construction_name``; the tests
    build wrong automata through it."""
    V = 2 * types
    rb = RecurrentBuilder(np.eye(V, dtype=np.int64))
    pairs = automaton_units(rb, dfa, np.arange(V))
    live = dfa.states
    params = {
        "states": Param(live, "stacks of at most D open brackets, 1 + k + ... + k^D (the reject sink is the zero state)"),
        "hidden": Param(len(pairs), "units: one per (state, bracket) pair the bracket leads to, 2k(1 + k + ... + k^(D-1))"),
        "precision_bits": Param(fmt.bits, "bits of one number in the format"),
        "state_bits": Param(len(pairs) * fmt.bits, "m p: the hidden state Thm 2's protocol sends"),
        "arithmetics": Param([fmt.name, "real", "float64", "float32"],
                             "integer weights and values in [-1, 1]: every step is exact in each of them"),
    }
    return rb.build(ANSWERS, list(BRACKETS[:V]), construction=construction_name, theorem=theorem, n=n,
                    precision=fmt.name, params=params, task_params={"types": types, "depth": depth})


CLAIM = Claim("P1 App. E (after Thm 10): a DFA with 7 states for Dyck-(2, 2)", "1 (recurrent)", "-",
              "O(1): constant in N", "O(1)", "O(1): a constant-size recurrent model at every length",
              "the paper's RNN has arbitrary transitions (ceil(log2 7) = 3 state bits); built: a ReLU RNN")


@construction("dyck-rnn", task=DyckTask(), theorem=THEOREM, claim=CLAIM,
              sizes=SizeRows("dyck", (("types", 2), ("depth", 2)), name="dyck-rnn", max_n=MAX_N,
                             note="a ReLU RNN of constant size; N is the input length the bounds are taken at"),
              example=dict(n=8), small=dict(n=4))
def dyck_rnn(n: int = 16, types: int = 2, depth: int = 2, precision: Format | str | None = None) -> RNNModel:
    """Bounded Dyck-(k, D) by a ReLU RNN of constant size (P1 App. E): one unit per (DFA state, bracket).

    Parameters
    ----------
    n : int in [1, 2^30]. The input length of the verifier's exhaustive and sampled strings (the
        model runs on strings of every length, and the certificate covers every length). Default: 16.
    types : int in [1, 4]. k, the bracket types: ()[]{}<> in order. Default: 2.
    depth : int in [1, 8]. D, the most brackets open at once; 2k(1 + k + ... + k^(D-1)) <= 4096
        hidden units. Default: 2.
    precision : a fixed-point format that holds -1, 0 and 1. Default: binary:int=1,frac=0 (2 bits).
    """
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise DyckError(f"n: an integer in [1, 2^30], got {n!r}")
    check_types_depth(types, depth)
    fmt = integer_format(-1, 1, precision, DyckError)  # weights, values and pre-activations in {-1, 0, 1}
    return build_from_automaton(dyck_automaton(types, depth), n, types, depth, fmt, "dyck-rnn", THEOREM)
