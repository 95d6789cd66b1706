"""The model IR: a compiled transformer as exact data.

A :class:`CompiledModel` has the semantics of a TransformerLens ``HookedTransformer`` without
normalisation (``normalization_type=None``, ``use_attn_scale=False``, ``positional_embedding_type
="standard"``, ``act_fn="relu"``)::

    x_t      = W_E[token_t] + W_pos[t]                                   residual stream [T, d_model]
    per block:
      q, k, v = x W_Q[h] + b_Q[h], x W_K[h] + b_K[h], x W_V[h] + b_V[h]  [n_heads, T, d_head]
      a       = softmax(q k^T)            (no 1/sqrt(d_head); causal mask if ``causal``)
      x       = x + sum_h (a v) W_O[h] + b_O
      x       = x + relu(x W_in + b_in) W_out + b_out
    logits   = x W_U + b_U                                               [T, d_vocab_out]

The paper's psi(M-Att(X)) without a residual connection is expressed by giving each output its own
residual subspace (the builders do this).

Every weight is an :class:`ExactTensor`: integer numerators over one positive integer denominator,
so entries are exact rationals. Embeddings are :class:`Embedding` objects: a small dense table plus
blocks generated on demand from a position code, so no ``n x d`` table is ever needed to run or
verify a model.

This module knows nothing about formats except through :mod:`exactformer.precision`: raw values
for a format are produced by ``fmt.quantize`` and the quantisation is checked to be exact.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from exactformer.precision import Format
from exactformer.constructions.core.streams import GeneratedTokens


class IRError(ValueError):
    """A malformed model (shapes, ranges) or a weight the requested format cannot represent."""


# --------------------------------------------------------------------------------------------
# exact tensors
# --------------------------------------------------------------------------------------------


def _lcm(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


@dataclass(frozen=True)
class ExactTensor:
    """An exact rational tensor ``num / den``.

    ``num``: numpy int64 array (object dtype only if an entry exceeds int64), any shape.
    ``den``: a positive int shared by every entry.
    """

    num: np.ndarray
    den: int = 1

    @staticmethod
    def zeros(*shape: int) -> "ExactTensor":
        return ExactTensor(np.zeros(shape, dtype=np.int64), 1)

    @staticmethod
    def from_values(values: Any) -> "ExactTensor":
        """From ints, Fractions, sympy Rationals or an (object) array of them; never from floats."""
        arr = np.asarray(values, dtype=object)
        flat = [Fraction(v) if not isinstance(v, float) else _reject_float(v) for v in arr.reshape(-1)]
        den = _lcm(f.denominator for f in flat) if flat else 1
        nums = [f.numerator * (den // f.denominator) for f in flat]
        big = any(abs(v) >= 2**62 for v in nums)
        num = np.array(nums, dtype=object if big else np.int64).reshape(arr.shape)
        return ExactTensor(num, den)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.num.shape)

    def fractions(self) -> np.ndarray:
        """Object array of Fractions (slow; for small tensors, tests and exports)."""
        out = np.empty(self.num.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(self.num.reshape(-1)):
            flat[i] = Fraction(int(v), self.den)
        return out

    def to_float(self) -> np.ndarray:
        return self.num.astype(np.float64) / float(self.den)

    def distinct_values(self) -> list[Fraction]:
        return sorted({Fraction(int(v), self.den) for v in np.unique(self.num)})

    def raw(self, fmt: Format) -> np.ndarray:
        """Raw values of every entry under ``fmt`` (numpy), checked to be exact.

        Raises :class:`IRError` naming an entry the format cannot represent. Quantising the
        distinct values only keeps this fast for structured weights.
        """
        num = self.num
        S = getattr(fmt, "scale", None) if fmt.is_exact else None
        if (num.dtype != object and isinstance(S, int) and S % self.den == 0 and num.size > 1 << 16
                and getattr(fmt, "int64_mode", True)):
            f = S // self.den  # multiples of 1/den on a grid of step 1/S: raw = num * S/den exactly
            lo, hi = int(num.min()), int(num.max())
            if fmt.min_raw <= lo * f and hi * f <= fmt.max_raw and max(abs(lo), abs(hi)) * f < 1 << 62:
                return num.astype(np.int64) * f
        if num.dtype != object and num.size > 1 << 16:  # mostly-zero weights: quantise the nonzero entries only
            nz = np.flatnonzero(num)
            if nz.size * 4 < num.size:
                raw_nz = ExactTensor(num.reshape(-1)[nz], self.den).raw(fmt)
                zero = ExactTensor(np.zeros(1, dtype=num.dtype), self.den).raw(fmt)
                out = np.full(num.size, zero[0], dtype=raw_nz.dtype if raw_nz.size else zero.dtype)
                out[nz] = raw_nz
                return out.reshape(num.shape)
        uniq, inv = np.unique(num, return_inverse=True)
        vals = [Fraction(int(v), self.den) for v in uniq]
        if fmt.is_exact:
            bad = [v for v in vals if not fmt.represents(v)]
            if bad:
                raise IRError(
                    f"weight value {bad[0]} is not exactly representable in format {fmt.name} "
                    f"(step {fmt.step}, range [{fmt.to_fraction(fmt.min_raw)}, {fmt.to_fraction(fmt.max_raw)}])"
                )
        raw_uniq = np.asarray(fmt.quantize(np.array(vals, dtype=object)))
        return raw_uniq[inv.reshape(-1)].reshape(self.num.shape)

    def __getitem__(self, idx: Any) -> "ExactTensor":
        return ExactTensor(self.num[idx], self.den)


def _reject_float(v: float) -> Fraction:
    raise IRError(f"weights must be exact rationals, got float {v!r}; pass a Fraction")


def exact(values: Any) -> ExactTensor:
    """Shorthand for :meth:`ExactTensor.from_values` (accepts an ExactTensor unchanged)."""
    return values if isinstance(values, ExactTensor) else ExactTensor.from_values(values)


# --------------------------------------------------------------------------------------------
# embeddings generated on demand
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodeBlock:
    """Rows ``first_row .. first_row+count-1`` hold ``scale * numerators(code_start + r - first_row)``
    in columns ``col .. col+code.k-1``. ``code`` is a position code (``numerators(indices) -> int8``:
    +-1 signs for sign codes, 0/1 rows for one-hot).
    """

    code: Any
    first_row: int
    count: int
    col: int
    code_start: int
    scale: Fraction

    @property
    def rows(self) -> range:
        return range(self.first_row, self.first_row + self.count)

    @property
    def cols(self) -> range:
        return range(self.col, self.col + self.code.k)


@dataclass(frozen=True)
class Embedding:
    """A ``[n_rows, d_model]`` matrix held as a dense table for ``table_rows`` plus code blocks.

    Rows covered by neither are zero. Code blocks must not overlap the table's nonzero entries.
    """

    n_rows: int
    d_model: int
    table: ExactTensor  # [len(table_rows), d_model]
    table_first_row: int = 0
    blocks: tuple[CodeBlock, ...] = ()

    @property
    def table_rows(self) -> range:
        return range(self.table_first_row, self.table_first_row + self.table.shape[0])

    def nonzero_columns(self) -> np.ndarray:
        """Boolean [d_model]: columns where some row may be nonzero."""
        cols = np.any(self.table.num != 0, axis=0) if self.table.shape[0] else np.zeros(self.d_model, bool)
        cols = np.array(cols, dtype=bool)
        for b in self.blocks:
            cols[b.col : b.col + b.code.k] = True
        return cols

    def values(self, rows: np.ndarray) -> ExactTensor:
        """Exact rows ``[len(rows), d_model]`` (used by exports and tests)."""
        rows = np.asarray(rows, dtype=np.int64)
        den = _lcm([self.table.den] + [b.scale.denominator for b in self.blocks])
        out = np.zeros((rows.size, self.d_model), dtype=np.int64)
        self._fill(rows, out, lambda t: t.num * (den // t.den), lambda b: b.scale.numerator * (den // b.scale.denominator))
        return ExactTensor(out, den)

    def raw(self, rows: np.ndarray, fmt: Format, cols: np.ndarray | None = None) -> np.ndarray:
        """Raw rows ``[len(rows), d_model]`` (or ``[len(rows), len(cols)]``) under ``fmt`` (numpy
        int64, or float for float formats)."""
        return self.raw_reader(fmt)(rows, cols)

    def raw_reader(self, fmt: Format) -> Callable[[np.ndarray, np.ndarray | None], np.ndarray]:
        """A function ``(rows, cols=None) -> raw rows`` with the table and the block scales
        quantised once (checked exact: a value ``fmt`` cannot represent raises IRError)."""
        table_raw = self.table.raw(fmt)
        dtype = table_raw.dtype if table_raw.size else (np.float64 if not fmt.is_exact else np.int64)
        scales = {}
        for b in self.blocks:
            ExactTensor.from_values([b.scale]).raw(fmt)  # representability check with a clear error
            scales[id(b)] = np.asarray(fmt.quantize(np.array([b.scale, -b.scale], dtype=object)))

        def read(rows: np.ndarray, cols: np.ndarray | None = None) -> np.ndarray:
            rows = np.asarray(rows, dtype=np.int64)
            if cols is None:
                out = np.zeros((rows.size, self.d_model), dtype=dtype)
                self._fill(rows, out, lambda t: table_raw, None, scales)
                return out
            cols = np.asarray(cols, dtype=np.int64)
            out = np.zeros((rows.size, cols.size), dtype=dtype)
            if np.any(rows < 0) or np.any(rows >= self.n_rows):
                raise IRError(f"embedding row out of range [0, {self.n_rows})")
            in_table = (rows >= self.table_first_row) & (rows < self.table_first_row + self.table.shape[0])
            if np.any(in_table):
                out[in_table] = table_raw[np.ix_(rows[in_table] - self.table_first_row, cols)]
            for b in self.blocks:  # only the blocks that meet the requested columns are generated
                where = np.flatnonzero((cols >= b.col) & (cols < b.col + b.code.k))
                sel = (rows >= b.first_row) & (rows < b.first_row + b.count)
                if where.size == 0 or not np.any(sel):
                    continue
                nums = np.asarray(b.code.numerators(rows[sel] - b.first_row + b.code_start))[:, cols[where] - b.col]
                pos, neg = scales[id(b)]
                out[np.ix_(np.flatnonzero(sel), where)] = np.where(nums > 0, pos, np.where(nums < 0, neg, 0))
            return out

        return read

    def _fill(self, rows, out, table_fn, scale_fn, raw_scales=None) -> None:
        if np.any(rows < 0) or np.any(rows >= self.n_rows):
            raise IRError(f"embedding row out of range [0, {self.n_rows})")
        in_table = (rows >= self.table_first_row) & (rows < self.table_first_row + self.table.shape[0])
        if np.any(in_table):
            out[in_table] = table_fn(self.table)[rows[in_table] - self.table_first_row]
        for b in self.blocks:
            sel = (rows >= b.first_row) & (rows < b.first_row + b.count)
            if not np.any(sel):
                continue
            nums = np.asarray(b.code.numerators(rows[sel] - b.first_row + b.code_start))
            if raw_scales is None:
                s = scale_fn(b)
                out[np.ix_(sel, np.arange(b.col, b.col + b.code.k))] = nums.astype(np.int64) * s
            else:
                pos, neg = raw_scales[id(b)]
                out[np.ix_(sel, np.arange(b.col, b.col + b.code.k))] = np.where(nums > 0, pos, np.where(nums < 0, neg, 0))


# --------------------------------------------------------------------------------------------
# blocks and the model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attention:
    """Multi-head attention. Shapes: W_Q, W_K, W_V [n_heads, d_model, d_head]; W_O [n_heads,
    d_head, d_model]; b_Q, b_K, b_V [n_heads, d_head]; b_O [d_model]."""

    W_Q: ExactTensor
    W_K: ExactTensor
    W_V: ExactTensor
    W_O: ExactTensor
    b_Q: ExactTensor
    b_K: ExactTensor
    b_V: ExactTensor
    b_O: ExactTensor
    causal: bool = False

    @property
    def n_heads(self) -> int:
        return self.W_Q.shape[0]

    @property
    def d_head(self) -> int:
        return self.W_Q.shape[2]


@dataclass(frozen=True)
class MLP:
    """ReLU MLP. Shapes: W_in [d_model, d_mlp], b_in [d_mlp], W_out [d_mlp, d_model], b_out [d_model]."""

    W_in: ExactTensor
    b_in: ExactTensor
    W_out: ExactTensor
    b_out: ExactTensor

    @property
    def d_mlp(self) -> int:
        return self.W_in.shape[1]


@dataclass(frozen=True)
class TransformerBlock:
    attn: Attention
    mlp: MLP


@dataclass
class Param:
    """A derived constant with the formula that produced it (for reports and manifests)."""

    value: Any
    formula: str

    def to_json(self) -> dict:
        v = self.value
        if isinstance(v, Fraction):
            v = str(v) if v.denominator != 1 else v.numerator
        return {"value": v, "formula": self.formula}


@dataclass(frozen=True)
class ModelShape:
    """What a model's size depends on, without its weights: the residual width, per layer (heads,
    d_head, d_mlp) as the stacked tensors hold them, the answers and the dense embedding table rows
    (token and position tables; rows generated from a position code are not stored).
    :attr:`parameters` is the count :meth:`CompiledModel.parameter_count` makes from the tensors."""

    d_model: int
    layers: tuple[tuple[int, int, int], ...]
    d_vocab_out: int
    table_rows: int
    architecture = "transformer"

    @property
    def parameters(self) -> int:
        d = self.d_model
        per_layer = sum(3 * H * d * dh + H * dh * d + 3 * H * dh + d  # W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O
                        + d * U + U + U * d + d                     # W_in, b_in, W_out, b_out
                        for H, dh, U in self.layers)
        return per_layer + d * self.d_vocab_out + self.d_vocab_out + self.table_rows * d

    @property
    def heads(self) -> int:
        return max(H for H, _, _ in self.layers)

    @property
    def d_head(self) -> int:
        return max(dh for _, dh, _ in self.layers)

    @property
    def d_mlp(self) -> int:
        return max(U for _, _, U in self.layers)

    @property
    def width(self) -> int:
        """The paper's width max(m, d) (:attr:`CompiledModel.width`)."""
        return max(self.d_model, self.d_head)


