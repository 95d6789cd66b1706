"""The frontier's grid: jobs, chains and arguments.

A **job** builds one construction at one N for one arithmetic and certifies it there
(:mod:`exactformer.verify.frontier.jobs`). The jobs of one construction and arithmetic form a
**chain** over N = 2^min_log_n .. 2^max_log_n, run upward. Its frontier is the largest N at
which the build is certified; the N below it that are not are its gaps (certification is not
monotone in N: the position code changes family with N, for one). A chain ends at a refusal (the
builder's design allows no format there) or an error, after :data:`PATIENCE` N in a row that are
not certified, at the grid's top, or when the next job's predicted time is over the budget (the
last job's time times its growth over the one before, at least :data:`GROWTH`). Nothing is
claimed beyond the N that ran.

Arithmetics: ``fixed`` (the fewest-bit fixed-point build, eta "minimal" where the builder has it:
its bits per N; a fixed-point budget of p bits reaches the largest N certified with <= p bits),
and the float dtypes the certificates enclose (precision/boxes.py), each with the build designed
for it where the builder takes ``arithmetics``, else the default (robust) build.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from typing import Any

from exactformer.constructions.core import registry
from exactformer.precision import FixedPoint
from exactformer.verify.verifier import VerifyError

#: what ``--arithmetics`` may name, in the tables' order (fixed point first, then by precision)
ARITHMETICS = ("fixed", "float8_e4m3", "float8_e5m2", "bfloat16", "float16", "float32", "float64")
#: the fixed-point budgets whose largest N the tables show (all of 4 .. 64 are in the JSON)
FIXED_BITS_SHOWN = (8, 12, 16, 24, 32, 48, 64)
FIXED_BITS = tuple(range(4, 65))
MIN_LOG_N, MAX_LOG_N, LIMIT_LOG_N = 4, 20, 30
DEFAULT_BUDGET = 120.0  # seconds: a chain's next job is not started when predicted to take longer
GROWTH = 2.0  # the least growth of a job's time per doubling of N that the prediction assumes
FLOOR = 1.0  # seconds: a job before the last one counts as at least this long in the prediction
PATIENCE = 3  # a chain ends after this many N in a row that are not certified


@dataclass(frozen=True)
class Job:
    """One cell of the grid: construction ``name`` with builder keywords ``params`` (besides n)
    at N = ``n`` in ``arithmetic``."""

    name: str
    params: tuple[tuple[str, Any], ...]
    arithmetic: str
    n: int

    def to_dict(self) -> dict[str, Any]:
        return {"construction": self.name, "params": dict(self.params), "arithmetic": self.arithmetic, "n": self.n}


@dataclass
class Chain:
    """The jobs of one construction and arithmetic, upward in N, and their results so far."""

    name: str
    params: tuple[tuple[str, Any], ...]
    arithmetic: str
    ns: list[int]
    cells: dict[int, dict[str, Any]] = field(default_factory=dict)

    def job(self, n: int) -> Job:
        return Job(self.name, self.params, self.arithmetic, n)

    def ran(self) -> list[dict[str, Any]]:
        """The results from the smallest N up, while they exist and the chain goes on (it ends at a
        refusal or an error, and after :data:`PATIENCE` N in a row that are not certified)."""
        out, misses = [], 0
        for n in self.ns:
            if n not in self.cells:
                break
            c = self.cells[n]
            out.append(c)
            misses = 0 if c["status"] == "certified" else misses + 1
            if c["status"] in ("refused", "error") or misses >= PATIENCE:
                break
        return out

    def certified(self) -> list[dict[str, Any]]:
        return [c for c in self.ran() if c["status"] == "certified"]

    def largest(self) -> int | None:
        """The largest N at which the chain's build is certified (None: none)."""
        done = self.certified()
        return done[-1]["n"] if done else None

    def gaps(self) -> list[int]:
        """The N below the largest certified one that are not certified."""
        top = self.largest()
        return [c["n"] for c in self.ran() if top is not None and c["n"] < top and c["status"] != "certified"]

    def _ended(self) -> dict[str, Any] | None:
        r = self.ran()
        if not r:
            return None
        last, misses = r[-1], 0
        for c in reversed(r):
            if c["status"] == "certified":
                break
            misses += 1
        if last["status"] in ("refused", "error") or misses >= PATIENCE:
            return {"why": last["status"], "n": last["n"], "reason": last["reason"]}
        if len(r) == len(self.ns):
            return {"why": "top", "n": self.ns[-1], "reason": f"ran up to the grid's largest N = {self.ns[-1]}"}
        return None

    def predicted(self) -> float:
        """The next job's predicted seconds: the last one's times its growth over the one before
        (at least :data:`GROWTH`; the one before counted as at least :data:`FLOOR` seconds, so that
        jitter on jobs of milliseconds predicts no blow-up); 0 before two jobs have run."""
        r = self.ran()
        if len(r) < 2:
            return 0.0
        last, before = r[-1]["seconds"], max(r[-2]["seconds"], FLOOR)
        return last * max(GROWTH, last / before)

    def next_n(self, budget: float) -> int | None:
        """The next N to run, or None when the chain has ended (:meth:`stop` says why)."""
        if self.stop(budget) is not None:
            return None
        return self.ns[len(self.ran())]

    def stop(self, budget: float) -> dict[str, Any] | None:
        """Why the chain ends where it does (None while it goes on): its last result (a refusal, an
        error, or the PATIENCE-th miss in a row), the grid's top, or the budget."""
        ended = self._ended()
        if ended is not None:
            return ended
        if self.predicted() > budget:
            nxt = self.ns[len(self.ran())]
            return {"why": "budget", "n": nxt,
                    "reason": f"N = {nxt} not run: predicted {self.predicted():.0f} s, over the budget of "
                              f"{budget:.0f} s per job"}
        return None


