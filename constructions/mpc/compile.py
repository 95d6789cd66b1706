"""The Thm 4.1 compiler (P2): an R-round protocol becomes an R-layer EMA program, round r ↦ layer r.

Layer r's ``pre`` is round r's ``step`` (local computation; its operations are kept as transient
``@``-fields of the state), its heads deliver the round's communication, and its ``post`` decodes the
head outputs into exactly the fields the MPC executor delivers (inbox, table results) and drops the
transient fields. Hence the **simulation invariant**: after layer r the program's state equals the
protocol's memory after round r, field by field, for every machine — checked by
:mod:`exactformer.verify.mpc.check` on every verified input.

Heads of layer r (docs/mpc.md, "Compilation"; exactformer's slot-addressed messages replace the
averaging code of Sanford, Hsu, Telgarsky (ICML 2024) that P2's proof sketch of Thm 4.1 uses):

* **send heads** h = 0 … α_r − 1. Let d_{i,h} be the h-th smallest distinct destination of machine
  i (none if it has fewer). key_i = (d_{i,h}); query_j = (j) — every machine asks for messages to
  itself in every send head; value_i = 2·s_in words: for each inbox slot σ the pair (1, w) if i sends
  w into slot σ of d_{i,h}, else (0, 0). Receiver j averages the c senders whose h-th destination is
  j; slots are unique per receiver, so every pair has at most one contributor and its word is
  recovered exactly as out[2σ+1] / out[2σ] (ideal: (w/c)/(1/c); fixed point: (ŵ w)/ŵ). c <= s_in.
* **table heads** (T, u), u < λ_T: key_i = i's record key (its machine id for a positional table;
  none if it does not publish), value_i = (1, record words), query_j = j's u-th lookup key.
  ``unique`` (c <= 1): the words are out[1:] / out[0]; ``exists``: out[0] > 0.

Resources (:func:`resources`, docs/mpc.md): layers = R; heads in layer r = α_r + Σ_T λ_T; key width
1 (send) or κ_T; value width 2·s_in (send) or 1 + w_T; residual width s + Σ_h value widths (memory
plus the layer's head outputs: Q, K, V and the local computation are element-wise maps of the
memory, Def. 2.2); precision: int bits p and frac bits ⌈log₂ c_max⌉ with c_max = max(s_in, the
tables' declared match bounds). The report prints P2's bounds beside them: L = O(R),
H = O(N^{(ε′−ε)/4}), m = O(N^{ε′}) with s = N^ε.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from exactformer.constructions.mpc.program import EMAProgram, Head, HeadOut, Layer, State
from exactformer.constructions.mpc.protocol import Protocol, ProtocolError, Round, Table, present_rows

DEST, KEYS, MSGS, BOUNDS = "@send.dest", "@send.keys", "@send.msgs", "@send.bounds"


def _key(t: Table) -> str:
    return f"@pub.{t.name}.key"


def _words(t: Table) -> str:
    return f"@pub.{t.name}.words"


def _look(t: Table) -> str:
    return f"@look.{t.name}"


def _as3(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.int64)
    return a[..., None] if a.ndim == 2 else a


def _dest_ranks(dest: np.ndarray) -> np.ndarray:
    """For messages [B, n, m]: the rank of each message's destination among its sender's distinct
    destinations in increasing order (−1 for no message)."""
    order = np.argsort(dest, axis=-1, kind="stable")
    sd = np.take_along_axis(dest, order, axis=-1)
    new = sd >= 0
    new[..., 1:] &= sd[..., 1:] != sd[..., :-1]
    rank = np.empty_like(dest)
    np.put_along_axis(rank, order, np.cumsum(new, axis=-1) - 1, axis=-1)
    return np.where(dest >= 0, rank, -1)


def _by_head(dest: np.ndarray, slot: np.ndarray, word: np.ndarray, heads: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The send heads' inputs: keys [B, n, heads] (d_{i,h}, −1 if none), the messages as columns
    (input, sender, slot, word) ordered by head, and each head's column range (bounds[h]:bounds[h+1]).
    Messages beyond ``heads`` destinations (a protocol the MPC executor rejects) are dropped."""
    rank = _dest_ranks(dest)
    b, i, m = np.nonzero((rank >= 0) & (rank < heads))
    h = rank[b, i, m]
    keys = np.full(dest.shape[:2] + (heads,), -1, dtype=np.int64)
    keys[b, i, h] = dest[b, i, m]
    order = np.argsort(h, kind="stable")
    msgs = np.stack([b, i, slot[b, i, m], word[b, i, m]])[:, order]
    return keys, msgs, np.searchsorted(h[order], np.arange(heads + 1))


