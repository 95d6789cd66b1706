"""Index Lookup with one layer of width O(log N) (Theorem 1, App. C.2 of Bhattamishra et al. 2024).

Task: IdxL(s_1 .. s_N, p) = s_p for symbols s_i in [0, S) and an index p in [1, N].

Construction (App. C.2, with the paper's equations reconstructed in docs/index-lookup.md). Let
T(1..N) be a position code with <T(i), T(i)> = 1 and |<T(i), T(j)>| <= mu (i != j), stored as
signs in {-1, +1}^k (T = signs / sqrt(k)), and rho(s) in {0, 1}^m, m = ceil(log2 S), the binary
encoding of a symbol. The residual stream has d_model = 2m + 2k columns::

    [ rho / attention output (m) | query code (k) | position code (k) | answer bits (m) ]

* token s_i at position i:        x_i = [rho(s_i), 0_k, signs(T(i)), 0_m]
* query token p at position N+1:  x_p = [0_m, signs(T(p)), 0_k, 0_m]   (no positional entries)
* W_Q = (eta/k) [O; I; O; O], W_K = [O; O; I; O], W_V = W_O = [I; O; O; O]  (one head, d_head = k)
  so the query-key logit is (eta/k) <signs(T(p)), signs(T(i))> = eta <T(p), T(i)>: eta on the
  target, at most eta*mu elsewhere, and 0 on the query itself.
* the attention output z = sum_i a_i rho(s_i) is added to the query's (empty) rho columns;
* the ReLU MLP thresholds each bit at 1/2: b_j = relu(2 z_j - 1/2) - relu(2 z_j - 3/2), which is
  0 for z_j <= 1/4 and 1 for z_j >= 3/4, written to the answer-bit columns;
* the unembedding scores symbol s by sum_j (2 rho_j(s) - 1)(2 b_j - 1): m for the symbol whose
  bits are b, at most m - 2 for every other.

Guarantee: the model answers s_p whenever, for every p, the rounded attention weight on position p
is >= 3/4 and the weights on the other symbol positions sum to <= 1/4. By default eta is the
smallest grid value for which this sufficient condition holds for the worst-case attention row
allowed by the code's bound mu (``sufficient_condition``), evaluated with the format's own exact
operations; the verifier's certificate re-derives correctness independently from the weights.
The paper's choice eta > 2 ln(3N) is reported beside it.
"""

from __future__ import annotations

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
)
from exactformer.constructions.position_codes import position_codes
from exactformer.precision import FixedPoint, Format, parse_format

NAME = "index-lookup"
THEOREM = "Thm 1 (App. C.2), Bhattamishra et al. 2024"
THRESHOLD_HIGH = Fraction(3, 4)  # attention on the target must be at least this
THRESHOLD_LOW = Fraction(1, 4)  # attention on the other symbols must be at most this
MAX_ALPHABET = 1 << 16


class IndexLookupError(ValueError):
    """Bad parameters for :func:`index_lookup`."""


def symbol_bits(alphabet: int) -> int:
    """m = ceil(log2 |Sigma|), at least 1."""
    return max(1, math.ceil(math.log2(alphabet)))


def paper_eta(n: int) -> float:
    """The paper's sufficient scale: eta > 2 ln(3N) (App. C.2)."""
    return 2 * math.log(3 * n)


# ------------------------------------------------------------------------------------------------
# the sufficient condition (builder side), evaluated with the format's exact operations
# ------------------------------------------------------------------------------------------------


@dataclass
class AttentionBound:
    """Worst-case rounded attention quantities for one eta (raw values of the format)."""

    target: Fraction  # lower bound on the rounded weight of the target position
    rest: Fraction  # upper bound on the summed weight of the other symbol positions

    def holds(self) -> bool:
        return self.target >= THRESHOLD_HIGH and self.rest <= THRESHOLD_LOW


