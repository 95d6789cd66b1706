"""One job of the frontier, as a worker runs it: build, then certify (no counterexample search: the
frontier records proofs; ``exactformer verify ... --arithmetic A`` searches one for a cell that is
not certified). Every outcome is a result, never an exception, so a worker returns it whatever
happens: "certified", "unproven" (the certificate's reason), "refused" (the builder's, e.g. no
format allows the arithmetic at this N) or "error" (anything unexpected, with its type).

Every result also records the memory the job took: ``rss_start``, the process's resident bytes when
it began, and ``peak_rss``, its peak resident bytes while it ran (interpreter and imports included:
what a dask nanny compares with its worker's memory limit). The peak is reset at the start (Linux:
``/proc/self/clear_refs``); where it cannot be, ``rss_start`` is None and ``peak_rss`` the process's
lifetime peak, an upper bound. The schedule (:mod:`exactformer.verify.frontier.run`) predicts a
job's memory from these before it runs one ahead of its chain.
"""

from __future__ import annotations

import resource
import sys
import time
import traceback
from typing import Any

from exactformer.constructions.core import registry
from exactformer.precision import parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.frontier.grid import design_keywords


def _proc_status(field: str) -> int:
    """A memory line of ``/proc/self/status`` (VmRSS, VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"no {field} in /proc/self/status")


def reset_peak_rss() -> int | None:
    """Make this process's peak resident memory its current one (Linux: "5" written to
    ``/proc/self/clear_refs``) and return it in bytes; None where the peak cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _proc_status("VmRSS")
    except OSError:
        return None


def peak_rss(reset: bool) -> int:
    """This process's peak resident memory in bytes: since the last :func:`reset_peak_rss` where
    ``reset`` (VmHWM: ``ru_maxrss`` also keeps the peak at the last exit of any of the process's
    threads, which the reset does not clear), else the lifetime peak (``ru_maxrss``: kilobytes on
    Linux, bytes on macOS)."""
    if reset:
        return _proc_status("VmHWM")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """The result of one job (``Job.to_dict()``): status, reason, the build's precision, bits and
    eta, the arithmetics its design checked, the seconds of each step and the memory it took
    (``rss_start``, ``peak_rss``: the module docstring)."""
    start = reset_peak_rss()
    return _run(job) | {"rss_start": start, "peak_rss": peak_rss(start is not None)}


def _run(job: dict[str, Any]) -> dict[str, Any]:
    name, arithmetic, n = job["construction"], job["arithmetic"], job["n"]
    out: dict[str, Any] = dict(job)
    t0 = time.perf_counter()
    try:
        c = registry.get(name)
        kwargs = {**job["params"], "n": n, **design_keywords(name, arithmetic)}
        try:
            model = c.builder(**kwargs)
        except (ValueError, ArithmeticError) as e:  # the builders' refusals (parameters, formats, designs)
            return out | {"status": "refused", "reason": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
        t1 = time.perf_counter()
        fmt = parse_format(model.precision or "float64")
        param = model.params.get("arithmetics")
        out |= {"precision": model.precision, "bits": getattr(fmt, "bits", None) if fmt.is_exact else None,
                "eta": None if model.params.get("eta") is None else str(model.params["eta"].value),
                "designed_for": None if param is None else list(param.value), "seconds_build": t1 - t0}
        if arithmetic == "fixed" and not fmt.is_exact:
            return out | {"status": "refused", "reason": f"the build is in {fmt.name}, not fixed point",
                          "seconds": time.perf_counter() - t0}
        r = certify(model, fmt, c.task, arithmetic=arithmetic)
        return out | {"status": "certified" if r.passed else "unproven", "reason": r.reason,
                      "min_margin": None if r.min_margin is None else str(r.min_margin),
                      "seconds_certify": time.perf_counter() - t1, "seconds": time.perf_counter() - t0}
    except (Exception, MemoryError) as e:  # a bug or a resource limit: recorded, the chain stops here
        return out | {"status": "error", "reason": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc(limit=4), "seconds": time.perf_counter() - t0}
