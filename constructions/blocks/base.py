"""What every block is: weights on named slots, a sufficient condition, a local certificate.

A block is a small frozen dataclass of parameters (slot names, scales), so a model's plan can be
saved and read back (:meth:`Block.to_json`, :meth:`Block.from_fields`). Every block class is
registered by the decorator :func:`block` in the table :data:`BLOCKS` (by class name): the package's
blocks when :mod:`exactformer.constructions.blocks` is imported, a user's block when its module is
(the saved manifest records that module; ``xf.load`` imports it only where the caller allows). The
interface is declared here: a :class:`HeadBlock` owns one attention head and has a local certificate
(:meth:`HeadBlock.certify_head`), an :class:`MLPBlock` owns MLP units (certified from the weights by
the exact MLP image), a :class:`ReadoutBlock` writes the unembedding. Blocks add their weights
through a :class:`~exactformer.constructions.core.builder.ModelBuilder`; the composed certificate
(:mod:`exactformer.verify.certify.composed`) calls the local certificates with a :class:`CertContext`. A
local certificate reads the model's *own* weights where the block sits (never the block's
parameters as facts) and either returns what it proves or raises :class:`Unproven`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from abc import ABC, abstractmethod
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from exactformer.constructions.core.builder import naming_block
from exactformer.constructions.core.proof import CertContext
from exactformer.precision.boxes import Box


class BlockError(TypeError):
    """A block class that cannot be registered (not a frozen dataclass deriving from Block, or a
    name another module registered); the message names the class."""


#: every registered block class by its name (:func:`block`); a saved plan names its blocks by it
BLOCKS: dict[str, type["Block"]] = {}


def block(cls: type) -> type:
    """Class decorator: register a block class under its name in :data:`BLOCKS`, so that a saved
    plan naming it loads. The class must derive from :class:`HeadBlock`, :class:`MLPBlock` or
    :class:`ReadoutBlock` and be a frozen dataclass (its fields are what is saved). A name is
    registered by one module (re-running that module registers it anew)."""
    if not (isinstance(cls, type) and issubclass(cls, Block)):
        raise BlockError(f"@block: {getattr(cls, '__name__', cls)!r} is not a Block subclass (derive from HeadBlock, "
                         "MLPBlock or ReadoutBlock)")
    params = getattr(cls, "__dataclass_params__", None)
    if "__dataclass_fields__" not in cls.__dict__ or params is None or not params.frozen:
        raise BlockError(f"@block: {cls.__name__} must be a frozen dataclass (put @block above @dataclass(frozen=True))")
    known = BLOCKS.get(cls.__name__)
    if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
        raise BlockError(f"@block: a block named {cls.__name__!r} is already registered by {known.__module__}; "
                         f"{cls.__module__}.{cls.__qualname__} must use another name")
    BLOCKS[cls.__name__] = cls
    return cls


@dataclass(frozen=True)
class Block(ABC):
    """Base of every block. ``kind`` is where its weights sit: "head", "mlp" or "unembed".

    Every subclass's ``emit`` reports an error naming the block and its layer
    (:func:`~exactformer.constructions.core.builder.naming_block`)."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "emit" in cls.__dict__ and not getattr(cls.__dict__["emit"], "__wrapped__", None):
            cls.emit = naming_block(cls.__dict__["emit"])

    def design(self, fmt: Any, mb: Any) -> "Block | None":
        """This block for the format ``fmt`` (a :class:`~exactformer.precision.Format`), given the
        model builder ``mb`` it is placed in: with the parameters it leaves to the build chosen (a
        block whose ``emit`` deferred itself, :meth:`ModelBuilder.defer`), or None where its
        sufficient condition fails in ``fmt`` (the build then tries another format). The default:
        no condition on the format, itself."""
        return self

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"block": type(self).__name__}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = _to_json(v)
        return out

    @classmethod
    def from_fields(cls, d: dict[str, Any]) -> "Block":
        """The block of this class whose fields :meth:`to_json` wrote into ``d``."""
        hints = typing.get_type_hints(cls)
        kwargs = {f.name: _from_json(d[f.name], hints.get(f.name)) for f in dataclasses.fields(cls) if f.name in d}
        return cls(**kwargs)


@dataclass(frozen=True)
class HeadBlock(Block):
    """A block that owns one attention head. ``engine`` names the certificate that composes its
    local certificate: "views" (:class:`ViewHead`) or "pointers" (:class:`PointerHead`)."""

    kind: ClassVar[str] = "head"
    engine: ClassVar[str] = ""
    #: True where the local certificate proves the head in the fixed-point format only (the verifier's
    #: default mode then samples a model run in floats or reals instead of certifying it)
    fixed_point_only: ClassVar[bool] = False
    #: the attention masks the local certificate proves the head under (``Attention.causal``): a
    #: certificate that bounds the row over every key proves the bidirectional head only; one that
    #: reads the layer's flag, both. The coverage step reads each owned head's flag against this
    #: (:func:`exactformer.verify.certify.layers.owners`)
    masks: ClassVar[tuple[bool, ...]] = (False,)

    @abstractmethod
    def emit(self, mb: Any, layer: int) -> int:
        """Add the head's weights to ``mb`` (a ModelBuilder) in ``layer``; return the head index."""


