"""A full disk, however a library reports it, and which of the project's directories it is.

Writers report a full disk in their own words, mostly without a file name: ``OSError`` ENOSPC/EDQUOT, torch's
``RuntimeError`` from its zip writer ("unexpected pos ...", "file write failed"), SQLite's "database or disk is full"
(MLflow's store), safetensors' and pyarrow's messages carrying "No space left on device". ``disk_full`` recognises
each, through the exception's causes. ``full_dirs`` then names the directory to free: the candidate (a stage's
``work/`` dir, ``paths.state``) holding the file the error names, or, when it names none, the candidates on the
filesystem with the least space left.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

MARKERS = ("no space left on device", "disk quota exceeded", "database or disk is full", "unexpected pos",
           "file write failed")


def disk_full(e: BaseException | None) -> bool:
    for x in _chain(e):
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(m in str(x).lower() for m in MARKERS):
            return True
    return False


def _space(path: Path) -> tuple[int, int] | None:
    """(device, bytes available to this user) of the filesystem ``path`` (or its nearest existing parent) is on."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
        return os.stat(p).st_dev, st.f_bavail * st.f_frsize
    except OSError:
        return None


def _chain(e: BaseException | None):
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def full_dirs(candidates: list[Path], e: BaseException | None = None) -> list[Path]:
    """The candidate holding the file whose write failed, when the error names one; else the candidates on the
    filesystem with the least space available (all of them when none can be measured)."""
    for x in _chain(e):
        name = getattr(x, "filename", None) if isinstance(x, OSError) else None
        if name:
            p = Path(os.fsdecode(name)).absolute()
            hit = [Path(c) for c in candidates if p.is_relative_to(Path(c).absolute())]
            if hit:  # the innermost, should one candidate hold another
                return [max(hit, key=lambda c: len(c.absolute().parts))]
    spaces = {Path(c): _space(Path(c)) for c in dict.fromkeys(candidates)}
    known = {c: s for c, s in spaces.items() if s is not None}
    if not known:
        return list(spaces)
    dev = min(known.values(), key=lambda s: s[1])[0]
    return [c for c, s in known.items() if s[0] == dev]


def full_line(candidates: list[Path], doing: str, e: BaseException | None = None) -> str:
    """The one-line message: which directory is full, what was being done, what to do."""
    where = " and ".join(str(d) for d in full_dirs(candidates, e))
    return (f"{where}: no space left on device while {doing} (nothing half-written was kept); free some space "
            "there and rerun")


def _local(uri: str) -> Path | None:
    from urllib.parse import unquote, urlparse

    u = urlparse(uri)
    return Path(unquote(u.path)) if u.scheme in ("file", "") and u.path else None


def drop_partial_artifacts(client, run_id: str) -> list[Path]:
    """After a run failed for want of space, remove what it wrote to a local artifact store (its artifacts, and the
    logged models it created that no registered version uses), so the failure does not keep the disk full. Best
    effort: whatever cannot be looked up or removed is left. Returns what was removed."""
    import shutil

    try:
        run = client.get_run(run_id)
        used = {getattr(mv, "model_id", None) for mv in client.search_model_versions(f"run_id = '{run_id}'")}
        places = [run.info.artifact_uri]
        for m in client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run_id}'"):
            if m.model_id not in used:
                places.append(m.artifact_location)
    except Exception:  # noqa: BLE001 (the store itself may be unusable when the disk is full)
        return []
    removed = []
    for uri in places:
        p = _local(uri or "")
        if p is not None and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed
