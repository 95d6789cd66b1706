"""Formats: construction, names, parsing, bits, bad input, quantize / represents / to_fraction, tagging."""

from __future__ import annotations

import decimal
import math
import pickle
from fractions import Fraction

import numpy as np
import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exactformer.precision import (
    FixedPoint,
    Float32,
    Float64,
    FloatFormat,
    Format,
    FormatMismatchError,
    PrecisionError,
    RawArray,
    RawTypeError,
    parse_format,
)


# ---- construction and attributes ------------------------------------------------------------------


def test_binary_attributes():
    f = FixedPoint.binary(int_bits=5, frac_bits=5)
    assert (f.scale, f.step, f.min_raw, f.max_raw, f.bits) == (32, Fraction(1, 32), -1024, 1023, 11)
    assert f.name == "binary:int=5,frac=5" and f.is_exact and f.rounding == "floor"
    assert f.min_value == -32 and f.max_value == 32 - Fraction(1, 32)
    g = FixedPoint.binary(3, 2, rounding="nearest-even")
    assert g.name == "binary:int=3,frac=2,rounding=nearest-even" and g.nearest
    assert FixedPoint.binary(0, 4).max_raw == 15  # range [-1, 1 - 1/16]


def test_paper_attributes():
    f = FixedPoint.paper(n=1024, kc=2)
    S = 1024**2
    assert f.scale == S and f.step == Fraction(1, S)
    assert (f.min_raw, f.max_raw) == (-S * S, S * S)  # values [-n^kc, n^kc]
    # |Q_p| = 2 n^(2kc) + 1 grid points: ceil(log2) = 2*kc*log2(n) + 2 (the paper's p = 40 omits sign and end point)
    assert f.bits == math.ceil(math.log2(2 * S * S + 1)) == 42
    assert f.name == "paper:n=1024,kc=2" and f.rounding == "floor"
    assert f.int64_mode
    big = FixedPoint.paper(n=2**20, kc=2)
    assert big.max_raw == 2**80 and not big.int64_mode and big.dtype is object
    assert FixedPoint.paper(3, 1).bits == math.ceil(math.log2(2 * 9 + 1))


@pytest.mark.parametrize("spec", [
    "binary:int=5,frac=5", "binary:int=5,frac=5,rounding=nearest-even", "binary:int=0,frac=1",
    "paper:n=4096,kc=2", "paper:n=1000,kc=3", "paper:n=1048576,kc=4", "float64", "float32",
    "fixed:scale=10,min=-100,max=77", "fixed:scale=3,min=0,max=5,rounding=nearest-even",
])
def test_parse_roundtrip(spec):
    f = parse_format(spec)
    assert f.name == spec
    assert parse_format(f.name) == f
    assert parse_format(f) is f
    assert pickle.loads(pickle.dumps(f)) == f


def test_float_singletons():
    assert Float64() is Float64 and parse_format("float64") is Float64
    assert isinstance(Float64, FloatFormat) and isinstance(Float64, Format)
    assert Float64.scale is None and Float64.step is None and not Float64.is_exact and Float64.bits == 64
    assert Float32.bits == 32 and Float32.name == "float32"


@pytest.mark.parametrize("call, words", [
    (lambda: FixedPoint.paper(n=1024, kc=0), ["kc", ">= 1"]),
    (lambda: FixedPoint.paper(n=1024, kc=-2), ["kc", ">= 1"]),
    (lambda: FixedPoint.paper(n=1024, kc=1.5), ["kc", "integer"]),
    (lambda: FixedPoint.paper(n=1, kc=1), ["n", ">= 2"]),
    (lambda: FixedPoint.paper(n=True, kc=1), ["n", "integer"]),
    (lambda: FixedPoint.binary(int_bits=-1, frac_bits=5), ["int_bits", ">= 0"]),
    (lambda: FixedPoint.binary(int_bits=5, frac_bits=-3), ["frac_bits", ">= 0"]),
    (lambda: FixedPoint.binary(int_bits=0, frac_bits=0), ["int_bits + frac_bits", ">= 1"]),
    (lambda: FixedPoint.binary(5, 5, rounding="ceil"), ["rounding", "nearest-even"]),
    (lambda: parse_format("binary:int=5"), ["frac"]),
    (lambda: parse_format("binary:int=5,frac=x"), ["frac", "integer"]),
    (lambda: parse_format("binary:int=5,frac=5,foo=1"), ["foo"]),
    (lambda: parse_format("decimal:p=3"), ["decimal", "binary:int="]),
    (lambda: parse_format("float16"), ["float16", "float64"]),
    (lambda: parse_format(17), ["string"]),
])
def test_bad_parameters(call, words):
    with pytest.raises(PrecisionError) as ei:
        call()
    assert isinstance(ei.value, ValueError)
    for w in words:
        assert w in str(ei.value)


# ---- quantize ------------------------------------------------------------------------------------------


