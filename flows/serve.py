"""`bertpipe serve`: a Prefect deployment of domain_adaptation on a cron schedule from params, served by this
long-running process. Point it at a server first (`prefect server start --host 127.0.0.1` and
`export PREFECT_API_URL=http://127.0.0.1:4200/api`); stop this process before stopping the server."""

from __future__ import annotations

from pathlib import Path

from bertpipe.config import load_config
from flows.domain_adaptation import domain_adaptation
from tasks.env import prefect_env

DEPLOYMENT = "bertpipe-domain-adaptation"


def serve(params: str = "params.yaml", profile: str | None = None, overrides: list[str] | None = None,
          until: str | None = None, name: str = DEPLOYMENT) -> None:
    cfg = load_config(params, profile, overrides or [])
    prefect_env(cfg)
    domain_adaptation.serve(
        name=name,
        cron=cfg.params.flow.cron,
        parameters={"params": str(Path(params).resolve()), "profile": profile, "overrides": list(overrides or []),
                    "until": until},
        pause_on_shutdown=False,
        limit=1,  # one pipeline run at a time on this machine
    )
