"""Build, certify and save at N = 2^24 .. 2^30 (docs/benchmarks.md, "N = 2^30").

Each case runs in a fresh Python process (its peak RSS is its own), ``--repeats`` times; the
table gives the median seconds of each step and the largest peak RSS, with the machine's load
average before and after. Cases:

* ``il24``: Index Lookup (|Sigma| = 64) at N = 2^24, built then certified (fixed point);
* ``il30``: Index Lookup at N = 2^30, built + certified;
* ``eq30`` / ``ineq30``: Equality / Inequality at N = 2^30, built + certified;
* ``disj22``: Disjointness at N = 2^22 (its cap before its features became one run), built + certified;
* ``disj30``: Disjointness at N = 2^30 (features as one run), built + certified;
* ``files30disj``: Disjointness at 2^30 saved compact, loaded and certified from the files;
* ``files30``: Index Lookup at 2^30: ``xf.save`` (compact: generators, no float file; it
  certifies in the format, float64 and float32 for the manifest), then ``xf.load`` and certify
  from the files, with the files' bytes; ``files30dense``: the same with the default dense form;
* ``sample24``: ``verify --mode sample`` of Index Lookup at N = 2^24 (2 inputs), inputs per second;
* ``mqar14`` / ``mqar16`` / ``mqar18`` / ``mqar20``: MQAR (lean, queries="last") at N = 2^14 .. 2^20,
  built + certified with ``xf.verify`` (the view certificate with the address path held by its
  code: the run certificate declines the causal layers), with ``count_s`` (the input count written
  short, which ``xf.verify`` computes before the proof) and ``proof_s`` (the report's own seconds:
  the proof alone); ``nn14`` / ``nn16`` / ``nn18``: nearest neighbour the same way (it reads input
  vectors; its count is "too many to count").

    python benchmarks/bench_scale.py [--repeats 3] [--cases il24,il30,...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r'''
import json, os, resource, shutil, sys, time
import exactformer as xf
case, tmp = sys.argv[1], sys.argv[2]
COUNTED = {"mqar14", "mqar16", "mqar18", "mqar20", "nn14", "nn16", "nn18"}
out = {}
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def timed(key, f):
    t = time.perf_counter(); v = f(); out[key] = time.perf_counter() - t; return v
name, n = {"il24": ("index-lookup", 1 << 24), "il30": ("index-lookup", 1 << 30), "eq30": ("equality", 1 << 30),
           "ineq30": ("inequality", 1 << 30), "disj22": ("disjointness", 1 << 22), "disj30": ("disjointness", 1 << 30),
           "files30": ("index-lookup", 1 << 30), "files30disj": ("disjointness", 1 << 30),
           "files30dense": ("index-lookup", 1 << 30), "sample24": ("index-lookup", 1 << 24),
           "mqar14": ("mqar", 1 << 14), "mqar16": ("mqar", 1 << 16), "mqar18": ("mqar", 1 << 18), "mqar20": ("mqar", 1 << 20),
           "nn14": ("nearest-neighbor", 1 << 14), "nn16": ("nearest-neighbor", 1 << 16),
           "nn18": ("nearest-neighbor", 1 << 18)}[case]
m = timed("build_s", lambda: xf.build(name, n=n))
if case.startswith("files"):
    d = os.path.join(tmp, case)
    shutil.rmtree(d, ignore_errors=True)
    timed("save_s", lambda: xf.save(m, d, dense=case == "files30dense"))
    out["files_bytes"] = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    m = timed("load_s", lambda: xf.load(d))
if case == "sample24":
    r = timed("sample_s", lambda: xf.verify(m, mode="sample", samples=2, seed=0))
    out["inputs_per_s"] = 2 / out["sample_s"]
else:
    if case in COUNTED:  # what xf.verify spends before the proof: the input count, written short
        from exactformer.constructions.core import registry
        from exactformer.constructions.core.task import format_count
        task = registry.task_of(m.compiled)
        timed("count_s", lambda: format_count(task.count(m.compiled), m.n))
    r = timed("certify_s", lambda: xf.verify(m, mode="certify"))
    out["proof_s"] = r.seconds  # the report's own time: the proof, without the input count
    out["engine"] = r.details.get("engine")
    out["held"] = [h.get("held_by") or h.get("query") for h in r.details.get("heads", []) if h.get("held_by") or h.get("query")]
out["passed"] = bool(r.passed)
out["reason"] = r.reason[:200]
out["peak_rss_mb"] = rss_mb()
print("RESULT " + json.dumps(out))
'''

CASES = ("il24", "il30", "eq30", "ineq30", "disj22", "disj30", "files30", "files30disj", "files30dense", "sample24",
         "mqar14", "mqar16", "mqar18", "mqar20", "nn14", "nn16", "nn18")


def run_case(case: str, tmp: str, timeout: float) -> dict:
    t = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", CHILD, case, tmp], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:200], "wall_s": time.perf_counter() - t}
    return json.loads(line[len("RESULT "):]) | {"wall_s": time.perf_counter() - t}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": os.getloadavg(),
               "cpus": os.cpu_count(), "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases.split(","):
            runs = [run_case(case, tmp, a.timeout) for _ in range(a.repeats)]
            ok = [r for r in runs if "error" not in r]
            row: dict = {"repeats": len(runs), "errors": [r["error"] for r in runs if "error" in r]}
            for key in sorted({k for r in ok for k in r if k.endswith("_s") or k == "inputs_per_s"}):
                row[key] = round(statistics.median(r[key] for r in ok if key in r), 3)
            if ok:
                row["peak_rss_mb"] = round(max(r["peak_rss_mb"] for r in ok), 1)
                row.update({k: ok[0][k] for k in ("passed", "engine", "reason", "files_bytes", "held") if k in ok[0]})
            results["cases"][case] = row
            print(case, json.dumps(row), flush=True)
    results["load_after"] = os.getloadavg()
    print(json.dumps(results, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