def worst_case_attention(fmt: Format, eta: Fraction, k: int, mu: Fraction, n: int) -> AttentionBound:
    """Bounds on the rounded softmax row of any query, from the code's bound ``mu`` alone.

    Logits (exact on the grid): eta on the target, at most eta*mu on each of the n-1 other symbol
    positions, 0 on the query itself. With floor rounding every rounded exponential is monotone
    in its logit, so the worst row puts every distractor at eta*mu:
    Z_w = e(0) + e(-eta) + (n-1) e(eta*mu - eta) (exact sum, saturated as the format does), the
    target weight is div(e(0), Z_w) and the other weights sum to at most R/(e(0) + R) with
    R = (n-1) e(eta*mu - eta) (dropping the query's own term only enlarges the bound).
    """
    raw = lambda v: np.asarray(fmt.quantize(np.array([v], dtype=object)))  # noqa: E731
    logit_mu = eta * mu  # on the grid: eta/k * integer inner product
    e_target = fmt.exp(raw(Fraction(0)))
    e_query = fmt.exp(fmt.sub(raw(Fraction(0)), raw(eta)))
    e_mu = fmt.exp(fmt.sub(raw(logit_mu), raw(eta)))
    et, eq, em = (fmt.to_fraction(v)[0] for v in (e_target, e_query, e_mu))
    R = (n - 1) * em
    Z = min(et + eq + R, fmt.to_fraction(fmt.max_raw))
    target = fmt.to_fraction(fmt.div(e_target, raw(Z)))[0]
    rest = R / (et + R) if et + R > 0 else Fraction(0)
    return AttentionBound(Fraction(target), Fraction(rest))


def smallest_eta(fmt: Format, k: int, mu: Fraction, n: int) -> Fraction | None:
    """The smallest eta = (k * step) * j (so eta/k lies on the grid) for which the sufficient
    condition holds, or None when no representable eta works. The bounds are monotone in eta
    (every rounded exponential is non-increasing in eta), so bisection over j is exact."""
    unit = Fraction(k) * fmt.step  # k here is <num(i), num(i)>: eta/k must lie on the grid
    hi_eta = fmt.to_fraction(fmt.max_raw)
    j_hi = int(hi_eta / unit)
    if j_hi < 1 or not worst_case_attention(fmt, unit * j_hi, k, mu, n).holds():
        return None
    lo, hi = 0, j_hi  # condition fails at lo (or lo = 0), holds at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if worst_case_attention(fmt, unit * mid, k, mu, n).holds():
            hi = mid
        else:
            lo = mid
    return unit * hi


def default_precision(n: int, k: int, mu: Fraction, m: int = 1, max_bits: int = 48) -> tuple[Format, Fraction]:
    """The binary format with the fewest bits in which the sufficient condition holds (ties: the
    one allowing the smallest eta), and that smallest eta. Needs frac >= 1 (the MLP's 1/2 offsets)
    and a range holding +-2m (the unembedding's sums before its bias), m = ceil(log2 |Sigma|)."""
    for total in range(3, max_bits + 1):  # total = 1 (sign) + int_bits + frac_bits
        found: list[tuple[Fraction, int, Format]] = []
        for frac in range(1, total - 2):
            fmt = FixedPoint.binary(int_bits=total - 1 - frac, frac_bits=frac)
            eta = smallest_eta(fmt, k, mu, n)
            if eta is not None and _weights_fit(fmt, eta, k, m):
                found.append((eta, frac, fmt))
        if found:
            eta, _, fmt = min(found, key=lambda t: (t[0], t[1]))
            return fmt, eta
    raise IndexLookupError(f"no binary format with at most {max_bits} bits satisfies the condition")


def _weights_fit(fmt: Format, eta: Fraction, k: int, m: int) -> bool:
    """Every weight and every intermediate range bound of the construction is representable."""
    vals = [eta, eta / k, Fraction(2), Fraction(-2), Fraction(-1, 2), Fraction(-3, 2), Fraction(2 * m), Fraction(-2 * m)]
    return all(fmt.represents(v) for v in vals)


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


