"""What the benches that run stages alone share: one way to run a `bertpipe` stage in a throwaway project and time
it (wall and the child's own CPU), and that project's setup from this repo's params."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _env(threads: int = 1) -> dict:
    n = str(threads)
    return dict(os.environ, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, PYTHONPATH=str(REPO),
                TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")


def run_cli(project: Path, args: list[str], sets: dict, log: Path, threads: int = 1) -> tuple[float, float, int]:
    """Run `bertpipe ARGS --set k=v ...` in the project with `threads` intra-op threads; returns (wall s, CPU s of
    this child alone, exit status). The child's own rusage (wait4), so runs in parallel threads do not mix."""
    cmd = ["bertpipe", *args]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, cwd=project, env=_env(threads), stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime, proc.returncode


def setup_project(project: Path, raw: Path) -> None:
    project.mkdir(parents=True, exist_ok=True)
    text = (REPO / "params.yaml").read_text()
    text = text.replace("raw: data/raw ", f"raw: {raw} ", 1)
    (project / "params.yaml").write_text(text)
    shutil.copy(REPO / "profiles.yaml", project / "profiles.yaml")
