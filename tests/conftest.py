"""Fixtures shared by several test modules."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture(scope="session")
def dask_cluster():
    """A 2-worker dask LocalCluster (one process per worker, restarted by its nanny when killed),
    started once for the session: starting one takes seconds. Tests reach it through its scheduler's
    address (``scheduler=cluster.scheduler_address``), the path a real cluster takes."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.ERROR) as cluster:
        yield cluster
