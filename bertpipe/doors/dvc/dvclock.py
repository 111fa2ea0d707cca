"""dvc.lock after a run: what `dvc commit` writes, for the stages a `bertpipe run` built or found fresh.

DVC knows a stage is up to date only from dvc.lock (the hashes of its deps and outs when it last ran). `dvc repro`
writes it; a run through another door (`bertpipe run`, a Prefect deployment) builds the same outputs from the same
inputs, so in a DVC repo the flow ends as `dvc commit` would: it records those stages' deps and outs in dvc.lock (and
their outs in DVC's cache), and `dvc status` agrees with `bertpipe stages`.

Only when the run's settings are what the project's DVC files say: its dvc.yaml, ``stages/`` and
``params_effective/`` equal what this run's config generates (`bertpipe dvc-yaml --check`). A run with a ``--set``
or ``--profile`` that moves a stage's resolved params, or a params.yaml edited since `bertpipe dvc-yaml`, built
something dvc.yaml does not describe; recording it would make `dvc status` call a stage fresh that `bertpipe stages`
calls stale. Then the lock is left as it is and one line says why.

DVC rewrites a lock file in place once per target, so a kill during `dvc commit` can leave it empty or cut short, and
every later `dvc` command fails on it. The lock files are copied aside first (``.dvc/tmp/bertpipe-dvclock``, complete
before the commit starts, removed when it has succeeded): a commit that fails or is stopped puts them back at once,
and one killed with the run (SIGKILL) leaves the copy, which the next run puts back before it commits. A lock file
DVC cannot read that has no copy is removed, and the run's stages are recorded afresh. One run records at a time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from bertpipe.core.outputs import atomic_file, output_lock
from bertpipe.doors.dvc.dvcfile import dvc_files, render_effective, render_files
from bertpipe.infra.config import Config


def dvc_root(root: Path) -> Path | None:
    """The DVC repo the project at ``root`` is in (a ``.dvc`` folder here or above), None outside one."""
    return next((p for p in (root, *root.parents) if (p / ".dvc").is_dir()), None)


def dvc_repo(root: Path) -> bool:
    """The project is inside a DVC repo and has a dvc.yaml."""
    return (root / "dvc.yaml").is_file() and dvc_root(root) is not None


def out_of_date(cfg: Config) -> list[str]:
    """The DVC files (relative to the project) that differ from what ``cfg`` generates."""
    root = cfg.root.resolve()
    files = {**render_files(cfg), **render_effective(cfg)}
    return [p for p, text in files.items()
            if not (root / p).is_file() or (root / p).read_text(encoding="utf-8") != text]


def targets(cfg: Config, stages: list[str]) -> list[str]:
    """`dvc commit` targets of ``stages`` (bertpipe names) and the ``params`` stage: a stage of the root dvc.yaml by
    its name, one in a file of its own as ``stages/<name>/dvc.yaml:<name>``."""
    from bertpipe.doors.dvc.dvcfile import dvc_stage_name

    where = {name: path for path, d in dvc_files(cfg).items() for name in d["stages"]}
    wanted = ["params"] + [dvc_stage_name(s) for s in stages]
    return [n if where[n] == "dvc.yaml" else f"{where[n]}:{n}" for n in wanted if n in where]


def _lock_files(cfg: Config) -> list[Path]:
    """The dvc.lock beside each of the project's dvc.yaml files (absolute; those not written yet included)."""
    root = cfg.root.resolve()
    return [root / Path(p).with_name("dvc.lock") for p in dvc_files(cfg)]


def _readable(lock: Path) -> bool:
    """DVC can read ``lock``: YAML that DVC's lock-file schema accepts (an empty or cut-short file is not)."""
    from dvc.schema import COMPILED_LOCKFILE_SCHEMA

    try:
        COMPILED_LOCKFILE_SCHEMA(yaml.safe_load(lock.read_text(encoding="utf-8")))
    except Exception:  # noqa: BLE001 - an unreadable file, bad YAML or a schema error all mean the same here
        return False
    return True


def _save(locks: list[Path], saved: Path, base: Path) -> None:
    """Copy ``locks`` under ``saved`` (paths relative to ``base``; ``index.json`` says which existed). Written under a
    temp name and renamed, so ``saved`` is a complete copy or absent."""
    tmp = saved.with_name(saved.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    index = {}
    for lock in locks:
        rel = lock.relative_to(base).as_posix()
        index[rel] = lock.is_file()
        if index[rel]:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lock, tmp / rel)
    (tmp / "index.json").write_text(json.dumps(index), encoding="utf-8")
    os.replace(tmp, saved)


