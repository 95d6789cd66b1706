"""The smt mode: a second prover, independent of the certificates, for any model at small N.

The model is encoded as it runs -- its fixed-point forward pass with every rounding and saturation
(docs/precision.md), the rounded exp as a table, the readout decoded as the executor decodes it,
the answer labels and answer positions -- beside the task's truth, and z3 is asked for an input
where they differ (docs/smt.md). It shares nothing with :mod:`exactformer.verify.certify`, the
blocks' certificates or the views: only the model, the format (:mod:`exactformer.precision`) and
the task.

z3 (``z3-solver``) is an optional dependency (``pip install -e '.[smt]'``): this module imports it
only when a proof is asked for (:func:`prove`), and :func:`refusal` says why a model is not
covered -- z3 missing, a float arithmetic, a model or task that is not encoded -- in one line.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

INSTALL = "pip install -e '.[smt]'"
#: the largest :func:`estimate` for which the verifier picks smt by default (docs/smt.md "Limits")
ESTIMATE_LIMIT = 1 << 24
DEFAULT_TIMEOUT = 600.0  # seconds, --mode smt
DEFAULT_CHOICE_TIMEOUT = 60.0  # seconds, smt chosen by default (then sampling if it runs out)


def available() -> bool:
    """Whether z3 is installed."""
    return importlib.util.find_spec("z3") is not None


def estimate(model: Any, task: Any) -> int:
    """The size of a model's smt problem (docs/smt.md "Limits"): the multiply-adds of one forward pass
    over the whole input -- T (the input length) times the parameters, plus 2 T^2 d_head per
    attention head -- times the depth through which the input mixes: 4^(A - 1) for A attention
    layers (each one lets every value read every position again), T for a recurrent model (its T
    steps). A measure of size from the model's shape, not of time."""
    T = int(task.length(model))
    layers = model.shape().layers
    heads = sum(H * dh for H, dh, _ in layers)
    attention = sum(1 for H, _, _ in layers if H)
    depth = 4 ** (attention - 1) if attention else T
    return (T * int(model.parameter_count()) + 2 * T * T * heads) * depth


def refusal(model: Any, task: Any, arithmetic: str, fmt: Any) -> str | None:
    """Why the smt mode does not cover ``model`` in ``arithmetic`` / ``fmt`` (one line), or None."""
    if not available():
        return f"smt needs z3, which is not installed: {INSTALL}"
    if fmt is None and arithmetic == "fixed":
        from exactformer.precision import parse_format

        fmt = parse_format(model.precision or "float64")
    if arithmetic != "fixed" or not fmt.is_exact:
        name = arithmetic if arithmetic != "fixed" else fmt.name
        return (f"smt covers fixed-point formats only, not {name}: a float forward pass's summation order and exp "
                "are not defined exactly enough to encode (docs/smt.md)")
    from exactformer.verify.smt.prover import covers

    return covers(model, task)


def prove(model: Any, fmt: Any, task: Any, timeout: float = DEFAULT_TIMEOUT,
          progress: Callable[[str], None] | None = None) -> Any:
    """:func:`exactformer.verify.smt.prover.prove` (imports z3)."""
    from exactformer.verify.smt import prover

    return prover.prove(model, fmt, task, timeout, progress)
