"""The MPC executor (level L1): runs a :class:`~exactformer.constructions.mpc.protocol.Protocol` on a batch
of inputs by direct message delivery, checking every resource of every round.

Delivery here is the plain data-structure semantics of P2 Def. 2.3 (messages written into inbox
slots; table reads resolved by sorting the published keys) — independent of the EMA program the
compiler makes of the same protocol (:mod:`exactformer.verify.mpc.program_run`), which is what makes the
round-by-round comparison of the two (:mod:`exactformer.verify.mpc.check`) a real check.

The first violation of a limit raises :class:`MPCError` naming the round, the machine (and the input
of the batch) and the limit; the limits are listed in :mod:`exactformer.constructions.mpc.protocol`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from exactformer.constructions.mpc.protocol import (
    RESERVED_PREFIX,
    Memory,
    Protocol,
    Publish,
    Round,
    Send,
    Step,
    Table,
    present_rows,
)

INIT = "init"


class MPCError(ValueError):
    """A protocol broke a rule or a resource limit. ``round`` is 1-based (0: ``init``); ``machine``
    and ``input`` (index in the batch) are None when the error concerns no single machine."""

    def __init__(self, protocol: str, round: int, round_name: str, limit: str, detail: str,
                 machine: int | None = None, input: int | None = None):
        self.protocol, self.round, self.round_name = protocol, round, round_name
        self.limit, self.detail, self.machine, self.input = limit, detail, machine, input
        where = f"protocol {protocol!r}, round {round} ({round_name!r})"
        if machine is not None:
            where += f", machine {machine}"
        if input is not None:
            where += f", input {input}"
        super().__init__(f"{where}: {detail} [limit: {limit}]")


class InputError(ValueError):
    """Inputs that are not a batch of n words in [0, 2^p)."""


@dataclass
class RoundUsage:
    """The largest use of each resource over all machines and inputs of one round."""

    round: int
    name: str
    memory: int = 0  # words held after the round
    sent: int = 0
    received: int = 0
    destinations: int = 0  # distinct destinations of one machine
    senders: int = 0  # distinct senders into one machine
    matches: dict[str, int] = field(default_factory=dict)  # table -> most publishers matching one lookup


@dataclass
class RoundState:
    """The memory of every machine after round ``round`` (0: after ``init``)."""

    round: int
    name: str
    memory: Memory
    usage: RoundUsage


@dataclass
class MPCResult:
    outputs: np.ndarray  # [B, n] int64, -1 = ⊥
    usage: list[RoundUsage]


def check_inputs(protocol: Protocol, inputs) -> np.ndarray:
    """``inputs`` as an int64 array [B, n] of words in [0, 2^p) (a 1-D input is a batch of one)."""
    x = np.asarray(inputs)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != protocol.n or x.shape[0] < 1:
        raise InputError(f"inputs must have shape [B, {protocol.n}] (B >= 1), got {list(x.shape)}")
    if x.dtype.kind not in "iu":
        raise InputError(f"inputs must be integers, got dtype {x.dtype}")
    x = x.astype(np.int64)
    bad = (x < 0) | (x >= protocol.word_limit)
    if bad.any():
        b, i = np.argwhere(bad)[0]
        raise InputError(f"inputs[{b}, {i}] = {x[b, i]} is not a word in [0, 2^{protocol.word_bits})")
    return x


def _first(mask: np.ndarray) -> tuple[int, int]:
    b, i = np.argwhere(mask)[0][:2]
    return int(b), int(i)


class _Checker:
    """Raises :class:`MPCError` for one protocol and round."""

    def __init__(self, protocol: Protocol, r: int, name: str):
        self.p, self.r, self.name = protocol, r, name

    def fail(self, limit: str, detail: str, at: tuple[int, int] | None = None) -> None:
        machine, inp = (at[1], at[0]) if at is not None else (None, None)
        raise MPCError(self.p.name, self.r, self.name, limit, detail, machine, inp)

    def array(self, a, what: str, B: int, ndims: tuple[int, ...], dims: dict[int, int] | None = None) -> np.ndarray:
        """An int64 array [B, n, ...] with ndim in ``ndims`` and fixed sizes ``dims`` (axis -> size)."""
        if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu":
            self.fail("int arrays", f"{what} must be a numpy integer array, got {type(a).__name__}"
                      + (f" of dtype {a.dtype}" if isinstance(a, np.ndarray) else ""))
        P = self.p.n_machines
        if a.ndim not in ndims or a.shape[:2] != (B, P) or any(a.shape[k] != v for k, v in (dims or {}).items()):
            self.fail("shapes", f"{what} has shape {list(a.shape)}; expected [B={B}, P={P}, ...] "
                                f"with {' or '.join(str(d) for d in ndims)} dimensions"
                                + (f" and sizes {dims}" if dims else ""))
        return a.astype(np.int64, copy=False)

    def words(self, a: np.ndarray, what: str, allow_empty: bool) -> None:
        lo = -1 if allow_empty else 0
        bad = (a < lo) | (a >= self.p.word_limit)
        if bad.any():
            idx = tuple(int(v) for v in np.argwhere(bad)[0])
            v = int(a[idx])
            rng = f"[{lo}, 2^{self.p.word_bits})" + ("" if allow_empty else " (no ⊥ here)")
            self.fail(f"words in {rng}", f"{what} holds {v}" + (f" >= 2^{self.p.word_bits}" if v >= 0 else ""),
                      idx[:2])

    def at_most(self, count: np.ndarray, bound: int, limit: str, what: str) -> None:
        over = count > bound
        if over.any():
            at = _first(over)
            self.fail(limit, f"{what} {int(count[at])} > {bound}", at)


def _words(a: np.ndarray) -> np.ndarray:
    """Words held per machine [B, n] (entries >= 0) of a field [B, n] or [B, n, w]."""
    ok = a >= 0
    return ok.astype(np.int64) if ok.ndim == 2 else ok.sum(axis=tuple(range(2, ok.ndim)))


def _check_memory(chk: _Checker, mem, B: int, reserved: tuple[str, ...] = ()) -> Memory:
    if not isinstance(mem, dict):
        chk.fail("memory is a dict", f"memory must be a dict field -> array, got {type(mem).__name__}")
    out = {}
    for k, v in mem.items():
        if not isinstance(k, str) or not k or k.startswith(RESERVED_PREFIX):
            chk.fail("field names", f"field name {k!r} must be a non-empty string not starting with {RESERVED_PREFIX!r}")
        if k in reserved:
            chk.fail("field names", f"field {k!r} is delivered by this round (inbox or table results); "
                                    f"the step's memory must not hold it")
        a = chk.array(v, f"field {k!r}", B, (2, 3))
        chk.words(a, f"field {k!r}", allow_empty=True)
        out[k] = a
    return out


def _distinct_per_row(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows [B, n, m] of entries (>= 0; −1: none): the number of distinct entries per row [B, n],
    and each distinct (row, entry) pair once: (batch index, entry)."""
    s = np.sort(v, axis=-1)
    new = s >= 0
    new[..., 1:] &= s[..., 1:] != s[..., :-1]
    return new.sum(axis=-1), np.nonzero(new)[0], s[new]