def paper_bits(n: int, kc: int = 1) -> int:
    """The paper's precision for N (P1 App. B.2): p = ceil(log2(2 N^(2 Kc) + 1)) bits."""
    return FixedPoint.paper(n, kc).bits


def design_keywords(name: str, arithmetic: str) -> dict[str, Any]:
    """The builder keywords of a job's design: eta "minimal" for fixed point where the builder's eta
    takes text (the fewest-bit, fixed-point-only design), ``arithmetics`` for a float dtype where
    the builder takes it; nothing else (the default build)."""
    builder = registry.get(name).builder
    params = inspect.signature(builder).parameters
    if arithmetic == "fixed":
        if "eta" in params:
            hint = typing.get_type_hints(builder).get("eta")
            if str in typing.get_args(hint) or hint is str:
                return {"eta": "minimal"}
        return {}
    return {"arithmetics": (arithmetic,)} if "arithmetics" in params else {}


# ---- the arguments: one check each, shared by xf.frontier and the command line -----------------------------------


def certified_constructions() -> list[str]:
    """The registered constructions with a certificate (``certify`` among their task's modes), in
    registry order: the frontier records proofs, so only these have one."""
    return [name for name in registry.names() if "certify" in registry.get(name).task.modes]


def check_constructions(names: Any) -> list[str]:
    """Constructions with a certificate (a list, or text "a,b"); None: every one of them."""
    known = certified_constructions()
    if names is None:
        return known
    items = [v.strip() for v in names.split(",")] if isinstance(names, str) else list(names)
    bad = [v for v in items if v not in known]
    if not items or bad:
        raise VerifyError("constructions", f"must be a comma list of {', '.join(known)} (those with a certificate), "
                                           f"got {names!r}")
    return list(dict.fromkeys(items))


def check_arithmetics(names: Any) -> list[str]:
    """Arithmetics of :data:`ARITHMETICS` (a list, or text "fixed,bfloat16"); None: all of them."""
    if names is None:
        return list(ARITHMETICS)
    items = [v.strip() for v in names.split(",")] if isinstance(names, str) else list(names)
    bad = [v for v in items if v not in ARITHMETICS]
    if not items or bad:
        raise VerifyError("arithmetics", f"must be a comma list of {', '.join(ARITHMETICS)}, got {names!r}")
    return [a for a in ARITHMETICS if a in items]


def check_log_n(min_log_n: Any, max_log_n: Any) -> tuple[int, int]:
    """The grid's exponents: integers with 1 <= min_log_n <= max_log_n <= 30."""
    for name, v in (("min_log_n", min_log_n), ("max_log_n", max_log_n)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= LIMIT_LOG_N:
            raise VerifyError(name, f"must be an integer in [1, {LIMIT_LOG_N}], got {v!r}")
    if min_log_n > max_log_n:
        raise VerifyError("max_log_n", f"must be >= min_log_n = {min_log_n}, got {max_log_n}")
    return min_log_n, max_log_n


def check_budget(budget: Any) -> float:
    """Seconds a job may be predicted to take: a number > 0."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise VerifyError("budget", f"must be a number of seconds > 0, got {budget!r}")
    return float(budget)


def check_params(params: Any, names: list[str]) -> dict[str, tuple[tuple[str, Any], ...]]:
    """Builder keywords per construction ({name: {keyword: value}}, JSON values; None: the builders'
    defaults); ``n`` and the design's keywords (eta, arithmetics) are the frontier's own."""
    params = params or {}
    if not isinstance(params, dict):
        raise VerifyError("params", f"must be a dict of construction -> builder keywords, got {type(params).__name__}")
    out = {}
    for name in names:
        kw = params.get(name, {})
        taken = set(registry.get(name).parameters) - {"n", "eta", "arithmetics"}
        bad = [k for k in kw if k not in taken]
        if not isinstance(kw, dict) or bad:
            raise VerifyError("params", f"{name}: keywords must be among {', '.join(sorted(taken))}, got {kw!r}")
        out[name] = tuple(sorted(kw.items()))
    extra = [k for k in params if k not in names]
    if extra:
        raise VerifyError("params", f"names constructions outside the grid: {', '.join(extra)}")
    return out
