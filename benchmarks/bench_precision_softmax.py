"""Fixed-point softmax (exact, App. D) against float64 softmax, for (1, n) and (n, n) logits.

    python benchmarks/bench_precision_softmax.py                       # CPU, numpy
    python benchmarks/bench_precision_softmax.py --device cuda         # torch on a GPU
    python benchmarks/bench_precision_softmax.py --formats binary:int=5,frac=5 --max-log2 16 --nn-max-log2 12

Logits are random grid values in [-8, 8] (raw = value * S). The float64 baseline is numpy's
max-subtracted softmax on CPU (x - max, exp, sum, divide) and torch.softmax(float64) on CUDA.
Times are the best of ``--repeat`` runs; "ratio" is fixed / float64. Rows whose (n, n) input would not
fit the limits (--nn-max-log2) are not run and are reported as such.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time

import numpy as np


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _best(fn, repeat: int, sync=None) -> float:
    best = float("inf")
    for _ in range(repeat):
        if sync:
            sync()
        t = time.perf_counter()
        fn()
        if sync:
            sync()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--formats", default="binary:int=5,frac=5;paper:n=1024,kc=2",
                    help="';'-separated format names")
    ap.add_argument("--min-log2", type=int, default=10)
    ap.add_argument("--max-log2", type=int, default=20, help="largest n = 2^k for (1, n)")
    ap.add_argument("--nn-max-log2", type=int, default=None,
                    help="largest n for (n, n) (default: 13 on CPU, 14 on CUDA)")
    ap.add_argument("--shapes", default="1n,nn", help="which shapes: 1n, nn or both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from exactformer.precision import parse_format

    nn_max = args.nn_max_log2 if args.nn_max_log2 is not None else (13 if args.device == "cpu" else 14)
    rng = np.random.default_rng(args.seed)
    sync = None
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--device cuda: torch.cuda.is_available() is False", file=sys.stderr)
            return 2
        sync = torch.cuda.synchronize
        dev_name = torch.cuda.get_device_name(0)
    else:
        dev_name = _cpu_model()
    print(f"# device={args.device} ({dev_name}), python {platform.python_version()}, numpy {np.__version__}")
    print("| format | shape | fixed (s) | float64 (s) | ratio | saturations | underflows |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for spec in args.formats.split(";"):
        fmt = parse_format(spec)
        S = fmt.scale
        fmt.softmax(np.zeros((1, 8), dtype=np.int64))  # builds the exp table (if any) outside the timing
        for shape_kind in args.shapes.split(","):
            top = args.max_log2 if shape_kind == "1n" else nn_max + 1
            for k in range(args.min_log2, top + 1):
                n = 1 << k
                if shape_kind == "nn" and k > nn_max:
                    print(f"| {fmt.name} | ({n}, {n}) | not run | | | | (n > 2^{nn_max}: memory/time limit) |")
                    break
                shape = (1, n) if shape_kind == "1n" else (n, n)
                vals = rng.integers(-8 * S, 8 * S, size=shape, dtype=np.int64)
                if args.device == "cuda":
                    import torch

                    x = torch.from_numpy(vals).cuda()
                    xf = torch.from_numpy(vals / S).cuda()
                    fixed = lambda x=x: fmt.softmax(x)  # noqa: E731
                    flt = lambda xf=xf: torch.softmax(xf, dim=-1)  # noqa: E731
                else:
                    xf = vals / S

                    def flt(xf=xf):
                        m = xf.max(axis=-1, keepdims=True)
                        e = np.exp(xf - m)
                        return e / e.sum(axis=-1, keepdims=True)

                    fixed = lambda vals=vals: fmt.softmax(vals)  # noqa: E731
                fmt.reset_counts()
                fixed()
                c = fmt.counts.as_dict()
                tf = _best(fixed, args.repeat, sync)
                tb = _best(flt, args.repeat, sync)
                print(f"| {fmt.name} | ({shape[0]}, {n}) | {tf:.4f} | {tb:.4f} | {tf / tb:.1f} | "
                      f"{c['saturations']} | {c['underflows']} |", flush=True)
                del vals, xf
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
