"""One Prefect task per stage. Each calls ``bertpipe.core.stage.run_stage`` on the library's Stage object (or the
stage's CLI command in a child process, when it runs beside other stages). The cache key is the stage's fingerprint as
the freshness plan computes it (``bertpipe.graph.freshness.plan``, what `bertpipe stages` prints; with every upstream
stage done it is ``bertpipe.core.stage.is_fresh``'s), computed when the task starts, so a flow run reports a stage as
Cached exactly when its output is fresh (and the CLI and `dvc repro` would skip it too)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from prefect import task
from prefect.cache_policies import CachePolicy

from bertpipe.infra.config import Config

from bertpipe.core.stage import Stage, is_fresh, read_manifest, run_stage
from bertpipe.graph.freshness import FLOW_STAGE_ENV
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.prepare.shard import use_executor
from .cluster import WORKER_SHARE, cluster_executor, parent_run_env, worker_share
from .parallel import child_env, slot


def _config(params: str, profile: str | None, overrides: list[str]) -> Config:
    return load_config(params, profile, overrides)


def _stage(stage_name: str, cfg: Config) -> Stage:
    from bertpipe.graph.pipeline import all_stages

    return all_stages(cfg)[stage_name]


def cache_key(stage: Stage, fingerprint: str) -> str:
    return f"bertpipe-{stage.name.replace('/', '-')}-{fingerprint}"


@dataclass
class FreshOutput(CachePolicy):
    """Key = the stage's fingerprint while its output on disk is fresh; no key (run, don't read a record) while it is
    stale, e.g. after `rm -r work/`. The task then records its result under the fingerprint itself (``_remember``),
    so the next run with the output intact reads as Cached; a fresh output with no record yet gets one when its key
    is computed (``_record_fresh``)."""

    def compute_key(self, task_ctx, inputs: dict[str, Any], flow_parameters: dict[str, Any], **kwargs) -> str | None:
        cfg = _config(inputs["params"], inputs.get("profile"), list(inputs.get("overrides") or []))
        stage = _stage(inputs["stage_name"], cfg)
        if stage.external is not None:
            return None  # what it reads outside the files (the registry) is asked on every run
        # The plan's answer for a stage whose upstream tasks are done (their outputs are what it reads): asked of
        # the stage alone, not of the whole graph above it again for every task
        fresh, fp = is_fresh(stage, cfg)
        if not fresh:
            return None
        key = cache_key(stage, fp)
        _record_fresh(task_ctx, key, stage, cfg, fp)
        return key


def _record_fresh(task_ctx, key: str, stage: Stage, cfg: Config, fp: str) -> None:
    """An output fresh on disk that this Prefect home holds no record of (built by the CLI, `dvc repro`, or a flow
    with another PREFECT_HOME): record its result under the key now, from its manifest, so the task reads as
    Cached like every other fresh stage, not Completed."""
    store = getattr(task_ctx, "result_store", None)
    if store is None or not getattr(task_ctx, "persist_result", False) or store.exists(key):
        return
    m = read_manifest(stage.output(cfg)) or {}
    store.write(obj=_result(stage.name, stage.output(cfg), fp, "cached", m.get("metrics"), m.get("mlflow_run_id")),
                key=key)


def _remember(key: str, result: dict) -> None:
    from prefect.context import TaskRunContext

    ctx = TaskRunContext.get()
    if ctx is not None and ctx.result_store is not None and ctx.persist_result:
        ctx.result_store.write(obj=result, key=key)


_children: set[subprocess.Popen] = set()  # the stage processes this flow process is waiting on
_children_lock = threading.Lock()
_stopping = False  # set when the flow process is being stopped (terminate_children)


def terminate_children() -> int:
    """SIGTERM every stage process still running for this flow process; each removes its temp dir and closes its
    MLflow run as KILLED (the CLI's handler). Called when the flow is interrupted: the task threads wait on their
    children, so without this a SIGTERM to `bertpipe run` would leave them running to the end. Returns how many."""
    global _stopping
    with _children_lock:  # under the lock: a stage starting now sees _stopping, or is among the children
        _stopping = True  # the stages these children ran failed because we stopped them: not worth a retry
        live = [p for p in _children if p.poll() is None]
    for p in live:
        p.terminate()
    return len(live)


def _isolated(stage_name: str, params: str, profile: str | None, overrides: list[str], threads: int,
              cfg: Config) -> None:
    """Run the stage through the CLI in a child process with ``threads`` torch threads. Stages that run beside
    others need this: transformers builds models under a process-wide meta-device context while loading, which
    breaks a forward pass in a neighbouring thread, and torch's thread pools are per process."""
    cmd = [sys.executable, "-m", "bertpipe", *_stage(stage_name, cfg).command, "--params", params]
    if profile is not None:
        cmd += ["--profile", profile]
    for o in overrides:
        cmd += ["--set", o]
    log = cfg.state / "logs" / f"{stage_name.replace('/', '__')}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{stage_name}] running in its own process with {threads} thread(s); log: {log}")
    with open(log, "ab") as fh:  # appended: concurrent flow runs may run the same stage
        start = fh.tell()
        fh.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n".encode())
        fh.flush()
        env = {**child_env(threads), FLOW_STAGE_ENV: "1"}
        with _children_lock:
            _not_stopping(stage_name)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
            _children.add(proc)
        with proc:
            timeout = cfg.params.flow.stage_timeout_s or None
            expired = threading.Event()
            timer = threading.Timer(timeout, lambda: (expired.set(), proc.terminate())) if timeout else None
            if timer:
                timer.start()
            try:
                _relay(proc.stdout, fh, stage_name)
                proc.wait()
            finally:
                if timer:
                    timer.cancel()
                if proc.poll() is None:  # interrupted here (e.g. Prefect's own timeout): the child goes too
                    proc.terminate()
                with _children_lock:
                    _children.discard(proc)
            if expired.is_set():
                raise TimeoutError(f"{stage_name}: stopped after flow.stage_timeout_s={timeout:g}s (log {log})")
    with open(log, "rb") as fh:
        fh.seek(start)
        tail = fh.read().decode("utf-8", errors="replace")
    if proc.returncode != 0:
        print(tail[-4000:])
        last = (tail.strip().splitlines() or ["no output"])[-1]
        if last.startswith("error: "):  # the CLI's one-line user error: pass it on as one
            raise BertpipeError(last[len("error: "):])
        raise RuntimeError(f"{stage_name} failed in its process (exit {proc.returncode}, log {log}): {last}")


