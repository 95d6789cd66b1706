"""Sampled verification through the exact executor: inputs per second and peak memory.

  python benchmarks/bench_sample.py --case index-lookup  [--n 16777216 --samples 8]
  python benchmarks/bench_sample.py --case k-hop         [--n 4096 --k 16 --alphabet 64 --samples 16]
  ... [--device cuda]   (the executor's torch backend; benchmarks/gpu_session.sh runs both cases so)

Each repeat runs in a fresh process (so its peak resident memory is its own): ``xf.build`` then
``xf.verify(mode="sample", samples=S, seed=0)``, which checks S sampled inputs and as many
adversarial ones; inputs per second count both and include drawing and encoding them. Goals:
k-hop N = 2^12 >= 200 inputs/s; Index Lookup N = 2^24 >= 2 inputs/s within 4 GB.
One JSON object: the medians of ``--repeats`` runs, every run, the load average before and after,
the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script


def one(a: argparse.Namespace) -> dict:
    import exactformer as xf

    kw = {"n": a.n} if a.case == "index-lookup" else {"n": a.n, "k": a.k, "alphabet": a.alphabet}
    t0 = time.perf_counter()
    model = xf.build(a.case, **kw)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report = xf.verify(model, mode="sample", samples=a.samples, seed=0, device=a.device)
    s = time.perf_counter() - t0
    assert report.passed, report.reason
    inputs = int(report.reason.split()[0])
    return {"build_s": round(build_s, 3), "inputs": inputs, "seconds": round(s, 3),
            "inputs_per_s": round(inputs / s, 3), "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3),
            "counts": report.counts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["index-lookup", "k-hop"], required=True)
    ap.add_argument("--n", type=int)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--alphabet", type=int, default=64)
    ap.add_argument("--samples", type=int)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one run, in this process
    a = ap.parse_args()
    a.n = a.n or (1 << 24 if a.case == "index-lookup" else 4096)
    a.samples = a.samples or (8 if a.case == "index-lookup" else 16)
    if a.one:
        print(json.dumps(one(a)))
        return
    load_before = os.getloadavg()
    runs = []
    for _ in range(a.repeats):
        cmd = [sys.executable, __file__, "--one", "--case", a.case, "--n", str(a.n), "--k", str(a.k),
               "--alphabet", str(a.alphabet), "--samples", str(a.samples), "--device", a.device]
        runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout))
    med = {key: statistics.median(r[key] for r in runs) for key in ("inputs_per_s", "seconds", "peak_rss_gb", "build_s")}
    print(json.dumps({"case": a.case, "args": vars(a), "machine": _machine(), "load_before": load_before,
                      "load_after": os.getloadavg(), "median": med, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
