"""MQAR's build (lean, the defaults) at large N: seconds, peak RSS, the positional table's dense rows,
and a compact save and a load in a fresh process (docs/benchmarks.md, "MQAR's build without a
dense positional table").

Every repeat is a fresh Python process (its peak RSS is its own, ``ru_maxrss``); the table gives
medians of the seconds and the largest peak RSS, with the load average before and after.
``--pythonpath DIR`` runs the children on another checkout (a directory holding an
``exactformer`` package), e.g. an older commit unpacked with ``git archive``, for a before/after
comparison; ``--limit-gb`` caps each child's address space (a build that would allocate more fails
with numpy's allocation error instead of swapping the machine).

    python benchmarks/bench_mqar_build.py [--n 2^16,2^20] [--repeats 3] [--save] [--pythonpath DIR]
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

BUILD = r'''
import json, os, resource, sys, time
t = time.perf_counter()
import exactformer as xf
n, out_dir = int(sys.argv[1]), sys.argv[2]
t1 = time.perf_counter()
m = xf.build("mqar", n=n)
res = {"import_s": t1 - t, "build_s": time.perf_counter() - t1,
       "dense_pos_rows": int(m.compiled.pos_embed.table.shape[0]), "d_model": int(m.compiled.d_model)}
if out_dir:
    t2 = time.perf_counter()
    xf.save(m, out_dir, certify=False, dense=False)
    res["save_s"] = time.perf_counter() - t2
    res["files_mb"] = sum(os.path.getsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir)) / 1e6
res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(res))
'''

LOAD = r'''
import json, resource, sys, time
import numpy as np
import exactformer as xf
t = time.perf_counter()
m = xf.load(sys.argv[1])
c = m.compiled
res = {"load_s": time.perf_counter() - t, "loaded_dense_pos_rows": int(c.pos_embed.table.shape[0])}
col, n = c.layout["FX"][0], c.n
res["fx_ok"] = c.pos_embed.values(np.array([0, n - 1, n, 2 * n - 2])).num[:, col].tolist() == [0, 0, 1, 1]
res["load_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print("RESULT " + json.dumps(res))
'''


def parse_n(text: str) -> int:
    return 1 << int(text[2:]) if text.startswith("2^") else int(text)


def child(code: str, args: list[str], env: dict, limit_gb: float, timeout: float, cwd: str) -> dict:
    def cap() -> None:
        lim = int(limit_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))

    try:
        p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                           preexec_fn=cap, timeout=timeout, cwd=cwd)  # cwd: no checkout shadows PYTHONPATH
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="2^16,2^20", help="comma list of N: integers or 2^k")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--save", action="store_true", help="also save compact (dense=False) and load in a fresh process")
    ap.add_argument("--pythonpath", default=None, help="run the children on this checkout (PYTHONPATH)")
    ap.add_argument("--limit-gb", type=float, default=20.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    a = ap.parse_args()
    env = dict(os.environ)
    if a.pythonpath:
        env["PYTHONPATH"] = a.pythonpath
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg(),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [parse_n(x) for x in a.n.split(",")]:
            runs = []
            for i in range(a.repeats):
                d = os.path.join(tmp, f"m{n}_{i}") if a.save else ""
                r = child(BUILD, [str(n), d], env, a.limit_gb, a.timeout, tmp)
                if a.save and "error" not in r:
                    r |= child(LOAD, [d], env, a.limit_gb, a.timeout, tmp)
                runs.append(r)
            ok = [r for r in runs if "error" not in r]
            row: dict = {"repeats": len(runs), "errors": sorted({r["error"] for r in runs if "error" in r})}
            for key in sorted({k for r in ok for k in r if k.endswith("_s")}):
                row[key] = round(statistics.median(r[key] for r in ok if key in r), 3)
            for key in ("peak_rss_mb", "load_rss_mb", "files_mb"):
                if any(key in r for r in ok):
                    row[key] = round(max(r[key] for r in ok if key in r), 1)
            for key in ("dense_pos_rows", "d_model", "loaded_dense_pos_rows", "fx_ok"):
                if any(key in r for r in ok):
                    row[key] = ok[0][key]
            out["cases"][n] = row
            print(n, json.dumps(row), flush=True)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
