"""P2 Thm 4.1 in weights: an R-round MPC protocol as an R-layer softmax transformer, on the
push-only prefix-sums protocol (docs/mpc.md, "Weights").

Protocol (:func:`~exactformer.constructions.mpc.library.prefix_sums`, B = fan-in, L = ⌈log_B N⌉):
a B-ary up-sweep (rounds up-1 … up-L: block leaders send their sums to the next level's leader)
and down-sweep (rounds down-1 … down-L: leaders send each child its offset); y_i = (x_0 + … + x_i)
mod 2^p. Its routing is *oblivious* — who sends to whom depends on machine ids only
(:func:`~exactformer.constructions.mpc.library.up_route`, ``down_route``) — so the keys of every
message are position features.

Construction (machine i at position i + 1, BOS at 0; a word w is the slots ``w.ok`` and ``w.bits``,
:mod:`exactformer.constructions.blocks.words`; id(i) ∈ {±1}^b the bits of i, b = max(2, ⌈log₂ N⌉))::

    embedding   x (the token's word), bos; position: id, one key per head and round
                (id(destination) of the message this machine sends there, 0 if none), the
                round's sender flags, off.start (offset 0 at machine 0: the root's)
    layer r     round r's messages: one MatchHead per inbox slot (up) or per child (down),
                query id(i), key id(dest), value the sent word, out the inbox word in.r.*:
                at most one sender per (receiver, slot), so every match count is c <= 1
                MLP r:  clean.r.* = the inbox words, exact (memory field "inbox", later "kids")
                        round r + 1's local step: its sent words (sums of the inbox words, gated
                        by the sender flags) and "off" (select: got if delivered, else the old)
                        — or, after the last round, y = off' + x
    readout     SymbolReadout(y.bits): the word whose bits y holds

Simulation invariant (checked by :func:`exactformer.verify.mpc.check.check`, level "softmax"):
after layer r the residual stream decodes — :func:`decode_memory`, through :func:`memory_slots`, the
field → words map of the builder's layout — to the protocol's memory after round r, field by field,
for every machine. Depth R = 2L layers (Thm 4.1: O(R)); heads B (up) and B − 1 (down) per
layer; MLP units per layer O(B·2^p) (the word gadgets); the residual keeps every round's words
(width O(R·B·(p + log N))).

Guarantee: in the fixed-point format the builder picks, every head has c <= 1 and satisfies
:meth:`MatchHead.conditions`, so each delivers the sent word exactly, and the MLP steps act on exact
integers: the model computes the protocol exactly. eta is at least ln(4(N + 1)(6 f + 8)) (f the
largest word sum), so in real arithmetic every delivered bit is within 1/(4(6 f + 8)) of exact —
inside the steps' margin: the float64 and float32 exports compute the same words (tested).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.blocks.match import MatchHead
from exactformer.constructions.blocks.readout import SymbolReadout
from exactformer.constructions.blocks.words import WordSum, word_slots
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.core.registry import Claim, NoRows, construction
from exactformer.constructions.core.task import Batch, SymbolsTask, TaskError
from exactformer.constructions.design.precision_search import fewest_bits, smallest_works
from exactformer.constructions.mpc.applications import prefix_sums_adversarial, prefix_sums_truth
from exactformer.constructions.mpc.library import down_route, levels, up_route
from exactformer.precision import Format, parse_format

THEOREM = "P2 Thm 4.1 (MPC simulation), on the push-only prefix-sums protocol"
MAX_N = 1 << 10
MAX_WORD_BITS = 8
MAX_FAN_IN = 8
VERIFY_ALL_N = 32  # verified by running it: the exact executor takes ~0.05 s per input at N = 32


class PrefixSumsError(TaskError):
    """Bad parameters for :func:`prefix_sums` or a bad input."""


class PrefixSumsTask(SymbolsTask):
    """y_i = (x_1 + … + x_i) mod 2^p for N words x_i in [0, 2^p). Tokens: BOS (id 2^p), then the
    words; answers at positions 1..N."""

    ENCODING = {"inputs": [{"name": "x", "type": "N ints in [0, 2^word_bits)"}],
                "tokens": [{"token": "BOS"}, {"for_each": "x", "token": "{}"}]}
    modes = ("exhaustive", "sample")
    noun, domain_param, error = "words", "word_bits", PrefixSumsError

    def symbols(self, model: CompiledModel) -> int:
        return 1 << int(model.task_params["word_bits"])

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        return prefix_sums_truth(np.atleast_2d(x), int(model.task_params["word_bits"]))

    def sample(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        """Uniform words, seeded."""
        rng = np.random.default_rng(seed)
        for lo in range(0, count, 256):
            yield self.batch(model, rng.integers(0, self.symbols(model), size=(min(256, count - lo), model.n)))

    def adversarial(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        """The named inputs of :func:`prefix_sums_adversarial` (wrap-around, travelling carries)."""
        done = 0
        for kind, x in prefix_sums_adversarial(model.n, int(model.task_params["word_bits"]), seed):
            take = x[: max(0, count - done)]
            if take.size:
                yield self.batch(model, take, kind=kind)
                done += len(take)


# ------------------------------------------------------------------------------------------------
# the plan: rounds, slots, the memory map
# ------------------------------------------------------------------------------------------------


def _rounds(n: int, B: int) -> list[tuple[str, int]]:
    """(kind, level) per round, as the protocol orders them: up-1 … up-L, then down at L … 1."""
    L = levels(n, B)
    return [("up", lev) for lev in range(1, L + 1)] + [("down", lev) for lev in range(L, 0, -1)]


def _senders(n: int, B: int, kind: str, lev: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per head of the round: (sends [n] bool, dest [n]) — up: one head per inbox slot σ (the
    senders into slot σ); down: one per child u = 1..B−1. Heads nobody sends in are left out."""
    if kind == "up":
        lead, dest, slot = up_route(n, B, lev)
        heads = [(lead & (slot == s), dest) for s in range(B)]
    else:
        lead, dest = down_route(n, B, lev)
        heads = [(lead[:, u], dest[:, u]) for u in range(B - 1)]
    return [(sends, d) for sends, d in heads if sends.any()]


