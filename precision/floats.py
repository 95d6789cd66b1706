"""Plain IEEE floating point formats ``Float64`` and ``Float32`` (singletons), for comparison with the
exact formats: raw values are the float values themselves."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._exact import exact_value, rational_or_none
from ._xp import NP, is_torch, torch_xp
from .base import ACCUMULATE, Format, RawArray
from .errors import PrecisionError, RawTypeError


class FloatFormat(Format):
    """Plain IEEE floating point (for comparison). Raw values are the float values themselves
    (numpy float arrays or torch float tensors of the format's dtype). ``counts.saturations`` counts
    results that overflow to +-inf from finite inputs; ``counts.underflows`` counts products,
    quotients and exponentials that are 0 although their exact value is not."""

    is_exact = False
    scale = None
    step = None

    def __init__(self, bits: int):
        super().__init__()
        self.bits = bits
        self.name = f"float{bits}"
        self.np_dtype = np.float64 if bits == 64 else np.float32
        fi = np.finfo(self.np_dtype)
        self.max_raw = float(fi.max)
        self.min_raw = -float(fi.max)
        self.int64_mode = False

    def __call__(self):
        """``Float64()`` is ``Float64`` (the formats are singletons)."""
        return self

    def __reduce__(self):
        return f"Float{self.bits}"  # unpickles to the module's singleton

    def _tdtype(self, t):
        return t.float64 if self.bits == 64 else t.float32

    def represents(self, x) -> bool:
        v = rational_or_none(x)
        if v is None:
            return False
        f = self.np_dtype(float(v)) if abs(v) <= Fraction(self.max_raw) else None
        return f is not None and bool(np.isfinite(f)) and Fraction(float(f)) == v

    def quantize(self, x):
        """Float values of x (correctly rounded from exact rationals). NaN/inf are errors."""
        if is_torch(x):
            t = torch_xp(x.device).t
            r = x.to(self._tdtype(t))
            if r.is_floating_point() and not bool(t.isfinite(r).all().item()):
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
            r = arr.astype(self.np_dtype)
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
                out.append(a.to(self._tdtype(xp.t)))
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
                out.append(xp.from_numpy(arr) if xp.torch else arr)
        return xp, out, [0] * len(out), scalar, tagged

    def _run(self, op, fn, args, names, under=None):
        xp, arrs, _, scalar, tagged = self._prep(op, args, names)
        with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
            r = fn(xp, *arrs)
        if xp.torch:
            t = xp.t
            fin_in = all(bool(t.isfinite(a).all().item()) for a in arrs)
            sat = int(t.isinf(r).sum().item()) if fin_in else 0
        else:
            fin_in = all(bool(np.all(np.isfinite(a))) for a in arrs)
            sat = int(np.count_nonzero(np.isinf(r))) if fin_in else 0
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


Float64 = FloatFormat(64)
Float32 = FloatFormat(32)
