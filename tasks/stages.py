"""One Prefect task per stage. Each calls ``bertpipe.stage.run_stage`` on the library's Stage object; the cache key
is the stage fingerprint, so a flow run reports a stage as Cached exactly when its output is fresh (and the CLI and
`dvc repro` would skip it too)."""

from __future__ import annotations

from tasks.env import prefect_env

prefect_env()

from prefect import task  # noqa: E402

from bertpipe.config import Config, load_config  # noqa: E402
from bertpipe.stage import Stage, is_fresh, run_stage  # noqa: E402


def _config(params: str, profile: str | None, overrides: list[str]) -> Config:
    return load_config(params, profile, overrides)


@task(persist_result=True, log_prints=True)
def stage_task(stage_name: str, params: str, profile: str | None = None, overrides: list[str] | None = None) -> dict:
    from bertpipe.pipeline import all_stages

    cfg = _config(params, profile, overrides or [])
    res = run_stage(all_stages(cfg)[stage_name], cfg)
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