def index_lookup(
    n: int,
    alphabet: int,
    positions: str | Any = "auto",
    eta: Fraction | int | str | None = None,
    precision: Format | str | None = None,
    max_inner: Fraction = Fraction(1, 4),
    seed: int = 0,
) -> CompiledModel:
    """Build Theorem 1's one-layer Index Lookup transformer.

    Parameters
    ----------
    n : int, 2 <= n <= 2^24. Sequence length N (the index p ranges over [1, N]).
    alphabet : int, 2 <= alphabet <= 2^16. |Sigma|; symbols are 0 .. alphabet-1.
    positions : a family name for :func:`position_codes` ("auto", "reed-solomon", "random",
        "onehot") or a position code object with ``n >= N``.
    eta : the attention scale; default the smallest grid value satisfying the sufficient
        condition at ``precision``. eta/k must lie on the format's grid.
    precision : a Format or a format string (``"binary:int=5,frac=5"``, ``"paper:n=4096,kc=1"``,
        ``"float64"``); default the smallest binary format satisfying the condition.
    max_inner, seed : passed to :func:`position_codes`.

    Returns a :class:`CompiledModel` on T = N+1 tokens: N symbols then the index token.
    """
    if not isinstance(n, (int, np.integer)) or not 2 <= n <= 1 << 24:
        raise IndexLookupError(f"n must be an integer in [2, 2^24], got {n!r}")
    if not isinstance(alphabet, (int, np.integer)) or not 2 <= alphabet <= MAX_ALPHABET:
        raise IndexLookupError(f"alphabet must be an integer in [2, {MAX_ALPHABET}], got {alphabet!r}")
    n, alphabet = int(n), int(alphabet)
    code = position_codes(n, max_inner=Fraction(max_inner), family=positions, seed=seed) if isinstance(positions, str) else positions
    if code.n < n:
        raise IndexLookupError(f"positions: the code has {code.n} vectors, need n = {n}")
    k = int(code.k)
    kappa = int(1 / Fraction(code.gram_scale))  # <T(i),T(i)> in numerator units: k for +-1 codes, 1 for one-hot
    mu = code.bound if code.bound is not None else Fraction(
        (getattr(code, "certificate", None) or code.certify()).max_inner)  # a random code carries its certificate

    if isinstance(precision, str):
        precision = parse_format(precision)
    eta_formula = "smallest grid value (multiple of k*step) with target weight >= 3/4 and rest <= 1/4 (worst case from mu)"
    if precision is None:
        precision, auto_eta = default_precision(n, kappa, mu, symbol_bits(alphabet))
        prec_formula = "fewest-bit binary format satisfying the sufficient condition"
    else:
        prec_formula = "given"
        auto_eta = smallest_eta(precision, kappa, mu, n) if precision.is_exact else None
    if eta is None:
        if precision.is_exact:
            if auto_eta is None:
                raise IndexLookupError(
                    f"precision {precision.name}: no representable eta satisfies the sufficient condition "
                    f"for n={n}, k={k}, mu={mu}; {_precision_hint(n, kappa, mu, symbol_bits(alphabet))}"
                )
            eta = auto_eta
        else:
            eta = Fraction(math.ceil(paper_eta(n) * 4), 4)
            eta_formula = "ceil(4 * 2 ln(3N)) / 4 (float format: the paper's sufficient scale)"
    else:
        eta = Fraction(eta)
        eta_formula = "given"
        if eta <= 0:
            raise IndexLookupError(f"eta must be > 0, got {eta}")
    m = symbol_bits(alphabet)
    model = _assemble(n, alphabet, code, k, m, eta)
    model.precision = precision.name
    model.params = {
        "k": Param(k, f"position code dimension ({code.family})"),
        "mu": Param(mu, "proved (or certified) max off-diagonal <T(i),T(j)>"),
        "eta": Param(eta, eta_formula),
        "eta_paper": Param(round(paper_eta(n), 6), "2 ln(3N) (App. C.2)"),
        "m": Param(m, "ceil(log2 |Sigma|)"),
        "d_model": Param(2 * m + 2 * k, "2m + 2k"),
        "precision": Param(precision.name, prec_formula),
        "precision_bits": Param(getattr(precision, "bits", 64), "bits of one number in the format"),
        "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2N) / mu^2) (Lemma 2)"),
    }
    model.task_params = {"n": n, "alphabet": alphabet, "code": code.describe() if hasattr(code, "describe") else {}}
    model.code = code  # type: ignore[attr-defined]
    if precision.is_exact:
        for name, t in model.tensors().items():
            t.raw(precision)  # raises IRError naming the weight if not representable
    return model


