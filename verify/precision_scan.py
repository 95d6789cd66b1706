"""The smallest value of one precision parameter that certifies a construction: the fraction bits
at a fixed number of integer bits (``binary``) or App. B.2's kc (``paper``); the other bits are
not varied, and the result says which were scanned (:attr:`MinPrecision.scanned`).

Passing is not monotone in the number of bits at very low precision (see docs/precision.md), so
the scan goes upward and reports the smallest value from which every larger value up to the last
one checked passes, never a bisection.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from exactformer.constructions.core import registry
from exactformer.constructions.core.ir import CompiledModel, IRError
from exactformer.precision import FixedPoint, Format
from exactformer.verify.certify.composed import certify


@dataclass
class MinPrecision:
    """The smallest precision from which every larger one (up to ``checked_up_to``) certifies.

    ``kind``: "binary" (frac bits at a fixed number of integer bits) or "paper" (kc of App. B.2);
    ``value``/``format``: the answer (None when none was found); ``passing``: every value that
    passed; ``results``: value -> (format name, passed, reason); ``scanned``: what was varied and
    over which values, in words (``"frac bits 1..9 at int=6"``: not the smallest precision of any
    kind, the smallest frac bits at those integer bits)."""

    kind: str
    value: int | None
    format: str | None
    passing: list[int]
    checked_up_to: int
    results: dict[int, dict[str, Any]]
    scanned: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def find_min_precision(build: Callable[[Format], CompiledModel], kind: str = "binary", n: int | None = None,
                       int_bits: int = 6, max_value: int | None = None, confirm: int = 4,
                       device: str = "cpu") -> MinPrecision:
    """Scan precisions upward, building the model for each (the builder derives its constants for
    the format) and certifying it. ``kind="binary"`` varies frac bits 1..max_value (default 24) at
    ``int_bits``; ``kind="paper"`` varies kc 1..max_value (default 4) of the grid for ``n``. The
    scan stops once ``confirm`` consecutive values after a passing one also pass."""
    if kind not in ("binary", "paper"):
        raise ValueError(f"kind must be 'binary' or 'paper', got {kind!r}")
    if kind == "paper" and (n is None or n < 2):
        raise ValueError("n must be given (>= 2) for kind='paper'")
    top = max_value or (24 if kind == "binary" else 4)
    results: dict[int, dict[str, Any]] = {}
    run_start = None
    for v in range(1, top + 1):
        fmt = FixedPoint.binary(int_bits=int_bits, frac_bits=v) if kind == "binary" else FixedPoint.paper(n, v)
        try:
            model = build(fmt)
            r = certify(model, fmt, registry.task_of(model), device=device)
            ok, reason = r.passed, r.reason
        except (ValueError, IRError) as e:
            ok, reason = False, f"{type(e).__name__}: {e}"
        results[v] = {"format": fmt.name, "passed": ok, "reason": reason}
        run_start = (run_start or v) if ok else None
        if run_start is not None and v - run_start >= confirm:
            break
    what = f"frac bits 1..{max(results)} at int={int_bits}" if kind == "binary" else f"kc 1..{max(results)} for N = {n}"
    return MinPrecision(kind, run_start, results[run_start]["format"] if run_start else None,
                        [v for v, r in results.items() if r["passed"]], max(results), results, what)
