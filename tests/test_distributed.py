"""Verification sharded over dask workers (verify/distributed): the same report for any number of
workers -- exhaustive equal to the single-process run (a passing model and a broken one, whose first
counterexample in enumeration order must survive the merge), sampled inputs equal for one and two
workers -- and bad sharding arguments refused in one line.

One 2-worker LocalCluster (tests/conftest.py) serves the session; runs reach it through
``scheduler=``, the path a real cluster takes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import exactformer as xf
from exactformer.cli.main import app
from exactformer.verify.distributed.engine import InProcess, Pool, check_scheduler, check_workers
from exactformer.verify.distributed.shards import SHARD_SAMPLES, merge, shard_seed
from exactformer.verify.verifier import VerifyError
from exactformer.constructions.core.ir import ExactTensor


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def cluster(dask_cluster):
    """The scheduler address of the session's 2-worker LocalCluster."""
    return dask_cluster.scheduler_address


@pytest.fixture(scope="module")
def eq16():
    return xf.build("equality", n=14)  # 16384 inputs: 4 batches of the enumeration


def broken(model):
    """A copy whose first MLP unit's bias is off by one half-step: wrong on many inputs, in every batch."""
    m = model.compiled
    b = m.blocks[0].mlp.b_in
    num = b.num.copy()
    num[1] += 1
    return m.replace_weight("blocks.0.mlp.b_in", ExactTensor(num, b.den))


def _same(a, b) -> None:
    """Two reports of one run agree on everything but the time and how the run was placed."""
    for k in ("passed", "mode", "inputs_covered", "counterexample", "min_margin", "counts"):
        assert getattr(a, k) == getattr(b, k), k


def test_exhaustive_sharded_over_two_workers_equals_one_process(cluster, eq16):
    single = xf.verify(eq16, mode="exhaustive")
    sharded = xf.verify(eq16, mode="exhaustive", scheduler=cluster)
    assert single.passed and single.inputs_covered == 16384
    _same(single, sharded)
    assert "in 4 shards" in sharded.reason and cluster in sharded.reason
    # a broken model, wrong in every shard's batches: the first wrong answer of the enumeration wins,
    # not the first a worker reports
    bad = broken(eq16)
    single = xf.verify(bad, mode="exhaustive")
    assert not single.passed and single.counterexample is not None
    _same(single, xf.verify(bad, mode="exhaustive", scheduler=cluster))
    _same(single, xf.verify(bad, mode="exhaustive", workers=0))


@pytest.mark.slow
def test_sampled_inputs_are_the_same_for_one_and_two_workers(cluster, eq16):
    bad = broken(eq16)
    for model in (eq16, bad):
        one = xf.verify(model, mode="sample", samples=SHARD_SAMPLES + 500, seed=7, workers=0)
        two = xf.verify(model, mode="sample", samples=SHARD_SAMPLES + 500, seed=7, scheduler=cluster)
        _same(one, two)
    assert one.counterexample is not None
    assert two.inputs_covered < 2 * (SHARD_SAMPLES + 500)


def test_the_command_line_shards_on_a_scheduler(cluster):
    r = cli("verify", "equality", "--n", "14", "--mode", "exhaustive", "--scheduler", cluster, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and out["inputs_covered"] == 16384 and "shards" in out["reason"]


def test_shard_seeds_depend_on_seed_and_shard_only():
    assert shard_seed(7, 0) == shard_seed(7, 0) != shard_seed(7, 1) != shard_seed(8, 1)


def test_merge_stops_at_the_first_wrong_batch_in_order():
    ok = {"covered": 10, "counterexample": None, "counts": {"saturations": 1}, "min_margin": "1/2"}
    wrong = {"covered": 3, "counterexample": {"input": [1]}, "counts": {"saturations": 2}, "min_margin": "1/4"}
    later = {"covered": 1, "counterexample": {"input": [2]}, "counts": {"saturations": 5}, "min_margin": "0"}
    parts = [((2, 0), later), ((0, 0), ok), ((1, 0), wrong)]  # as workers finish: out of order
    assert merge(parts) == (13, {"input": [1]}, 1 / 4, {"saturations": 3})


def test_the_pool_is_an_interface():
    assert issubclass(InProcess, Pool)
    with pytest.raises(TypeError):
        Pool()  # abstract


@pytest.mark.parametrize("args,message", [
    (("--workers", "-1"), "--workers: "),
    (("--workers", "two"), "--workers: "),
    (("--scheduler", "localhost:8786"), "--scheduler: must be a dask scheduler address such as tcp://HOST:PORT"),
    (("--mode", "certify", "--workers", "2"), "--workers: shards exhaustive and sample runs only"),
    (("--workers", "2"), "--workers: shards exhaustive and sample runs only"),
])
def test_bad_sharding_arguments_are_one_line(args, message):
    r = cli("verify", "equality", "--n", "8", *args)
    assert r.exit_code == 2, r.output
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith(f"error: {message}") and "Traceback" not in r.output


def test_verify_all_is_not_sharded():
    r = cli("verify", "all", "--workers", "2")
    assert r.exit_code == 2 and r.stderr.strip().startswith("error: --workers: not with verify all")


def test_bad_sharding_arguments_in_the_api(eq16):
    for kw, name in (({"workers": -1}, "workers"), ({"workers": 1.5}, "workers"), ({"scheduler": "nowhere"}, "scheduler")):
        with pytest.raises(VerifyError) as e:
            xf.verify(eq16, mode="exhaustive", **kw)
        assert e.value.parameter == name
    with pytest.raises(VerifyError, match="^workers: shards exhaustive and sample runs only"):
        xf.verify(eq16, mode="certify", workers=2)
    assert check_workers(None) is None and check_scheduler(" tcp://h:1 ") == "tcp://h:1"


def _dies(_: object) -> None:
    import os

    os._exit(1)  # the worker process dies, as the kernel's OOM killer would end it


def _square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_a_job_whose_worker_always_dies_is_one_result_or_raises(monkeypatch):
    """With its retries spent, a job that kills its worker becomes on_killed's result (the run goes
    on: the pool still runs jobs after it), or, without on_killed, raises KilledWorker."""
    from distributed import KilledWorker

    from exactformer.verify.distributed import engine

    monkeypatch.setattr(engine, "RETRIES", 0)
    with engine.pool(workers=1) as jobs:
        jobs.submit(_square, 7, "square")
        got = {}
        for key, result in jobs.completed(on_killed=lambda key, why: ("killed", key, why)):
            got[key] = result
            if key == "square":  # submitted while iterating: then the next result comes as well
                jobs.submit(_dies, None, "dies")
        assert got["square"] == 49 and got["dies"][:2] == ("killed", "dies") and "died" in got["dies"][2]
        jobs.submit(_dies, None, "dies again")
        with pytest.raises(KilledWorker):
            list(jobs.completed())
