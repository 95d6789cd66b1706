"""Residual slots and the assembly of a model from blocks.

A :class:`Layout` names the residual stream's columns (like tracr's labelled bases): blocks read
and write slots by name and the layout assigns columns. A :class:`ModelBuilder` collects what each
block contributes -- embedding rows and position-code blocks, attention heads, MLP units, the
unembedding -- and assembles a :class:`~exactformer.constructions.core.ir.CompiledModel` whose ``plan``
records which block owns which head, which MLP units and the unembedding. The plan is a witness for
the certificate, not a premise: every fact a certificate uses is checked against the weights.

Weights are given exactly: an integer array, an ``(integer array, denominator)`` pair, or
a Fraction scalar. Every piece is checked where it is added: a slot the layout does not have is
refused listing the slots it has, a piece of the wrong shape names the slot, the block that adds it
and the expected shape (a block's ``emit`` runs under :func:`naming_block`).

**The format** (:meth:`ModelBuilder.build`). ``precision`` given: every weight must be a grid value
of it, else the build fails naming the weight, the block that wrote it and the smallest binary
format that holds every weight. ``precision`` left out: the fewest-bit binary format in which every
block's sufficient condition holds (:meth:`~exactformer.constructions.blocks.base.Block.design`: a
block whose parameters are left to the build, as a retrieval's ``eta``, is *deferred* by its
``emit`` and placed once the format is chosen) and every weight is a grid value -- the precision
search sees every weight, not only the retrieval blocks'.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterator, Sequence

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

#: the construction of a model built outside a registered builder (it runs; verifying needs a registration)
UNREGISTERED = "unregistered"
#: the largest format the precision search of :meth:`ModelBuilder.build` tries (sign + int + frac bits)
MAX_BITS = 48

_BLOCK: contextvars.ContextVar[Any] = contextvars.ContextVar("emitting_block", default=None)


def naming_block(emit: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a block's ``emit(mb, ...)`` so that an error it raises names the block and the layer it
    is placed in (one line: ``RetrieveByPosition in layer 0: no slot 'q' in the layout; its slots:
    ...``). :class:`~exactformer.constructions.blocks.base.Block` applies it to every ``emit``."""

    @functools.wraps(emit)
    def wrapped(self: Any, mb: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with _setting(_BLOCK, (self, True)):
                return emit(self, mb, *args, **kwargs)
        except (IRError, ValueError, TypeError, IndexError) as e:
            if getattr(e, "names_block", False):
                raise
            where = f" in layer {args[0]}" if args else ""
            err = IRError(f"{type(self).__name__}{where}: {e}")
            err.names_block = True  # type: ignore[attr-defined]
            raise err from None

    return wrapped


_BUILDING: contextvars.ContextVar[Any] = contextvars.ContextVar("building", default=None)


@contextlib.contextmanager
def _setting(var: contextvars.ContextVar, value: Any) -> Iterator[None]:
    """``var`` holds ``value`` inside the context."""
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def building(entry: Any) -> contextlib.AbstractContextManager:
    """While a registered builder runs (the registry's decorator enters this): the construction
    being built, whose name and theorem :meth:`ModelBuilder.build` gives the model unless told."""
    return _setting(_BUILDING, entry)


def _who() -> str:
    """The block whose pieces are being checked, for messages (``"block SymbolReadout: "``), or ""
    (none, or inside its ``emit``, whose errors :func:`naming_block` names)."""
    b = _BLOCK.get()
    return "" if b is None or b[1] else f"block {type(b[0]).__name__}: "


_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("shapes_only", default=False)


def shapes_only() -> contextlib.AbstractContextManager:
    """Inside this context every :meth:`ModelBuilder.build` returns a :class:`ShapeOnlyModel`: the
    builder runs unchanged (its design searches, its layout, every block's placement) but no weight
    tensor or embedding table is assembled. The sizes tables read models built this way."""
    return _setting(_SHAPES_ONLY, True)


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
    """Named residual slots; columns are assigned in order of declaration: ``Layout(rho=2, q=16)``
    or :meth:`add` one by one."""

    def __init__(self, **slots: int) -> None:
        self._slots: dict[str, tuple[int, int]] = {}
        self.d_model = 0
        for name, width in slots.items():
            self.add(name, width)

    def add(self, name: str, width: int) -> np.ndarray:
        if name in self._slots:
            raise IRError(f"slot {name!r} is declared twice")
        if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < 0:
            raise IRError(f"slot {name!r}: width must be an integer >= 0, got {width!r}")
        self._slots[name] = (self.d_model, int(width))
        self.d_model += int(width)
        return self[name]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._slots:
            raise IRError(f"no slot {name!r} in the layout; its slots: {', '.join(self._slots) or 'none'}")
        start, width = self._slots[name]
        return np.arange(start, start + width)

    def width(self, name: str) -> int:
        return int(self[name].size)

    def slot_of(self, column: int) -> str:
        """The slot holding residual column ``column``."""
        return next((k for k, (s, w) in self._slots.items() if s <= column < s + w), "?")

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


class Unmet(IRError):
    """A block's sufficient condition, or a weight, that the format at hand does not meet (the
    precision search tries the next format; a given precision is refused)."""


def _design_of(block: Any, fmt: Any, mb: "ModelBuilder") -> Any:
    """``block.design(fmt, mb)``, an error in it naming the block."""
    try:
        return block.design(fmt, mb)
    except (IRError, ValueError) as e:
        raise IRError(f"{type(block).__name__}: {e}") from None


def _shape(value: Exact) -> tuple[int, ...]:
    """The shape of an exact value (a scalar: ())."""
    if isinstance(value, tuple) and len(value) == 2 and np.ndim(value[1]) == 0:
        return tuple(np.shape(value[0]))
    return tuple(np.shape(value))


class ModelBuilder:
    """Collects blocks' contributions; :meth:`build` assembles the model (see the module docstring).

    ``layout``: the residual slots; ``n_layers``; ``d_vocab``: token ids 0 .. d_vocab-1; ``n_ctx``:
    positions 0 .. n_ctx-1."""

    def __init__(self, layout: Layout, n_layers: int, d_vocab: int, n_ctx: int):
        for name, v, lo in (("n_layers", n_layers, 1), ("d_vocab", d_vocab, 1), ("n_ctx", n_ctx, 1)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
                raise IRError(f"ModelBuilder: {name} must be an integer >= {lo}, got {v!r}")
        self.layout, self.d_vocab, self.n_ctx = layout, int(d_vocab), int(n_ctx)
        self.layers = [_Layer() for _ in range(n_layers)]
        self.tok_rows: list[tuple[np.ndarray, str, Exact]] = []
        self.pos_rows: list[tuple[np.ndarray, str, Exact]] = []
        self.tok_codes: list[tuple[str, int, int, Any, int, Fraction]] = []
        self.pos_codes: list[tuple[str, int, int, Any, int, Fraction]] = []
        self.unembed_parts: list[tuple[str, Exact, Any]] = []  # (slot, M, the block that wrote it)
        self.b_U: Exact | None = None
        self.plan: list[Placement] = []
        self.deferred: list[tuple[Any, tuple]] = []  # blocks whose parameters the build chooses: (block, emit args)

    # ---- checks -------------------------------------------------------------------------------------
    def _check(self, what: str, slot: str | None, value: Exact, expected: tuple[int, ...], meaning: str,
               scalar: bool = False) -> None:
        """``value`` has shape ``expected`` (or is a scalar, where ``scalar``), else IRError naming the
        block that adds it, the slot and the expected shape (``meaning`` names the axes)."""
        got = _shape(value)
        if got == tuple(expected) or (scalar and got == ()):
            return
        on = f" on slot {slot!r}" if slot is not None else ""
        raise IRError(f"{_who()}{what}{on} has shape {got}, expected {tuple(expected)} [{meaning}]")

    def _rows(self, which: str, rows: Sequence[int], limit: int, limit_name: str) -> np.ndarray:
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        if r.size and (r.min() < 0 or r.max() >= limit):
            raise IRError(f"{_who()}{which}: rows must lie in [0, {limit}) ({limit_name}), got [{r.min()}, {r.max()}]")
        return r

    def _layer(self, layer: int) -> "_Layer":
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < len(self.layers):
            raise IRError(f"{_who()}layer must be in [0, {len(self.layers)}) (n_layers = {len(self.layers)}), got {layer!r}")
        return self.layers[layer]

    # ---- embeddings ------------------------------------------------------------------------------
    def token_rows(self, rows: Sequence[int], slot: str, values: Exact) -> None:
        """Token embedding rows ``rows`` on ``slot`` ([len(rows), width] exact values)."""
        r = self._rows("token_rows", rows, self.d_vocab, "d_vocab")
        self._check("token_rows values", slot, values, (r.size, self.layout.width(slot)), "rows, slot width")
        self.tok_rows.append((r, slot, values))

    def position_rows(self, rows: Sequence[int], slot: str, values: Exact) -> None:
        """Positional embedding rows ``rows`` on ``slot`` ([len(rows), width] exact values)."""
        r = self._rows("position_rows", rows, self.n_ctx, "n_ctx")
        self._check("position_rows values", slot, values, (r.size, self.layout.width(slot)), "rows, slot width")
        self.pos_rows.append((r, slot, values))

    def _code(self, which: str, slot: str, first_row: int, count: int, code: Any, code_start: int, limit: int) -> None:
        self._rows(which, [first_row, first_row + count - 1] if count > 0 else [], limit,
                   "d_vocab" if which == "token_code" else "n_ctx")
        if not 0 <= code_start <= code_start + count <= getattr(code, "n", code_start + count):
            raise IRError(f"{_who()}{which}: code_start + count = {code_start} + {count} must be at most the code's "
                          f"{code.n} vectors (code_start >= 0)")
        if getattr(code, "k", None) != self.layout.width(slot):
            raise IRError(f"{_who()}{which}: code width {getattr(code, 'k', None)} != width "
                          f"{self.layout.width(slot)} of slot {slot!r}")

    def token_code(self, slot: str, first_row: int, count: int, code: Any, code_start: int = 0,
                   scale: Fraction = Fraction(1)) -> None:
        """Token rows first_row .. first_row+count-1 hold ``scale * code(code_start + r)`` on ``slot``."""
        self._code("token_code", slot, first_row, count, code, code_start, self.d_vocab)
        self.tok_codes.append((slot, first_row, count, code, code_start, Fraction(scale)))

    def position_code(self, slot: str, first_row: int, count: int, code: Any, code_start: int = 0,
                      scale: Fraction = Fraction(1)) -> None:
        """Positions first_row .. first_row+count-1 hold ``scale * code(code_start + r)`` on ``slot``
        (position first_row holds vector code_start)."""
        self._code("position_code", slot, first_row, count, code, code_start, self.n_ctx)
        self.pos_codes.append((slot, first_row, count, code, code_start, Fraction(scale)))

    def code_of(self, slot: str) -> Any:
        """The position code filling ``slot`` in the positional embedding (the first block on it)."""
        for name, _, _, code, _, _ in self.pos_codes:
            if name == slot:
                return code
        raise IRError(f"{_who()}slot {slot!r} holds no position code (ModelBuilder.position_code)")

    # ---- layers ------------------------------------------------------------------------------------
    def defer(self, block: Any, *args: Any) -> None:
        """Place ``block`` (whose ``emit(self, *args)`` this is) once :meth:`build` has chosen the
        format and, with it, the parameters the block leaves to the build (its ``design``)."""
        self.deferred.append((block, args))

    def head(self, block: Any, layer: int, d_head: int, Q=(), K=(), V=(), O=(), b_Q: Exact | None = None,
             b_K: Exact | None = None, b_V: Exact | None = None, causal: bool = False) -> int:
        """Add one attention head. Q, K, V: pieces (slot, M [slot width, d_head]); O: pieces
        (slot, M [d_head, slot width]). Returns the head's index in its layer."""
        L = self._layer(layer)
        for name, pieces in (("W_Q", Q), ("W_K", K), ("W_V", V)):
            for slot, M in pieces:
                self._check(name, slot, M, (self.layout.width(slot), d_head), "slot width, d_head")
        for slot, M in O:
            self._check("W_O", slot, M, (d_head, self.layout.width(slot)), "d_head, slot width")
        for name, b in (("b_Q", b_Q), ("b_K", b_K), ("b_V", b_V)):
            if b is not None:
                self._check(name, None, b, (d_head,), "d_head", scalar=True)
        if L.heads and causal != L.causal:
            raise IRError(f"{_who()}layer {layer}: every head of a layer is causal or none is")
        L.causal = causal
        L.heads.append(dict(d_head=d_head, Q=list(Q), K=list(K), V=list(V), O=list(O), b_Q=b_Q, b_K=b_K, b_V=b_V))
        h = len(L.heads) - 1
        self.plan.append(Placement(block, "head", layer, h))
        return h

    def b_O(self, layer: int, slot: str, values: Exact) -> None:
        self._check("b_O", slot, values, (self.layout.width(slot),), "slot width", scalar=True)
        self._layer(layer).b_O.append((slot, values))

    def mlp(self, block: Any, layer: int, W_in=(), b_in: Exact = 0, W_out=(), n_units: int = 0) -> tuple[int, int]:
        """Add ``n_units`` MLP units: W_in pieces (slot, M [width, n_units]), b_in [n_units],
        W_out pieces (slot, M [n_units, width]). Returns (first unit, n_units)."""
        L = self._layer(layer)
        for slot, M in W_in:
            self._check("W_in", slot, M, (self.layout.width(slot), n_units), "slot width, units")
        self._check("b_in", None, b_in, (n_units,), "units", scalar=True)
        for slot, M in W_out:
            self._check("W_out", slot, M, (n_units, self.layout.width(slot)), "units, slot width")
        first = sum(u[3] for u in L.units)
        L.units.append((list(W_in), b_in, list(W_out), n_units))
        self.plan.append(Placement(block, "mlp", layer, (first, n_units)))
        return first, n_units

    def b_out(self, layer: int, slot: str, values: Exact) -> None:
        self._check("b_out", slot, values, (self.layout.width(slot),), "slot width", scalar=True)
        self._layer(layer).b_out.append((slot, values))

    def unembed(self, block: Any, W_U=(), b_U: Exact | None = None) -> None:
        """W_U pieces (slot, M [width, d_vocab_out]) and b_U [d_vocab_out] (checked against the
        answers at :meth:`build`)."""
        for slot, M in W_U:
            self.layout[slot]  # a slot the layout has
            self.unembed_parts.append((slot, M, block))
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

    def build(self, answers: list[Any], vocab: list[str] | None = None, precision: Any = None,
              **fields: Any) -> CompiledModel:
        """The model. ``answers``: the answer each logit stands for (the task's answer values);
        ``vocab``: the name of each token id (default its number); ``precision``: the format, a
        :class:`~exactformer.precision.Format` or its name -- every weight must be a grid value of it
        -- or None: the fewest-bit binary format in which every block's condition holds and every
        weight is a grid value (the module docstring); ``fields``: the other
        :class:`~exactformer.constructions.core.ir.CompiledModel` fields (``construction`` and
        ``theorem`` -- by default the registered construction's being built, else
        :data:`UNREGISTERED` --, ``n`` -- default ``n_ctx`` --, ``task_params``, ``answer_positions`` ...)."""
        from exactformer.precision import parse_format

        entry = _BUILDING.get()
        fields.setdefault("construction", UNREGISTERED if entry is None else entry.name)
        fields.setdefault("theorem", "" if entry is None else entry.theorem)
        fields.setdefault("n", self.n_ctx)
        if not isinstance(answers, (list, tuple)) or not answers:
            raise IRError(f"build: answers must be a non-empty list (the answer each logit stands for), got {answers!r}")
        answers = list(answers)
        vocab = [str(i) for i in range(self.d_vocab)] if vocab is None else vocab
        if precision is None:
            from exactformer.constructions.design.precision_search import designed_for

            params = dict(fields.get("params") or {})
            params.setdefault("precision", Param(None, "the fewest-bit binary format in which every block's sufficient "
                                                       "condition holds and every weight is a grid value"))
            params.setdefault("arithmetics", Param(None, "the arithmetics the blocks' sufficient conditions were "
                                                         "checked in (ModelBuilder.build)"))
            fmt, mb, model = self._design(answers, vocab, dict(fields, params=params))
            for key, value in (("precision", fmt.name), ("arithmetics", designed_for(fmt, True))):
                if params[key].value is None:
                    params[key] = Param(value, params[key].formula)
            if model is not None:
                model.params = params
            fields["params"] = params
        else:
            try:
                fmt = parse_format(precision) if isinstance(precision, str) else precision
            except ValueError as e:
                raise IRError(f"build: precision: {e}") from None
            mb = self._designed(fmt)
            model = None if _SHAPES_ONLY.get() else mb._assemble(answers, vocab, dict(fields, precision=fmt.name))
            if model is not None and fmt.is_exact:
                bad = first_unrepresentable(model, fmt)
                if bad is not None:
                    raise IRError(f"{bad} is not a grid value of {fmt.name} (range [{fmt.min_value}, {fmt.max_value}], "
                                  f"step {fmt.step}); {smallest_holding(model)} -- or leave precision out: the build then "
                                  "searches the fewest-bit format that every block's condition and every weight allow")
        if _SHAPES_ONLY.get():
            return ShapeOnlyModel(mb.shape(len(answers)), dict(fields, precision=fmt.name))  # type: ignore[return-value]
        return model

    def _designed(self, fmt: Any, search: bool = False) -> "ModelBuilder":
        """A copy of this builder with the deferred blocks designed for ``fmt`` and placed; IRError
        naming a block whose condition fails in ``fmt`` (``search``: the placed blocks' conditions
        too -- a format the caller gives is theirs to choose for the blocks they placed)."""
        for p in self.plan if search else ():
            if _design_of(p.block, fmt, self) is None:
                raise Unmet(f"block {type(p.block).__name__}: its sufficient condition fails in {fmt.name}")
        designed = []
        for block, args in self.deferred:
            d = _design_of(block, fmt, self)
            if d is None:
                raise Unmet(f"block {type(block).__name__}: no choice of its parameters meets its sufficient condition "
                            f"in {fmt.name} (leave precision out to search a format)")
            designed.append((d, args))
        mb = copy.copy(self)
        mb.layers = [copy.copy(L) for L in self.layers]
        for L in mb.layers:
            L.heads, L.units, L.b_O, L.b_out = list(L.heads), list(L.units), list(L.b_O), list(L.b_out)
        mb.plan, mb.unembed_parts, mb.deferred = list(self.plan), list(self.unembed_parts), []
        for d, args in designed:
            d.emit(mb, *args)
        return mb

    def _design(self, answers: list[Any], vocab: list[str], fields: dict[str, Any]) -> tuple[Any, "ModelBuilder", Any]:
        """The precision search of :meth:`build` (fewest bits, then fewest fraction bits): the format,
        the builder with its deferred blocks placed, and the model (None when shapes only)."""
        from exactformer.precision import FixedPoint

        need_int, need_frac = _bits_needed(self._static_values())
        why = "no block condition was met"
        for total in range(3, MAX_BITS + 1):
            for frac in range(max(1, need_frac), total - 1):
                fmt = FixedPoint.binary(int_bits=total - 1 - frac, frac_bits=frac)
                if total - 1 - frac < need_int:
                    continue
                try:
                    mb = self._designed(fmt, search=True)
                except Unmet as e:
                    why = str(e)
                    continue
                if _SHAPES_ONLY.get():
                    return fmt, mb, None
                model = mb._assemble(answers, vocab, dict(fields, precision=fmt.name))
                bad = first_unrepresentable(model, fmt)
                if bad is None:
                    return fmt, mb, model
                why = f"{bad} is not a grid value of {fmt.name}"
        raise IRError(f"build: no binary format up to {MAX_BITS} bits allows the model: at the largest, {why}")

    def _static_values(self) -> Iterator[Exact]:
        """Every value added so far (the deferred blocks' come with the format)."""
        for _, _, v in self.tok_rows + self.pos_rows:
            yield v
        for codes in (self.tok_codes, self.pos_codes):
            for *_, scale in codes:
                yield scale
        for L in self.layers:
            for h in L.heads:
                for key in ("Q", "K", "V", "O"):
                    yield from (M for _, M in h[key])
                yield from (h[b] for b in ("b_Q", "b_K", "b_V") if h[b] is not None)
            for pieces_in, bias, pieces_out, _ in L.units:
                yield from (M for _, M in pieces_in + pieces_out)
                yield bias
            yield from (v for _, v in L.b_O + L.b_out)
        yield from (M for _, M, _ in self.unembed_parts)
        if self.b_U is not None:
            yield self.b_U

    def _assemble(self, answers: list[Any], vocab: list[str], fields: dict[str, Any]) -> CompiledModel:
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
        for slot, M, block in self.unembed_parts:
            with _setting(_BLOCK, (block, False)):
                self._check("W_U", slot, M, (self.layout.width(slot), V), "slot width, answers")
                if self.b_U is not None:
                    self._check("b_U", None, self.b_U, (V,), "answers", scalar=True)
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


# ------------------------------------------------------------------------------------------------
# weights against a format: the first one it cannot hold, and the smallest format that holds all
# ------------------------------------------------------------------------------------------------


def _values(model: CompiledModel) -> Iterator[tuple[str, ExactTensor]]:
    """Every exact tensor of ``model`` by name: the weights, the embedding tables, the code blocks'
    scales."""
    yield from model.tensors().items()
    for prefix, emb in (("embed", model.embed), ("pos_embed", model.pos_embed)):
        yield f"{prefix}.table", emb.table
        for i, b in enumerate(emb.blocks):
            yield f"{prefix}.blocks[{i}].scale", ExactTensor.from_values([b.scale])


def _where(model: CompiledModel, name: str, index: tuple[int, ...]) -> str:
    """Who wrote the weight ``name[index]``: the block of the plan and the slot of its residual column."""
    layout = Layout.from_dict(model.layout) if model.layout else None
    slot = (lambda col: f"slot {layout.slot_of(int(col))!r}") if layout else (lambda col: f"column {col}")
    parts = name.split(".")
    owner = None
    if parts[0] == "blocks" and parts[2] == "attn" and parts[3] != "b_O":
        owner = next((p.block for p in model.plan if p.kind == "head" and p.layer == int(parts[1]) and p.index == index[0]), None)
        col = {"W_Q": 1, "W_K": 1, "W_V": 1, "W_O": 2}.get(parts[3])
        where = [slot(index[col])] if col is not None else []
    elif parts[0] == "blocks" and parts[2] == "mlp" and parts[3] != "b_out":
        unit = {"W_in": 1, "b_in": 0, "W_out": 0}[parts[3]]
        owner = next((p.block for p in model.plan if p.kind == "mlp" and p.layer == int(parts[1])
                      and p.index[0] <= index[unit] < p.index[0] + p.index[1]), None)
        where = [slot(index[0 if parts[3] == "W_in" else 1])] if parts[3] != "b_in" else []
    elif parts[0] == "unembed":
        owner = next((p.block for p in model.plan if p.kind == "unembed"), None)
        where = ([slot(index[0])] if parts[1] == "W_U" else []) + [f"answer {model.answers[index[-1]]!r}"]
    elif name.endswith(".table"):
        first = (model.embed if parts[0] == "embed" else model.pos_embed).table_first_row
        where = [f"{'token' if parts[0] == 'embed' else 'position'} {first + index[0]}", slot(index[1])]
    else:
        where = [slot((model.embed if parts[0] == "embed" else model.pos_embed).blocks[int(name[name.index("[") + 1])].col)]
    if parts[0] == "blocks" and parts[3] in ("b_O", "b_out"):
        where = [slot(index[0])]
    return ", ".join(([f"block {type(owner).__name__}"] if owner is not None else []) + where)


def first_unrepresentable(model: CompiledModel, fmt: Any) -> str | None:
    """``"weight <name>[<index>] = <value> (<block>, <slot>)"`` for the first weight (embeddings
    included) that is not a grid value of ``fmt`` (a fixed-point format), or None."""
    for name, t in _values(model):
        num = np.asarray(t.num)
        for v in np.unique(num):
            value = Fraction(int(v), t.den)
            if not fmt.represents(value):
                index = tuple(int(i) for i in np.argwhere(num == v)[0])
                return f"weight {name}{list(index)} = {value} ({_where(model, name, index)})"
    return None


def _bits_needed(values: Iterator[Exact]) -> tuple[int, int]:
    """(integer bits, fraction bits) of the smallest signed binary format holding every value;
    IRError for a value no binary format holds (a denominator that is not a power of two)."""
    lo = hi = Fraction(0)
    frac = 0
    for v in values:
        num, den = _as_exact(v)
        u = np.unique(np.asarray(num).reshape(-1))
        if u.size == 0:
            continue
        dens = den // np.gcd(u.astype(object) if u.dtype == object else u, den)
        odd = [int(x) for x, d in zip(u.tolist(), np.asarray(dens).tolist()) if int(d) & (int(d) - 1)]
        if odd:
            raise IRError(f"{_who()}weight value {Fraction(odd[0], den)} has a denominator that is not a power of two: "
                          "no binary fixed-point format holds it")
        frac = max(frac, max(int(d).bit_length() - 1 for d in np.asarray(dens).tolist()))
        lo, hi = min(lo, Fraction(int(u.min()), den)), max(hi, Fraction(int(u.max()), den))
    need = max(-lo, hi + Fraction(1, 1 << frac))  # the range is [-2^I, 2^I - 2^-F]
    bits = 0
    while (1 << bits) < need:
        bits += 1
    return bits, frac


def smallest_holding(model: CompiledModel) -> str:
    """The smallest binary format that holds every weight of ``model``, in words."""
    from exactformer.precision import FixedPoint

    try:
        i, f = _bits_needed(t.num if t.den == 1 else (t.num, t.den) for _, t in _values(model))
    except IRError as e:
        return str(e)
    return f"the smallest binary format holding every weight is {FixedPoint.binary(int_bits=i, frac_bits=max(f, int(i == 0))).name}"
