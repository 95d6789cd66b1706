"""The torch path at large N: the exported module, the plain-torch recipe, TransformerLens's memory,
and torch float32 sampling against the exact executor.

  python benchmarks/bench_torch_scale.py --case module   [--n 65536] [--device cuda]
  python benchmarks/bench_torch_scale.py --case plain    [--n 1048576]
  python benchmarks/bench_torch_scale.py --case sampling [--n 4096] [--threads 1] [--device cuda]
  python benchmarks/bench_torch_scale.py --case lens     [--n 4096 8192]

* ``module``: ``to_torch(m, float32)`` on one input of Index Lookup (|Σ| = 64) and k-hop (k = 16,
  |Σ| = 64) at N: seconds and peak resident memory (each repeat a fresh process), beside the dense
  attention's FLOP count (every layer and head: 2 T^2 d_head for the scores and as many for the
  weighted values) at the float32 matrix-product throughput measured in the same process (torch.mm
  of 2048 x 2048 float32). Goal at N = 2^16: <= 2 GB, time <= 2 x that FLOP count's time.
* ``plain``: ``exactformer build index-lookup --n N --out DIR`` then docs/examples/plain_torch.py on
  one input in a fresh process that never imports exactformer. Goal at N = 2^20: <= 10 s, <= 4 GB.
* ``sampling``: ``xf.verify(m, mode="sample", samples=S)`` with the exact executor and with
  ``arithmetic="float32"`` (the torch module) on the same inputs, one process, ``--threads`` torch threads (1), for
  Index Lookup, Equality and k-hop, alternated ``ROUNDS`` times (medians; the same seed, so the same
  inputs each time); and the same inputs one at a time. Goal: torch >= exact. Beside
  it the machine's ceiling for the module: its FLOPs per input (``module_flops``) at the float32
  matmul throughput of the same thread.
* ``lens``: TransformerLens's forward pass on one Index Lookup input, its peak resident memory over
  the memory before it, as a multiple c of T^2 x 4 bytes (the formula of docs/exports.md).

One JSON object: medians of ``--repeats``, every run, the load average before and after, the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from bench_index_lookup import _machine  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 3  # sampling: exact and torch alternated this many times per process (medians)


def matmul_gflops(device: str = "cpu") -> float:
    """float32 torch.mm throughput (GFLOP/s) on ``device``: the median of 5 products of 2048^2."""
    import torch

    a, b = torch.randn(2048, 2048, device=device), torch.randn(2048, 2048, device=device)
    a @ b
    times = []
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * 2048**3 / statistics.median(times) / 1e9


def one_module(name: str, n: int, device: str) -> dict:
    import torch

    import exactformer as xf

    kw = {"alphabet": 64} if name == "index-lookup" else {"k": 16, "alphabet": 64}
    built = xf.build(name, n=n, **kw)
    m = built.compiled
    batch = next(iter(built.task.sample(m, 1, 0)))
    tokens = torch.as_tensor(batch.tokens, device=device)
    T = tokens.shape[1]
    # k-hop answers at every position over N + 1 answers (17 GB of float32 logits at 2^16): its last position
    last = {} if name == "index-lookup" else {"positions": [T - 1]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = built.to_torch(torch.float32, device=device, **last)
    gflops = matmul_gflops(device)
    t = time.perf_counter()
    with torch.no_grad():
        out = net(tokens)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    dense = sum(b.attn.n_heads * 4 * T * T * b.attn.d_head for b in m.blocks)
    answers = net.decode(out)
    return {"case": name, "n": n, "seconds": round(seconds, 3), "matmul_gflops": round(gflops, 1),
            "dense_attention_gflop": round(dense / 1e9, 1), "dense_seconds_at_throughput": round(dense / gflops / 1e9, 2),
            "ratio_to_dense": round(seconds / (dense / gflops / 1e9), 3), "estimate_gb": round(net.memory(T, 1) / 1e9, 3),
            "right": [str(a) for a in answers] == [str(a) for a in (batch.truth if batch.truth.ndim == 1 else batch.truth[:, -1])],
            "positions": "last" if last else "answers",
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)}


def one_plain(n: int, out: Path) -> dict:
    """Build (once) and run the recipe in a fresh process; the child's peak memory."""
    import numpy as np

    model_dir = out / f"il{n}"
    if not (model_dir / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "exactformer.cli.main", "build", "index-lookup", "--n", str(n), "--out",
                        str(model_dir), "--json"], check=True, capture_output=True)
    rng = np.random.default_rng(0)
    s, p = rng.integers(0, 64, n).tolist(), int(rng.integers(1, n + 1))
    (out / "inputs.json").write_text(json.dumps([[s, p]]))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "examples" / "plain_torch.py"), str(model_dir),
                           str(out / "inputs.json")], check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"case": "plain", "n": n, "seconds": round(seconds, 2), "right": got == [s[p - 1]],
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, 3),
            "files_bytes": sum(f.stat().st_size for f in model_dir.iterdir())}


