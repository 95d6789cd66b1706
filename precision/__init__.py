"""exactformer.precision: exact p-bit fixed-point arithmetic (App. B.2) and plain floats.

>>> from exactformer.precision import FixedPoint
>>> fmt = FixedPoint.binary(int_bits=5, frac_bits=5)
>>> r = fmt.quantize([0.5, -1.25])
>>> fmt.to_fraction(fmt.mul(r, r)).tolist()
[Fraction(1, 4), Fraction(25, 16)]

See docs/precision.md for the semantics of every operation.
"""

from .errors import FormatMismatchError, PrecisionError, RawTypeError
from .formats import (
    ACCUMULATE,
    ROUNDINGS,
    Counts,
    FixedPoint,
    Float32,
    Float64,
    FloatFormat,
    Format,
    RawArray,
    parse_format,
)
from .prepared import Prepared

__all__ = [
    "ACCUMULATE",
    "ROUNDINGS",
    "Counts",
    "FixedPoint",
    "Float32",
    "Float64",
    "FloatFormat",
    "Format",
    "FormatMismatchError",
    "PrecisionError",
    "Prepared",
    "RawArray",
    "RawTypeError",
    "parse_format",
]
