"""Exact-Match Attention and ANNA (Alg. 1) at long context, beside dense softmax attention.

    python benchmarks/bench_ema.py                         # all parts, CPU
    python benchmarks/bench_ema.py --parts ema --max-log2 20 --d 64
    python benchmarks/bench_ema.py --parts ema --device cuda

Parts (markdown tables on stdout):

* ``ema``: exact_match_attention (ideal semantics; numpy on the CPU, torch on CUDA), N = Nq = Nk
  from 2^min-log2 to 2^max-log2, value width --d, one int64 word per key, for the key patterns
  ``unique`` (a permutation: every query one match), ``random`` (keys and queries uniform in [0, N):
  about 37% of queries match nothing, groups of every small size), ``few:16`` (16 distinct keys:
  groups of ~N/16) and ``all`` (one group of N). Best of --repeat; every result is checked on 64
  sampled queries against the dense reference. Also torch on the CPU and the fixed-point semantics
  at the largest N, and --big-log2 with --big-d where memory allows.
* ``dense``: float64 softmax attention of the lowered head (torch, blocks of rows; N^2 scores)
  for N up to --dense-max-log2.
* ``anna``: Alg. 1 with bit sampling on planted data in {0,1}^64 (near: <= 2 flipped bits, c = 3),
  ℓ and z from Thm 3.4 at each N; the least-squares slope of log time against log N beside the
  predicted 1 + 3ρ and the slope of the cost model N ℓ z.
* ``fail``: Def. 3.3 failures against ℓ (planted data, N = 1024, {0,1}^128, <= 4 flips, c = 3,
  z from Thm 3.4), over --seeds seeds: measured near-failure rate per query and frequency of a
  failed run, beside the exact per-query prediction mean (1 - p^z)^ℓ and the union bounds.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time

import numpy as np

from bench_precision_softmax import _best, _cpu_model  # benchmarks/ is on sys.path when run as a script


def _patterns(n: int, rng) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {
        "unique": (np.arange(n), rng.permutation(n)),
        "random": (rng.integers(0, n, n), rng.integers(0, n, n)),
        "few:16": (rng.integers(0, 16, n), rng.integers(0, 16, n)),
        "all": (np.zeros(n, np.int64), np.zeros(n, np.int64)),
    }


def _spot_check(q, k, v, res, rng, fmt=None) -> None:
    from exactformer.verify.attention.ema import ema_dense_reference

    def host(x):
        return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)

    n = q.shape[0]
    rows = [(0, int(i)) for i in rng.integers(0, n, 64)]
    ref = ema_dense_reference(q, k, v, fmt=fmt, rows=rows)
    count, total = host(res.count), host(res.total)
    for _, i in rows:
        assert int(count[i]) == int(ref.count[0, i]) and total[i].tolist() == ref.total[0, i].tolist(), i


def bench_ema(args) -> None:
    import torch

    from exactformer.precision import FixedPoint
    from exactformer.verify.attention.ema import exact_match_attention

    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else None
    print(f"\n### EMA, exact (ideal semantics), d = {args.d}, {'torch CUDA' if cuda else 'numpy'}, best of {args.repeat}\n")
    names = list(_patterns(4, np.random.default_rng(0)))
    print("| N | " + " | ".join(f"{p} (s)" for p in names) + " |")
    print("| ---: | " + " | ".join("---:" for _ in names) + " |")
    rng = np.random.default_rng(args.seed)
    for lg in range(args.min_log2, args.max_log2 + 1, 2):
        n = 1 << lg
        v = rng.integers(-1000, 1000, (n, args.d))
        row = []
        for name, (qi, ki) in _patterns(n, rng).items():
            q, k = qi[:, None], ki[:, None]
            Q, K, V = (torch.from_numpy(x).cuda() for x in (q, k, v)) if cuda else (q, k, v)
            res = exact_match_attention(Q, K, V)
            _spot_check(q, k, v, res, rng)
            row.append(_best(lambda: exact_match_attention(Q, K, V), args.repeat, sync))
        print(f"| 2^{lg} | " + " | ".join(f"{t:.4f}" for t in row) + " |")
        sys.stdout.flush()

    n = 1 << args.max_log2
    v = rng.integers(-1000, 1000, (n, args.d))
    pats = _patterns(n, rng)
    print(f"\n### EMA at N = 2^{args.max_log2}, d = {args.d}: backends and semantics (best of {args.repeat})\n")
    print("| pattern | numpy ideal (s) | torch CPU ideal (s) | numpy binary:int=24,frac=12 (s) |")
    print("| --- | ---: | ---: | ---: |")
    fmt = FixedPoint.binary(24, 12)
    for name, (qi, ki) in pats.items():
        q, k = qi[:, None], ki[:, None]
        t_np = _best(lambda: exact_match_attention(q, k, v), args.repeat)
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        res = exact_match_attention(tq, tk, tv)
        _spot_check(q, k, v, res, rng)
        t_t = _best(lambda: exact_match_attention(tq, tk, tv), args.repeat)
        vf = v * fmt.scale
        res = exact_match_attention(q, k, vf, fmt=fmt)
        _spot_check(q, k, vf, res, rng, fmt)
        t_f = _best(lambda: exact_match_attention(q, k, vf, fmt=fmt), args.repeat)
        print(f"| {name} | {t_np:.4f} | {t_t:.4f} | {t_f:.4f} |")
        sys.stdout.flush()

    if args.big_log2:
        n = 1 << args.big_log2
        print(f"\n### EMA at N = 2^{args.big_log2}, d = {args.big_d} (numpy, one run each)\n")
        print("| pattern | seconds | peak RSS so far (GiB) |")
        print("| --- | ---: | ---: |")
        v = rng.integers(-1000, 1000, (n, args.big_d))
        for name in ("unique", "random"):
            qi, ki = _patterns(n, rng)[name] if name == "unique" else (rng.integers(0, n, n), rng.integers(0, n, n))
            q, k = qi[:, None], ki[:, None]
            t = time.perf_counter()
            res = exact_match_attention(q, k, v)
            t = time.perf_counter() - t
            _spot_check(q, k, v, res, rng)
            del res
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"| {name} | {t:.3f} | {rss:.1f} |")
            sys.stdout.flush()


def bench_dense(args) -> None:
    import torch

    from exactformer.precision import FixedPoint
    from exactformer.verify.attention.ema import exact_match_attention, lowered_head_vectors

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    print(f"\n### dense float64 softmax attention (lowered head, random keys), d = {args.d}, torch {args.device}\n")
    print("| N | scores | dense (s) | EMA numpy (s) | max abs error vs exact EMA mean |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(args.seed)
    grid = FixedPoint(1, -(1 << 60), 1 << 60)
    for lg in range(args.min_log2, args.dense_max_log2 + 1):
        n = 1 << lg
        qi, ki = rng.integers(0, n, n), rng.integers(0, n, n)
        v = rng.integers(-1000, 1000, (n, args.d))
        Qi, Ki = lowered_head_vectors(qi, ki, bits=max(2, lg), eta=1, fmt=grid)
        eta = math.log(n) + 20
        Qt = torch.from_numpy(Qi * eta).to(dev)
        Kt = torch.from_numpy(Ki.astype(np.float64)).to(dev)
        Vt = torch.from_numpy(np.concatenate([np.zeros((1, args.d)), v]).astype(np.float64)).to(dev)
        out = torch.empty((n, args.d), dtype=torch.float64, device=dev)
        rows = max(1, (1 << 24) // (n + 1))

        def dense():
            for r0 in range(0, n, rows):
                out[r0:r0 + rows] = torch.softmax(Qt[r0:r0 + rows] @ Kt.T, -1) @ Vt

        t_d = _best(dense, 1 if lg >= 14 else args.repeat, sync)
        q, k = qi[:, None], ki[:, None]
        t_e = _best(lambda: exact_match_attention(q, k, v), args.repeat)
        ex = exact_match_attention(q, k, v)
        mean = np.where(ex.count[:, None] > 0, ex.total / np.maximum(ex.count, 1)[:, None], 0.0)
        err = float(np.abs(out.cpu().numpy() - mean).max())
        print(f"| 2^{lg} | {n * (n + 1):.3g} | {t_d:.4f} | {t_e:.4f} | {err:.2e} |")
        sys.stdout.flush()


def bench_anna(args) -> None:
    from exactformer.verify.attention.anna import BitSampling, LSHAttention, planted_data, thm34

    dim, flips, c = 64, 2, 3
    p1, p2 = 1 - flips / dim, 1 - c * c * flips / dim
    rho = math.log(p1) / math.log(p2)
    print(f"\n### ANNA (Alg. 1, bit sampling) time against N: {{0,1}}^{dim}, r^2 = {flips}, c = {c}, "
          f"p1 = {p1:.5f}, p2 = {p2:.5f}, ρ = {rho:.4f}; ℓ, z from Thm 3.4 at each N; values [N, 1]\n")
    print("| N | z | ℓ | N ℓ z | seconds |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    xs, ts, cs = [], [], []
    for lg in range(args.anna_min_log2, args.anna_max_log2 + 1):
        n = 1 << lg
        th = thm34(n, p1, p2)
        pd = planted_data(n, n, dim, flips, planted=0.9, seed=args.seed)
        lsh = LSHAttention(BitSampling(), dim, tables=th.tables, hashes=th.hashes, seed=args.seed)
        v = np.arange(n)[:, None]
        t = _best(lambda: lsh(pd.queries, pd.keys, v), 1 if lg >= 13 else args.repeat)
        xs.append(math.log(n))
        ts.append(math.log(t))
        cs.append(math.log(n * th.tables * th.hashes))
        print(f"| 2^{lg} | {th.hashes} | {th.tables} | {n * th.tables * th.hashes:.3g} | {t:.3f} |")
        sys.stdout.flush()
    slope = np.polyfit(xs, ts, 1)[0]
    model = np.polyfit(xs, cs, 1)[0]
    half = len(xs) // 2
    upper = np.polyfit(xs[half:], ts[half:], 1)[0]
    print(f"\nfitted exponent (log time on log N, all rows): {slope:.3f}; upper half: {upper:.3f}; "
          f"predicted 1 + 3ρ = {1 + 3 * rho:.3f}; slope of N ℓ z over the same N: {model:.3f}")


def bench_fail(args) -> None:
    from exactformer.verify.attention.anna import BitSampling, LSHAttention, check_conditions, planted_data, thm34

    n, dim, flips, c = 1024, 128, 4, 3
    pd = planted_data(n, n, dim, flips, seed=args.seed)
    p1, p2 = 1 - flips / dim, 1 - c * c * flips / dim
    z = thm34(n, p1, p2).hashes
    p = (1 - pd.flips / dim) ** z
    print(f"\n### Def. 3.3 failures against ℓ: N = {n}, {{0,1}}^{dim}, planted flips <= {flips}, c = {c}, "
          f"z = {z} (Thm 3.4), {args.seeds} seeds\n")
    print("| ℓ | near-failure rate / query | predicted mean (1-p^z)^ℓ | far failures | runs failed | "
          "union bound (data) | Thm 3.4 η |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for ell in (1, 2, 4, 8, 16, 32, 64):
        near, far, failed, ub = [], 0, 0, []
        for s in range(args.seeds):
            lsh = LSHAttention(BitSampling(), dim, tables=ell, hashes=z, seed=1000 * ell + s)
            rep = check_conditions(lsh, pd.queries, pd.keys, r_sq=pd.r_sq, approx_c=c)
            near.append(rep.near_rate)
            far += rep.far_failures
            failed += rep.failed
            ub.append(rep.union_bound)
        pred = float(((1 - p) ** ell).mean())
        eta = thm34(n, p1, p2, tables=ell, hashes=z).fail_prob
        print(f"| {ell} | {np.mean(near):.5f} | {pred:.5f} | {far} | {failed}/{args.seeds} | {min(1.0, ub[0]):.3g} | "
              f"{eta:.3g} |")
        sys.stdout.flush()
    th = thm34(n, p1, p2)
    print(f"\nThm 3.4 at N = {n}: z = {th.hashes}, ℓ = {th.tables}, η ≤ {th.fail_prob:.3g} (ρ = {th.rho:.4f})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="ema,dense,anna,fail")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--min-log2", type=int, default=10)
    ap.add_argument("--max-log2", type=int, default=20)
    ap.add_argument("--big-log2", type=int, default=0, help="one more EMA size (0: none)")
    ap.add_argument("--big-d", type=int, default=8)
    ap.add_argument("--dense-max-log2", type=int, default=14)
    ap.add_argument("--anna-min-log2", type=int, default=8)
    ap.add_argument("--anna-max-log2", type=int, default=14)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import torch

    print(f"machine: {_cpu_model()}, torch threads {torch.get_num_threads()}, numpy {np.__version__}, "
          f"torch {torch.__version__}, device {args.device}")
    parts = {"ema": bench_ema, "dense": bench_dense, "anna": bench_anna, "fail": bench_fail}
    for name in args.parts.split(","):
        parts[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