@dataclass(frozen=True)
class VectorInput:
    """Token ids whose inputs carry an exact vector (Theorem 7: the inputs x_i in R^{d'}).

    At a position holding one of ``tokens`` the vector's values are added to residual columns
    ``col .. col+width-1`` of the token embedding (``hook_embed`` = W_E[token] + vector); at every
    other position the vector must be zero. The embedding itself is no finite table of vectors:
    the values arrive with the input (:class:`Inputs`)."""

    tokens: tuple[int, ...]
    col: int
    width: int

    @property
    def cols(self) -> range:
        return range(self.col, self.col + self.width)

    def to_json(self) -> dict[str, Any]:
        return {"tokens": [int(t) for t in self.tokens], "col": int(self.col), "width": int(self.width)}

    @staticmethod
    def from_json(d: dict[str, Any] | None) -> "VectorInput | None":
        return None if d is None else VectorInput(tuple(int(t) for t in d["tokens"]), int(d["col"]), int(d["width"]))


@dataclass(frozen=True)
class Inputs:
    """Token ids [B, T] with the exact vectors [B, T, width] of a model with a
    :class:`VectorInput` (``vectors``: an :class:`ExactTensor`, zero at positions whose token
    carries no vector). Indexing and ``len`` act on the batch axis, like a token array."""

    tokens: np.ndarray
    vectors: ExactTensor

    def __post_init__(self) -> None:
        t, v = np.asarray(self.tokens), self.vectors
        if v.num.ndim != t.ndim + 1 or v.shape[: t.ndim] != t.shape:
            raise IRError(f"vectors must have shape {t.shape} + (width,), got {v.shape}")

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, idx: Any) -> "Inputs":
        t = np.asarray(self.tokens)[idx]
        v = self.vectors.num[idx]
        if np.ndim(t) < np.ndim(self.tokens):  # one input: keep a batch axis of 1
            t, v = t[None], v[None]
        return Inputs(t, ExactTensor(v, self.vectors.den))

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.tokens))

    @property
    def ndim(self) -> int:
        return int(np.ndim(self.tokens))


def split_inputs(model: "CompiledModel", tokens: Any) -> tuple[np.ndarray, ExactTensor | None]:
    """(token ids, exact vectors or None) of what a caller passed to run a model: a token array, or
    :class:`Inputs`. A model with a :class:`VectorInput` needs Inputs (IRError otherwise); the
    vectors must be zero wherever the token carries no vector."""
    vi = getattr(model, "vector_input", None)
    if not isinstance(tokens, Inputs):
        if vi is not None:
            raise IRError(f"{model.construction} reads input vectors: pass Inputs(tokens, vectors), not token ids only")
        return (tokens if isinstance(tokens, GeneratedTokens) else np.asarray(tokens)), None
    if vi is None:
        raise IRError(f"{model.construction} reads no input vectors, but vectors were given")
    t = np.asarray(tokens.tokens)
    v = tokens.vectors
    if v.shape[-1] != vi.width:
        raise IRError(f"vectors must have width {vi.width}, got {v.shape[-1]}")
    carries = np.isin(t, np.asarray(vi.tokens))
    if np.any(v.num[~carries] != 0):
        raise IRError("vectors must be zero at positions whose token carries no vector")
    return t, v


class ModelIR:
    """What every built model is, whatever its architecture: a construction's exact weights with its
    vocabularies, answers and metadata. :class:`CompiledModel` (a transformer) and
    :class:`~exactformer.constructions.core.recurrent.RNNModel` (a recurrent model) are the two kinds;
    the layers above (executor, certificate, exports, the API) reach the kind-specific parts through
    one dispatch point each (``functools.singledispatch`` on the model's class), never by asking
    which kind they hold. Subclasses provide ``construction``, ``theorem``, ``n``, ``answers``,
    ``answer_positions``, ``params``, ``precision``, ``task_params`` and the shape facts ``n_layers``,
    ``n_heads``, ``width``, ``parameter_count()``, ``size_bits(p)``, ``summary()``,
    ``weights_raw(fmt)`` and ``fingerprint()``."""

    answers: list[Any]
    answer_positions: tuple[int, ...] | None

    def answer_positions_for(self, T: int) -> np.ndarray:
        """The positions whose logits are answers, for an input of length ``T`` (0-based)."""
        if self.answer_positions is None:
            return np.array([T - 1], dtype=np.int64)
        pos = np.asarray(self.answer_positions, dtype=np.int64)
        if pos.size == 0 or pos.min() < 0 or pos.max() >= T:
            raise IRError(f"answer positions {list(pos[:4])}... do not fit an input of length {T}")
        return pos

    @property
    def output_vocab(self) -> list[str]:
        return [str(a) for a in self.answers]

    def check(self) -> None:
        """Raise IRError naming the first field that does not fit the others (shapes, ranges)."""
        raise NotImplementedError(type(self).__name__)

    def decode(self, logits: np.ndarray) -> Any:
        """The answer for one row of last-position logits [d_vocab_out] (argmax; ties -> lowest)."""
        return self.answers[int(np.argmax(np.asarray(logits)))]


