"""All-inputs certificates by construction, and the smallest-precision search built on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from exactformer.constructions.ir import CompiledModel, IRError
from exactformer.precision import FixedPoint, Format
from exactformer.verify.certify_index_lookup import CertificateResult, certify_index_lookup
from exactformer.verify.certify_two_layer import certify_two_layer

CERTIFIERS: dict[str, Callable[..., CertificateResult]] = {
    "index-lookup": certify_index_lookup,
    **{name: certify_two_layer for name in ("equality", "inequality", "threshold", "disjointness", "dnf", "cnf")},
}


def certify(model: CompiledModel, fmt: Format, device: str = "cpu") -> CertificateResult:
    """Prove ``model`` correct on every input under ``fmt``, or return why not (with a
    counterexample whenever the failing bound is attained by a real input)."""
    from exactformer.verify.verifier import counterexample_runner

    fn = CERTIFIERS.get(model.construction)
    if fn is None:
        return CertificateResult(False, False, f"no certificate for construction {model.construction!r}", None, 0)
    runner = counterexample_runner(device)
    return fn(model, fmt, device=device, run_fn=lambda m, *arrays: runner(m, *arrays, fmt=fmt))


@dataclass
class MinPrecision:
    """The smallest precision from which every larger one (up to ``checked_up_to``) certifies.

    Passing is not monotone in the number of bits at very low precision, so this is the smallest
    f such that every f' in [f, checked_up_to] passes; ``passing`` lists every f that passed.
    ``value`` is None when no such run was found up to the scan's limit.
    """

    kind: str  # "binary" (frac bits) or "paper" (kc)
    value: int | None
    fmt_name: str | None
    passing: list[int]
    checked_up_to: int


def find_min_precision(
    build: Callable[[Format], CompiledModel],
    kind: str = "binary",
    n: int | None = None,
    int_bits: int = 6,
    max_value: int | None = None,
    confirm: int = 4,
    device: str = "cpu",
) -> MinPrecision:
    """Scan precisions upward, building the model for each (the builder derives its constants for
    the format) and certifying it. ``kind="binary"`` varies frac bits 1..max_value (default 24)
    at ``int_bits``; ``kind="paper"`` varies kc 1..max_value (default 4) of the grid for ``n``.

    The scan stops once ``confirm`` consecutive values after a passing one also pass (or at
    ``max_value``); the answer is the smallest value from which every value up to
    ``checked_up_to`` passes. (Passing is not monotone at very low precision, so no bisection.)
    """
    if kind not in ("binary", "paper"):
        raise ValueError(f"kind must be 'binary' or 'paper', got {kind!r}")
    if kind == "paper" and (n is None or n < 2):
        raise ValueError("n must be given (>= 2) for kind='paper'")
    top = max_value or (24 if kind == "binary" else 4)
    results: dict[int, bool] = {}
    names: dict[int, str] = {}
    run_start = None
    for v in range(1, top + 1):
        fmt = FixedPoint.binary(int_bits=int_bits, frac_bits=v) if kind == "binary" else FixedPoint.paper(n, v)
        names[v] = fmt.name
        try:
            ok = certify(build(fmt), fmt, device=device).passed
        except (ValueError, IRError):
            ok = False
        results[v] = ok
        run_start = (run_start or v) if ok else None
        if run_start is not None and v - run_start >= confirm:
            break
    checked = max(results)
    return MinPrecision(kind, run_start, names.get(run_start) if run_start else None,
                        [v for v, ok in results.items() if ok], checked)
