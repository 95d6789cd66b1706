"""MPC → EMA benchmarks (P2 Thm 4.1 and §5): compiled-program verification and L1/L2 timing.

Usage:
  python benchmarks/bench_mpc.py --case khop      [--n 65536 --hops 1024 --inputs 100 --batch 10]
  python benchmarks/bench_mpc.py --case khop-full [--n 65536 --hops 1024 --inputs 20]
  python benchmarks/bench_mpc.py --case rgs       [--n 10 --hops 3]
  python benchmarks/bench_mpc.py --case match2    [--n 32 --inputs 10000]
  python benchmarks/bench_mpc.py --case match2-lowered [--n 65536 --inputs 100]
  python benchmarks/bench_mpc.py --case push      [--n 65536 --inputs 100]

``khop``: the goal case — the compiled program (L2, in the model's coarsest exact fixed-point format)
on ``--inputs`` seeded random inputs, checked against the ground truth; then the protocol run
directly (L1) on the same inputs, and the ratio L2 / L1 (goal: <= 5). ``khop-full``: the four-way
check (L1 with resource checks, L2 ideal, L2 fixed point, the per-round invariant, the truth).
``rgs``: every restricted growth string of length n (Bell(n) inputs), four-way. ``match2``: P2's
N = 32, M = 37 setting, four-way with the lowered softmax model (L3, heads compared bit for bit).
``match2-lowered``: the softmax model alone at --n (M = 37): build, the all-inputs certificate,
and --inputs sampled inputs (plus as many adversarial) through the exact executor (0: none). ``push``: the push-only protocols, prefix
sums (B = 16, N = --n) and Columnsort (N = 1024).
Prints one JSON object per case: wall and CPU seconds per stage (CPU time is the better measure on
a shared machine), the model's sizes and the verdict.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

from exactformer.constructions.core import registry
from exactformer.verify.mpc import program_run as ema_program, protocol_run as mpc
from exactformer.verify.mpc.check import build
from exactformer.verify.verifier import verify


def _timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, round(time.perf_counter() - t0, 2), round(time.process_time() - c0, 2)


def _inputs(model, count: int, batch: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [model.application.draw(model, rng, min(batch, count - lo)) for lo in range(0, count, batch)]


def khop(a) -> dict:
    model, build_s, _ = _timed(lambda: build("k-hop", a.n, hops=a.hops))
    xs = _inputs(model, a.inputs, a.batch, a.seed)

    def compiled():
        ok = True
        for x in xs:
            out = ema_program.run(model.program, x, model.fmt).outputs
            ok &= bool(np.array_equal(out, model.application.truth(model, x)))
        return ok

    ok, l2_s, l2_cpu = _timed(compiled)
    _, l1_s, l1_cpu = _timed(lambda: [mpc.run(model.protocol, x) for x in xs])
    r = model.resources
    return {"case": "khop", "n": a.n, "hops": a.hops, "inputs": a.inputs, "seed": a.seed, "passed": ok,
            "format": model.fmt.name, "layers": r.layers, "heads": list(r.heads), "build_s": build_s,
            "l2_fixed_plus_truth_s": l2_s, "l2_cpu_s": l2_cpu, "l1_s": l1_s, "l1_cpu_s": l1_cpu,
            "ratio_l2_over_l1_cpu": round(l2_cpu / max(l1_cpu, 1e-9), 2)}


def khop_full(a) -> dict:
    model = build("k-hop", a.n, hops=a.hops)
    rep, s, cpu = _timed(lambda: model.verify("sample", samples=a.inputs, seed=a.seed, batch=a.batch))
    return {"case": "khop-full", "n": a.n, "hops": a.hops, "passed": rep.passed, "inputs": rep.inputs,
            "sources": rep.sources, "levels": rep.levels, "seconds": s, "cpu_s": cpu, "reason": rep.reason,
            "max_matches": rep.max_matches, "lost_matches": rep.lost_matches}


def rgs(a) -> dict:
    model = build("k-hop", a.n, hops=a.hops)
    rep, s, cpu = _timed(lambda: model.verify("exhaustive"))
    return {"case": "rgs", "n": a.n, "hops": a.hops, "passed": rep.passed, "inputs": rep.inputs,
            "levels": rep.levels, "seconds": s, "cpu_s": cpu, "reason": rep.reason}


def match2(a) -> dict:
    model = build("match2", a.n, modulus=37)
    rep, s, cpu = _timed(lambda: model.verify("sample", samples=a.inputs, seed=a.seed))
    r = model.resources
    return {"case": "match2", "n": a.n, "modulus": 37, "passed": rep.passed, "inputs": rep.inputs,
            "levels": rep.levels, "heads_compared": rep.heads_compared, "layers": r.layers, "heads": r.max_heads,
            "m": r.m, "format": model.fmt.name, "seconds": s, "cpu_s": cpu}


def match2_lowered(a) -> dict:
    m, build_s, build_cpu = _timed(lambda: registry.get("match2").builder(n=a.n, modulus=37))
    cert, cert_s, cert_cpu = _timed(lambda: verify(m, "certify"))
    rep, s, cpu = _timed(lambda: verify(m, "sample", samples=a.inputs, seed=a.seed)) if a.inputs else (None, 0.0, 0.0)
    return {"case": "match2-lowered", "n": a.n, "modulus": 37, "format": m.precision, "eta": str(m.params["eta"].value),
            "d_model": m.d_model, "build_s": build_s, "build_cpu_s": build_cpu, "certified": cert.passed,
            "certify_s": cert_s, "certify_cpu_s": cert_cpu, "sampled": rep and rep.inputs_covered, "sample_passed": rep and rep.passed,
            "sample_s": s, "sample_cpu_s": cpu}


def push(a) -> dict:
    out = {"case": "push", "inputs": a.inputs}
    for name, n, kw in (("prefix-sums", a.n, {"word_bits": 16, "fan_in": 16}), ("sort", 1024, {"value_bits": 10})):
        model = build(name, n, **kw)
        rep, s, cpu = _timed(lambda: model.verify("sample", samples=a.inputs, seed=a.seed, batch=a.batch))
        r = model.resources
        out[name] = {"n": n, "passed": rep.passed, "inputs": rep.inputs, "layers": r.layers, "heads": list(r.heads),
                     "m": r.m, "memory": r.memory, "seconds": s, "cpu_s": cpu}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["khop", "khop-full", "rgs", "match2", "match2-lowered", "push"], required=True)
    ap.add_argument("--n", type=int)
    ap.add_argument("--hops", type=int)
    ap.add_argument("--inputs", type=int)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    defaults = {"khop": (65536, 1024, 100), "khop-full": (65536, 1024, 20), "rgs": (10, 3, 0),
                "match2": (32, 1, 10000), "match2-lowered": (65536, 1, 100), "push": (65536, 1, 100)}[a.case]
    a.n = a.n or defaults[0]
    a.hops = a.hops or defaults[1]
    a.inputs = a.inputs if a.inputs is not None else defaults[2]
    fn = {"khop": khop, "khop-full": khop_full, "rgs": rgs, "match2": match2, "match2-lowered": match2_lowered,
          "push": push}[a.case]
    res = fn(a)
    res["machine"] = _machine()
    res["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(res))


if __name__ == "__main__":
    main()
