"""dvc.lock as a run records it (bertpipe.doors.dvc.dvclock) when `dvc commit` is killed half-way or fails: the lock
files are the old ones or the new ones, never cut short, and a failure says DVC's reason.

The kill lands inside DVC's own write of dvc.lock: a ``sitecustomize`` on the `dvc commit` process's PYTHONPATH
writes half of DVC's first write to a dvc.lock, then SIGKILLs `dvc commit` alone (the run goes on) or its whole
process group (the run is killed with it). What the run that records it looks like end to end: test_pipeline_e2e.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from bertpipe.doors.dvc import dvclock
from bertpipe.graph.pipeline import load_config
from tests.e2e_project import invoke, run, write_project

pytestmark = pytest.mark.slow  # seven `dvc commit` processes of ~2 CPU-s each

KILL_IN_WRITE = '''
import builtins, os, signal

_open = builtins.open


class _CutShort:
    """The file DVC writes dvc.lock through: half of the first write lands, then the kill."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, text):
        self.fh.write(text[: len(text) // 2])
        self.fh.flush()
        os.killpg(0, signal.SIGKILL) if os.environ["KILL_IN_WRITE"] == "group" else os.kill(os.getpid(), signal.SIGKILL)

    def __getattr__(self, name):
        return getattr(self.fh, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()


def _cut_open(file, mode="r", *args, **kwargs):
    fh = _open(file, mode, *args, **kwargs)
    return _CutShort(fh) if os.path.basename(str(file)) == "dvc.lock" and "w" in mode else fh


if os.environ.get("KILL_IN_WRITE"):
    builtins.open = _cut_open
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory, sample_raw):
    """A project in a DVC repo, its ``params`` stage (what writes params_effective/) recorded once: (root, its
    config, the recorded dvc.lock). No stage is built: the params stage needs none, and what the claim is about is
    the lock file, not what it records."""
    root = tmp_path_factory.mktemp("dvclock") / "p"
    cfg = load_config(write_project(root, sample_raw))
    assert invoke(["dvc-yaml"], root).returncode == 0
    subprocess.run(["dvc", "init", "-q", "--no-scm"], cwd=root, check=True, capture_output=True)
    line = dvclock.record(cfg, [])
    assert line.startswith("dvc.lock: recorded 1 stage(s)"), line
    return root, cfg, (root / "dvc.lock").read_text()


@pytest.fixture
def kill_in_write(tmp_path, monkeypatch):
    """``kill_in_write(mode)``: the next `dvc commit` started with this environment is killed inside its first write
    of a dvc.lock; mode "dvc" kills it alone, "group" its whole process group."""
    (tmp_path / "sitecustomize.py").write_text(KILL_IN_WRITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return lambda mode: monkeypatch.setenv("KILL_IN_WRITE", mode)


def test_dvc_commit_killed_in_its_write_leaves_the_old_lock(project, kill_in_write):
    root, cfg, recorded = project
    (root / "dvc.lock").write_text(recorded.replace("schema: '2.0'", "schema: '2.0'\n# the old lock"))
    old = (root / "dvc.lock").read_text()
    kill_in_write("dvc")
    line = dvclock.record(cfg, [])
    assert line.startswith("dvc.lock: not recorded: `dvc commit` failed (stopped by signal 9)"), line
    assert (root / "dvc.lock").read_text() == old  # not the half DVC wrote: the lock as it was
    assert not list((root / ".dvc" / "tmp").glob("bertpipe-dvclock*")), "the copy outlived the restore"


def test_a_run_killed_with_its_dvc_commit_is_repaired_by_the_next(project, kill_in_write, monkeypatch):
    """SIGKILL to the run and `dvc commit` together leaves dvc.lock cut short (nothing can stop that); the next record
    puts the old one back before committing, and says so."""
    root, cfg, recorded = project
    (root / "dvc.lock").write_text(recorded)
    kill_in_write("group")
    code = f"from bertpipe.doors.dvc import dvclock; from bertpipe.graph.pipeline import load_config; " \
           f"dvclock.record(load_config({str(root / 'params.yaml')!r}), [])"
    killed = run([sys.executable, "-c", code], root, check=False, prefect="ephemeral")
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    cut = (root / "dvc.lock").read_text()
    assert len(cut) < len(recorded), "the kill did not land inside DVC's write"
    monkeypatch.delenv("KILL_IN_WRITE")
    line = dvclock.record(cfg, [])
    assert line.splitlines()[0] == "dvc.lock: put back as it was before an interrupted `dvc commit`", line
    assert line.splitlines()[1].startswith("dvc.lock: recorded 1 stage(s)"), line
    assert (root / "dvc.lock").read_text() == recorded


def test_a_lock_cut_short_with_no_copy_is_removed_and_recorded_afresh(project):
    root, cfg, recorded = project
    for cut in ("", recorded[: recorded.index("md5:") + 2]):  # empty; cut inside a key
        (root / "dvc.lock").write_text(cut)
        line = dvclock.record(cfg, [])
        assert "dvc.lock: unreadable (cut short by a killed `dvc commit`): removed" in line, line
        assert line.splitlines()[-1].startswith("dvc.lock: recorded 1 stage(s)"), line
        assert (root / "dvc.lock").read_text() == recorded


def test_a_failed_dvc_commit_says_dvcs_reason(project):
    """DVC's repo lock held by another process: the line says so, not DVC's support footer or an exit status."""
    from dvc.repo import Repo

    root, cfg, recorded = project
    (root / "dvc.lock").write_text(recorded)
    with Repo(str(root)).lock:
        line = dvclock.record(cfg, [])
    assert "Unable to acquire lock" in line and "Having any troubles" not in line, line
    assert line.startswith("dvc.lock: not recorded: `dvc commit` failed (failed to commit params - "), line
    assert (root / "dvc.lock").read_text() == recorded
    assert yaml.safe_load(recorded)["stages"].keys() == {"params"}
