"""Multi-query associative recall in two layers (P1 App. G, "Relation to Associative Recall"; through Theorem 7).

Task MQAR: symbols s_1 .. s_N over an alphabet Sigma and labels y_1 .. y_{N-1}; the first half
s_1 .. s_{N/2} are distinct and the second half is a permutation of them (the paper's format).
For every K > N/2 the prefix (s_1, y_1, .., s_{K-1}, y_{K-1}, s_K) asks for y_{pi(K)}, pi(K) the
first-half position holding s_K. Inputs outside this precondition are refused
(:class:`MQARError`). Tokens, 0-based: s_i at 2i - 2, y_i at 2i - 1; answers at 2K - 2 as for
nearest neighbour (``queries``: "all" or "last").

Two builds (docs/nearest-neighbor.md):

* ``variant="lean"`` (default): a symbol code C with mu <= 1/4 from the token embedding and a flag
  FX on labels and second-half inputs in place of self-exclusion (legitimate because every match is
  in the first half)::

      slots: X (k_Sigma) | Y (m) | FX | P2 (k2) | A (k2) | R (k2) | S (k2) | Z (m) | B (m)
      token s: X = sigma(s);  token y_v: Y = bits(v), FX = 1;  positions N .. 2N - 2: FX += 1 (one run)
      (so FX = 0 on first-half inputs, 1 on first-half labels and second-half inputs, 2 on second-half labels)
      layer 0: RetrieveByMatch: logit = eta1 <C(s_L), C(s_t)> - eta1 c_label FX_t (all exact), value A
      layer 1: as nearest neighbour (RetrieveByAddress, BitThreshold, SymbolReadout)

* ``variant="nn"``: the paper's own reduction: symbol s becomes the hypercube vector
  (+-2^-e)^D (D = 4^e >= ceil(log2 |Sigma|), the signs the bits of s), distinct symbols are
  margin 2/D apart, and the model is :func:`~exactformer.constructions.theorems.nearest_neighbor.nearest_neighbor`
  with d_in = D and margin 2/D (its width grows as log N / margin^2 = Theta(log^3 N) when
  |Sigma| = Theta(N): docs/sizes.md).
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.content import RetrieveByMatch, row_from_levels
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.codes.products import pair_inner, resolve
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.theorems.nearest_neighbor import (MAX_N, QUERIES, NearestNeighborError, NearestNeighborTask, REST,
                                                        TARGET, check_fraction, check_int, address_codes, address_mlp,
                                                        address_tail, answer_positions, build, code_range, design,
                                                        label_positions, layer2_holds, smallest_code, value_scale)
from exactformer.constructions.design.precision_search import (FLOAT_ARITHMETICS, designed_for, fewest_bits,
                                                         float_arithmetic, smallest_grid_eta, smallest_works)
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.runs import RunConstantCode
from exactformer.constructions.core.spec import NearestLabel
from exactformer.constructions.core.task import ArrangementCount, Batch, Domains, Task, arrangement_count
from exactformer.precision import Format, parse_format
from exactformer.precision.boxes import FixedArithmetic

THEOREM = "Thm 7 via App. G (MQAR), Bhattamishra et al. 2024"
VARIANTS = ("lean", "nn")
EXHAUSTIVE_MAX = 1 << 22


class MQARError(NearestNeighborError):
    """Bad parameters for :func:`mqar` or an input outside the task's precondition."""


def hypercube_dim(alphabet: int) -> int:
    """D = 4^e >= ceil(log2 |Sigma|): the hypercube (+-2^-e)^D has exact grid entries."""
    need, D = max(1, (alphabet - 1).bit_length()), 1
    while D < need:
        D *= 4
    return D


def second_half_flag(count: int) -> RunConstantCode:
    """The positional part of the lean build's flag FX: ``count`` vectors of width 1, all [1] (one
    run), placed on positions N .. T - 1, the second half; the rows below N are not covered (0)."""
    return RunConstantCode(np.zeros(1, dtype=np.int64), np.ones((1, 1), dtype=np.int8), count)


