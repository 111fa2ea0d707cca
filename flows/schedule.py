"""`bertpipe schedule`: a Prefect deployment of domain_adaptation on a cron schedule from params (``flow.cron`` in
``flow.timezone``), served by this long-running process, and also triggered when new files land in ``flow.drop_dir``.

New data: a watcher thread in this process polls the drop dir and, for files it has not seen (by name, size and
mtime) once they have held still for a poll interval, emits a Prefect event ``bertpipe.incoming.files`` about the
resource ``bertpipe.drop-dir.<abs path>``; the deployment carries a DeploymentEventTrigger on that event, so the
server's automation starts a run (visible in the UI as triggered by the event, and any other emitter of the event
triggers it too). The run then reads the drop dir's
files as one more domain source (bertpipe.stages.prepare.declare.with_incoming). A poll rather than inotify
(watchfiles): it sees a drop dir created after it started or removed and made again, and files another machine writes
to a network mount, for 0.001 s of CPU per idle 30 s.

Point it at a server first (`prefect server start --host 127.0.0.1` and
`export PREFECT_API_URL=http://127.0.0.1:4200/api`); stop this process before stopping the server."""

from __future__ import annotations

import stat
import threading
from pathlib import Path
from typing import Iterator

from bertpipe.graph.pipeline import load_config
from bertpipe_prefect.tasks.env import prefect_env

from .domain_adaptation import domain_adaptation

DEPLOYMENT = "bertpipe-domain-adaptation"
EVENT = "bertpipe.incoming.files"


def drop_resource(drop: Path) -> str:
    return f"bertpipe.drop-dir.{drop.resolve()}"


def _listing(drop: Path, glob: str) -> dict[str, tuple[int, int]]:
    """{name: (size, mtime)} of the regular files matching ``glob``, not hidden; one gone since the glob is left out."""
    out = {}
    for f in sorted(drop.glob(glob)) if drop.is_dir() else []:
        try:
            st = f.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and not f.name.startswith("."):
            out[f.name] = (st.st_size, st.st_mtime_ns)
    return out


def arrivals(drop: Path, glob: str, stop: threading.Event, every_s: float = 5.0) -> Iterator[list[str]]:
    """At each poll, the files that appeared or changed in ``drop`` since the watcher started, each once its size and
    mtime have held for a whole interval: a file still being copied in is reported when the copy is done."""
    last = _listing(drop, glob)
    reported = dict(last)
    while not stop.wait(every_s):
        now = _listing(drop, glob)
        new = sorted(n for n, sig in now.items() if last.get(n) == sig != reported.get(n))
        reported.update({n: now[n] for n in new})
        last = now
        yield new


def watch(drop: Path, glob: str, stop: threading.Event, every_s: float = 5.0) -> None:
    """Emit EVENT for the files ``arrivals`` reports."""
    from prefect.events import emit_event

    for new in arrivals(drop, glob, stop, every_s):
        if new:
            emit_event(event=EVENT, resource={"prefect.resource.id": drop_resource(drop)},
                       payload={"files": new, "drop_dir": str(drop)})
            print(f"new files in {drop}: {', '.join(new)}: a run is triggered")


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
