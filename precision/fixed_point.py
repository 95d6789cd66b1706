"""Exact signed fixed point: the App. B.2 grid (:meth:`FixedPoint.paper`) and binary fixed point
(:meth:`FixedPoint.binary`). Every operation is exact, then rounded to the grid and saturated.

Raw values are numpy ``int64`` arrays (or ``object`` arrays of Python ints for formats whose range
exceeds 2^60, see :attr:`FixedPoint.int64_mode`) or torch ``int64`` tensors on any device. See
docs/precision.md for the exact semantics of every operation.
"""

from __future__ import annotations

import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np

from . import _exp, _matmul, _wide
from ._exact import exact_value, rational_or_none, round_fraction, sympy_module
from ._matmul import NeedObject
from ._xp import NP, is_torch, torch_xp
from .base import ACCUMULATE, Format, RawArray, _Bound
from .errors import PrecisionError, RawTypeError

ROUNDINGS = ("floor", "nearest-even")
INT64_LIMIT = 1 << 60  # int64 mode: every raw value has |raw| <= 2^60
SOFTMAX_CHUNK = 1 << 17  # elements per chunk in the numpy softmax pipeline
EXP_TABLE_MAX = 1 << 21  # largest exact exp table (entries) kept per format
EXP_TABLE_MIN_INPUT = 1 << 12  # fewer values than this are rounded without building the table
THREADS = max(1, min(8, os.cpu_count() or 1))  # numpy softmax worker threads


def _check_int(v, pname: str, lo: int, what: str) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise PrecisionError(f"{pname} must be an integer >= {lo} ({what}), got {v!r}")
    v = int(v)
    if v < lo:
        raise PrecisionError(f"{pname} must be an integer >= {lo} ({what}), got {v}")
    return v


def _object_minmax(a: np.ndarray) -> tuple[int, int]:
    """min and max of a non-empty object array of integers: through int64 in one C pass when every
    value fits (the common case: formats wider than int64 hold mostly small values), else in Python."""
    try:
        v = a.astype(np.int64)
    except OverflowError:
        flat = a.reshape(-1).tolist()
        return int(min(flat)), int(max(flat))
    return int(v.min()), int(v.max())


def _size(x) -> int:
    """Number of entries of a numpy array, torch tensor or scalar."""
    return int(x.numel()) if hasattr(x, "numel") else int(np.size(x))


@functools.lru_cache(maxsize=32)
def _numpy_exp_table(S: int, M: int, min_raw: int, nearest: bool) -> tuple[int, np.ndarray, int] | None:
    """The exact exp table of a format, keyed by everything it depends on (scale, largest and
    smallest raw value, rounding), so formats rebuilt with the same numbers (the precision searches
    build many) share one table. None when the window exceeds EXP_TABLE_MAX entries or an end
    cannot be verified."""
    lnS = math.log(S)
    x_lo = max(min_raw, math.floor(-S * (lnS + 2.0)))
    x_hi = min(M, math.ceil(S * (math.log(M + 1) - lnS + 1.0)))
    W = x_hi - x_lo + 1
    if W > EXP_TABLE_MAX:
        return None
    table = _exp.exp_int64(np.arange(x_lo, x_hi + 1, dtype=np.int64), S, M, nearest, NP)
    table.flags.writeable = False
    ok_lo = x_lo == min_raw or int(table[0]) == 0
    ok_hi = x_hi == M or int(table[-1]) == M + 1
    return (x_lo, table, W) if ok_lo and ok_hi else None