def _slots_in(kind: str, B: int) -> int:
    return B if kind == "up" else 1


def memory_slots(n: int, B: int) -> list[list[tuple[str, list[str], bool]]]:
    """After layer r (r = 0: the embedding), per memory field of the protocol: (field, the words
    holding it in order, scalar field?). Up-ℓ: x, kids_j = clean inbox of up-j (j < ℓ), inbox;
    down at level ℓ: x, kids_j (j < ℓ), off, inbox."""
    rounds = _rounds(n, B)
    out: list[list[tuple[str, list[str], bool]]] = [[("x", ["x"], True)]]
    for r, (kind, lev) in enumerate(rounds, start=1):
        fields = [("x", ["x"], True)]
        fields += [(f"kids{j}", [f"clean.{j}.{s}" for s in range(B)], False) for j in range(1, lev)]
        if kind == "down":
            fields.append(("off", [_off(r, n, B)], True))
        fields.append(("inbox", [f"clean.{r}.{s}" for s in range(_slots_in(kind, B))], False))
        out.append(fields)
    return out


def _off(r: int, n: int, B: int) -> str:
    """The word holding "off" after round r (a down round): the root's constant after down-1."""
    return "off.start" if r == levels(n, B) + 1 else f"off.{r}"


# ------------------------------------------------------------------------------------------------
# precision and eta
# ------------------------------------------------------------------------------------------------


def _f_max(p: int, B: int) -> int:
    """The largest word sum any step forms: B words (B kids; the offset and B − 1 kids; off' + x)."""
    return max(B, 2) * ((1 << p) - 1)


def real_eta(n: int, p: int, B: int) -> float:
    """ln(4 (N + 1)(6 f + 8)): with eta at least this the attention leaks at most (N + 1) e^-eta
    <= 1/(4 (6 f + 8)) per delivered bit, so every step's argument stays within 1/4 of its exact
    value (module docstring of blocks/words) — the model is right in real arithmetic."""
    return math.log(4 * (n + 1) * (6 * _f_max(p, B) + 8))


