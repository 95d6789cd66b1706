"""exactformer.precision: exact p-bit fixed-point arithmetic (App. B.2) and plain floats.

>>> from exactformer.precision import FixedPoint
>>> fmt = FixedPoint.binary(int_bits=5, frac_bits=5)
>>> r = fmt.quantize([0.5, -1.25])
>>> fmt.to_fraction(fmt.mul(r, r)).tolist()
[Fraction(1, 4), Fraction(25, 16)]

See docs/precision.md for the semantics of every operation. Modules: ``base`` (the Format
interface, counts, tagging), ``fixed_point`` (FixedPoint), ``floats`` (Float64, Float32, BFloat16, Float16, Float8E4M3, Float8E5M2),
``parse`` (parse_format), ``_exact`` (exact values of inputs), ``_wide``/``_exp``/``_matmul``
(exact integer kernels), ``reference`` (slow Fraction-only semantics for the tests).
"""

from .errors import FormatMismatchError, PrecisionError, RawTypeError
from .base import ACCUMULATE, Counts, Format, RawArray
from .fixed_point import ROUNDINGS, FixedPoint
from .floats import BFloat16, Float8E4M3, Float8E5M2, Float16, Float32, Float64, FloatFormat, float_format
from .parse import parse_format
from .prepared import Prepared
from ._xp import NO_CUDA, cuda_available

__all__ = [
    "ACCUMULATE",
    "NO_CUDA",
    "ROUNDINGS",
    "BFloat16",
    "Counts",
    "FixedPoint",
    "Float8E4M3",
    "Float8E5M2",
    "Float16",
    "Float32",
    "Float64",
    "FloatFormat",
    "Format",
    "FormatMismatchError",
    "PrecisionError",
    "Prepared",
    "RawArray",
    "RawTypeError",
    "cuda_available",
    "float_format",
    "parse_format",
]
