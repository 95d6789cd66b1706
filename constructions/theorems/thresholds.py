"""Thresholds of k-sparse features with two layers of width O(log N) (Theorem 13, App. F.3 of
Bhattamishra et al. 2024), and the named cases Disjointness, k-DNF and k-CNF.

Task, for x in {0, 1}^N: Th_b(g_1(x_{I_1}), .., g_m(x_{I_m})) = [sum_j g_j(x_{I_j}) > b], m <= N
features, index sets I_j of size <= k (ordered), g_j : {0,1}^{|I_j|} -> {0,1} (definitions and
inputs: :mod:`exactformer.constructions.theorems.boolean_tasks`).

Construction (equations reconstructed in docs/thresholds.md). A BOS token precedes the bits, so
T = N + 1; position i >= 1 holds x_i (as -1/+1) and hosts feature j = i. T(0..N) is a position code::

    slots:  x | y_1 .. y_k | g | z | key (r) | q_1 .. q_k (r each) | type (G, when G >= 2 types)
    positional: key = T(i); q_h = T(I_i[h]) (T(0), BOS's vector, for unused slots); type signs
    layer 0: k heads RetrieveByPosition(query=q_h, key=key, value=x -> y_h)  (y_h(i) = x_{I_i[h]})
             PatternMLP(y, type -> g): g_i = g_i(x_{I_i}) (0 at BOS and without a feature)
    layer 1: UniformAverage(g -> z): z = a * sum_j g_j
    readout: ThresholdReadout(z): answer 1 iff S >= b + 1 (margin c a / 2)

Features listed one by one are capped at N = 2^22; features given as runs (Disjointness, or
``features=[{"count": .., "index": .., "step": .., "g": ..}, ..]``) are held as a rule, and the
query code blocks are its runs, so nothing of N rows is built, certified or saved (N up to 2^30).

Guarantee: correct whenever every first-layer row is within the pattern MLP's tolerance
1/(2 max arity) of one-hot and the uniform weight a is positive.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.average import UniformAverage
from exactformer.constructions.blocks.mlp import PatternMLP
from exactformer.constructions.blocks.readout import ThresholdReadout
from exactformer.constructions.blocks.retrieve import RetrieveByPosition
from exactformer.constructions.theorems.boolean_tasks import (
    MAX_K,
    MAX_LISTED,
    Features,
    FeatureRuns,
    ThresholdError,
    ThresholdTask,
    disjointness_features,
    features_of,
    literal_features,
    random_clauses,
)
from exactformer.constructions.core.ir import CompiledModel, Param
from exactformer.constructions.codes.positions import CodeView
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.runs import RunConstantCode
from exactformer.constructions.design.two_layer import (arithmetics_param, code_for, etas_by_mode, kc_equivalent, paper_eta,
                                                        readout, resolve)
from exactformer.constructions.design.precision_search import design_arithmetics
from exactformer.precision import Format

THEOREM = "Thm 13 (App. F.3), Bhattamishra et al. 2024"
CLAIM = Claim("P1 Thm 13 (App. F.3)", "2", "k (TF^2_{m,p,k})", "O(log N)", "O(log N)", "O((log N)^3) for constant k")


def _formula_rows(note: str) -> SizeRows:
    """A particular formula has no lower bound of its own: the family's bounds are for the class."""
    return SizeRows("threshold", bounds=(), note=note)
MAX_N = 1 << 30  # features given as runs (Disjointness): built and certified in O(runs), whatever N is
MAX_N_LISTED = MAX_LISTED  # features listed one by one (index arrays of N rows)
BOS = 2  # token id of [BOS]; tokens 0 and 1 are the bits
MAX_RUN_BLOCKS = 16  # more query-code runs than this per head (listed features) -> one table-indexed block


