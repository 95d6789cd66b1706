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
from typing import Any

from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.precision_search import fewest_bits, smallest_grid_eta
from exactformer.precision import Format, parse_format
from exactformer.precision.boxes import FixedArithmetic

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


def _row_ok(fmt: Format, eta: Fraction, mu: Fraction, n_keys: int, mode: str, tol: Fraction) -> bool:
    target, rest = RetrieveByPosition.worst_case(FixedArithmetic(fmt), eta, mu, n_keys)
    if mode == "one-hot":
        return target == 1 and rest == 0
    return (1 - target) + rest <= tol


def smallest_eta(fmt: Format, gram: Fraction, mu: Fraction, n_keys: int, mode: str = "one-hot",
                 tol: Fraction = Fraction(1, 2), offset: Fraction = Fraction(0)) -> Fraction | None:
    """The smallest eta, a multiple of step/gram (so the W_Q entry eta * gram is on the grid), whose
    worst-case first-layer row satisfies ``mode``; None when none in range does."""
    top = Fraction(fmt.max_value) / (1 + abs(offset))  # logits lie in [-(1 + |offset|) eta, (1 + |offset|) eta]
    return smallest_grid_eta(fmt, fmt.step / gram, lambda e: _row_ok(fmt, e, mu, n_keys, mode, tol), top)


def readout(fmt: Format, T: int, b: int = 0) -> tuple[Fraction, int, Fraction]:
    """(a, c, l0): the uniform weight, the readout gain (largest power of two <= min(1/a, max)) and
    the threshold logit (2b + 1) c a / 2; float formats: a = 1/T, c = 2^floor(log2 T)."""
    if not fmt.is_exact:
        c = 1 << (T.bit_length() - 1)
        return Fraction(1, T), c, Fraction(float(Fraction((2 * b + 1) * c, 2 * T)))
    arith = FixedArithmetic(fmt)
    a = Fraction(arith.to_fraction(arith.array(arith.uniform_weight(T))))
    if a <= 0:
        return a, 0, Fraction(0)
    cap = min(1 / a, Fraction(fmt.max_value))
    c = 1
    while 2 * c <= cap:
        c <<= 1
    return a, c, (2 * b + 1) * c * a / 2


def average_ok(fmt: Format, T: int, b: int, saturation: bool) -> bool:
    """The second layer's requirements: a > 0, c and l0 representable (and l0 below the maximum),
    and (unless ``saturation``) no saturation of the softmax sum T e(0)."""
    if not fmt.is_exact:
        return True
    a, c, l0 = readout(fmt, T, b)
    if a <= 0 or not fmt.represents(Fraction(c)) or not fmt.represents(l0) or l0 >= Fraction(fmt.max_value):
        return False
    return saturation or T * Fraction(1) <= Fraction(fmt.max_value)


def resolve(n: int, T: int, gram: Fraction, mu: Fraction, eta: Any, precision: Any, tol: Fraction,
            offset: Fraction, b: int, err: type[Exception]) -> tuple[Format, Fraction, dict[str, str]]:
    """The format, eta and the formulas behind them (see the module docstring). ``eta``: None or
    "one-hot", "threshold", or a number > 0; ``precision``: None, a Format or a format string."""
    mode = "one-hot"
    if isinstance(eta, str):
        if eta not in MODES:
            raise err(f"eta must be a positive number, 'one-hot' or 'threshold', got {eta!r}")
        mode, eta = eta, None
    if isinstance(precision, str):
        precision = parse_format(precision)

    def check(fmt: Format) -> Fraction | None:
        if not (fmt.represents(Fraction(1, 2)) and average_ok(fmt, T, b, saturation=False)):
            return None
        return smallest_eta(fmt, gram, mu, T, mode, tol, offset)

    notes = {"mode": mode}
    if precision is None:
        precision, auto = fewest_bits(check, max_bits=48, err=err)
        notes["precision"] = (f"fewest-bit binary format with: a {mode} worst-case first-layer row for some grid eta, "
                              "and an unsaturated uniform second-layer average (weight > 0)")
    else:
        notes["precision"] = "given"
        auto = smallest_eta(precision, gram, mu, T, mode, tol, offset) if precision.is_exact else None
        if precision.is_exact and not average_ok(precision, T, b, saturation=True):
            raise err(f"precision {precision.name}: the second layer's uniform weight round(1/{T}) is 0 or the readout "
                      f"constants are not representable (the step must be <= 1/{T}); {_hint(check, err)}")
    if eta is not None:
        eta = Fraction(eta)
        if eta <= 0:
            raise err(f"eta must be > 0, got {eta}")
        notes["eta"] = "given"
        return precision, eta, notes
    if not precision.is_exact:
        notes["eta"] = "ceil(4 (ln N + ln 2N)) / 4 (float format: the paper's scale with Kc = 1)"
        return precision, Fraction(math.ceil(paper_eta(n, 1.0) * 4), 4), notes
    if auto is None:
        raise err(f"precision {precision.name}: no representable eta makes the first layer's attention {mode} "
                  f"for T={T}, Gram scale {gram}, mu={mu}; {_hint(check, err)}")
    notes["eta"] = ("smallest multiple of step/gram with every worst-case row (all others at mu) "
                    + ("exactly one-hot: e(-eta(1-mu)) rounds to 0" if mode == "one-hot"
                       else f"within tolerance: (1 - target) + rest <= {tol}"))
    return precision, auto, notes


def _hint(check, err) -> str:
    try:
        fmt, eta = fewest_bits(check, max_bits=48, err=err)
        return f"the smallest precision that works is {fmt.name} (eta = {eta})"
    except err:
        return "no binary format up to 48 bits works"
