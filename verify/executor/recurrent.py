"""Running a recurrent model (:class:`~exactformer.constructions.core.recurrent.RNNModel`) exactly.

The semantics of one step in a format (P1 App. B.2: every operation the format's own): the
pre-activation of a unit is one ``matmul`` of [x_t, h_{t-1}, 1] with the unit's row
[W_ih | W_hh | b] -- rounded products, summed exactly, saturated once -- then ``relu``::

    x_t      = E[token_t]                                             [d_input]
    h_t      = relu(matmul([x_t, h_{t-1}, 1], [W_ih | W_hh | b]^T))  [H]
    logits_t = matmul([h_t, 1], [W_U; b_U])                          [d_vocab_out], at the answer positions

(a single saturation: intermediate sums such as W_ih x_t + W_hh h_{t-1} may leave the range as long
as the pre-activation is in it; with exact products this is the real-number step ``torch.nn.RNN``
computes). Zero entries add products that are 0, so :func:`step` multiplies the stored entries of
each row only (:class:`Weights`), while :func:`forward_recurrent` (the plain reference, with every
activation) multiplies the dense matrices with the format's ``matmul``; with integer weights in a
fixed-point format every rounded product is exact and :class:`Weights` sums exact integers instead.
The tests compare the paths bit for bit. Recurrent models
run on the CPU whatever ``device`` says (the results are the same exact integers).

Registered here, next to the implementation, for :class:`RNNModel`: :func:`run` (the executor) and
:func:`forward_with_cache` (the plain pass with a cache); the float runner of the exported
``torch.nn.RNN`` is :func:`exactformer.verify.executor.torch_run.run_torch_recurrent` (torch is
imported only there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from exactformer.constructions.core.recurrent import RNNModel
from exactformer.constructions.core.scan import run_machine
from exactformer.constructions.core.streams import GeneratedTokens
from exactformer.precision import Format
from exactformer.verify.executor.exact import ExecutorError, RunResult, decode_logits, memory_estimate, run
from exactformer.verify.executor.forward import Cache, forward_with_cache

STEP_ENTRIES = 1 << 24  # hidden units x stored entries per row x inputs per batch chunk
CHUNK = 1 << 20  # positions of an input read at once
STATE_LIMIT = 1 << 12  # hidden states tabulated at most (:func:`state_table`)
TABLE_MIN_STEPS = 1 << 14  # inputs x positions from which a run tabulates the hidden states
DENSE_WIDTH = 256  # rows [W_ih | W_hh | b] up to this long are multiplied densely
_TABLES: dict[tuple, Any] = {}  # (fingerprint, format) -> state_table
TABLE_ENTRIES = 1 << 24  # integer weights: every token's input row is tabulated at once up to d_vocab x H x d_input products


class Weights:
    """A recurrent model's weights as raw values of one format (checked exact).

    Two ways to the same pre-activations: when every weight is an integer in a fixed-point format
    (``integer`` True: each rounded product is the exact product), the input part of each token is
    one row ``A[token] = E[token] W_ih^T`` of exact integers, the recurrent part a sparse integer
    product, and the exact sum is saturated once (counted in ``saturations``); otherwise each unit's
    row [W_ih | W_hh | b] is held as its stored entries (``cols`` [H, w] indexing [x_t, h_{t-1}, 1],
    ``vals`` [H, w]) or densely (rows of at most :data:`DENSE_WIDTH` entries) for the format's
    ``matmul``."""

    def __init__(self, model: RNNModel, fmt: Format):
        raw = model.weights_raw(fmt)
        self.fmt, self.model = fmt, model
        H, I = model.hidden, model.d_input
        self.E = raw["embed"]
        self.one = np.asarray(fmt.quantize(np.array([1], dtype=object)))
        self.h0 = raw["h0"]
        self.readout_W = np.concatenate([raw["W_U"], raw["b_U"][None]], axis=0)
        self.saturations = 0
        S = getattr(fmt, "scale", None)
        stored = [raw["W_ih"], raw["W_hh"], raw["b"]]
        self.integer = bool(fmt.is_exact and getattr(fmt, "int64_mode", False) and isinstance(S, int)
                            and all(a.dtype == np.int64 and not np.any(a % S) for a in stored))
        if self.integer:
            import scipy.sparse  # imported when a recurrent model runs

            hh = model.W_hh
            self.K_ih = raw["W_ih"] // S  # [H, I] integer weights
            self.K_hh = scipy.sparse.csr_matrix(((raw["W_hh"] // S).reshape(-1), (np.repeat(np.arange(H), hh.width),
                                                hh.cols.reshape(-1))), shape=(H, H), dtype=np.int64)
            self.b = raw["b"][:, None]
            self.rows: dict[int, np.ndarray] = {}  # token -> E[token] K_ih^T + b, exact integers [H]
            self.table = None  # [d_vocab, H]: every token's row at once, where that is small
            if model.d_vocab * H * max(1, I) <= TABLE_ENTRIES:
                self.table = np.ascontiguousarray((self.K_ih @ self.E.T + self.b).T)
            return
        ih_r, ih_c = np.nonzero(model.W_ih.num)
        hh = model.W_hh
        rows = np.concatenate([ih_r, np.repeat(np.arange(H), hh.width), np.arange(H)])
        cols = np.concatenate([ih_c, I + hh.cols.reshape(-1), np.full(H, I + H)])
        vals = np.concatenate([raw["W_ih"][ih_r, ih_c], raw["W_hh"].reshape(-1), raw["b"]])
        order = np.argsort(rows, kind="stable")
        counts = np.bincount(rows, minlength=H)
        slot = np.arange(rows.size) - np.repeat(np.cumsum(counts) - counts, counts)
        self.cols = np.zeros((H, int(counts.max())), np.int64)
        self.vals = np.zeros((H, int(counts.max())), dtype=vals.dtype)
        self.cols[rows[order], slot], self.vals[rows[order], slot] = cols[order], vals[order]
        self.dense = None  # [I + H + 1, H]: one GEMM per step where the rows are short anyway
        if I + H + 1 <= DENSE_WIDTH:
            self.dense = np.zeros((I + H + 1, H), dtype=vals.dtype)
            np.add.at(self.dense, (cols, rows), vals)  # W_hh's unused entries (value 0) add nothing

    def input_rows(self, tokens: np.ndarray) -> np.ndarray:
        """The exact integers E[token] K_ih^T + b of each token id [B] (integer weights) -> [H, B]."""
        if self.table is not None:
            return self.table[tokens].T
        uniq, inv = np.unique(tokens, return_inverse=True)
        missing = [int(u) for u in uniq if int(u) not in self.rows]
        if missing:
            part = self.K_ih @ self.E[missing].T + self.b  # [H, len(missing)]
            self.rows.update({u: part[:, i] for i, u in enumerate(missing)})
        return np.stack([self.rows[int(u)] for u in uniq], axis=1)[:, inv]

    def magnitude(self, h: np.ndarray, tokens: np.ndarray) -> int:
        """The largest sum of |product| over the terms of one unit's pre-activation (integer weights),
        for hidden states [B, H] and token ids [B]: a bound on every partial sum of the step."""
        uniq, inv = np.unique(tokens, return_inverse=True)
        a = (np.abs(self.K_ih) @ np.abs(self.E[uniq]).T)[:, inv]
        return int((a + abs(self.K_hh) @ np.abs(h).T + np.abs(self.b)).max(initial=0))

    def readout_magnitude(self, h: np.ndarray) -> int:
        """The largest sum of |product| over the terms of one logit, ``W_U h + b_U``, for hidden states
        [B, H] (integer weights): a bound on every partial sum of the readout, in any order."""
        W = np.abs(np.asarray(self.readout_W, dtype=object if self.readout_W.dtype == object else np.int64))
        return int((np.abs(h) @ W[:-1] + W[-1]).max(initial=0))

    @property
    def entries(self) -> int:
        """Stored entries per unit (the batch sizing's cost per input and unit)."""
        return 1 if self.integer else int(self.cols.shape[1])

    def readout(self, h: np.ndarray) -> np.ndarray:
        """logits = matmul([h, 1], [W_U; b_U]) for hidden states [B, H]."""
        return np.asarray(self.fmt.matmul(np.concatenate([h, np.broadcast_to(self.one, (len(h), 1))], axis=1),
                                          self.readout_W))


def step(w: Weights, h: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """h_t = relu(matmul([x_t, h_{t-1}, 1], [W_ih | W_hh | b]^T)) for hidden states ``h`` [B, H] and
    token ids [B] (module docstring): the one definition the executor and the recurrent
    certificate share."""
    B = len(h)
    if w.integer:
        out, sat = integer_step(w, h, tokens)
        w.saturations += int(sat.sum())
        return out
    z = np.concatenate([w.E[tokens], h, np.broadcast_to(w.one, (B, 1))], axis=1)
    if w.dense is not None:
        pre = np.asarray(w.fmt.matmul(z, w.dense))
    else:
        pre = np.asarray(w.fmt.matmul(z[:, w.cols][:, :, None, :], w.vals[:, :, None])).reshape(B, -1)
    return np.asarray(w.fmt.relu(pre))


def integer_step(w: Weights, h: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`step` with integer weights, and each input's saturations [B] (units x inputs: rows of
    h^T are gathered contiguously)."""
    pre = w.input_rows(tokens) + w.K_hh @ np.ascontiguousarray(h.T)  # exact integers [H, B]
    lo, hi = w.fmt.min_raw, w.fmt.max_raw
    sat = np.count_nonzero(pre < lo, axis=0) + np.count_nonzero(pre > hi, axis=0)
    return np.clip(pre, max(lo, 0), hi).T, sat  # saturated once, then relu


def state_table(model: RNNModel, fmt: Format, w: Weights,
                budget: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every hidden state reachable from h_0 (integer weights), as (states [S, H], next [S, d_vocab]
    state indices, saturations [S, d_vocab] of each step), by :func:`integer_step` from the states
    found so far under every token until no new one appears; None beyond :data:`STATE_LIMIT` states
    or without integer weights. States are stepped a few at a time (:data:`STEP_ENTRIES` units in
    all), and at most ``budget`` steps are spent (a run's own T x B steps: a table that costs more than
    the run is not built for it; None, and nothing kept). Index Lookup's RNN, whose state holds the
    whole string, stepped 4,096 states x 258 tokens at once before (4.9 GB, 5-17 s) for 200 inputs of
    257 steps. Kept per (model, format)."""
    key = (model.fingerprint(), fmt.name)
    if key in _TABLES:
        return _TABLES[key]
    table = None
    if w.integer:
        V = model.d_vocab
        states, index, nxt, sat = [np.asarray(w.h0, dtype=np.int64)], {}, [], []
        index[states[0].tobytes()] = 0
        done = 0
        per = max(1, STEP_ENTRIES // (V * max(1, model.hidden)))  # states stepped at once: STEP_ENTRIES units
        while done < len(states) and len(states) <= STATE_LIMIT:  # a model with more states stops early
            if budget is not None and (done + min(per, len(states) - done)) * V > budget:
                return None  # dearer than the run it is for: not built, nothing kept
            hs = np.stack(states[done : done + per])
            out, cnt = integer_step(w, np.repeat(hs, V, axis=0), np.tile(np.arange(V), len(hs)))
            for row, c in zip(out.reshape(len(hs), V, -1), cnt.reshape(len(hs), V)):
                ids = []
                for h in row:
                    k = h.tobytes()
                    if k not in index:
                        index[k] = len(states)
                        states.append(h.copy())
                    ids.append(index[k])
                nxt.append(ids)
                sat.append(c)
            done += len(hs)
        if len(states) <= STATE_LIMIT:
            table = (np.stack(states), np.asarray(nxt, dtype=np.int64), np.asarray(sat, dtype=np.int64))
    _TABLES[key] = table
    while len(_TABLES) > 8:
        _TABLES.pop(next(iter(_TABLES)))
    return table


def _columns(tokens: Any, rows: slice, a: int, b: int, model: RNNModel) -> np.ndarray:
    """Token ids [len(rows), b - a] of inputs ``rows`` at positions a .. b-1 (generated inputs are
    read there only), checked to lie in the vocabulary."""
    t = np.asarray(tokens[rows][:, a:b] if isinstance(tokens, GeneratedTokens) else tokens[rows, a:b], dtype=np.int64)
    if t.size and (t.min() < 0 or t.max() >= model.d_vocab):
        raise ExecutorError(f"token ids must lie in [0, d_vocab={model.d_vocab})")
    return t


def check_tokens(model: RNNModel, tokens: Any, shortest: int = 1) -> np.ndarray:
    """Token ids [B, T] (T >= ``shortest``) of ``model``'s vocabulary as int64, or ExecutorError."""
    t = np.asarray(tokens)
    if t.ndim == 1:
        t = t[None, :]
    if t.ndim != 2 or t.shape[1] < shortest or not (np.issubdtype(t.dtype, np.integer) or t.size == 0):
        raise ExecutorError(f"tokens must be an integer array [B, T] with T >= {shortest}, got dtype {t.dtype} "
                            f"shape {t.shape}")
    if t.size and (t.min() < 0 or t.max() >= model.d_vocab):
        raise ExecutorError(f"token ids must lie in [0, d_vocab={model.d_vocab})")
    return t.astype(np.int64)


@memory_estimate.register
def _memory_recurrent(model: RNNModel, fmt: Format, T: int, batch: int, device: str = "cpu") -> int:
    """A part of the batch's hidden states and one chunk of its token ids (besides the inputs)."""
    part = min(batch, max(1, STEP_ENTRIES // max(1, model.hidden)))
    table = 0
    if T * batch >= TABLE_MIN_STEPS:  # the tabulation of the states: its steps and the table
        table = 8 * 4 * STEP_ENTRIES + 8 * (STATE_LIMIT + 1) * (model.hidden + 2 * model.d_vocab)
    return 8 * 4 * part * (model.hidden + model.d_input + min(T, CHUNK)) + table


@run.register
def run_recurrent(model: RNNModel, tokens: Any, fmt: Format, device: str = "cpu",
                  batch_size: int | None = None, progress: Any = None) -> RunResult:
    """Run ``model`` on token ids [B, T] under ``fmt``: the logits at the answer positions
    (:class:`~exactformer.verify.executor.exact.RunResult`), step by step from h_0. A model that
    answers at the last position answers the empty input (T = 0) from h_0 itself. Inputs are read
    :data:`CHUNK` positions at a time (generated inputs, :class:`GeneratedTokens`, are never
    formed) and ``progress(f)`` is called with the fraction of inputs f each chunk completes.
    Where every reachable hidden state is tabulated (:func:`state_table`: integer weights, at most
    :data:`STATE_LIMIT` states) the steps are table lookups run by
    :func:`~exactformer.constructions.core.scan.run_machine`, the same states and saturations."""
    if not isinstance(tokens, GeneratedTokens):
        tokens = check_tokens(model, tokens, shortest=0 if model.answer_positions is None else 1)
    B, T = tokens.shape
    w = Weights(model, fmt)
    if T == 0:
        fmt.reset_counts()
        logits = np.broadcast_to(w.readout(w.h0[None]), (B, len(model.answers)))[:, None].copy()
        return RunResult(logits, *decode_logits(model, logits), fmt.counts.as_dict() | {"saturations": 0})
    pos = model.answer_positions_for(T)
    at = np.zeros(T, dtype=bool)
    at[pos] = True
    if batch_size is None:
        batch_size = max(1, STEP_ENTRIES // max(1, model.hidden * w.entries))
    table = state_table(model, fmt, w, budget=T * B) if T * B >= TABLE_MIN_STEPS else None
    fmt.reset_counts()
    parts = []
    for s in range(0, B, batch_size):
        rows = slice(s, min(B, s + batch_size))
        b = rows.stop - s
        out = []
        if table is not None:
            states, nxt, sat = table
            state = np.zeros(b, dtype=np.int64)  # h_0 is state 0
            for a in range(0, T, CHUNK):
                z = min(T, a + CHUNK)
                wanted = np.flatnonzero(at[a:z])
                state, cost, every = run_machine(nxt, sat, state, _columns(tokens, rows, a, z, model), wanted.size > 0)
                w.saturations += int(cost.sum())
                out += [w.readout(states[every[:, j]]) for j in wanted]
                if progress is not None:
                    progress(b * (z - a) / T)
        else:
            h = np.broadcast_to(w.h0, (b, model.hidden))
            for a in range(0, T, CHUNK):
                z = min(T, a + CHUNK)
                chunk = _columns(tokens, rows, a, z, model)
                # integer weights: the steps over the prefix every input of the chunk shares run once
                # (an exhaustive enumeration's batches share long prefixes), their saturations counted b times
                shared = 0
                if w.integer and b > 1 and a == 0 and z == T:
                    same = np.all(chunk == chunk[:1], axis=0)  # [T]: position t holds one token in the whole chunk
                    shared = T if same.all() else int(np.argmin(same))
                if shared:
                    h = h[:1]
                for t in range(a, z):
                    before = w.saturations
                    h = step(w, h, chunk[:1, t - a] if t < shared else chunk[:, t - a])
                    if t < shared:
                        w.saturations = before + (w.saturations - before) * b
                    if t + 1 == shared:
                        h = np.broadcast_to(h, (b, model.hidden))
                    if at[t]:
                        out.append(np.broadcast_to(w.readout(h), (b, len(model.answers))))
                if progress is not None:
                    progress(b * (z - a) / T)
        parts.append(np.stack(out, axis=1))
    logits = np.concatenate(parts) if parts else np.zeros((0, pos.size, len(model.answers)), np.int64)
    answers, margin = decode_logits(model, logits)
    counts = fmt.counts.as_dict()
    counts["saturations"] = counts.get("saturations", 0) + w.saturations
    return RunResult(logits, answers, margin, counts)


@forward_with_cache.register
def forward_recurrent(model: RNNModel, tokens: Any, fmt: Format) -> tuple[np.ndarray, Cache]:
    """All logits [B, T, d_vocab_out] and every activation, plainly (dense matrices, every
    position). Hook names: ``hook_embed`` [B, T, d_input], ``rnn.hook_pre`` and ``rnn.hook_h``
    [B, T, H], ``unembed.hook_logits`` [B, T, d_vocab_out]."""
    tokens = check_tokens(model, tokens)
    B, T = tokens.shape
    one = np.asarray(fmt.quantize(np.array([1], dtype=object)))
    row = np.concatenate([model.W_ih.raw(fmt), model.W_hh.dense().raw(fmt), model.b.raw(fmt)[:, None]], axis=1)
    readout = np.concatenate([model.W_U.raw(fmt), model.b_U.raw(fmt)[None]], axis=0)
    cache = Cache(fmt)
    x = model.embed.raw(fmt)[tokens]
    pres, hs = [], []
    h = np.broadcast_to(model.h0.raw(fmt), (B, model.hidden))
    for t in range(T):
        pre = np.asarray(fmt.matmul(np.concatenate([x[:, t], h, np.broadcast_to(one, (B, 1))], axis=1), row.T))
        h = np.asarray(fmt.relu(pre))
        pres.append(pre)
        hs.append(h)
    cache.raw["hook_embed"] = x
    cache.raw["rnn.hook_pre"], cache.raw["rnn.hook_h"] = np.stack(pres, axis=1), np.stack(hs, axis=1)
    ones = np.broadcast_to(one, (B, T, 1))
    logits = np.asarray(fmt.matmul(np.concatenate([cache.raw["rnn.hook_h"], ones], axis=2), readout))
    cache.raw["unembed.hook_logits"] = logits
    return logits, cache
