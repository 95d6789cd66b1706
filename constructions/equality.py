"""Equality and Inequality with two layers of width O(log N) (Theorem 6, App. F.2 of
Bhattamishra et al. 2024).

Tasks, for x in {-1, 1}^N with N even:  EQ(x) = 1 iff (x_1 .. x_{N/2}) = (x_{N/2+1} .. x_N), and
INEQ(x) = 1 - EQ(x) = OR_{i <= N/2} [x_i != x_{i+N/2}].

Construction (App. F.2; the paper's equations reconstructed in docs/equality.md). T(1..N) is a
position code stored as signs sigma(i) in {-1, +1}^k (1/k folded into W_Q). Positions are 0-based
here: position i holds x_{i+1}, and its partner is t(i) = i (i < N/2, the first half attends to
itself) or i - N/2 (i >= N/2). The residual stream has d_model = 4 + 2k columns::

    [ x | y (layer-1 attention out) | m (mismatch bit) | z (layer-2 attention out) | key code (k) | query code (k) ]

* token x_i at position i:   [x_i, 0, 0, 0, sigma(i), sigma(t(i))]   (token: column x; position: the codes)
* layer 1, one head, d_head = k + 1:
      Q(i) = [(eta/k) sigma(t(i)), eta]    (W_Q on the query code block, b_Q = eta on the last dim)
      K(j) = [sigma(j), -1/2]              (W_K on the key code block,   b_K = -1/2)
      <Q(i), K(j)> = eta <T(t(i)), T(j)> - eta/2  =  eta/2 at j = t(i),  <= eta(mu - 1/2) elsewhere
      V(j) = x_j -> written to column y.
  With eta large enough every rounded softmax row is exactly one-hot on t(i) (every off-target
  exponential rounds to 0), so y_i = x_{t(i)}.
* MLP 1 (4 hidden units), written to column m: with d = x - y,
      m = 2 relu(d - 1/2) - 2 relu(d - 1) + 2 relu(-d - 1/2) - 2 relu(-d - 1)
  = 0 for |d| <= 1/2 and 1 for |d| >= 1. Exactly: m_i = [x_i != x_{t(i)}] (0 on the first half).
  It tolerates an attention weight >= 3/4 on the partner with <= 1/4 elsewhere.
* layer 2, one head, query 0: every weight is the format's uniform weight a = round(1/N)
  (exactly 1/N when N is a power of two and the step is <= 1/N); V(j) = m_j -> column z, so
  z = a * #{i : x_i != x_{i+N/2}} at the last position.
* MLP 2 is zero; the readout thresholds z at > 0:  logit_INEQ = c z,  logit_EQ = c a / 2 with
  the largest power of two c <= 1/a (so answer INEQ iff z >= a, i.e. iff some pair differs;
  margin c a / 2, = 1/2 when a = 1/N).

``equality(n)`` answers EQ, ``inequality(n)`` answers INEQ (same weights, readout columns swapped).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from exactformer.constructions.ir import (
    MLP,
    Attention,
    Block,
    CodeBlock,
    CompiledModel,
    Embedding,
    ExactTensor,
    Param,
    check_shapes,
    code_fingerprint,
    sequence_rows,
)
from exactformer.constructions.position_codes import position_codes
from exactformer.precision import FixedPoint, Format, parse_format

NAME = "equality"
NAMES = ("equality", "inequality")
THEOREM = "Thm 6 (App. F.2), Bhattamishra et al. 2024"
MAX_N = 1 << 24
XOR_TOLERANCE = Fraction(1, 2)  # the XOR MLP is exact while |y - x_partner| <= 1/2
KEY_OFFSET = Fraction(-1, 2)  # the paper's key entry -1/2 (a per-row constant: softmax ignores it)


class EqualityError(ValueError):
    """Bad parameters for :func:`equality` / :func:`inequality`, or a bad input to ``encode``."""


# ------------------------------------------------------------------------------------------------
# the paper's constants
# ------------------------------------------------------------------------------------------------


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


# ------------------------------------------------------------------------------------------------
# sufficient conditions (builder side), evaluated with the format's own operations
# ------------------------------------------------------------------------------------------------


def _raw(fmt: Format, v: Fraction) -> np.ndarray:
    return np.asarray(fmt.quantize(np.array([v], dtype=object)))


def _val(fmt: Format, r) -> Fraction:
    return Fraction(fmt.to_fraction(np.asarray(r).reshape(-1)[:1])[0])


def _exp0(fmt: Format) -> np.ndarray:
    """The format's e(0) as raw: e^0 = 1 exactly, so round(1) = 1 saturated to the range (the
    same value ``fmt.exp`` returns, without building its tables for every candidate format)."""
    return np.array([min(int(np.asarray(fmt.quantize(np.array([Fraction(1)], dtype=object)))[0]) if fmt.represents(1)
                         else fmt.max_raw, fmt.max_raw)], dtype=np.int64)


@dataclass
class RowBound:
    """Worst-case rounded softmax row of the first layer (weights as exact Fractions)."""

    one_hot: bool  # every off-target exponential rounds to 0, so the row is exactly one-hot
    target: Fraction  # lower bound on the weight of the partner
    rest: Fraction  # upper bound on the summed weight of the other positions

    def holds(self, mode: str, tol: Fraction) -> bool:
        if mode == "one-hot":
            return self.one_hot
        return (1 - self.target) + self.rest <= tol


def gram_scale(code: Any) -> Fraction:
    """<T(i), T(j)> = gram_scale * <numerators(i), numerators(j)>: 1/k for +-1 codes, 1 for one-hot."""
    return Fraction(getattr(code, "gram_scale", Fraction(1, int(code.k))))


def worst_case_row(fmt: Format, eta: Fraction, mu: Fraction, n_keys: int) -> RowBound:
    """Bounds on any first-layer softmax row from the code's bound ``mu`` alone.

    Logits, exactly as the executor forms them (eta*gs on the grid, gs the code's Gram scale):
    eta*gs*I + c with I = <numerators(q), numerators(j)> and c a per-row constant (the paper's
    key offset); eta*gs*I = eta on the partner and <= eta*mu elsewhere. The row maximum is the
    partner, so after subtracting it every other entry is <= -eta(1 - mu); the rounded exponential
    is monotone, so the worst row puts all n_keys - 1 others there. One-hot
    iff that exponential rounds to 0 (then Z = e(0) and the partner's weight is div(e0, e0) = 1).
    Otherwise target >= div(e0, sat(e0 + (n-1) e_w)) and rest <= (n - 1) div(e_w, e0) (every other
    weight is div(e_j, Z) with e_j <= e_w and Z >= e0; div is monotone in both arguments).
    """
    gap = eta * (1 - mu)
    e0 = _exp0(fmt)
    ew = np.asarray(fmt.exp(fmt.sub(_raw(fmt, Fraction(0)), _raw(fmt, gap))))
    e0v, ewv = _val(fmt, e0), _val(fmt, ew)
    if ewv == 0:
        return RowBound(True, Fraction(1), Fraction(0))
    Z = min(e0v + (n_keys - 1) * ewv, fmt.to_fraction(np.array([fmt.max_raw]))[0])
    target = _val(fmt, fmt.div(e0, _raw(fmt, Fraction(Z))))
    rest = (n_keys - 1) * _val(fmt, fmt.div(ew, e0))
    return RowBound(False, target, rest)


def smallest_eta(fmt: Format, gs: Fraction, mu: Fraction, n_keys: int, mode: str = "one-hot",
                 tol: Fraction = XOR_TOLERANCE, offset: Fraction = Fraction(0)) -> Fraction | None:
    """The smallest eta = (step / gs) * j (so that eta * gs, the W_Q entry, is on the grid) for which the worst-case row satisfies ``mode``
    ("one-hot": exactly one-hot; "threshold": (1 - target) + rest <= tol), or None when no eta
    whose logits stay in range works. Monotone in eta (every rounded exponential is
    non-increasing in eta), so bisection over j is exact."""
    unit = fmt.step / gs
    # logits lie in [-(1 + |offset|) eta, (1 + |offset|) eta]; keep them unsaturated
    hi_eta = fmt.to_fraction(np.array([fmt.max_raw]))[0] / (1 + abs(offset))
    j_hi = int(hi_eta / unit)
    if j_hi < 1 or not worst_case_row(fmt, unit * j_hi, mu, n_keys).holds(mode, tol):
        return None
    lo, hi = 0, j_hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if worst_case_row(fmt, unit * mid, mu, n_keys).holds(mode, tol):
            hi = mid
        else:
            lo = mid
    return unit * hi


def uniform_weight(fmt: Format, T: int) -> Fraction:
    """The rounded weight of a softmax row of T equal logits under ``fmt``: div(e(0), sat(T e(0)))
    (App. D: max subtracted, exp, exact sum saturated once, divided). For float formats the
    power of two 2^-ceil(log2 T) <= 1/T (used as the readout threshold)."""
    if not fmt.is_exact:
        return Fraction(1, 1 << (T - 1).bit_length())
    e0 = _exp0(fmt)
    Z = min(T * _val(fmt, e0), fmt.to_fraction(np.array([fmt.max_raw]))[0])
    return _val(fmt, fmt.div(e0, _raw(fmt, Z)))


def readout(fmt: Format, T: int, b: int = 0) -> tuple[Fraction, int, Fraction]:
    """The second layer's uniform weight a, the readout gain c and the threshold logit.

    The readout compares logit_yes = c * z (z = a * S, S the number of true features) with
    logit_no = (2b + 1) * c * a / 2, so the answer is "yes" iff S >= b + 1, with margin c*a/2.
    c is the largest power of two with c <= 1/a and c <= the format's maximum (so c * z is exact
    and c * a lies in (1/2, 1] unless the maximum caps it; c = T when the average is unsaturated and
    a = 1/T). The weights do not depend on the step beyond a: every format with a > 0 runs them.
    Float formats: a = 1/T nominally, c = 2^floor(log2 T), logit_no = (2b+1) c / (2T) rounded to
    a double."""
    if not fmt.is_exact:
        c = 1 << (T.bit_length() - 1)
        return Fraction(1, T), c, Fraction(float(Fraction((2 * b + 1) * c, 2 * T)))
    a = uniform_weight(fmt, T)
    if a <= 0:
        return a, 0, Fraction(0)
    cap = min(1 / a, fmt.to_fraction(np.array([fmt.max_raw]))[0])
    c = 1
    while 2 * c <= cap:
        c <<= 1
    return a, c, (2 * b + 1) * c * a / 2


def average_ok(fmt: Format, T: int, b: int, saturation: bool) -> bool:
    """Layer 2's requirements: a uniform weight a > 0, the readout gain c and threshold logit
    representable, and (unless ``saturation``) no saturation of the softmax sum T e(0)."""
    if not fmt.is_exact:
        return True
    a, c, l0 = readout(fmt, T, b)
    if a <= 0 or not fmt.represents(Fraction(c)) or not fmt.represents(l0):
        return False
    if l0 >= fmt.to_fraction(np.array([fmt.max_raw]))[0]:
        return False
    if not saturation:
        e0 = _val(fmt, _exp0(fmt))
        if T * e0 > fmt.to_fraction(np.array([fmt.max_raw]))[0]:
            return False
    return True


def default_binary_precision(check, max_frac: int = 40, max_int: int = 40) -> tuple[Format, Any]:
    """The binary format with the fewest bits (then the fewest fraction bits) for which
    ``check(fmt)`` returns a non-None value; returns (fmt, value)."""
    best: tuple[int, int, Format, Any] | None = None
    for frac in range(1, max_frac + 1):
        if best is not None and frac + 1 >= best[0]:
            break
        for int_bits in range(1, max_int + 1):
            if best is not None and int_bits + frac >= best[0]:
                break
            fmt = FixedPoint.binary(int_bits=int_bits, frac_bits=frac)
            v = check(fmt)
            if v is not None:
                best = (int_bits + frac, frac, fmt, v)
                break
    if best is None:
        raise EqualityError(f"no binary format with at most {max_frac} fraction bits satisfies the sufficient condition")
    return best[2], best[3]


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


def _check_n(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= MAX_N or n % 2:
        raise EqualityError(f"n must be an even integer in [2, 2^24], got {n!r}")
    return int(n)


def _code_for(n_codes: int, positions: Any, max_inner: Fraction, seed: int, err=None):
    """A position code with at least ``n_codes`` vectors (a family name or a code object)."""
    err = err or EqualityError
    if isinstance(positions, str):
        return position_codes(n_codes, max_inner=Fraction(max_inner), family=positions, seed=seed)
    if getattr(positions, "n", 0) < n_codes:
        raise err(f"positions: the code has {getattr(positions, 'n', 0)} vectors, need {n_codes}")
    return positions


def code_view(code: Any) -> Any:
    """The object a CodeBlock holds for an identity block: the code itself."""
    return code


class CodeView:
    """A position code read through an index map: vector ``idx`` of the view is vector
    ``base_indices(idx)`` of ``base`` (its numerators: +-1 signs, or 0/1 rows for one-hot).

    ``kind``: "identity"; "constant" (every index maps to ``data``, an int); "table" (``data`` is an
    int64 array: index i maps to data[i]). Used for query blocks whose code index is not an affine
    function of the position (T(0) for unused slots, arbitrary feature index sets)."""

    def __init__(self, base: Any, kind: str = "identity", data: Any = None):
        if kind not in ("identity", "constant", "table"):
            raise ValueError(f"kind must be 'identity', 'constant' or 'table', got {kind!r}")
        self.base, self.kind = base, kind
        self.data = np.asarray(data, dtype=np.int64) if kind == "table" else data
        self.k, self.bound, self.family = base.k, base.bound, base.family
        self.n = len(self.data) if kind == "table" else (base.n if kind == "identity" else 1 << 62)
        self.is_sign_code = getattr(base, "is_sign_code", True)
        self.gram_scale = getattr(base, "gram_scale", Fraction(1, base.k))

    def base_indices(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if self.kind == "identity":
            return idx
        if self.kind == "constant":
            return np.full(idx.shape, int(self.data), dtype=np.int64)
        return self.data[idx]

    def numerators(self, idx) -> np.ndarray:
        return np.asarray(self.base.numerators(self.base_indices(idx)))

    signs = numerators

    def generator_key(self) -> tuple:
        data = hashlib.sha256(np.ascontiguousarray(self.data).tobytes()).hexdigest() if self.kind == "table" else self.data
        return ("view", self.kind, data, code_fingerprint(self.base))

    def describe(self) -> dict:
        out = {"family": "view", "kind": self.kind, "base": self.base.describe() if hasattr(self.base, "describe") else {}}
        if self.kind == "constant":
            out["index"] = int(self.data)
        elif self.kind == "table":
            out["table_len"] = int(len(self.data))
        return out


def base_code(code: Any) -> Any:
    """The underlying position code of a code or a :class:`CodeView`."""
    return code.base if isinstance(code, CodeView) else code


def _mu(code: Any) -> Fraction:
    if code.bound is not None:
        return Fraction(code.bound)
    return Fraction(code.certify().max_inner)


def resolve_precision_and_eta(n: int, T: int, gs: Fraction, mu: Fraction, eta: Any, precision: Any, tol: Fraction,
                              offset: Fraction, b: int, err=EqualityError) -> tuple[Format, Fraction, dict]:
    """Shared by equality and thresholds: the format, eta and the formulas behind them.

    ``eta``: None / "one-hot" (smallest grid eta making every worst-case row exactly one-hot),
    "threshold" (smallest grid eta with (1 - target) + rest <= tol), or a number. ``precision``:
    None (the fewest-bit binary format satisfying the sufficient condition for the chosen mode
    with an unsaturated layer-2 average), a Format or a format string."""
    mode = "one-hot"
    if isinstance(eta, str):
        if eta not in ("one-hot", "threshold"):
            raise err(f"eta must be a positive number, 'one-hot' or 'threshold', got {eta!r}")
        mode, eta = eta, None
    if isinstance(precision, str):
        precision = parse_format(precision)
    notes: dict[str, Any] = {"mode": mode}
    if precision is None:
        def check(fmt: Format):
            if not (fmt.represents(Fraction(1, 2)) and average_ok(fmt, T, b, saturation=False)):
                return None
            return smallest_eta(fmt, gs, mu, T, mode, tol, offset)

        precision, auto_eta = _default(check, err)
        notes["precision_formula"] = (f"fewest-bit binary format with: a {mode} worst-case first-layer row for some "
                                      "grid eta, and an unsaturated uniform second-layer average (weight > 0)")
    else:
        notes["precision_formula"] = "given"
        auto_eta = smallest_eta(precision, gs, mu, T, mode, tol, offset) if precision.is_exact else None
        if precision.is_exact and not average_ok(precision, T, b, saturation=True):
            raise err(f"precision {precision.name}: the second layer's uniform weight round(1/{T}) is 0 or the readout "
                      f"constants are not representable (the step must be <= 1/{T}); {_hint(T, gs, mu, mode, tol, offset, b)}")
    if eta is None:
        if precision.is_exact:
            if auto_eta is None:
                raise err(f"precision {precision.name}: no representable eta makes the first layer's attention {mode} "
                          f"for T={T}, Gram scale {gs}, mu={mu}; {_hint(T, gs, mu, mode, tol, offset, b)}")
            eta = auto_eta
            notes["eta_formula"] = (f"smallest multiple of k*step with every worst-case row (all others at mu) "
                                    + ("exactly one-hot: e(-eta(1-mu)) rounds to 0" if mode == "one-hot"
                                       else f"within tolerance: (1 - target) + rest <= {tol}"))
        else:
            kc = 1.0
            eta = Fraction(math.ceil(paper_eta(n, kc) * 4), 4)
            notes["eta_formula"] = "ceil(4 (ln N + ln 2N)) / 4 (float format: the paper's scale with Kc = 1)"
    else:
        eta = Fraction(eta)
        if eta <= 0:
            raise err(f"eta must be > 0, got {eta}")
        notes["eta_formula"] = "given"
    return precision, eta, notes


def _default(check, err):
    try:
        return default_binary_precision(check)
    except EqualityError as e:
        raise err(str(e)) from None


def _hint(T, gs, mu, mode, tol, offset, b) -> str:
    try:
        fmt, eta = default_binary_precision(
            lambda f: smallest_eta(f, gs, mu, T, mode, tol, offset)
            if f.represents(Fraction(1, 2)) and average_ok(f, T, b, saturation=False) else None)
        return f"the smallest precision that works is {fmt.name} (eta = {eta})"
    except EqualityError:
        return "no binary format up to 40 fraction bits works"


def equality(
    n: int,
    positions: str | Any = "auto",
    eta: Fraction | int | str | None = None,
    precision: Format | str | None = None,
    max_inner: Fraction = Fraction(1, 4),
    seed: int = 0,
    complement: bool = False,
) -> CompiledModel:
    """Build Theorem 6's two-layer Equality transformer (answers EQ(x); INEQ with ``complement``).

    Parameters
    ----------
    n : even int in [2, 2^24]. Input length N (the two halves have N/2 symbols each).
    positions : a family for :func:`position_codes` ("auto", "reed-solomon", "random", "onehot") or a
        code object with at least N vectors.
    eta : the first layer's attention scale: None or "one-hot" (default: the smallest grid value for
        which every row is exactly one-hot), "threshold" (the smallest for which the partner keeps
        weight >= 1 - 1/2 + stray, enough for the XOR MLP), or a number (eta/k must be on the grid).
    precision : a Format or a format string; default the fewest-bit binary format satisfying the
        sufficient condition (one-hot first layer, unsaturated uniform average with weight > 0).
    max_inner, seed : passed to :func:`position_codes`.

    Returns a :class:`CompiledModel` on T = N tokens (token 0 is x = -1, token 1 is x = +1);
    answers [0, 1].
    """
    n = _check_n(n)
    code = _code_for(n, positions, Fraction(max_inner), seed)
    k = int(code.k)
    mu = _mu(code)
    precision, eta, notes = resolve_precision_and_eta(
        n, n, gram_scale(code), mu, eta, precision, XOR_TOLERANCE, KEY_OFFSET, 0, EqualityError)
    a, c, l0 = readout(precision, n, 0)
    model = _assemble(n, code, k, eta * gram_scale(code), c, l0, complement)
    model.precision = precision.name
    bits = int(getattr(precision, "bits", 64))
    kc = kc_equivalent(precision, n)
    fmt_ok = precision.is_exact
    gs = gram_scale(code)
    eta_oh = smallest_eta(precision, gs, mu, n, "one-hot", XOR_TOLERANCE, KEY_OFFSET) if fmt_ok else None
    eta_th = smallest_eta(precision, gs, mu, n, "threshold", XOR_TOLERANCE, KEY_OFFSET) if fmt_ok else None
    model.params = {
        "k": Param(k, f"position code dimension ({code.family})"),
        "mu": Param(mu, "proved (or certified) max off-diagonal <T(i),T(j)>"),
        "eta": Param(eta, notes["eta_formula"]),
        "eta_one_hot": Param(eta_oh, "smallest grid eta with every worst-case row exactly one-hot: e(-eta(1-mu)) = 0"),
        "eta_threshold": Param(eta_th, "smallest grid eta with (1 - target) + rest <= 1/2 in the worst-case row"),
        "Kc": Param(None if kc is None else round(kc, 6), "App. B.2 constant of the format: step = N^-Kc"),
        "eta_paper": Param(None if kc is None else round(paper_eta(n, kc), 6), "ln N + Kc ln(2N) (App. F.2)"),
        "uniform_weight": Param(a, "a = div(e(0), sat(N e(0))) under the format (= 1/N when unsaturated and on the grid)"),
        "readout_gain": Param(c, "c = largest power of two <= min(1/a, max)"),
        "readout": Param(f"logit_INEQ = {c} z, logit_EQ = {l0}", "c*z vs c*a/2: INEQ iff z >= a iff some pair differs (margin c*a/2)"),
        "d_model": Param(4 + 2 * k, "4 + 2k (paper: 2 + 2k; y and z get their own columns)"),
        "d_head": Param(k + 1, "k + 1 (layer 1: code plus the constant of [T, 1] / [T, -1/2])"),
        "d_mlp": Param(4, "4 ReLUs for the XOR step in layer 1 (layer 2's MLP is a zero 1-unit block)"),
        "layers": Param(2, "Thm 6"),
        "heads": Param(1, "one head per layer"),
        "precision": Param(precision.name, notes["precision_formula"]),
        "precision_bits": Param(bits, "bits of one number in the format (sign included)"),
        "size_bits": Param(model.size_bits(bits), "parameters (code rows generated, not stored) x precision_bits"),
        "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2N) / mu^2) (Lemma 2)"),
    }
    model.task_params = {"n": n, "answer": "INEQ" if complement else "EQ",
                         "code": code.describe() if hasattr(code, "describe") else {}}
    model.code = code  # type: ignore[attr-defined]
    if precision.is_exact:
        for name, t in model.tensors().items():
            t.raw(precision)  # raises IRError naming the weight if not representable
    return model


def inequality(n: int, **kwargs: Any) -> CompiledModel:
    """INEQ(x) = 1 - EQ(x) (the paper's formulation); same arguments as :func:`equality`."""
    if "complement" in kwargs:
        raise EqualityError("inequality() takes no 'complement' argument; use equality(n, complement=...)")
    return equality(n, complement=True, **kwargs)


# column layout
C_X, C_Y, C_M, C_Z, C_CODE = 0, 1, 2, 3, 4


def _assemble(n: int, code: Any, k: int, eta_gs: Fraction, c: int, l0: Fraction, ineq: bool) -> CompiledModel:
    """``eta_gs`` = eta * Gram scale (eta/k for +-1 codes): the W_Q entry."""
    eta = eta_gs / gram_scale(code)
    c_key, c_q = C_CODE, C_CODE + k
    d = 4 + 2 * k
    view = code_view(code)
    h = n // 2
    table = np.zeros((2, d), dtype=np.int64)
    table[0, C_X], table[1, C_X] = -1, 1
    embed = Embedding(2, d, ExactTensor(table, 1), 0, ())
    pos_embed = Embedding(n, d, ExactTensor(np.zeros((0, d), np.int64), 1), 0, (
        CodeBlock(view, 0, n, c_key, 0, Fraction(1)),
        CodeBlock(view, 0, h, c_q, 0, Fraction(1)),
        CodeBlock(view, h, h, c_q, 0, Fraction(1)),
    ))

    # ---- layer 1 --------------------------------------------------------------------------------
    dh = k + 1
    t = np.arange(k)
    scale = eta_gs
    W_Q = np.zeros((1, d, dh), np.int64)
    W_Q[0, c_q + t, t] = scale.numerator
    b_Q = [[Fraction(0)] * k + [eta]]
    W_K = np.zeros((1, d, dh), np.int64)
    W_K[0, c_key + t, t] = 1
    b_K = [[Fraction(0)] * k + [KEY_OFFSET]]
    W_V = np.zeros((1, d, dh), np.int64)
    W_V[0, C_X, 0] = 1
    W_O = np.zeros((1, dh, d), np.int64)
    W_O[0, 0, C_Y] = 1
    attn1 = Attention(ExactTensor(W_Q, scale.denominator), ExactTensor(W_K), ExactTensor(W_V), ExactTensor(W_O),
                      ExactTensor.from_values(b_Q), ExactTensor.from_values(b_K),
                      ExactTensor(np.zeros((1, dh), np.int64)), ExactTensor(np.zeros(d, np.int64)))
    # m = 2 relu(d - 1/2) - 2 relu(d - 1) + 2 relu(-d - 1/2) - 2 relu(-d - 1),  d = x - y
    W_in = np.zeros((d, 4), np.int64)
    W_in[C_X] = [1, 1, -1, -1]
    W_in[C_Y] = [-1, -1, 1, 1]
    b_in = np.array([-1, -2, -1, -2], np.int64)  # halves
    W_out = np.zeros((4, d), np.int64)
    W_out[:, C_M] = [2, -2, 2, -2]
    mlp1 = MLP(ExactTensor(W_in), ExactTensor(b_in, 2), ExactTensor(W_out), ExactTensor(np.zeros(d, np.int64)))

    # ---- layer 2: uniform average of m ----------------------------------------------------------
    z1 = ExactTensor(np.zeros((1, d, 1), np.int64))
    W_V2 = np.zeros((1, d, 1), np.int64)
    W_V2[0, C_M, 0] = 1
    W_O2 = np.zeros((1, 1, d), np.int64)
    W_O2[0, 0, C_Z] = 1
    zh = ExactTensor(np.zeros((1, 1), np.int64))
    attn2 = Attention(z1, z1, ExactTensor(W_V2), ExactTensor(W_O2), zh, zh, zh, ExactTensor(np.zeros(d, np.int64)))
    mlp2 = MLP(ExactTensor(np.zeros((d, 1), np.int64)), ExactTensor(np.zeros(1, np.int64)),
               ExactTensor(np.zeros((1, d), np.int64)), ExactTensor(np.zeros(d, np.int64)))

    # ---- readout: answers [0, 1] ----------------------------------------------------------------
    W_U = np.zeros((d, 2), np.int64)
    yes = 1 if ineq else 0  # the logit that reads c z
    W_U[C_Z, yes] = c
    b_U = [Fraction(0), Fraction(0)]
    b_U[1 - yes] = l0
    model = CompiledModel(
        construction="inequality" if ineq else "equality",
        theorem=THEOREM,
        n=n,
        embed=embed,
        pos_embed=pos_embed,
        blocks=[Block(attn1, mlp1), Block(attn2, mlp2)],
        W_U=ExactTensor(W_U),
        b_U=ExactTensor.from_values(b_U),
        vocab=["-1", "+1"],
        answers=[0, 1],
    )
    check_shapes(model)
    return model


# ------------------------------------------------------------------------------------------------
# the task interface used by CompiledModel.encode
# ------------------------------------------------------------------------------------------------


#: How a natural input x becomes token ids, declared for exports' manifest.json (schema in
#: docs/exports.md): one token per x_i, named "-1" or "+1". Must agree with :func:`encode`.
ENCODING = {
    "inputs": [{"name": "x", "type": "N ints in {-1, 1}"}],
    "tokens": [{"for_each": "x", "token": "{:+d}"}],
}


def encode(model: CompiledModel, example: Sequence[int]) -> np.ndarray:
    """x in {-1, 1}^N (a list of ints) -> token ids [N] (token (x + 1) / 2)."""
    return encode_arrays(model, sequence_rows([example]))[0]


def encode_batch(model: CompiledModel, examples: Sequence[Sequence[int]]) -> np.ndarray:
    """A batch of natural inputs -> token ids [B, T]."""
    return encode_arrays(model, sequence_rows(examples))


def encode_arrays(model: CompiledModel, x: np.ndarray) -> np.ndarray:
    """Vectorised encoding: x [B, N] with entries in {-1, 1} -> ids [B, N]."""
    n = model.n
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != n:
        raise EqualityError(f"x must have length n = {n} (shape [B, {n}]), got shape {x.shape}")
    if x.size and not np.all((x == 1) | (x == -1)):
        raise EqualityError("x must have entries in {-1, 1}")
    return ((x.astype(np.int64) + 1) // 2).astype(np.int64)


def rebuild_kwargs(model: CompiledModel) -> dict[str, Any]:
    """Keyword arguments that rebuild ``model``'s function with the same position code (pass them
    with ``precision=...`` to the builder named by ``model.construction``, e.g. for a precision
    search)."""
    return {"positions": model.code}
