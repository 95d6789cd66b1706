"""Index Lookup with one layer of width O(log N) (Theorem 1, App. C.2 of Bhattamishra et al. 2024).

Task: IdxL(s_1 .. s_N, p) = s_p for symbols s_i in [0, |Sigma|) and an index p in [1, N].

Construction (the paper's equations reconstructed in docs/index-lookup.md): a position code T(1..N)
with <T(i), T(i)> = 1 and |<T(i), T(j)>| <= mu, rho(s) in {0,1}^m the bits of a symbol
(m = ceil(log2 |Sigma|)). Token s_i at position i writes rho(s_i) and the position writes T(i);
the index token p (the last token) writes T(p). One head retrieves the value at the position whose
code matches the query's, an MLP rounds the retrieved bits, the unembedding reads the symbol::

    slots:  rho (m) | qcode (k) | pcode (k) | bits (m)
    layer 0: RetrieveByPosition(query=qcode, key=pcode, value=rho -> rho), scale eta
             BitThreshold(rho -> bits)
    readout: SymbolReadout(bits)

Guarantee: the model answers s_p whenever every rounded attention row puts weight >= 3/4 on
position p and <= 1/4 on the rest (then each retrieved bit is within 1/4 of rho_j(s_p)). By
default eta is the smallest grid value for which the worst row the code's bound allows does so,
computed with the format's own operations; the paper's sufficient eta > 2 ln(3N) is reported
beside it. The certificate re-derives everything from the weights.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.mlp import BitThreshold
from exactformer.constructions.blocks.readout import SymbolReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.codes.positions import position_codes
from exactformer.constructions.design.precision_search import (FLOAT_ARITHMETICS, arithmetics_for, design_arithmetics,
                                                        designed_for, fallbacks, fewest_bits, float_set, given_eta,
                                                        refused, smallest_grid_eta, smallest_works)
from exactformer.constructions.core.spec import Select
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.runs import Classes, DomainRuns, Lookup
from exactformer.constructions.core.vocab import RunVocab
from exactformer.constructions.core.streams import STREAM_TOKENS, GeneratedTokens, draw_keys, uniform_symbols
from exactformer.constructions.core.task import Batch, Domains, PowerCount, Task, TaskError, power_count, redefines
from exactformer.precision import FixedPoint, Format, parse_format

THEOREM = "Thm 1 (App. C.2), Bhattamishra et al. 2024"
MAX_ALPHABET = 1 << 16
MAX_N = 1 << 30  # built, saved and certified in O(polylog N): position codes are generators, never tables
P_GROUP = 16  # sampled inputs share p in groups of this size (a group shares its attention row)
BATCH_TOKENS = 1 << 26  # tokens per batch of formed sampled or adversarial inputs


class IndexLookupError(TaskError):
    """Bad parameters for :func:`index_lookup` or a bad input to ``encode``."""


def symbol_bits(alphabet: int) -> int:
    """m = ceil(log2 |Sigma|), at least 1."""
    return max(1, math.ceil(math.log2(alphabet)))


def paper_eta(n: int) -> float:
    """The paper's sufficient scale: eta > 2 ln(3N) (App. C.2)."""
    return 2 * math.log(3 * n)


def retrieval_holds(fmt: Format, eta: Fraction, mu: Fraction, n: int, gram: Fraction | None = None,
                    robust: bool | tuple[str, ...] = False) -> bool:
    """The sufficient condition: the worst row of N+1 keys puts >= 3/4 on the target and <= 1/4
    elsewhere, in the format (and, when ``robust``, in exact reals, float64 and float32 too)."""
    return RetrieveByPosition.selects(arithmetics_for(fmt, robust), eta, mu, n + 1, gram, tol=BitThreshold.TOLERANCE)


