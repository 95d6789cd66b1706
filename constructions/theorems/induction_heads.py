"""Induction heads (P2 Def. 5.3, Thm 5.4) and k-hop induction heads (Def. 5.5, Thm 5.6) as causal
softmax transformers with exact weights (docs/mpc.md, "Weights").

Task: w in Sigma^N; at every position p the answer is w_{sigma^k(p)}, sigma(p) = 1 + (the last
q < p with w_q = w_p) (1-based), "no answer" where there is none; k = 1 is induction heads.

Construction (positions 0..N: a BOS token at 0 that stands for "no answer", w at 1..N; sigma(p) = 0
where there is no earlier occurrence, and sigma(0) = 0, so "no answer" is absorbing)::

    slots:  tok (M) | bos | pcode (m) | qprev (m) | prevc (M) | P (m) | TP (M) | A (m) | TA (M) | scratch
    tok:    the token's balanced code (codes/tokens.py), bos: 1 at the BOS token
    pcode = A (initially): the binary code of the position; qprev: the binary code of p - 1
    layer 0: FollowPointer(qprev -> pcode, value tok): prevc = the code of w_{p-1}   [+ CleanCode]
    layer 1: LatestMatch(query tok, keys prevc, order pcode, default bos, values pcode, tok):
             P = code(sigma(p)), TP = code(w_sigma(p))                             [+ CleanCode]
    layer 1 + t, t = 1 .. L (L = floor(log2 k)): FollowPointer(P -> pcode, values P, TP):
             P <- P o P (sigma^(2^t)); if bit t - 1 of k is set, FollowPointer(A -> pcode):
             A <- P o A (the old P), TA likewise                                      [+ CleanCode]
    last layer (k >= 2): A <- P o A with P = sigma^(2^L)
    readout: CodeReadout(TA, or TP for k = 1): the token whose code it holds

So induction heads take 2 layers and k-hop floor(log2 k) + 3 <= ceil(log2 k) + 3, every layer one
or two heads, width (d_model) 4M + 4m + 1 (k = 1) or 6M + 6m + 1 with M = O(log |Sigma|) and
m = ceil(log2(N + 1)): O(log N + log |Sigma|), where P2's MPC route has m = O(N^eps) per head
(its per-token maps not counted). The CleanCode MLPs are not in the width: a layer's MLP has 6
hidden units per cleaned column, 6(M + m) in a layer that follows one pointer and 12(M + m) in one
that follows two (k not a power of two), so induction heads' MLP is wider than its d_model at every
N; the size tables show the MLP units beside the width (docs/sizes.md), and the parameters count them.

Guarantee (the blocks' sufficient conditions, checked for the chosen eta, lambda and format in the
fixed-point format and in exact reals, float64 and float32 where they hold): every pointer head
puts weight >= 3/4 on its target in the worst row, so every clean-up is exact. The certificate
(:mod:`exactformer.verify.certify.pointer`) proves it for all |Sigma|^N inputs from the weights.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.blocks.pointer import GEOMETRIC, CleanCode, CodeReadout, FollowPointer, LatestMatch
from exactformer.constructions.codes.positions import BinaryCode
from exactformer.constructions.codes.tokens import balanced_width, token_code
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.core.pointers import Latest, Shift, TokenAt
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.task import Batch, SymbolsTask, TaskError
from exactformer.constructions.design.precision_search import (FLOAT_FALLBACKS, arithmetics_for, designed_for,
                                                               fewest_bits, float_arithmetic, float_set,
                                                               smallest_grid_eta, smallest_works)
from exactformer.constructions.mpc.applications import k_hop_adversarial, k_hop_draw, k_hop_truth
from exactformer.precision import FixedPoint, Format, parse_format

MAX_N = 1 << 24
MAX_ALPHABET = 1 << 16
BRANCHING = 2  # the block boundaries of the adversarial inputs (those of a binary search)


class InductionHeadsError(TaskError):
    """Bad parameters for :func:`induction_heads` / :func:`k_hop`, or a bad input."""


# ------------------------------------------------------------------------------------------------
# the task
# ------------------------------------------------------------------------------------------------


def sigma_pointer(T: int) -> Latest:
    """sigma as a pointer on inputs of T = N + 1 tokens (BOS first): the latest j in [1, p] whose
    previous token equals the token at p, else 0 (the BOS: no answer)."""
    return Latest(key=(Shift.of([(1, T, -1)]),), first=1, default=0)


class KHopTask(SymbolsTask):
    """Tokens: BOS, then w_1 .. w_N in [0, |Sigma|); answers at positions 1..N: w_{sigma^k(p)} or
    None ("no answer"). Inputs are held as the array w [B, N]."""

    ENCODING = {"inputs": [{"name": "w", "type": "N ints in [0, alphabet)"}],
                "tokens": [{"token": "BOS"}, {"for_each": "w", "token": "s{}"}]}
    noun, domain_param, error = "tokens", "alphabet", InductionHeadsError

    def __init__(self, hops: int | None = None):
        self.hops = hops  # fixed (induction heads) or the model's k

    def _k(self, model: CompiledModel) -> int:
        return int(model.task_params["k"])

    def symbols(self, model: CompiledModel) -> int:
        return int(model.task_params["alphabet"])

    def truth(self, model: CompiledModel, w: np.ndarray) -> np.ndarray:
        return k_hop_truth(np.atleast_2d(w), self._k(model))

    def spec(self, model: CompiledModel) -> TokenAt:
        S = self.symbols(model)
        return TokenAt((sigma_pointer(model.n + 1),) * self._k(model), np.arange(S + 1), tuple(range(1, model.n + 1)),
                       tuple(range(S)) + (None,))  # the BOS (token S) names "no answer"

    def sample(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        for lo in range(0, count, 256):
            yield self.batch(model, k_hop_draw(model.n, self.symbols(model), rng, min(256, count - lo)))

    def adversarial(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        """The named hard cases of the k-hop application (fixed points, no repeats, long chains,
        block boundaries), at most ``count`` inputs."""
        done = 0
        for kind, w in k_hop_adversarial(model.n, self.symbols(model), BRANCHING, seed):
            take = w[: max(0, count - done)]
            if take.size:
                yield self.batch(model, take, kind=kind)
                done += len(take)


# ------------------------------------------------------------------------------------------------
# the builders
# ------------------------------------------------------------------------------------------------


def _check(name: str, v: Any, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        hi_text = f"2^{hi.bit_length() - 1}" if hi & (hi - 1) == 0 and hi > 1 << 10 else str(hi)
        raise InductionHeadsError(f"{name} must be an integer in [{lo}, {hi_text}], got {v!r}")
    return int(v)


#: the grid on which the float arithmetics' thresholds are found (once per condition, then rounded
#: up to each format's grid: the conditions are monotone)
FLOAT_GRID = Fraction(1, 1 << 12)


@lru_cache(maxsize=256)
def _float_threshold(condition: str, dtype: str | None, args: tuple) -> Fraction | None:
    arith = float_arithmetic("real" if dtype is None else dtype)
    holds = {"pointer": lambda x: FollowPointer.holds(arith, x, *args),
             "order": lambda x: LatestMatch.order_holds(arith, x, *args),
             "latest": lambda x: LatestMatch.holds(arith, x, *args)}[condition]
    return smallest_grid_eta(FixedPoint.binary(40, 12), FLOAT_GRID, holds, top=Fraction(1 << 38))


def _smallest(fmt: Format, unit: Fraction, top: Fraction, ariths: list, condition: str, args: tuple) -> Fraction | None:
    """The smallest multiple of ``unit`` up to ``top`` at which ``condition`` holds in every arithmetic
    (each monotone: the largest of the arithmetics' smallest values)."""
    best = unit
    for a in ariths:
        if a.exact:
            x = smallest_grid_eta(fmt, unit, lambda v: _holds(a, condition, v, args), top=top)
        else:
            x = _float_threshold(condition, a.dtype, args)
            x = None if x is None else unit * -(-x // unit)
        if x is None or x > top:
            return None
        best = max(best, x)
    return best if all(_holds(a, condition, best, args) for a in ariths) else None


def _holds(arith: Any, condition: str, x: Fraction, args: tuple) -> bool:
    return {"pointer": FollowPointer.holds, "order": LatestMatch.order_holds, "latest": LatestMatch.holds}[condition](
        arith, x, *args)


def _parameters(fmt: Format, M: int, m: int, n_keys: int, robust: Any) -> tuple[Fraction, Fraction, Fraction] | None:
    """(eta of the pointer heads, eta and lambda of sigma's head): the smallest grid values whose
    rows settle in every arithmetic of the design, with every weight representable; None if none."""
    unit, most = fmt.step, Fraction(fmt.max_value)
    if most < 1 << (m + 1):  # the order term lambda j alone needs this range
        return None
    ariths = arithmetics_for(fmt, robust)
    eta_r = _smallest(fmt, unit, most / m, ariths, "pointer", (m, n_keys))
    lam = _smallest(fmt, 2 * unit, most / (GEOMETRIC + 2), ariths, "order", (n_keys,))
    if eta_r is None or lam is None or lam * ((1 << m) - 1) >= most:
        return None
    span = lam * ((1 << m) - 1)
    eta_s = _smallest(fmt, unit, (most - span) / (2 * M), ariths, "latest", (lam, M, m, n_keys))
    return None if eta_s is None else (eta_r, eta_s, lam)


def _design(n: int, M: int, m: int, precision: Any) -> tuple[Format, tuple, Any]:
    """The format (given, or the fewest-bit binary one; robust to reals, float64 and float32, each
    dropped in turn where no format up to 48 bits allows it) and the parameters."""
    return _design_named(n, M, m, None if precision is None else parse_format(precision).name)


@lru_cache(maxsize=64)
def _design_named(n: int, M: int, m: int, precision: str | None) -> tuple[Format, tuple, Any]:
    if precision is not None:
        fmt = parse_format(precision)
        if not fmt.is_exact:
            raise InductionHeadsError(f"precision must be a fixed-point format (the pointer certificate is exact), "
                                      f"got {fmt.name}")
        for robust in FLOAT_FALLBACKS:
            found = _parameters(fmt, M, m, n + 1, robust)
            if found is not None:
                return fmt, found, robust
        hint = smallest_works(lambda f: _parameters(f, M, m, n + 1, ()), InductionHeadsError, min_frac=2)
        raise InductionHeadsError(f"precision {fmt.name}: the pointer heads' rows do not settle for n = {n}; {hint}")
    for robust in FLOAT_FALLBACKS:
        try:
            fmt, found = fewest_bits(lambda f: _parameters(f, M, m, n + 1, robust), max_bits=48, err=InductionHeadsError,
                                     min_frac=2)
            return fmt, found, robust
        except InductionHeadsError:
            continue
    raise InductionHeadsError(f"no binary format up to 48 bits holds the pointer heads for n = {n}")


def _build(name: str, theorem: str, n: int, k: int, alphabet: int | None, precision: Any) -> CompiledModel:
    n = _check("n", n, 2, MAX_N)
    k = _check("k", k, 1, 1 << 30)
    S = min(n, MAX_ALPHABET) if alphabet is None else _check("alphabet", alphabet, 2, MAX_ALPHABET)
    M, code = balanced_width(S) + 1, BinaryCode(n + 1)
    m = code.k
    fmt, (eta_r, eta_s, lam), robust = _design(n, M, m, precision)
    L = k.bit_length() - 1
    two = k >= 2
    lay = Layout()
    slots = [("tok", M), ("bos", 1), ("pcode", m), ("qprev", m), ("prevc", M), ("P", m), ("TP", M), ("S_P", m), ("S_T", M)]
    if two:
        slots += [("A", m), ("TA", M), ("S_A", m), ("S_TA", M)]
    for s, w in slots:
        lay.add(s, w)
    n_layers = 2 + (L + 1 if two else 0)
    mb = ModelBuilder(lay, n_layers=n_layers, d_vocab=S + 1, n_ctx=n + 1)
    codes = token_code(S).astype(np.int64)
    for slot in ("tok", "TA") if two else ("tok",):
        mb.token_rows(range(S + 1), slot, codes)
    mb.token_rows([S], "bos", np.array([[1]]))
    for slot in ("pcode", "A") if two else ("pcode",):
        mb.position_code(slot, 0, n + 1, code)
    mb.position_code("qprev", 0, 1, code)  # position 0: itself (the BOS)
    mb.position_code("qprev", 1, n, code)  # position p >= 1: the code of p - 1
    FollowPointer("qprev", "pcode", ("tok",), ("S_T",), eta_r).emit(mb, 0)
    CleanCode("S_T", "prevc").emit(mb, 0)
    LatestMatch("tok", "prevc", "pcode", "bos", ("pcode", "tok"), ("S_P", "S_T"), eta_s, lam).emit(mb, 1)
    CleanCode("S_P", "P").emit(mb, 1)
    CleanCode("S_T", "TP").emit(mb, 1)
    for t in range(1, L + 2 if two else 1):
        layer, last = 1 + t, t == L + 1
        if not last:  # P <- P o P
            FollowPointer("P", "pcode", ("P", "TP"), ("S_P", "S_T"), eta_r).emit(mb, layer)
            CleanCode("S_P", "P").emit(mb, layer)
            CleanCode("S_T", "TP").emit(mb, layer)
        if last or (k >> (t - 1)) & 1:  # A <- P o A
            FollowPointer("A", "pcode", ("P", "TP"), ("S_A", "S_TA"), eta_r).emit(mb, layer)
            CleanCode("S_A", "A").emit(mb, layer)
            CleanCode("S_TA", "TA").emit(mb, layer)
    CodeReadout("TA" if two else "TP", S).emit(mb)
    model = mb.build(
        answers=list(range(S)) + [None], vocab=[f"s{t}" for t in range(S)] + ["BOS"], construction=name,
        theorem=theorem, n=n, precision=fmt.name, answer_positions=tuple(range(1, n + 1)),
        task_params={"n": n, "k": k, "alphabet": S},
        params={
            "k": Param(k, "the number of hops (P2 Def. 5.5)"),
            "alphabet": Param(S, "|Sigma|"),
            "M": Param(M, "token code width: the smallest even M' with C(M', M'/2) >= |Sigma|, plus 1"),
            "m": Param(m, "position code width ceil(log2(N + 1))"),
            "eta_pointer": Param(eta_r, "smallest grid eta with weight >= 3/4 on the followed position in the worst row"),
            "eta": Param(eta_s, "sigma's head: smallest grid eta with weight >= 3/4 on the latest match (or the "
                                "default) in the worst row"),
            "lambda": Param(lam, "sigma's head: the order step, smallest grid value that settles the earlier matches"),
            "layers": Param(n_layers, "2 for k = 1, floor(log2 k) + 3 for k >= 2"),
            "precision": Param(fmt.name, "fewest-bit binary format in which the rows settle" if precision is None
                               else "given"),
            "precision_bits": Param(fmt.bits, "bits of one number in the format"),
            "arithmetics": Param(designed_for(fmt, robust), "the arithmetics the sufficient conditions were checked in"
                                 + ("" if float_set(robust) == float_set(True) else " (the others allow no format "
                                                                                    "up to 48 bits)")),
        },
        position_code=code)
    return model


_CLAIM_NOTE = "P2 counts heads x embedding dimension; its per-token maps are arbitrary functions (not counted)"


@construction("induction-heads", task=KHopTask(hops=1), theorem="P2 Thm 5.4 (Def. 5.3)",
              claim=Claim("P2 Thm 5.4 (Sec. 5.2)", "O(1)", "O(N^((eps'-eps)/4))", "O(N^eps')", "p-bit words",
                          "sub-linear width (ANNA)", _CLAIM_NOTE),
              sizes=SizeRows("k-hop", (("alphabet", 64),), max_n=1 << 24, note="|Sigma| = 64"),
              example=dict(n=8, alphabet=3), small=dict(n=5, alphabet=3))
def induction_heads(n: int, alphabet: int | None = None, precision: Format | str | None = None) -> CompiledModel:
    """Induction heads (P2 Def. 5.3, Thm 5.4) as a two-layer causal transformer: at position p the
    answer is w_{sigma(p)}, sigma(p) = 1 + (the last q < p with w_q = w_p), None where there is none.

    Parameters
    ----------
    n : int in [2, 2^24]. Sequence length N.
    alphabet : int in [2, 2^16]. |Sigma|: tokens are integers in [0, |Sigma|). Default: min(N, 2^16).
    precision : a fixed-point format: binary:int=I,frac=F | paper:n=N,kc=K. Default: the fewest-bit
        binary format in which every pointer head's worst row settles.

    Returns a model on T = N + 1 tokens (BOS, then w) answering at positions 1..N.
    """
    return _build("induction-heads", "P2 Thm 5.4 (Def. 5.3)", n, 1, alphabet, precision)


@construction("k-hop", task=KHopTask(), theorem="P2 Thm 5.6 (Def. 5.5)",
              claim=Claim("P2 Thm 5.6 (Sec. 5.2)", "O(log k)", "O(N^((eps'-eps)/4))", "O(N^eps')", "p-bit words",
                          "sub-linear width (ANNA), |Sigma| = O(N)", _CLAIM_NOTE),
              sizes=SizeRows("k-hop", (("k", 16), ("alphabet", 64)), max_n=1 << 24, note="k = 16, |Sigma| = 64"),
              example=dict(n=8, k=3, alphabet=3), small=dict(n=5, k=3, alphabet=3))
def k_hop(n: int, k: int = 2, alphabet: int | None = None, precision: Format | str | None = None) -> CompiledModel:
    """k-hop induction heads (P2 Def. 5.5, Thm 5.6) with floor(log2 k) + 3 layers (k >= 2): at
    position p the answer is w_{sigma^k(p)} (sigma composed k times, "no answer" absorbing), by
    pointer doubling.

    Parameters
    ----------
    n : int in [2, 2^24]. Sequence length N.
    k : int in [1, 2^30]. The number of hops.
    alphabet : int in [2, 2^16]. |Sigma|: tokens are integers in [0, |Sigma|). Default: min(N, 2^16).
    precision : a fixed-point format: binary:int=I,frac=F | paper:n=N,kc=K. Default: the fewest-bit
        binary format in which every pointer head's worst row settles.

    Returns a model on T = N + 1 tokens (BOS, then w) answering at positions 1..N.
    """
    return _build("k-hop", "P2 Thm 5.6 (Def. 5.5)", n, k, alphabet, precision)