def _precision_hint(n: int, k: int, mu: Fraction, m: int) -> str:
    try:
        fmt, eta = default_precision(n, k, mu, m)
        return f"the smallest precision that works is {fmt.name} (eta = {eta})"
    except IndexLookupError:
        return "no binary format up to 48 bits works"


def _assemble(n: int, alphabet: int, code: Any, k: int, m: int, eta: Fraction) -> CompiledModel:
    S = alphabet
    c_rho, c_q, c_p, c_out = 0, m, m + k, m + 2 * k
    d = 2 * m + 2 * k
    rho = np.array([[(s >> j) & 1 for j in range(m)] for s in range(S)], dtype=np.int64)

    table = np.zeros((S, d), dtype=np.int64)
    table[:, c_rho : c_rho + m] = rho
    embed = Embedding(S + n, d, ExactTensor(table, 1), 0, (CodeBlock(code, S, n, c_q, 0, Fraction(1)),))
    pos_embed = Embedding(n + 1, d, ExactTensor(np.zeros((0, d), np.int64), 1), 0,
                          (CodeBlock(code, 0, n, c_p, 0, Fraction(1)),))

    dh = max(k, m)
    eye_k = np.arange(k)
    scale = eta * Fraction(code.gram_scale)  # eta/k for +-1 codes, eta for one-hot
    W_Q = np.zeros((1, d, dh), np.int64)
    W_Q[0, c_q + eye_k, eye_k] = scale.numerator
    W_K = np.zeros((1, d, dh), np.int64)
    W_K[0, c_p + eye_k, eye_k] = 1
    W_V = np.zeros((1, d, dh), np.int64)
    W_V[0, c_rho + np.arange(m), np.arange(m)] = 1
    W_O = np.zeros((1, dh, d), np.int64)
    W_O[0, np.arange(m), c_rho + np.arange(m)] = 1
    zeros_h = ExactTensor(np.zeros((1, dh), np.int64), 1)
    attn = Attention(ExactTensor(W_Q, scale.denominator), ExactTensor(W_K), ExactTensor(W_V), ExactTensor(W_O),
                     zeros_h, zeros_h, zeros_h, ExactTensor(np.zeros(d, np.int64)))

    # b_j = relu(2 z_j - 1/2) - relu(2 z_j - 3/2)
    W_in = np.zeros((d, 2 * m), np.int64)
    b_in = np.zeros(2 * m, np.int64)  # in halves
    W_out = np.zeros((2 * m, d), np.int64)
    for j in range(m):
        W_in[c_rho + j, 2 * j] = 2
        W_in[c_rho + j, 2 * j + 1] = 2
        b_in[2 * j] = -1
        b_in[2 * j + 1] = -3
        W_out[2 * j, c_out + j] = 1
        W_out[2 * j + 1, c_out + j] = -1
    mlp = MLP(ExactTensor(W_in), ExactTensor(b_in, 2), ExactTensor(W_out), ExactTensor(np.zeros(d, np.int64)))

    # logit_s = sum_j (2 rho_j(s) - 1)(2 b_j - 1)
    sign = 2 * rho - 1  # [S, m]
    W_U = np.zeros((d, S), np.int64)
    W_U[c_out : c_out + m, :] = 2 * sign.T
    b_U = -sign.sum(axis=1)

    vocab = [f"s{s}" for s in range(S)] + [f"p{p}" for p in range(1, n + 1)]
    model = CompiledModel(
        construction=NAME,
        theorem=THEOREM,
        n=n,
        embed=embed,
        pos_embed=pos_embed,
        blocks=[Block(attn, mlp)],
        W_U=ExactTensor(W_U),
        b_U=ExactTensor(b_U.astype(np.int64)),
        vocab=vocab,
        answers=list(range(S)),
    )
    check_shapes(model)
    return model


