"""Nearest neighbour in two layers (Theorem 7, App. G.2 of Bhattamishra et al. 2024).

Task NSTNB (P1 Sec. 5.2): for vectors x_1 .. x_N in R^{d'} and labels y_1 .. y_{N-1}, the prefix
(x_1, y_1, .., x_{K-1}, y_{K-1}, x_K) asks for y_{j*}, j* = argmax_{i < K} <x_K, x_i>, for every
K > N/2. Precondition (P1 Sec. 5.2's assumptions, stated on the grid values the model reads): every ||x_i||^2 <= 1 and
<x_K, x_{j*}> >= <x_K, x_i> + margin for every other i < K. Inputs that violate it are refused
(:class:`NearestNeighborError` naming the input and the condition), never counted as model errors.

Tokens, 0-based: x_i at position 2i - 2 (token "x", its vector in the vector-input columns), y_i at
2i - 1 (token "y{v}"); T = 2N - 1. ``queries="all"``: one causal sequence answered at every
position 2K - 2 with K > N/2; ``queries="last"``: the single-prefix form, answered at K = N only
(with causal attention the answer at 2K - 2 is the prefix's, so the two agree position by position).

Construction (reconstructed in docs/nearest-neighbor.md; ``addr(t)`` is the label position of t's
pair, C1 the self-exclusion code, C2 the address code, sigma the +-1 numerators)::

    slots: X (d') | Y (m) | FL | P1 (k1) | P2 (k2) | A (k2) | R (k2) | S (k2) | Z (m) | B (m)
    token x: X = x (vector input);   token y_v: Y = bits(v), FL = 1
    position t: P1 = sigma1(t), P2 = sigma2(t), A = sigma2(addr(t))
    layer 0: RetrieveNearest: logit = eta1 <x_L, x_t> - eta1 c_self <C1(L), C1(t)> - eta1 c_label FL_t,
             value 2 A -> R (causal);  SignClip: S = clip(R, -1, 1) = sigma2(addr(j*))
             (a 0/1 one-hot C2 at small N: value A, BitThreshold)
    layer 1: RetrieveByAddress(query S, key P2, value Y -> Z), scale eta2 (causal);  BitThreshold: B
    readout: SymbolReadout(B)

``variant="paper"``: one code C for self-exclusion and addresses (P1 = P2), the paper's constants
c_self = c_label = 6 and code accuracy gamma/100; ``"two-code"`` (default): a fine code C1 only for
self-exclusion (mu1 <= gamma / (2 c_self)) and the coarse Index-Lookup code (mu2 <= 1/4) for the
addresses. Every constant is derived (:func:`design`) and recorded with its formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.theorems import nearest_neighbor_inputs as inputs
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.content import (RetrieveByAddress, RetrieveNearest, SignClip, row_from_levels,
                                                      nearest_bounds)
from exactformer.constructions.blocks.mlp import BitThreshold
from exactformer.constructions.blocks.readout import SymbolReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.core.ir import CompiledModel, ExactTensor, Inputs, Param, VectorInput
from exactformer.constructions.codes.positions import OneHotCode, ReedSolomonCode
from exactformer.constructions.design.precision_search import fewest_bits, smallest_grid_eta, smallest_works
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.spec import NearestLabel
from exactformer.constructions.core.task import Batch, Domains, Task, TaskError
from exactformer.precision import Format, parse_format
from exactformer.precision.boxes import FixedArithmetic

THEOREM = "Thm 7 (App. G.2), Bhattamishra et al. 2024"
VARIANTS = ("two-code", "paper")
QUERIES = ("last", "all")
MAX_N = 1 << 20
TARGET, REST = Fraction(3, 4), Fraction(1, 4)  # rounded attention rows: target >= 3/4, rest <= 1/4


class NearestNeighborError(TaskError):
    """Bad parameters for :func:`nearest_neighbor` or an input the task refuses (the message names
    the parameter or the input and the violated condition)."""


@dataclass(frozen=True)
class MarginPrecondition:
    """What the task assumes of its input vectors (checked exactly on grid values)."""

    margin: Fraction
    max_norm_sq: Fraction
    d_in: int


# ------------------------------------------------------------------------------------------------
# design: codes, constants, precision
# ------------------------------------------------------------------------------------------------


def smallest_code(n: int, mu: Fraction) -> Any:
    """The narrower of the Reed--Solomon∘Hadamard code and the one-hot code for n positions with
    every off-diagonal inner product in [0, mu] (both proved; one-hot has cross products 0)."""
    onehot = OneHotCode(n, mu)
    try:
        rs = ReedSolomonCode.for_max_inner(n, mu)
    except Exception:  # no RS code reaches n at this mu
        return onehot
    return rs if rs.k < onehot.k else onehot


def code_range(code: Any) -> tuple[int, int, int]:
    """(least, largest off-diagonal, diagonal) integer inner product of the code's numerators."""
    self_ip = 1 if code.family == "onehot" else int(code.k)
    bound = code.bound if code.bound is not None else (code.certificate or code.certify()).max_inner
    hi = int(Fraction(bound) * self_ip)
    lo = 0 if code.family in ("reed-solomon", "onehot") else -hi
    return lo, hi, self_ip


