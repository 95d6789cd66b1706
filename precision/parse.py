"""Formats by name: :func:`parse_format` (``fmt.name`` round-trips)."""

from __future__ import annotations

import re

from .base import Format
from .errors import PrecisionError
from .fixed_point import FixedPoint
from .floats import Float32, Float64


_KV = re.compile(r"^\s*([a-z_]+)\s*=\s*([^,\s]+)\s*$")


def _parse_kv(body: str, spec: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in body.split(","):
        m = _KV.match(part)
        if not m:
            raise PrecisionError(f"format {spec!r}: cannot parse {part!r} (expected key=value)")
        out[m.group(1)] = m.group(2)
    return out


def _int_param(kv, key, spec):
    if key not in kv:
        raise PrecisionError(f"format {spec!r}: missing parameter {key}")
    try:
        return int(kv.pop(key))
    except ValueError:
        raise PrecisionError(f"format {spec!r}: parameter {key} must be an integer") from None


_FORMS = ('"binary:int=I,frac=F[,rounding=floor|nearest-even]", "paper:n=N,kc=K", '
          '"fixed:scale=S,min=LO,max=HI[,rounding=...]", "float64", "float32"')


def parse_format(spec) -> Format:
    """Format from its name (``fmt.name`` round-trips). A Format is returned unchanged."""
    if isinstance(spec, Format):
        return spec
    if not isinstance(spec, str):
        raise PrecisionError(f"format spec must be a string, one of {_FORMS}; got {type(spec).__name__}")
    s = spec.strip().lower()
    if s in ("float64", "fp64", "double"):
        return Float64
    if s in ("float32", "fp32", "single"):
        return Float32
    kind, sep, body = s.partition(":")
    if not sep:
        raise PrecisionError(f"unknown format {spec!r}; allowed: {_FORMS}")
    kv = _parse_kv(body, spec)
    if kind == "binary":
        i = _int_param(kv, "int", spec)
        f = _int_param(kv, "frac", spec)
        rounding = kv.pop("rounding", "floor")
        fmt = FixedPoint.binary(int_bits=i, frac_bits=f, rounding=rounding)
    elif kind == "paper":
        n = _int_param(kv, "n", spec)
        kc = _int_param(kv, "kc", spec)
        fmt = FixedPoint.paper(n=n, kc=kc)
    elif kind == "fixed":
        S = _int_param(kv, "scale", spec)
        lo = _int_param(kv, "min", spec)
        hi = _int_param(kv, "max", spec)
        rounding = kv.pop("rounding", "floor")
        fmt = FixedPoint(S, lo, hi, rounding)
    else:
        raise PrecisionError(f"unknown format kind {kind!r} in {spec!r}; allowed: {_FORMS}")
    if kv:
        raise PrecisionError(f"format {spec!r}: unknown parameter(s) {sorted(kv)}; allowed: {_FORMS}")
    return fmt
