"""The design of the two-layer Boolean constructions (Theorems 6 and 13): one retrieval layer whose
MLP computes a 0/1 feature at every position, then a uniform average read out against a threshold.

Everything here is a sufficient condition evaluated with the format's own operations:

* :func:`smallest_eta`: the smallest grid eta for which the first layer's worst row (every other
  key at the code's bound mu, :meth:`RetrieveByPosition.worst_case`) is exactly one-hot
  ("one-hot", the default: every off-target exponential rounds to 0) or within the feature MLP's
  tolerance ("threshold": (1 - target) + rest <= tol);
* :func:`readout`: the second layer's uniform weight a = div(e(0), sat(T e(0))) and the readout's
  gain c and threshold logit l0 = (2b + 1) c a / 2, so the answer is [S >= b + 1] with margin c a / 2;
* :func:`resolve`: the format and eta (given, or the fewest-bit binary format for which both hold).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.codes.positions import position_codes
from exactformer.constructions.core.ir import Param
from exactformer.constructions.design.precision_search import (FLOAT_FALLBACKS, arithmetics_for, designed_for, fallbacks,
                                                        fewest_bits, float_arithmetic, float_set, given_eta,
                                                        largest_n, smallest_grid_eta, smallest_works)
from exactformer.precision import FixedPoint, Format, parse_format
from exactformer.precision.boxes import Box, FixedArithmetic

MODES = ("one-hot", "threshold")


def kc_equivalent(fmt: Format, n: int) -> float | None:
    """K_c of App. B.2 for a format: step = N^-Kc, i.e. Kc = log(1/step) / log N."""
    if not fmt.is_exact or n < 2:
        return None
    if getattr(fmt, "kind", None) == "paper":
        return float(fmt.params["kc"])
    return math.log(1 / float(fmt.step)) / math.log(n)


def paper_eta(n: int, kc: float) -> float:
    """App. F.2's scale: eta = ln N + Kc ln(2N)."""
    return math.log(n) + kc * math.log(2 * n)


def float_tolerance(tol: Fraction, b: int) -> Fraction:
    """The first layer's tolerance in float arithmetics. No float exp rounds to 0, so every feature
    value is off by up to 2 * gain * eps (eps = (1 - target) + rest, gain = 1/(2 tol) heads read per
    feature), and the average sums b + 1 of them: eps <= 1/(16 gain (b + 1)) keeps that error within
    1/8 of the count gap 1/T; and never more than ``tol`` itself."""
    gain = Fraction(1) / (2 * tol)
    return min(tol, 1 / (16 * gain * (b + 1)))


def _row_ok(fmt: Format, eta: Fraction, mu: Fraction, n_keys: int, mode: str, tol: Fraction, floats: tuple[str, ...],
            gram: Fraction, offset: Fraction, tol_float: Fraction) -> bool:
    target, rest = RetrieveByPosition.worst_case(FixedArithmetic(fmt), eta, mu, n_keys)
    if not ((target == 1 and rest == 0) if mode == "one-hot" else (1 - target) + rest <= tol):
        return False
    for arith in arithmetics_for(fmt, floats)[1:]:  # no row of floats is one-hot: the float tolerance
        target, rest = RetrieveByPosition.worst_case(arith, eta, mu, n_keys, gram, offset)
        if (1 - target) + rest > tol_float:
            return False
    return True


def smallest_eta(fmt: Format, gram: Fraction, mu: Fraction, n_keys: int, mode: str = "one-hot",
                 tol: Fraction = Fraction(1, 2), offset: Fraction = Fraction(0), floats: tuple[str, ...] = (),
                 tol_float: Fraction | None = None) -> Fraction | None:
    """The smallest eta, a multiple of step/gram (so the W_Q entry eta * gram is on the grid), whose
    worst-case first-layer row satisfies ``mode`` in the format (and is within ``tol_float``, default
    ``tol``, in each arithmetic of ``floats``); None when none in range does."""
    top = Fraction(fmt.max_value) / (1 + abs(offset))  # logits lie in [-(1 + |offset|) eta, (1 + |offset|) eta]
    tf = tol if tol_float is None else tol_float
    return smallest_grid_eta(fmt, fmt.step / gram, lambda e: _row_ok(fmt, e, mu, n_keys, mode, tol, floats, gram, offset, tf), top)


