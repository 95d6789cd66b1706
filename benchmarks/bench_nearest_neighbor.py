"""Nearest neighbour (Thm 7) and MQAR benchmarks: build, certify, sampled verification, size tables.

Usage:
  python benchmarks/bench_nearest_neighbor.py --case certify [--n 65536 --margin 1/4]   # goal: <= 10 s
  python benchmarks/bench_nearest_neighbor.py --case sample  [--n 4096 --samples 1000]  # goal: >= 1000 inputs/s
  python benchmarks/bench_nearest_neighbor.py --case mqar    [--n 4096]
  python benchmarks/bench_nearest_neighbor.py --case table   # docs/nearest-neighbor.md's size tables (markdown)

Prints one JSON object per case (seconds for each stage, the model's constants and the verdict);
``--case table`` prints markdown. The table derives every constant exactly as the builder does
(:func:`~exactformer.constructions.theorems.nearest_neighbor.design`), without building the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from fractions import Fraction

from bench_index_lookup import _machine  # this folder is on sys.path when a script here runs

from exactformer.constructions.theorems.mqar import MQARTask, hypercube_dim, lean_design, mqar
from exactformer.constructions.theorems.nearest_neighbor import NearestNeighborTask, design, nearest_neighbor, paper_constants
from exactformer.precision import parse_format
from exactformer.verify.certify.composed import certify
from exactformer.verify.bounds.lower_bounds import rnn_mqar_last, rnn_nearest_neighbor
from exactformer.verify.verifier import counterexample_runner, verify


def table(margins: list[Fraction], exps: range, variant: str = "two-code") -> str:
    """Widths, eta1 and precision of the built construction over N and the margin, the paper's eta
    and Thm 8's RNN lower bound ceil(N/(2p)) at the built precision p (for models that answer every
    query; docs/nearest-neighbor.md says what bounds the last-query builds)."""
    head = ["N", "margin", "k1", "k2", "d_model", "eta1", "eta1 (paper)", "eta2", "precision", "p (bits)",
            "RNN m >= N/(2p)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in margins:
        for e in exps:
            n = 1 << e
            dz = design(n, 16, g, variant, 2, None, None, None, 8)
            p = int(dz.fmt.bits)
            rows.append("| " + " | ".join([f"2^{e}", str(g), str(dz.code1.k), str(dz.code2.k), str(dz.d_model),
                                           f"{float(dz.eta1):.2f}", f"{paper_constants(n, g)['eta']:.2f}",
                                           f"{float(dz.eta2):.2f}", dz.fmt.name, str(p),
                                           str(rnn_nearest_neighbor(n, p))]) + " |")
    return "\n".join(rows)


def mqar_table(exps: range) -> str:
    """The lean MQAR build (|Sigma| = N) and the paper's reduction (hypercube symbols, margin 2/D),
    with the RNN bound for a last-query model (INDEX on the N/2 first-half labels, Prop. 9)."""
    head = ["N", "lean: k_Sigma", "k2", "d_model", "eta1", "precision", "nn: D", "margin 2/D", "k1", "d_model",
            "eta1", "precision", "RNN m >= N/(2p)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in exps:
        n = 1 << e
        code, code2, fmt, e1, _, _ = lean_design(n, n)
        D = hypercube_dim(n)
        dz = design(n, D, Fraction(2, D), "two-code", 2, None, None, None, 2 * int(round(math.log(D, 4))) + 2)
        d_lean = int(code.k) + 3 + 1 + 4 * int(code2.k)
        rows.append("| " + " | ".join([f"2^{e}", str(code.k), str(code2.k), str(d_lean), f"{float(e1):.2f}", fmt.name,
                                       str(D), str(Fraction(2, D)), str(dz.code1.k), str(dz.d_model), f"{float(dz.eta1):.2f}",
                                       dz.fmt.name, str(rnn_mqar_last(n, int(fmt.bits)))]) + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=["certify", "sample", "mqar", "table"], required=True)
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--margin", default="1/4")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.case == "table":
        print(table([Fraction(1, 2), Fraction(1, 8), Fraction(1, 32)], range(4, 21, 2)))
        print()
        print(table([Fraction(1)], range(2, 7, 2), variant="paper"))
        print()
        print(mqar_table(range(4, 21, 4)))
        return
    out: dict = {"case": a.case, "machine": _machine(), "margin": a.margin}
    t = time.perf_counter()
    if a.case == "mqar":
        n = a.n or 4096
        model, task = mqar(n), MQARTask()
    else:
        n = a.n or (1 << 16 if a.case == "certify" else 4096)
        model, task = nearest_neighbor(n, margin=Fraction(a.margin)), NearestNeighborTask()
    out.update(n=n, build_s=time.perf_counter() - t, d_model=model.d_model, d_head=model.d_head,
               precision=model.precision, eta1=str(model.params["eta"].value), k=model.params["k"].value)
    fmt = parse_format(model.precision)
    if a.case in ("certify", "mqar"):
        t = time.perf_counter()
        cert = certify(model, fmt, task, run_candidates=counterexample_runner(fmt))
        out.update(certify_s=time.perf_counter() - t, passed=cert.passed, reason=cert.reason[:200])
    if a.case in ("sample", "mqar"):
        verify(model, "sample", samples=8, seed=a.seed)  # the plan (input-independent) is built once
        t = time.perf_counter()
        r = verify(model, "sample", samples=a.samples // 2, seed=a.seed)
        s = time.perf_counter() - t
        out.update(sample_s=s, inputs=r.inputs_covered, inputs_per_s=r.inputs_covered / s, sample_passed=r.passed)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