def _grid_up(fmt: Format, v: Fraction) -> Fraction:
    """The smallest grid value >= v."""
    return Fraction(math.ceil(v / fmt.step)) * fmt.step


@dataclass
class Design:
    """Every constant of the construction with the formula that produced it (see :func:`design`)."""

    n: int
    d_in: int
    margin: Fraction
    variant: str
    labels: int
    code1: Any
    code2: Any
    c_self_min: Fraction
    c_label_min: Fraction
    mu1_target: Fraction
    fmt: Format | None = None
    eta1: Fraction | None = None
    eta2: Fraction | None = None
    code_weight: Fraction | None = None  # the W_Q entry of the code dims (eta1 c_self / k1 on the grid)
    label_bias: Fraction | None = None  # |b_Q| of the flag dim (eta1 c_label on the grid)
    formulas: dict[str, str] = field(default_factory=dict)

    @property
    def m(self) -> int:
        return max(1, (self.labels - 1).bit_length())

    @property
    def c_self(self) -> Fraction:
        return self.code_weight / (self.eta1 * Fraction(self.code1.gram_scale))

    @property
    def c_label(self) -> Fraction:
        return self.label_bias / self.eta1

    @property
    def tau(self) -> Fraction:
        """The margin left after the code: gamma - c_self mu1 (RS / one-hot: cross products >= 0)."""
        lo, hi, s = code_range(self.code1)
        return self.margin - self.c_self_min * Fraction(hi - lo, s)

    def widths(self) -> dict[str, int]:
        d, m, k1, k2 = self.d_in, self.m, int(self.code1.k), int(self.code2.k)
        if self.variant == "paper":
            return {"X": d, "Y": m, "FL": 1, "P": k1, "A": k1, "R": k1, "S": k1, "Z": m, "B": m}
        return {"X": d, "Y": m, "FL": 1, "P1": k1, "P2": k2, "A": k2, "R": k2, "S": k2, "Z": m, "B": m}

    @property
    def d_model(self) -> int:
        return sum(self.widths().values())

    @property
    def d_head(self) -> int:
        return max(self.d_in + int(self.code1.k) + 1, int(self.code2.k))


def paper_constants(n: int, margin: Fraction) -> dict[str, Any]:
    """The paper's values (reconstructed, docs/nearest-neighbor.md): c1 = c2 = 6, code accuracy
    eps = gamma/100, tau = 4 gamma/5, eta = (5/(4 gamma)) ln(18N) (weight 9/10 on the target)."""
    g = float(margin)
    return {"c_self": 6, "c_label": 6, "eps": Fraction(margin) / 100, "tau": 0.8 * g,
            "eta": 5 / (4 * g) * math.log(18 * n), "heads": 2}


def layer1_holds(fmt: Format, eta1: Fraction, dz: "Design") -> tuple[Fraction, Fraction] | None:
    """The first layer's sufficient condition (the bound the certificate evaluates, with the code's
    proved range in place of its exact inner products): (code weight, label bias) on the grid when
    the worst row of the longest prefix puts >= 3/4 on the nearest candidate and <= 1/4 elsewhere."""
    gram = Fraction(dz.code1.gram_scale)
    w_c, b = _grid_up(fmt, eta1 * dz.c_self_min * gram), _grid_up(fmt, eta1 * dz.c_label_min)
    lo, hi, s = code_range(dz.code1)
    tops = {"candidates": -w_c * lo, "self": -w_c * s, "other": -w_c * lo - b}
    upper, span = nearest_bounds(fmt.step, eta1, dz.margin, Fraction(1), dz.d_in, -w_c * hi, tops, w_c * s + b)
    if span > Fraction(fmt.max_value) or not all(fmt.represents(v) for v in (eta1, w_c, b)):
        return None
    raw = [math.floor(upper[k] / fmt.step) for k in ("candidates", "self", "other")]
    if any(U >= 0 for U in raw):
        return None
    arith = FixedArithmetic(fmt)
    w_t, w_l, cnt = row_from_levels(arith, raw, [max(dz.n - 2, 0), 1, dz.n - 1])
    target = Fraction(arith.to_fraction(np.asarray(w_t.lo)[0]))
    rest = sum(Fraction(arith.to_fraction(np.asarray(w_l.hi)[0, i])) * int(c) for i, c in enumerate(cnt[0]))
    return (w_c, b) if target >= TARGET and rest <= REST else None