def _code_runs(mb: ModelBuilder, slot: str, code: Any, features: Features, h: int) -> None:
    """Position code blocks giving row i the code vector of head ``h``'s query index at i: maximal
    affine (slope 1) runs and constant runs (:meth:`Features.code_runs`), or, for features listed
    one by one with more than MAX_RUN_BLOCKS runs, one table-indexed view."""
    runs = features.code_runs(h, MAX_RUN_BLOCKS)
    if runs is None:
        mb.position_code(slot, 0, features.n + 1, CodeView(code, "table", features.query_table(h)))
        return
    for kind, i, j, v in runs:
        if kind == "affine":
            mb.position_code(slot, i, j - i, code, v)
        else:
            mb.position_code(slot, i, j - i, CodeView(code, "constant", v))


class TypeSigns(RunConstantCode):
    """Type columns as a 'code': vector i is +1 at its type's coordinate, -1 elsewhere (all -1 for
    positions without a feature); the types held as runs (``starts``, ``types``: positions
    [starts[r], starts[r+1]) have type ``types[r]``) over ``n`` positions, so the run certificate
    reads one vector per run."""

    family = "type-signs"

    def __init__(self, starts: np.ndarray, types: np.ndarray, G: int, n: int):
        self.types = np.asarray(types, dtype=np.int64)
        super().__init__(starts, np.where(self.types[:, None] == np.arange(G)[None, :], 1, -1).astype(np.int8), n)

    def describe(self) -> dict:
        return {"family": self.family, "G": self.k, "n": self.n, "runs": int(len(self.starts))}


def _check_n(n: Any, limit: int = MAX_N_LISTED, even: bool = False) -> None:
    if (isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= limit
            or (even and n % 2)):
        raise ThresholdError(f"n must be an{' even' if even else ''} integer in [2, 2^{limit.bit_length() - 1}], got {n!r}")


