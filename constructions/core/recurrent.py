"""The recurrent model IR: a ReLU RNN as exact data (P1 Sec. 2, "Recurrent Models").

An :class:`RNNModel` has the semantics of ``torch.nn.RNN(nonlinearity="relu", batch_first=True)``
with one layer, an input embedding before it and a linear readout after it::

    x_t      = E[token_t]                                   input vector [d_input]
    h_t      = relu(W_ih x_t + W_hh h_{t-1} + b)            hidden state [H], h_0 given
    logits_t = h_t W_U + b_U                                [d_vocab_out], read at the answer positions

(P1's RNN: h_t = g(x_t, h_{t-1}), y_t = f(h_t); here g is one ReLU layer and f is linear). The
format's semantics of one step is :func:`exactformer.verify.executor.recurrent.step`: each
matrix product is the format's ``matmul`` (rounded products, summed exactly, saturated once), then
``add``, ``add``, ``relu``. The hidden units are named by a :class:`~exactformer.constructions.core.builder.Layout`
(``layout``: group -> [first unit, count]).

``W_hh`` is held by rows (:class:`SparseRows`): the constructions' recurrent matrices have a few
nonzero entries per row (a shift register has one), while ``torch.nn.RNN`` stores it dense; sizes
count it dense (``parameters``, as the export stores it).

:class:`RecurrentBuilder` collects the weights of named unit groups and assembles the model (or,
under :func:`~exactformer.constructions.core.builder.shapes_only`, its shape only).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from exactformer.constructions.core.builder import Layout, ShapeOnlyModel, shapes_requested
from exactformer.constructions.core.ir import ExactTensor, IRError, ModelIR, Param
from exactformer.precision import Format


@dataclass(frozen=True)
class SparseRows:
    """An exact ``[rows, n_cols]`` matrix held by rows: row u has the value ``vals[u, k]`` at column
    ``cols[u, k]`` for k < width; unused slots hold the value 0 (at column 0)."""

    cols: np.ndarray  # [rows, width] int64
    vals: ExactTensor  # [rows, width]
    n_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.cols.shape[0]), int(self.n_cols))

    @property
    def width(self) -> int:
        return int(self.cols.shape[1])

    @staticmethod
    def from_entries(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, shape: tuple[int, int],
                     den: int = 1) -> "SparseRows":
        """From entries (row, col, numerator) over ``den``; entries at the same (row, col) add up."""
        n_rows, n_cols = shape
        rows, cols, values = (np.asarray(a, dtype=np.int64).reshape(-1) for a in (rows, cols, values))
        if rows.size and (rows.min() < 0 or rows.max() >= n_rows or cols.min() < 0 or cols.max() >= n_cols):
            raise IRError(f"sparse entries outside a [{n_rows}, {n_cols}] matrix")
        key = rows * n_cols + cols
        uniq, inv = np.unique(key, return_inverse=True)
        summed = np.zeros(uniq.size, np.int64)
        np.add.at(summed, inv, values)
        keep = summed != 0
        uniq, summed = uniq[keep], summed[keep]
        r, c = uniq // n_cols, uniq % n_cols
        counts = np.bincount(r, minlength=n_rows)
        width = int(counts.max()) if counts.size and counts.max() > 0 else 0
        out_c = np.zeros((n_rows, width), np.int64)
        out_v = np.zeros((n_rows, width), np.int64)
        slot = np.arange(r.size) - np.repeat(np.cumsum(counts) - counts, counts)
        out_c[r, slot], out_v[r, slot] = c, summed
        return SparseRows(out_c, ExactTensor(out_v, int(den)), int(n_cols))

    def dense(self) -> ExactTensor:
        """The matrix as a dense exact tensor."""
        out = np.zeros(self.shape, dtype=self.vals.num.dtype)
        rows = np.repeat(np.arange(self.shape[0]), self.width)
        np.add.at(out, (rows, self.cols.reshape(-1)), self.vals.num.reshape(-1))
        return ExactTensor(out, self.vals.den)

    def nonzero(self) -> int:
        return int(np.count_nonzero(self.vals.num))


@dataclass(frozen=True)
class RecurrentShape:
    """A recurrent model's size facts without its weights, under the names the size tables read from
    a transformer's :class:`~exactformer.constructions.core.ir.ModelShape`: one layer, no heads,
    width = hidden units H. ``parameters`` counts what the export stores: the embedding table
    [d_vocab, d_input], W_ih [H, d_input], W_hh [H, H] (dense, as ``torch.nn.RNN`` holds it), the
    two biases and h_0 [H] each, the readout [H, d_vocab_out] and its bias."""

    hidden: int
    d_input: int
    d_vocab: int
    d_vocab_out: int
    architecture = "recurrent"
    layers = ((0, 0, 0),)
    heads = 0
    d_head = 0
    d_mlp = 0

    @property
    def d_model(self) -> int:
        return self.hidden

    @property
    def width(self) -> int:
        return self.hidden

    @property
    def parameters(self) -> int:
        H, I, A = self.hidden, self.d_input, self.d_vocab_out
        return self.d_vocab * I + H * I + H * H + 3 * H + H * A + A


#: the exported names of the recurrent model's tensors (a ``torch.nn.RNN`` state dict under ``rnn.``)
TENSOR_NAMES = ("embed", "W_ih", "W_hh", "b", "h0", "W_U", "b_U")


@dataclass
class RNNModel(ModelIR):
    """A compiled recurrent construction (module docstring): exact weights, vocabularies and
    metadata. ``answer_positions`` None: the answer is read at the last position."""

    construction: str
    theorem: str
    n: int  # the input length the task's inputs have (the model itself runs on any length)
    embed: ExactTensor  # E [d_vocab, d_input]
    W_ih: ExactTensor  # [H, d_input]
    W_hh: SparseRows  # [H, H]
    b: ExactTensor  # [H]
    h0: ExactTensor  # [H]
    W_U: ExactTensor  # [H, d_vocab_out]
    b_U: ExactTensor  # [d_vocab_out]
    vocab: list[str]
    answers: list[Any]
    params: dict[str, Param] = field(default_factory=dict)
    precision: str | None = None
    task_params: dict[str, Any] = field(default_factory=dict)
    answer_positions: tuple[int, ...] | None = None
    layout: dict[str, list[int]] = field(default_factory=dict)  # unit group -> [first unit, count]

    # ---- shape facts -------------------------------------------------------------------------
    @property
    def hidden(self) -> int:
        return int(self.b.shape[0])

    @property
    def d_input(self) -> int:
        return int(self.embed.shape[1])

    @property
    def d_vocab(self) -> int:
        return int(self.embed.shape[0])

    @property
    def d_model(self) -> int:
        return self.hidden

    @property
    def n_layers(self) -> int:
        return 1

    @property
    def n_heads(self) -> int:
        return 0

    @property
    def width(self) -> int:
        """P1 Sec. 2: "its width is m", the hidden units."""
        return self.hidden

    @property
    def d_mlp(self) -> int:
        """No MLP: one ReLU layer is the recurrence itself (its units are the width)."""
        return 0

    @property
    def plan(self) -> list:
        """No blocks: a recurrent model's unit groups record no plan (its certificate reads the
        weights and the task's automaton only)."""
        return []

    def shape(self) -> RecurrentShape:
        return RecurrentShape(self.hidden, self.d_input, self.d_vocab, len(self.answers))

    def parameter_count(self, materialized: bool = False) -> int:
        """Stored numbers as the export stores them (W_hh dense); ``materialized`` changes nothing
        (a recurrent model has no generated rows)."""
        return self.shape().parameters

    def size_bits(self, precision_bits: int, materialized: bool = False) -> int:
        """Representation size in bits (P1 Sec. 2): every stored number at ``precision_bits`` bits."""
        return self.parameter_count() * precision_bits

    def state_bits(self, precision_bits: int) -> int:
        """The hidden state's size, m p bits (P1 Sec. 2): what Thm 2's protocol sends."""
        return self.hidden * precision_bits

    def summary(self) -> dict[str, Any]:
        return {
            "construction": self.construction,
            "theorem": self.theorem,
            "architecture": "recurrent",
            "n": self.n,
            "layers": 1,
            "heads": 0,
            "d_model": self.hidden,
            "d_head": 0,
            "d_mlp": 0,
            "width": self.hidden,
            "hidden": self.hidden,
            "d_input": self.d_input,
            "d_vocab": self.d_vocab,
            "d_vocab_out": len(self.answers),
            "parameters": self.parameter_count(),
            "recurrent_nonzero": self.W_hh.nonzero(),
            "precision": self.precision,
            "params": {k: p.to_json() for k, p in self.params.items()},
        }

    def tensors(self) -> dict[str, ExactTensor]:
        """Every dense exact tensor by name (W_hh is :class:`SparseRows`, not listed)."""
        return {name: getattr(self, name) for name in TENSOR_NAMES if name != "W_hh"}

    def weights_raw(self, fmt: Format) -> dict[str, np.ndarray]:
        """Every weight as raw values of ``fmt`` (checked exact: IRError names a weight it cannot hold)."""
        out = {name: t.raw(fmt) for name, t in self.tensors().items()}
        out["W_hh"] = self.W_hh.vals.raw(fmt)
        return out

    def fingerprint(self) -> str:
        """sha256 of everything a run depends on (weights, h_0, answer positions)."""
        h = hashlib.sha256(b"recurrent|")
        tensors = self.tensors() | {"W_hh.cols": ExactTensor(self.W_hh.cols, 1), "W_hh": self.W_hh.vals}
        for name, t in tensors.items():
            h.update(f"{name}|{t.shape}|{t.den}|".encode())
            h.update(repr(t.num.tolist()).encode() if t.num.dtype == object else np.ascontiguousarray(t.num, np.int64).tobytes())
        h.update(repr(self.answer_positions).encode())
        return h.hexdigest()

    def check(self) -> None:
        """Raise IRError if the shapes are inconsistent."""
        H, I, V, A = self.hidden, self.d_input, self.d_vocab, len(self.answers)
        for name, shape in (("W_ih", (H, I)), ("b", (H,)), ("h0", (H,)), ("W_U", (H, A)), ("b_U", (A,))):
            if getattr(self, name).shape != shape:
                raise IRError(f"{name} has shape {getattr(self, name).shape}, expected {shape}")
        if self.W_hh.shape != (H, H) or self.W_hh.vals.shape != self.W_hh.cols.shape:
            raise IRError(f"W_hh has shape {self.W_hh.shape}, expected {(H, H)}")
        if self.W_hh.cols.size and (self.W_hh.cols.min() < 0 or self.W_hh.cols.max() >= H):
            raise IRError(f"W_hh.cols must be units in [0, {H})")
        if len(self.vocab) != V:
            raise IRError(f"vocab has {len(self.vocab)} names for {V} tokens")
        pos = self.answer_positions
        if pos is not None and (not pos or min(pos) < 0):
            raise IRError(f"answer_positions must be positions >= 0, got {list(pos)[:4]}")