def layer2_holds(fmt: Format, eta2: Fraction, code: Any, n_keys: int) -> bool:
    """The second layer's sufficient condition (Index Lookup's): the worst row of ``n_keys`` keys, all
    at the code's bound, puts >= 3/4 on the target and <= 1/4 elsewhere."""
    lo, hi, s = code_range(code)
    target, rest = RetrieveByPosition.worst_case(FixedArithmetic(fmt), eta2, Fraction(hi, s), n_keys)
    return target >= TARGET and rest <= REST and fmt.represents(eta2 * Fraction(code.gram_scale))


def design(n: int, d_in: int, margin: Fraction, variant: str, labels: int, c_self: Fraction | None,
           c_label: Fraction | None, precision: Format | None, input_frac_bits: int,
           eta1: Fraction | None = None, eta2: Fraction | None = None, search: bool = True) -> Design:
    """The codes, constants and (with ``search``) the format, eta1 and eta2 (see the module docstring).

    c_self = c_label = 2 + gamma (two-code; "paper": 6 and 6) with the code bound
    mu1 <= gamma / (2 c_self) ("paper": gamma/100) leave the nearest candidate tau = gamma - c_self mu1
    >= gamma / 2 ahead of every other candidate, and the query's own key and the labels at least
    c_self (1 - mu1) - 2 = tau and c_label - 1 - c_self mu1 >= tau behind it (real arithmetic);
    the fixed-point condition is :func:`layer1_holds`. (The paper's tau = 4 gamma / 5 costs
    four times the code width for a 2.5-fold smaller eta1 reserve; docs/nearest-neighbor.md.)"""
    g = Fraction(margin)
    if variant == "paper":
        c1 = Fraction(6) if c_self is None else Fraction(c_self)
        c2 = Fraction(6) if c_label is None else Fraction(c_label)
        mu1 = g / 100
    else:
        c1 = 2 + g if c_self is None else Fraction(c_self)
        c2 = 2 + g if c_label is None else Fraction(c_label)
        mu1 = g / (2 * c1)
    code1 = smallest_code(2 * n, mu1)
    code2 = code1 if variant == "paper" else smallest_code(2 * n, Fraction(1, 4))
    dz = Design(n, d_in, g, variant, labels, code1, code2, c1, c2, mu1)
    dz.formulas = {
        "c_self": "given" if c_self is not None else ("6 (the paper's c1)" if variant == "paper" else "2 + margin, raised to the grid"),
        "c_label": "given" if c_label is not None else ("6 (the paper's c2)" if variant == "paper" else "2 + margin, raised to the grid"),
        "mu1": "margin / 100 (the paper's eps)" if variant == "paper" else "margin / (2 c_self): tau >= margin / 2",
    }
    if not search:
        return dz
    n_keys = 2 * n - 1

    def eta1_of(fmt: Format) -> Fraction | None:
        if eta1 is not None:
            return Fraction(eta1) if layer1_holds(fmt, Fraction(eta1), dz) else None
        top = Fraction(fmt.max_value) / (2 + dz.c_self_min + dz.c_label_min)  # |logits| <= eta1 (1 + c_self + c_label) + E1
        return smallest_grid_eta(fmt, fmt.step, lambda e: layer1_holds(fmt, e, dz) is not None, top)

    def eta2_of(fmt: Format) -> Fraction | None:
        if eta2 is not None:
            return Fraction(eta2) if layer2_holds(fmt, Fraction(eta2), code2, n_keys) else None
        unit = fmt.step / Fraction(code2.gram_scale)
        return smallest_grid_eta(fmt, unit, lambda e: layer2_holds(fmt, e, code2, n_keys))

    def check(fmt: Format) -> tuple[Fraction, Fraction] | None:
        if not fmt.represents(Fraction(2 * dz.m)) or not fmt.represents(g):
            return None
        e1 = eta1_of(fmt)
        e2 = eta2_of(fmt) if e1 is not None else None
        return None if e2 is None else (e1, e2)

    if precision is None:
        fmt, (e1, e2) = fewest_bits(check, max_bits=48, err=NearestNeighborError, min_frac=input_frac_bits)
        dz.formulas["precision"] = (f"fewest-bit binary format with >= {input_frac_bits} fraction bits (the input grid) "
                                    "for which both layers' sufficient conditions hold for some grid eta")
    else:
        fmt = precision
        found = check(fmt)
        if found is None:
            raise NearestNeighborError(f"precision {fmt.name}: no representable eta1, eta2 satisfy the sufficient "
                                       f"conditions for n={n}, margin={g}; "
                                       + smallest_works(check, NearestNeighborError, min_frac=input_frac_bits))
        e1, e2 = found
        dz.formulas["precision"] = "given"
    dz.fmt, dz.eta1, dz.eta2 = fmt, e1, e2
    dz.code_weight, dz.label_bias = layer1_holds(fmt, e1, dz)
    dz.formulas["eta1"] = "given" if eta1 is not None else (
        "smallest grid value whose worst row (every other candidate exactly margin behind, codes at their bounds, "
        "the query's own key and N - 1 labels at their largest) puts >= 3/4 on the nearest candidate, <= 1/4 elsewhere")
    dz.formulas["eta2"] = "given" if eta2 is not None else (
        "smallest multiple of step/gram2 whose worst row of 2N - 1 keys (all at mu2) is >= 3/4 / <= 1/4")
    return dz