@dataclass(frozen=True)
class ViewHead(HeadBlock):
    """A head certified over views (:mod:`exactformer.constructions.core.views`): its output at the
    needed positions as boxes over the views' input variables."""

    engine: ClassVar[str] = "views"
    #: True where the certificate derives the logits from code columns (the codes' generators),
    #: so the query and key columns need no views
    reads_codes: ClassVar[bool] = False
    #: True where the local certificate reads columns that follow a code-held content pointer
    #: (:class:`~exactformer.constructions.core.views.CodeAxis`) coordinate by coordinate; any other
    #: head that reads such a column is Unproven
    reads_code_axis: ClassVar[bool] = False

    @abstractmethod
    def certify_head(self, ctx: "CertContext", layer: int, head: int, state: Any, need: np.ndarray) -> list[tuple[Any, Box]]:
        """The head's output at the positions ``need`` as (view group, output box) pairs, proved from
        the model's weights and the views ``state``; raises :class:`Unproven` where it cannot."""

    def view_columns(self, model: Any, head_weights: dict[str, np.ndarray]) -> np.ndarray:
        """The residual columns the certificate reads from views [d_model] (bool): every column the
        value reads, and the query's and key's unless the logits come from codes (``reads_codes``)."""
        read = np.any(head_weights["W_V"] != 0, axis=1)
        if not self.reads_codes:
            read = read | np.any(head_weights["W_Q"] != 0, axis=1) | np.any(head_weights["W_K"] != 0, axis=1)
        return read


@dataclass(frozen=True)
class PointerHead(HeadBlock):
    """A head certified over slot facts (:mod:`exactformer.constructions.core.pointers`): from the
    facts of the columns it reads, the facts of the columns it writes, at every position."""

    engine: ClassVar[str] = "pointers"
    fixed_point_only: ClassVar[bool] = True  # verify/certify/pointer.py reads raw fixed-point values

    @abstractmethod
    def certify_pointer(self, ctx: "CertContext", layer: int, head: int, facts: dict[int, Any]) -> dict[int, Any]:
        """The head's output on every residual column it writes (column -> a ``Noisy`` fact), proved
        from the model's weights and the facts of the columns it reads; raises :class:`Unproven`."""


@dataclass(frozen=True)
class MLPBlock(Block):
    """A block that owns MLP units (certified from the weights: the exact MLP image)."""

    kind: ClassVar[str] = "mlp"

    @abstractmethod
    def emit(self, mb: Any, layer: int) -> None:
        """Add the units to ``mb`` in ``layer``."""


@dataclass(frozen=True)
class ReadoutBlock(Block):
    """A block that writes the unembedding (certified by the composed certificate's readout)."""

    kind: ClassVar[str] = "unembed"

    @abstractmethod
    def emit(self, mb: Any) -> None:
        """Add the unembedding to ``mb``."""


def paired_slots(block: Any) -> None:
    """A frozen block's ``value`` and ``out`` as tuples of slot names (a name alone is a tuple of
    one), paired one to one (its ``__post_init__``)."""
    for name in ("value", "out"):
        if isinstance(getattr(block, name), str):
            object.__setattr__(block, name, (getattr(block, name),))
    if len(block.value) != len(block.out):
        raise ValueError(f"{type(block).__name__}: value {block.value} and out {block.out} must pair slots one to one")


def copied_through(mb: Any, value: tuple[str, ...], out: tuple[str, ...], d_head: int) -> tuple[list, list]:
    """A head's V and O pieces copying the slots ``value`` to the slots ``out`` through head dims
    0, 1, ... (identities); the paired slots must have the same widths."""
    V, O, d0 = [], [], 0
    for s_in, s_out in zip(value, out):
        n = mb.layout.width(s_in)
        if mb.layout.width(s_out) != n:
            raise ValueError(f"value slot {s_in!r} has width {n}, out slot {s_out!r} {mb.layout.width(s_out)}")
        V.append((s_in, np.eye(n, d_head, d0, dtype=np.int64)))
        O.append((s_out, np.eye(d_head, n, -d0, dtype=np.int64)))
        d0 += n
    return V, O


def _to_json(v: Any) -> Any:
    if isinstance(v, Fraction):
        return str(v)
    if isinstance(v, (tuple, list)):
        return [_to_json(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    return v


def _from_json(v: Any, hint: Any) -> Any:
    if hint is Fraction:
        return Fraction(v)
    origin = typing.get_origin(hint)
    if v is not None and (origin is typing.Union or isinstance(hint, types.UnionType)) and Fraction in typing.get_args(hint):
        return Fraction(v)  # Fraction | None
    if origin is tuple or (isinstance(v, list) and hint is not None):
        args = typing.get_args(hint)
        inner = args[0] if args else None
        return tuple(_from_json(x, inner) for x in v)
    return v