def _eta_for(fmt: Format, n: int, p: int, B: int, b: int) -> Fraction | None:
    """The smallest grid eta >= the real-arithmetic eta at which every match head (c <= 1) is exact
    in ``fmt``, with every MLP pre-activation (<= 6 f + 10) in range; None if there is none."""
    if not (fmt.is_exact and fmt.represents(Fraction(1, 2))):
        return None
    if Fraction(fmt.max_value) < 6 * _f_max(p, B) + 10:
        return None
    eta = MatchHead.smallest_eta(fmt)
    if eta is None:
        return None
    S = int(fmt.scale)
    eta = max(eta, Fraction(math.ceil(real_eta(n, p, B) * S), S))
    return eta if MatchHead.conditions(fmt, eta, b, 1)["ok"] else None


@lru_cache(maxsize=64)
def _design(n: int, p: int, B: int, b: int, precision: str | None) -> tuple[Format, Fraction]:
    if precision is None:
        return fewest_bits(lambda f: _eta_for(f, n, p, B, b), max_bits=48, err=PrefixSumsError)
    fmt = parse_format(precision)
    eta = _eta_for(fmt, n, p, B, b) if fmt.is_exact else None
    if eta is None:
        raise PrefixSumsError(f"precision {fmt.name}: no grid eta makes every head exact with the MLP in range "
                              f"(a fixed-point format is needed); "
                              f"{smallest_works(lambda f: _eta_for(f, n, p, B, b), PrefixSumsError)}")
    return fmt, eta


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