class IndexLookupTask(Task):
    """IdxL(s, p) = s_p; natural input ``(symbols, p)`` with p 1-based; tokens: the symbols, then
    the index token ``p{p}`` (id |Sigma| + p - 1)."""

    ENCODING = {
        "inputs": [{"name": "symbols", "type": "N ints in [0, |Sigma|)"}, {"name": "p", "type": "int in [1, N] (1-based)"}],
        "tokens": [{"for_each": "symbols", "token": "s{}"}, {"of": "p", "token": "p{}"}],
    }

    @staticmethod
    def alphabet(model: Any) -> int:
        """|Sigma|: the task parameter ``alphabet`` (never the model's answer labels)."""
        return int(model.task_params["alphabet"])

    def length(self, model: CompiledModel) -> int:
        return model.n + 1

    def domains(self, model: CompiledModel) -> Domains:
        S, n = self.alphabet(model), model.n
        return Domains([np.arange(S), np.arange(S, S + n)], np.r_[np.zeros(n, np.int64), 1])

    def domain_runs(self, model: CompiledModel) -> DomainRuns:
        """:meth:`domains` in O(1): the symbols at positions 0 .. N-1, an index token at N."""
        if redefines(self, IndexLookupTask, "domains"):
            return super().domain_runs(model)
        S, n = self.alphabet(model), model.n
        return DomainRuns(np.array([0, n], np.int64), np.array([0, 1], np.int64), [Classes.run(0, S), Classes.run(S, S + n)],
                          n + 1)

    def truth(self, model: CompiledModel, symbols: np.ndarray, p: np.ndarray) -> np.ndarray:
        return np.asarray(symbols)[np.arange(len(p)), np.asarray(p) - 1]

    def spec(self, model: CompiledModel) -> Select:
        S, n = self.alphabet(model), model.n
        pointer = np.full(S + n, -1, dtype=np.int64)
        pointer[S:] = np.arange(n)
        answer_of = np.full(S + n, -1, dtype=np.int64)
        answer_of[:S] = np.arange(S)
        return Select(n, n, pointer, answer_of, tuple(range(S)))

    def spec_runs(self, model: CompiledModel) -> Lookup:
        """:meth:`spec` in O(1): index token S + p - 1 looks up position p - 1; symbol s names answer s."""
        if redefines(self, IndexLookupTask, "spec"):
            return super().spec_runs(model)
        S, n = self.alphabet(model), model.n
        return Lookup(n, n, ((S, S + n, -S),), ((0, S, 0),), tuple(range(S)))

    def encode_arrays(self, model: CompiledModel, symbols: np.ndarray, p: np.ndarray) -> np.ndarray:
        S, n = self.alphabet(model), model.n
        symbols, p = np.asarray(symbols), np.asarray(p)
        for name, a in (("symbols", symbols), ("p", p)):
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise IndexLookupError(f"{name} must be integers, got dtype {a.dtype}")
        if symbols.ndim != 2 or symbols.shape[1] != n:
            raise IndexLookupError(f"symbols must have shape [B, {n}] (N = {n} symbols per input), got {symbols.shape}")
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

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        rows, ps = [], []
        for e in examples:
            if not (isinstance(e, (tuple, list)) and len(e) == 2):
                raise IndexLookupError("an input is (symbols, p): a list of N symbols and a 1-based index p")
            sy, p = e
            if not isinstance(sy, (list, tuple, np.ndarray)):
                raise IndexLookupError(f"symbols must be a list of N = {model.n} integers in [0, {self.alphabet(model)}), "
                                       f"got {type(sy).__name__}")
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
                raise IndexLookupError(f"p must be an integer in [1, {model.n}], got {p!r}")
            if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in sy):
                raise IndexLookupError(f"symbols must be integers in [0, {self.alphabet(model)})")
            if len(sy) != model.n:
                raise IndexLookupError(f"symbols must have length N = {model.n}, got {len(sy)}")
            rows.append(list(sy))
            ps.append(int(p))
        return np.asarray(rows, dtype=np.int64).reshape(len(rows), model.n), np.asarray(ps, dtype=np.int64)

    # ---- inputs ------------------------------------------------------------------------------------------
    def count(self, model: CompiledModel) -> int | PowerCount:
        return power_count(self.alphabet(model), model.n, model.n)

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        """Every (s, p): |Sigma|^N * N inputs, symbols in counting order."""
        S, n = self.alphabet(model), model.n
        per = max(1, batch // n)
        for start in range(0, S**n, per):
            ints = np.arange(start, min(S**n, start + per), dtype=np.int64)
            sy = (ints[:, None] // S ** np.arange(n - 1, -1, -1)[None, :]) % S
            yield self.batch(model, np.repeat(sy, n, axis=0), np.tile(np.arange(1, n + 1), len(ints)))

    def batch_inputs(self, model: CompiledModel, batch: int = 1024) -> int:
        """Inputs per batch of :meth:`sample` and :meth:`adversarial`: ``batch``, or fewer so that a
        batch of formed inputs holds at most :data:`BATCH_TOKENS` tokens (a function of N alone, so
        a seed gives the same inputs on every machine); generated inputs (N + 1 >=
        :data:`~exactformer.constructions.core.streams.STREAM_TOKENS`) hold O(1) each."""
        return batch if self.generated(model) else max(1, min(batch, BATCH_TOKENS // (model.n + 1)))

    def generated(self, model: CompiledModel) -> bool:
        """Whether sampled and adversarial inputs are generated on demand, never formed."""
        return model.n + 1 >= STREAM_TOKENS

    def input_bytes(self, model: CompiledModel) -> int:
        return 64 if self.generated(model) else 8 * (model.n + 1)  # int32 tokens and symbols

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 1024) -> Iterator[Batch]:
        """``count`` inputs from ``np.random.default_rng(seed)``: p uniform in [1, N] for each group
        of ``P_GROUP`` consecutive inputs, symbols uniform and independent for every input (drawn
        by ``rng.integers``; for N + 1 >= 2^25 symbol t of an input is :func:`uniform_symbols` of
        a key drawn per input and t, generated when read)."""
        rng = np.random.default_rng(seed)
        S, n = self.alphabet(model), model.n
        batch = self.batch_inputs(model, batch)
        for done in range(0, count, batch):
            b = min(batch, count - done)
            p = np.repeat(rng.integers(1, n + 1, size=-(-b // P_GROUP)), P_GROUP)[:b]
            if not self.generated(model):
                yield self.batch(model, rng.integers(0, S, size=(b, n), dtype=np.int32), p)
                continue
            keys = draw_keys(rng, b)
            yield self._generated(model, p, lambda rows, pos: uniform_symbols(keys[rows], pos, S),
                                  lambda r: {"symbols": f"uniform_symbols(key={int(keys[r])}, t, S={S}) for t in "
                                                        f"[0, {n}) (exactformer.constructions.core.streams)"}, "sample")

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 1024,
                    positions: np.ndarray | None = None) -> Iterator[Batch]:
        """s_p = a and every other symbol the one farthest from a in Hamming distance (its bitwise
        complement when that is a symbol): the largest interference per bit. p shared by groups
        of ``P_GROUP`` (drawn from ``positions`` when given)."""
        rng = np.random.default_rng(seed)
        S, n = self.alphabet(model), model.n
        far = _farthest_symbols(S)
        batch = self.batch_inputs(model, batch)
        for done in range(0, count, batch):
            b = min(batch, count - done)
            a = rng.integers(0, S, size=b)
            groups = -(-b // P_GROUP)
            p = np.repeat(rng.integers(1, n + 1, size=groups) if positions is None else
                          rng.choice(np.asarray(positions) + 1, size=groups), P_GROUP)[:b]
            if not self.generated(model):
                sy = np.repeat(far[a][:, None], n, axis=1)
                sy[np.arange(b), p - 1] = a
                yield self.batch(model, sy, p)
                continue
            yield self._generated(model, p, lambda rows, pos: np.where(pos[None, :] == p[rows, None] - 1, a[rows, None],
                                                                       far[a[rows], None]),
                                  lambda r: {"symbols": f"{int(far[a[r]])} everywhere but position p - 1, which holds "
                                                        f"{int(a[r])}"}, "adversarial")

    def _generated(self, model: CompiledModel, p: np.ndarray, symbols, describe, kind: str) -> Batch:
        """A batch of inputs generated on demand: ``symbols(rows, positions)`` gives the symbols."""
        S, n = self.alphabet(model), model.n

        def tokens(rows: np.ndarray, pos: np.ndarray) -> np.ndarray:
            out = np.empty((rows.size, pos.size), dtype=np.int64)
            last = pos == n
            out[:, ~last] = symbols(rows, pos[~last])
            out[:, last] = (S + p[rows] - 1)[:, None]
            return out

        def what(r: int) -> dict:
            return describe(r) | {"p": int(p[r])}

        B = p.size
        sy = GeneratedTokens(symbols, B, n, 0, S - 1, what)
        truth = np.empty(B, dtype=np.int64)
        for q in np.unique(p):  # s_p of each input, one read per distinct p (groups of P_GROUP share it)
            rows = np.flatnonzero(p == q)
            truth[rows] = symbols(rows, np.array([q - 1]))[:, 0]
        return Batch((sy, p), GeneratedTokens(tokens, B, n + 1, 0, S + n - 1, what), truth, kind)

    def candidates(self, model: CompiledModel, hint: dict, count: int) -> Iterator[Batch]:
        if hint.get("positions"):
            pos = [q for q in hint["positions"] if 0 <= q < model.n] or None
            yield from self.adversarial(model, min(count, 256 * P_GROUP), seed=3, positions=pos)
        yield from super().candidates(model, hint, count)


def _farthest_symbols(S: int) -> np.ndarray:
    m = max(1, (S - 1).bit_length())
    s = np.arange(S)
    comp = (~s) & ((1 << m) - 1)
    if S > 4096:
        return np.where(comp < S, comp, comp & (S - 1))
    dist = np.array([[bin(x ^ y).count("1") for y in range(S)] for x in range(S)])
    return np.where(comp < S, comp, dist.argmax(axis=1))


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


_SIZE_BOUNDS = ("rnn-index-lookup", "tracr-index-lookup")


@construction("index-lookup", task=IndexLookupTask, theorem=THEOREM,
              claim=Claim("P1 Thm 1 (Sec. 3, App. C.2)", "1", "1 (App. C.2)", "O(log N)", "O(log N)",
                          "poly-log: width x d x p = O((log N)^3) (Sec. 1, Sec. 2)"),
              sizes=(SizeRows("index-lookup", (("alphabet", 64),), _SIZE_BOUNDS, build_max_n=MAX_N, max_n=MAX_N,
                              built_to=MAX_N, note="|Sigma| = 64, positions auto"),
                     SizeRows("index-lookup", (("alphabet", 64), ("positions", "onehot")), _SIZE_BOUNDS,
                              name="index-lookup-onehot", build_max_n=1 << 10, max_n=1 << 10,
                              claim=Claim("P1 Sec. 3 (the naive construction before Thm 1)", "1", "1",
                                          "Omega(N) (one-hot positions)", "O(log N)", "Theta(N^2 p) dense weights"),
                              note="one-hot positions: the naive width-Theta(N) construction of P1 Sec. 3 (built up "
                                   "to N = 2^10)")),
              example=dict(n=16, alphabet=4), small=dict(n=4, alphabet=2))
def index_lookup(
    n: int,
    alphabet: int = 64,
    positions: str = "auto",
    eta: Fraction | str | None = None,
    precision: Format | str | None = None,
    max_inner: Fraction = Fraction(1, 4),
    seed: int = 0,
    arithmetics: str | tuple[str, ...] | None = None,
) -> CompiledModel:
    """Theorem 1's one-layer Index Lookup transformer (App. C.2).

    Parameters
    ----------
    n : int in [2, 2^30]. Sequence length N (the index p ranges over [1, N]).
    alphabet : int in [2, 2^16]. |Sigma|; the symbols are 0 .. alphabet-1.
    positions : auto | reed-solomon | random | onehot (Python: also a PositionCode with n >= N).
    eta : robust | minimal | a number > 0 (eta/k on the format's grid). robust (default): the
        smallest eta for which the sufficient condition holds in the format and in exact reals,
        float64 and float32 (the model is right wherever it runs); minimal: the smallest for the
        format alone (fixed-point only: it relies on weights rounding to 0).
    precision : a format: binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32. Default: the binary
        format with the fewest bits in which the chosen eta exists.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3 (Python: also a tuple). The float arithmetics the robust eta search checks
        besides the format. Default: real, float64, float32, dropping float32, then float64, where no
        format up to 48 bits allows them; given: exactly these, refused with the largest N at which a
        format allows them (or, for a given eta, the smallest eta that works).

    Returns a model on T = N + 1 tokens: the N symbols, then the index token.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= MAX_N:
        raise IndexLookupError(f"n must be an integer in [2, 2^30], got {n!r}")
    if isinstance(alphabet, bool) or not isinstance(alphabet, (int, np.integer)) or not 2 <= alphabet <= MAX_ALPHABET:
        raise IndexLookupError(f"alphabet must be an integer in [2, {MAX_ALPHABET}], got {alphabet!r}")
    n, S = int(n), int(alphabet)
    code = position_codes(n, max_inner=Fraction(max_inner), family=positions, seed=seed) \
        if isinstance(positions, str) else positions
    if code.n < n:
        raise IndexLookupError(f"positions: the code has {code.n} vectors, need n = {n}")
    k, gram = int(code.k), Fraction(code.gram_scale)
    mu = Fraction(code.bound if code.bound is not None else (code.certificate or code.certify()).max_inner)
    m = symbol_bits(S)
    asked = design_arithmetics(arithmetics, IndexLookupError)

    def works(n2: int) -> bool:  # the design for ``asked`` at a smaller N, for a refusal's message
        c = position_codes(n2, max_inner=Fraction(max_inner), family=positions if isinstance(positions, str) else "auto",
                           seed=seed)
        mu2 = Fraction(c.bound if c.bound is not None else (c.certificate or c.certify()).max_inner)
        try:
            fewest_bits(lambda f: _best_eta(f, Fraction(c.gram_scale), mu2, n2, m, asked), err=IndexLookupError)
        except IndexLookupError:
            return False
        return True

    fmt, eta, formulas, robust = _precision_and_eta(n, gram, mu, m, eta, precision, asked, works)
    if asked is not None and not eta_works(fmt, eta, mu, n, gram, asked):
        raise IndexLookupError(f"arithmetics {', '.join(asked)}: the sufficient condition fails at eta = {eta} in "
                               f"{fmt.name}; {smallest_works(lambda f: _best_eta(f, gram, mu, n, m, asked), IndexLookupError)}")

    L = Layout()
    for name, width in (("rho", m), ("qcode", k), ("pcode", k), ("bits", m)):
        L.add(name, width)
    mb = ModelBuilder(L, n_layers=1, d_vocab=S + n, n_ctx=n + 1)
    mb.token_rows(range(S), "rho", np.array([[(s >> j) & 1 for j in range(m)] for s in range(S)]))
    mb.token_code("qcode", S, n, code)  # the index token p carries T(p)
    mb.position_code("pcode", 0, n, code)  # position i carries T(i)
    RetrieveByPosition("qcode", "pcode", ("rho",), ("rho",), eta, gram).emit(mb, 0)
    BitThreshold("rho", "bits").emit(mb, 0)
    SymbolReadout("bits", S).emit(mb)
    model = mb.build(
        answers=list(range(S)), vocab=RunVocab([("s{}", 0, S), ("p{}", 1, n)]),
        construction="index-lookup", theorem=THEOREM, n=n, precision=fmt.name,
        task_params={"n": n, "alphabet": S, "code": code.describe() if hasattr(code, "describe") else {}},
        params={
            "k": Param(k, f"position code dimension ({getattr(code, 'family', type(code).__name__)})"),
            "mu": Param(mu, "proved (or certified) largest off-diagonal <T(i), T(j)>"),
            "eta": Param(eta, formulas["eta"]),
            "eta_paper": Param(round(paper_eta(n), 6), "2 ln(3N) (App. C.2)"),
            "m": Param(m, "ceil(log2 |Sigma|)"),
            "d_model": Param(2 * m + 2 * k, "2m + 2k"),
            "precision": Param(fmt.name, formulas["precision"]),
            "precision_bits": Param(getattr(fmt, "bits", 64), "bits of one number in the format"),
            "arithmetics": Param(designed_for(fmt, robust), "the arithmetics the sufficient condition was checked in "
                                 + ("(robust build)" if float_set(robust) == FLOAT_ARITHMETICS else "(as asked)" if asked
                                    else "(robust build: the others allow no format up to 48 bits)" if robust
                                    else "(fixed-point only)")),
            "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2N) / mu^2) (Lemma 2)"),
        })
    model.position_code = code
    return model


def _fits(fmt: Format, e: Fraction, gram: Fraction, m: int) -> bool:
    """Every weight and range bound representable in ``fmt`` for eta = ``e``."""
    return all(fmt.represents(v) for v in (e, e * gram, Fraction(2), Fraction(-3, 2), Fraction(2 * m), Fraction(-2 * m)))


def _best_eta(fmt: Format, gram: Fraction, mu: Fraction, n: int, m: int, robust: bool | tuple[str, ...]) -> Fraction | None:
    """The smallest grid eta with the sufficient condition in ``fmt`` (and the arithmetics of
    ``robust``) whose weights ``fmt`` represents, or None."""
    e = smallest_grid_eta(fmt, fmt.step / gram, lambda x: retrieval_holds(fmt, x, mu, n, gram, robust))
    return e if e is not None and _fits(fmt, e, gram, m) else None


def eta_works(fmt: Format, eta: Fraction, mu: Fraction, n: int, gram: Fraction, arithmetics: tuple[str, ...]) -> bool:
    """Whether a given eta meets the sufficient condition in the float ``arithmetics`` (and in the
    format, when it is a fixed-point one)."""
    return retrieval_holds(fmt if fmt.is_exact else FixedPoint.binary(16, 16), eta, mu, n, gram, arithmetics)


def _precision_and_eta(n: int, gram: Fraction, mu: Fraction, m: int, eta: Any, precision: Any,
                       asked: tuple[str, ...] | None, works: Any) -> tuple[Format, Fraction, dict, bool | tuple[str, ...]]:
    robust: bool | tuple[str, ...] = True if asked is None else asked
    if isinstance(eta, str):
        if eta not in ("robust", "minimal"):
            raise IndexLookupError(f"eta must be 'robust', 'minimal' or a number > 0, got {eta!r}")
        if eta == "minimal" and asked is not None:
            raise IndexLookupError("arithmetics: not with eta minimal (a fixed-point-only design)")
        robust, eta = (robust if eta == "robust" else False), None

    def best_eta(fmt: Format) -> Fraction | None:
        return _best_eta(fmt, gram, mu, n, m, robust)

    if isinstance(precision, str):
        precision = parse_format(precision)
    searched, auto = precision is None, None
    if searched:  # float32, then float64, dropped where no format up to 48 bits allows them
        options = fallbacks(asked) if robust else ((),)
        for i, robust in enumerate(options):
            try:
                precision, auto = fewest_bits(best_eta, max_bits=48, err=IndexLookupError)
                break
            except IndexLookupError:
                if i < len(options) - 1:
                    continue
                if asked is None:
                    raise
                raise IndexLookupError(refused(asked, n, works, "no binary format up to 48 bits meets the "
                                                                "sufficient condition"))
    elif precision.is_exact:
        auto = best_eta(precision)
    floats = ", ".join(float_set(robust))
    formulas = {"eta": "smallest grid value (multiple of step/gram) with target weight >= 3/4 and rest <= 1/4 "
                       "in the worst row the code's mu allows, in the format" + (f" and {floats}" if floats else
                                                                                 " only (fixed-point)"),
                "precision": "fewest-bit binary format in which that eta exists (ties: smallest eta)" if searched
                else "given"}
    if eta is not None:
        eta = given_eta(eta, IndexLookupError)
        formulas["eta"] = "given"
        return precision, eta, formulas, robust
    if not precision.is_exact:
        checked = FLOAT_ARITHMETICS if asked is None else asked
        e = smallest_grid_eta(FixedPoint.binary(16, 16), Fraction(1, 4), lambda x: retrieval_holds(precision, x, mu, n, gram, checked))
        formulas["eta"] = f"smallest multiple of 1/4 with the sufficient condition in {', '.join(checked)}"
        return precision, e if e is not None else Fraction(math.ceil(paper_eta(n) * 4), 4), formulas, checked
    if auto is None:
        raise IndexLookupError(f"precision {precision.name}: no representable eta satisfies the sufficient condition "
                               f"for n={n}, mu={mu}; {smallest_works(best_eta, IndexLookupError)}")
    return precision, auto, formulas, robust