def _deliver_sends(chk: _Checker, rnd: Round, send: Send | None, B: int, n: int, usage: RoundUsage):
    """(inbox [B, n, slots] or None, words sent per machine [B, n])."""
    sent = np.zeros((B, n), dtype=np.int64)
    if send is None:
        return (np.full((B, n, rnd.slots), -1, dtype=np.int64) if rnd.slots else None), sent
    if not isinstance(send, Send):
        chk.fail("Send", f"send must be a Send, got {type(send).__name__}")
    dest = chk.array(send.dest, "Send.dest", B, (2, 3))
    dims = {2: dest.shape[2]} if dest.ndim == 3 else None
    slot = chk.array(send.slot, "Send.slot", B, (dest.ndim,), dims)
    word = chk.array(send.word, "Send.word", B, (dest.ndim,), dims)
    if dest.ndim == 2:
        dest, slot, word = dest[..., None], slot[..., None], word[..., None]
    valid = dest >= 0
    sent = valid.sum(axis=-1)
    if not valid.any():
        return (np.full((B, n, rnd.slots), -1, dtype=np.int64) if rnd.slots else None), sent
    ndest, pb, pd = _distinct_per_row(np.where(valid, dest, -1))
    usage.destinations = max(usage.destinations, int(ndest.max()))
    chk.at_most(ndest, rnd.sends, f"declared destinations α = {rnd.sends}", "sends to distinct machines:")
    bi, ii, mi = np.nonzero(valid)
    d, sl, w = dest[bi, ii, mi], slot[bi, ii, mi], word[bi, ii, mi]
    for arr, lo, hi, what in ((d, 0, n, "destination"), (sl, 0, rnd.slots, "inbox slot")):
        bad = (arr < lo) | (arr >= hi)
        if bad.any():
            k = int(np.argmax(bad))
            chk.fail(f"{what}s in [{lo}, {hi})", f"message to {what} {int(arr[k])}", (int(bi[k]), int(ii[k])))
    bad = (w < 0) | (w >= chk.p.word_limit)
    if bad.any():
        k = int(np.argmax(bad))
        chk.fail(f"message words in [0, 2^{chk.p.word_bits})", f"message word {int(w[k])}", (int(bi[k]), int(ii[k])))
    code = (bi * n + d) * rnd.slots + sl
    if np.bincount(code, minlength=B * n * rnd.slots).max() > 1:  # find the first collision
        order = np.argsort(code, kind="stable")
        cs = code[order]
        dup = np.flatnonzero(cs[1:] == cs[:-1])
        k1, k2 = order[dup[0]], order[dup[0] + 1]
        chk.fail("one message per inbox slot",
                 f"two messages into slot {int(sl[k2])} of machine {int(d[k2])} (from machines "
                 f"{int(ii[k1])} and {int(ii[k2])})", (int(bi[k2]), int(d[k2])))
    inbox = np.full((B, n, rnd.slots), -1, dtype=np.int64)
    inbox[bi, d, sl] = w
    usage.senders = max(usage.senders, int(np.bincount(pb * n + pd).max()))
    return inbox, sent


