"""MLflow runs left RUNNING by a killed process (SIGKILL, the OOM killer, a power cut) are closed by the next run.

Each open run has a marker file in ``<paths.state>/open-runs/`` naming its process (pid, host, process start time, so
a reused pid is not mistaken for the owner); the marker is removed when the run ends. ``close_orphans`` marks the
runs of dead processes KILLED. A listing of that dir is all it costs when nothing was killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

from bertpipe.infra.config import Config


def _proc_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not mistaken for the owner.
    Read here rather than through psutil: that is as long, and its create time would not match the open markers'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_tags() -> dict[str, str]:
    """Who holds a run open: checked by ``close_orphans`` on the next run."""
    pid = os.getpid()
    return {"bertpipe.pid": str(pid), "bertpipe.host": socket.gethostname(), "bertpipe.pid_start": _proc_start(pid)}


def _owner_alive(tags: dict[str, str]) -> bool:
    try:
        pid = int(tags.get("bertpipe.pid", ""))
    except ValueError:
        return True  # not ours to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    started = tags.get("bertpipe.pid_start", "")
    return not started or _proc_start(pid) in ("", started)


def _markers(cfg: Config) -> Path:
    return cfg.state / "open-runs"


def mark_open(cfg: Config, run_id: str) -> None:
    """A file per open run, removed when it ends: after a SIGKILL it outlives its process, and the next bertpipe
    command in this project closes the run (``close_orphans``). A listing of this dir is all it costs otherwise."""
    d = _markers(cfg)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{run_id}.json").write_text(json.dumps(owner_tags()))


def mark_closed(cfg: Config, run_id: str) -> None:
    with contextlib.suppress(OSError):
        (_markers(cfg) / f"{run_id}.json").unlink()


def close_orphans(cfg: Config, connect: Callable[[], Any]) -> list[str]:
    """Mark KILLED the MLflow runs whose process died without closing them (SIGKILL, OOM killer, power loss).
    Called by every stage run, fresh or not, so a project is never left showing RUNNING runs of dead processes.
    ``connect()`` gives the MLflow client (``bertpipe.infra.tracking`` passes its own: this module sits below it),
    called only when a dead process's marker is found."""
    try:
        markers = sorted(_markers(cfg).glob("*.json"))
    except OSError:
        return []
    dead = []
    for m in markers:
        try:
            owner = json.loads(m.read_text())
        except (OSError, ValueError):
            owner = {}
        if owner.get("bertpipe.host") not in (None, socket.gethostname()):
            continue  # another machine's run: its liveness cannot be seen from here
        if not _owner_alive(owner):
            dead.append((m, owner))
    if not dead:
        return []
    c = connect()
    closed = []
    for m, owner in dead:
        run_id = m.stem
        try:
            if c.get_run(run_id).info.status == "RUNNING":
                c.set_tag(run_id, "bertpipe.error",
                          f"orphaned: process {owner.get('bertpipe.pid')} ended without closing the run")
                c.set_terminated(run_id, "KILLED")
                closed.append(run_id)
        except Exception as e:  # a deleted run or an unreachable server must not stop the pipeline
            print(f"[tracking] could not close orphaned run {run_id}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        m.unlink(missing_ok=True)
    if closed:
        print(f"[tracking] marked {len(closed)} run(s) of killed processes KILLED: {', '.join(closed)}",
              file=sys.stderr, flush=True)
    return closed