def lean_holds(fmt: Format, eta1: Fraction, code: Any, n: int) -> Fraction | None:
    """The lean first layer's sufficient condition for the longest prefix: the target at eta1, N/2 - 1
    other first-half symbols at eta1 mu, the N/2 second-half inputs at most eta1 (1 - c_label) with
    c_label = 1, the N - 1 labels at -eta1 c_label or below (the N/2 - 1 second-half labels carry
    FX = 2 and sit at -2 eta1 c_label: bounded by -eta1 c_label, the rounded row being monotone in
    every logit); the rounded row >= 3/4 on the target, <= 1/4 elsewhere. The flag's largest value 2
    and the logit range 3 eta1 must be representable. Returns the label bias eta1 c_label (a grid
    value) or None."""
    lo, hi, s = code_range(code)
    gram = Fraction(code.gram_scale)
    if not (fmt.represents(eta1 * gram) and fmt.represents(eta1) and fmt.represents(Fraction(2))
            and 3 * eta1 <= Fraction(fmt.max_value)):
        return None
    arith = FixedArithmetic(fmt)
    S = int(fmt.scale)
    mu = Fraction(hi, s)
    rel = [eta1 * (mu - 1), -eta1, -2 * eta1]
    raw = [math.floor(r * S) for r in rel]
    if any(U >= 0 for U in raw):
        return None
    w_t, w_l, cnt = row_from_levels(arith, raw, [n // 2 - 1, n // 2, n - 1])
    target = Fraction(arith.to_fraction(np.asarray(w_t.lo)[0]))
    rest = sum(Fraction(arith.to_fraction(np.asarray(w_l.hi)[0, i])) * int(c) for i, c in enumerate(cnt[0]))
    return eta1 if target >= TARGET and rest <= REST else None


class MQARTask(Task):
    """MQAR (module docstring). Natural input ``(symbols, labels)``: N ints in [0, |Sigma|) and N - 1
    labels. Arrays: symbols [B, N], labels [B, N - 1]; truths [B, A]."""

    ENCODING = {
        "inputs": [{"name": "symbols", "type": "N ints in [0, alphabet): first half distinct, second half a permutation"},
                   {"name": "labels", "type": "N-1 ints in [0, labels)"}],
        "tokens": [{"interleave": ["symbols", "labels"], "token": ["s{}", "y{}"]}],
        "variant nn": "symbol s is token x carrying the vector ((-1)^bit_j(s) 2^-e)_j, j < D = 4^e (vector_input)",
    }

    def __init__(self) -> None:
        self.nn = NearestNeighborTask()

    @staticmethod
    def variant(model: CompiledModel) -> str:
        return model.task_params["variant"]

    @staticmethod
    def alphabet(model: CompiledModel) -> int:
        return int(model.task_params["alphabet"])

    @staticmethod
    def labels(model: CompiledModel) -> int:
        return int(model.task_params["labels"])

    def length(self, model: CompiledModel) -> int:
        return 2 * model.n - 1

    def domains(self, model: CompiledModel) -> Domains:
        if self.variant(model) == "nn":
            return self.nn.domains(model)
        S, L, T = self.alphabet(model), self.labels(model), self.length(model)
        return Domains([np.arange(S), np.arange(S, S + L)], np.arange(T) % 2)

    def spec(self, model: CompiledModel) -> NearestLabel:
        if self.variant(model) == "nn":
            return self.nn.spec(model)
        S, L, T, n = self.alphabet(model), self.labels(model), self.length(model), model.n
        cands = {q: np.arange(0, n, 2, dtype=np.int64) for q in self.nn.queries(model)}  # the first half
        return NearestLabel("equal", cands, label_positions(T), np.r_[np.full(S, -1), np.arange(L)], tuple(range(L)))

    # ---- truth ----------------------------------------------------------------------------------
    def truth(self, model: CompiledModel, symbols: np.ndarray, labels: np.ndarray) -> np.ndarray:
        s, y = np.asarray(symbols), np.asarray(labels)
        n, half = model.n, model.n // 2
        first, second = np.sort(s[:, :half], axis=1), np.sort(s[:, half:], axis=1)
        dup = np.flatnonzero(np.any(first[:, 1:] == first[:, :-1], axis=1))
        if dup.size:
            raise MQARError(f"input {int(dup[0])}: the first half repeats a symbol (the precondition: distinct keys)")
        perm = np.flatnonzero(np.any(first != second, axis=1))
        if perm.size:
            raise MQARError(f"input {int(perm[0])}: the second half is not a permutation of the first (the precondition)")
        qs = [q // 2 for q in self.nn.queries(model)]
        match = s[:, qs][:, :, None] == s[:, None, :half]  # [B, A, N/2]
        return np.take_along_axis(y, np.argmax(match, axis=2), axis=1)

    # ---- encoding -------------------------------------------------------------------------------
    def encode_arrays(self, model: CompiledModel, symbols: np.ndarray, labels: np.ndarray) -> Any:
        s, y = np.asarray(symbols), np.asarray(labels)
        n, S, L = model.n, self.alphabet(model), self.labels(model)
        if s.ndim != 2 or s.shape[1] != n or (s.size and (not np.issubdtype(s.dtype, np.integer) or s.min() < 0 or s.max() >= S)):
            raise MQARError(f"symbols must be ints in [0, {S}) of shape [B, {n}]")
        if y.shape != (s.shape[0], n - 1) or (y.size and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= L)):
            raise MQARError(f"labels must be ints in [0, {L}) of shape [B, {n - 1}]")
        if self.variant(model) == "nn":
            return self.nn.encode_arrays(model, self.vectors(model, s), y)
        tokens = np.empty((s.shape[0], 2 * n - 1), dtype=np.int64)
        tokens[:, 0::2], tokens[:, 1::2] = s, S + y
        return tokens

    def vectors(self, model: CompiledModel, symbols: np.ndarray) -> np.ndarray:
        """The hypercube vectors of the symbols (raw grid values [B, N, D]): entry j is
        (-1)^bit_j(s) 2^-e."""
        D = int(model.task_params["d_in"])
        e = int(round(math.log(D, 4)))
        unit = self.nn.scale(model) >> e
        bits = (np.asarray(symbols)[..., None] >> np.arange(D)) & 1
        return (1 - 2 * bits) * unit

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        n = model.n
        ss, ys = [], []
        for e in examples:
            if not (isinstance(e, (tuple, list)) and len(e) == 2 and len(e[0]) == n and len(e[1]) == n - 1):
                raise MQARError(f"an input is (symbols, labels): {n} symbols and {n - 1} labels")
            if any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in list(e[0]) + list(e[1])):
                raise MQARError("symbols and labels must be integers")
            ss.append(list(e[0]))
            ys.append(list(e[1]))
        return np.asarray(ss, dtype=np.int64).reshape(-1, n), np.asarray(ys, dtype=np.int64).reshape(-1, n - 1)

    # ---- inputs ---------------------------------------------------------------------------------
    def count(self, model: CompiledModel) -> int | ArrangementCount:
        n, S, L = model.n, self.alphabet(model), self.labels(model)
        return arrangement_count(L, n - 1, S, n // 2)

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        """Every injective first half (lexicographic), every permutation as the second half, every
        label sequence (innermost)."""
        n, S, L = model.n, self.alphabet(model), self.labels(model)
        half = n // 2
        if self.count(model) > EXHAUSTIVE_MAX:
            raise MQARError(f"exhaustive: {self.count(model)} inputs exceed {EXHAUSTIVE_MAX}")
        perms = np.array(list(itertools.permutations(range(half))), dtype=np.int64)
        Ys = np.array(list(itertools.product(range(L), repeat=n - 1)), dtype=np.int64).reshape(-1, n - 1)
        firsts = np.array(list(itertools.permutations(range(S), half)), dtype=np.int64)
        sym = np.concatenate([np.repeat(firsts, len(perms), axis=0),
                              np.take_along_axis(np.repeat(firsts, len(perms), axis=0), np.tile(perms, (len(firsts), 1)), axis=1)],
                             axis=1)
        per = max(1, batch // len(Ys))
        for s0 in range(0, len(sym), per):
            x = sym[s0 : s0 + per]
            yield self.batch(model, np.repeat(x, len(Ys), axis=0), np.tile(Ys, (len(x), 1)))

    def _random(self, model: CompiledModel, B: int, rng: np.random.Generator, kind: str) -> tuple[np.ndarray, np.ndarray]:
        n, S, L = model.n, self.alphabet(model), self.labels(model)
        half = n // 2
        first = np.argsort(rng.random((B, S)), axis=1)[:, :half]
        if kind == "code-worst":  # the query's symbol among the symbols whose codes correlate most with it
            first = np.tile(_closest_symbols(model, half), (B, 1))
        perm = np.argsort(rng.random((B, half)), axis=1)
        if kind == "edges":  # the matches at the first and the last first-half position, first
            perm[:, :2] = np.array([0, half - 1]) if half > 1 else 0
            perm[:, 2:] = np.array([i for i in range(1, half - 1)])
        s = np.concatenate([first, np.take_along_axis(first, perm, axis=1)], axis=1)
        y = rng.integers(0, L, size=(B, n - 1))
        if kind == "labels":  # every other label the farthest from the answer of the first query
            v = rng.integers(0, L, size=B)
            m = max(1, (L - 1).bit_length())
            far = np.where((~v) & ((1 << m) - 1) < L, (~v) & ((1 << m) - 1), (v + L // 2) % L)
            y = np.repeat(far[:, None], n - 1, axis=1)
            y[np.arange(B), perm[:, 0]] = v
        return s, y

    def _batches(self, model, count, seed, batch, kinds) -> Iterator[Batch]:
        rng = np.random.default_rng(seed)
        done, i = 0, 0
        while done < count:
            B = min(batch, count - done)
            yield self.batch(model, *self._random(model, B, rng, kinds[i % len(kinds)]))
            done, i = done + B, i + 1

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """``count`` inputs: a uniformly random injective first half, a uniformly random permutation,
        uniform labels (``np.random.default_rng(seed)``)."""
        yield from self._batches(model, count, seed, batch, ("random",))

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[Batch]:
        """Kinds cycled per batch: the first half made of the symbols whose codes correlate most
        with one symbol ("code-worst"), matches at the first and last first-half position ("edges"),
        maximal label interference ("labels"), random."""
        kinds = ("code-worst", "edges", "labels", "random")
        yield from self._batches(model, count, seed, min(batch, max(1, count // len(kinds))), kinds)


def _closest_symbols(model: CompiledModel, half: int) -> np.ndarray:
    """Symbol 0 and the half - 1 symbols whose code vectors have the largest inner products with
    it (the lean variant's code; any half symbols for the nn variant)."""
    S = int(model.task_params["alphabet"])
    blk = next((b for b in model.embed.blocks if b.first_row == 0 and b.count == S), None)
    if blk is None:
        return np.arange(half)
    gen, idx = resolve(blk.code, np.arange(S) + blk.code_start)
    ip = pair_inner(gen, np.full(S, idx[0]), gen, idx)
    order = np.argsort(-ip[1:], kind="stable") + 1
    return np.r_[0, order[: half - 1]]


@construction("mqar", task=MQARTask, theorem=THEOREM,
              claim=Claim("P1 Thm 7 via App. G (\"Relation to Associative Recall\")", "2", "2",
                          "Theta(log^3 N) through the paper's hypercube embedding (margin 2/ceil(log2|Sigma|)); O(log N) "
                          "with a constant-margin symbol code", "O(log N)", "poly-log"),
              sizes=(SizeRows("nearest-neighbor", bounds=("rnn-mqar-last",),
                              note="lean variant, |Sigma| = N, the last query answered"),
                     SizeRows("nearest-neighbor", (("queries", "all"),), bounds=("rnn-nearest-neighbor",),
                              name="mqar-all", note="lean variant, |Sigma| = N, every query answered (Thm 8's setting)")),
              small=dict(n=4))
def mqar(
    n: int,
    alphabet: int | None = None,
    labels: int = 2,
    variant: str = "lean",
    queries: str = "last",
    eta1: Fraction | None = None,
    eta2: Fraction | None = None,
    precision: Format | str | None = None,
) -> CompiledModel:
    """Multi-query associative recall in two layers (P1 App. G; the lean build or through Theorem 7).

    Parameters
    ----------
    n : int in [2, 2^20], even. N, the number of symbols (2N - 1 tokens); the first N/2 are the keys.
    alphabet : int in [N/2, 2^16]. |Sigma| (default N). The nn variant needs |Sigma| <= 2^16.
    labels : int in [2, 2^16]. The label alphabet.
    variant : lean | nn. lean: a symbol code and a second-half flag (all first-layer logits exact);
        nn: the paper's reduction to nearest neighbour (hypercube symbol vectors, margin 2/D).
    queries : last | all. last: answer the last query only; all: every query of the second half.
    eta1 : first-layer scale > 0 on the grid. Default: the smallest that satisfies the sufficient condition.
    eta2 : second-layer scale > 0. Default: the smallest that satisfies it.
    precision : a fixed-point format: binary:int=I,frac=F | paper:n=N,kc=K. Default: the binary
        format with the fewest bits that works.

    Returns a model on T = 2N - 1 tokens (s_1, y_1, .., s_N).
    """
    n = check_int("n", n, 2, MAX_N, even=True, err=MQARError)
    S = n if alphabet is None else check_int("alphabet", alphabet, max(2, n // 2), 1 << 16, err=MQARError)
    L = check_int("labels", labels, 2, 1 << 16, err=MQARError)
    if variant not in VARIANTS:
        raise MQARError(f"variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    if queries not in QUERIES:
        raise MQARError(f"queries must be one of {', '.join(QUERIES)}, got {queries!r}")
    e1 = None if eta1 is None else check_fraction("eta1", eta1, Fraction(0), Fraction(1 << 30), MQARError)
    e2 = None if eta2 is None else check_fraction("eta2", eta2, Fraction(0), Fraction(1 << 30), MQARError)
    fmt = parse_format(precision) if isinstance(precision, str) else precision
    if fmt is not None and not fmt.is_exact:
        raise MQARError(f"precision must be a fixed-point format, got {fmt.name}")
    if variant == "nn":
        D = hypercube_dim(S)
        dz = design(n, D, Fraction(2, D), "two-code", L, None, None, fmt, 2 * int(round(math.log(D, 4))) + 2, e1, e2)
        m = build(dz, queries)
        m.construction, m.theorem = "mqar", THEOREM
        m.task_params.update({"alphabet": S, "variant": "nn"})
        m.params["margin"] = Param(Fraction(2, D), "2/D: distinct hypercube symbols (D = 4^e >= ceil(log2 |Sigma|))")
        return m
    return _lean(n, S, L, queries, e1, e2, fmt)


def lean_design(n: int, S: int, eta1: Fraction | None = None, eta2: Fraction | None = None,
                fmt: Format | None = None) -> tuple[Any, Any, Format, Fraction, Fraction, str]:
    """(symbol code, address code, format, eta1, eta2, how the format was chosen) of the lean build."""
    code = smallest_code(S, Fraction(1, 4))
    code2 = smallest_code(2 * n, Fraction(1, 4))
    T, gram = 2 * n - 1, Fraction(code.gram_scale)

    mu1, mu2 = (Fraction(code_range(c)[1], code_range(c)[2]) for c in (code, code2))
    gram2 = Fraction(code2.gram_scale)
    floats = [float_arithmetic(a) for a in FLOAT_ARITHMETICS]  # the float half of a robust build's condition

    def layer1(f: Format, e: Fraction) -> bool:
        # robust: the row bound also in exact reals, float64 and float32, every key of the prefix
        # at most eta1 mu1, the flag term eta1 c_label inside the dot product's error bound
        return lean_holds(f, e, code, n) is not None and (eta1 is not None or RetrieveByPosition.selects(
            floats, e, mu1, T, gram, Fraction(1)))

    def layer2(f: Format, e: Fraction) -> bool:
        return layer2_holds(f, e, code2, T) and (eta2 is not None or RetrieveByPosition.selects(floats, e, mu2, T, gram2))

    def check(f: Format) -> tuple[Fraction, Fraction] | None:
        if eta1 is not None:
            e1 = Fraction(eta1) if layer1(f, Fraction(eta1)) else None
        else:
            e1 = smallest_grid_eta(f, f.step / gram, lambda e: layer1(f, e), Fraction(f.max_value) / 3)
        if e1 is None:
            return None
        if eta2 is not None:
            return (e1, Fraction(eta2)) if layer2(f, Fraction(eta2)) else None
        e2 = smallest_grid_eta(f, f.step / gram2, lambda e: layer2(f, e))
        return None if e2 is None else (e1, e2)

    if fmt is None:
        fmt, (e1, e2) = fewest_bits(check, max_bits=48, err=MQARError)
        how = "fewest-bit binary format for which both layers' sufficient conditions hold for some grid eta"
    else:
        found = check(fmt)
        if found is None:
            raise MQARError(f"precision {fmt.name}: no representable eta1, eta2 satisfy the sufficient conditions; "
                            + smallest_works(check, MQARError))
        (e1, e2), how = found, "given"
    return code, code2, fmt, e1, e2, how


def _lean(n: int, S: int, L: int, queries: str, eta1: Fraction | None, eta2: Fraction | None, fmt: Format | None) -> CompiledModel:
    code, code2, fmt, e1, e2, how = lean_design(n, S, eta1, eta2, fmt)
    robust = eta1 is None and eta2 is None  # a given eta is checked in the format only
    T, gram = 2 * n - 1, Fraction(code.gram_scale)
    m_y = max(1, (L - 1).bit_length())
    lay = Layout()
    for name, width in (("X", code.k), ("Y", m_y), ("FX", 1), ("P2", code2.k), ("A", code2.k), ("R", code2.k),
                        ("S", code2.k), ("Z", m_y), ("B", m_y)):
        lay.add(name, width)
    mb = ModelBuilder(lay, n_layers=2, d_vocab=S + L, n_ctx=T)
    mb.token_code("X", 0, S, code)
    mb.token_rows(range(S, S + L), "Y", np.array([[(v >> j) & 1 for j in range(m_y)] for v in range(L)], dtype=np.int64))
    mb.token_rows(range(S, S + L), "FX", np.ones((L, 1), dtype=np.int64))
    # FX = 1 on the second half [n, T) as one run (no dense positional rows): its input positions get
    # FX = 1, its labels FX = 1 + 1 = 2 (their logit -2 eta1, further below the target; docs/nearest-neighbor.md)
    mb.position_code("FX", n, T - n, second_half_flag(T - n))
    address_codes(mb, code2, T, "P2")
    RetrieveByMatch("X", "FX", "A", "R", e1, Fraction(1), gram, value_scale(code2)).emit(mb, 0)
    address_mlp(mb, code2)
    address_tail(mb, "S", "P2", "Y", e2, Fraction(code2.gram_scale), L)
    lo, hi, s = code_range(code)
    model = mb.build(
        answers=list(range(L)), vocab=[f"s{i}" for i in range(S)] + [f"y{v}" for v in range(L)],
        construction="mqar", theorem=THEOREM, n=n, precision=fmt.name, answer_positions=answer_positions(n, queries),
        task_params={"n": n, "alphabet": S, "labels": L, "queries": queries, "variant": "lean"},
        params={
            "k": Param(int(code.k), f"symbol code width ({code.family}, |Sigma| symbols, mu <= 1/4)"),
            "k2": Param(int(code2.k), f"address code width ({code2.family}, 2N positions)"),
            "mu": Param(Fraction(hi, s), "proved largest off-diagonal <C(s), C(s')>"),
            "c_label": Param(1, "the flag removes labels and second-half inputs: their logits <= 0 < eta1 (1 - mu)"),
            "eta": Param(e1, "eta1: smallest grid value whose worst row of the longest prefix is >= 3/4 / <= 1/4"),
            "eta2": Param(e2, "smallest multiple of step/gram2 whose worst row of 2N - 1 keys is >= 3/4 / <= 1/4"),
            "tau": Param(1 - Fraction(hi, s), "1 - mu: the target's lead over every other first-half symbol"),
            "d_model": Param(lay.d_model, "k_Sigma + 3m + 1 + 4 k2"),
            "precision": Param(fmt.name, how),
            "precision_bits": Param(getattr(fmt, "bits", None), "bits of one number in the format"),
            "arithmetics": Param(designed_for(fmt, robust), "the arithmetics the sufficient conditions were checked "
                                 "in (the certificate of the content-dependent first layer is fixed-point only)"),
        })
    return model
