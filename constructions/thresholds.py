"""Thresholds of k-sparse features with two layers of width O(log N) (Theorem 13, App. F.3 of
Bhattamishra et al. 2024), and the named shortcuts Disjointness, k-DNF and k-CNF.

Task, for x in {0, 1}^N:  Th_b(g_1(x_{I_1}), .., g_m(x_{I_m})) = [sum_j g_j(x_{I_j}) > b], with
m <= N features, index sets I_j subset of [N] = {1..N} of size <= k (ordered: g_j reads
x_{I_j[0]}, .., x_{I_j[r-1]}), g_j : {0,1}^{|I_j|} -> {0,1}, and g_j = 0 when I_j is empty.

Construction (App. F.3; equations reconstructed in docs/thresholds.md). The input is mapped to
{-1, 1} (bit 0 -> -1, bit 1 -> +1) and a BOS token is prepended, so T = N + 1 positions:
position 0 is BOS, position i >= 1 holds x_i and hosts feature j = i (positions past m host no
feature). T(0..N) is a position code of dimension r (signs; 1/r folded into W_Q). Columns::

    [ x | y_1..y_k | g | z | key code T(i) (r) | query code of head 1 (r) | .. | head k (r) | type signs (G) ]

* position i:  x = +-1 (0 for BOS), key code sigma(i), query block h = sigma(I_i[h]) for h < |I_i|
  and sigma(0) (BOS) for the unused slots; type signs (only when G >= 2 distinct feature
  functions are used): +1 in the column of the feature's function, -1 elsewhere.
* layer 1, k heads, d_head = r: head h has Q = (eta/r) sigma(query block h), K = sigma(key code),
  V = x -> column y_h. With eta large enough every rounded row is exactly one-hot, so
  y_h(i) = x_{I_i[h]} (0 for unused slots: BOS has x = 0).
* MLP 1: for every function type tau (arity r_tau, truth table t_tau) and every pattern u with
  t_tau(u) = 1, with s_h = 2u_h - 1 and t = sum_{h < r_tau} s_h y_h - (r_tau - 1) [+ (type_tau - 1)]:
      g += relu(2t) - relu(2t - 1)          (= 1 iff y matches u and the type is tau, else 0)
  so column g holds g_i(x_{I_i}) exactly (0 at BOS and at positions without a feature). It
  tolerates |y_h - x| <= 1/(2 r_tau).
* layer 2, one head, query 0: uniform weight a = round(1/(N+1)), V = g -> column z = a * S,
  S = sum_j g_j.
* readout: logit_1 = c z, logit_0 = (2b + 1) c a / 2 with the largest power of two c <= 1/a,
  so the answer is 1 iff S >= b + 1 (margin c a / 2).

Shortcuts: ``disjointness(n)`` (DISJ(x) = 1 iff no i <= N/2 has x_i = x_{i+N/2} = 1: the 2-CNF
AND_i NAND(x_i, x_{i+N/2}), i.e. Th_{N/2-1} of NAND features), ``k_dnf(n, terms)`` (OR of ANDs of
literals: Th_0 of AND features) and ``k_cnf(n, clauses)`` (AND of ORs: Th_{m-1} of OR features).
Literals are nonzero ints as in DIMACS: +v is x_v, -v is NOT x_v (v in [1, N]).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from exactformer.constructions.equality import (
    CodeView,
    _code_for,
    _mu,
    code_view,
    gram_scale,
    kc_equivalent,
    paper_eta,
    resolve_precision_and_eta,
    smallest_eta,
    readout,
)
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
    sequence_rows,
)
from exactformer.precision import Format

NAME = "threshold"
NAMES = ("threshold", "disjointness", "dnf", "cnf")
THEOREM = "Thm 13 (App. F.3), Bhattamishra et al. 2024"
MAX_N = 1 << 22
MAX_K = 8  # heads = k; the MLP has up to 2 * G * 2^k units
BOS = 2  # token id of [BOS]; tokens 0 and 1 are the bits
MAX_RUN_BLOCKS = 16  # more query-code runs than this per head -> one table-indexed block


class ThresholdError(ValueError):
    """Bad parameters for the threshold builders, or a bad input to ``encode``."""


# ------------------------------------------------------------------------------------------------
# feature specifications
# ------------------------------------------------------------------------------------------------


def _table_of(g: Any, r: int, where: str) -> tuple[int, ...]:
    """A truth table of length 2^r in itertools.product order (first bit most significant)."""
    if callable(g):
        out = []
        for bits in itertools.product((0, 1), repeat=r):
            v = g(*bits)
            if v not in (0, 1, True, False):
                raise ThresholdError(f"{where}: g must return 0 or 1, got {v!r} for bits {bits}")
            out.append(int(v))
        return tuple(out)
    try:
        t = [int(v) for v in g]
    except TypeError:
        raise ThresholdError(f"{where}: g must be a truth table (sequence of 0/1) or a function of the bits") from None
    if len(t) != 1 << r:
        raise ThresholdError(f"{where}: the truth table has length {len(t)}, expected 2^{r} = {1 << r} for |I| = {r}")
    if any(v not in (0, 1) for v in t):
        raise ThresholdError(f"{where}: truth table entries must be 0 or 1")
    return tuple(t)


def _is_index_set(item: Any) -> bool:
    return isinstance(item, (list, tuple, np.ndarray)) and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in item)


def normalize_features(n: int, features: Sequence[Any], g: Any, k: int | None) -> tuple[np.ndarray, np.ndarray, list]:
    """Validate features; return (index [m, k] int64, 1-based, 0 = unused slot), (type [m] int64,
    -1 for an empty feature), and the list of types [(arity, table)]."""
    if not isinstance(features, (list, tuple)):
        raise ThresholdError("features must be a list of index sets (or of (index set, g) pairs)")
    m = len(features)
    if not 1 <= m <= n:
        raise ThresholdError(f"features: the number of features must lie in [1, n] = [1, {n}], got {m}")
    sets, gs = [], []
    for j, item in enumerate(features):
        if _is_index_set(item):
            sets.append([int(v) for v in item])
            gs.append(None)
        elif isinstance(item, (list, tuple)) and len(item) == 2 and _is_index_set(item[0]):
            sets.append([int(v) for v in item[0]])
            gs.append(item[1])
        else:
            raise ThresholdError(f"features[{j}] must be an index set (ints in [1, {n}]) or a pair (index set, g)")
    kmax = max((len(s) for s in sets), default=0)
    if k is None:
        k = max(1, kmax)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K:
        raise ThresholdError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
    k = int(k)
    types: list[tuple[int, tuple[int, ...]]] = []
    type_id: dict = {}
    tables: dict = {}  # (id(g), arity) -> table, so a shared g is evaluated once
    index = np.zeros((m, k), dtype=np.int64)
    ftype = np.full(m, -1, dtype=np.int64)
    for j, (s, gj) in enumerate(zip(sets, gs)):
        if len(s) > k:
            raise ThresholdError(f"features[{j}]: |I_j| = {len(s)} exceeds k = {k} (allowed: |I_j| <= k)")
        if any(not 1 <= v <= n for v in s):
            bad = next(v for v in s if not 1 <= v <= n)
            raise ThresholdError(f"features[{j}]: index {bad} out of range; indices must lie in [1, n] = [1, {n}]")
        if len(set(s)) != len(s):
            raise ThresholdError(f"features[{j}]: index set {s} repeats an index (indices must be distinct)")
        index[j, : len(s)] = s
        if not s:
            continue
        gg = gj if gj is not None else g
        if gg is None:
            raise ThresholdError(f"features[{j}]: no g given (pass g=... or (index set, g) pairs)")
        tk = (id(gg), len(s))
        if tk not in tables:
            tables[tk] = (gg, _table_of(gg, len(s), f"features[{j}]"))  # keep gg alive while its id is a key
        key = (len(s), tables[tk][1])
        if key not in type_id:
            type_id[key] = len(types)
            types.append(key)
        ftype[j] = type_id[key]
    return index, ftype, types


def feature_values(index: np.ndarray, ftype: np.ndarray, types: list, x: np.ndarray) -> np.ndarray:
    """g_j(x_{I_j}) for x [B, N] in {0, 1}: int64 [B, m] (vectorised per type)."""
    x = np.asarray(x, dtype=np.int64)
    B, m = x.shape[0], len(ftype)
    out = np.zeros((B, m), dtype=np.int64)
    for t, (r, table) in enumerate(types):
        sel = np.flatnonzero(ftype == t)
        if not sel.size:
            continue
        code = np.zeros((B, sel.size), dtype=np.int64)
        for h in range(r):
            code = code * 2 + x[:, index[sel, h] - 1]
        out[:, sel] = np.asarray(table, dtype=np.int64)[code]
    return out


def literal_features(n: int, clauses: Sequence[Sequence[int]], kind: str, k: int | None) -> tuple[list, int]:
    """(index set, table) pairs for DNF terms (AND of literals) or CNF clauses (OR of literals)."""
    if not isinstance(clauses, (list, tuple)) or not clauses:
        raise ThresholdError(f"{'terms' if kind == 'dnf' else 'clauses'} must be a non-empty list of literal lists")
    if len(clauses) > n:
        raise ThresholdError(f"at most n = {n} {'terms' if kind == 'dnf' else 'clauses'} are allowed, got {len(clauses)}")
    out = []
    for j, c in enumerate(clauses):
        if not _is_index_set(c) or not len(c):
            raise ThresholdError(f"clause {j}: must be a non-empty list of nonzero ints (literals +v / -v, v in [1, {n}])")
        lits = [int(v) for v in c]
        if any(v == 0 or abs(v) > n for v in lits):
            bad = next(v for v in lits if v == 0 or abs(v) > n)
            raise ThresholdError(f"clause {j}: literal {bad} out of range; literals are +v or -v with v in [1, n] = [1, {n}]")
        vars_ = [abs(v) for v in lits]
        if len(set(vars_)) != len(vars_):
            raise ThresholdError(f"clause {j}: {lits} repeats a variable")
        if k is not None and len(lits) > k:
            raise ThresholdError(f"clause {j}: {len(lits)} literals exceed k = {k} (allowed: at most k literals)")
        want = tuple(1 if v > 0 else 0 for v in lits)
        table = [0] * (1 << len(lits))
        for idx, bits in enumerate(itertools.product((0, 1), repeat=len(lits))):
            if kind == "dnf":
                table[idx] = int(bits == want)
            else:
                table[idx] = int(bits != tuple(1 - w for w in want))
        out.append((vars_, table))
    return out, len(clauses)


def random_clauses(n: int, m: int, k: int, seed: int) -> list[list[int]]:
    """m random clauses of k distinct variables with random signs (seeded)."""
    rng = np.random.default_rng(seed)
    k = min(k, n)
    out = []
    for _ in range(m):
        vs = rng.choice(n, size=k, replace=False) + 1
        sg = rng.choice([-1, 1], size=k)
        out.append([int(v * s) for v, s in zip(vs, sg)])
    return out


# ------------------------------------------------------------------------------------------------
# builders
# ------------------------------------------------------------------------------------------------


def _check_n(n: Any, even: bool = False) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 2 <= n <= MAX_N or (even and n % 2):
        raise ThresholdError(f"n must be {'an even' if even else 'an'} integer in [2, 2^22], got {n!r}")
    return int(n)


def threshold_features(
    n: int,
    features: Sequence[Any] | None = None,
    b: int | None = None,
    g: Any = None,
    k: int | None = None,
    positions: str | Any = "auto",
    eta: Fraction | int | str | None = None,
    precision: Format | str | None = None,
    max_inner: Fraction = Fraction(1, 4),
    seed: int = 0,
    feature_seed: int = 0,
    _kind: str = "threshold",
    _extra: dict | None = None,
) -> CompiledModel:
    """Build Theorem 13's two-layer transformer for Th_b over k-sparse features.

    Parameters
    ----------
    n : int in [2, 2^22]. Input length N (x in {0, 1}^N).
    features : list of m <= N items, each an index set I_j (distinct ints in [1, N], |I_j| <= k) or a
        pair (I_j, g_j). Feature j is computed at position j. Default: N seeded random k-subsets
        (k = 2) with g = parity (``feature_seed``).
    b : int in [0, m]; the answer is [sum_j g_j > b]. Default m // 2.
    g : the feature function for items without their own: a truth table of length 2^|I_j| in
        itertools.product order (first bit most significant) or a function g(*bits) -> 0/1.
    k : the sparsity bound (= number of heads), in [1, 8]; default max |I_j|.
    positions, eta, precision, max_inner, seed : as for :func:`~exactformer.constructions.equality.equality`
        (eta: None/"one-hot", "threshold" or a number; precision: default the fewest-bit binary format).

    Returns a :class:`CompiledModel` on T = N + 1 tokens ([BOS] then the bits; tokens 0, 1, 2 =
    bit 0, bit 1, BOS); answers [0, 1].
    """
    n = _check_n(n)
    if features is None:
        kk = 2 if k is None else k
        if isinstance(kk, bool) or not isinstance(kk, (int, np.integer)) or not 1 <= kk <= min(MAX_K, n):
            raise ThresholdError(f"k must be an integer in [1, {min(MAX_K, n)}], got {kk!r}")
        rng = np.random.default_rng(feature_seed)
        features = [sorted((rng.choice(n, size=int(kk), replace=False) + 1).tolist()) for _ in range(n)]
        if g is None:
            g = lambda *bits: sum(bits) % 2  # noqa: E731
    index, ftype, types = normalize_features(n, list(features), g, k)
    m, k = index.shape
    if b is None:
        b = m // 2
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b <= m:
        raise ThresholdError(f"b must be an integer in [0, m] = [0, {m}] (m = number of features), got {b!r}")
    b = int(b)
    T = n + 1
    code = _code_for(T, positions, Fraction(max_inner), seed, ThresholdError)
    r = int(code.k)
    mu = _mu(code)
    rmax = max([t[0] for t in types], default=1)
    tol = Fraction(1, 2 * max(1, rmax))
    precision, eta, notes = resolve_precision_and_eta(
        n, T, gram_scale(code), mu, eta, precision, tol, Fraction(0), b, ThresholdError)
    a, c, l0 = readout(precision, T, b)
    model = _assemble(n, code, r, k, index, ftype, types, eta * gram_scale(code), c, l0)
    model.construction = _kind
    model.precision = precision.name
    bits = int(getattr(precision, "bits", 64))
    kc = kc_equivalent(precision, T)
    ok = precision.is_exact
    G = len(types)
    model.params = {
        "k": Param(r, f"position code dimension r ({code.family}; the paper's r = O(log N))"),
        "sparsity": Param(k, "k = max |I_j| (heads)"),
        "features": Param(m, "m <= N"),
        "function_types": Param(G, "distinct (arity, truth table) pairs"),
        "b": Param(b, "answer = [sum_j g_j > b]"),
        "mu": Param(mu, "proved (or certified) max off-diagonal <T(i),T(j)>"),
        "eta": Param(eta, notes["eta_formula"]),
        "eta_one_hot": Param(smallest_eta(precision, gram_scale(code), mu, T, "one-hot", tol) if ok else None,
                             "smallest grid eta with every worst-case row exactly one-hot"),
        "eta_threshold": Param(smallest_eta(precision, gram_scale(code), mu, T, "threshold", tol) if ok else None,
                               f"smallest grid eta with (1 - target) + rest <= 1/(2 max arity) = {tol}"),
        "Kc": Param(None if kc is None else round(kc, 6), "App. B.2 constant of the format: step = (N+1)^-Kc"),
        "eta_paper": Param(None if kc is None else round(paper_eta(T, kc), 6), "ln N + Kc ln(2N) (App. F.2, N -> N+1)"),
        "uniform_weight": Param(a, "a = div(e(0), sat((N+1) e(0))) under the format"),
        "readout_gain": Param(c, "c = largest power of two <= min(1/a, max)"),
        "readout": Param(f"logit_1 = {c} z, logit_0 = (2b+1) c a / 2 = {l0}", "answer 1 iff S = z/a >= b + 1 (margin c a / 2)"),
        "d_model": Param(model.d_model, "3 + k + r(k + 1) + (G if G >= 2 else 0)"),
        "d_head": Param(r, "r (layer 1); 1 (layer 2)"),
        "d_mlp": Param(model.blocks[0].mlp.d_mlp, "2 * sum over types of #{u : g(u) = 1}"),
        "layers": Param(2, "Thm 13"),
        "heads": Param(k, "k heads in layer 1, one in layer 2"),
        "precision": Param(precision.name, notes["precision_formula"]),
        "precision_bits": Param(bits, "bits of one number in the format (sign included)"),
        "size_bits": Param(model.size_bits(bits), "parameters (code rows generated, not stored) x precision_bits"),
        "index_table_entries": Param(_table_entries(model), "query-code indices stored in table views (0 when every "
                                                                 "block is an affine or constant run)"),
        "paper_k": Param(getattr(code, "paper_k", None), "ceil(8 ln(2(N+1)) / mu^2) (Lemma 2)"),
    }
    model.task_params = {"n": n, "kind": _kind, "b": b, "k": k, "feature_index": index, "feature_type": ftype,
                         "types": [[t[0], list(t[1])] for t in types],
                         "code": code.describe() if hasattr(code, "describe") else {}}
    model.task_params.update(_extra or {})
    model.code = code  # type: ignore[attr-defined]
    if precision.is_exact:
        for name, t in model.tensors().items():
            t.raw(precision)
    return model


def disjointness(n: int, **kwargs: Any) -> CompiledModel:
    """DISJ(x) = 1 iff no i in [1, N/2] has x_i = x_{i+N/2} = 1 (N even): the 2-CNF
    AND_i (NOT x_i OR NOT x_{i+N/2}), i.e. Th_{N/2-1} over the N/2 NAND features."""
    n = _check_n(n, even=True)
    _no(kwargs, ("features", "b", "g"), "disjointness")
    h = n // 2
    feats = [[i, i + h] for i in range(1, h + 1)]
    return threshold_features(n, feats, b=h - 1, g=[1, 1, 1, 0], _kind="disjointness", **kwargs)


def k_dnf(n: int, terms: Sequence[Sequence[int]] | None = None, k: int | None = None, clause_seed: int = 0,
          **kwargs: Any) -> CompiledModel:
    """OR of at most N terms, each an AND of at most k literals (+v = x_v, -v = NOT x_v):
    Th_0 over AND features. Default: N // 2 seeded random terms of k = 3 literals."""
    return _literal_builder(n, terms, k, clause_seed, "dnf", kwargs)