def readout(fmt: Format, T: int, b: int = 0, robust: bool | tuple[str, ...] = False) -> tuple[Fraction, int, Fraction]:
    """(a, c, l0): the uniform weight a under the format, the readout gain c (largest power of two
    <= min(1/a, max)) and the threshold logit l0, so that the answer is [c z > l0]. Not robust:
    l0 = (2b + 1) c a / 2, halfway between b and b + 1 features. Robust (any float arithmetic
    checked): l0 lies strictly between c b max(a, 1/T) and c (b + 1) min(a, 1/T), on the grid --
    right both for the format's a and for the float weight 1/T (l0 = 0 when no grid value does).
    Float formats: a = 1/T."""
    if not fmt.is_exact:
        c = 1 << (T.bit_length() - 1)
        return Fraction(1, T), c, Fraction(float(Fraction((2 * b + 1) * c, 2 * T)))
    arith = FixedArithmetic(fmt)
    a = Fraction(arith.to_fraction(np.asarray(arith.uniform_weight(T).lo)))
    if a <= 0:
        return a, 0, Fraction(0)
    cap = min(1 / a, Fraction(fmt.max_value))
    c = 1
    while 2 * c <= cap:
        c <<= 1
    if not float_set(robust):
        return a, c, (2 * b + 1) * c * a / 2
    lower, upper = c * b * max(a, Fraction(1, T)), c * (b + 1) * min(a, Fraction(1, T))
    step = fmt.step
    l0 = ((lower + upper) / 2 // step) * step
    if not lower < l0 < upper:
        l0 = lower + step if lower + step < upper else Fraction(0)
    return a, c, l0 if lower < l0 < upper else Fraction(0)


def _float_count_ok(floats: tuple[str, ...], T: int, b: int, c: int, l0: Fraction, delta: Fraction) -> bool:
    """In each float arithmetic: with feature values 0 (exactly: a ReLU's zero) or within ``delta``
    of 1, the computed logit c z (z = the sum of the S weighted values, in any order) is below the
    rounded l0 for S = b and above it for S = b + 1 (the sum is monotone in S, so those two decide)."""
    for name in floats:
        A = float_arithmetic(name)
        term = A.mul(A.uniform_weight(T), Box(np.array(1 - float(delta)), np.array(1 + float(delta))))
        thr = A.const(l0)
        for S, below in ((b, True), (b + 1, False)):
            if S == 0:
                continue  # z = 0 exactly
            z = A.sum(Box(np.atleast_1d(term.lo), np.atleast_1d(term.hi)), axis=0, counts=np.array([S]))
            logit = A.mul(z, Box.point(np.array(float(c))))
            if (float(logit.hi) >= thr) if below else (float(logit.lo) <= thr):
                return False
    return True


def average_ok(fmt: Format, T: int, b: int, saturation: bool, robust: bool | tuple[str, ...] = False,
               tol: Fraction = Fraction(1, 2)) -> bool:
    """The second layer's requirements: a > 0, c and l0 representable (and l0 below the maximum),
    (unless ``saturation``) no saturation of the softmax sum T e(0), and, for each float
    arithmetic of ``robust``, a threshold that separates b from b + 1 counted features under the
    float weight 1/T, the float summation error and feature values within 2 gain tol_float of 0/1
    (:func:`float_tolerance`)."""
    if not fmt.is_exact:
        return True
    floats = float_set(robust)
    a, c, l0 = readout(fmt, T, b, floats)
    if a <= 0 or not fmt.represents(Fraction(c)) or not fmt.represents(l0) or l0 >= Fraction(fmt.max_value):
        return False
    if floats and not (c * b * max(a, Fraction(1, T)) < l0 < c * (b + 1) * min(a, Fraction(1, T))):
        return False
    if floats and not _float_count_ok(floats, T, b, c, l0, 2 * float_tolerance(tol, b) / (2 * tol)):
        return False
    return saturation or T * Fraction(1) <= Fraction(fmt.max_value)


#: what a robust build tries, in order: every float arithmetic, then without float32 (whose
#: a-priori summation bound cannot separate large counts), then exact reals alone, then the format
#: alone (when no format up to 48 bits puts one threshold between b and b + 1 counts for both the
#: format's rounded 1/T and the exact 1/T); the format alone is searched up to this many bits
#: (Equality at N = 2^30 needs binary:int=31,frac=30, 62 bits: the weight 1/N and counts up to N)
FORMAT_ALONE_BITS = 64


def resolve(n: int, T: int, gram: Fraction, mu: Fraction, eta: Any, precision: Any, tol: Fraction,
            offset: Fraction, b: int, err: type[Exception], arithmetics: tuple[str, ...] | None = None,
            smaller: Callable[[int], tuple[int, Fraction, Fraction, int]] | None = None) -> tuple[Format, Fraction, dict[str, Any]]:
    """The format, eta and the formulas behind them (see the module docstring). ``eta``: None or
    "robust" / "one-hot" (the default: every worst-case row exactly one-hot in the format, within
    the float tolerance in exact reals, float64 and float32 -- dropping float32, then float64, when
    no format up to 48 bits allows them, said in ``notes["floats_dropped"]``), "threshold" (within
    the tolerance everywhere), "minimal" (one-hot in the format only: fixed-point only), or a
    number > 0; ``precision``: None, a Format or a format string. ``notes["robust"]`` is the tuple
    of float arithmetics checked. ``arithmetics`` (from
    :func:`~exactformer.constructions.design.precision_search.design_arithmetics`): exactly these
    instead of the fallbacks, refused when no format allows them, with the largest power-of-two N
    that works where ``smaller(N')`` gives the design's (T, gram, mu, b) at a smaller N'."""
    mode, want = "one-hot", fallbacks(arithmetics)
    if isinstance(eta, str):
        if eta not in MODES + ("robust", "minimal"):
            raise err(f"eta must be 'robust', 'one-hot', 'threshold', 'minimal' or a number > 0, got {eta!r}")
        if eta == "minimal" and arithmetics is not None:
            raise err("arithmetics: not with eta minimal (a fixed-point-only design)")
        mode = "threshold" if eta == "threshold" else "one-hot"
        want, eta = (want if eta != "minimal" else ((),)), None
    if isinstance(precision, str):
        precision = parse_format(precision)
    tol_f = float_tolerance(tol, b)

    def checker(floats: tuple[str, ...]):
        def check(fmt: Format) -> Fraction | None:
            if not (fmt.represents(Fraction(1, 2)) and average_ok(fmt, T, b, saturation=False, robust=floats, tol=tol)):
                return None
            return smallest_eta(fmt, gram, mu, T, mode, tol, offset, floats, tol_f)
        return check

    notes: dict[str, Any] = {"mode": mode}
    given = precision is not None
    floats, auto, dropped = want[0], None, []
    for floats in want:
        c_ideal = 1 << (T.bit_length() - 1)
        if floats and not _float_count_ok(floats, T, b, c_ideal, Fraction((2 * b + 1) * c_ideal, 2 * T),
                                          float_tolerance(tol, b) / tol):
            if arithmetics is not None:  # asked for: no fallback
                raise err(_refusal(arithmetics, n, f"no threshold separates b = {b} from {b + 1} counted features "
                                                   f"over T = {T} positions there", smaller, mode, tol, offset, err))
            dropped.append(floats[-1])  # even the ideal threshold fails there: no format can help
            continue
        check = checker(floats)
        try:
            if precision is None:
                fmt, auto = fewest_bits(check, max_bits=48 if floats else FORMAT_ALONE_BITS, err=err)
            else:
                fmt = precision
                auto = smallest_eta(fmt, gram, mu, T, mode, tol, offset, floats, tol_f) if fmt.is_exact else None
                if fmt.is_exact and not average_ok(fmt, T, b, saturation=True, robust=floats, tol=tol):
                    raise err(f"precision {fmt.name}: the second layer's uniform weight round(1/{T}) is 0 or the "
                              f"readout constants are not representable (the step must be <= 1/{T})"
                              + (" or do not separate the counts in " + ", ".join(floats) if floats else "")
                              + f"; {smallest_works(check, err)}")
                if fmt.is_exact and auto is None and eta is None:
                    raise err(f"precision {fmt.name}: no representable eta makes the first layer's attention {mode} "
                              f"for T={T}, Gram scale {gram}, mu={mu}" + (f" (and within {tol_f} in "
                              + ", ".join(floats) + ")" if floats else "") + f"; {smallest_works(check, err)}")
            break
        except err as e:
            if arithmetics is not None and precision is None:
                raise err(_refusal(arithmetics, n, "no binary format up to 48 bits meets the conditions", smaller, mode,
                                   tol, offset, err)) from None
            if floats == want[-1]:
                raise e
            dropped.append(floats[-1])
    precision = fmt
    notes["robust"] = floats
    if dropped:
        notes["floats_dropped"] = (f"{', '.join(dropped)} not checked: no " + ("format up to 48 bits" if not given else
                                   f"eta in {precision.name}") + f" meets the conditions there (the counts b = {b}, "
                                   f"{b + 1} must stay apart under the a-priori summation bound; the certificate decides)")
    described = ", ".join(floats)
    notes["precision"] = ("given" if given else
                          f"fewest-bit binary format with: a {mode} worst-case first-layer row for some grid eta"
                          + (f" (within {tol_f} in {described})" if floats else "")
                          + ", and an unsaturated uniform second-layer average (weight > 0)")
    if eta is not None:
        eta = given_eta(eta, err)
        notes["eta"] = "given"
        if arithmetics is not None and precision.is_exact and not _row_ok(precision, eta, mu, T, "threshold", tol,
                                                                          arithmetics, gram, offset, tol_f):
            least = smallest_eta(precision, gram, mu, T, "threshold", tol, offset, arithmetics, tol_f)
            raise err(f"arithmetics {', '.join(arithmetics)}: eta = {eta} leaves the first layer's worst-case row "
                      f"outside {tol_f} there in {precision.name}; "
                      + (f"the smallest eta that works is {least}" if least is not None else "no eta in range works"))
        return precision, eta, notes
    if not precision.is_exact:
        checked = FLOAT_FALLBACKS[0] if arithmetics is None else arithmetics
        e = smallest_grid_eta(FixedPoint.binary(16, 16), Fraction(1, 4),
                              lambda x: _row_ok(FixedPoint.binary(16, 16), x, mu, T, "threshold", tol, checked,
                                                gram, offset, tol_f))
        notes["eta"] = f"smallest multiple of 1/4 within {tol_f} in {', '.join(checked)}"
        return precision, e if e is not None else Fraction(math.ceil(paper_eta(n, 1.0) * 4), 4), notes
    notes["eta"] = ("smallest multiple of step/gram with every worst-case row (all others at mu) "
                    + ("exactly one-hot: e(-eta(1-mu)) rounds to 0" if mode == "one-hot"
                       else f"within tolerance: (1 - target) + rest <= {tol}")
                    + (f" in the format, and within {tol_f} in {described}" if floats
                       else " (fixed-point only: minimal)"))
    return precision, auto, notes



def _refusal(arithmetics: tuple[str, ...], n: int, what: str, smaller: Any, mode: str, tol: Fraction,
             offset: Fraction, err: type[Exception]) -> str:
    """Why a design for ``arithmetics`` is refused at N = ``n``, with the largest power-of-two N at
    which it holds when ``smaller`` gives the design's inputs there."""
    head = f"arithmetics {', '.join(arithmetics)}: {what} at N = {n}"
    if smaller is None:
        return head

    def works(n2: int) -> bool:
        T2, gram2, mu2, b2 = smaller(n2)
        try:
            resolve(n2, T2, gram2, mu2, mode, None, tol, offset, b2, err, arithmetics)
        except err:
            return False
        return True

    found = largest_n(works, n)
    return head + ("; the largest power of two N at which a format allows them is " + str(found) if found
                   else "; no N >= 2 allows them")


def arithmetics_param(fmt: Format, notes: dict[str, Any]) -> Param:
    """The ``arithmetics`` parameter of a two-layer build from :func:`resolve`'s notes."""
    return Param(designed_for(fmt, notes["robust"]), "the arithmetics the sufficient conditions were checked in "
                 + (("(robust build" + (f"; {notes['floats_dropped']}" if "floats_dropped" in notes else "") + ")")
                    if notes["robust"] else "(fixed-point only: eta minimal)"))


def code_for(n_codes: int, positions: Any, max_inner: Fraction, seed: int, err: type[Exception]) -> Any:
    """A position code with at least ``n_codes`` vectors (a family name or a code object) and its
    proved (or certified) bound mu."""
    if isinstance(positions, str):
        code = position_codes(n_codes, max_inner=Fraction(max_inner), family=positions, seed=seed)
    elif getattr(positions, "n", 0) < n_codes:
        raise err(f"positions: the code has {getattr(positions, 'n', 0)} vectors, need {n_codes}")
    else:
        code = positions
    mu = Fraction(code.bound) if code.bound is not None else Fraction(code.certify().max_inner)
    return code, mu


def etas_by_mode(fmt: Format, eta: Fraction, notes: dict, gram: Fraction, mu: Fraction, n_keys: int, tol: Fraction,
                 offset: Fraction) -> dict[str, Fraction | None]:
    """The smallest grid eta of each mode (``two_layer.MODES``) in the format alone (None for float
    formats); the mode :func:`resolve` searched for under the same condition is not searched again."""
    if not fmt.is_exact:
        return {mode: None for mode in MODES}
    searched = {notes["mode"]: eta} if notes["eta"] != "given" and not notes.get("robust") else {}
    return {mode: searched[mode] if mode in searched else smallest_eta(fmt, gram, mu, n_keys, mode, tol, offset)
            for mode in MODES}
