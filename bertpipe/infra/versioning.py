"""Data versioning through the DVC command line (the library never imports dvc, so it stays optional at runtime)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from bertpipe.infra.errors import BertpipeError


def dvc_env(root: Path) -> dict[str, str]:
    """Environment for dvc: no analytics, and its site cache inside the project rather than the user's home."""
    env = dict(os.environ)
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("DVC_SITE_CACHE_DIR", str(Path(root) / ".bertpipe" / "dvc-site-cache"))
    return env


def dvc_command() -> list[str]:
    exe = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    return [exe] if Path(exe).exists() else [sys.executable, "-m", "dvc"]


def dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([*dvc_command(), *args], cwd=root, env=dvc_env(root), capture_output=True, text=True)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "failed").splitlines()[-1]
        raise BertpipeError(f"dvc {' '.join(args)}: {last}")
    return proc


def is_dvc_repo(root: Path) -> bool:
    return (Path(root) / ".dvc").is_dir()


def dvc_add_if_repo(path: Path, root: Path, log=print) -> bool:
    """`dvc add path` when ``root`` is a DVC repo; returns whether it did."""
    if not is_dvc_repo(root):
        log(f"{root} is not a DVC repo (run `dvc init`); {path} left unversioned")
        return False
    rel = os.path.relpath(path, root)
    dvc(root, "add", rel)
    log(f"dvc add {rel}: versioned as {rel}.dvc")
    return True