def _build(n: int, features: Sequence[Any], b: int | None, g: Any, k: int | None, positions: Any, eta: Any,
           precision: Any, max_inner: Fraction, seed: int, kind: str, extra: dict, arithmetics: Any = None,
           b_at: Any = None) -> CompiledModel:
    """The Theorem 13 model; ``b_at(N')`` (None: features given by the caller) is the threshold b of
    the same kind of default features at a smaller N', for a refused ``arithmetics`` design."""
    _check_n(n, MAX_N)
    n = int(n)
    feats = features if isinstance(features, Features) else features_of(n, list(features), g, k)
    if not isinstance(feats, FeatureRuns):
        _check_n(n)
    m, k, types = feats.m, feats.k, feats.types
    b = m // 2 if b is None else b
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b <= m:
        raise ThresholdError(f"b must be an integer in [0, m] = [0, {m}] (m = number of features), got {b!r}")
    b, T = int(b), n + 1
    code, mu = code_for(T, positions, max_inner, seed, ThresholdError)
    r, gram = int(code.k), Fraction(code.gram_scale)
    tol = Fraction(1, 2 * max(1, max([t[0] for t in types], default=1)))
    asked = design_arithmetics(arithmetics, ThresholdError)

    def smaller(n2: int) -> tuple[int, Fraction, Fraction, int]:  # the design's inputs at a smaller N
        c2, mu2 = code_for(n2 + 1, positions if isinstance(positions, str) else "auto", max_inner, seed, ThresholdError)
        return n2 + 1, Fraction(c2.gram_scale), mu2, b_at(n2)

    fmt, eta, notes = resolve(n, T, gram, mu, eta, precision, tol, Fraction(0), b, ThresholdError, asked,
                              smaller if b_at is not None else None)
    a, c, l0 = readout(fmt, T, b, notes["robust"])
    G = len(types)

    L = Layout()
    L.add("x", 1)
    ys = [f"y{h + 1}" for h in range(k)]
    for s in ys:
        L.add(s, 1)
    for s, w in (("g", 1), ("z", 1), ("key", r)):
        L.add(s, w)
    qs = [f"q{h + 1}" for h in range(k)]
    for s in qs:
        L.add(s, r)
    if G >= 2:
        L.add("type", G)
    mb = ModelBuilder(L, n_layers=2, d_vocab=3, n_ctx=T)
    mb.token_rows([0, 1, BOS], "x", np.array([[-1], [1], [0]]))  # BOS: x = 0
    mb.position_code("key", 0, T, code)
    for h in range(k):
        _code_runs(mb, qs[h], code, feats, h)
        RetrieveByPosition(qs[h], "key", ("x",), (ys[h],), eta, gram).emit(mb, 0)
    if G >= 2:
        mb.position_code("type", 0, T, TypeSigns(*feats.type_runs(), G, T))
    PatternMLP(tuple(ys), "g", tuple(t[0] for t in types), tuple(tuple(t[1]) for t in types),
               "type" if G >= 2 else "").emit(mb, 0)
    UniformAverage("g", "z").emit(mb, 1)
    ThresholdReadout("z", Fraction(c), l0, yes=1).emit(mb)
    model = mb.build(answers=[0, 1], vocab=["0", "1", "BOS"], construction=kind, theorem=THEOREM, n=n,
                     precision=fmt.name)
    bits = int(getattr(fmt, "bits", 64))
    kc = kc_equivalent(fmt, T)
    exact = fmt.is_exact
    eta_modes = etas_by_mode(fmt, eta, notes, gram, mu, T, tol, Fraction(0))
    model.params = {
        "k": Param(r, f"position code dimension r ({getattr(code, 'family', type(code).__name__)}; the paper's r = O(log N))"),
        "sparsity": Param(k, "k = max |I_j| (heads)"),
        "features": Param(m, "m <= N"),
        "function_types": Param(G, "distinct (arity, truth table) pairs"),
        "b": Param(b, "answer = [sum_j g_j > b]"),
        "mu": Param(mu, "proved (or certified) largest off-diagonal <T(i), T(j)>"),
        "eta": Param(eta, notes["eta"]),
        "eta_one_hot": Param(eta_modes["one-hot"],
                             "smallest grid eta with every worst-case row exactly one-hot"),
        "eta_threshold": Param(eta_modes["threshold"],
                               f"smallest grid eta with (1 - target) + rest <= 1/(2 max arity) = {tol}"),
        "Kc": Param(None if kc is None else round(kc, 6), "App. B.2 constant of the format: step = (N+1)^-Kc"),
        "eta_paper": Param(None if kc is None else round(paper_eta(T, kc), 6), "ln N + Kc ln(2N) (App. F.2, N -> N+1)"),
        "uniform_weight": Param(a, "a = div(e(0), sat((N+1) e(0))) under the format"),
        "readout_gain": Param(c, "c = largest power of two <= min(1/a, max)"),
        "readout": Param(f"logit_1 = {c} z, logit_0 = {l0}", "l0 between c b a and c (b+1) a for the format's a (and 1/(N+1) when robust): answer 1 iff S >= b + 1"),
        "d_model": Param(model.d_model, "3 + k + r(k + 1) + (G if G >= 2 else 0)"),
        "d_head": Param(r, "r (layer 1); 1 (layer 2)"),
        "d_mlp": Param(model.shape().layers[0][2], "2 * sum over types of #{u : g(u) = 1}"),
        "layers": Param(2, "Thm 13"),
        "heads": Param(k, "k heads in layer 1, one in layer 2"),
        "precision": Param(fmt.name, notes["precision"]),
        "precision_bits": Param(bits, "bits of one number in the format (sign included)"),
        "arithmetics": arithmetics_param(fmt, notes),
        "size_bits": Param(model.size_bits(bits), "parameters (code rows generated, not stored) x precision_bits"),
        "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2(N+1)) / mu^2) (Lemma 2)"),
    }
    model.task_params = {"n": n, "kind": kind, "b": b, "k": k, **feats.task_params(),
                         "types": [[t[0], list(t[1])] for t in types],
                         "code": code.describe() if hasattr(code, "describe") else {}, **extra}
    model.position_code = code
    if exact:
        model.weights_raw(fmt)
    return model