def start_accepting() -> None:
    """A flow run starts in this process: stages may start again, whatever an earlier run that was stopped set."""
    global _stopping
    with _children_lock:
        _stopping = False


def _not_stopping(stage_name: str) -> None:
    """Raise when the flow process is being stopped (SIGTERM, Ctrl-C, a cancelled flow run): no stage starts then."""
    if _stopping:
        raise RuntimeError(f"{stage_name}: not started: the flow run is being stopped")


def _run_logger():
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # no flow or task run context (a direct call): the log file only
        return None


def _relay(pipe, fh, stage_name: str) -> None:
    """Copy the child's output to its log file and to the task run's logger (so it reaches the Prefect UI), as whole
    lines: a progress bar's carriage-return redraws become a line every few seconds (``bertpipe.infra.progress.Lines``).
    The logger's lines carry the stage's name once: the child's own ``[stage]`` lines are not prefixed again."""
    import codecs

    from bertpipe.infra.progress import Lines

    logger = _run_logger()
    prefix = f"[{stage_name}]"

    def emit(line: str) -> None:
        fh.write(line.encode("utf-8") + b"\n")
        fh.flush()
        text = line.strip()
        if logger is not None and text:
            logger.info("%s", text if text.startswith(prefix) else f"{prefix} {text}")

    lines = Lines(emit)
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    for chunk in iter(lambda: pipe.read1(65536), b""):
        lines.feed(decode(chunk))
    lines.feed(decode(b"", final=True))
    lines.close()