def _key_codes(pkey: np.ndarray, pmask: np.ndarray, qkey: np.ndarray, qmask: np.ndarray, word_bits: int,
               B: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 codes of (input, key) for publishers ``pkey`` [B, n, κ] and lookups ``qkey`` [B, n, λ, κ]:
    equal iff the input and the key are equal; −2 (publishers) and −1 (lookups) where absent."""
    kw = pkey.shape[-1]
    if kw * word_bits + max(1, B.bit_length()) <= 62:
        def pack(key: np.ndarray) -> np.ndarray:
            c = np.arange(B, dtype=np.int64).reshape((B,) + (1,) * (key.ndim - 2))
            for j in range(kw):
                c = (c << word_bits) | key[..., j]
            return c

        return np.where(pmask, pack(pkey), -2), np.where(qmask, pack(qkey), -1)
    pb = np.nonzero(pmask)
    qb = np.nonzero(qmask)
    rows = np.concatenate([np.column_stack([pb[0], pkey[pb]]), np.column_stack([qb[0], qkey[qb]])])
    _, inv = np.unique(rows, axis=0, return_inverse=True)
    inv = inv.reshape(-1).astype(np.int64)
    pc = np.full(pmask.shape, -2, dtype=np.int64)
    qc = np.full(qmask.shape, -1, dtype=np.int64)
    pc[pb], qc[qb] = inv[:len(pb[0])], inv[len(pb[0]):]
    return pc, qc


def _sorted_with_index(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted codes, original index of each) — by one sort of code·2^b + index when that fits in
    int64 (codes >= −2), else by argsort."""
    nb = max(1, int(codes.size).bit_length())
    if codes.size and int(codes.max()) < (1 << (61 - nb)):
        s = np.sort(((codes + 2) << nb) | np.arange(codes.size, dtype=np.int64))
        return (s >> nb) - 2, s & ((1 << nb) - 1)
    order = np.argsort(codes, kind="stable")
    return codes[order], order


def _runs(sorted_codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each entry of a sorted array: (first index, one past the last index) of its run of equal values."""
    m = sorted_codes.size
    new = np.ones(m, dtype=bool)
    new[1:] = sorted_codes[1:] != sorted_codes[:-1]
    starts = np.flatnonzero(new)
    rid = np.cumsum(new) - 1
    ends = np.append(starts[1:], m)
    return starts[rid], ends[rid]


def _resolve_table(chk: _Checker, t: Table, pub: Publish | None, look, B: int, n: int, usage: RoundUsage):
    """(result field, words published per machine, words received per machine)."""
    p = chk.p
    zero = np.zeros((B, n), dtype=np.int64)
    kappa = max(1, t.key_words)
    # --- lookups ---------------------------------------------------------------------------------
    if look is None:
        q = np.full((B, n, t.lookups, kappa), -1, dtype=np.int64)
    else:
        if kappa == 1:
            q = chk.array(look, f"lookup keys of table {t.name!r}", B, (2, 3, 4))
            if q.ndim == 2:
                q = q[..., None]
            if q.ndim == 3:
                q = q[..., None]
            if q.shape[2:] != (t.lookups, 1):
                chk.fail(f"λ = {t.lookups} lookups", f"lookup keys of table {t.name!r} have shape {list(q.shape)}")
        else:
            q = chk.array(look, f"lookup keys of table {t.name!r}", B, (4,), {2: t.lookups, 3: kappa})
        chk.words(q, f"lookup key of table {t.name!r}", allow_empty=True)
    asked = present_rows(q)  # [B, n, λ]
    # --- publishers ------------------------------------------------------------------------------
    published = zero
    if pub is None:
        present = np.zeros((B, n), dtype=bool)
        key = words = None
    else:
        if not isinstance(pub, Publish):
            chk.fail("Publish", f"publish[{t.name!r}] must be a Publish, got {type(pub).__name__}")
        if t.positional:
            if pub.key is not None:
                chk.fail("positional keys", f"table {t.name!r} is positional: Publish.key must be None")
            key = None
            present = np.ones((B, n), dtype=bool)
        else:
            if pub.key is None:
                chk.fail("keys", f"table {t.name!r} needs Publish.key [B, n, {t.key_words}]")
            key = chk.array(pub.key, f"Publish.key of table {t.name!r}", B, (2, 3) if kappa == 1 else (3,), {2: kappa} if kappa > 1 else None)
            if key.ndim == 2:
                key = key[..., None]
            if key.shape[2] != kappa:
                chk.fail("key words", f"Publish.key of table {t.name!r} has {key.shape[2]} words, declared {kappa}")
            chk.words(key, f"Publish.key of table {t.name!r}", allow_empty=True)
            present = present_rows(key)
        if pub.present is not None:
            pm = np.asarray(pub.present)
            if pm.dtype != bool or pm.shape != (B, n):
                chk.fail("shapes", f"Publish.present of table {t.name!r} must be bool [B={B}, n={n}]")
            present = present & pm
        if t.kind == "unique":
            if pub.words is None:
                chk.fail("records", f"table {t.name!r} is unique: Publish.words [B, n, {t.value_words}] is required")
            words = chk.array(pub.words, f"Publish.words of table {t.name!r}", B, (2, 3))
            if words.ndim == 2:
                words = words[..., None]
            if words.shape[2] != t.value_words:
                chk.fail("record words", f"Publish.words of table {t.name!r} has {words.shape[2]} words, declared {t.value_words}")
            chk.words(words, f"Publish.words of table {t.name!r}", allow_empty=True)
        else:
            if pub.words is not None:
                chk.fail("records", f"table {t.name!r} is an exists table: Publish.words must be None")
            words = None
        published = present * (t.key_words + t.value_words)
    # --- resolve every lookup against the published keys ------------------------------------------
    if t.positional:
        tgt = q[..., 0]  # [B, n, λ]
        found = asked & (tgt < n)
        src = np.arange(B, dtype=np.int64)[:, None, None] * n + np.where(found, tgt, 0)
        found &= present.reshape(-1)[src]
        count = found
    else:
        pc, qc = _key_codes(key, present, q, asked, p.word_bits, B)
        spc, order = _sorted_with_index(pc.reshape(-1))
        start, end = _runs(spc)
        dup = np.flatnonzero((end - start > 1) & (spc >= 0))
        if t.kind == "unique" and dup.size:
            k1, k2 = (int(order[start[dup[0]]]), int(order[start[dup[0]] + 1]))
            chk.fail("one publisher per key of a unique table",
                     f"machines {k1 % n} and {k2 % n} both publish key {key.reshape(-1, kappa)[k2].tolist()} "
                     f"in table {t.name!r}", (k2 // n, k2 % n))
        qs, qo = _sorted_with_index(qc.reshape(-1))
        left = np.empty_like(qs)
        left[qo] = np.searchsorted(spc, qs, "left")
        left = np.minimum(left, spc.size - 1).reshape(qc.shape)
        found = (spc[left] == qc) & (qc >= 0)
        count = np.where(found, end[left] - left, 0)
        src = order[left]
    if found.any():
        usage.matches[t.name] = max(usage.matches.get(t.name, 0), int(count.max()))
        bound = t.matches_bound(n)
        over = count > bound
        if over.any():
            b, i, u = (int(v) for v in np.argwhere(over)[0])
            chk.fail(f"max_matches = {bound} of table {t.name!r}",
                     f"lookup {q[b, i, u].tolist()} matches {int(count[b, i, u])} publishers", (b, i))
    if t.kind == "unique":
        res = np.where(found[..., None], words.reshape(B * n, -1)[src], -1)
    else:
        res = np.where(asked, found.astype(np.int64), -1)
    res = res.reshape(B, n, -1)
    return res, published, _words(res)


def _round(protocol: Protocol, r: int, rnd: Round, mem: Memory, B: int, usage: RoundUsage) -> Memory:
    chk = _Checker(protocol, r, rnd.name)
    n, s = protocol.n_machines, protocol.memory
    step = rnd.step(mem)
    if not isinstance(step, Step):
        chk.fail("Step", f"step must return a Step, got {type(step).__name__}")
    new = _check_memory(chk, step.memory, B, rnd.delivered_fields)
    inbox, sent = _deliver_sends(chk, rnd, step.send, B, n, usage)
    declared = {t.name for t in rnd.tables}
    for what, ops in (("publish", step.publish), ("lookup", step.lookup)):
        unknown = set(ops) - declared
        if unknown:
            chk.fail("declared tables", f"{what} into undeclared table(s) {sorted(unknown)}; declared: {sorted(declared)}")
    received = np.zeros((B, n), dtype=np.int64)
    delivered: Memory = {}
    if inbox is not None:
        delivered[rnd.inbox] = inbox
        received += _words(inbox)
    for t in rnd.tables:
        res, published, got = _resolve_table(chk, t, step.publish.get(t.name), step.lookup.get(t.name), B, n, usage)
        delivered[t.into] = res
        sent = sent + published
        received = received + got
    chk.at_most(sent, s, f"s = {s} words sent per machine", "sends words:")
    chk.at_most(received, s, f"s = {s} words received per machine", "receives words:")
    held = received + sum((_words(a) for a in new.values()), np.zeros((B, n), dtype=np.int64))
    chk.at_most(held, s, f"s = {s} words of memory", "holds words after the round:")
    usage.sent, usage.received, usage.memory = int(sent.max()), int(received.max()), int(held.max())
    new.update(delivered)
    return new


def trace(protocol: Protocol, inputs) -> Iterator[RoundState]:
    """The memory after ``init`` (round 0) and after each round, with every resource checked."""
    x = check_inputs(protocol, inputs)
    B = x.shape[0]
    chk = _Checker(protocol, 0, INIT)
    mem = _check_memory(chk, protocol.init(x), B)
    held = sum((_words(a) for a in mem.values()), np.zeros((B, protocol.n_machines), dtype=np.int64))
    chk.at_most(held, protocol.memory, f"s = {protocol.memory} words of memory", "holds words after init:")
    yield RoundState(0, INIT, mem, RoundUsage(0, INIT, memory=int(held.max())))
    for r, rnd in enumerate(protocol.rounds, start=1):
        usage = RoundUsage(r, rnd.name)
        mem = _round(protocol, r, rnd, mem, B, usage)
        yield RoundState(r, rnd.name, mem, usage)


def output(protocol: Protocol, mem: Memory, B: int) -> np.ndarray:
    """ψ applied to the final memory, checked to be int64 [B, n] answers (−1 = ⊥)."""
    out = protocol.output(mem)
    chk = _Checker(protocol, len(protocol.rounds), "output")
    if not isinstance(out, np.ndarray) or out.dtype.kind not in "iu" or out.shape != (B, protocol.n):
        chk.fail("shapes", f"output must be an int array [B={B}, n={protocol.n}], got "
                           f"{getattr(out, 'dtype', type(out).__name__)} {list(np.shape(out))}")
    out = out.astype(np.int64, copy=False)
    chk.words(out, "output", allow_empty=True)
    return out


def run(protocol: Protocol, inputs) -> MPCResult:
    """Execute ``protocol`` on ``inputs`` ([B, n] or [n] words); raises :class:`MPCError` on the first
    violated limit. Returns the outputs [B, n] (−1 = ⊥) and the per-round resource use."""
    x = check_inputs(protocol, inputs)
    usage, mem = [], {}
    for st in trace(protocol, x):
        usage.append(st.usage)
        mem = st.memory
    return MPCResult(output(protocol, mem, x.shape[0]), usage)
