"""An output directory's safety rules, used by ``bertpipe.core.stage.run_stage``: one builder at a time (a file lock),
atomic replacement (temp dir, then rename), never replacing what bertpipe did not write (the manifest lists the files
a stage wrote), and clean-up after a killed build (leftover temp dirs, an output moved aside mid-rename, SIGTERM)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator

from bertpipe.infra.errors import BertpipeError, raise_terminated

MANIFEST = "manifest.json"


def read_manifest(out: Path) -> dict | None:
    try:
        return json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def output_lock(out: Path, lock_dir: Path | None = None) -> Iterator[None]:
    """Serialise builders of one output across processes (two flow runs started at once). The lock file lives in
    ``lock_dir`` (the state dir) when given, so a failed first build leaves nothing under work/."""
    if lock_dir is None:
        lock = out.parent / f".{out.name}.lock"
    else:
        lock = Path(lock_dir) / (hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:24] + ".lock")
    from filelock import FileLock  # imported when a stage builds, not by every command that reads outputs

    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock):
        yield


def missing_parents(out: Path, root: Path) -> list[Path]:
    """The directories above ``out`` that do not exist yet (deepest first), to remove again if the build fails."""
    missing = []
    for p in [out.parent, *out.parent.parents]:
        if p.exists() or p == root or root not in p.parents:
            break
        missing.append(p)
    return missing


def written_files(d: Path) -> list[str]:
    """Every file under ``d`` (relative, sorted): the manifest records them so a later rebuild can tell a file the
    user put there from one bertpipe wrote."""
    return sorted(str(f.relative_to(d)) for f in Path(d).rglob("*") if f.is_file() or f.is_symlink())


def foreign_files(out: Path) -> list[str]:
    """What in ``out`` bertpipe did not write: everything when there is no manifest, else the files its manifest does
    not list (a manifest from before the list existed vouches for the whole directory)."""
    out = Path(out)
    if not out.exists() and not out.is_symlink():
        return []
    if not out.is_dir() or out.is_symlink():
        return ["."]
    present = written_files(out)
    if not (out / MANIFEST).is_file():
        return present
    m = read_manifest(out)
    listed = (m or {}).get("files")
    if not isinstance(listed, list):
        return []
    return sorted(set(present) - set(listed) - {MANIFEST})


def check_replaceable(out: Path) -> None:
    """Refuse to replace an output directory holding anything bertpipe did not write (a user's notes, a dir that
    happens to sit where the output goes): replacing it would delete them."""
    foreign = foreign_files(out)
    if foreign:
        what = out if foreign == ["."] or not (Path(out) / MANIFEST).is_file() else Path(out) / foreign[0]
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 and what != out else ""
        raise BertpipeError(
            f"{what}{more}: not written by bertpipe, and rebuilding would replace {out}; move it elsewhere and rerun"
        )


@contextlib.contextmanager
def atomic_file(path: Path | str) -> Iterator[Path]:
    """A temp path beside ``path`` to write to; renamed over ``path`` when the block succeeds, removed when it fails
    (Ctrl-C and SIGTERM included): a reader, or a rerun after a kill, sees the old file or the new one, never half.
    The one helper for every single-file write that must not be seen half-done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path | str, text: str) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_replace_dir(tmp: Path, out: Path) -> None:
    """Move a finished ``tmp`` dir to ``out``; an older ``out`` is moved aside first, then deleted. An ``out`` holding
    files bertpipe did not write is never touched (see ``check_replaceable``)."""
    check_replaceable(out)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:  # e.g. SIGTERM between the two renames: put the previous output back
        if old is not None and not out.exists():
            os.replace(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale(out: Path, log: Callable[[str], None] | None = None) -> list[Path]:
    """Temp and moved-aside dirs of ``out`` left by a killed builder. Call only while holding ``output_lock(out)``:
    then no live process owns them."""
    gone = []
    for d in sorted(out.parent.glob(f".{out.name}.old-*")):
        if not out.exists() and (d / MANIFEST).is_file():  # killed between the two renames: the output comes back
            os.replace(d, out)
            if log is not None:
                log(f"restored {out} from {d.name}, left by an interrupted run")
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    for d in out.parent.glob(f".{out.name}.tmp-*"):
        shutil.rmtree(d, ignore_errors=True)
        gone.append(d)
    if gone and log is not None:
        log(f"removed {len(gone)} leftover dir(s) of an interrupted run: {', '.join(d.name for d in gone)}")
    return gone


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """While building, SIGTERM raises ``Terminated`` in the main thread so the temp dir is removed and the MLflow run
    is closed as KILLED. Leaves any handler someone else installed (Prefect, the CLI) alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