class FixedPoint(Format):
    """Signed fixed point: raw integers r in [min_raw, max_raw] stand for r/scale.

    Build with :meth:`paper` (App. B.2) or :meth:`binary`. Every operation rounds its exact result to
    the grid (``rounding``: ``"floor"`` or ``"nearest-even"``) and saturates to the range ends.
    """

    is_exact = True

    def __init__(self, scale: int, min_raw: int, max_raw: int, rounding: str = "floor", *, name: str | None = None,
                 bits: int | None = None, kind: str = "fixed", params: dict | None = None):
        super().__init__()
        scale = _check_int(scale, "scale", 1, "steps per unit")
        if isinstance(min_raw, bool) or not isinstance(min_raw, (int, np.integer)):
            raise PrecisionError(f"min_raw must be an integer <= 0, got {min_raw!r}")
        max_raw = _check_int(max_raw, "max_raw", 1, "largest raw value")
        min_raw = int(min_raw)
        if min_raw > 0:
            raise PrecisionError(f"min_raw must be an integer <= 0, got {min_raw}")
        if rounding not in ROUNDINGS:
            raise PrecisionError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        self.scale = scale
        self.step = Fraction(1, scale)
        self.min_raw = min_raw
        self.max_raw = max_raw
        self.rounding = rounding
        self.nearest = rounding == "nearest-even"
        self.kind = kind
        self.params = dict(params or {})
        count = max_raw - min_raw + 1
        self.bits = bits if bits is not None else (count - 1).bit_length()
        self.bound = max(max_raw, -min_raw)
        #: True when every raw value fits |raw| <= 2^60: numpy int64 / torch int64 arithmetic with
        #: proven headroom. Otherwise raw values are Python ints in numpy object arrays.
        self.int64_mode = self.bound <= INT64_LIMIT and (scale < (1 << 53) or _wide.is_pow2(scale))
        if name is None:
            name = f"fixed:scale={scale},min={min_raw},max={max_raw}"
            if rounding != "floor":
                name += f",rounding={rounding}"
        self.name = name

    def __reduce__(self):
        rebuild = functools.partial(FixedPoint, name=self.name, bits=self.bits, kind=self.kind, params=self.params)
        return (rebuild, (self.scale, self.min_raw, self.max_raw, self.rounding))

    # ---- constructors ------------------------------------------------------------------------
    @classmethod
    def paper(cls, n: int, kc: int) -> "FixedPoint":
        """App. B.2: step 1/n^kc, range [-n^kc, n^kc], floor rounding, saturation.

        ``bits`` = ceil(log2 |Q_p|) with |Q_p| = 2 n^(2 kc) + 1 (the grid's actual size; the paper's
        p = 2 kc log2 n leaves out the sign and the end point)."""
        n = _check_int(n, "n", 2, "the input length N of App. B.2")
        kc = _check_int(kc, "kc", 1, "the constant K_c of App. B.2")
        S = n**kc
        return cls(S, -S * S, S * S, "floor", name=f"paper:n={n},kc={kc}", kind="paper",
                   params={"n": n, "kc": kc})

    @classmethod
    def binary(cls, int_bits: int, frac_bits: int, rounding: str = "floor") -> "FixedPoint":
        """Signed binary fixed point: step 2^-frac_bits, range [-2^int_bits, 2^int_bits - 2^-frac_bits]
        (two's complement with 1 + int_bits + frac_bits bits)."""
        int_bits = _check_int(int_bits, "int_bits", 0, "integer bits, sign excluded")
        frac_bits = _check_int(frac_bits, "frac_bits", 0, "fraction bits")
        if int_bits + frac_bits < 1:
            raise PrecisionError("int_bits + frac_bits must be >= 1 (the format needs a nonzero positive value)")
        if rounding not in ROUNDINGS:
            raise PrecisionError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
        w = int_bits + frac_bits
        name = f"binary:int={int_bits},frac={frac_bits}"
        if rounding != "floor":
            name += f",rounding={rounding}"
        return cls(1 << frac_bits, -(1 << w), (1 << w) - 1, rounding, name=name, bits=1 + w, kind="binary",
                   params={"int_bits": int_bits, "frac_bits": frac_bits})

    # ---- convenience attributes ----------------------------------------------------------------
    @property
    def dtype(self):
        return np.int64 if self.int64_mode else object

    @property
    def min_value(self) -> Fraction:
        return Fraction(self.min_raw, self.scale)

    @property
    def max_value(self) -> Fraction:
        return Fraction(self.max_raw, self.scale)

    # ---- conversion ----------------------------------------------------------------------------
    def represents(self, x) -> bool:
        """True iff x is exactly a grid point of this format inside its range."""
        v = rational_or_none(x)
        if v is None:
            return False
        q = v * self.scale
        return q.denominator == 1 and self.min_raw <= q.numerator <= self.max_raw

    def _round_exact(self, v) -> int:
        if isinstance(v, tuple):  # irrational sympy expression: floor is exact in sympy
            sp = sympy_module()
            e = v[1] * self.scale
            if self.nearest:
                e = e + sp.Rational(1, 2)
            return int(sp.floor(e))
        return round_fraction(v * self.scale, self.nearest)

    def quantize(self, x):
        """Raw values of x rounded to the grid (floor or nearest-even) and saturated, counted.

        x: int, Fraction, float (converted exactly), Decimal, sympy number, a list/numpy array of
        these (int, float or object dtype) or a torch tensor (result on the same device)."""
        if is_torch(x):
            return self._quantize_torch(x)
        scalar = not isinstance(x, np.ndarray) and np.ndim(x) == 0
        if scalar and not isinstance(x, np.generic):
            arr = np.empty((), dtype=object)
            arr[()] = x
        else:
            try:
                arr = np.asarray(x)
            except (ValueError, OverflowError):
                arr = np.asarray(x, dtype=object)
        r, sat, und = self._quantize_np(arr)
        self._bump(sat, und)
        if scalar:
            return r[()]
        return r

    def _quantize_np(self, arr: np.ndarray):
        k = arr.dtype.kind
        if k == "b":
            arr = arr.astype(np.int64)
            k = "i"
        if k in "iu" and self.int64_mode:
            if k == "u" and arr.size and int(arr.max()) > (1 << 62):
                arr = np.minimum(arr, np.uint64(1 << 62))
            a = arr.astype(np.int64)
            lo, hi = self.min_raw // self.scale - 1, self.max_raw // self.scale + 1
            a = np.clip(a, lo, hi) * self.scale  # |.| <= 2^60 + S
            return self._sat_np(a) + (0,)
        if k == "f" and self.int64_mode and _wide.is_pow2(self.scale):
            a = arr.astype(np.float64)
            if not np.all(np.isfinite(a)):
                raise PrecisionError("quantize: x contains NaN or inf; only finite values are allowed")
            ys = a * float(self.scale)  # exact (power of two), or +-inf -> saturated
            f = np.rint(ys) if self.nearest else np.floor(ys)
            und = int(np.count_nonzero((f == 0) & (a != 0)))
            sat = int(np.count_nonzero(f > self.max_raw)) + int(np.count_nonzero(f < self.min_raw))
            f = np.clip(f, float(self.min_raw), float(self.max_raw))
            return f.astype(np.int64), sat, und
        if k not in "iufO":
            raise RawTypeError(f"quantize: x has dtype {arr.dtype}; allowed: integer, float or object arrays")
        out = np.empty(arr.shape, dtype=object)
        flat = out.reshape(-1)
        und = 0
        for i, v in enumerate(arr.reshape(-1).tolist() if k != "O" else arr.reshape(-1)):
            ev = exact_value(v)
            r = self._round_exact(ev)
            if r == 0 and (isinstance(ev, tuple) or ev != 0):
                und += 1
            flat[i] = r
        r, sat = self._sat_obj(out)
        if self.int64_mode:
            r = r.astype(np.int64)
        return r, sat, und

    def _quantize_torch(self, x):
        t = torch_xp(x.device).t
        if not self.int64_mode:
            raise PrecisionError(self._torch_range_msg("quantize"))
        if x.dtype == t.bool:
            x = x.to(t.int64)
        if x.is_floating_point():
            if not bool(t.isfinite(x).all().item()):
                raise PrecisionError("quantize: x contains NaN or inf; only finite values are allowed")
            if _wide.is_pow2(self.scale):
                a = x.to(t.float64)
                ys = a * float(self.scale)
                f = t.round(ys) if self.nearest else t.floor(ys)  # torch.round: ties to even
                und = int(((f == 0) & (a != 0)).sum().item())
                sat = int((f > self.max_raw).sum().item()) + int((f < self.min_raw).sum().item())
                r = t.clamp(f, float(self.min_raw), float(self.max_raw)).to(t.int64)
                self._bump(sat, und)
                return r
            r, sat, und = self._quantize_np(x.detach().cpu().numpy())
            self._bump(sat, und)
            return t.as_tensor(r, device=x.device)
        if x.is_complex():
            raise RawTypeError("quantize: complex tensors are not allowed")
        a = x.to(t.int64)
        lo, hi = self.min_raw // self.scale - 1, self.max_raw // self.scale + 1
        a = t.clamp(a, lo, hi) * self.scale
        xp = torch_xp(x.device)
        r, sat = self._sat(xp, a)
        self._bump(sat, 0)
        return r

    def to_fraction(self, raw):
        """Exact values: a Fraction for a scalar, else an object array of Fractions."""
        arr = self._raw_to_numpy(raw, "to_fraction")
        S = self.scale
        if arr.ndim == 0:
            return Fraction(int(arr[()]), S)
        out = np.empty(arr.shape, dtype=object)
        flat = out.reshape(-1)
        for i, v in enumerate(arr.reshape(-1).tolist()):
            flat[i] = Fraction(int(v), S)
        return out

    def to_float(self, raw):
        """Approximate float64 values (for display); exact integers divided by the scale."""
        arr = self._raw_to_numpy(raw, "to_float")
        if arr.dtype != object:
            return arr.astype(np.float64) / float(self.scale)
        out = np.array([int(v) / self.scale for v in arr.reshape(-1).tolist()], dtype=np.float64)
        return out.reshape(arr.shape)

    def _raw_to_numpy(self, raw, op):
        if is_torch(raw):
            if raw.is_floating_point() or raw.is_complex() or raw.dtype == raw.new_zeros(()).bool().dtype:
                raise RawTypeError(f"{op}: raw has dtype {raw.dtype}; raw values of {self.name} are integers")
            return raw.detach().cpu().numpy()
        arr = np.asarray(raw)
        if arr.dtype.kind not in "iuO":
            raise RawTypeError(f"{op}: raw has dtype {arr.dtype}; raw values of {self.name} are integers "
                               "(use quantize to convert values)")
        return arr

    # ---- argument handling -----------------------------------------------------------------------
    def _torch_range_msg(self, op: str) -> str:
        return (f"{op}: format {self.name} has raw values up to 2^{self.bound.bit_length() - 1}, beyond "
                f"torch.int64 with headroom (|raw| <= 2^60 required for torch); use numpy arrays (object dtype)")

    def _prep(self, op: str, args, names):
        """Validate raw arguments. Returns (xp, arrays, bounds, scalar, tagged)."""
        dev = None
        for a in args:
            if is_torch(a):
                if dev is not None and a.device != dev:
                    raise PrecisionError(f"{op}: tensors on different devices ({dev} and {a.device})")
                dev = a.device
        xp = NP if dev is None else torch_xp(dev)
        if dev is not None and not self.int64_mode:
            raise PrecisionError(self._torch_range_msg(op))
        tagged = False
        scalar = True
        out, bounds = [], []
        for a, pname in zip(args, names):
            tagged |= self._check_tag(a, op, pname)
            if is_torch(a):
                scalar = False
                if a.is_floating_point() or a.is_complex() or a.dtype == xp.t.bool:
                    raise RawTypeError(
                        f"{op}: argument {pname} has dtype {a.dtype}; raw values of {self.name} are integer "
                        "tensors (torch.int64); use quantize to convert values")
                a = a.to(xp.t.int64)
                mn, mx = xp.minmax(a)
            else:
                if isinstance(a, np.ndarray) or not np.ndim(a) == 0:
                    scalar = False
                if isinstance(a, RawArray):
                    a = a.view(np.ndarray)
                try:
                    arr = np.asarray(a)
                except (ValueError, OverflowError):
                    arr = np.asarray(a, dtype=object)
                k = arr.dtype.kind
                if k not in "iuO":
                    raise RawTypeError(
                        f"{op}: argument {pname} has dtype {arr.dtype}; raw values of {self.name} are integers "
                        "(numpy int64, or object arrays of Python ints); use quantize to convert values")
                if k == "O":
                    flat = arr.reshape(-1).tolist()
                    types = set(map(type, flat))  # one C-level pass; the element loop only on a bad type
                    if any(t is bool or not issubclass(t, (int, np.integer)) for t in types):
                        v = next(v for v in flat if isinstance(v, bool) or not isinstance(v, (int, np.integer)))
                        raise RawTypeError(
                            f"{op}: argument {pname} contains {type(v).__name__} {v!r}; raw values of "
                            f"{self.name} are integers (use quantize to convert values)")
                    plain = types <= {int}
                    if not plain:
                        flat = [int(v) for v in flat]
                    mn, mx = (0, 0) if not flat else _object_minmax(arr) if plain else (min(flat), max(flat))
                    if self.int64_mode and mn >= self.min_raw and mx <= self.max_raw:
                        arr = arr.astype(np.int64)
                    elif not self.int64_mode and not plain:
                        arr = np.array(flat, dtype=object).reshape(arr.shape) if flat else arr
                else:
                    if k == "u" and arr.dtype.itemsize >= 8 and arr.size and int(arr.max()) > self.max_raw:
                        mn, mx = int(arr.min()), int(arr.max())
                    else:
                        arr = arr.astype(np.int64, copy=False)
                        mn, mx = NP.minmax(arr)
                    if not self.int64_mode:
                        arr = arr.astype(object)
                if xp.torch and mn >= self.min_raw and mx <= self.max_raw:
                    a = xp.from_numpy(arr.astype(np.int64))
                else:
                    a = arr
            if mn < self.min_raw or mx > self.max_raw:
                raise PrecisionError(
                    f"{op}: argument {pname} has raw values in [{mn}, {mx}], outside the range of {self.name} "
                    f"[min_raw, max_raw] = [{self.min_raw}, {self.max_raw}] (raw values of another format?)")
            out.append(a)
            bounds.append(_Bound(max(abs(mn), abs(mx)), mn, mx))
        return xp, out, bounds, scalar, tagged

    def _finish(self, xp, r, scalar: bool, tagged: bool):
        if not xp.torch:
            r = np.asarray(r)
            if self.int64_mode and r.dtype != np.int64:
                r = r.astype(np.int64)
            if scalar:
                return r[()]
        return self._tag(xp, r, tagged)

    def _sat(self, xp, r):
        """Saturate exact integer results (int64 or object) to [min_raw, max_raw]; returns (r, count)."""
        if isinstance(r, np.ndarray) and r.dtype == object:
            return self._sat_obj(r)
        if xp.torch:  # no host sync: clip unconditionally, count on the device
            n = xp.count(r > self.max_raw) + xp.count(r < self.min_raw)
            return xp.clip(r, self.min_raw, self.max_raw), n
        mn, mx = xp.minmax(r)
        if mn >= self.min_raw and mx <= self.max_raw:
            return r, 0
        n = xp.count(r > self.max_raw) + xp.count(r < self.min_raw)
        return xp.clip(r, self.min_raw, self.max_raw), n

    def _sat_np(self, r):
        return self._sat(NP, r)

    def _sat_obj(self, r: np.ndarray):
        if r.size == 0:
            return r, 0
        mn, mx = _object_minmax(r)
        if mn >= self.min_raw and mx <= self.max_raw:
            return r, 0
        flat = r.reshape(-1).tolist()
        n = 0
        lo, hi = self.min_raw, self.max_raw
        out = np.empty(r.shape, dtype=object)
        of = out.reshape(-1)
        for i, v in enumerate(flat):
            if v > hi:
                v, n = hi, n + 1
            elif v < lo:
                v, n = lo, n + 1
            of[i] = v
        return out, n

    def _run(self, op: str, kernel, args, names, **kw):
        xp, arrs, bounds, scalar, tagged = self._prep(op, args, names)
        try:
            r, sat, und = kernel(xp, arrs, bounds, **kw)
        except NeedObject:
            np_arrs = [xp.to_numpy(a) for a in arrs]
            r, sat, und = kernel(NP, np_arrs, bounds, **kw)
            r = xp.from_numpy(np.asarray(r).astype(np.int64))
        self._bump(sat, und)
        return self._finish(xp, r, scalar, tagged)

    @property
    def _obj(self) -> bool:
        return not self.int64_mode

    # ---- elementwise ops -------------------------------------------------------------------------
    def add(self, a, b):
        """a + b exactly, then saturated."""
        return self._run("add", lambda xp, x, bd: self._sat_within(xp, x[0] + x[1], bd[0].lo + bd[1].lo,
                                                                   bd[0].hi + bd[1].hi), (a, b), ("a", "b"))

    def sub(self, a, b):
        """a - b exactly, then saturated."""
        return self._run("sub", lambda xp, x, bd: self._sat_within(xp, x[0] - x[1], bd[0].lo - bd[1].hi,
                                                                   bd[0].hi - bd[1].lo), (a, b), ("a", "b"))

    def _sat_within(self, xp, r, lo: int, hi: int):
        """(r, saturations, 0) for a result known to lie in [lo, hi]: no scan when that is inside the
        format (object arrays scan element by element in Python)."""
        if lo >= self.min_raw and hi <= self.max_raw:
            return r, 0, 0
        return self._sat(xp, r) + (0,)

    def neg(self, a):
        """-a exactly, then saturated (-min_raw may exceed max_raw)."""
        return self._run("neg", lambda xp, x, bd: self._sat(xp, -x[0]) + (0,), (a,), ("a",))

    def relu(self, a):
        """max(a, 0) (exact)."""
        def k(xp, x, bd):
            if self._obj:
                return np.where(x[0] > 0, x[0], 0).astype(object), 0, 0
            return xp.maximum(x[0], 0), 0, 0
        return self._run("relu", k, (a,), ("a",))

    def mul(self, a, b):
        """round(a*b) to the grid (floor or nearest-even) of the exact product, then saturated."""
        def k(xp, x, bd):
            A, B = x
            q = _wide.muldiv(A, B, self.scale, self.nearest, xp, bd[0], bd[1], self.scale, obj=self._obj)
            und = xp.count((q == 0) & (A != 0) & (B != 0)) if not self._obj else \
                int(np.count_nonzero((q == 0) & (A != 0) & (B != 0)))
            r, sat = self._sat(xp, q)
            return r, sat, und
        return self._run("mul", k, (a, b), ("a", "b"))

    def div(self, a, b):
        """round(a/b) to the grid of the exact quotient, then saturated. b must be nonzero."""
        def k(xp, x, bd):
            A, B = x
            if self._obj:
                if bool(np.any(B == 0)):
                    raise PrecisionError("div: divisor b contains 0; division by zero is undefined")
                neg = B < 0
                num = np.where(neg, -A, A)
                den = np.where(neg, -B, B)
                q = _wide.div_exact_int(num * self.scale, den, self.nearest, xp, 0, 0, obj=True)
                und = int(np.count_nonzero((q == 0) & (A != 0)))
            else:
                if xp.any(B == 0):
                    raise PrecisionError("div: divisor b contains 0; division by zero is undefined")
                neg = B < 0
                num = xp.where(neg, -A, A)
                den = xp.where(neg, -B, B)
                q = _wide.muldiv(num, self.scale, den, self.nearest, xp, bd[0], self.scale, max(bd[1], 1))
                und = xp.count((q == 0) & (A != 0))
            r, sat = self._sat(xp, q)
            return r, sat, und
        return self._run("div", k, (a, b), ("a", "b"))

    def exp(self, a):
        """round(e^a) to the grid, exactly (see docs/precision.md for the decision procedure),
        saturated; every result 0 is an underflow (e^a > 0)."""
        def k(xp, x, bd):
            r = self._exp_raw(xp, x[0])
            cap = self.max_raw + 1
            if self._obj:
                sat = int(np.count_nonzero(r == cap))
                und = int(np.count_nonzero(r == 0))
                return np.where(r == cap, self.max_raw, r).astype(object), sat, und
            sat = xp.count(r == cap)
            und = xp.count(r == 0)
            if xp.torch or sat:
                r = xp.minimum(r, self.max_raw)
            return r, sat, und
        return self._run("exp", k, (a,), ("a",))

    def _exp_raw(self, xp, x):
        if self._obj:
            return _exp.exp_object(np.asarray(x, dtype=object), self.scale, self.max_raw, self.nearest)
        # a table pays for itself only over many values: a few values (the precision searches ask
        # for one or two per candidate format) are rounded directly, exactly the same way
        tab = self._exp_table(xp) if _size(x) >= EXP_TABLE_MIN_INPUT or "_exp_tables" in self.__dict__ else None
        if tab is not None:
            x_lo, table, W = tab
            if xp.torch:
                return table[xp.clip(x - x_lo, 0, W - 1)]
            return np.take(table, x - x_lo, mode="clip")
        return _exp.exp_int64(x, self.scale, self.max_raw, self.nearest, xp)

    def exp_zero_below(self) -> int | None:
        """A raw d0 in [min_raw, 0) with round(e^d) = 0 for every raw d <= d0 (exp is monotone, so
        one exact evaluation decides it): a softmax entry that far below its row's maximum is 0 and
        adds nothing to the row's sum. None when no such d0 is within the range."""
        S = self.scale
        d0 = max(self.min_raw, math.floor(-S * (math.log(S) + 2.0)))
        if d0 >= 0:
            return None
        e = _exp.exp_int64(np.array([d0], dtype=np.int64), S, self.max_raw, self.nearest, NP, nonpositive=True)
        return d0 if int(e[0]) == 0 else None

    def _exp_table(self, xp):
        """(x_lo, table, W): exact rounded exp of every raw x in [x_lo, x_lo + W), with results 0 for
        all x below the window and saturated (max_raw + 1) above it (exp is monotone and both ends
        are verified), or None when the window would exceed EXP_TABLE_MAX entries."""
        cache = self.__dict__.setdefault("_exp_tables", {})
        key = "numpy" if not xp.torch else str(xp.device)
        if key in cache:
            return cache[key]
        if "numpy" not in cache:
            cache["numpy"] = _numpy_exp_table(self.scale, self.max_raw, self.min_raw, self.nearest)
        res = cache["numpy"]
        if xp.torch and res is not None:
            res = (res[0], xp.from_numpy(res[1].copy()), res[2])
        cache[key] = res
        return res

    # ---- reductions ------------------------------------------------------------------------------
    def sum(self, a, axis=-1):
        """Exact sum along ``axis`` (int, tuple or None), saturated once."""
        def k(xp, x, bd):
            A = x[0]
            n = A.numel() if xp.torch else A.size
            if not self._obj and n * bd[0] < (1 << 63):
                s = xp.sum(A, axis=axis) if axis is not None else xp.sum(A)
            elif xp.torch:
                raise NeedObject("sum may exceed int64")
            else:
                s = np.sum(np.asarray(A).astype(object), axis=axis)
                s = np.asarray(s, dtype=object)
            r, sat = self._sat(xp, s)
            return r, sat, 0
        return self._run("sum", k, (a,), ("a",))

    # ---- matmul ------------------------------------------------------------------------------------
    def matmul(self, a, b, accumulate: str = "rounded-products"):
        """a @ b with numpy matmul semantics (1-D operands, broadcast batch dims).

        ``accumulate="rounded-products"`` (App. B.2 read literally): every product a_ik*b_kj rounded
        as in :meth:`mul`, the rounded products summed exactly, the sum saturated once.
        ``accumulate="exact"``: the exact sum of exact products rounded once, then saturated."""
        if accumulate not in ACCUMULATE:
            raise PrecisionError(f"matmul: accumulate must be one of {ACCUMULATE}, got {accumulate!r}")

        def k(xp, x, bd):
            A, B = x
            if A.ndim == 0 or B.ndim == 0:
                raise PrecisionError("matmul: operands must have at least 1 dimension (use mul for scalars)")
            va, vb = A.ndim == 1, B.ndim == 1
            if va:
                A = A[None, :]
            if vb:
                B = B[:, None]
            if A.shape[-1] != B.shape[-2]:
                raise PrecisionError(f"matmul: inner dimensions differ: a {tuple(A.shape)} @ b {tuple(B.shape)}")
            r, sat, und = self._matmul_kernel(xp, A, B, bd[0], bd[1], accumulate)
            if va:
                r = r[..., 0, :]
            if vb:
                r = r[..., 0]
            return r, sat, und
        return self._run("matmul", k, (a, b), ("a", "b"))

    def dot(self, a, b, accumulate: str = "rounded-products"):
        """Alias of :meth:`matmul` (for 1-D operands: the dot product)."""
        return self.matmul(a, b, accumulate=accumulate)

    def _matmul_kernel(self, xp, A, B, ab, bb, accumulate):
        S, obj = self.scale, self._obj
        if accumulate == "exact":
            P = _matmul.imatmul(A, B, ab, bb, xp, obj_in=obj)
            if isinstance(P, np.ndarray) and P.dtype == object:
                q = _wide.div_exact_int(P, S, self.nearest, NP, 0, S, obj=True)
                und = int(np.count_nonzero((q == 0) & (P != 0)))
            else:
                kdim = A.shape[-1]
                q = _wide.div_exact_int(P, S, self.nearest, xp, kdim * ab * bb, S)
                und = xp.count((q == 0) & (P != 0))
            r, sat = self._sat(xp, q)
            return r, sat, und
        # rounded products: fast path when one operand is on the integer grid (multiples of S),
        # checked on the smaller operand first
        small_first_b = int(np.prod(B.shape)) <= int(np.prod(A.shape))
        res = {}
        for side in (("b", "a") if small_first_b else ("a", "b")):
            X = B if side == "b" else A
            h, l = _matmul.residues(X, S, xp, obj)
            if not (bool(np.any(l != 0)) if obj else xp.any(l != 0)):
                if side == "a":
                    C = _matmul.imatmul(h, B, ab // S, bb, xp, obj_in=obj)
                else:
                    C = _matmul.imatmul(A, h, ab, bb // S, xp, obj_in=obj)
                r, sat = self._sat(xp, C)
                return r, sat, 0
            res[side] = (h, l)
        force = _matmul.FORCE_PATH
        if not self.nearest and not obj and force != "elementwise":
            out = _matmul.matmul_indicator(A, B, S, xp, ab, bb, res["a"], res["b"], small_first_b,
                                           force=force == "indicator")
            if out is not None:
                C, und = out
                r, sat = self._sat(xp, C)
                return r, sat, und
        C, und = _matmul.matmul_elementwise(A, B, S, self.nearest, xp, ab, bb, obj)
        r, sat = self._sat(xp, C)
        return r, sat, und

    # ---- softmax -----------------------------------------------------------------------------------
    def softmax(self, a, axis: int = -1):
        """App. D softmax along ``axis``: d = a - max (exact, saturated), e = exp(d) (rounded),
        Z = sum e (exact, saturated), result e/Z (rounded as div), saturated."""
        def k(xp, x, bd):
            return self._softmax_kernel(xp, x[0], axis, bd[0])
        return self._run("softmax", k, (a,), ("a",))

    def _softmax_kernel(self, xp, A, axis, bound):
        if A.ndim == 0:
            raise PrecisionError("softmax: input must have at least 1 dimension")
        nd = A.ndim
        if not -nd <= axis < nd:
            raise PrecisionError(f"softmax: axis {axis} out of range for an array of {nd} dimensions")
        last = axis in (-1, nd - 1)
        X = A if last else xp.moveaxis(A, axis, -1)
        shape = tuple(X.shape)
        T = shape[-1]
        if T == 0:
            raise PrecisionError("softmax: the softmax axis has length 0")
        R = math.prod(shape[:-1])
        X2 = xp.reshape(xp.contiguous(X), (R, T))
        S, hi = self.scale, self.max_raw
        e_max = min(S, hi)
        if self._obj:
            out = np.empty((R, T), dtype=object)
            sat = und = 0
            for r0 in range(R):
                x = X2[r0]
                d = x - max(x.tolist())
                d, s1 = self._sat_obj(d)
                e = _exp.exp_object(d, S, hi, self.nearest)
                s2 = int(np.count_nonzero(e == hi + 1))
                e = np.where(e == hi + 1, hi, e).astype(object)
                und += int(np.count_nonzero(e == 0))
                Z = min(sum(e.tolist()), hi)
                s3 = int(sum(e.tolist()) > hi)
                q = _wide.div_exact_int(e * S, Z, self.nearest, NP, 0, 0, obj=True)
                und += int(np.count_nonzero((q == 0) & (e != 0)))
                q, s4 = self._sat_obj(q)
                out[r0] = q
                sat += s1 + s2 + s3 + s4
        else:
            if T * e_max >= (1 << 63):
                if xp.torch:
                    raise NeedObject("softmax sum exceeds int64")
            chunk = SOFTMAX_CHUNK if not xp.torch else (1 << 26)
            rows = max(1, chunk // T)
            out = xp.empty((R, T))
            sat = und = 0
            # x - max(x) >= lo - hi of the argument: saturation of the difference is possible only if
            # that is below min_raw
            need_dclip = bound.lo - bound.hi < self.min_raw
            starts = list(range(0, R, rows))

            def work(r0):
                r1 = min(R, r0 + rows)
                q, s, u = self._softmax_rows(xp, X2[r0:r1], need_dclip, e_max)
                out[r0:r1] = q
                return s, u

            if xp.torch or THREADS == 1 or len(starts) < 4:
                results = [work(r0) for r0 in starts]
            else:
                with ThreadPoolExecutor(THREADS) as ex:
                    results = list(ex.map(work, starts))
            sat = sum(r[0] for r in results)
            und = sum(r[1] for r in results)
        out = xp.reshape(out, shape)
        return (out if last else xp.moveaxis(out, -1, axis)), sat, und

    def _softmax_rows(self, xp, x, need_dclip: bool, e_max: int):
        S, hi = self.scale, self.max_raw
        sat = und = 0
        m = xp.amax(x, -1, keepdims=True)
        tab = self._exp_table(xp)
        if tab is not None and not need_dclip:
            # e = table[d - x_lo] with d = x - m <= 0; entries below the window are 0
            x_lo, table, W = tab
            idx = x - (m + x_lo)
            if xp.torch:
                e = table[xp.maximum(idx, 0)]
            else:
                e = np.take(table, idx, mode="clip")
            if S > hi:
                s = xp.count(e > hi)
                sat += s
                e = xp.minimum(e, hi)
        else:
            d = x - m
            if need_dclip:
                s = xp.count(d < self.min_raw)
                if xp.torch or s:
                    sat += s
                    d = xp.maximum(d, self.min_raw)
            e = _exp.exp_int64(d, S, hi, self.nearest, xp, nonpositive=True)
            if S > hi:  # exp(0) = 1 is not representable: saturated
                s = xp.count(e > hi)
                sat += s
                e = xp.minimum(e, hi)
        e_zero = xp.count(e == 0)
        und += e_zero
        T = x.shape[-1]
        Z = xp.sum(e, axis=-1, keepdims=True)
        if T * e_max > hi:
            s = xp.count(Z > hi)
            if xp.torch or s:
                sat += s
                Z = xp.minimum(Z, hi)
        q = _wide.muldiv(e, S, Z, self.nearest, xp, e_max, S, hi)
        und += xp.count(q == 0) - e_zero  # e == 0 implies q == 0
        if S > hi:
            s = xp.count(q > hi)
            sat += s
            q = xp.minimum(q, hi)
        return q, sat, und
