"""Ground truths and input sources for the Boolean constructions of Theorems 6 and 13.

One task object per construction name, with the interface of
:class:`exactformer.verify.tasks.IndexLookupTask` (``count``, ``exhaustive``, ``sample``,
``adversarial``, ``_batch``) and ``truth(model, x)``. Inputs are one array ``x [B, N]``: entries
in {-1, 1} for Equality / Inequality, in {0, 1} for the threshold family.

Ground truths are computed from the task's own definition, not from the model's feature tables,
wherever the task has one: EQ / INEQ from the two halves, DISJ from the two halves, k-DNF / k-CNF
from the clause lists in ``model.task_params["clauses"]``. Only the general THRES task reads its
specification (index sets, truth tables, b) from ``model.task_params``: that *is* its definition.

Sources:

* ``exhaustive``: all 2^N inputs in counting order (x_1 is the most significant bit), vectorised.
* ``sample``: seeded; Equality draws half of the inputs uniformly and half as "first half copied,
  then (with probability 1/2) 1-3 random bits flipped"; thresholds draw each input with its own density p ~ U(0, 1).
* ``adversarial``: Equality: inputs with equal halves and every single-bit flip of them (pairs
  that differ in exactly one bit, at every position). Thresholds: inputs with exactly b and exactly
  b + 1 true features (found by a seeded local search) and all their single-bit neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from exactformer.constructions.ir import CompiledModel


@dataclass
class BoolBatch:
    """Same fields as :class:`exactformer.verify.tasks.Batch` (defined here, not subclassed, so that
    ``verify/tasks.py`` can import this module without an import cycle); ``example(i)`` is the
    natural input itself (a list of ints)."""

    arrays: tuple[np.ndarray, ...]
    tokens: np.ndarray  # [B, T]
    truth: np.ndarray  # [B]

    def example(self, i: int) -> Any:
        return self.arrays[0][i].tolist()


def _bits_of(ints: np.ndarray, n: int) -> np.ndarray:
    """[B] ints -> [B, n] bits, bit 0 of the input = most significant."""
    shifts = np.arange(n - 1, -1, -1, dtype=np.int64)
    return ((ints[:, None] >> shifts[None, :]) & 1).astype(np.int64)


class _BooleanTask:
    name = ""
    pm1 = False  # natural inputs in {-1, 1} (else {0, 1})

    # ---- to implement ---------------------------------------------------------------------------
    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _encode(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # ---- interface --------------------------------------------------------------------------------
    def _batch(self, model: CompiledModel, x: np.ndarray) -> BoolBatch:
        x = np.asarray(x, dtype=np.int64)
        return BoolBatch((x,), self._encode(model, x), self.truth(model, x).astype(np.int64))

    def count(self, model: CompiledModel) -> int:
        return 1 << model.n

    def _from_bits(self, bits: np.ndarray) -> np.ndarray:
        return 2 * bits - 1 if self.pm1 else bits

    def exhaustive(self, model: CompiledModel, batch: int = 4096) -> Iterator[BoolBatch]:
        """All 2^N inputs, in counting order."""
        n = model.n
        total = 1 << n
        for s in range(0, total, batch):
            ints = np.arange(s, min(total, s + batch), dtype=np.int64)
            yield self._batch(model, self._from_bits(_bits_of(ints, n)))

    def sample(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[BoolBatch]:
        rng = np.random.default_rng(seed)
        done = 0
        while done < count:
            b = min(batch, count - done)
            yield self._batch(model, self._draw(model, rng, b))
            done += b

    def _draw(self, model: CompiledModel, rng: np.random.Generator, b: int) -> np.ndarray:
        p = rng.random((b, 1))
        return self._from_bits((rng.random((b, model.n)) < p).astype(np.int64))

    def adversarial(self, model: CompiledModel, count: int, seed: int, batch: int = 256) -> Iterator[BoolBatch]:
        """Rounds of adversarial inputs (see each task's ``_adversarial_round``), streamed: a round
        is a list of arrays or of iterables of arrays, consumed lazily, so single-bit flips of an
        N-bit input never form an N x N array."""
        rng = np.random.default_rng(seed)
        done = 0
        while done < count:
            produced = False
            for part in self._adversarial_round(model, rng):
                for arr in ([part] if isinstance(part, np.ndarray) else part):
                    for s in range(0, len(arr), batch):
                        if done >= count:
                            return
                        b = min(batch, count - done, len(arr) - s)
                        yield self._batch(model, arr[s : s + b])
                        done += b
                        produced = True
            if not produced:
                return

    def _adversarial_round(self, model, rng) -> list[np.ndarray]:
        raise NotImplementedError


def _single_flips(x: np.ndarray, pm1: bool, chunk: int = 256) -> Iterator[np.ndarray]:
    """[B, n] -> chunks of at most ``chunk`` rows, together every input with exactly one bit
    flipped (input-major order), generated lazily."""
    B, n = x.shape
    for i in range(B):
        for s in range(0, n, chunk):
            j = np.arange(s, min(n, s + chunk))
            out = np.repeat(x[i : i + 1], len(j), axis=0)
            rows = np.arange(len(j))
            out[rows, j] = -out[rows, j] if pm1 else 1 - out[rows, j]
            yield out


# ------------------------------------------------------------------------------------------------
# Equality / Inequality
# ------------------------------------------------------------------------------------------------


class EqualityTask(_BooleanTask):
    """EQ(x) = [x_{1..N/2} = x_{N/2+1..N}] (``complement``: INEQ = 1 - EQ), x in {-1, 1}^N."""

    pm1 = True

    def __init__(self, complement: bool = False):
        self.complement = complement
        self.name = "inequality" if complement else "equality"

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        h = x.shape[1] // 2
        eq = np.all(x[:, :h] == x[:, h:], axis=1).astype(np.int64)
        return 1 - eq if self.complement else eq

    def _encode(self, model, x):
        from exactformer.constructions.equality import encode_arrays

        return encode_arrays(model, x)

    def _draw(self, model, rng, b):
        n, h = model.n, model.n // 2
        x = rng.choice(np.array([-1, 1]), size=(b, n))
        copy = rng.random(b) < 0.5
        x[copy, h:] = x[copy, :h]
        flips = np.where(rng.random(b) < 0.5, 0, rng.integers(1, 4, size=b)) * copy
        for i in np.flatnonzero(flips):
            j = rng.choice(n, size=int(flips[i]), replace=False)
            x[i, j] *= -1
        return x

    def _adversarial_round(self, model, rng):
        """One input with equal halves, then all N single-bit flips of it."""
        n, h = model.n, model.n // 2
        base = rng.choice(np.array([-1, 1]), size=(1, n))
        base[:, h:] = base[:, :h]
        return [base, _single_flips(base, True)]

    def feature_counts(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        """Number of mismatched pairs (the S of the certificate)."""
        h = model.n // 2
        return np.sum(np.asarray(x)[:, :h] != np.asarray(x)[:, h:], axis=1)


# ------------------------------------------------------------------------------------------------
# thresholds of k-sparse features
# ------------------------------------------------------------------------------------------------


def threshold_spec(model: CompiledModel) -> tuple[np.ndarray, np.ndarray, list, int]:
    """(feature index [m, k] 1-based, type [m], types [(arity, table)], b) of a threshold model,
    re-derived from the clause list for DNF / CNF and from N for Disjointness (so the spec does
    not depend on stored feature tables); read from ``task_params`` for general THRES."""
    from exactformer.constructions import thresholds as th

    tp = model.task_params
    kind, n = tp.get("kind", "threshold"), model.n
    if kind == "disjointness":
        h = n // 2
        feats = [[i, i + h] for i in range(1, h + 1)]
        idx, ft, types = th.normalize_features(n, feats, [1, 1, 1, 0], 2)
        return idx, ft, types, h - 1
    if kind in ("dnf", "cnf"):
        feats, m = th.literal_features(n, tp["clauses"], kind, None)
        idx, ft, types = th.normalize_features(n, feats, None, int(tp.get("k", 0)) or None)
        return idx, ft, types, (0 if kind == "dnf" else m - 1)
    types = [(int(a), tuple(int(v) for v in t)) for a, t in tp["types"]]
    return np.asarray(tp["feature_index"], dtype=np.int64), np.asarray(tp["feature_type"], dtype=np.int64), types, int(tp["b"])


class ThresholdTask(_BooleanTask):
    """Th_b over k-sparse features, x in {0, 1}^N. ``kind`` selects the ground truth:
    "threshold" (the stored specification), "disjointness", "dnf", "cnf" (from their definitions)."""

    pm1 = False

    def __init__(self, kind: str = "threshold"):
        if kind not in ("threshold", "disjointness", "dnf", "cnf"):
            raise ValueError(f"kind must be one of threshold, disjointness, dnf, cnf; got {kind!r}")
        self.kind = self.name = kind
        self._cache: tuple | None = None  # (model, spec) of the last model seen

    def _spec(self, model):
        if self._cache is None or self._cache[0] is not model:
            self._cache = (model, threshold_spec(model))
        return self._cache[1]

    def feature_counts(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        from exactformer.constructions.thresholds import feature_values

        idx, ft, types, _ = self._spec(model)
        return feature_values(idx, ft, types, x).sum(axis=1)

    def truth(self, model: CompiledModel, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        n = model.n
        if self.kind == "disjointness":
            h = n // 2
            return (~np.any((x[:, :h] == 1) & (x[:, h:] == 1), axis=1)).astype(np.int64)
        if self.kind in ("dnf", "cnf"):
            out = np.zeros(len(x), dtype=bool) if self.kind == "dnf" else np.ones(len(x), dtype=bool)
            for c in model.task_params["clauses"]:
                lits = np.asarray(c, dtype=np.int64)
                vals = np.where(lits[None, :] > 0, x[:, np.abs(lits) - 1] == 1, x[:, np.abs(lits) - 1] == 0)
                if self.kind == "dnf":
                    out |= np.all(vals, axis=1)
                else:
                    out &= np.any(vals, axis=1)
            return out.astype(np.int64)
        b = self._spec(model)[3]
        return (self.feature_counts(model, x) > b).astype(np.int64)

    def _encode(self, model, x):
        from exactformer.constructions.thresholds import encode_arrays

        return encode_arrays(model, x)

    def with_count(self, model: CompiledModel, targets: np.ndarray, rng: np.random.Generator,
                   rounds: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """Seeded search for inputs whose feature count S equals ``targets`` [R].

        1. Bisection along a random path: draw u and v (random densities) and a random order of the
           bits; x(t) takes v's first t bits (in that order) and u's others. When S(u) and S(v) lie
           on both sides of the target, bisection on t finds adjacent t, t + 1 whose counts straddle
           it, so S(x(t)) is within one bit's degree (features per bit) of the target.
        2. Finish by best single flips (exact deltas from the bit -> features incidence), with a
           random flip when no flip improves.
        Returns (x [R, N], found [R] bool). Best effort: exact counts can be NP-hard to reach (e.g.
        all clauses of a CNF true), so callers use what is found."""
        from exactformer.constructions.thresholds import feature_values

        idx, ft, types, _ = self._spec(model)
        n = model.n
        targets = np.asarray(targets, dtype=np.int64)
        R = len(targets)
        S_of = lambda x: feature_values(idx, ft, types, x).sum(axis=1)  # noqa: E731
        best = (rng.random((R, n)) < 0.5).astype(np.int64)
        found = np.zeros(R, dtype=bool)
        for _ in range(rounds):
            todo = np.flatnonzero(~found)
            if not todo.size:
                break
            r = len(todo)
            u = (rng.random((r, n)) < rng.random((r, 1))).astype(np.int64)
            v = (rng.random((r, n)) < rng.random((r, 1))).astype(np.int64)
            if rng.random() < 0.5:
                u[: r // 2], v[: r // 2] = 0, 1  # the extreme path all-0 -> all-1 for half of the rows
            rank = np.argsort(rng.random((r, n)), axis=1).argsort(axis=1)
            tgt = targets[todo]
            lo, hi = np.zeros(r, dtype=np.int64), np.full(r, n, dtype=np.int64)
            s_lo, s_hi = S_of(u) - tgt, S_of(v) - tgt
            ok = np.sign(s_lo) * np.sign(s_hi) <= 0
            while np.any(ok & (hi - lo > 1)):
                mid = (lo + hi) // 2
                s_mid = S_of(np.where(rank < mid[:, None], v, u)) - tgt
                go_hi = np.sign(s_mid) * np.sign(s_lo) > 0  # same side as lo: move lo up
                act = ok & (hi - lo > 1)
                lo = np.where(act & go_hi, mid, lo)
                s_lo = np.where(act & go_hi, s_mid, s_lo)
                hi = np.where(act & ~go_hi, mid, hi)
                s_hi = np.where(act & ~go_hi, s_mid, s_hi)
            t = np.where(np.abs(s_lo) <= np.abs(s_hi), lo, hi)
            x = np.where(rank < t[:, None], v, u)
            x = self._finish(model, x, tgt, rng)
            hit = S_of(x) == tgt
            best[todo[hit]] = x[hit]
            found[todo[hit]] = True
        return best, found

    def _finish(self, model, x, targets, rng, steps: int = 24) -> np.ndarray:
        """Best single flips toward the targets (exact deltas via the incidence of bits in features)."""
        from exactformer.constructions.thresholds import feature_values

        idx, ft, types, _ = self._spec(model)
        n, m = model.n, len(ft)
        if not m:
            return x
        # incidence: features containing each bit, padded with -1
        rows_f = np.repeat(np.arange(m), idx.shape[1])
        vars_ = idx.reshape(-1) - 1
        keep = vars_ >= 0
        rows_f, vars_ = rows_f[keep], vars_[keep]
        order = np.argsort(vars_, kind="stable")
        rows_f, vars_ = rows_f[order], vars_[order]
        deg = np.bincount(vars_, minlength=n)
        D = max(1, int(deg.max()) if deg.size else 1)
        inc = np.full((n, D), -1, dtype=np.int64)
        slot = np.arange(len(vars_)) - np.repeat(np.cumsum(deg) - deg, deg)
        inc[vars_, slot] = rows_f
        x = x.copy()
        for i in range(len(x)):
            for _ in range(steps):
                g = feature_values(idx, ft, types, x[i : i + 1])[0]
                S = int(g.sum())
                if S == targets[i]:
                    break
                # value of every incident feature with bit j flipped
                fl = np.repeat(x[i : i + 1], n, axis=0)
                fl[np.arange(n), np.arange(n)] ^= 1
                f_ids = inc.reshape(-1)
                valid = f_ids >= 0
                new_vals = np.zeros(n * D, dtype=np.int64)
                rows = np.repeat(np.arange(n), D)[valid]
                sub_idx, sub_ft = idx[f_ids[valid]], ft[f_ids[valid]]
                for tau, (ar, table) in enumerate(types):
                    sel = sub_ft == tau
                    if not np.any(sel):
                        continue
                    code = np.zeros(int(sel.sum()), dtype=np.int64)
                    for h in range(ar):
                        code = code * 2 + fl[rows[sel], sub_idx[sel, h] - 1]
                    tmp = np.zeros(int(valid.sum()), dtype=np.int64)
                    tmp[sel] = np.asarray(table, dtype=np.int64)[code]
                    new_vals[np.flatnonzero(valid)[sel]] = tmp[sel]
                old_vals = np.where(valid, g[np.maximum(f_ids, 0)], 0)
                delta = (new_vals - old_vals).reshape(n, D).sum(axis=1)
                dist = np.abs(S + delta - targets[i])
                cand = np.flatnonzero(dist == dist.min())
                if dist.min() >= abs(S - targets[i]):
                    cand = np.arange(n)  # stuck: random flip
                x[i, int(rng.choice(cand))] ^= 1
        return x

    def _adversarial_round(self, model, rng):
        """Inputs with exactly b and b + 1 true features and all their single-bit flips."""
        b = self._spec(model)[3]
        m = len(self._spec(model)[1])
        targets = np.array([t for t in (b, b + 1) if 0 <= t <= m] * 2, dtype=np.int64)
        x, found = self.with_count(model, targets, rng)
        x = x[found]
        if not len(x):  # nothing reachable: fall back to random inputs so the source never stalls
            return [self._draw(model, rng, 8)]
        return [x, _single_flips(x, False)]


TASKS_BOOLEAN: dict[str, Any] = {
    "equality": EqualityTask(False),
    "inequality": EqualityTask(True),
    "threshold": ThresholdTask("threshold"),
    "disjointness": ThresholdTask("disjointness"),
    "dnf": ThresholdTask("dnf"),
    "cnf": ThresholdTask("cnf"),
}