def shape_only(hidden: int, d_input: int, d_vocab: int, answers: int, **fields: Any) -> ShapeOnlyModel | None:
    """Under :func:`~exactformer.constructions.core.builder.shapes_only`, the shape of a recurrent
    model of these dimensions with its builder's ``fields`` (a builder whose weights grow with N
    returns it before assembling them; tests compare it with the full build); otherwise None."""
    if not shapes_requested():
        return None
    return ShapeOnlyModel(RecurrentShape(hidden, d_input, d_vocab, answers), fields)


class RecurrentBuilder:
    """Collects the weights of an :class:`RNNModel` by unit group (integer weights; every piece
    adds to what is there) and assembles it. Unit groups are declared with :meth:`units`;
    ``recur(rows, cols, values)`` adds W_hh entries, ``read(rows, input_cols, values)`` W_ih
    entries, ``bias`` / ``start`` b and h_0, ``readout`` W_U entries, ``readout_bias`` b_U."""

    def __init__(self, embed: np.ndarray):
        self.layout = Layout()
        self.embed = np.asarray(embed, dtype=np.int64)
        self._parts: dict[str, list[tuple[np.ndarray, ...]]] = {k: [] for k in ("W_hh", "W_ih", "b", "h0", "W_U")}
        self._b_U: np.ndarray | None = None

    def units(self, name: str, count: int) -> np.ndarray:
        """Declare ``count`` hidden units named ``name``; returns their indices."""
        return self.layout.add(name, count)

    def recur(self, rows: Any, cols: Any, values: Any) -> None:
        self._add("W_hh", rows, cols, values)

    def read(self, rows: Any, cols: Any, values: Any) -> None:
        self._add("W_ih", rows, cols, values)

    def bias(self, rows: Any, values: Any) -> None:
        self._add("b", rows, np.zeros_like(np.asarray(rows)), values)

    def start(self, rows: Any, values: Any) -> None:
        self._add("h0", rows, np.zeros_like(np.asarray(rows)), values)

    def readout(self, rows: Any, answers: Any, values: Any) -> None:
        self._add("W_U", rows, answers, values)

    def readout_bias(self, values: Any) -> None:
        self._b_U = np.asarray(values, dtype=np.int64)

    def _add(self, key: str, rows: Any, cols: Any, values: Any) -> None:
        rows, cols = np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)
        values = np.broadcast_to(np.asarray(values, dtype=np.int64), np.broadcast_shapes(rows.shape, cols.shape))
        rows, cols = np.broadcast_to(rows, values.shape), np.broadcast_to(cols, values.shape)
        self._parts[key].append((rows.reshape(-1), cols.reshape(-1), values.reshape(-1)))

    def _entries(self, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        parts = self._parts[key]
        if not parts:
            return (np.zeros(0, np.int64),) * 3
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]

    def _dense(self, key: str, shape: tuple[int, ...]) -> ExactTensor:
        r, c, v = self._entries(key)
        out = np.zeros(shape, np.int64)
        if len(shape) == 1:
            np.add.at(out, r, v)
        else:
            np.add.at(out, (r, c), v)
        return ExactTensor(out, 1)

    def build(self, answers: list[Any], vocab: list[str], **fields: Any) -> RNNModel:
        """The model (``fields``: the remaining :class:`RNNModel` fields), or under
        :func:`~exactformer.constructions.core.builder.shapes_only` its shape only."""
        H, A = self.layout.d_model, len(answers)
        V, I = self.embed.shape
        if shapes_requested():
            return ShapeOnlyModel(RecurrentShape(H, I, V, A), fields)  # type: ignore[return-value]
        b_U = np.zeros(A, np.int64) if self._b_U is None else self._b_U
        model = RNNModel(embed=ExactTensor(self.embed, 1), W_ih=self._dense("W_ih", (H, I)),
                         W_hh=SparseRows.from_entries(*self._entries("W_hh"), (H, H)), b=self._dense("b", (H,)),
                         h0=self._dense("h0", (H,)), W_U=self._dense("W_U", (H, A)), b_U=ExactTensor(b_U, 1),
                         vocab=vocab, answers=answers, layout=self.layout.as_dict(), **fields)
        model.check()
        return model