# ------------------------------------------------------------------------------------------------
# the task interface used by CompiledModel.encode
# ------------------------------------------------------------------------------------------------


#: How a natural input (symbols, p) becomes token ids, declared for exports' manifest.json (schema in
#: docs/exports.md): tokens in position order, each named by ``str.format`` of its template; a
#: name's id is its index in ``model.vocab``. Must agree with :func:`encode` (tests/test_export_encoding.py).
ENCODING = {
    "inputs": [
        {"name": "symbols", "type": "N ints in [0, |Sigma|)"},
        {"name": "p", "type": "int in [1, N] (1-based)"},
    ],
    "tokens": [
        {"for_each": "symbols", "token": "s{}"},
        {"of": "p", "token": "p{}"},
    ],
}


def _check_example(model: CompiledModel, symbols: Sequence[int], p: int) -> None:
    n, S = model.n, len(model.answers)
    if len(symbols) != n:
        raise IndexLookupError(f"symbols must have length n = {n}, got {len(symbols)}")
    if not 1 <= int(p) <= n:
        raise IndexLookupError(f"p must lie in [1, {n}], got {p}")


def encode(model: CompiledModel, example: tuple[Sequence[int], int]) -> np.ndarray:
    """(symbols, p) -> token ids [N+1]: the symbols, then the index token S + p - 1."""
    symbols, p = example
    _check_example(model, symbols, p)
    return encode_arrays(model, np.asarray(symbols)[None, :], np.asarray([p]))[0]


def encode_batch(model: CompiledModel, examples: Sequence[tuple[Sequence[int], int]]) -> np.ndarray:
    """A batch of (symbols, p) -> token ids [B, N+1]."""
    syms = np.asarray([e[0] for e in examples])
    ps = np.asarray([e[1] for e in examples])
    return encode_arrays(model, syms, ps)


def encode_arrays(model: CompiledModel, symbols: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Vectorised encoding: symbols [B, N] in [0, S), p [B] in [1, N] -> ids [B, N+1]."""
    S, n = len(model.answers), model.n
    symbols, p = np.asarray(symbols), np.asarray(p)
    for name, a in (("symbols", symbols), ("p", p)):
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise IndexLookupError(f"{name} must be integers, got dtype {a.dtype}")
    if symbols.ndim != 2 or symbols.shape[1] != n:
        raise IndexLookupError(f"symbols must have shape [B, {n}], got {symbols.shape}")
    if symbols.size and (symbols.min() < 0 or symbols.max() >= S):
        raise IndexLookupError(f"symbols must lie in [0, {S})")
    if p.ndim != 1 or p.shape[0] != symbols.shape[0]:
        raise IndexLookupError(f"p must have shape [{symbols.shape[0]}], got {p.shape}")
    if p.size and (p.min() < 1 or p.max() > n):
        raise IndexLookupError(f"p must lie in [1, {n}]")
    out = np.empty((symbols.shape[0], n + 1), dtype=np.int32 if S + n < 1 << 31 else np.int64)
    out[:, :n] = symbols
    out[:, n] = S + p - 1
    return out
