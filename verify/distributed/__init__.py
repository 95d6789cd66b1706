"""Grids of independent jobs on dask.distributed: the engine (``engine``: an embedded LocalCluster, a
scheduler's address, or this process alone; jobs resubmitted when their worker dies, results
streamed as they finish) and verification sharded over it (``shards``: exhaustive and sampled
inputs in fixed shards with per-shard seeds, so the result is the same for any number of workers).

dask is imported when a cluster is first asked for, never by ``import exactformer``.
"""
