"""Paper 2 as weights: build, certify and sampled verification of induction heads / k-hop, and the
MPC simulation of prefix sums (docs/mpc.md "Weights"; results in docs/benchmarks.md).

Usage:
  python benchmarks/bench_paper2_weights.py --case khop-certify   [--n 65536 --k 1024 --alphabet 64]
  python benchmarks/bench_paper2_weights.py --case induction-certify [--n 1048576 --alphabet 64]
  python benchmarks/bench_paper2_weights.py --case khop-sample    [--n 4096 --k 16 --alphabet 64 --inputs 1000]
  python benchmarks/bench_paper2_weights.py --case prefix-sums    [--n 64 --word-bits 4 --inputs 100]

``khop-certify`` / ``induction-certify``: ``xf.build`` then ``xf.verify(mode="certify")`` (goals:
k-hop N = 2^16, k = 1024 build <= 10 s, certify <= 60 s; induction heads N = 2^20 certify <= 30 s).
``khop-sample``: ``xf.verify(mode="sample")`` through the exact executor, inputs per second of the
whole run (adversarial inputs included; goal at N = 2^12: >= 200 inputs/s). ``prefix-sums``: the
five-way MPC check (the invariant at the weights) and ``xf.verify`` sampled. Every case runs
``--repeats`` times; one JSON object: the medians, every run, the load average before and after,
the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

import exactformer as xf
from exactformer.verify.mpc import check


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def certify(name: str, kw: dict) -> dict:
    model, build_s = _timed(lambda: xf.build(name, **kw))
    report, certify_s = _timed(lambda: xf.verify(model, mode="certify"))
    assert report.passed, report.reason
    return {"build_s": build_s, "certify_s": certify_s, "layers": len(model.compiled.blocks),
            "width": model.summary()["d_model"], "precision": model.precision}


def sample(kw: dict, inputs: int) -> dict:
    model = xf.build("k-hop", **kw)
    report, s = _timed(lambda: xf.verify(model, mode="sample", samples=inputs, seed=0))
    assert report.passed, report.reason
    covered = int(report.reason.split()[0])
    return {"inputs": covered, "seconds": s, "inputs_per_s": covered / s}


def prefix_sums(n: int, word_bits: int, inputs: int) -> dict:
    m = check.build("prefix-sums", n, word_bits=word_bits)
    r, check_s = _timed(lambda: m.verify("sample", samples=inputs, seed=0))
    assert r.passed, r.reason
    model = xf.build("prefix-sums", n=n, word_bits=word_bits)
    v, verify_s = _timed(lambda: xf.verify(model, mode="sample", samples=inputs, seed=0))
    assert v.passed, v.reason
    return {"five_way_inputs": r.inputs, "five_way_s": check_s, "verify_s": verify_s,
            "verify_inputs": int(v.reason.split()[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["khop-certify", "induction-certify", "khop-sample", "prefix-sums"],
                    required=True)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--alphabet", type=int, default=64)
    ap.add_argument("--word-bits", type=int, default=4)
    ap.add_argument("--inputs", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    load_before = os.getloadavg()
    runs = []
    for _ in range(a.repeats):
        if a.case == "khop-certify":
            runs.append(certify("k-hop", dict(n=a.n or 1 << 16, k=a.k or 1024, alphabet=a.alphabet)))
        elif a.case == "induction-certify":
            runs.append(certify("induction-heads", dict(n=a.n or 1 << 20, alphabet=a.alphabet)))
        elif a.case == "khop-sample":
            runs.append(sample(dict(n=a.n or 1 << 12, k=a.k or 16, alphabet=a.alphabet), a.inputs or 1000))
        else:
            runs.append(prefix_sums(a.n or 64, a.word_bits, a.inputs or 100))
    numeric = [k for k, v in runs[0].items() if isinstance(v, float)]
    print(json.dumps({"case": a.case, "args": vars(a), "machine": _machine(),
                      "load_before": [round(x, 2) for x in load_before],
                      "load_after": [round(x, 2) for x in os.getloadavg()],
                      "median": {k: round(statistics.median(r[k] for r in runs), 3) for k in numeric},
                      "runs": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()} for r in runs]},
                     indent=1))


if __name__ == "__main__":
    main()