@dataclass
class CompiledModel(ModelIR):
    """A compiled construction: exact weights, vocabularies and metadata.

    ``vocab[i]`` names input token i; ``output_vocab[i]`` is ``str()`` of the answer logit i stands
    for (``answers[i]`` is the answer itself). The model answers with the argmax of the logits at
    the last position. ``task`` names the construction module whose ``encode`` maps a natural input
    to token ids (see :func:`exactformer.constructions.core.registry.task`).
    """

    construction: str
    theorem: str
    n: int
    embed: Embedding  # W_E [d_vocab, d_model]
    pos_embed: Embedding  # W_pos [n_ctx, d_model]
    blocks: list[TransformerBlock]
    W_U: ExactTensor  # [d_model, d_vocab_out]
    b_U: ExactTensor  # [d_vocab_out]
    vocab: list[str]
    answers: list[Any]
    params: dict[str, Param] = field(default_factory=dict)
    precision: str | None = None  # format name the model was built for
    task_params: dict[str, Any] = field(default_factory=dict)
    answer_positions: tuple[int, ...] | None = None  # None: the last position of the input
    layout: dict[str, list[int]] = field(default_factory=dict)  # residual slot -> [first column, width]
    plan: list[Any] = field(default_factory=list)  # blocks and where they sit (assemble.Placement)
    vector_input: VectorInput | None = None  # token ids whose inputs carry an exact vector
    position_code: Any = None  # the construction's position code (a PositionCode), recorded in saved files

    def check(self) -> None:
        check_shapes(self)

    def fingerprint(self) -> str:
        """sha256 of everything the forward pass depends on: weights, embeddings (tables and the
        position codes' generators), attention masks and answer positions. Equal fingerprints mean
        equal models; caches of input-independent work are keyed by it, never by ``id()``."""
        h = hashlib.sha256()
        for name, t in sorted(self.tensors().items()):
            _hash_tensor(h, name, t)
        for name, emb in (("embed", self.embed), ("pos_embed", self.pos_embed)):
            _hash_embedding(h, name, emb)
        h.update(repr([b.attn.causal for b in self.blocks]).encode())
        h.update(repr(self.answer_positions).encode())
        if self.vector_input is not None:
            h.update(repr(self.vector_input).encode())
        return h.hexdigest()

    # ---- shape facts -------------------------------------------------------------------
    @property
    def d_model(self) -> int:
        return self.embed.d_model

    @property
    def n_ctx(self) -> int:
        return self.pos_embed.n_rows

    @property
    def d_vocab(self) -> int:
        return self.embed.n_rows

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    @property
    def n_heads(self) -> int:
        return max(b.attn.n_heads for b in self.blocks)

    @property
    def d_head(self) -> int:
        return max(b.attn.d_head for b in self.blocks)

    @property
    def d_mlp(self) -> int:
        return max(b.mlp.d_mlp for b in self.blocks)

    @property
    def width(self) -> int:
        """The paper's width max(m, d): m = d_head (projection rows), d = d_model."""
        return max(self.d_model, self.d_head)

    # ---- size accounting -----------------------------------------------------------------
    def tensors(self) -> dict[str, ExactTensor]:
        """The non-embedding weights by TransformerLens state-dict name."""
        out: dict[str, ExactTensor] = {}
        for l, b in enumerate(self.blocks):
            a, m = b.attn, b.mlp
            for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                out[f"blocks.{l}.attn.{name}"] = getattr(a, name)
            for name in ("W_in", "b_in", "W_out", "b_out"):
                out[f"blocks.{l}.mlp.{name}"] = getattr(m, name)
        out["unembed.W_U"] = self.W_U
        out["unembed.b_U"] = self.b_U
        return out

    def shape(self) -> ModelShape:
        return ModelShape(self.d_model, tuple((b.attn.n_heads, b.attn.d_head, b.mlp.d_mlp) for b in self.blocks),
                          len(self.answers), int(self.embed.table.shape[0] + self.pos_embed.table.shape[0]))

    def parameter_count(self, materialized: bool = False) -> int:
        """Stored numbers: every non-embedding weight plus the dense embedding table rows.

        Rows generated on demand from a position code are not stored (App. B.3 generates them in
        log space from the code's few parameters), so they are counted only with
        ``materialized=True``, which counts both embeddings at their full ``n x d_model`` size.
        """
        if materialized:
            n = sum(int(np.prod(t.shape)) for t in self.tensors().values())
            return n + (self.embed.n_rows + self.pos_embed.n_rows) * self.d_model
        return self.shape().parameters

    def size_bits(self, precision_bits: int, materialized: bool = False) -> int:
        """Representation size in bits (Section 2): every stored number at ``precision_bits`` bits."""
        return self.parameter_count(materialized) * precision_bits

    def summary(self) -> dict[str, Any]:
        return {
            "construction": self.construction,
            "theorem": self.theorem,
            "architecture": "transformer",
            "n": self.n,
            "layers": self.n_layers,
            "heads": self.n_heads,
            "d_model": self.d_model,
            "d_head": self.d_head,
            "d_mlp": self.d_mlp,
            "width": self.width,
            "n_ctx": self.n_ctx,
            "d_vocab": self.d_vocab,
            "d_vocab_out": len(self.answers),
            "parameters": self.parameter_count(),
            "parameters_materialized": self.parameter_count(materialized=True),
            "precision": self.precision,
            "params": {k: p.to_json() for k, p in self.params.items()},
        }

    def replace_weight(self, name: str, value: ExactTensor) -> "CompiledModel":
        """A copy with one weight replaced (by state-dict name); used for mutants and loading."""
        import copy

        new = copy.copy(self)
        new.blocks = list(self.blocks)
        if name.startswith("blocks."):
            _, l, kind, w = name.split(".")
            blk = new.blocks[int(l)]
            part = getattr(blk, kind)
            if getattr(part, w).shape != value.shape:
                raise IRError(f"{name}: shape {value.shape} != {getattr(part, w).shape}")
            new.blocks[int(l)] = dataclasses.replace(blk, **{kind: dataclasses.replace(part, **{w: value})})
        elif name in ("unembed.W_U", "unembed.b_U"):
            setattr(new, name.split(".")[1], value)
        else:
            raise IRError(f"unknown weight name {name!r}")
        return new

    def weights_raw(self, fmt: Format) -> dict[str, np.ndarray]:
        """Every non-embedding weight as raw values of ``fmt`` (checked exact)."""
        return {k: t.raw(fmt) for k, t in self.tensors().items()}


