"""Default builds run as users run them, on samples: the exported torch module in
float64, float32, bfloat16 and float16, and TransformerLens 4 in float32 and float64.

Usage:
  python benchmarks/bench_float_samples.py [--n 16 64 256] [--samples 500] [--seed 0]
  python benchmarks/bench_float_samples.py --lens --n 4096 --constructions index-lookup --samples 10000

Every input is either all of them (when the construction has at most --exhaustive-limit inputs)
or ``--samples`` seeded random inputs plus as many of the task's adversarial ones (seed + 1). The
truth is the task's ground truth. Prints one Markdown row per (construction, N, arithmetic): the
fraction answered right and the first wrong input. float32/float64 are certified by the default
builds (a wrong answer there is a bug); bfloat16/float16 are measured only.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch

import exactformer as xf
from exactformer.constructions.export.floats import ArithmeticWarning
from exactformer.verify.executor.exact import decode_logits
from exactformer.verify.executor.torch_run import run_torch

CONSTRUCTIONS = ("index-lookup", "equality", "inequality", "disjointness", "dnf", "cnf", "threshold",
                 "nearest-neighbor", "mqar", "match2")
TORCH = ("float64", "float32", "bfloat16", "float16")
LENS = {"lens float64": torch.float64, "lens float32": torch.float32}


def batches(m, samples: int, seed: int, exhaustive_limit: int):
    task = m.task
    if task.count(m.compiled) <= exhaustive_limit:
        return list(task.exhaustive(m.compiled)), "exhaustive"
    return list(task.adversarial(m.compiled, samples, seed + 1)) + list(task.sample(m.compiled, samples, seed)), \
        f"{samples} sampled (seed {seed}) + adversarial"


def lens_runner(m, dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ArithmeticWarning)
        bridge = m.to_transformer_lens(dtype)

    def run(tokens: np.ndarray) -> list[list]:
        pos = torch.as_tensor(m.compiled.answer_positions_for(tokens.shape[1]))
        out = []
        for s in range(0, len(tokens), 16):
            with torch.no_grad():
                logits = bridge(torch.as_tensor(tokens[s:s + 16]))[:, pos].double()
            out += decode_logits(m.compiled, logits.numpy())[0]  # strict argmax; ties answer None
        return out
    return run


def torch_runner(m, dtype: str):
    return lambda tokens: run_torch(m.compiled, tokens, dtype).answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--constructions", nargs="+", default=list(CONSTRUCTIONS), choices=CONSTRUCTIONS)
    ap.add_argument("--n", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--samples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exhaustive-limit", type=int, default=1 << 12)
    ap.add_argument("--lens", action="store_true", help="TransformerLens float64/float32 instead of the torch module")
    a = ap.parse_args()
    print("| construction | N | arithmetic | designed for (params arithmetics) | inputs | right | first wrong input | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.constructions:
        for n in a.n:
            try:
                m = xf.build(name, n=n)
            except ValueError as e:
                print(f"| {name} | {n} | — | — | not built: {e} | | | |", flush=True)
                continue
            bs, how = batches(m, a.samples, a.seed, a.exhaustive_limit)
            certified = set(m.params["arithmetics"].value) if "arithmetics" in m.params else set()
            runners = {k: lens_runner(m, d) for k, d in LENS.items()} if a.lens else \
                {k: torch_runner(m, k) for k in TORCH}
            for label, runner in runners.items():
                t0, right, total, first = time.perf_counter(), 0, 0, None
                for b in bs:
                    got = np.array([[-1 if x is None else x for x in row] for row in runner(b.tokens)])
                    truth = np.asarray(b.truth).reshape(got.shape)
                    ok = (got == truth).all(axis=1)
                    right += int(ok.sum())
                    total += len(ok)
                    if first is None and not ok.all():
                        first = b.example(int(np.flatnonzero(~ok)[0]))
                dt = time.perf_counter() - t0
                arith = label.removeprefix("lens ")
                cert = "yes" if arith in certified else "no"
                shown = "—" if first is None else str(first)[:60]
                print(f"| {name} | {n} | {label} | {cert} | {total} ({how}) | {100 * right / total:.2f} % | "
                      f"{shown} | {dt:.1f} |", flush=True)


if __name__ == "__main__":
    main()
