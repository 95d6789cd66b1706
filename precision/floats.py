"""IEEE floating point formats as torch runs them on the CPU: ``Float64``, ``Float32``, ``BFloat16``,
``Float16``, ``Float8E4M3`` and ``Float8E5M2`` (singletons), for comparison with the exact formats.

Each format is a :class:`FloatGrid` (its significand digits, exponent range, largest value and what
overflow does). The reduced formats (16 and 8 bits) are *storage* formats: torch's CPU kernels
convert their operands to float32, compute in float32 (sums and matrix products accumulated in
float32) and round each stored result once to the format (``FloatGrid.compute``, torch's "opmath"
type). Their raw values are float32 arrays holding values of the grid; every operation here
computes in float32 and rounds the result to nearest (ties to even), as torch does.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ._exact import exact_value, rational_or_none
from ._xp import NP, is_torch, torch_xp
from .base import ACCUMULATE, Format, RawArray
from .errors import PrecisionError, RawTypeError

ROUNDING_MODES = ("nearest", "down", "up")


@dataclass(frozen=True)
class FloatGrid:
    """The values of a binary floating-point format: ``digits`` significand bits (the leading one
    included), normal numbers from 2^``emin`` up to ``max``, subnormals below (spacing
    :attr:`tiny`). ``overflow``: "inf" (IEEE: beyond the range rounds to +-inf) or "saturate" (torch's
    float8_e4m3fn conversion clamps to +-max; the format has no infinity). ``compute``: the grid torch
    computes in on the CPU before rounding a result to this one; ``torch_name``: torch's dtype."""

    name: str
    digits: int
    emin: int
    max: float
    overflow: str
    torch_name: str
    compute: str
    bits: int

    @property
    def u(self) -> float:
        """The unit roundoff 2^-digits: a rounding to nearest errs by at most u relative (normal range)."""
        return 2.0 ** -self.digits

    @property
    def tiny(self) -> float:
        """The smallest positive (subnormal) value, the spacing of the grid below 2^emin."""
        return 2.0 ** (self.emin - self.digits + 1)

    @property
    def overflow_threshold(self) -> float:
        """The smallest magnitude that rounds (to nearest) beyond ``max``: max + half its spacing."""
        return self.max + 2.0 ** (int(np.frexp(self.max)[1]) - 1 - self.digits)

    def round(self, x: np.ndarray, mode: str = "nearest") -> np.ndarray:
        """float64 values ``x`` rounded to the grid (float64 results, exact): to nearest with ties to
        even, down or up. Overflow as the format does: +-inf (``overflow="inf"``; rounding down keeps
        +max, rounding up keeps -max) or clamped to +-max ("saturate"). NaN stays NaN."""
        x = np.asarray(x, dtype=np.float64)
        if self.digits == 53:
            return x
        op = {"nearest": np.rint, "down": np.floor, "up": np.ceil}[mode]
        with np.errstate(over="ignore", invalid="ignore"):
            e = np.frexp(x)[1]  # |x| in [2^(e-1), 2^e)
            q = np.ldexp(1.0, np.maximum(e - 1, self.emin) - (self.digits - 1))  # the spacing at x
            r = op(x / q) * q  # exact: x / q is x scaled by a power of two
            r = np.where(np.isfinite(x), r, x)
            if self.overflow == "saturate":
                return np.clip(r, -self.max, self.max)
            hi = np.inf if mode in ("nearest", "up") else self.max
            lo = -np.inf if mode in ("nearest", "down") else -self.max
            if mode == "nearest":
                big = np.abs(x) >= self.overflow_threshold
                return np.where(big, np.copysign(np.inf, x), r)
            return np.where(r > self.max, hi, np.where(r < -self.max, lo, r))


_F64_MAX = float(np.finfo(np.float64).max)
_F32_MAX = float(np.finfo(np.float32).max)
#: every float format by name: float64 and float32 compute in themselves, the reduced formats in float32
GRIDS: dict[str, FloatGrid] = {g.name: g for g in (
    FloatGrid("float64", 53, -1022, _F64_MAX, "inf", "float64", "float64", 64),
    FloatGrid("float32", 24, -126, _F32_MAX, "inf", "float32", "float32", 32),
    FloatGrid("bfloat16", 8, -126, float.fromhex("0x1.fep127"), "inf", "bfloat16", "float32", 16),
    FloatGrid("float16", 11, -14, 65504.0, "inf", "float16", "float32", 16),
    FloatGrid("float8_e4m3", 4, -6, 448.0, "saturate", "float8_e4m3fn", "float32", 8),
    FloatGrid("float8_e5m2", 3, -14, 57344.0, "inf", "float8_e5m2", "float32", 8),
)}
#: the formats whose results torch computes in float32 and rounds to the format
REDUCED = ("bfloat16", "float16", "float8_e4m3", "float8_e5m2")


