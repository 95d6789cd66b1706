"""Exact fixed-point matmul against float64 matmul on the executor's shapes.

    python benchmarks/bench_precision_matmul.py [--device cuda] [--batch 16] [--format binary:int=5,frac=5]

Cases (raw values random; "int-valued" = multiples of S, i.e. the fast path):
  attention   a [B, 1, 65536] (weights in [0, 1]) @ v [B, 65536, 8]: v int-valued / v fractional
  projection  [65536, 518] @ [518, 256]: W in {-1, 0, 1} (fast) / W in {0, +-1/2, 1/4} (indicator path)
  general     [512, 518] @ [518, 256], both fractional (elementwise path)
"""

from __future__ import annotations

import argparse

import numpy as np

from bench_precision_softmax import _best  # benchmarks/ is on sys.path when run as a script


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--format", default="binary:int=5,frac=5")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    from exactformer.precision import parse_format

    fmt = parse_format(args.format)
    S = fmt.scale
    rng = np.random.default_rng(0)
    B = args.batch
    cases = [
        ("attention, v int-valued", rng.integers(0, S + 1, size=(B, 1, 65536)), rng.integers(0, 2, size=(B, 65536, 8)) * S),
        ("attention, v fractional", rng.integers(0, S + 1, size=(B, 1, 65536)), rng.integers(-S, S, size=(B, 65536, 8))),
        ("projection, W in {-1,0,1}", rng.integers(-4 * S, 4 * S, size=(65536, 518)), rng.choice([-S, 0, S], size=(518, 256))),
        ("projection, W in {0,+-1/2,1/4}", rng.integers(-4 * S, 4 * S, size=(65536, 518)),
         rng.choice([-S // 2, 0, S // 2, S // 4], size=(518, 256))),
        ("general 512x518x256", rng.integers(-4 * S, 4 * S, size=(512, 518)), rng.integers(-S, S, size=(518, 256))),
    ]
    sync = None
    if args.device == "cuda":
        import torch

        sync = torch.cuda.synchronize
    print(f"# {fmt.name}, device={args.device}, batch={B}")
    print("| case | shapes | fixed (s) | float64 (s) | ratio |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, a, b in cases:
        if args.device == "cuda":
            import torch

            ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            fa, fb = ta.double() / S, tb.double() / S
            fixed = lambda ta=ta, tb=tb: fmt.matmul(ta, tb)  # noqa: E731
            flt = lambda fa=fa, fb=fb: torch.matmul(fa, fb)  # noqa: E731
        else:
            fa, fb = a / S, b / S
            fixed = lambda a=a, b=b: fmt.matmul(a, b)  # noqa: E731
            flt = lambda fa=fa, fb=fb: np.matmul(fa, fb)  # noqa: E731
        times = []
        for fn in (fixed, flt):
            fn()
            times.append(_best(fn, args.repeat, sync))
        print(f"| {name} | {tuple(a.shape)} @ {tuple(b.shape)} | {times[0]:.3f} | {times[1]:.3f} | "
              f"{times[0] / times[1]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