def _discard(saved: Path) -> None:
    """Remove the copy: renamed to the temp name first (which ``_save`` clears), so a kill half-way never leaves part
    of a copy to be put back."""
    tmp = saved.with_name(saved.name + ".tmp")
    if saved.exists():
        shutil.rmtree(tmp, ignore_errors=True)
        os.replace(saved, tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def _restore(saved: Path, base: Path) -> list[str]:
    """Put every lock file of the copy under ``saved`` back as it was (each one renamed into place, so a kill here
    leaves the copy to finish from), then discard the copy. Returns the lock files put back (relative to ``base``)."""
    if not (saved / "index.json").is_file():
        _discard(saved)  # an incomplete copy: the commit never started, the locks are as they were
        return []
    back = []
    for rel, existed in json.loads((saved / "index.json").read_text(encoding="utf-8")).items():
        lock = base / rel
        if existed:
            if not lock.is_file() or lock.read_bytes() != (saved / rel).read_bytes():
                with atomic_file(lock) as tmp:
                    shutil.copy2(saved / rel, tmp)
                back.append(rel)
        elif lock.exists():
            lock.unlink()
            back.append(rel)
    _discard(saved)
    return back


def _dvc_reason(proc: subprocess.CompletedProcess) -> str:
    """What DVC says went wrong: its ``ERROR:`` lines (else its other output), without its support footer."""
    lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines()
             if ln.strip() and "Having any troubles?" not in ln]
    errors = [ln.removeprefix("ERROR:").strip() for ln in lines if ln.startswith("ERROR:")]
    if proc.returncode < 0:
        errors.append(f"stopped by signal {-proc.returncode}")
    return " ".join(errors or lines[:3]) or f"exit {proc.returncode}"


def _commit(root: Path, names: list[str], timeout_s: float) -> str | None:
    """`dvc commit --force` of ``names``; None when it succeeded, else DVC's reason."""
    try:
        proc = subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", *names], cwd=root,
                              capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:  # the run itself succeeded: said, not raised
        return str(e)
    return None if proc.returncode == 0 else _dvc_reason(proc)


def _repair(cfg: Config, saved: Path, base: Path) -> list[str]:
    """Lock files a killed commit left: the copy put back, and any lock DVC cannot read that has no copy removed.
    Returns what was done, one phrase per file. Call only holding the recorders' lock."""
    done = [f"{rel}: put back as it was before an interrupted `dvc commit`" for rel in _restore(saved, base)]
    for lock in _lock_files(cfg):
        if lock.is_file() and not _readable(lock):
            lock.unlink()
            rel = lock.relative_to(base).as_posix()
            done.append(f"{rel}: unreadable (cut short by a killed `dvc commit`): removed")
    return done


def record(cfg: Config, stages: list[str], timeout_s: float = 1800) -> str | None:
    """Record ``stages`` (those the run built or found fresh) in dvc.lock as `dvc commit --force` does. Returns the
    line to show, or None when the project is not a DVC repo."""
    root = cfg.root.resolve()
    if not dvc_repo(root):
        return None
    stale = out_of_date(cfg)
    if stale:
        shown = ", ".join(stale[:3]) + (f" and {len(stale) - 3} more" if len(stale) > 3 else "")
        return (f"dvc.lock: left as it is: {shown} not what this run's settings generate (a --set/--profile, or "
                f"params.yaml edited since `bertpipe dvc-yaml`: run it, and `dvc commit` records what is fresh)")
    names = targets(cfg, stages)
    base = dvc_root(root)
    saved = base / ".dvc" / "tmp" / "bertpipe-dvclock"
    with output_lock(saved):  # one recorder at a time: another's copy is never taken for a killed run's
        repaired = _repair(cfg, saved, base)
        _save(_lock_files(cfg), saved, base)
        try:
            why = _commit(root, names, timeout_s)
        except BaseException:  # Ctrl-C or SIGTERM: subprocess.run has stopped DVC; its half-written locks go back
            _restore(saved, base)
            raise
        if why is None:
            _discard(saved)
        else:
            _restore(saved, base)
    said = "".join(f"{r}\n" for r in repaired)
    if why is not None:
        return said + f"dvc.lock: not recorded: `dvc commit` failed ({why}); `dvc commit` records the run"
    return said + (f"dvc.lock: recorded {len(names)} stage(s) as `dvc commit` does (`dvc status` agrees with "
                   f"`bertpipe stages`)")