def round_via_float32(x: np.ndarray, grid: FloatGrid) -> np.ndarray:
    """What torch holds after converting float64 values ``x`` to ``grid``'s dtype: rounded to float32
    first, then to the grid (torch converts double to the reduced types through float; float64 and
    float32 are rounded once). float64 results."""
    x = np.asarray(x, dtype=np.float64)
    if grid.digits == 53:
        return x
    with np.errstate(over="ignore"):
        f = x.astype(np.float32).astype(np.float64)
    return f if grid.name == "float32" else grid.round(f)


class FloatFormat(Format):
    """A float format (:data:`GRIDS`) as torch computes in it on the CPU. Raw values are float
    values (numpy float64 / float32 arrays, or torch float tensors of the compute dtype); a reduced
    format's raw values are float32 values on its grid, and every operation computes in float32 and
    rounds its result to the grid. ``counts.saturations`` counts results that overflow the format's
    range from finite inputs (to +-inf, or clamped for float8_e4m3); ``counts.underflows`` counts
    products, quotients and exponentials that are 0 although their exact value is not."""

    is_exact = False
    scale = None
    step = None

    def __init__(self, name: str):
        super().__init__()
        self.grid = GRIDS[name]
        self.name = name
        self.bits = self.grid.bits
        self.reduced = name in REDUCED
        self.np_dtype = np.float64 if name == "float64" else np.float32
        self.max_raw = self.grid.max
        self.min_raw = -self.grid.max
        self.int64_mode = False

    def __call__(self):
        """``Float64()`` is ``Float64`` (the formats are singletons)."""
        return self

    def __reduce__(self):
        return _SINGLETON_NAMES[self.name]  # unpickles to the module's singleton

    def _tdtype(self, t):
        return t.float64 if self.name == "float64" else t.float32

    def _round(self, xp, r, counted: bool = False):
        """Results computed in the compute dtype, rounded to a reduced format's grid (unchanged for
        float32/float64); with ``counted`` also the number of results beyond the range."""
        if not self.reduced:
            return (r, 0) if counted else r
        if xp.torch:
            t = xp.t
            sat = (t.abs(r) >= self.grid.overflow_threshold).sum() if counted else 0
            out = r.to(getattr(t, self.grid.torch_name)).to(t.float32)
        else:
            sat = int(np.count_nonzero(np.abs(r) >= self.grid.overflow_threshold)) if counted else 0
            out = self.grid.round(np.asarray(r, np.float64)).astype(np.float32)
        return (out, sat) if counted else out

    def represents(self, x) -> bool:
        v = rational_or_none(x)
        if v is None or abs(v) > Fraction(self.grid.max):
            return False
        f = float(v)
        return Fraction(float(self.grid.round(np.array(f)))) == v and Fraction(f) == v

    def quantize(self, x):
        """Float values of x as torch holds them (correctly rounded to float64 from exact
        rationals, then converted: reduced formats through float32). NaN/inf are errors."""
        if is_torch(x):
            xp = torch_xp(x.device)
            r = self._round(xp, x.to(self._tdtype(xp.t)))
            if r.is_floating_point() and not bool(xp.t.isfinite(r).all().item()):
                raise PrecisionError("quantize: x contains NaN or inf (or overflows); only finite values are allowed")
            return r
        scalar = not isinstance(x, np.ndarray) and np.ndim(x) == 0
        try:
            arr = np.asarray(x)
        except (ValueError, OverflowError):
            arr = np.asarray(x, dtype=object)
        if arr.dtype == object:
            vals = []
            for v in arr.reshape(-1).tolist():
                ev = exact_value(v)
                vals.append(float(ev[1].evalf(30)) if isinstance(ev, tuple) else float(ev))
            arr = np.array(vals, dtype=np.float64).reshape(arr.shape)
        elif arr.dtype.kind not in "biuf":
            raise RawTypeError(f"quantize: x has dtype {arr.dtype}; allowed: numbers or arrays of numbers")
        with np.errstate(over="ignore"):
            r = round_via_float32(arr.astype(np.float64), self.grid).astype(self.np_dtype) if self.reduced \
                else arr.astype(self.np_dtype)
        if not np.all(np.isfinite(r)):
            raise PrecisionError("quantize: x contains NaN or inf (or overflows); only finite values are allowed")
        return r[()] if scalar else r

    def to_fraction(self, raw):
        arr = raw.detach().cpu().numpy() if is_torch(raw) else np.asarray(raw)
        if arr.ndim == 0:
            return Fraction(float(arr[()]))
        out = np.empty(arr.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(arr.reshape(-1).tolist()):
            flat[i] = Fraction(float(v))
        return out

    def to_float(self, raw):
        arr = raw.detach().cpu().numpy() if is_torch(raw) else np.asarray(raw)
        return arr.astype(np.float64)

    def _prep(self, op, args, names):
        dev = None
        for a in args:
            if is_torch(a):
                dev = a.device
        xp = NP if dev is None else torch_xp(dev)
        out = []
        scalar = True
        tagged = False
        for a, pname in zip(args, names):
            tagged |= self._check_tag(a, op, pname)
            if is_torch(a):
                scalar = False
                if a.is_complex():
                    raise RawTypeError(f"{op}: argument {pname} is complex")
                out.append(self._round(xp, a.to(self._tdtype(xp.t))))
            else:
                if isinstance(a, np.ndarray) or np.ndim(a) != 0:
                    scalar = False
                if isinstance(a, RawArray):
                    a = a.view(np.ndarray)
                arr = np.asarray(a)
                if arr.dtype.kind not in "biuf":
                    raise RawTypeError(f"{op}: argument {pname} has dtype {arr.dtype}; {self.name} raw values "
                                       "are floats")
                arr = arr.astype(self.np_dtype, copy=False)
                if self.reduced:  # operands on the grid, as torch holds them
                    arr = self._round(NP, arr)
                out.append(xp.from_numpy(arr) if xp.torch else arr)
        return xp, out, [0] * len(out), scalar, tagged

    def _run(self, op, fn, args, names, under=None):
        xp, arrs, _, scalar, tagged = self._prep(op, args, names)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            r = fn(xp, *arrs)
            r, beyond = self._round(xp, r, counted=True)
        if xp.torch:
            t = xp.t
            fin_in = all(bool(t.isfinite(a).all().item()) for a in arrs)
            sat = int(t.isinf(r).sum().item()) if fin_in and not self.reduced else int(beyond) if fin_in else 0
        else:
            fin_in = all(bool(np.all(np.isfinite(a))) for a in arrs)
            sat = int(np.count_nonzero(np.isinf(r))) if fin_in and not self.reduced else int(beyond) if fin_in else 0
        und = int(under(xp, r, *arrs)) if under is not None else 0
        self._bump(sat, und)
        if not xp.torch and scalar:
            r = np.asarray(r)[()]
        return self._tag(xp, r, tagged)

    def add(self, a, b):
        return self._run("add", lambda xp, x, y: x + y, (a, b), ("a", "b"))

    def sub(self, a, b):
        return self._run("sub", lambda xp, x, y: x - y, (a, b), ("a", "b"))

    def neg(self, a):
        return self._run("neg", lambda xp, x: -x, (a,), ("a",))

    def mul(self, a, b):
        def und(xp, r, x, y):
            m = (r == 0) & (x != 0) & (y != 0)
            return xp.count(m)
        return self._run("mul", lambda xp, x, y: x * y, (a, b), ("a", "b"), under=und)

    def div(self, a, b):
        def fn(xp, x, y):
            if xp.any(y == 0):
                raise PrecisionError("div: divisor b contains 0; division by zero is undefined")
            return x / y

        def und(xp, r, x, y):
            return xp.count((r == 0) & (x != 0))
        return self._run("div", fn, (a, b), ("a", "b"), under=und)

    def relu(self, a):
        return self._run("relu", lambda xp, x: xp.maximum(x, 0.0) if not xp.torch else xp.t.clamp(x, min=0.0),
                         (a,), ("a",))

    def exp(self, a):
        def und(xp, r, x):
            return xp.count(r == 0)
        return self._run("exp", lambda xp, x: xp.exp(x), (a,), ("a",), under=und)

    def sum(self, a, axis=-1):
        return self._run("sum", lambda xp, x: xp.sum(x, axis=axis) if axis is not None else xp.sum(x),
                         (a,), ("a",))

    def matmul(self, a, b, accumulate: str = "rounded-products"):
        if accumulate not in ACCUMULATE:
            raise PrecisionError(f"matmul: accumulate must be one of {ACCUMULATE}, got {accumulate!r}")
        return self._run("matmul", lambda xp, x, y: xp.matmul(x, y), (a, b), ("a", "b"))

    def dot(self, a, b, accumulate: str = "rounded-products"):
        return self.matmul(a, b, accumulate=accumulate)

    def softmax(self, a, axis: int = -1):
        def fn(xp, x):
            m = xp.amax(x, axis, keepdims=True)
            e = xp.exp(x - m)
            return e / xp.sum(e, axis=axis, keepdims=True)

        def und(xp, r, x):
            return xp.count(r == 0)
        return self._run("softmax", fn, (a,), ("a",), under=und)


_SINGLETON_NAMES = {"float64": "Float64", "float32": "Float32", "bfloat16": "BFloat16", "float16": "Float16",
                    "float8_e4m3": "Float8E4M3", "float8_e5m2": "Float8E5M2"}
Float64 = FloatFormat("float64")
Float32 = FloatFormat("float32")
BFloat16 = FloatFormat("bfloat16")
Float16 = FloatFormat("float16")
Float8E4M3 = FloatFormat("float8_e4m3")
Float8E5M2 = FloatFormat("float8_e5m2")
FLOAT_FORMATS: dict[str, FloatFormat] = {f.name: f for f in (Float64, Float32, BFloat16, Float16, Float8E4M3, Float8E5M2)}


def float_format(name: str) -> FloatFormat:
    """The float format of a name in :data:`GRIDS` (ValueError naming the allowed ones otherwise)."""
    if name not in FLOAT_FORMATS:
        raise ValueError(f"float format must be one of {', '.join(FLOAT_FORMATS)}, got {name!r}")
    return FLOAT_FORMATS[name]