def k_cnf(n: int, clauses: Sequence[Sequence[int]] | None = None, k: int | None = None, clause_seed: int = 0,
          **kwargs: Any) -> CompiledModel:
    """AND of at most N clauses, each an OR of at most k literals: Th_{m-1} over OR features.
    Default: N // 2 seeded random clauses of k = 3 literals."""
    return _literal_builder(n, clauses, k, clause_seed, "cnf", kwargs)


def _literal_builder(n, clauses, k, clause_seed, kind, kwargs) -> CompiledModel:
    n = _check_n(n)
    _no(kwargs, ("features", "b", "g"), kind)
    if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= MAX_K):
        raise ThresholdError(f"k must be an integer in [1, {MAX_K}], got {k!r}")
    if clauses is None:
        clauses = random_clauses(n, max(1, n // 2), 3 if k is None else int(k), clause_seed)
    feats, m = literal_features(n, clauses, kind, k)
    b = 0 if kind == "dnf" else m - 1
    return threshold_features(n, feats, b=b, k=k, _kind=kind,
                              _extra={"clauses": [[int(v) for v in c] for c in clauses]}, **kwargs)


def _no(kwargs: dict, names: tuple, who: str) -> None:
    for nm in names:
        if nm in kwargs:
            raise ThresholdError(f"{who}() takes no {nm!r} argument (it is fixed by the function)")


def parse_clauses(text: str) -> list[list[int]]:
    """'1,-2;3,4' -> [[1, -2], [3, 4]] (for the CLI's --clauses)."""
    try:
        return [[int(v) for v in part.split(",") if v.strip()] for part in text.split(";") if part.strip()]
    except ValueError:
        raise ThresholdError(f"--clauses must look like '1,-2;3,4' (literals +v / -v, clauses separated by ';'), got {text!r}") from None


# ------------------------------------------------------------------------------------------------
# assembly
# ------------------------------------------------------------------------------------------------


def _table_entries(model: CompiledModel) -> int:
    return sum(len(b.code.data) for b in model.pos_embed.blocks if isinstance(b.code, CodeView) and b.code.kind == "table")


def query_indices(index: np.ndarray, n: int, h: int) -> np.ndarray:
    """Code index queried by head h at every position 0..N: I_i[h] (position i hosts feature i),
    0 (BOS's vector) for BOS, positions without a feature and unused slots."""
    out = np.zeros(n + 1, dtype=np.int64)
    m = index.shape[0]
    out[1 : m + 1] = index[:, h]
    return out


def code_blocks_for(code: Any, qidx: np.ndarray, col: int) -> tuple[CodeBlock, ...]:
    """CodeBlocks giving row i the code vector qidx[i]: maximal affine (slope 1) runs and constant
    runs, or one table-indexed view when there are more than MAX_RUN_BLOCKS runs."""
    T = len(qidx)
    runs = []
    i = 0
    while i < T:
        j = i + 1
        if j < T and qidx[j] == qidx[i] + 1:
            while j < T and qidx[j] == qidx[j - 1] + 1:
                j += 1
            runs.append(("affine", i, j))
        else:
            while j < T and qidx[j] == qidx[i]:
                j += 1
            runs.append(("constant", i, j))
        i = j
    base = code_view(code)
    if len(runs) > MAX_RUN_BLOCKS:
        return (CodeBlock(CodeView(code, "table", qidx.copy()), 0, T, col, 0, Fraction(1)),)
    out = []
    for kind, i, j in runs:
        if kind == "affine":
            out.append(CodeBlock(base, i, j - i, col, int(qidx[i]), Fraction(1)))
        else:
            out.append(CodeBlock(CodeView(code, "constant", int(qidx[i])), i, j - i, col, 0, Fraction(1)))
    return tuple(out)


class TypeSigns:
    """Type columns as a 'code': vector i is +1 at its type's coordinate, -1 elsewhere (all -1 for
    positions without a feature)."""

    family = "type-signs"
    is_sign_code = True
    bound = None

    def __init__(self, types_of_position: np.ndarray, G: int):
        self.types = np.asarray(types_of_position, dtype=np.int64)
        self.k, self.n = G, len(self.types)

    def numerators(self, idx) -> np.ndarray:
        t = self.types[np.asarray(idx, dtype=np.int64)]
        return np.where(t[:, None] == np.arange(self.k)[None, :], 1, -1).astype(np.int8)

    signs = numerators

    def describe(self) -> dict:
        return {"family": self.family, "G": self.k, "n": self.n}


def _assemble(n, code, r, k, index, ftype, types, eta_gs, c, l0) -> CompiledModel:
    T = n + 1
    G = len(types)
    c_x, c_y, c_g, c_z, c_key = 0, 1, 1 + k, 2 + k, 3 + k
    c_q = [3 + k + r * (1 + h) for h in range(k)]
    c_type = 3 + k + r * (k + 1)
    d = c_type + (G if G >= 2 else 0)
    m = index.shape[0]

    table = np.zeros((3, d), dtype=np.int64)
    table[0, c_x], table[1, c_x] = -1, 1  # BOS: x = 0
    embed = Embedding(3, d, ExactTensor(table, 1), 0, ())
    blocks = [CodeBlock(code_view(code), 0, T, c_key, 0, Fraction(1))]
    for h in range(k):
        blocks.extend(code_blocks_for(code, query_indices(index, n, h), c_q[h]))
    if G >= 2:
        tpos = np.full(T, -1, dtype=np.int64)
        tpos[1 : m + 1] = ftype
        blocks.append(CodeBlock(TypeSigns(tpos, G), 0, T, c_type, 0, Fraction(1)))
    pos_embed = Embedding(T, d, ExactTensor(np.zeros((0, d), np.int64), 1), 0, tuple(blocks))

    # ---- layer 1: k heads -------------------------------------------------------------------------
    t = np.arange(r)
    scale = eta_gs
    W_Q = np.zeros((k, d, r), np.int64)
    W_K = np.zeros((k, d, r), np.int64)
    W_V = np.zeros((k, d, r), np.int64)
    W_O = np.zeros((k, r, d), np.int64)
    for h in range(k):
        W_Q[h, c_q[h] + t, t] = scale.numerator
        W_K[h, c_key + t, t] = 1
        W_V[h, c_x, 0] = 1
        W_O[h, 0, c_y + h] = 1
    zb = ExactTensor(np.zeros((k, r), np.int64))
    attn1 = Attention(ExactTensor(W_Q, scale.denominator), ExactTensor(W_K), ExactTensor(W_V), ExactTensor(W_O),
                      zb, zb, zb, ExactTensor(np.zeros(d, np.int64)))

    # ---- MLP 1: g = sum over (type, pattern) of relu(2t) - relu(2t - 1) --------------------------------
    units = []
    for tau, (ar, tab) in enumerate(types):
        for idx, bits in enumerate(itertools.product((0, 1), repeat=ar)):
            if tab[idx]:
                units.append((tau, ar, [2 * v - 1 for v in bits]))
    U = max(1, 2 * len(units))
    W_in = np.zeros((d, U), np.int64)
    b_in = np.zeros(U, np.int64)
    W_out = np.zeros((U, d), np.int64)
    for u, (tau, ar, s) in enumerate(units):
        for h in range(ar):
            W_in[c_y + h, 2 * u] = W_in[c_y + h, 2 * u + 1] = 2 * s[h]
        bias = -2 * (ar - 1)
        if G >= 2:
            W_in[c_type + tau, 2 * u] = W_in[c_type + tau, 2 * u + 1] = 2
            bias -= 2
        b_in[2 * u], b_in[2 * u + 1] = bias, bias - 1
        W_out[2 * u, c_g], W_out[2 * u + 1, c_g] = 1, -1
    mlp1 = MLP(ExactTensor(W_in), ExactTensor(b_in), ExactTensor(W_out), ExactTensor(np.zeros(d, np.int64)))

    # ---- layer 2: uniform average of g ----------------------------------------------------------
    z1 = ExactTensor(np.zeros((1, d, 1), np.int64))
    W_V2 = np.zeros((1, d, 1), np.int64)
    W_V2[0, c_g, 0] = 1
    W_O2 = np.zeros((1, 1, d), np.int64)
    W_O2[0, 0, c_z] = 1
    zh = ExactTensor(np.zeros((1, 1), np.int64))
    attn2 = Attention(z1, z1, ExactTensor(W_V2), ExactTensor(W_O2), zh, zh, zh, ExactTensor(np.zeros(d, np.int64)))
    mlp2 = MLP(ExactTensor(np.zeros((d, 1), np.int64)), ExactTensor(np.zeros(1, np.int64)),
               ExactTensor(np.zeros((1, d), np.int64)), ExactTensor(np.zeros(d, np.int64)))

    W_U = np.zeros((d, 2), np.int64)
    W_U[c_z, 1] = c
    model = CompiledModel(
        construction=NAME,
        theorem=THEOREM,
        n=n,
        embed=embed,
        pos_embed=pos_embed,
        blocks=[Block(attn1, mlp1), Block(attn2, mlp2)],
        W_U=ExactTensor(W_U),
        b_U=ExactTensor.from_values([l0, Fraction(0)]),
        vocab=["0", "1", "BOS"],
        answers=[0, 1],
    )
    check_shapes(model)
    return model


# ------------------------------------------------------------------------------------------------
# the task interface
# ------------------------------------------------------------------------------------------------


#: How a natural input x becomes token ids, declared for exports' manifest.json (schema in
#: docs/exports.md): the BOS token, then one token per bit, named "0" or "1". Must agree with :func:`encode`.
ENCODING = {
    "inputs": [{"name": "x", "type": "N ints in {0, 1}"}],
    "tokens": [{"token": "BOS"}, {"for_each": "x", "token": "{}"}],
}


def encode(model: CompiledModel, example: Sequence[int]) -> np.ndarray:
    """x in {0, 1}^N (a list of ints) -> token ids [N + 1]: BOS, then the bits."""
    return encode_arrays(model, sequence_rows([example]))[0]


def encode_batch(model: CompiledModel, examples: Sequence[Sequence[int]]) -> np.ndarray:
    """A batch of natural inputs -> token ids [B, T]."""
    return encode_arrays(model, sequence_rows(examples))


def encode_arrays(model: CompiledModel, x: np.ndarray) -> np.ndarray:
    """x [B, N] in {0, 1} -> ids [B, N + 1]."""
    n = model.n
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[1] != n:
        raise ThresholdError(f"x must have length n = {n} (shape [B, {n}]), got shape {x.shape}")
    if x.size and not np.all((x == 0) | (x == 1)):
        raise ThresholdError("x must have entries in {0, 1}")
    return np.concatenate([np.full((x.shape[0], 1), BOS, dtype=np.int64), x.astype(np.int64)], axis=1)


def rebuild_kwargs(model: CompiledModel) -> dict[str, Any]:
    """Keyword arguments that rebuild ``model``'s function with the same position code (pass them
    with ``precision=...`` to the builder named by ``model.construction``)."""
    tp = model.task_params
    kw: dict[str, Any] = {"positions": model.code}
    kind = tp.get("kind", model.construction)
    if kind in ("dnf", "cnf"):
        kw["terms" if kind == "dnf" else "clauses"] = [list(c) for c in tp["clauses"]]
        kw["k"] = int(tp["k"])
    elif kind == "threshold":
        idx = np.asarray(tp["feature_index"], dtype=np.int64)
        ft = np.asarray(tp["feature_type"], dtype=np.int64)
        types = tp["types"]
        feats: list[Any] = []
        for row, t in zip(idx.tolist(), ft.tolist()):
            if t < 0:
                feats.append([])
            else:
                ar, table = types[t]
                feats.append((row[:ar], list(table)))
        kw.update(features=feats, b=int(tp["b"]), k=int(tp["k"]))
    return kw