def fixed_point_only_heads(plan: Sequence[Any]) -> list[str]:
    """The blocks of a plan's heads whose local certificates prove them in the fixed-point format
    only (``HeadBlock.fixed_point_only``). The one source of "certified in float": the verifier's
    mode choice and refusals (``certificate_refusal``), the manifest ``xf.save`` writes, a build's
    ``params["arithmetics"]`` (``ModelBuilder.build`` notes it there) and the modes table of
    docs/cli.md read it."""
    return sorted({type(p.block).__name__ for p in plan if p.kind == "head" and getattr(p.block, "fixed_point_only", False)})


#: said after a build's ``params["arithmetics"]`` where a head is certified in fixed point only
FIXED_POINT_ONLY_NOTE = "; no certificate covers the floats: its {} heads are certified in fixed point only"


def _hash_tensor(h: "hashlib._Hash", name: str, t: ExactTensor) -> None:
    num = t.num
    h.update(f"{name}|{num.shape}|{num.dtype}|{t.den}|".encode())
    if num.dtype == object:
        h.update(repr(num.tolist()).encode())
        return
    nz = np.flatnonzero(num) if num.size > 1 << 16 else None
    if nz is not None and nz.size * 4 < num.size:  # mostly zero: the nonzero entries and where they are
        h.update(b"sparse|" + nz.tobytes() + num.reshape(-1)[nz].tobytes())
    else:
        h.update(np.ascontiguousarray(num).tobytes())


