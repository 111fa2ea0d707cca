"""domain_adaptation: prepare -> [base] -> vocab -> pretrain -> finetune (tasks x encoders) -> evaluate -> register.

Every stage is submitted at once with its upstream stages' futures as ``wait_for`` (the graph comes from
``bertpipe.graph.pipeline.upstream``), so whatever the graph allows runs concurrently: base finetunes beside
pretraining, all finetunes together. ``flow.max_parallel`` bounds how many run at once and divides the cores among them
(tasks.parallel); stages that never overlap another run in this process on every core. ``flow.runner: dask`` runs
the stage tasks on a Dask cluster instead (tasks.cluster, docs/distributed.md).

Run with `bertpipe run` or
`python -m bertpipe_prefect.flows.domain_adaptation [--params params.yaml] [--until STAGE]`.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

from prefect import flow
from prefect.states import Cancelled
from prefect.task_runners import ThreadPoolTaskRunner

from bertpipe.core.stage import Stage
from bertpipe.doors.dvc import dvclock
from bertpipe.graph.pipeline import all_stages, load_config, until_targets, upstream
from bertpipe.infra.config import Config
from bertpipe.infra.progress import lines_unless_terminal
from bertpipe.infra.tracking import flow_run
from bertpipe_prefect.tasks import cluster, parallel
from bertpipe_prefect.tasks.env import prefect_env
from bertpipe_prefect.tasks.stages import start_accepting, task_for, terminate_children

from . import artifacts, cancel
from .knobs import Knobs
from .summary import stage_line, summary


def stage_graph(cfg: Config, stages: dict[str, Stage]) -> parallel.Graph:
    return {name: upstream(name, cfg, stages) for name in stages}


def _outcome(fut) -> tuple[str, dict | None]:
    """(status, result) of a finished future: built / cached from what Prefect and the stage reported."""
    state = fut.state
    if state.is_completed():
        res = fut.result()
        cached = state.name == "Cached" or res.get("status") == "cached"
        return ("cached" if cached else "built"), res
    return ("failed" if state.is_failed() or state.is_crashed() else "not run"), None


@flow(name="domain_adaptation", log_prints=True, task_runner=ThreadPoolTaskRunner())
def domain_adaptation(
    params: str = "params.yaml", profile: str | None = None, overrides: list[str] | None = None,
    until: str | None = None, knobs: Knobs | None = None,
) -> dict:
    lines_unless_terminal()  # in-process stages' progress bars: whole lines in a log, not redraws
    overrides = list(overrides or []) + (knobs.overrides() if knobs else [])  # a knob is an override, last
    params = str(Path(params).resolve())
    cfg = load_config(params, profile, overrides)
    stages = all_stages(cfg)
    graph = parallel.select(stage_graph(cfg, stages), until_targets(list(stages), until))
    side_by_side = parallel.overlapping(graph, {n for n in graph if stages[n].light})
    workers, threads = parallel.plan(cfg.params.flow.max_parallel, max(1, len(side_by_side)))
    priority = parallel.remaining(graph)
    fp = cfg.params.flow
    if fp.runner == "local":
        print(f"{len(graph)} stages; up to {workers} at once with {threads} thread(s) each "
              f"({parallel.cores()} cores, flow.max_parallel: {fp.max_parallel})")
    else:
        print(f"{len(graph)} stages on a Dask cluster: " + (fp.cluster_address or
              f"a local one of {cluster.local_cluster_workers(cfg)} worker(s), started for this run"))
    parallel.use_threads(parallel.cores())  # stages that run alone run here, on every core
    pool = uuid.uuid4().hex
    parallel.open_pool(pool, workers, graph)
    start_accepting()
    futures = {}
    try:
        with flow_run(cfg, "domain_adaptation", {"bertpipe.until": until or "register"}) as parent, \
                cluster.submitting(cfg) as submit, cancel.watching() as cancelled:
            for name, ups in graph.items():
                args = dict(stage_name=name, params=params, profile=profile, overrides=overrides,
                            threads=cluster.stage_threads(cfg, name, side_by_side, workers, threads), pool=pool,
                            priority=priority[name], parent_run=parent.run_id)
                task, wait_for = task_for(stages[name], cfg), [futures[u] for u in ups]
                futures[name] = submit(task, args, wait_for) if submit else task.submit(**args, wait_for=wait_for)
            progress = artifacts.Progress(len(futures))
            for name, fut in futures.items():  # in graph order: a stage's progress step comes after its upstreams'
                fut.wait()
                progress.step(name)
            if cancelled.is_set():  # its stages were stopped, none started since: the MLflow run ends KILLED
                raise cancel.FlowCancelled("the flow run was cancelled through the Prefect API")
            outcomes = {name: _outcome(fut) for name, fut in futures.items()}
            parent.set_tags({f"bertpipe.fingerprint.{n}": r["fingerprint"] for n, (_, r) in outcomes.items() if r})
    except cancel.FlowCancelled as e:
        return Cancelled(message=str(e))  # the flow run ends Cancelled; calling the flow raises CancelledRun
    except BaseException:  # e.g. SIGTERM (Terminated) or Ctrl-C while stages run in child processes
        n = terminate_children()
        if n:
            print(f"interrupted: stopped {n} running stage process(es)")
        raise
    finally:
        parallel.close_pool(pool)
    results: dict[str, dict] = {}
    for name, st in stages.items():
        status, res = outcomes.get(name, ("skipped", None))
        # "out" is this project's: a Cached result read from a copied project's result store names the original's
        results[name] = {**(res or {"stage": name}), "out": str(st.output(cfg)), "status": status}
    artifacts.publish(results, cfg)  # failed runs too: the table says which stage failed
    failed = [n for n, (status, _) in outcomes.items() if status == "failed"]
    if failed:
        for n, (status, r) in outcomes.items():
            print(stage_line(n, status, stages[n].output(cfg)))
        futures[failed[0]].result()  # raises the first failure: the flow run fails with it
    # in a DVC repo, dvc.lock records what the run built or found fresh, as `dvc commit` would
    # (bertpipe.doors.dvc.dvclock)
    line = dvclock.record(cfg, [n for n, (status, _) in outcomes.items() if status in ("built", "cached")])
    if line:
        print(line)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--until", default=None)
    a = ap.parse_args(argv)
    cfg = load_config(a.params, a.profile, a.overrides)
    prefect_env(cfg)
    results = domain_adaptation(a.params, a.profile, a.overrides, a.until)
    print(summary(results, cfg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
