"""Index Lookup (Thm 1) benchmarks: build, certify and sampled verification.

Usage:
  python benchmarks/bench_index_lookup.py --case rs-certify   [--n 1048576]   # CPU goal: <= 10 s
  python benchmarks/bench_index_lookup.py --case sample       [--n 65536 --samples 100000]
  python benchmarks/bench_index_lookup.py --case random-certify --device cuda [--n 1048576]

Prints one JSON object per case (seconds for each stage, the model's constants and the verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from exactformer.constructions.theorems.index_lookup import IndexLookupTask, index_lookup
from exactformer.constructions.codes.positions import position_codes
from exactformer.precision import parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.verifier import counterexample_runner, verify


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["rs-certify", "sample", "random-certify"], required=True)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--alphabet", type=int, default=64)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    out: dict = {"case": a.case, "device": a.device, "machine": _machine(), "alphabet": a.alphabet}
    if a.case == "rs-certify":
        n = a.n or 1 << 20
        t = time.perf_counter()
        model = index_lookup(n, a.alphabet, positions="reed-solomon")
        out["build_s"] = time.perf_counter() - t
        fmt = parse_format(model.precision)
        t = time.perf_counter()
        cert = certify(model, fmt, IndexLookupTask(), device=a.device, run_candidates=counterexample_runner(fmt, a.device))
        out["certify_s"] = time.perf_counter() - t
    elif a.case == "random-certify":
        n = a.n or 1 << 20
        t = time.perf_counter()
        code = position_codes(n, family="random", seed=a.seed, device=a.device)
        out["code_search_s"] = time.perf_counter() - t
        out["code"] = code.describe()
        t = time.perf_counter()
        model = index_lookup(n, a.alphabet, positions=code)
        out["build_s"] = time.perf_counter() - t
        fmt = parse_format(model.precision)
        t = time.perf_counter()
        cert = certify(model, fmt, IndexLookupTask(), device=a.device, run_candidates=counterexample_runner(fmt, a.device))
        out["certify_s"] = time.perf_counter() - t
    else:
        n = a.n or 1 << 16
        t = time.perf_counter()
        model = index_lookup(n, a.alphabet, positions="reed-solomon")
        out["build_s"] = time.perf_counter() - t
        t = time.perf_counter()
        rep = verify(model, mode="sample", samples=a.samples // 2, seed=a.seed, device=a.device)
        out["verify_s"] = time.perf_counter() - t
        out.update(passed=rep.passed, inputs=rep.inputs_covered, min_margin=rep.min_margin, counts=rep.counts)
        cert = None
    out.update(n=n, k=model.params["k"].value, eta=str(model.params["eta"].value),
               eta_paper=model.params["eta_paper"].value, precision=model.precision, width=model.width)
    if cert is not None:
        out.update(passed=cert.passed, reason=cert.reason, min_margin=str(cert.min_margin), details=cert.details)
    print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