# ------------------------------------------------------------------------------------------------
# the task
# ------------------------------------------------------------------------------------------------


@dataclass
class VectorBatch(Batch):
    """A batch whose first array holds raw grid values over ``scale``: its natural inputs
    (:meth:`example`, e.g. a counterexample) write the vectors as exact fractions ("3/8")."""

    scale: int = 1

    def example(self, i: int) -> Any:
        X, Y = self.arrays
        return [[str(Fraction(int(v), self.scale)) for v in row] for row in X[i]], Y[i].tolist()

    def take(self, idx: np.ndarray) -> "VectorBatch":
        return VectorBatch(tuple(a[idx] for a in self.arrays), self.tokens[idx], self.truth[idx], self.kind,
                           scale=self.scale)


def label_positions(T: int) -> np.ndarray:
    """label_of[t]: the label position of t's pair (t | 1), for every position."""
    return np.arange(T, dtype=np.int64) | 1


class NearestNeighborTask(Task):
    """NSTNB on grid vectors (module docstring). Natural input ``(vectors, labels)``: N vectors of
    d' numbers (ints, Fractions, decimal strings or floats, rounded to the model's grid the way the
    format rounds) and N - 1 labels. Arrays: raw grid values X [B, N, d'] (int64, over the format's
    scale) and labels Y [B, N - 1]. Truths [B, A]: the label of each answered query's nearest
    candidate; the precondition is checked on the grid values and violations refused."""

    ENCODING = {
        "inputs": [{"name": "vectors", "type": "N vectors of d_in grid values (norms^2 <= 1)"},
                   {"name": "labels", "type": "N-1 ints in [0, labels)"}],
        "tokens": [{"interleave": ["vectors", "labels"], "token": ["x", "y{}"]}],
        "vectors": "x_i (grid values) is added to the vector_input columns of hook_embed at position 2i-2",
    }

    def length(self, model: CompiledModel) -> int:
        return 2 * model.n - 1

    @staticmethod
    def labels(model: CompiledModel) -> int:
        return int(model.task_params["labels"])

    @staticmethod
    def queries(model: CompiledModel) -> tuple[int, ...]:
        """The positions of the answered queries (the task parameter ``queries``: last or all)."""
        return answer_positions(model.n, model.task_params.get("queries", "last"))

    def precondition(self, model: CompiledModel) -> MarginPrecondition:
        tp = model.task_params
        return MarginPrecondition(Fraction(tp["margin"]), Fraction(tp.get("max_norm_sq", "1")), int(tp["d_in"]))

    def domains(self, model: CompiledModel) -> Domains:
        T, L = self.length(model), self.labels(model)
        return Domains([np.array([0]), np.arange(1, 1 + L)], np.arange(T) % 2, self.precondition(model))

    def spec(self, model: CompiledModel) -> NearestLabel:
        T = self.length(model)
        pre = self.precondition(model)
        cands = {q: np.arange(0, q, 2, dtype=np.int64) for q in self.queries(model)}
        answer_of = np.r_[-1, np.arange(self.labels(model))]
        return NearestLabel("nearest", cands, label_positions(T), answer_of, tuple(range(self.labels(model))), pre.margin,
                            pre.max_norm_sq)

    def scale(self, model: CompiledModel) -> int:
        return int(parse_format(model.precision).scale)

    # ---- truth ----------------------------------------------------------------------------------
    def check(self, model: CompiledModel, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        """The nearest candidate j* (0-based pair index) of each answered query [B, A]; raises
        NearestNeighborError naming the first input that violates the precondition."""
        X, Y = np.asarray(X), np.asarray(Y)
        n, pre, S = model.n, self.precondition(model), self.scale(model)
        B = X.shape[0]
        Xo = X.astype(object) if int(np.abs(X).max(initial=0)) ** 2 * max(pre.d_in, 1) >= 1 << 62 else X.astype(np.int64)
        norms = np.einsum("bnd,bnd->bn", Xo, Xo)
        bad = np.argwhere(norms * pre.max_norm_sq.denominator > pre.max_norm_sq.numerator * S * S)
        if bad.size:
            b, i = bad[0]
            raise NearestNeighborError(f"input {int(b)}: ||x_{int(i) + 1}||^2 = {Fraction(int(norms[b, i]), S * S)} "
                                       f"exceeds {pre.max_norm_sq} (the precondition)")
        qs = [p // 2 for p in self.queries(model)]  # 0-based pair index of each query
        jstar = np.empty((B, len(qs)), dtype=np.int64)
        rows = np.arange(B)
        for a, K in enumerate(qs):
            ip = np.einsum("bnd,bd->bn", Xo[:, :K], Xo[:, K])
            best = np.argmax(ip, axis=1)
            if K > 1:
                gap = ip[rows, best] - np.where(np.arange(K)[None, :] == best[:, None], ip.min(axis=1)[:, None] - 1, ip).max(axis=1)
                short = np.flatnonzero(np.asarray(gap * pre.margin.denominator < pre.margin.numerator * S * S, dtype=bool))
                if short.size:
                    b = int(short[0])
                    raise NearestNeighborError(
                        f"input {b}: query x_{K + 1}: the nearest candidate x_{int(best[b]) + 1} leads by "
                        f"{Fraction(int(gap[b]), S * S)} < margin {pre.margin} (the precondition)")
            jstar[:, a] = best
        return jstar

    def truth(self, model: CompiledModel, X: np.ndarray, Y: np.ndarray) -> np.ndarray:
        j = self.check(model, X, Y)
        return np.take_along_axis(np.asarray(Y), j, axis=1)

    # ---- encoding -------------------------------------------------------------------------------
    def encode_arrays(self, model: CompiledModel, X: np.ndarray, Y: np.ndarray) -> Inputs:
        X, Y = np.asarray(X), np.asarray(Y)
        n, L = model.n, self.labels(model)
        d = int(model.task_params["d_in"])
        if X.ndim != 3 or X.shape[1:] != (n, d) or (X.size and not np.issubdtype(X.dtype, np.integer)):
            raise NearestNeighborError(f"vectors must be raw grid values of shape [B, {n}, {d}], got {X.shape} {X.dtype}")
        if Y.shape != (X.shape[0], n - 1) or (Y.size and (not np.issubdtype(Y.dtype, np.integer) or Y.min() < 0 or Y.max() >= L)):
            raise NearestNeighborError(f"labels must be ints in [0, {L}) of shape [B, {n - 1}]")
        B, T = X.shape[0], 2 * n - 1
        tokens = np.zeros((B, T), dtype=np.int64)
        tokens[:, 1::2] = 1 + Y
        vec = np.zeros((B, T, d), dtype=np.int64)
        vec[:, 0::2] = X
        return Inputs(tokens, ExactTensor(vec, self.scale(model)))

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        fmt = parse_format(model.precision)
        n, d = model.n, int(model.task_params["d_in"])
        Xs, Ys = [], []
        for e in examples:
            if not (isinstance(e, (tuple, list)) and len(e) == 2):
                raise NearestNeighborError("an input is (vectors, labels): N vectors of d_in numbers and N-1 labels")
            vs, ls = e
            if len(vs) != n or any(len(v) != d for v in vs):
                raise NearestNeighborError(f"vectors must be {n} vectors of {d} numbers")
            if len(ls) != n - 1 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in ls):
                raise NearestNeighborError(f"labels must be {n - 1} integers in [0, {self.labels(model)})")
            try:
                vals = np.array([[Fraction(x) if not isinstance(x, float) else Fraction(x) for x in v] for v in vs], dtype=object)
            except (TypeError, ValueError) as err:
                raise NearestNeighborError(f"vectors must hold numbers: {err}") from None
            Xs.append(np.asarray(fmt.quantize(vals.reshape(-1)), dtype=np.int64).reshape(n, d))
            Ys.append(list(ls))
        return np.asarray(Xs, dtype=np.int64).reshape(len(Xs), n, d), np.asarray(Ys, dtype=np.int64).reshape(len(Ys), n - 1)

    def batch(self, model: CompiledModel, *arrays: np.ndarray, kind: str = "") -> Batch:
        return VectorBatch(tuple(arrays), self.encode_arrays(model, *arrays), self.truth(model, *arrays), kind,
                           scale=self.scale(model))

    # ---- inputs ---------------------------------------------------------------------------------
    def count(self, model: CompiledModel) -> int:
        """The size of the finite family (:func:`nearest_neighbor_inputs.family`, n <= 4), else
        2^64: inputs are grid vectors, too many to enumerate (sample or certify instead)."""
        return inputs.family_count(self, model)

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        yield from inputs.family(self, model, batch)

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        yield from inputs.sample(self, model, count, seed, batch)

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        yield from inputs.adversarial(self, model, count, seed, batch)


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


def check_int(name: str, v: Any, lo: int, hi: int, even: bool = False, err: type = NearestNeighborError) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi or (even and v % 2):
        rng = f"an even integer in [{lo}, {hi}]" if even else f"an integer in [{lo}, {hi}]"
        raise err(f"{name} must be {rng}, got {v!r}")
    return int(v)


def check_fraction(name: str, v: Any, lo: Fraction, hi: Fraction, err: type = NearestNeighborError) -> Fraction:
    try:
        f = Fraction(v) if not isinstance(v, float) else Fraction(v).limit_denominator(1 << 30)
    except (TypeError, ValueError):
        raise err(f"{name} must be a number in ({lo}, {hi}], got {v!r}") from None
    if not lo < f <= hi:
        raise err(f"{name} must lie in ({lo}, {hi}], got {v!r}")
    return f


def answer_positions(n: int, queries: str) -> tuple[int, ...]:
    """0-based positions 2K - 2 of the answered queries x_K (K > N/2, or K = N)."""
    return (2 * n - 2,) if queries == "last" else tuple(range(n, 2 * n - 1, 2))


def address_tail(mb: ModelBuilder, query: str, key: str, values: str, eta2: Fraction, gram2: Fraction, labels: int) -> None:
    """Layer 1 and the readout shared with MQAR: retrieve the label at the address the first layer
    wrote (``query`` holds sigma2(addr(j*))), threshold its bits, read the symbol."""
    RetrieveByAddress(query, key, (values,), ("Z",), eta2, gram2).emit(mb, 1)
    BitThreshold("Z", "B").emit(mb, 1)
    SymbolReadout("B", labels).emit(mb)


def address_codes(mb: ModelBuilder, code2: Any, T: int, key: str) -> None:
    """Positional codes of the address path: ``key`` = sigma2(t), A = sigma2(t + 1): at an input
    position t (even) the address of its pair's label t + 1 (the paper's addr(t)); at a label
    position the next vector, never a target. Both are runs of the generator (no index table), so
    a certificate can hold a candidate's address by its code (docs/positions.md)."""
    mb.position_code(key, 0, T, code2)
    mb.position_code("A", 0, T, code2, code_start=1)


def value_scale(code2: Any) -> int:
    """The first layer's value scale: 2 for a +-1 address code (R within [1, 2] of the sign),
    1 for the 0/1 one-hot code (R within 1/4 of it)."""
    return 1 if code2.family == "onehot" else 2


def address_mlp(mb: ModelBuilder, code2: Any) -> None:
    """R -> S = the address code exactly: clip(R, -1, 1) for +-1 codes, the 1/2-threshold for 0/1 codes."""
    (BitThreshold if code2.family == "onehot" else SignClip)("R", "S").emit(mb, 0)


@construction("nearest-neighbor", task=NearestNeighborTask, theorem=THEOREM,
              claim=Claim("P1 Thm 7 (Sec. 5.2, App. G.2)", "2", "2", "O(log N); Theta(log N / margin^2) as built",
                          "O(log N)", "O((log N)^3) total (Sec. 5, App. A (2)) for constant margin only",
                          "the margin gamma >= N^-c allowed by Sec. 5.2's assumptions makes the width N^Theta(c)"),
              # the last query only: Thm 8 (every query answered) does not apply; INDEX does (lower_bounds)
              sizes=SizeRows("nearest-neighbor", bounds=("rnn-nearest-neighbor-last",),
                             note="d' = 16, margin 1/4, two-code variant, the last query answered"),
              small=dict(n=2))
def nearest_neighbor(
    n: int,
    d_in: int = 16,
    margin: Fraction = Fraction(1, 4),
    variant: str = "two-code",
    labels: int = 2,
    queries: str = "last",
    c_self: Fraction | None = None,
    c_label: Fraction | None = None,
    eta1: Fraction | None = None,
    eta2: Fraction | None = None,
    precision: Format | str | None = None,
    input_frac_bits: int = 8,
) -> CompiledModel:
    """Theorem 7's two-layer nearest-neighbour transformer (App. G.2, reconstructed).

    Parameters
    ----------
    n : int in [2, 2^20], even. N, the number of input vectors (2N - 1 tokens).
    d_in : int in [1, 1024]. d', the dimension of the input vectors.
    margin : number in (0, 2]. gamma: the nearest candidate's inner product with the query exceeds
        every other's by at least this (the task's precondition).
    variant : two-code | paper. two-code: a fine self-exclusion code and the Index-Lookup address
        code; paper: one code, the paper's c_self = c_label = 6 and code accuracy margin/100.
    labels : int in [2, 2^16]. The label alphabet.
    queries : last | all. last: answer the query x_N only (the single-prefix form); all: one causal
        sequence answered at every x_K with K > N/2.
    c_self : number in (0, 64]. Self-exclusion constant (default 2 + margin; paper: 6).
    c_label : number in (0, 64]. Label-exclusion constant (default 2 + margin; paper: 6).
    eta1 : first-layer scale > 0 on the grid. Default: the smallest that satisfies the sufficient
        condition in the chosen precision.
    eta2 : second-layer scale > 0 (eta2/k2 on the grid). Default: the smallest that satisfies it.
    precision : a fixed-point format: binary:int=I,frac=F | paper:n=N,kc=K. Default: the binary
        format with the fewest bits (and at least input_frac_bits fraction bits) that works.
    input_frac_bits : int in [1, 30]. The input grid: the default precision has at least this many
        fraction bits (input vectors are grid values of the model's format).

    Returns a model on T = 2N - 1 tokens (x_1, y_1, .., x_N) whose inputs are
    :class:`~exactformer.constructions.core.ir.Inputs` (token ids and the exact vectors).
    """
    n = check_int("n", n, 2, MAX_N, even=True)
    d = check_int("d_in", d_in, 1, 1024)
    g = check_fraction("margin", margin, Fraction(0), Fraction(2))
    L = check_int("labels", labels, 2, 1 << 16)
    ifb = check_int("input_frac_bits", input_frac_bits, 1, 30)
    if variant not in VARIANTS:
        raise NearestNeighborError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if queries not in QUERIES:
        raise NearestNeighborError(f"queries must be one of {', '.join(QUERIES)}, got {queries!r}")
    c1 = None if c_self is None else check_fraction("c_self", c_self, Fraction(0), Fraction(64))
    c2 = None if c_label is None else check_fraction("c_label", c_label, Fraction(0), Fraction(64))
    e1 = None if eta1 is None else check_fraction("eta1", eta1, Fraction(0), Fraction(1 << 30))
    e2 = None if eta2 is None else check_fraction("eta2", eta2, Fraction(0), Fraction(1 << 30))
    fmt = parse_format(precision) if isinstance(precision, str) else precision
    if fmt is not None and not fmt.is_exact:
        raise NearestNeighborError(f"precision must be a fixed-point format (binary:... or paper:...), got {fmt.name}")
    dz = design(n, d, g, variant, L, c1, c2, fmt, ifb, e1, e2)
    return build(dz, queries)


def build(dz: Design, queries: str) -> CompiledModel:
    """The model of a searched :class:`Design`."""
    n, d, T = dz.n, dz.d_in, 2 * dz.n - 1
    lay = Layout()
    for name, width in dz.widths().items():
        lay.add(name, width)
    key = "P" if dz.variant == "paper" else "P2"
    code_slot = "P" if dz.variant == "paper" else "P1"
    mb = ModelBuilder(lay, n_layers=2, d_vocab=1 + dz.labels, n_ctx=T)
    bits = np.array([[(v >> j) & 1 for j in range(dz.m)] for v in range(dz.labels)], dtype=np.int64)
    mb.token_rows(range(1, 1 + dz.labels), "Y", bits)
    mb.token_rows(range(1, 1 + dz.labels), "FL", np.ones((dz.labels, 1), dtype=np.int64))
    if dz.variant != "paper":
        mb.position_code(code_slot, 0, T, dz.code1)
    address_codes(mb, dz.code2, T, key)
    RetrieveNearest("X", code_slot, "FL", "A", "R", dz.eta1, dz.c_self, dz.c_label, Fraction(dz.code1.gram_scale),
                    value_scale(dz.code2)).emit(mb, 0)
    address_mlp(mb, dz.code2)
    address_tail(mb, "S", key, "Y", dz.eta2, Fraction(dz.code2.gram_scale), dz.labels)
    pc = paper_constants(n, dz.margin)
    lo, hi, s = code_range(dz.code1)
    model = mb.build(
        answers=list(range(dz.labels)), vocab=["x"] + [f"y{v}" for v in range(dz.labels)],
        construction="nearest-neighbor", theorem=THEOREM, n=n, precision=dz.fmt.name,
        answer_positions=answer_positions(n, queries), vector_input=VectorInput((0,), int(lay["X"][0]), d),
        task_params={"n": n, "d_in": d, "margin": str(dz.margin), "labels": dz.labels, "queries": queries,
                     "variant": dz.variant, "max_norm_sq": "1"},
        params=design_params(dz, pc, lo, hi, s))
    return model


def design_params(dz: Design, pc: dict, lo: int, hi: int, s: int) -> dict[str, Param]:
    """The recorded constants (value, formula), the paper's beside them."""
    k1, k2 = int(dz.code1.k), int(dz.code2.k)
    mu1, mu2 = Fraction(hi, s), Fraction(code_range(dz.code2)[1], code_range(dz.code2)[2])
    return {
        "margin": Param(dz.margin, "gamma: the task's margin precondition"),
        "k": Param(k1, f"k1: self-exclusion code width ({dz.code1.family}, 2N positions)"),
        "k2": Param(k2, f"address code width ({dz.code2.family}, 2N positions)"),
        "mu1": Param(mu1, "proved largest off-diagonal <C1(i), C1(j)>; target " + dz.formulas["mu1"]),
        "mu2": Param(mu2, "proved largest off-diagonal <C2(i), C2(j)> (target 1/4)"),
        "c_self": Param(dz.c_self, "code weight * k1 / eta1 (the grid value >= eta1 c_self_min / k1); c_self_min: "
                        + dz.formulas["c_self"]),
        "c_label": Param(dz.c_label, "label bias / eta1 (the grid value >= eta1 c_label_min); c_label_min: "
                         + dz.formulas["c_label"]),
        "tau": Param(dz.margin - dz.c_self * (mu1 - Fraction(lo, s)), "margin - c_self (mu1 - min cross): the lead "
                     "of the nearest candidate after the code term (real arithmetic)"),
        "eta": Param(dz.eta1, "eta1: " + dz.formulas["eta1"]),
        "eta2": Param(dz.eta2, dz.formulas["eta2"]),
        "eta_paper": Param(round(pc["eta"], 6), "(5 / (4 margin)) ln(18N): weight 9/10 with tau = 4 margin / 5 (P1 App. G.2)"),
        "c_paper": Param(6, "the paper's c1 = c2 = 6 (reconstructed from 'self and labels <= -5', P1 App. G.2)"),
        "eps_paper": Param(pc["eps"], "the paper's code accuracy margin/100 (P1 App. G.2, second layer)"),
        "d_model": Param(dz.d_model, "d' + 3m + 1 + k1 + 4 k2 (two-code); d' + 3m + 1 + 4k (paper)"),
        "d_head": Param(dz.d_head, "max(d' + k1 + 1, k2)"),
        "heads": Param(1, "per layer (the paper's TF^2_{m,p,2} has 2: no residual stream)"),
        "precision": Param(dz.fmt.name, dz.formulas["precision"]),
        "precision_bits": Param(getattr(dz.fmt, "bits", None), "bits of one number in the format"),
        "m": Param(dz.m, "ceil(log2 labels)"),
    }