def module_flops(module, T: int) -> float:
    """Floating-point operations of one input in ``module`` (an ExactformerTorch) beyond those
    shared by every input: the scores where the query or the key depends on the input (not where
    the query depends on its token id alone and the key on the position, unmasked: those rows are
    computed once per distinct query id of a call, shared by the inputs that ask it), the weighted
    values (every key a query sees: (q + 1) keys under a causal mask), the projections of the
    input's rows, the MLP and the unembedding at the rows computed. The float32 pass cannot skip
    any (its attention weights are nonzero), so this at the measured matmul throughput is the
    machine's ceiling for the module."""
    import numpy as np

    layers, W_U = module._layers()
    out_pos = module.output_positions(T)
    total = 0.0
    for li, L in enumerate(layers):
        qpos = out_pos if li == len(layers) - 1 else np.arange(T)
        seen = float(np.sum(qpos + 1)) if L.causal else float(len(qpos) * T)
        H, dqk, dv = L.q.W.shape[0], L.q.W.shape[2], L.v.W.shape[2]
        per_token = L.q.source == "token" and L.k.source == "position" and not L.causal
        if not L.q.source == L.k.source == "position" and not per_token:
            total += 2 * H * seen * dqk
        total += 2 * H * seen * dv
        for p, rows in ((L.q, len(qpos)), (L.k, T), (L.v, T)):
            if p.source == "input":
                total += 2 * H * rows * len(p.rows) * p.W.shape[2]
        total += 2 * len(qpos) * (L.W_in.shape[0] * L.W_in.shape[1] + L.W_out.shape[0] * L.W_out.shape[1])
    return total + 2 * len(out_pos) * W_U.shape[0] * W_U.shape[1]


def one_sampling(n: int, samples: dict, device: str = "cpu", threads: int = 1) -> list[dict]:
    import numpy as np
    import torch

    import exactformer as xf
    from exactformer.precision import parse_format
    from exactformer.verify.executor.exact import run
    from exactformer.verify.executor.torch_run import run_torch

    torch.set_num_threads(threads)  # the exact executor's numpy integer work runs on one core whatever this is
    warnings.simplefilter("ignore")
    rows = []
    for name, kw in (("index-lookup", {}), ("equality", {}), ("k-hop", {"k": 16})):
        m = xf.build(name, n=n, **kw)
        S = samples[name]
        xf.verify(m, mode="sample", samples=2, device=device)  # plans and modules built before the clock
        xf.verify(m, mode="sample", samples=2, arithmetic="float32", device=device)
        row = {"case": name, "n": n, "inputs": 2 * S, "device": device, "torch_threads": threads}
        rates: dict = {"exact": [], "torch_float32": []}
        for _ in range(ROUNDS):  # alternated, so that both see the same moments of a shared machine
            for label, arith in (("exact", "fixed"), ("torch_float32", "float32")):
                t = time.perf_counter()
                r = xf.verify(m, mode="sample", samples=S, arithmetic=arith, device=device)
                rates[label].append(2 * S / (time.perf_counter() - t))
                row[f"{label}_passed"] = r.passed
        for label, rs in rates.items():
            row[f"{label}_per_s"] = round(statistics.median(rs), 2)
        c, fmt = m.compiled, parse_format(m.compiled.precision)
        tokens = np.concatenate([b.tokens for b in m.task.sample(c, min(S, 32), 0)])
        for label, fn in (("exact_one_at_a_time_per_s", lambda t: run(c, t, fmt, device=device)),
                          ("torch_float32_one_at_a_time_per_s", lambda t: run_torch(c, t, "float32", device))):
            t0 = time.perf_counter()
            for i in range(len(tokens)):
                fn(tokens[i : i + 1])
            row[label] = round(len(tokens) / (time.perf_counter() - t0), 2)
        row["ratio_batched"] = round(row["torch_float32_per_s"] / row["exact_per_s"], 2)
        from exactformer.verify.executor.torch_run import torch_module

        flops = module_flops(torch_module(c, "float32", device), m.task.length(c))
        row["torch_flops_per_input"] = flops
        row["matmul_gflops"] = round(matmul_gflops(device), 1)  # at torch_threads
        row["torch_ceiling_per_s"] = round(row["matmul_gflops"] * 1e9 / flops, 1)  # the module at the matmul rate
        row["torch_of_ceiling"] = round(row["torch_float32_per_s"] / row["torch_ceiling_per_s"], 2)
        row["ratio_one_at_a_time"] = round(row["torch_float32_one_at_a_time_per_s"] / row["exact_one_at_a_time_per_s"], 2)
        rows.append(row)
    return rows


