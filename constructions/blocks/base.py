"""What every block is: weights on named slots, a sufficient condition, a local certificate.

A block is a small frozen dataclass of parameters (slot names, scales) registered by name, so a
model's plan can be saved and read back (:meth:`Block.to_json`). Blocks add their weights through a
:class:`~exactformer.constructions.assemble.ModelBuilder`; the composed certificate
(:mod:`exactformer.verify.certify`) calls their local certificates with a :class:`CertContext`.
A local certificate reads the model's *own* weights where the block sits (never the block's
parameters as facts) and either returns what it proves or raises :class:`Unproven`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from exactformer.precision.boxes import Arithmetic

BLOCKS: dict[str, type] = {}


class Unproven(Exception):
    """A proof step failed. ``hint`` tells the counterexample search which inputs to try."""

    def __init__(self, reason: str, hint: dict | None = None):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint or {}


def register(cls: type) -> type:
    """Class decorator: make a block dataclass known by its class name (for saved plans)."""
    BLOCKS[cls.__name__] = cls
    return cls


@dataclass(frozen=True)
class Block:
    """Base of every block. ``kind`` is where its weights sit: "head", "mlp" or "unembed"."""

    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"block": type(self).__name__}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = _to_json(v)
        return out

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Block":
        name = d.get("block")
        if name not in BLOCKS:
            raise ValueError(f"unknown block {name!r} (known: {sorted(BLOCKS)})")
        cls = BLOCKS[name]
        hints = typing.get_type_hints(cls)
        kwargs = {f.name: _from_json(d[f.name], hints.get(f.name)) for f in dataclasses.fields(cls) if f.name in d}
        return cls(**kwargs)


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
    if origin is tuple or (isinstance(v, list) and hint is not None):
        args = typing.get_args(hint)
        inner = args[0] if args else None
        return tuple(_from_json(x, inner) for x in v)
    return v


@dataclass
class CertContext:
    """What local certificates read: the model, its raw weights in the arithmetic, slot columns,
    the token domain of every position, and a details dict for the report."""

    model: Any
    arith: Arithmetic
    W: dict[str, np.ndarray]
    domains: Any  # exactformer.constructions.task.Domains
    T: int
    device: str = "cpu"
    details: dict[str, Any] = field(default_factory=dict)
    written: list[np.ndarray] = field(default_factory=list)  # per layer: columns earlier layers write

    def slot(self, name: str) -> np.ndarray:
        start, width = self.model.layout[name]
        return np.arange(start, start + width)

    def head_weights(self, layer: int, head: int) -> dict[str, np.ndarray]:
        p = f"blocks.{layer}.attn."
        return {w: self.W[p + w][head] for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")}
