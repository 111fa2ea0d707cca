"""`bertpipe schedule`: a Prefect deployment of domain_adaptation on a cron schedule from params (``flow.cron`` in
``flow.timezone``), served by this long-running process, and also triggered when new files land in ``flow.drop_dir``.

New data: a watcher thread in this process polls the drop dir and, for files it has not seen (by name, size and
mtime), emits a Prefect event ``bertpipe.incoming.files`` about the resource ``bertpipe.drop-dir.<abs path>``; the
deployment carries a DeploymentEventTrigger on that event, so the server's automation starts a run (visible in the
UI as triggered by the event, and any other emitter of the event triggers it too). The run then reads the drop dir's
files as one more domain source (bertpipe.stages.prepare.declare.with_incoming).

Point it at a server first (`prefect server start --host 127.0.0.1` and
`export PREFECT_API_URL=http://127.0.0.1:4200/api`); stop this process before stopping the server."""

from __future__ import annotations

import threading
from pathlib import Path

from bertpipe.graph.pipeline import load_config
from bertpipe_prefect.tasks.env import prefect_env

from .domain_adaptation import domain_adaptation

DEPLOYMENT = "bertpipe-domain-adaptation"
EVENT = "bertpipe.incoming.files"


def drop_resource(drop: Path) -> str:
    return f"bertpipe.drop-dir.{drop.resolve()}"


def _listing(drop: Path, glob: str) -> dict[str, tuple[int, int]]:
    if not drop.is_dir():
        return {}
    return {f.name: (f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(drop.glob(glob))
            if f.is_file() and not f.name.startswith(".")}


def watch(drop: Path, glob: str, stop: threading.Event, every_s: float = 5.0) -> None:
    """Emit EVENT for files that appear or change in ``drop`` after the watcher started."""
    from prefect.events import emit_event

    seen = _listing(drop, glob)
    while not stop.wait(every_s):
        now = _listing(drop, glob)
        new = sorted(n for n, sig in now.items() if seen.get(n) != sig)
        if new:
            emit_event(event=EVENT, resource={"prefect.resource.id": drop_resource(drop)},
                       payload={"files": new, "drop_dir": str(drop)})
            print(f"new files in {drop}: {', '.join(new)}: a run is triggered")
        seen = now


def deployment(params: str = "params.yaml", profile: str | None = None, overrides: list[str] | None = None,
               until: str | None = None, name: str = DEPLOYMENT):
    """The RunnerDeployment `bertpipe schedule` serves (built without contacting a server)."""
    from prefect.deployments.runner import EntrypointType
    from prefect.events import DeploymentEventTrigger
    from prefect.schedules import Cron

    cfg = load_config(params, profile, overrides or [])
    fp = cfg.params.flow
    parameters = {"params": str(Path(params).resolve()), "profile": profile, "overrides": list(overrides or []),
                  "until": until}
    trigger = DeploymentEventTrigger(name="new files in flow.drop_dir", expect={EVENT},
                                     match={"prefect.resource.id": drop_resource(cfg.path(fp.drop_dir))},
                                     parameters=parameters)
    dep = domain_adaptation.to_deployment(
        name=name,
        schedules=[Cron(fp.cron, timezone=fp.timezone)],
        triggers=[trigger],
        parameters=parameters,
        # bertpipe_prefect.flows.domain_adaptation.domain_adaptation, imported by name rather than a file path
        # relative to the cwd: the same in a checkout and an install, and a project's own flows/ cannot shadow it
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    from bertpipe.graph.pipeline import COMMANDS
    from .knobs import typed_schema

    typed_schema(dep._parameter_openapi_schema, list(COMMANDS), sorted(cfg.params.profiles))  # UI dropdowns
    return dep


def serve(params: str = "params.yaml", profile: str | None = None, overrides: list[str] | None = None,
          until: str | None = None, name: str = DEPLOYMENT, watch_every_s: float = 5.0) -> None:
    from prefect import serve as prefect_serve

    cfg = load_config(params, profile, overrides or [])
    prefect_env(cfg)
    fp = cfg.params.flow
    dep = deployment(params, profile, overrides, until, name)
    drop = cfg.path(fp.drop_dir)
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(drop, fp.incoming_source.get("glob", "*"), stop, watch_every_s),
                               name="drop-dir-watcher", daemon=True)
    watcher.start()
    try:
        prefect_serve(dep, pause_on_shutdown=False, limit=1)  # limit: one pipeline run at a time on this machine
    finally:
        stop.set()
