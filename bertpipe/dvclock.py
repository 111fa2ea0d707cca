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
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bertpipe.config import Config
from bertpipe.dvcfile import dvc_files, render_effective, render_files


def dvc_repo(root: Path) -> bool:
    """The project is inside a DVC repo (a ``.dvc`` folder here or above) and has a dvc.yaml."""
    return (root / "dvc.yaml").is_file() and any((p / ".dvc").is_dir() for p in (root, *root.parents))


def out_of_date(cfg: Config) -> list[str]:
    """The DVC files (relative to the project) that differ from what ``cfg`` generates."""
    root = cfg.root.resolve()
    files = {**render_files(cfg), **render_effective(cfg)}
    return [p for p, text in files.items()
            if not (root / p).is_file() or (root / p).read_text(encoding="utf-8") != text]


def targets(cfg: Config, stages: list[str]) -> list[str]:
    """`dvc commit` targets of ``stages`` (bertpipe names) and the ``params`` stage: a stage of the root dvc.yaml by
    its name, one in a file of its own as ``stages/<name>/dvc.yaml:<name>``."""
    from bertpipe.dvcfile import dvc_stage_name

    where = {name: path for path, d in dvc_files(cfg).items() for name in d["stages"]}
    wanted = ["params"] + [dvc_stage_name(s) for s in stages]
    return [n if where[n] == "dvc.yaml" else f"{where[n]}:{n}" for n in wanted if n in where]


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
    try:
        proc = subprocess.run([sys.executable, "-m", "dvc", "commit", "--force", "--quiet", *names], cwd=root,
                              capture_output=True, text=True, timeout=timeout_s)
        why = None if proc.returncode == 0 else next(
            (ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()), f"exit {proc.returncode}")
    except (OSError, subprocess.TimeoutExpired) as e:  # the run itself succeeded: said, not raised
        why = str(e)
    if why is not None:
        return f"dvc.lock: not recorded: `dvc commit` failed ({why}); `dvc commit` records the run"
    return f"dvc.lock: recorded {len(names)} stage(s) as `dvc commit` does (`dvc status` agrees with `bertpipe stages`)"