def test_quantize_kinds():
    f = FixedPoint.binary(5, 5)
    assert f.quantize(Fraction(1, 3)) == 10  # floor(32/3)
    assert f.quantize(-Fraction(1, 3)) == -11
    assert f.quantize(sympy.Rational(1, 3)) == 10
    assert f.quantize(sympy.sqrt(2)) == 45  # floor(32 sqrt 2) = floor(45.25)
    assert f.quantize(1 / sympy.sqrt(3)) == 18
    assert f.quantize(decimal.Decimal("0.1")) == 3
    assert f.quantize(0.1) == 3 and f.quantize(np.float32(0.1)) == 3
    assert f.quantize(7) == 224 and f.quantize(True) == 32
    r = f.quantize([0.5, -1.25, 3])
    assert isinstance(r, np.ndarray) and r.dtype == np.int64 and r.tolist() == [16, -40, 96]
    r = f.quantize(np.array([Fraction(1, 64), Fraction(-1, 64)], dtype=object))
    assert r.dtype == np.int64 and r.tolist() == [0, -1]
    t = f.quantize(torch.tensor([0.5, -0.03125, 2.0]))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64 and t.tolist() == [16, -1, 64]
    assert f.quantize(torch.tensor([1, -2])).tolist() == [32, -64]
    assert f.quantize(np.zeros((2, 0))).shape == (2, 0)


def test_quantize_floats_are_exact_not_decimal():
    # 0.1 is 3602879701896397/2^55 > 1/10: floor(0.1 * 10) == 1 exactly, while the decimal reading
    # would give 1 too; the telling case is a float just below a grid point.
    f = FixedPoint.paper(n=10, kc=1)  # step 1/10
    x = 0.3  # 0.299999999999999988897769753748...
    assert f.quantize(x) == 2  # floor(2.99999...) even though str(x) == "0.3"
    assert f.quantize(np.array([0.3, 0.7, 0.5])).tolist() == [2, 6, 5]  # 0.7 = 0.69999999999999995559...
    assert f.quantize(torch.tensor([0.3], dtype=torch.float64)).tolist() == [2]
    g = FixedPoint.binary(3, 60)  # object mode, float path via Fractions
    assert int(g.quantize(0.1)) == (Fraction(0.1) * 2**60).__floor__()


def test_quantize_saturates_and_counts():
    f = FixedPoint.binary(2, 3)  # range [-4, 4 - 1/8]
    f.reset_counts()
    r = f.quantize([100, -100, 3.99, Fraction(1, 100), -Fraction(1, 100), 0])
    assert r.tolist() == [31, -32, 31, 0, -1, 0]
    assert f.counts.as_dict() == {"saturations": 2, "underflows": 1}
    f.reset_counts()
    f.quantize(np.array([1e300, -1e300, 5e-324]))
    assert f.counts.saturations == 2 and f.counts.underflows == 1
    f.reset_counts()
    f.quantize(torch.tensor([1e300, -1e300, 1e-300], dtype=torch.float64))
    assert f.counts.as_dict() == {"saturations": 2, "underflows": 1}


def test_quantize_nearest_even_ties():
    f = FixedPoint.binary(4, 1, rounding="nearest-even")  # step 1/2
    vals = [Fraction(1, 4), Fraction(3, 4), Fraction(5, 4), Fraction(-1, 4), Fraction(-3, 4), Fraction(7, 4)]
    assert f.quantize(np.array(vals, dtype=object)).tolist() == [0, 2, 2, 0, -2, 4]
    assert f.quantize(np.array([0.25, 0.75, 1.25, -0.25, -0.75, 1.75])).tolist() == [0, 2, 2, 0, -2, 4]
    assert f.quantize(torch.tensor([0.25, 0.75, 1.25, -0.25])).tolist() == [0, 2, 2, 0]
    g = FixedPoint.paper(10, 1)
    assert g.quantize(Fraction(-1, 20)) == -1  # paper grid always floors


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")],
                                 np.array([np.inf]), decimal.Decimal("NaN"), sympy.oo, sympy.nan])
def test_quantize_rejects_nonfinite(bad):
    for f in (FixedPoint.binary(5, 5), FixedPoint.paper(1000, 2), FixedPoint.paper(2**20, 2), Float64):
        with pytest.raises(PrecisionError, match="finite"):
            f.quantize(bad)
    with pytest.raises(PrecisionError, match="finite"):
        FixedPoint.binary(5, 5).quantize(torch.tensor([float("nan")]))


def test_quantize_rejects_bad_types():
    f = FixedPoint.binary(5, 5)
    with pytest.raises(RawTypeError, match="str"):
        f.quantize(np.array(["a"], dtype=object))
    with pytest.raises(RawTypeError):
        f.quantize(np.array([1 + 2j]))