@construction("threshold", task=ThresholdTask("threshold"), theorem=THEOREM, claim=CLAIM,
              sizes=_formula_rows("default: N seeded random 2-subsets, g = parity, b = m // 2"))
def threshold_features(n: int, features: list | None = None, b: int | None = None, g: Any = None,
                       k: int | None = None, positions: str = "auto", eta: Fraction | str | None = None,
                       precision: Format | str | None = None, max_inner: Fraction = Fraction(1, 4), seed: int = 0,
                       feature_seed: int = 0, arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """Theorem 13's two-layer transformer for Th_b over k-sparse features.

    Parameters
    ----------
    n : int in [2, 2^30] (at most 2^22 unless the features are runs). Input length N (x in {0, 1}^N).
    features : list of m <= N items: an index set (distinct ints in [1, N], |I_j| <= k) or a pair
        [index set, truth table]; or a list of runs {"count": c, "index": [i_1, ..], "step": [0|1,
        ..], "g": table}, the next c features reading (i_1 + step_1 t, ..), t = 0 .. c - 1 (held
        as a rule, so N may reach 2^30). Feature j is computed at position j. Default: N seeded
        random k-subsets (k = 2) with g = parity. JSON schema: docs/thresholds.md.
    b : int in [0, m]. The answer is [sum_j g_j > b]. Default m // 2.
    g : truth table (a string of 0/1, length 2^|I_j|, first input bit most significant) for the
        features that carry none.
    k : int in [1, 8]. The sparsity bound (= heads). Default max |I_j|.
    positions : auto | reed-solomon | random | onehot.
    eta : robust | threshold | minimal | a number > 0 (see equality).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32. Default: fewest-bit binary format.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    feature_seed : seed of the default random features.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3; see equality (Python: also a tuple).
    """
    _check_n(n, MAX_N)
    default = features is None and b is None
    if features is None:
        _check_n(n)
        kk = 2 if k is None else k
        if isinstance(kk, bool) or not isinstance(kk, (int, np.integer)) or not 1 <= kk <= min(MAX_K, max(1, n)):
            raise ThresholdError(f"k must be an integer in [1, {min(MAX_K, n)}], got {kk!r}")
        rng = np.random.default_rng(feature_seed)
        features = [sorted((rng.choice(n, size=int(kk), replace=False) + 1).tolist()) for _ in range(n)]
        if g is None:
            g = [bin(i).count("1") % 2 for i in range(1 << int(kk))]  # parity
    if isinstance(g, str):
        if not g or set(g) - {"0", "1"}:
            raise ThresholdError(f"g must be a truth table of 0/1 characters, got {g!r}")
        g = [int(ch) for ch in g]
    return _build(n, features, b, g, k, positions, eta, precision, max_inner, seed, "threshold", {}, arithmetics,
                  (lambda n2: n2 // 2) if default else None)


@construction("disjointness", task=ThresholdTask("disjointness"), theorem=THEOREM, claim=CLAIM,
              sizes=SizeRows("disjointness", build_max_n=MAX_N, max_n=MAX_N, built_to=MAX_N))
def disjointness(n: int, positions: str = "auto", eta: Fraction | str | None = None,
                 precision: Format | str | None = None, max_inner: Fraction = Fraction(1, 4), seed: int = 0,
                 arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """DISJ(x) = 1 iff no i in [1, N/2] has x_i = x_{i+N/2} = 1: the 2-CNF AND_i NAND(x_i, x_{i+N/2}),
    Th_{N/2-1} over the N/2 NAND features (Theorem 13).

    Parameters
    ----------
    n : even int in [2, 2^30]. Input length N (the features are one run: built in O(1) of N).
    positions : auto | reed-solomon | random | onehot.
    eta : robust | threshold | minimal | a number > 0 (see equality).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32. Default: fewest-bit binary format.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3; see equality (Python: also a tuple).
    """
    _check_n(n, MAX_N, even=True)
    h = n // 2
    return _build(n, disjointness_features(int(n)), h - 1, None, None, positions, eta, precision, max_inner, seed, "disjointness", {},
                  arithmetics, lambda n2: n2 // 2 - 1)


def _literal(n: int, clauses: Any, k: int | None, clause_seed: int, kind: str, rest: tuple,
             arithmetics: Any) -> CompiledModel:
    _check_n(n)
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K):
        raise ThresholdError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
    default = clauses is None
    if clauses is None:
        clauses = random_clauses(int(n), max(1, int(n) // 2), 3 if k is None else int(k), clause_seed)
    feats, m = literal_features(int(n), clauses, kind, k)
    b = 0 if kind == "dnf" else m - 1
    b_at = (lambda n2: 0) if kind == "dnf" else (lambda n2: max(1, n2 // 2) - 1)  # default: N // 2 clauses
    return _build(n, feats, b, None, k, *rest, kind, {"clauses": [[int(v) for v in c] for c in clauses]}, arithmetics,
                  b_at if default else None)


@construction("dnf", task=ThresholdTask("dnf"), theorem=THEOREM, claim=CLAIM,
              sizes=_formula_rows("default: N/2 seeded random 3-literal terms"))
def k_dnf(n: int, terms: list | None = None, k: int | None = None, clause_seed: int = 0, positions: str = "auto",
          eta: Fraction | str | None = None, precision: Format | str | None = None, max_inner: Fraction = Fraction(1, 4),
          seed: int = 0, arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """A k-DNF: OR of at most N terms, each an AND of at most k literals: Th_0 over AND features.

    Parameters
    ----------
    n : int in [2, 2^22]. Input length N.
    terms : list of literal lists (+v = x_v, -v = NOT x_v, v in [1, N]), e.g. "1,-2;3,4" on the
        command line. Default: N // 2 seeded random terms of k = 3 literals.
    k : int in [1, 8]. The largest term. Default: the longest term.
    clause_seed : seed of the default random terms.
    positions : auto | reed-solomon | random | onehot.
    eta : robust | threshold | minimal | a number > 0 (see equality).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3; see equality (Python: also a tuple).
    """
    return _literal(n, terms, k, clause_seed, "dnf", (positions, eta, precision, max_inner, seed), arithmetics)


@construction("cnf", task=ThresholdTask("cnf"), theorem=THEOREM, claim=CLAIM,
              sizes=_formula_rows("default: N/2 seeded random 3-literal clauses"))
def k_cnf(n: int, clauses: list | None = None, k: int | None = None, clause_seed: int = 0, positions: str = "auto",
          eta: Fraction | str | None = None, precision: Format | str | None = None, max_inner: Fraction = Fraction(1, 4),
          seed: int = 0, arithmetics: str | tuple[str, ...] | None = None) -> CompiledModel:
    """A k-CNF: AND of at most N clauses, each an OR of at most k literals: Th_{m-1} over OR features.

    Parameters
    ----------
    n : int in [2, 2^22]. Input length N.
    clauses : list of literal lists (+v = x_v, -v = NOT x_v, v in [1, N]), e.g. "1,-2;3,4" on the
        command line. Default: N // 2 seeded random clauses of k = 3 literals.
    k : int in [1, 8]. The largest clause. Default: the longest clause.
    clause_seed : seed of the default random clauses.
    positions : auto | reed-solomon | random | onehot.
    eta : robust | threshold | minimal | a number > 0 (see equality).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32.
    max_inner : the position code's largest inner product mu, in (0, 1).
    seed : seed of a random position code.
    arithmetics : a comma list of real, float64, float32, float16, bfloat16, float8_e5m2,
        float8_e4m3; see equality (Python: also a tuple).
    """
    return _literal(n, clauses, k, clause_seed, "cnf", (positions, eta, precision, max_inner, seed), arithmetics)
