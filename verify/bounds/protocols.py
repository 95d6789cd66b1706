"""The lower bounds' communication protocols, run on built models (P1 Thm 4, App. D; Thm 2, Sec. 3).

P1 turns a model into a protocol between Alice and Bob, who hold complementary parts of the input,
and a lower bound on the communication of the task into a lower bound on the model's size. Here the
protocols run: each party computes only from its own positions and the messages it receives, every
message is an integer of a width fixed in advance (so the messages' length is the same on every
input), and the result is compared with the executor's.

* :func:`one_layer_protocol` (Thm 4): a one-layer transformer, any split of the positions. For each
  answer position a (held by one party) and each head, following the proof of Thm 4 (App. D):
  the holder of a sends its token (step 1: both then know x_a and the query q = x_a W_Q + b_Q; the
  paper sends x_a, d p bits); each party sends the largest logit among its positions (step 2),
  then its part of the softmax normaliser Z = sum_i exp(s_i - M) (step 3) and its part of the
  attention output sum_i round(w_i v_i) (step 4). Every sum is exact, so the two parts add up to
  what the format's softmax and matmul compute over all positions (each saturates once, at the
  end): the protocol's logits equal the executor's bit for bit.
* :func:`recurrent_protocol` (Thm 2): a recurrent model, a prefix/suffix split. Alice runs the model
  over her prefix and sends the hidden state, m units of p bits (one way); Bob continues over his
  suffix and reads the answers (all of them in his part).

The widths: a token ceil(log2 d_vocab) bits; a raw value of the format p = ``fmt.bits`` bits; a part
of Z over c positions ceil(log2(c e_max + 1)) bits (e_max = exp(0) in the format); a part of an
attention output over c positions ceil(log2(2 c v_max + 1)) bits per entry (v_max the format's
largest magnitude).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.constructions.core.ir import CompiledModel
from exactformer.constructions.core.recurrent import RNNModel
from exactformer.precision import Format, parse_format
from exactformer.verify.executor.exact import decode_logits
from exactformer.verify.executor.recurrent import Weights, step


class ProtocolError(ValueError):
    """A model or a split a protocol does not apply to (the message names the parameter)."""


@dataclass(frozen=True)
class Message:
    """One message: who sends it, what it is, its width in bits and the integers it carries."""

    sender: str
    what: str
    bits: int
    value: Any


@dataclass
class ProtocolRun:
    """A run: the answers (one per answer position, None on a tie), the raw logits [A, V], and the
    messages exchanged."""

    answers: list[Any]
    logits: np.ndarray
    messages: list[Message] = field(default_factory=list)

    @property
    def bits(self) -> int:
        """The messages' length in bits (the same on every input)."""
        return sum(m.bits for m in self.messages)


def _width(count: int) -> int:
    """Bits of an integer in [0, count]."""
    return max(1, math.ceil(math.log2(count + 1)))


def _signed_width(bound: int) -> int:
    """Bits of an integer in [-bound, bound]."""
    return _width(2 * bound)


def _format(model: Any, fmt: Format | str | None) -> Format:
    f = parse_format(fmt if fmt is not None else model.precision)
    if not f.is_exact:
        raise ProtocolError(f"fmt: a fixed-point format (the protocols exchange exact raw values), got {f.name}")
    return f


# ------------------------------------------------------------------------------------------------
# Thm 4: one-layer transformers, any partition of the positions
# ------------------------------------------------------------------------------------------------