def one_lens(n: int) -> dict:
    import psutil
    import torch

    import exactformer as xf

    warnings.simplefilter("ignore")
    m = xf.build("index-lookup", n=n)
    bridge = m.to_transformer_lens(torch.float32)
    tokens = torch.as_tensor(next(iter(m.task.sample(m.compiled, 1, 0))).tokens)
    before = psutil.Process().memory_info().rss
    with torch.no_grad():
        bridge(tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1e3
    T = tokens.shape[1]
    return {"case": "lens", "n": n, "T": T, "forward_peak_over_before_gb": round((peak - before) / 1e9, 3),
            "c": round((peak - before) / (4 * T * T), 2)}


def fresh(args: list[str]) -> dict | list:
    out = subprocess.run([sys.executable, __file__, "--one", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=["module", "plain", "sampling", "lens"], required=True)
    ap.add_argument("--n", type=int, nargs="+")
    ap.add_argument("--name", choices=["index-lookup", "k-hop"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--samples", type=int, nargs=3, default=[2000, 200, 4], help="Index Lookup, Equality, k-hop")
    ap.add_argument("--threads", type=int, default=1, help="sampling: torch threads (1: like for like with the "
                    "exact executor's one core; the CLI runs torch's default, one per core)")
    ap.add_argument("--dir", type=Path, help="where the plain case writes its model (default: a temporary folder)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    default = {"module": [1 << 16], "plain": [1 << 20], "sampling": [4096], "lens": [4096, 8192]}[a.case]
    ns = a.n or default
    if a.one:
        n = ns[0]
        if a.case == "module":
            print(json.dumps(one_module(a.name, n, a.device)))
        elif a.case == "plain":
            print(json.dumps(one_plain(n, a.dir)))
        elif a.case == "sampling":
            print(json.dumps(one_sampling(n, dict(zip(("index-lookup", "equality", "k-hop"), a.samples)), a.device, a.threads)))
        else:
            print(json.dumps(one_lens(n)))
        return
    load_before = os.getloadavg()
    runs: list = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in ns:
            for _ in range(a.repeats):
                if a.case == "module":
                    for name in ("index-lookup", "k-hop"):
                        runs.append(fresh(["--case", "module", "--n", str(n), "--name", name, "--device", a.device]))
                elif a.case == "plain":
                    runs.append(fresh(["--case", "plain", "--n", str(n), "--dir", str(a.dir or tmp)]))
                elif a.case == "sampling":
                    runs += fresh(["--case", "sampling", "--n", str(n), "--samples", *map(str, a.samples), "--device", a.device,
                                   "--threads", str(a.threads)])
                else:
                    runs.append(fresh(["--case", "lens", "--n", str(n)]))
    groups: dict = {}
    for r in runs:
        groups.setdefault((r["case"], r["n"]), []).append(r)
    medians = {f"{c} n={n}": {k: statistics.median(r[k] for r in rs) for k, v in rs[0].items()
                              if isinstance(v, (int, float)) and not isinstance(v, bool)} for (c, n), rs in groups.items()}
    print(json.dumps({"case": a.case, "args": {k: str(v) for k, v in vars(a).items()}, "machine": _machine(),
                      "load_before": load_before, "load_after": os.getloadavg(), "median": medians, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