def _pre(rnd: Round, n: int):
    """Layer pre-map: the round's step, with its operations stored as transient fields."""
    def pre(state: State) -> State:
        ids = np.arange(n, dtype=np.int64)[None, :]
        st = rnd.step(state)
        new = dict(st.memory)
        some = next(iter(state.values()))
        B = some.shape[0]
        if rnd.slots:
            if st.send is None:
                dest = np.full((B, n, 1), -1, dtype=np.int64)
                slot = word = np.zeros((B, n, 1), dtype=np.int64)
            else:
                dest, slot, word = (_as3(a) for a in (st.send.dest, st.send.slot, st.send.word))
            new[DEST] = dest
            new[KEYS], new[MSGS], new[BOUNDS] = _by_head(dest, slot, word, rnd.sends)
        for t in rnd.tables:
            kappa = max(1, t.key_words)
            pub = st.publish.get(t.name)
            if pub is None:
                key = np.full((B, n, kappa), -1, dtype=np.int64)
            else:
                key = np.broadcast_to(ids, (B, n))[..., None] if t.positional else _as3(pub.key)
                present = present_rows(key)
                if pub.present is not None:
                    present = present & np.asarray(pub.present, dtype=bool)
                key = np.where(present[..., None], key, -1)
            new[_key(t)] = key
            if t.kind == "unique":
                new[_words(t)] = _as3(pub.words) if pub is not None else np.full((B, n, t.value_words), -1, np.int64)
            look = st.lookup.get(t.name)
            if look is None:
                q = np.full((B, n, t.lookups, kappa), -1, dtype=np.int64)
            else:
                q = np.asarray(look, dtype=np.int64)
                q = q.reshape(B, n, t.lookups, kappa)
            new[_look(t)] = q
        return new

    return pre


def _send_head(h: int, slots: int, n: int) -> Head:
    def query(state: State) -> np.ndarray:
        return np.broadcast_to(np.arange(n, dtype=np.int64)[None, :, None], state[DEST].shape[:2] + (1,))

    def key(state: State) -> np.ndarray:
        return state[KEYS][..., h:h + 1]

    def value(state: State) -> np.ndarray:
        b, i, sl, w = state[MSGS][:, state[BOUNDS][h]:state[BOUNDS][h + 1]]
        val = np.zeros(state[DEST].shape[:2] + (2 * slots,), dtype=np.int64)
        val[b, i, 2 * sl] = 1
        val[b, i, 2 * sl + 1] = w
        return val

    return Head(f"send-{h}", query, key, value, 1, 2 * slots, min(n, slots))


def _table_head(t: Table, u: int, n: int) -> Head:
    def query(state: State) -> np.ndarray:
        return state[_look(t)][:, :, u, :]

    def key(state: State) -> np.ndarray:
        return state[_key(t)]

    def value(state: State) -> np.ndarray:
        k = state[_key(t)]
        one = np.ones(k.shape[:2] + (1,), dtype=np.int64)
        return np.concatenate([one, state[_words(t)]], axis=-1) if t.kind == "unique" else one

    return Head(f"{t.name}[{u}]", query, key, value, max(1, t.key_words), 1 + t.value_words, t.matches_bound(n))


def _post(rnd: Round, n_send: int):
    def post(state: State, outs: tuple[HeadOut, ...]) -> State:
        new = {k: v for k, v in state.items() if not k.startswith("@")}
        if rnd.slots:
            inbox = np.full(state[DEST].shape[:2] + (rnd.slots,), -1, dtype=np.int64)
            for out in outs[:n_send]:
                got = out.pairs()
                inbox = np.where(got >= 0, got, inbox)
            new[rnd.inbox] = inbox
        k = n_send
        for t in rnd.tables:
            asked = present_rows(state[_look(t)])  # [B, n, λ]
            res = []
            for u in range(t.lookups):
                out = outs[k + u]
                if t.kind == "unique":
                    res.append(out.word(slice(1, 1 + t.value_words)))
                else:
                    res.append(np.where(asked[..., u], out.present().astype(np.int64), -1)[..., None])
            new[t.into] = np.concatenate(res, axis=-1)
            k += t.lookups
        return new

    return post