def _hash_embedding(h: "hashlib._Hash", name: str, emb: Embedding) -> None:
    h.update(f"{name}|{emb.n_rows}|{emb.d_model}|{emb.table_first_row}|".encode())
    _hash_tensor(h, name + ".table", emb.table)
    for b in emb.blocks:
        h.update(f"block|{b.first_row}|{b.count}|{b.col}|{b.code_start}|{b.scale}|".encode())
        h.update(code_fingerprint(b.code).encode())


def code_fingerprint(code: Any) -> str:
    """A digest of a position code's content: its generator's parameters when it has a
    deterministic generator (``generator_key()``), else every vector it holds."""
    key = getattr(code, "generator_key", None)
    if key is not None:  # the width and length too: code blocks read k columns of n rows whatever the generator
        return hashlib.sha256(repr((type(code).__name__, int(code.n), int(code.k), key())).encode()).hexdigest()
    h = hashlib.sha256(f"{type(code).__name__}|{code.n}|{code.k}|".encode())
    step = max(1, (1 << 22) // max(int(code.k), 1))
    for s in range(0, int(code.n), step):
        h.update(np.ascontiguousarray(code.numerators(np.arange(s, min(int(code.n), s + step)))).tobytes())
    return h.hexdigest()


def sequence_rows(examples: Sequence[Any]) -> np.ndarray:
    """Natural inputs that are one sequence each (a list of ints, or a 1-tuple holding one, as the
    verifier's counterexamples are) -> an int array [B, N], for the constructions' encoders."""
    rows = [e[0] if isinstance(e, tuple) and len(e) == 1 and not isinstance(e[0], (int, np.integer)) else e
            for e in examples]
    return np.asarray([list(r) for r in rows])


def check_embedding(name: str, emb: Embedding, d_model: int) -> None:
    """Raise IRError naming the field of ``emb`` that does not fit a ``[n_rows, d_model]`` matrix: the
    dense table's shape and rows, and each code block's rows, columns and code indices."""
    if emb.d_model != d_model:
        raise IRError(f"{name}.d_model is {emb.d_model}, the residual stream's width is {d_model}")
    t = emb.table
    if t.num.ndim != 2 or (t.shape[0] and t.shape[1] != d_model):
        raise IRError(f"{name}.table has shape {t.shape}, expected [rows, {d_model}]")
    if emb.table_first_row < 0 or emb.table_first_row + t.shape[0] > emb.n_rows:
        raise IRError(f"{name}.table rows [{emb.table_first_row}, {emb.table_first_row + t.shape[0]}) do not fit "
                      f"n_rows = {emb.n_rows}")
    for i, b in enumerate(emb.blocks):
        where = f"{name}.blocks[{i}]"
        if b.first_row < 0 or b.count < 0 or b.first_row + b.count > emb.n_rows:
            raise IRError(f"{where}: rows [{b.first_row}, {b.first_row + b.count}) do not fit n_rows = {emb.n_rows}")
        if b.col < 0 or b.col + b.code.k > d_model:
            raise IRError(f"{where}: columns [{b.col}, {b.col + b.code.k}) do not fit d_model = {d_model}")
        if b.code_start < 0 or b.code_start + b.count > b.code.n:
            raise IRError(f"{where}: code indices [{b.code_start}, {b.code_start + b.count}) do not fit its code's "
                          f"n = {b.code.n}")
        if b.count and np.shape(b.code.numerators(np.array([b.code_start])))[-1] != b.code.k:
            raise IRError(f"{where}.code: its vectors do not have k = {b.code.k} entries")


def check_shapes(model: CompiledModel) -> None:
    """Raise IRError naming the field if shapes are inconsistent (the weights, the embeddings, the
    answers and the answer positions)."""
    d = model.d_model
    check_embedding("embed", model.embed, d)
    check_embedding("pos_embed", model.pos_embed, d)
    for l, b in enumerate(model.blocks):
        a = b.attn
        h, dm, dh = a.W_Q.shape
        for name, shape in (("W_K", (h, d, dh)), ("W_V", (h, d, dh)), ("W_O", (h, dh, d)), ("b_Q", (h, dh)),
                            ("b_K", (h, dh)), ("b_V", (h, dh)), ("b_O", (d,))):
            if getattr(a, name).shape != shape:
                raise IRError(f"blocks.{l}.attn.{name} has shape {getattr(a, name).shape}, expected {shape}")
        if dm != d:
            raise IRError(f"blocks.{l}.attn.W_Q has d_model {dm}, expected {d}")
        m = b.mlp
        dmlp = m.W_in.shape[1]
        for name, shape in (("W_in", (d, dmlp)), ("b_in", (dmlp,)), ("W_out", (dmlp, d)), ("b_out", (d,))):
            if getattr(m, name).shape != shape:
                raise IRError(f"blocks.{l}.mlp.{name} has shape {getattr(m, name).shape}, expected {shape}")
    if model.W_U.shape != (d, len(model.answers)):
        raise IRError(f"unembed.W_U has shape {model.W_U.shape}, expected {(d, len(model.answers))}")
    if model.b_U.shape != (len(model.answers),):
        raise IRError(f"unembed.b_U has shape {model.b_U.shape}, expected {(len(model.answers),)}")
    if len(model.vocab) != model.d_vocab:
        raise IRError(f"vocab has {len(model.vocab)} names for {model.d_vocab} tokens")
    pos = model.answer_positions
    if pos is not None and (not pos or min(pos) < 0 or max(pos) >= model.n_ctx):
        raise IRError(f"answer_positions must be positions in [0, {model.n_ctx}), got {list(pos)[:4]}")
    vi = model.vector_input
    if vi is not None:
        if vi.width < 1 or vi.col < 0 or vi.col + vi.width > d:
            raise IRError(f"vector_input columns [{vi.col}, {vi.col + vi.width}) do not fit d_model = {d}")
        if not vi.tokens or min(vi.tokens) < 0 or max(vi.tokens) >= model.d_vocab:
            raise IRError(f"vector_input tokens must be ids in [0, {model.d_vocab})")