def _result(name: str, out, fp: str, status: str, metrics: dict, run_id: str | None) -> dict:
    return {"stage": name, "out": str(out), "fingerprint": fp, "status": status,
            "metrics": {k: v for k, v in (metrics or {}).items() if isinstance(v, (int, float, str))},
            "mlflow_run_id": run_id}


@task(persist_result=True, result_serializer="json", log_prints=True)  # results are data: never pickles
def stage_task(stage_name: str, params: str, profile: str | None = None, overrides: list[str] | None = None,
               threads: int = 0, pool: str = "", priority: int = 0, parent_run: str = "") -> dict:
    """Run one stage. ``threads`` > 0: in a child process with that many torch threads (WORKER_SHARE: this Dask
    worker's share of its machine); ``pool``/``priority``: the flow run's slot pool (see tasks.parallel);
    ``parent_run``: the flow's MLflow run, passed rather than inherited so that it reaches other machines."""
    overrides = list(overrides or [])
    cfg = _config(params, profile, overrides)
    stage = _stage(stage_name, cfg)
    if threads == WORKER_SHARE:
        threads = worker_share()
    with slot(pool, priority, stage_name), parent_run_env(parent_run):
        _not_stopping(stage_name)
        # run_stage decides freshness itself; only a stage that would go to a process of its own is asked first
        if threads and not is_fresh(stage, cfg)[0]:
            launched = time.time()
            _isolated(stage_name, params, profile, overrides, threads, cfg)
            fresh, fp = is_fresh(stage, cfg)
            if not fresh:
                raise RuntimeError(f"{stage_name}: the child process finished but {stage.output(cfg)} is not fresh")
            m = read_manifest(stage.output(cfg)) or {}
            # An output started before the child was: a concurrent flow run built it, the child only waited.
            status = "built" if m.get("started", 0) >= launched else "cached"
            res = _result(stage_name, stage.output(cfg), fp, status, m.get("metrics"), m.get("mlflow_run_id"))
        else:
            with cluster_executor() as (executor, workers), use_executor(executor, workers):
                r = run_stage(stage, cfg)  # prepare's shards go to the cluster when it runs on one
            res = _result(r.name, r.out, r.fingerprint, "cached" if r.skipped else "built", r.metrics, r.run_id)
    if res["status"] == "built":
        _remember(cache_key(stage, res["fingerprint"]), res)
    return res


def transient(task, task_run, state) -> bool:
    """Retry condition: anything but a user error (BertpipeError: bad params or data, retrying cannot help) or an
    interruption (Ctrl-C / SIGTERM of the flow, which also stops the stage processes)."""
    if _stopping:
        return False
    try:
        state.result()
    except (BertpipeError, KeyboardInterrupt, SystemExit):
        return False
    except BaseException:
        return True
    return False


def task_for(stage: Stage, cfg: Config | None = None):
    """The stage's task: named after the stage, cached by its fingerprint (see FreshOutput); with ``cfg``, retried
    with exponential backoff on transient failures and limited in time per ``flow.stage_retries``/``retry_delay_s``/
    ``stage_timeout_s``."""
    opts: dict = {}
    if cfg is not None:
        from prefect.tasks import exponential_backoff

        fp = cfg.params.flow
        opts = {"retries": fp.stage_retries, "retry_condition_fn": transient,
                "retry_delay_seconds": exponential_backoff(backoff_factor=fp.retry_delay_s) if fp.retry_delay_s else 0,
                "timeout_seconds": fp.stage_timeout_s or None}
    return stage_task.with_options(name=stage.name, task_run_name=stage.name, cache_policy=FreshOutput(), **opts)
