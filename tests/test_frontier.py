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
from exactformer.verify.distributed.engine import Pool, pool
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


#: three N per chain, so that a chain can run one ahead (verify/frontier/run.py)
AHEAD = SMALL | {"max_log_n": 6}


@pytest.fixture(scope="module")
def serial_ahead():
    """The three-N grid in this process (one worker: nothing runs ahead)."""
    f = xf.frontier(**AHEAD, workers=0, cache=False)
    assert f.ran_ahead == {"run": 0, "joined": 0}
    return f


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
def test_a_grid_that_runs_ahead_on_two_workers_equals_the_serial_run(serial_ahead, dask_cluster):
    """Three N per chain: with two workers a chain may run its third N while its second runs."""
    two = xf.frontier(**AHEAD, scheduler=dask_cluster.scheduler_address, cache=False)
    assert dask_cluster.scheduler_address in two.where and two.computed >= serial_ahead.computed
    assert two.computed == serial_ahead.computed + two.ran_ahead["run"] - two.ran_ahead["joined"]
    assert cells(two) == cells(serial_ahead)


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


# ---- running ahead (verify/frontier/run.py): the memory rule, and the table stays the serial run's ------------------


def _result(n: int, seconds: float, start: int | None, peak: int) -> dict:
    return {"n": n, "status": "certified", "seconds": seconds, "rss_start": start, "peak_rss": peak}


def test_the_memory_prediction_grows_the_jobs_own_memory():
    from exactformer.verify.frontier.grid import Chain
    from exactformer.verify.frontier.run import MEMORY_FLOOR, predicted_peak

    mb = 1 << 20
    chain = Chain("inequality", (), "fixed", [16, 32, 64, 128])
    assert predicted_peak(chain, 1) is None  # no result yet: not predicted
    chain.cells = {16: _result(16, 0.1, 100 * mb, 150 * mb)}
    assert predicted_peak(chain, 2) == 100 * mb + 50 * mb * 4  # own memory 50 MB, doubling per N
    chain.cells[32] = _result(32, 0.1, 100 * mb, 500 * mb)  # own 400 MB after 50 MB: growth 8 per N
    assert predicted_peak(chain, 1) == 100 * mb + 400 * mb * 8 and predicted_peak(chain, 2) == 100 * mb + 400 * mb * 64
    chain.cells[16]["peak_rss"] = 101 * mb  # own 1 MB before: counted as MEMORY_FLOOR, no jitter blow-up
    assert predicted_peak(chain, 1) == 100 * mb + int(400 * mb * 400 * mb / MEMORY_FLOOR)
    chain.cells[32]["rss_start"] = None  # no start known: the whole peak counts as the job's own
    assert predicted_peak(chain, 1) == int(500 * mb * 500 * mb / MEMORY_FLOOR)


def test_the_memory_rule_refuses_a_job_over_the_limit_and_allows_one_that_fits():
    from exactformer.verify.frontier.run import SAFETY, may_run_ahead

    gb = 1 << 30
    limit = 10 * gb  # per worker
    share = int(SAFETY * limit)
    assert may_run_ahead(2 * gb, [1 * gb, 1 * gb], 2, limit)
    assert may_run_ahead(share, [share, 0], 2, limit)  # exactly a worker's share beside another share
    assert not may_run_ahead(share + 1, [], 2, limit)  # over its worker's share
    assert not may_run_ahead(4 * gb, [7 * gb, 1 * gb], 2, limit)  # fits its worker, not the two together
    assert may_run_ahead(4 * gb, [5 * gb, 5 * gb], 3, limit) and not may_run_ahead(4 * gb, [6 * gb, 6 * gb], 3, limit)
    # a job not predicted yet counts as a worker's share
    assert may_run_ahead(share, [None], 2, limit) and may_run_ahead(share, [0, 6 * gb], 3, limit)
    assert not may_run_ahead(share, [None, 6 * gb], 3, limit)
    assert not may_run_ahead(1, [], 1, limit)  # one worker: nothing runs ahead
    assert not may_run_ahead(None, [], 2, limit) and not may_run_ahead(1, [], 2, None)  # unknown: not run


class _LowestPriorityFirst(Pool):
    """Two workers in this process with a memory limit, the job of lowest priority run first: every
    job run ahead finishes before the job its chain waits for (the order least like the serial one)."""

    def __init__(self, memory_limit: int):
        self.where, self.workers, self.memory_limit = "this process, lowest priority first", 2, memory_limit
        self.queue: list = []

    def submit(self, fn, arg, key, priority=0):
        self.queue.append((priority, key, fn, arg))

    def share(self, obj):
        return obj

    def completed(self, on_killed=None):
        while self.queue:
            item = min(self.queue, key=lambda q: q[0])
            self.queue.remove(item)
            yield item[1], item[2](item[3])


@pytest.mark.parametrize("limit,runs", [
    (64 << 30, True),
    # slow: a job over the memory limit refused by test_the_memory_rule_refuses_a_job_over_the_limit_and_allows_one_that_fits,
    # the table equal to the serial run's by the case above
    pytest.param(1 << 20, False, marks=pytest.mark.slow)])
def test_jobs_run_ahead_only_where_memory_allows_and_the_table_is_the_serial_runs(serial_ahead, monkeypatch, limit,
                                                                                  runs):
    from contextlib import contextmanager

    from exactformer.verify.frontier import run

    monkeypatch.setattr(run, "pool", contextmanager(lambda workers, scheduler: iter([_LowestPriorityFirst(limit)])))
    f = xf.frontier(**AHEAD, cache=False)
    assert cells(f) == cells(serial_ahead)
    if runs:  # every chain's third N ran ahead of its second and joined the table
        assert f.ran_ahead == {"run": len(f.chains), "joined": len(f.chains)} and f.computed == serial_ahead.computed
    else:  # a worker's memory limit of 1 MB: no job is predicted to fit
        assert f.ran_ahead == {"run": 0, "joined": 0} and f.computed == serial_ahead.computed
    assert all(c["peak_rss"] >= (c["rss_start"] or 0) > 0 for chain in f.chains for c in chain.ran())


class _KillsN32(_LowestPriorityFirst):
    """As above, but every N = 32 job's worker always dies: the pool hands it to ``on_killed``."""

    def completed(self, on_killed=None):
        while self.queue:
            item = min(self.queue, key=lambda q: q[0])
            self.queue.remove(item)
            if item[3]["n"] == 32:
                yield item[1], on_killed(item[1], "its worker died in each of its 4 submissions (test)")
            else:
                yield item[1], item[2](item[3])


def test_a_job_whose_worker_always_dies_is_an_error_cell_and_the_run_goes_on(monkeypatch, tmp_path):
    """The run ends normally: the killed N is an error cell with its reason and seconds, its chain
    stops there, the other cells are the serial run's, and every output writes it (the line per job
    on a pipe, CSV, Markdown, JSON)."""
    from contextlib import contextmanager

    from exactformer.cli.frontier import _progress
    from exactformer.verify.frontier import report, run

    monkeypatch.setattr(run, "pool", contextmanager(lambda workers, scheduler: iter([_KillsN32(64 << 30)])))
    lines, _ = _progress()
    f = xf.frontier(**SMALL, cache=False, progress=lines)
    for chain in f.chains:
        cell = chain.cells[32]
        assert cell["status"] == "error" and "worker died" in cell["reason"] and cell["seconds"] >= 0
        assert chain.cells[16]["status"] != "error"
    assert report.to_csv(f) and report.to_markdown(f) and json.dumps(report.to_dict(f))