def one_layer_protocol(model: CompiledModel, tokens: np.ndarray, alice: np.ndarray, fmt: Format | str | None = None
                       ) -> ProtocolRun:
    """P1 Thm 4's protocol (module docstring) on one input ``tokens`` [T]: Alice holds the positions
    where ``alice`` [T] (bool) is True, Bob the others. ``fmt``: the model's format by default."""
    if model.n_layers != 1:
        raise ProtocolError(f"model: Thm 4 is about one-layer transformers; {model.construction} has {model.n_layers} layers")
    if model.vector_input is not None:
        raise ProtocolError(f"model: {model.construction} reads input vectors; the protocol exchanges tokens")
    fmt = _format(model, fmt)
    tokens = np.asarray(tokens, dtype=np.int64)
    alice = np.asarray(alice, dtype=bool)
    T = tokens.size
    if tokens.ndim != 1 or alice.shape != (T,):
        raise ProtocolError(f"alice: a boolean mask of the {T} positions, got shape {alice.shape}")
    blk = model.blocks[0]
    a, m = blk.attn, blk.mlp
    W = {k: getattr(a, k).raw(fmt) for k in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")}
    W |= {k: getattr(m, k).raw(fmt) for k in ("W_in", "b_in", "W_out", "b_out")}
    x = np.asarray(fmt.add(model.embed.raw(tokens, fmt), model.pos_embed.raw(np.arange(T), fmt)))  # each party its own rows
    e_max = min(int(fmt.scale), int(fmt.max_raw))
    v_max = max(-int(fmt.min_raw), int(fmt.max_raw))
    parties = {"Alice": np.flatnonzero(alice), "Bob": np.flatnonzero(~alice)}
    messages: list[Message] = []
    rows = []
    for pos in model.answer_positions_for(T):
        holder = "Alice" if alice[pos] else "Bob"
        messages.append(Message(holder, f"token at position {pos} (step 1)", _width(model.d_vocab - 1), int(tokens[pos])))
        xa = x[pos]  # both know it now
        attended = {p: idx[idx <= pos] if a.causal else idx for p, idx in parties.items()}
        z = []
        for h in range(a.n_heads):
            q = np.asarray(fmt.add(fmt.matmul(xa, W["W_Q"][h]), W["b_Q"][h]))
            scores, values = {}, {}
            for p, idx in attended.items():
                k = np.asarray(fmt.add(fmt.matmul(x[idx], W["W_K"][h]), W["b_K"][h]))
                values[p] = np.asarray(fmt.add(fmt.matmul(x[idx], W["W_V"][h]), W["b_V"][h]))
                scores[p] = np.asarray(fmt.matmul(k, q)) if idx.size else np.zeros(0, np.int64)
            local_max = {p: int(s.max()) if s.size else int(fmt.min_raw) for p, s in scores.items()}
            messages += [Message(p, f"head {h}: largest logit (step 2)", fmt.bits, v) for p, v in local_max.items()]
            M = max(local_max.values())
            e = {p: np.asarray(fmt.exp(fmt.sub(s, M))) if s.size else np.zeros(0, np.int64) for p, s in scores.items()}
            parts = {p: int(np.sum(v, dtype=object)) for p, v in e.items()}
            messages += [Message(p, f"head {h}: part of Z (step 3)", _width(attended[p].size * e_max), v)
                         for p, v in parts.items()]
            Z = min(sum(parts.values()), int(fmt.max_raw))
            out = {}
            for p, ep in e.items():
                w = np.asarray(fmt.div(ep, np.full_like(ep, Z))) if ep.size else ep
                out[p] = (np.sum(np.asarray(fmt.mul(w[:, None], values[p])).astype(object), axis=0)
                          if ep.size else np.zeros(a.d_head, dtype=object))
                messages.append(Message(p, f"head {h}: part of the attention output (step 4)",
                                        a.d_head * _signed_width(attended[p].size * v_max), [int(v) for v in out[p]]))
            z.append(np.clip(np.array(sum(out.values()), dtype=object).astype(np.int64), fmt.min_raw, fmt.max_raw))
        z_cat = np.concatenate(z)
        attn_out = np.asarray(fmt.add(fmt.matmul(z_cat, W["W_O"].reshape(-1, model.d_model)), W["b_O"]))
        xm = np.asarray(fmt.add(xa, attn_out))
        hidden = np.asarray(fmt.relu(fmt.add(fmt.matmul(xm, W["W_in"]), W["b_in"])))
        xo = np.asarray(fmt.add(xm, fmt.add(fmt.matmul(hidden, W["W_out"]), W["b_out"])))
        rows.append(np.asarray(fmt.add(fmt.matmul(xo, model.W_U.raw(fmt)), model.b_U.raw(fmt))))
    logits = np.stack(rows)[None]
    answers, _ = decode_logits(model, logits)
    return ProtocolRun(answers[0], logits[0], messages)


# ------------------------------------------------------------------------------------------------
# Thm 2: recurrent models, one way over a prefix/suffix split
# ------------------------------------------------------------------------------------------------


def recurrent_protocol(model: RNNModel, tokens: np.ndarray, split: int, fmt: Format | str | None = None) -> ProtocolRun:
    """P1 Thm 2's one-way protocol (module docstring) on one input ``tokens`` [T]: Alice holds
    positions ``0 .. split - 1``, Bob the rest, and every answer position is Bob's."""
    fmt = _format(model, fmt)
    tokens = np.asarray(tokens, dtype=np.int64)
    T = tokens.size
    pos = model.answer_positions_for(T)
    if not 0 <= split <= int(pos.min()):
        raise ProtocolError(f"split: an integer in [0, {int(pos.min())}] (Bob must hold every answer position), "
                            f"got {split}")
    w = Weights(model, fmt)
    h = np.asarray(w.h0)[None]
    for t in range(split):  # Alice
        h = step(w, h, tokens[t : t + 1])
    message = Message("Alice", f"the hidden state after position {split - 1} (m = {model.hidden} units)",
                      model.state_bits(fmt.bits), [int(v) for v in h[0]])
    rows = []
    for t in range(split, T):  # Bob, from the message alone
        h = step(w, h, tokens[t : t + 1])
        if t in pos:
            rows.append(w.readout(h)[0])
    logits = np.stack(rows)[None]
    answers, _ = decode_logits(model, logits)
    return ProtocolRun(answers[0], logits[0], [message])


def distinct_messages(model: RNNModel, prefixes: np.ndarray, fmt: Format | str | None = None) -> int:
    """How many different hidden states Alice can send after the prefixes [B, split] (every one of
    them: log2 of this is what Thm 2's message must be able to tell apart)."""
    fmt = _format(model, fmt)
    w = Weights(model, fmt)
    h = np.broadcast_to(np.asarray(w.h0), (len(prefixes), model.hidden))
    for t in range(np.shape(prefixes)[1]):
        h = step(w, h, np.asarray(prefixes)[:, t])
    return len({row.tobytes() for row in np.ascontiguousarray(h)})