def _check(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise PrefixSumsError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return int(v)


def _code(values: np.ndarray, b: int, sends: np.ndarray | None = None) -> np.ndarray:
    """id(v) ∈ {±1}^b (bit t of v, least significant first) per row; 0 where not ``sends``."""
    c = 2 * ((np.asarray(values, dtype=np.int64)[:, None] >> np.arange(b, dtype=np.int64)) & 1) - 1
    return c if sends is None else np.where(sends[:, None], c, 0)


@construction("prefix-sums", task=PrefixSumsTask(), theorem=THEOREM,
              claim=Claim("P2 Thm 4.1 (Sec. 4.1)", "O(R) = 2 ceil(log_B N)", "O(N^((eps'-eps)/4))", "O(N^eps')",
                          "p-bit words", "R rounds, s = N^eps words per machine",
                          "P2 counts heads x embedding dimension; its per-token maps are arbitrary functions (not "
                          "counted): here they are exact ReLU MLPs of O(B^2 2^p) units per layer, in the parameters "
                          "and shown as MLP units beside the width, not in it"),
              sizes=NoRows("prefix-sums", "a library protocol (not in the papers' size claims): its sizes are in "
                                          "docs/mpc.md"),
              example=dict(n=8, word_bits=3), all_max_n=VERIFY_ALL_N,
              small=dict(n=4, word_bits=2))
def prefix_sums(n: int, word_bits: int = 4, fan_in: int = 2, precision: Format | str | None = None) -> CompiledModel:
    """Prefix sums mod 2^p by the push-only B-ary tree protocol, simulated round for round by a
    bidirectional softmax transformer (P2 Thm 4.1; docs/mpc.md "Weights").

    Parameters
    ----------
    n : int in [1, 1024]. N words (machines); answers at positions 1..N (BOS at position 0).
    word_bits : int in [1, 8]. p: words are integers in [0, 2^p); y_i = (x_1 + ... + x_i) mod 2^p.
    fan_in : int in [2, 8]. B, children per tree node: 2 ceil(log_B N) rounds = layers.
    precision : a fixed-point format binary:int=I,frac=F | paper:n=N,kc=K. Default: the fewest-bit
        binary format in which every head is exact (c <= 1 matches) and the MLP stays in range.

    Returns a model on T = N + 1 tokens whose residual stream after layer r decodes to the
    protocol's memory after round r (:func:`decode_memory`).
    """
    n = _check("n", n, 1, MAX_N)
    p = _check("word_bits", word_bits, 1, MAX_WORD_BITS)
    B = _check("fan_in", fan_in, 2, MAX_FAN_IN)
    b = max(2, (n - 1).bit_length())
    fmt, eta = _design(n, p, B, b, None if precision is None else parse_format(precision).name)
    rounds = _rounds(n, B)
    R = len(rounds)
    senders = [_senders(n, B, kind, lev) for kind, lev in rounds]

    lay = Layout()
    words = ["x", "off.start", "y"]
    lay.add("bos", 1)
    lay.add("id", b)
    for r, (kind, lev) in enumerate(rounds, start=1):
        for h in range(len(senders[r - 1])):
            lay.add(f"key.{r}.{h}", b)
            if kind == "down":
                lay.add(f"sends.{r}.{h}", 1)
        if kind == "up" and r > 1:
            lay.add(f"lead.{r}", 1)
        words += [f"in.{r}.{s}" for s in range(_slots_in(kind, B))]
        words += [f"clean.{r}.{s}" for s in range(_slots_in(kind, B))]
        if r > 1 and kind == "up":
            words.append(f"send.{r}")
        if kind == "down":
            words += [f"send.{r}.{h}" for h in range(len(senders[r - 1]))]
            if _off(r, n, B) != "off.start":
                words.append(_off(r, n, B))
    for w in words:
        ok, bits = word_slots(w)
        lay.add(ok, 1)
        lay.add(bits, p)

    D = 1 << p
    mb = ModelBuilder(lay, n_layers=R, d_vocab=D + 1, n_ctx=n + 1)
    values = np.arange(D, dtype=np.int64)
    mb.token_rows(values, "x.ok", np.ones((D, 1), dtype=np.int64))
    mb.token_rows(values, "x.bits", (values[:, None] >> np.arange(p)) & 1)
    mb.token_rows([D], "bos", np.array([[1]]))
    machines = np.arange(1, n + 1)
    ids = np.arange(n, dtype=np.int64)
    mb.position_rows(machines, "id", _code(ids, b))
    mb.position_rows([1], "off.start.ok", np.array([[1]]))  # the root's offset: 0
    for r, ((kind, lev), heads) in enumerate(zip(rounds, senders), start=1):
        for h, (sends, dest) in enumerate(heads):
            mb.position_rows(machines, f"key.{r}.{h}", _code(np.maximum(dest, 0), b, sends))
            if kind == "down":
                mb.position_rows(machines, f"sends.{r}.{h}", sends[:, None].astype(np.int64))
        if kind == "up" and r > 1:
            mb.position_rows(machines, f"lead.{r}", up_route(n, B, lev)[0][:, None].astype(np.int64))

    for r, (kind, lev) in enumerate(rounds, start=1):
        layer = r - 1
        # round r's messages: the sent word of each head into its inbox slot
        for h, (sends, dest) in enumerate(senders[r - 1]):
            if kind == "up":
                sent, slot = ("x" if r == 1 else f"send.{r}"), _up_slot(n, B, lev, sends)
            else:
                sent, slot = f"send.{r}.{h}", 0
            MatchHead("id", f"key.{r}.{h}", "bos", word_slots(sent), word_slots(f"in.{r}.{slot}"), eta).emit(mb, layer)
        delivered = _delivered(n, B, kind, lev, senders[r - 1])
        for s in delivered:  # the inbox, exact: memory field "inbox" (later "kids")
            WordSum(f"clean.{r}.{s}", (f"in.{r}.{s}",), (f"in.{r}.{s}.ok",)).emit(mb, layer)
        # round r + 1's local step, or after the last round the output
        got = f"in.{r}.0"
        if r == R:
            WordSum("y", (got, "x"), (f"{got}.ok",)).emit(mb, layer)
            WordSum("y", (_off(r, n, B), "x"), (f"!{got}.ok",)).emit(mb, layer)
            continue
        nkind, nlev = rounds[r]
        if nkind == "up":  # the level-lev block sum, sent by the level-lev leaders
            WordSum(f"send.{r + 1}", tuple(f"in.{r}.{s}" for s in delivered), (f"lead.{r + 1}",)).emit(mb, layer)
            continue
        # a down round at level nlev: its kids are the inbox of up-nlev (still approximate when that
        # was round r; exact words otherwise) and its senders' offset off' (select: got, else the old)
        kids = {s: (f"in.{r}.{s}" if kind == "up" else f"clean.{nlev}.{s}")
                for s in _delivered(n, B, "up", nlev, senders[nlev - 1])}
        for h, head in enumerate(senders[r]):
            before = tuple(kids[s] for s in range(_down_child(head, B, nlev)) if s in kids)
            gate = f"sends.{r + 1}.{h}"
            if kind == "up":  # the first down round: the sender is the root, offset 0
                WordSum(f"send.{r + 1}.{h}", before, (gate,)).emit(mb, layer)
            else:
                old = _off(r, n, B)
                WordSum(f"send.{r + 1}.{h}", (got,) + before, (f"{got}.ok", gate)).emit(mb, layer)
                WordSum(f"send.{r + 1}.{h}", (old,) + before, (f"!{got}.ok", gate)).emit(mb, layer)
        if kind == "down":
            old, new = _off(r, n, B), _off(r + 1, n, B)
            WordSum(new, (got,), (f"{got}.ok",)).emit(mb, layer)
            WordSum(new, (old,), (f"!{got}.ok", f"{old}.ok")).emit(mb, layer)
    SymbolReadout("y.bits", D).emit(mb)
    model = mb.build(
        answers=list(range(D)), vocab=[str(v) for v in range(D)] + ["BOS"], construction="prefix-sums",
        theorem=THEOREM, n=n, precision=fmt.name, answer_positions=tuple(range(1, n + 1)),
        task_params={"n": n, "word_bits": p, "fan_in": B},
        params={
            "word_bits": Param(p, "p: bits per word"),
            "fan_in": Param(B, "B: children per tree node"),
            "rounds": Param(R, "2 ceil(log_B N): one layer per protocol round (P2 Thm 4.1)"),
            "b": Param(b, "id code bits max(2, ceil(log2 N))"),
            "eta": Param(eta, "smallest grid eta >= ln(4(N+1)(6f+8)) (f = B(2^p - 1)) with round(e^-eta S) = 0"),
            "precision": Param(fmt.name, "fewest-bit binary format in which every head is exact and the MLP in range"
                               if precision is None else "given"),
            "precision_bits": Param(fmt.bits, "bits of one number in the format"),
            "arithmetics": Param([fmt.name, "real", "float64", "float32"],
                                 "fixed point: exact (c <= 1 per head); reals and floats: eta keeps every step "
                                 "within its margin (the builder's argument, not a certificate: it is verified by "
                                 "running it)"),
        })
    return model


def _up_slot(n: int, B: int, lev: int, sends: np.ndarray) -> int:
    """The inbox slot a head of round up-``lev`` delivers into (the slot of its senders)."""
    _, _, slot = up_route(n, B, lev)
    return int(slot[np.argmax(sends)])


def _down_child(head: tuple[np.ndarray, np.ndarray], B: int, lev: int) -> int:
    """u: the child index a head of the down round at ``lev`` sends to."""
    sends, dest = head
    i = int(np.argmax(sends))
    return int((dest[i] - i) // B ** (lev - 1))


def _delivered(n: int, B: int, kind: str, lev: int, heads: list[tuple[np.ndarray, np.ndarray]]) -> tuple[int, ...]:
    """The inbox slots some head of the round writes."""
    if kind == "down":
        return (0,) if heads else ()
    return tuple(sorted({_up_slot(n, B, lev, sends) for sends, _ in heads}))


NOT_A_WORD = -2  # a decoded word whose columns are not exact bits (see decode_memory)


def decode_memory(model: CompiledModel, resid: np.ndarray, scale: int, r: int) -> dict[str, np.ndarray]:
    """The protocol memory that the residual stream after layer r holds (r = 0: the embedding).

    ``resid``: raw residual values [B, N, d_model] at the machines' positions 1..N in a fixed-point
    format of scale ``scale`` (raw = value · scale). A word reads as its value where ``ok`` is 1 and
    every bit 0 or 1, ⊥ (−1) where all its columns are 0, and :data:`NOT_A_WORD` otherwise (the
    invariant then fails there). Fields as the protocol's memory: [B, N] or [B, N, words]."""
    resid = np.asarray(resid)
    out: dict[str, np.ndarray] = {}
    for field, names, scalar in memory_slots(model.n, int(model.task_params["fan_in"]))[r]:
        vals = []
        for w in names:
            (ok_at, _), (bits_at, p) = (model.layout[s] for s in word_slots(w))
            ok = resid[..., ok_at]
            bits = resid[..., bits_at:bits_at + p]
            exact = np.all((bits == 0) | (bits == scale), axis=-1)
            value = ((bits == scale) * (1 << np.arange(bits.shape[-1], dtype=np.int64))).sum(axis=-1)
            vals.append(np.where(exact & (ok == scale), value,
                                 np.where(exact & (ok == 0) & (value == 0), -1, NOT_A_WORD)))
        out[field] = vals[0] if scalar else np.stack(vals, axis=-1)
    return out
