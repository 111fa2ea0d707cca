"""One Prefect task per stage. Each calls ``bertpipe.stage.run_stage`` on the library's Stage object; the cache key
is the stage fingerprint, so a flow run reports a stage as Cached exactly when its output is fresh (and the CLI and
`dvc repro` would skip it too)."""

from __future__ import annotations

from tasks.env import prefect_env

prefect_env()

import subprocess  # noqa: E402
import sys  # noqa: E402

from prefect import task  # noqa: E402

from bertpipe.config import Config, load_config  # noqa: E402
from bertpipe.stage import Stage, is_fresh, read_manifest, run_stage  # noqa: E402


def _config(params: str, profile: str | None, overrides: list[str]) -> Config:
    return load_config(params, profile, overrides)


def _isolated(stage_name: str, params: str, profile: str | None, overrides: list[str]) -> None:
    """Run the stage through the CLI in a child process. Concurrent tasks need this: transformers builds models
    under a process-wide meta-device context while loading, which breaks a forward pass in a neighbouring thread."""
    from bertpipe.dvcfile import cli_args

    cmd = [sys.executable, "-m", "bertpipe.cli", *cli_args(stage_name), "--params", params]
    if profile is not None:
        cmd += ["--profile", profile]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout[-4000:])
    if proc.returncode != 0:
        raise RuntimeError(f"{stage_name} failed in its process (exit {proc.returncode}): "
                           + (proc.stdout.strip().splitlines() or ["no output"])[-1])


@task(persist_result=True, result_serializer="json", log_prints=True)  # results are data: never pickles
def stage_task(stage_name: str, params: str, profile: str | None = None, overrides: list[str] | None = None,
               isolated: bool = False) -> dict:
    from bertpipe.pipeline import all_stages

    cfg = _config(params, profile, overrides or [])
    stage = all_stages(cfg)[stage_name]
    if isolated:
        _isolated(stage_name, params, profile, list(overrides or []))
        fresh, fp = is_fresh(stage, cfg)
        m = read_manifest(stage.output(cfg)) or {}
        if not fresh:
            raise RuntimeError(f"{stage_name}: the child process finished but {stage.output(cfg)} is not fresh")
        return {"stage": stage_name, "out": str(stage.output(cfg)), "fingerprint": fp, "skipped": False,
                "metrics": {k: v for k, v in (m.get("metrics") or {}).items() if isinstance(v, (int, float, str))},
                "mlflow_run_id": m.get("mlflow_run_id")}
    res = run_stage(stage, cfg)
    return {
        "stage": res.name,
        "out": str(res.out),
        "fingerprint": res.fingerprint,
        "skipped": res.skipped,
        "metrics": {k: v for k, v in res.metrics.items() if isinstance(v, (int, float, str))},
        "mlflow_run_id": res.run_id,
    }


def task_for(stage: Stage, cfg: Config):
    """The stage's task, keyed by its fingerprint. A stale output refreshes the cache entry instead of reusing it,
    which keeps Prefect's cache and the on-disk manifests in agreement (e.g. after `rm -r work/`)."""
    fresh, fp = is_fresh(stage, cfg)
    key = f"bertpipe-{stage.name.replace('/', '-')}-{fp}"
    return stage_task.with_options(
        name=stage.name,
        task_run_name=stage.name,
        cache_key_fn=lambda *_: key,
        refresh_cache=not fresh,
    )
