"""Where the flow's stage tasks run (``flow.runner``): the flow's own threads, or a Dask cluster through prefect-dask.

Why Dask (not Ray): prefect-dask's task runner hands upstream futures to the Dask scheduler, so a stage waiting for
its inputs holds no worker; and ``distributed.Client.get_executor()`` is a ``concurrent.futures`` executor, which
is all prepare's shards need (``bertpipe.stages.prepare.shard.use_executor``), so the library imports neither.

On a cluster a stage task may run on another machine: it gets only plain arguments (the params file's absolute path,
profile, overrides) and reads everything else from there, so the project must be at the same path on every worker
(a shared filesystem); see docs/distributed.md.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from bertpipe.infra.config import Config
from . import parallel

# (task, parameters, wait_for) -> future
Submit = Callable[[Any, dict, list], Any]

# A stage task's ``threads`` meaning "whatever this worker's share of its machine is" (a cluster started elsewhere).
WORKER_SHARE = -1


def local_cluster_workers(cfg: Config) -> int:
    """Worker processes of the cluster a ``runner: dask`` flow starts itself: ``flow.max_parallel`` (auto: by the
    core count, as for local runs)."""
    mp = cfg.params.flow.max_parallel
    return parallel.auto_workers(parallel.cores()) if mp == "auto" else int(mp)


@contextlib.contextmanager
def submitting(cfg: Config) -> Iterator[Submit | None]:
    """A submit function for ``runner: dask`` (the cluster is connected, or started, for the block and closed after
    it); None for ``local``: the flow submits to its own ThreadPoolTaskRunner."""
    fp = cfg.params.flow
    if fp.runner == "local":
        yield None
        return
    from bertpipe.infra.extras import require

    require("dask", "flow.runner: dask")
    from prefect_dask import DaskTaskRunner

    if fp.cluster_address:
        runner = DaskTaskRunner(address=fp.cluster_address)
    else:
        # Single-threaded workers: a stage owns its worker; its torch threads are set per stage (stage_threads).
        runner = DaskTaskRunner(cluster_kwargs={
            "n_workers": local_cluster_workers(cfg), "threads_per_worker": 1, "processes": True,
            "host": "127.0.0.1", "dashboard_address": None})
    # Task runs on the workers report to this flow's Prefect API: without its address in the settings that travel
    # with each task, a worker would start a temporary server of its own.
    with _api_url_settings(), runner:
        yield lambda task, parameters, wait_for: runner.submit(task, parameters, wait_for=wait_for)


@contextlib.contextmanager
def _api_url_settings() -> Iterator[None]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with get_client(sync_client=True) as c:
        url = str(c.api_url)
    with temporary_settings({PREFECT_API_URL: url}):
        yield


def stage_threads(cfg: Config, name: str, side_by_side: set[str], workers: int, threads: int) -> int:
    """A stage task's ``threads`` argument (0: in the task's own process; > 0: a child process with that many torch
    threads; WORKER_SHARE: decided on the worker)."""
    fp = cfg.params.flow
    if fp.runner == "local":
        return threads if workers > 1 and name in side_by_side else 0
    if name == "prepare":
        return 0  # in the worker's process, where it can send its shards to the cluster
    if fp.cluster_address:
        return WORKER_SHARE
    n = local_cluster_workers(cfg)
    return max(1, parallel.cores() // n) if name in side_by_side else parallel.cores()


def worker_share() -> int:
    """On a Dask worker: the machine's cores divided among the worker's threads (one stage per thread). Assumes one
    worker process per machine, the layout docs/distributed.md describes."""
    from distributed import get_worker

    return max(1, parallel.cores() // max(1, get_worker().state.nthreads))


@contextlib.contextmanager
def cluster_executor() -> Iterator[tuple[Any, int]]:
    """(executor, workers) of the Dask cluster this task runs on, (None, 1) outside one. The executor's tasks run
    beside this one: ``worker_client`` releases this task's worker thread while it waits for them."""
    try:
        from distributed import get_worker, worker_client

        get_worker()
        on_cluster = True
    except (ImportError, ValueError):
        on_cluster = False
    if not on_cluster:  # yielded outside the except: the stage's own errors must not chain to the probe's
        yield None, 1
        return
    with worker_client() as client:
        yield client.get_executor(), max(1, sum(client.nthreads().values()))


@contextlib.contextmanager
def parent_run_env(run_id: str) -> Iterator[None]:
    """The flow's MLflow run as the parent of the stage runs made in this process and its children (what
    ``bertpipe.infra.tracking.flow_run`` sets in the flow's own process; a worker elsewhere gets it from here)."""
    from bertpipe.infra.tracking import as_parent

    with as_parent(run_id):
        yield