def test_big_paper_grid_is_exact():
    f = FixedPoint.paper(n=2**20, kc=2)  # step 2^-40, raw range +-2^80: beyond int64
    x = Fraction(1, 3)
    r = f.quantize(x)
    assert isinstance(r, int) and r == (2**40) // 3
    arr = f.quantize([Fraction(2**39), -Fraction(2**39) - Fraction(1, 2**41)])
    assert arr.dtype == object and arr.tolist() == [2**79, -(2**79) - 1]
    assert f.to_fraction(arr).tolist() == [Fraction(2**39), -Fraction(2**39) - Fraction(1, 2**40)]
    assert f.represents(Fraction(2**40)) and not f.represents(Fraction(2**40) + Fraction(1, 2**40))
    with pytest.raises(PrecisionError, match="torch"):
        f.add(torch.tensor([1]), torch.tensor([2]))


def test_represents():
    f = FixedPoint.binary(5, 5)
    assert f.represents(Fraction(3, 32)) and f.represents(-32) and f.represents(0.5)
    assert not f.represents(Fraction(1, 64)) and not f.represents(32) and not f.represents(float("nan"))
    assert not f.represents(sympy.sqrt(2)) and f.represents(sympy.Rational(-1, 2))
    assert Float64.represents(0.1) and not Float64.represents(Fraction(1, 10))
    assert Float32.represents(0.5) and not Float32.represents(0.1)


@settings(max_examples=60, deadline=None)
@given(st.fractions(min_value=-40, max_value=40, max_denominator=10**6),
       st.sampled_from(["binary:int=5,frac=5", "binary:int=3,frac=7,rounding=nearest-even", "paper:n=12,kc=2",
                        "paper:n=2048,kc=3"]))
def test_quantize_matches_definition(x, spec):
    f = parse_format(spec)
    q = x * f.scale
    fl = q.numerator // q.denominator
    if f.rounding == "nearest-even":
        r = q - fl
        fl += 1 if (r > Fraction(1, 2) or (r == Fraction(1, 2) and fl % 2)) else 0
    expect = min(max(fl, f.min_raw), f.max_raw)
    assert int(f.quantize(x)) == expect
    assert f.to_fraction(f.quantize(x)) == Fraction(expect, f.scale)
    assert f.represents(Fraction(expect, f.scale))


def test_to_fraction_and_float():
    f = FixedPoint.binary(5, 5)
    r = np.array([[16, -40]], dtype=np.int64)
    fr = f.to_fraction(r)
    assert fr.dtype == object and fr.shape == (1, 2) and fr.tolist() == [[Fraction(1, 2), Fraction(-5, 4)]]
    assert f.to_fraction(np.int64(16)) == Fraction(1, 2) and f.to_fraction(f.max_raw) == Fraction(1023, 32)
    assert f.to_float(r).tolist() == [[0.5, -1.25]]
    assert f.to_fraction(torch.tensor([16])).tolist() == [Fraction(1, 2)]
    with pytest.raises(RawTypeError, match="integer"):
        f.to_fraction(np.array([0.5]))
    assert Float64.to_fraction(0.1) == Fraction(0.1)


# ---- raw argument checks and tagging -------------------------------------------------------------------


def test_raw_argument_errors():
    f = FixedPoint.binary(5, 5)
    with pytest.raises(RawTypeError, match="float64"):
        f.add(np.array([0.5]), np.array([1]))
    with pytest.raises(RawTypeError, match="torch.float32"):
        f.exp(torch.tensor([0.5]))
    with pytest.raises(RawTypeError, match="Fraction"):
        f.add(np.array([Fraction(1, 2)], dtype=object), 1)
    with pytest.raises(RawTypeError):
        f.relu(np.array([True]))
    with pytest.raises(PrecisionError, match=r"\[-1024, 1023\]"):
        f.add(np.array([5000]), np.array([1]))  # raw values of a wider format
    assert isinstance(RawTypeError("x"), TypeError) and isinstance(FormatMismatchError("x"), TypeError)


def test_tagging_catches_mixed_formats():
    f = FixedPoint.binary(5, 5)
    g = FixedPoint.binary(6, 4)  # the same raw range [-1024, 1023]: only a tag can tell them apart
    a = f.raw(f.quantize([1, 2]))
    b = g.raw(g.quantize([1, 2]))
    assert isinstance(a, RawArray) and a.raw_format == f
    with pytest.raises(FormatMismatchError, match="binary:int=6,frac=4"):
        f.add(a, b)
    c = f.add(a, a)
    assert isinstance(c, RawArray) and c.raw_format == f  # outputs of tagged inputs stay tagged
    assert f.add(np.asarray(a), np.asarray(b)).tolist() == [32 + 16, 64 + 32]  # plain arrays: unchecked
    t = g.raw(torch.tensor([16, 32]))
    with pytest.raises(FormatMismatchError):
        f.exp(t)
    assert isinstance(f.exp(torch.tensor([16])), torch.Tensor)


def test_scalar_in_scalar_out():
    f = FixedPoint.binary(5, 5)
    r = f.add(3, 4)
    assert np.ndim(r) == 0 and int(r) == 7
    assert f.to_fraction(f.mul(f.quantize(Fraction(1, 2)), f.quantize(3))) == Fraction(3, 2)
