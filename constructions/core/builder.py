"""Residual slots and the assembly of a model from blocks.

A :class:`Layout` names the residual stream's columns (like tracr's labelled bases): blocks read
and write slots by name and the layout assigns columns. A :class:`ModelBuilder` collects what each
block contributes -- embedding rows and position-code blocks, attention heads, MLP units, the
unembedding -- and assembles a :class:`~exactformer.constructions.core.ir.CompiledModel` whose ``plan``
records which block owns which head, which MLP units and the unembedding. The plan is a witness for
the certificate, not a premise: every fact a certificate uses is checked against the weights.

Weights are given exactly: an integer array, an ``(integer array, denominator)`` pair, or
a Fraction scalar.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from exactformer.constructions.core.ir import (
    MLP,
    Attention,
    TransformerBlock,
    CodeBlock,
    CompiledModel,
    Embedding,
    ExactTensor,
    FIXED_POINT_ONLY_NOTE,
    IRError,
    ModelShape,
    Param,
    check_shapes,
    fixed_point_only_heads,
)

Exact = Any  # np.ndarray of ints | (np.ndarray, int) | Fraction | int

_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("shapes_only", default=False)


@contextlib.contextmanager
def shapes_only():
    """Inside this context every :meth:`ModelBuilder.build` returns a :class:`ShapeOnlyModel`: the
    builder runs unchanged (its design searches, its layout, every block's placement) but no weight
    tensor or embedding table is assembled. The sizes tables read models built this way."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def shapes_requested() -> bool:
    """Whether the caller is inside :func:`shapes_only` (builders that assemble their own models ask)."""
    return _SHAPES_ONLY.get()


class ShapeOnlyModel:
    """A model's shape and the fields its builder records (``params``, ``precision``, ...), without
    weights: :meth:`summary` carries the size keys of :meth:`CompiledModel.summary`. Representability
    of the weights in the format is not checked (``weights_raw`` is a no-op): the full build checks it."""

    def __init__(self, shape: ModelShape, fields: dict[str, Any]):
        self.model_shape = shape
        self.params: dict[str, Any] = fields.pop("params", {})
        self.__dict__.update(fields)

    def shape(self) -> ModelShape:
        return self.model_shape

    @property
    def d_model(self) -> int:
        return self.model_shape.d_model

    def parameter_count(self) -> int:
        return self.model_shape.parameters

    def size_bits(self, precision_bits: int) -> int:
        return self.model_shape.parameters * precision_bits

    def weights_raw(self, fmt: Any) -> None:
        return None

    def summary(self) -> dict[str, Any]:
        sh = self.model_shape
        return {"construction": self.construction, "n": self.n, "architecture": sh.architecture,
                "layers": len(sh.layers), "heads": sh.heads,
                "d_model": sh.d_model, "d_head": sh.d_head, "d_mlp": sh.d_mlp, "width": sh.width,
                "d_vocab_out": sh.d_vocab_out, "parameters": sh.parameters, "precision": self.precision,
                "params": {k: p.to_json() for k, p in self.params.items()}}


class Layout:
    """Named residual slots; columns are assigned in order of declaration."""

    def __init__(self) -> None:
        self._slots: dict[str, tuple[int, int]] = {}
        self.d_model = 0

    def add(self, name: str, width: int) -> np.ndarray:
        if name in self._slots:
            raise IRError(f"slot {name!r} is declared twice")
        if width < 0:
            raise IRError(f"slot {name!r}: width must be >= 0, got {width}")
        self._slots[name] = (self.d_model, int(width))
        self.d_model += int(width)
        return self[name]

    def __getitem__(self, name: str) -> np.ndarray:
        start, width = self._slots[name]
        return np.arange(start, start + width)

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    def as_dict(self) -> dict[str, list[int]]:
        return {k: [s, w] for k, (s, w) in self._slots.items()}

    @staticmethod
    def from_dict(d: dict[str, Sequence[int]]) -> "Layout":
        out = Layout()
        for name, (start, width) in sorted(d.items(), key=lambda kv: kv[1][0]):
            if start != out.d_model:
                raise IRError(f"slot {name!r} starts at {start}, expected {out.d_model}")
            out.add(name, width)
        return out


@dataclass(frozen=True)
class Placement:
    """Where a block's weights sit: ``kind`` is "head" (``index`` = head of ``layer``), "mlp"
    (``index`` = (first unit, number of units) of ``layer``) or "unembed"."""

    block: Any
    kind: str
    layer: int = -1
    index: Any = None


def _as_exact(x: Exact) -> tuple[np.ndarray, int]:
    if isinstance(x, tuple):
        return np.asarray(x[0], dtype=np.int64), int(x[1])
    if isinstance(x, (Fraction, int, np.integer)):
        f = Fraction(x)
        return np.asarray(f.numerator, dtype=np.int64), f.denominator
    arr = np.asarray(x)
    if arr.dtype == object:
        t = ExactTensor.from_values(arr)
        return np.asarray(t.num, dtype=np.int64), t.den
    if not np.issubdtype(arr.dtype, np.integer):
        raise IRError(f"weights must be exact (integers, (numerators, denominator) or Fractions), got {arr.dtype}")
    return arr.astype(np.int64), 1


class _Acc:
    """An exact tensor accumulated from pieces (entries are added; denominators unified)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.pieces: list[tuple[Any, np.ndarray, int]] = []

    def add(self, index: Any, value: Exact) -> None:
        num, den = _as_exact(value)
        self.pieces.append((index, num, den))

    def tensor(self) -> ExactTensor:
        den = math.lcm(*[d for _, _, d in self.pieces]) if self.pieces else 1
        out = np.zeros(self.shape, dtype=np.int64)
        for index, num, d in self.pieces:
            out[index] += num * (den // d)
        return ExactTensor(out, den)


class _Layer:
    def __init__(self) -> None:
        self.heads: list[dict[str, Any]] = []
        self.units: list[tuple[list, Exact, list]] = []  # (W_in pieces, b_in, W_out pieces)
        self.b_O: list[tuple[str, Exact]] = []
        self.b_out: list[tuple[str, Exact]] = []
        self.causal = False


class ModelBuilder:
    """Collects blocks' contributions; :meth:`build` assembles the model (see the module docstring)."""

    def __init__(self, layout: Layout, n_layers: int, d_vocab: int, n_ctx: int):
        self.layout, self.d_vocab, self.n_ctx = layout, d_vocab, n_ctx
        self.layers = [_Layer() for _ in range(n_layers)]
        self.tok_rows: list[tuple[np.ndarray, str, Exact]] = []
        self.pos_rows: list[tuple[np.ndarray, str, Exact]] = []
        self.tok_codes: list[tuple[str, int, int, Any, int, Fraction]] = []
        self.pos_codes: list[tuple[str, int, int, Any, int, Fraction]] = []
        self.unembed_parts: list[tuple[str, Exact]] = []
        self.b_U: Exact | None = None
        self.plan: list[Placement] = []

    # ---- embeddings ------------------------------------------------------------------------------
    def token_rows(self, rows: Sequence[int], slot: str, values: Exact) -> None:
        """Token embedding rows ``rows`` on ``slot`` ([len(rows), width] exact values)."""
        self.tok_rows.append((np.asarray(rows, dtype=np.int64), slot, values))

    def position_rows(self, rows: Sequence[int], slot: str, values: Exact) -> None:
        self.pos_rows.append((np.asarray(rows, dtype=np.int64), slot, values))

    def token_code(self, slot: str, first_row: int, count: int, code: Any, code_start: int = 0,
                   scale: Fraction = Fraction(1)) -> None:
        """Token rows first_row .. first_row+count-1 hold ``scale * code(code_start + r)`` on ``slot``."""
        self.tok_codes.append((slot, first_row, count, code, code_start, Fraction(scale)))

    def position_code(self, slot: str, first_row: int, count: int, code: Any, code_start: int = 0,
                      scale: Fraction = Fraction(1)) -> None:
        self.pos_codes.append((slot, first_row, count, code, code_start, Fraction(scale)))

    # ---- layers ------------------------------------------------------------------------------------
    def head(self, block: Any, layer: int, d_head: int, Q=(), K=(), V=(), O=(), b_Q: Exact | None = None,
             b_K: Exact | None = None, b_V: Exact | None = None, causal: bool = False) -> int:
        """Add one attention head. Q, K, V: pieces (slot, M [slot width, d_head]); O: pieces
        (slot, M [d_head, slot width]). Returns the head's index in its layer."""
        L = self.layers[layer]
        if L.heads and causal != L.causal:
            raise IRError(f"layer {layer}: every head of a layer is causal or none is")
        L.causal = causal
        L.heads.append(dict(d_head=d_head, Q=list(Q), K=list(K), V=list(V), O=list(O), b_Q=b_Q, b_K=b_K, b_V=b_V))
        h = len(L.heads) - 1
        self.plan.append(Placement(block, "head", layer, h))
        return h

    def b_O(self, layer: int, slot: str, values: Exact) -> None:
        self.layers[layer].b_O.append((slot, values))

    def mlp(self, block: Any, layer: int, W_in=(), b_in: Exact = 0, W_out=(), n_units: int = 0) -> tuple[int, int]:
        """Add ``n_units`` MLP units: W_in pieces (slot, M [width, n_units]), b_in [n_units],
        W_out pieces (slot, M [n_units, width]). Returns (first unit, n_units)."""
        L = self.layers[layer]
        first = sum(u[3] for u in L.units)
        L.units.append((list(W_in), b_in, list(W_out), n_units))
        self.plan.append(Placement(block, "mlp", layer, (first, n_units)))
        return first, n_units

    def b_out(self, layer: int, slot: str, values: Exact) -> None:
        self.layers[layer].b_out.append((slot, values))

    def unembed(self, block: Any, W_U=(), b_U: Exact | None = None) -> None:
        """W_U pieces (slot, M [width, d_vocab_out]) and b_U [d_vocab_out]."""
        self.unembed_parts.extend(W_U)
        self.b_U = b_U
        self.plan.append(Placement(block, "unembed"))

    # ---- assembly ------------------------------------------------------------------------------------
    def _embedding(self, n_rows: int, rows: list, codes: list) -> Embedding:
        d = self.layout.d_model
        if rows:
            lo = int(min(r.min() for r, _, _ in rows if r.size))
            hi = int(max(r.max() for r, _, _ in rows if r.size))
            acc = _Acc((hi - lo + 1, d))
            for r, slot, vals in rows:
                acc.add(np.ix_(r - lo, self.layout[slot]), vals)
            table, first = acc.tensor(), lo
        else:
            table, first = ExactTensor(np.zeros((0, d), np.int64)), 0
        blocks = tuple(CodeBlock(code, fr, cnt, int(self.layout[slot][0]), cs, sc)
                       for slot, fr, cnt, code, cs, sc in codes)
        for b, (slot, *_r) in zip(blocks, codes):
            if b.code.k != self.layout[slot].size:
                raise IRError(f"code block on slot {slot!r}: code width {b.code.k} != slot width {self.layout[slot].size}")
        return Embedding(n_rows, d, table, first, blocks)

    def shape(self, d_vocab_out: int) -> ModelShape:
        """The shape :meth:`build` would give, from the collected pieces alone."""
        layers = tuple((max(1, len(L.heads)), max([h["d_head"] for h in L.heads] + [1]),
                        max(1, sum(u[3] for u in L.units))) for L in self.layers)
        rows = sum(int(max(r.max() for r, _, _ in rs if r.size) - min(r.min() for r, _, _ in rs if r.size) + 1)
                   for rs in (self.tok_rows, self.pos_rows) if any(r.size for r, _, _ in rs))
        return ModelShape(self.layout.d_model, layers, d_vocab_out, rows)

    def build(self, answers: list[Any], vocab: list[str], **fields: Any) -> CompiledModel:
        if _SHAPES_ONLY.get():
            return ShapeOnlyModel(self.shape(len(answers)), fields)  # type: ignore[return-value]
        d = self.layout.d_model
        blocks = []
        for li, L in enumerate(self.layers):
            H = max(1, len(L.heads))
            dh = max([h["d_head"] for h in L.heads] + [1])
            acc = {w: _Acc((H, d, dh)) for w in ("W_Q", "W_K", "W_V")}
            acc["W_O"] = _Acc((H, dh, d))
            for w in ("b_Q", "b_K", "b_V"):
                acc[w] = _Acc((H, dh))
            for h, spec in enumerate(L.heads):
                n = spec["d_head"]
                for w, key in (("W_Q", "Q"), ("W_K", "K"), ("W_V", "V")):
                    for slot, M in spec[key]:
                        acc[w].add(np.ix_([h], self.layout[slot], np.arange(n)), M)
                for slot, M in spec["O"]:
                    acc["W_O"].add(np.ix_([h], np.arange(n), self.layout[slot]), M)
                for w in ("b_Q", "b_K", "b_V"):
                    if spec[w] is not None:
                        acc[w].add(np.ix_([h], np.arange(n)), spec[w])
            acc["b_O"] = _Acc((d,))
            for slot, vals in L.b_O:
                acc["b_O"].add(self.layout[slot], vals)
            attn = Attention(*(acc[w].tensor() for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")),
                             causal=L.causal)
            U = max(1, sum(u[3] for u in L.units))
            W_in, b_in, W_out, b_out = _Acc((d, U)), _Acc((U,)), _Acc((U, d)), _Acc((d,))
            first = 0
            for pieces_in, bias, pieces_out, n in L.units:
                units = np.arange(first, first + n)
                for slot, M in pieces_in:
                    W_in.add(np.ix_(self.layout[slot], units), M)
                b_in.add(units, bias)
                for slot, M in pieces_out:
                    W_out.add(np.ix_(units, self.layout[slot]), M)
                first += n
            for slot, vals in L.b_out:
                b_out.add(self.layout[slot], vals)
            blocks.append(TransformerBlock(attn, MLP(W_in.tensor(), b_in.tensor(), W_out.tensor(), b_out.tensor())))
        V = len(answers)
        W_U, b_U = _Acc((d, V)), _Acc((V,))
        for slot, M in self.unembed_parts:
            W_U.add(np.ix_(self.layout[slot], np.arange(V)), M)
        if self.b_U is not None:
            b_U.add(np.arange(V), self.b_U)
        model = CompiledModel(
            embed=self._embedding(self.d_vocab, self.tok_rows, self.tok_codes),
            pos_embed=self._embedding(self.n_ctx, self.pos_rows, self.pos_codes),
            blocks=blocks, W_U=W_U.tensor(), b_U=b_U.tensor(), vocab=vocab, answers=answers,
            layout=self.layout.as_dict(), plan=list(self.plan), **fields)
        check_shapes(model)
        only, designed = fixed_point_only_heads(model.plan), model.params.get("arithmetics")
        if only and designed is not None:  # the arithmetics the design checked are not all certified
            model.params["arithmetics"] = Param(designed.value,
                                                designed.formula + FIXED_POINT_ONLY_NOTE.format(", ".join(only)))
        return model
