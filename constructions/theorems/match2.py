"""Match2 as one softmax layer (P2 Def. 5.1, Thm 5.2): the EMA head of the compiled Match2 program
lowered to a softmax head of the model IR (docs/ema.md, docs/mpc.md).

Task: Match2(x)_i = 1{∃ j ∈ [N]: x_i + x_j ≡ 0 (mod M)} for x ∈ [0, M)^N, j = i allowed (P2's
quantifier is garbled, "∃j �"; the one-head construction counts j = i, docs/mpc.md). Tokens: BOS
(id M) at position 0, then the residues; the answers are read at positions 1..N.

Construction (b = max(2, ceil(log2 M)) code bits, code(r) in {-1, +1}^b the bits of r)::

    slots:  kcode (b) | qcode (b) | bos (1) | flag (1) | z (1) | ans (1)        d_model = 2b + 4
    token r < M:  kcode = code(r), qcode = code((M - r) mod M), flag = 1;   BOS: bos = 1
    layer 0: MatchHead(query=qcode, key=kcode, default=bos, value=flag -> z), scale eta
             MatchIndicator(z -> ans): ans = relu(2z) - relu(2z - 1)
    readout: SymbolReadout(ans): answer 1 iff ans = 1

One layer, one head (d_head = b + 1). With c_i matches the head computes z_i = c_i round(S/c_i) / S
(fixed-point EMA of the indicator value: 0 without a match, >= 1/2 with 1 <= c_i <= S), so the
answer is [c_i >= 1] whenever the lowering's sufficient condition holds (:meth:`MatchHead.conditions`
at c_max = N: eta > ln S, S >= N, N S <= max). The certificate proves it for all inputs from the
weights: rows depend only on c in [0, N].
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Iterator

import numpy as np
from exactformer.constructions.core.builder import Layout, ModelBuilder
from exactformer.constructions.blocks.match import MatchHead, MatchIndicator, ema_weight
from exactformer.constructions.blocks.readout import SymbolReadout
from exactformer.constructions.core.ir import CompiledModel, IRError, Param
from exactformer.constructions.mpc.applications import (
    match2_adversarial,
    match2_draw,
    match2_truth,
)
from exactformer.constructions.design.precision_search import fewest_bits, given_eta, smallest_works
from exactformer.constructions.core.registry import Claim, SizeRows, construction
from exactformer.constructions.core.spec import ExistsMatch
from exactformer.constructions.core.task import Batch, Domains, Task, TaskError
from exactformer.precision import Format, parse_format

THEOREM = "P2 Thm 5.2 (Def. 5.1), lowered (docs/ema.md)"
MAX_N = 1 << 20
MAX_MODULUS = 1 << 16


class Match2Error(TaskError):
    """Bad parameters for :func:`match2` or a bad input."""


def code_bits(modulus: int) -> int:
    """b = max(2, ceil(log2 M)): the code width (b >= 2 keeps BOS below a match)."""
    return max(2, (modulus - 1).bit_length())


def codes(values: np.ndarray, b: int) -> np.ndarray:
    """code(x) in {-1, +1}^b: bit t of x (t = 0 the least significant) -> +1 if set, else -1."""
    return 2 * ((np.asarray(values, dtype=np.int64)[..., None] >> np.arange(b, dtype=np.int64)) & 1) - 1


class Match2Task(Task):
    """Match2 on residues; natural input: a list of N ints in [0, M). Tokens: BOS (id M), then the
    residues (id = residue). Answers at positions 1..N."""

    ENCODING = {"inputs": [{"name": "x", "type": "N ints in [0, M)"}],
                "tokens": [{"token": "BOS"}, {"for_each": "x", "token": "{}"}]}

    @staticmethod
    def modulus(model: CompiledModel) -> int:
        return int(model.task_params["modulus"])

    def length(self, model: CompiledModel) -> int:
        return model.n + 1

    def domains(self, model: CompiledModel) -> Domains:
        M = self.modulus(model)
        return Domains([np.array([M]), np.arange(M)], np.r_[0, np.ones(model.n, np.int64)])

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        return match2_truth(x, self.modulus(model))

    def spec(self, model: CompiledModel) -> ExistsMatch:
        """[#{j : key(tok_j) = query(tok_i)} >= 1] with key(r) = r, query(r) = (M - r) mod M, and
        neither for BOS."""
        M = self.modulus(model)
        r = np.arange(M, dtype=np.int64)
        return ExistsMatch(np.r_[(M - r) % M, -1], np.r_[r, -1], (0, 1), tuple(range(1, model.n + 1)))

    # ---- encoding -----------------------------------------------------------------------------------
    def encode_arrays(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        M, n = self.modulus(model), model.n
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != n or (x.size and not np.issubdtype(x.dtype, np.integer)):
            raise Match2Error(f"inputs must be integers of shape [B, {n}] (N = {n} residues each), got {x.dtype} "
                              f"{list(x.shape)}")
        if x.size and (x.min() < 0 or x.max() >= M):
            raise Match2Error(f"residues must lie in [0, {M}), got values in [{x.min()}, {x.max()}]")
        return np.concatenate([np.full((len(x), 1), M, dtype=np.int64), x.astype(np.int64)], axis=1)

    def to_arrays(self, model: CompiledModel, examples: list[Any]) -> tuple[np.ndarray]:
        M, n = self.modulus(model), model.n
        rows = []
        for e in examples:
            if not isinstance(e, (list, tuple, np.ndarray)) or len(e) != n or any(
                    isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in e):
                raise Match2Error(f"an input is a list of N = {n} integers in [0, {M})")
            rows.append([int(v) for v in e])
        return (np.asarray(rows, dtype=np.int64).reshape(len(rows), n),)

    # ---- input sources ----------------------------------------------------------------------------------
    def count(self, model: CompiledModel) -> int:
        return self.modulus(model) ** model.n

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[Batch]:
        """Every x in [0, M)^N in counting order (x_1 most significant)."""
        M, n = self.modulus(model), model.n
        for lo in range(0, M**n, batch):
            idx = np.arange(lo, min(M**n, lo + batch), dtype=np.int64)
            yield self.batch(model, (idx[:, None] // M ** np.arange(n - 1, -1, -1, dtype=np.int64)) % M)

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 1024) -> Iterator[Batch]:
        """Residues from a random subset of [0, M) per input (:func:`match2_draw`), seeded."""
        rng = np.random.default_rng(seed)
        for done in range(0, count, batch):
            yield self.batch(model, match2_draw(model.n, self.modulus(model), rng, min(batch, count - done)))

    def adversarial(self, model: CompiledModel, count: int, seed: int) -> Iterator[Batch]:
        """The named Match2 inputs (:func:`match2_adversarial`), then near misses (:meth:`near_misses`)."""
        rows = [x for _, x in match2_adversarial(model.n, self.modulus(model), seed)]
        rows.append(self.near_misses(model, np.random.default_rng(seed)))
        yield from self._capped(model, np.concatenate(rows), count)

    def candidates(self, model: CompiledModel, hint: dict, count: int) -> Iterator[Batch]:
        """Planted from a failed proof's hint: inputs where position 1 has each hinted match count,
        and near misses; then the adversarial and sampled inputs."""
        rng = np.random.default_rng(4)
        if hint.get("counts"):
            yield from self._capped(model, self.with_counts(model, hint["counts"][:16], rng), count)
        if hint.get("near"):
            yield from self._capped(model, self.near_misses(model, rng), count)
        yield from super().candidates(model, hint, count)

    def _capped(self, model: CompiledModel, x: np.ndarray, count: int, batch: int = 64) -> Iterator[Batch]:
        """The first ``count`` rows of ``x`` in small batches (a counterexample search stops at the first
        batch with a wrong answer; the executor's cost per input grows with N^2)."""
        x = x[:count]
        for lo in range(0, len(x), batch):
            yield self.batch(model, x[lo:lo + batch])

    def _pairs(self, model: CompiledModel, rng: np.random.Generator) -> list[tuple[int, int, int]]:
        """A few (u, partner of u, the residue whose code is farthest from the partner's): residues
        u that do not pair with themselves (2u ≢ 0 mod M)."""
        M = self.modulus(model)
        r = np.arange(M)
        cand = r[(2 * r) % M != 0]
        out = []
        C = codes(r, code_bits(M))
        for u in rng.permutation(cand)[:4].tolist():
            p = (M - u) % M
            far = int(np.argmax(np.where(r == p, -1, np.sum(C != C[p], axis=1))))
            out.append((u, p, far))
        return out

    def with_counts(self, model: CompiledModel, counts: list[int], rng: np.random.Generator) -> np.ndarray:
        """Inputs where position 1 holds u and exactly c of the others its partner (c = N: all zero)."""
        n, rows = model.n, []
        for c in counts:
            c = int(min(max(c, 0), n))
            if c == n or not self._pairs(model, rng):
                rows.append(np.zeros(n, dtype=np.int64))
                continue
            for u, p, far in self._pairs(model, rng):
                rows.append(np.r_[u, np.full(min(c, n - 1), p), np.full(n - 1 - min(c, n - 1), far)])
        return np.asarray(rows, dtype=np.int64).reshape(-1, n)

    def near_misses(self, model: CompiledModel, rng: np.random.Generator) -> np.ndarray:
        """Position 1 holds u, k others (k = 1, 2, 4, ..., N - 1) residues whose codes differ from u's
        partner's in one bit, the rest the farthest residue: no match at position 1, and the most weight
        a too-small eta leaves on non-matching keys."""
        M, n = self.modulus(model), model.n
        r = np.arange(M)
        C = codes(r, code_bits(M))
        rows = []
        for u, p, far in self._pairs(model, rng):
            near = r[(np.sum(C != C[p], axis=1) == 1) & (r != p)]
            near = near if near.size else np.array([far])
            k = 1
            while k <= n - 1:
                rows.append(np.r_[u, near[np.arange(k) % near.size], np.full(n - 1 - k, far)])
                k *= 2
        return np.asarray(rows, dtype=np.int64).reshape(-1, n)


# ------------------------------------------------------------------------------------------------
# the builder
# ------------------------------------------------------------------------------------------------


def real_eta(n: int) -> float:
    """ln(8 (N + 1)): with eta at least this, e^-eta (N + 1) <= 1/8, so the model is also right in
    real arithmetic (z <= 1/8 without a match, z >= 7/8 with one): the exported float model works."""
    return math.log(8 * (n + 1))


def _eta_for(fmt: Format, b: int, n: int) -> Fraction | None:
    """The smallest grid eta >= ln(8(N + 1)) with round(e^-eta S) = 0, if every lowering condition
    holds at c_max = n there (and the MLP's and readout's constants are representable)."""
    if not (fmt.is_exact and fmt.represents(Fraction(2)) and fmt.represents(Fraction(1, 2))):
        return None
    S, top = int(fmt.scale), int(fmt.max_raw)
    if not (S <= top and n * S <= top and ema_weight(fmt, n) >= 1):  # the cheap conditions first
        return None
    eta = MatchHead.smallest_eta(fmt)
    if eta is None:
        return None
    eta = max(eta, Fraction(math.ceil(real_eta(n) * S), S))
    return eta if MatchHead.conditions(fmt, eta, b, n)["ok"] else None


@construction("match2", task=Match2Task(), theorem=THEOREM,
              claim=Claim("P2 Thm 5.2 (Sec. 5.1)", "1", "1", "embedding dimension 1 (ANNA)", "p-bit words", "O(1) words"),
              sizes=SizeRows("match2"), small=dict(n=4, modulus=3))
def match2(n: int, modulus: int = 37, eta: Fraction | None = None,
           precision: Format | str | None = None) -> CompiledModel:
    """Match2 (P2 Def. 5.1, Thm 5.2) as one softmax layer with one head: the EMA head lowered
    (spec B.6), proved for all inputs by the certificate.

    Parameters
    ----------
    n : int in [1, 2^20]. Sequence length N; answers at positions 1..N (BOS at position 0).
    modulus : int in [1, 2^16]. M: inputs are residues in [0, M); the answer at position i is 1
        iff x_i + x_j = 0 (mod M) for some j (j = i allowed). P2's experiment: N = 32, M = 37.
    eta : attention scale > 0 on the format's grid. Default: the smallest grid value with
        round(e^-eta S) = 0 (eta > ln S under floor rounding) and eta >= ln(8(N+1)) (then the
        exported model is right in real arithmetic too).
    precision : binary:int=I,frac=F | paper:n=N,kc=K | float64 | float32. Default: the fewest-bit binary
        format satisfying the lowering condition at c_max = N (S >= N, N S <= max, eta b <= max).
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= MAX_N:
        raise Match2Error(f"n must be an integer in [1, 2^20], got {n!r}")
    if isinstance(modulus, bool) or not isinstance(modulus, (int, np.integer)) or not 1 <= modulus <= MAX_MODULUS:
        raise Match2Error(f"modulus must be an integer in [1, 2^16], got {modulus!r}")
    n, M = int(n), int(modulus)
    b = code_bits(M)
    fmt, eta, notes = _precision_and_eta(n, b, eta, precision)

    L = Layout()
    for name, width in (("kcode", b), ("qcode", b), ("bos", 1), ("flag", 1), ("z", 1), ("ans", 1)):
        L.add(name, width)
    mb = ModelBuilder(L, n_layers=1, d_vocab=M + 1, n_ctx=n + 1)
    r = np.arange(M)
    mb.token_rows(r, "kcode", codes(r, b))
    mb.token_rows(r, "qcode", codes((M - r) % M, b))
    mb.token_rows(r, "flag", np.ones((M, 1), dtype=np.int64))
    mb.token_rows([M], "bos", np.array([[1]]))
    MatchHead("qcode", "kcode", "bos", ("flag",), ("z",), eta).emit(mb, 0)
    MatchIndicator("z", "ans").emit(mb, 0)
    SymbolReadout("ans", 2).emit(mb)
    cond = MatchHead.conditions(fmt, eta, b, n) if fmt.is_exact and fmt.represents(eta) else None
    try:
        model = mb.build(
            answers=[0, 1], vocab=[str(v) for v in range(M)] + ["BOS"], construction="match2", theorem=THEOREM, n=n,
            precision=fmt.name, answer_positions=tuple(range(1, n + 1)), task_params={"n": n, "modulus": M},
            params={
                "b": Param(b, "code bits max(2, ceil(log2 M))"),
                "eta": Param(eta, notes["eta"]),
                "ln_S": Param(round(math.log(fmt.scale), 6) if fmt.is_exact else None,
                              "eta must exceed ln S (floor rounding) so that e^-eta S rounds to 0"),
                "lowering_conditions": Param(cond, "MatchHead.conditions(fmt, eta, b, c_max = N) (docs/ema.md)"),
                "d_model": Param(2 * b + 4, "2b + 4 (kcode, qcode, bos, flag, z, ans)"),
                "d_head": Param(b + 1, "b + 1 (code dims and the default dim)"),
                "precision": Param(fmt.name, notes["precision"]),
                "precision_bits": Param(getattr(fmt, "bits", 64), "bits of one number in the format"),
            })
    except IRError as e:  # a weight the format does not hold: only a given eta can do this (the default fits)
        raise Match2Error(f"eta = {eta} does not fit precision {fmt.name}: {e}") from None
    return model


def _precision_and_eta(n: int, b: int, eta: Any, precision: Any) -> tuple[Format, Fraction, dict[str, str]]:
    notes = {"eta": "smallest grid value >= ln(8(N+1)) with round(e^-eta S) = 0 (eta > ln S under floor rounding, "
                    "ln 2S under nearest-even)", "precision": "given"}
    if isinstance(precision, str):
        precision = parse_format(precision)
    if precision is None:
        precision, auto = fewest_bits(lambda f: _eta_for(f, b, n), max_bits=48, err=Match2Error)
        notes["precision"] = "fewest-bit binary format satisfying the lowering condition at c_max = N"
    else:
        auto = _eta_for(precision, b, n) if precision.is_exact else None
    if eta is not None:
        eta = given_eta(eta, Match2Error)
        notes["eta"] = "given"
        return precision, eta, notes
    if not precision.is_exact:
        notes["eta"] = "ceil(4 ln(8(N+1))) / 4 (float format: e^-eta (N+1) <= 1/8)"
        return precision, Fraction(math.ceil(4 * real_eta(n)), 4), notes
    if auto is None:
        raise Match2Error(f"precision {precision.name}: no grid eta satisfies the lowering condition at c_max = N = {n} "
                          f"(eta > ln S, S >= N, N S <= max, eta b <= max); "
                          f"{smallest_works(lambda f: _eta_for(f, b, n), Match2Error)}")
    return precision, auto, notes
