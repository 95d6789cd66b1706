"""The precision frontier (verify/frontier, ``xf.frontier``, ``exactformer frontier``): the cache (a
re-run computes nothing, an interrupted run resumes), the tables, the arguments; on the session's
2-worker LocalCluster (slow): the grid equals the serial run, also when a worker is killed mid-run,
and the engine resubmits a job whose worker keeps dying."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import exactformer as xf
from exactformer.cli.main import app
from exactformer.verify.distributed.engine import pool
from exactformer.verify.frontier.cache import code_version
from exactformer.verify.frontier.grid import paper_bits
from exactformer.verify.verifier import VerifyError

#: a small grid: fixed point and bfloat16 (certified and unproven cells), N = 16 .. 32
SMALL = dict(constructions="index-lookup,inequality", arithmetics="fixed,bfloat16", min_log_n=4, max_log_n=5,
             budget=1e6)  # no time-dependent stop: the cells are the same on every run


def cells(f) -> dict:
    """What a run found, without times and placement: per chain, its cells and why it stopped."""
    keep = ("n", "status", "precision", "bits", "eta", "designed_for", "min_margin", "reason")
    return {(c.name, c.arithmetic): ([{k: x.get(k) for k in keep} for x in c.ran()], c.stop(f.budget))
            for c in f.chains}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    """The small grid in this process, cached in a fresh directory."""
    cache = tmp_path_factory.mktemp("frontier")
    return xf.frontier(**SMALL, workers=0, cache=cache), cache


def test_the_small_grid_in_one_process(serial):
    f, _ = serial
    assert f.where == "this process" and f.cached == 0 and f.computed == sum(len(c.ran()) for c in f.chains)
    found = cells(f)
    fixed = found[("index-lookup", "fixed")][0]
    assert [x["n"] for x in fixed] == [16, 32] and all(x["status"] == "certified" for x in fixed)
    bf16 = found[("inequality", "bfloat16")]
    assert [x["status"] for x in bf16[0]] == ["certified", "unproven"] and bf16[1]["why"] == "top"
    d = f.to_dict()
    entry = d["constructions"]["inequality"]
    assert [r["paper_bits"] for r in entry["fixed_bits"]] == [paper_bits(n) for n in (16, 32)] == [10, 12]
    assert entry["arithmetics"]["fixed"]["largest_n"] == 32 and entry["arithmetics"]["fixed"]["open"]
    assert entry["arithmetics"]["bfloat16"]["largest_n"] == 16 and not entry["arithmetics"]["bfloat16"]["open"]
    rows = list(csv.DictReader(io.StringIO(f.to_csv())))
    assert len(rows) == f.computed and {r["status"] for r in rows} == {"certified", "unproven"}
    md = f.to_markdown()
    assert "| construction | fixed ≤ 8 bits |" in md and "| index-lookup |" in md


def test_a_rerun_computes_nothing_and_an_interrupted_run_resumes(serial, tmp_path):
    f, cache = serial
    again = xf.frontier(**SMALL, workers=0, cache=cache)
    assert again.computed == 0 and again.cached == f.computed and again.where.startswith("nothing run")
    assert cells(again) == cells(f)

    seen = []

    def stop_after_two(event):
        seen.append(event)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        xf.frontier(**SMALL, workers=0, cache=tmp_path, progress=stop_after_two)
    resumed = xf.frontier(**SMALL, workers=0, cache=tmp_path)
    assert resumed.cached == 2 and resumed.computed == f.computed - 2
    assert cells(resumed) == cells(f)


def test_the_cache_key_holds_the_code_version(serial, tmp_path):
    f, cache = serial
    assert len(f.code_version) == 16 and f.code_version == code_version()
    files = list(cache.rglob("*.json"))
    assert len(files) == f.computed  # one per job; errors (none here) are not cached


def test_no_dask_without_a_cluster():
    """The frontier in this process, a sharded run in this process and ``import exactformer`` never
    import dask."""
    code = ("import exactformer as xf, json, sys\n"
            "f = xf.frontier('inequality', 'fixed', 4, 4, workers=0, cache=False)\n"
            "m = xf.build('inequality', n=4)\n"
            "assert xf.verify(m, mode='exhaustive', workers=0).passed\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    mods = set(json.loads(proc.stdout.splitlines()[-1]))
    assert not {"dask", "distributed"} & mods


@pytest.mark.parametrize("kw,name", [
    ({"constructions": "nope"}, "constructions"),
    ({"constructions": "prefix-sums"}, "constructions"),  # no certificate: the frontier records proofs
    ({"arithmetics": "float128"}, "arithmetics"),
    ({"max_log_n": 31}, "max_log_n"),
    ({"min_log_n": 6, "max_log_n": 5}, "max_log_n"),
    ({"workers": -2}, "workers"),
    ({"scheduler": "somewhere"}, "scheduler"),
    ({"budget": 0}, "budget"),
    ({"params": {"equality": {"bogus": 1}}, "constructions": "equality"}, "params"),
])
def test_bad_arguments_name_the_parameter(kw, name):
    with pytest.raises(VerifyError) as e:
        xf.frontier(**{"cache": False, "workers": 0, **kw})
    assert e.value.parameter == name


@pytest.mark.parametrize("args,start", [
    (("--max-log-n", "40"), "error: --max-log-n: must be an integer in [1, 30]"),
    (("--arithmetics", "fixed,float128"), "error: --arithmetics: must be a comma list of fixed"),
    (("--constructions", "nope"), "error: --constructions: must be a comma list of index-lookup"),
    (("--workers", "x"), "error: --workers: "),
    (("--json", "--csv"), "error: --json/--csv/--markdown: at most one of them"),
])
def test_the_command_line_refuses_in_one_line(args, start):
    r = CliRunner().invoke(app, ["frontier", *args])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().startswith(start) and "\n" not in r.stderr.strip() and "Traceback" not in r.output


def test_the_command_line_reads_the_cache(serial):
    _, cache = serial
    r = CliRunner().invoke(app, ["frontier", "--constructions", "index-lookup,inequality", "--arithmetics",
                                 "fixed,bfloat16", "--max-log-n", "5", "--budget", "1e6", "--workers", "0",
                                 "--cache", str(cache), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["computed"] == 0 and out["constructions"]["index-lookup"]["arithmetics"]["fixed"]["largest_n"] == 32


# ---- on the 2-worker LocalCluster ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_grid_on_two_workers_equals_the_serial_run(serial, dask_cluster):
    f, _ = serial
    two = xf.frontier(**SMALL, scheduler=dask_cluster.scheduler_address, cache=False)
    assert dask_cluster.scheduler_address in two.where and two.computed == f.computed
    assert cells(two) == cells(f)


@pytest.mark.slow
def test_a_worker_killed_mid_run_loses_no_result(serial, dask_cluster):
    from distributed import Client

    f, _ = serial
    with Client(dask_cluster.scheduler_address) as client:
        pids = client.run(os.getpid)  # {worker address: pid}
        killed = []

        def kill_one(event):
            if not event["cached"] and not killed:  # the first result: both workers hold jobs now
                pid = next(iter(pids.values()))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        run = xf.frontier(**SMALL, scheduler=dask_cluster.scheduler_address, cache=False, progress=kill_one)
        assert killed and cells(run) == cells(f)
        client.wait_for_workers(2, timeout=60)  # the nanny restarted it, for the tests after this one
        assert killed[0] not in client.run(os.getpid).values()


def _dies_first(arg: tuple[str, int]) -> int:
    """Kill this worker process the first ``deaths`` times it runs (counted in a file), then return them."""
    path, deaths = arg
    count = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as out:
        out.write(str(count + 1))
    if count < deaths:
        os._exit(1)
    return count


@pytest.mark.slow
def test_a_job_whose_worker_keeps_dying_is_resubmitted(dask_cluster, tmp_path):
    """More deaths than the scheduler allows (its allowed-failures, 3 by default): the scheduler gives
    up with KilledWorker, and the pool submits the job again."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    counter = str(tmp_path / "count")
    with pool(scheduler=dask_cluster.scheduler_address) as jobs:
        jobs.submit(_dies_first, (counter, 5), "dies")
        assert list(jobs.completed()) == [("dies", 5)]


def test_the_budget_prediction_ignores_jitter_on_tiny_jobs():
    from exactformer.verify.frontier.grid import Chain

    chain = Chain("inequality", (), "fixed", [16, 32, 64])
    chain.cells = {16: {"n": 16, "status": "certified", "seconds": 0.0003},
                   32: {"n": 32, "status": "certified", "seconds": 1.7}}
    assert chain.predicted() == 3.4 and chain.next_n(120) == 64  # not 1.7 * 1.7 / 0.0003
    chain.cells[32]["seconds"] = 100.0
    assert chain.next_n(120) is None and chain.stop(120)["why"] == "budget"