def compile_protocol(protocol: Protocol) -> EMAProgram:
    """The EMA program of ``protocol`` (one layer per round; see the module docstring). The program
    has one token per machine, so the protocol must have P = n machines."""
    n = protocol.n
    if protocol.n_machines != n:
        raise ProtocolError(f"compile_protocol: the protocol has P = {protocol.n_machines} machines for n = {n} "
                            "input words; Thm 4.1's program has one token per machine (P = n)")
    layers = []
    for rnd in protocol.rounds:
        heads = [_send_head(h, rnd.slots, n) for h in range(rnd.sends)]
        heads += [_table_head(t, u, n) for t in rnd.tables for u in range(t.lookups)]
        layers.append(Layer(rnd.name, _pre(rnd, n), tuple(heads), _post(rnd, rnd.sends)))
    return EMAProgram(protocol.name, n, protocol.word_bits, protocol.init, tuple(layers), protocol.output,
                      dict(protocol.params))


# ------------------------------------------------------------------------------------------------
# resources, beside P2's bounds
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerResources:
    name: str
    heads: int
    send_heads: int
    table_heads: int
    key_words: int  # widest key of the layer
    value_words: int  # widest value of the layer
    output_words: int  # Σ_h value widths
    max_matches: int
    pull: bool  # True: the round reads tables (an EMA round, not a Def-2.3 round)


@dataclass(frozen=True)
class ResourceReport:
    """Sizes of the compiled program and P2 Thm 4.1's bounds for them.

    ``m`` is the widest per-head query/key/value (Def. 2.1's embedding dimension); ``residual`` =
    s + max_r Σ_h value widths (words); ``eps`` = log_N s; ``eps_prime_needed`` = the smallest ε′
    with H <= N^{(ε′−ε)/4} and m <= N^{ε′} (Thm 4.1's hidden constants set to 1)."""

    name: str
    n: int
    rounds: int
    layers: int
    heads: tuple[int, ...]
    max_heads: int
    key_words: int
    value_words: int
    m: int
    residual: int
    word_bits: int
    memory: int
    max_matches: int
    min_format: str
    is_mpc: bool
    per_layer: tuple[LayerResources, ...] = field(repr=False, default=())

    def _log(self, x: float) -> float:
        return math.log(x) / math.log(self.n) if self.n > 1 and x > 0 else float("nan")

    @property
    def eps(self) -> float:
        return self._log(self.memory)

    @property
    def eps_prime_needed(self) -> float:
        return max(self._log(self.m), self.eps + 4 * self._log(max(1, self.max_heads)))

    def rows(self) -> list[tuple[str, str, str]]:
        """(quantity, built, P2 Thm 4.1) rows for a table."""
        N = "N"
        return [
            ("layers L", f"{self.layers} (R = {self.rounds} rounds)", "O(R)"),
            ("heads per layer H", f"max {self.max_heads} = {N}^{self._log(max(1, self.max_heads)):.3f}",
             "O(N^{(ε′−ε)/4})"),
            ("embedding dim. per head m", f"{self.m} = {N}^{self._log(self.m):.3f} (key {self.key_words}, "
                                          f"value {self.value_words} words)", "O(N^{ε′})"),
            ("local memory s", f"{self.memory} = {N}^{self.eps:.3f} (ε)", "O(N^ε)"),
            ("ε′ needed (constants 1)", f"{self.eps_prime_needed:.3f}", "ε < ε′ < 1"),
            ("residual width", f"{self.residual} words", "—"),
            ("precision", f"words of p = {self.word_bits} bits; fixed point {self.min_format} "
                          f"(S >= c_max = {self.max_matches})", "p = Θ(log N)"),
            ("protocol", "MPC (push only, Def. 2.3)" if self.is_mpc else "EMA protocol (keyed reads)", "MPC"),
        ]


def resources(protocol: Protocol) -> ResourceReport:
    """The compiled program's sizes, from the protocol's declarations alone (nothing runs)."""
    program = compile_protocol(protocol)
    per = []
    for rnd, layer in zip(protocol.rounds, program.layers):
        hs = layer.heads
        per.append(LayerResources(rnd.name, len(hs), rnd.sends, len(hs) - rnd.sends,
                                  max((h.key_words for h in hs), default=0), max((h.value_words for h in hs), default=0),
                                  sum(h.value_words for h in hs), max((h.max_matches for h in hs), default=1),
                                  bool(rnd.tables)))
    kw = max((x.key_words for x in per), default=0)
    vw = max((x.value_words for x in per), default=0)
    return ResourceReport(
        protocol.name, protocol.n, len(protocol.rounds), len(per), tuple(x.heads for x in per),
        max((x.heads for x in per), default=0), kw, vw, max(kw, vw),
        protocol.memory + max((x.output_words for x in per), default=0), protocol.word_bits, protocol.memory,
        program.max_matches, program.min_format().name, protocol.is_mpc, tuple(per))
