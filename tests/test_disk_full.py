"""A full disk under the stage contract, on a real size-limited filesystem (a tmpfs): a pretrain checkpoint that does
not fit in paths.state (torch's "unexpected pos"), an MLflow-style SQLite store that does not (SQLite's "database or
disk is full"), and a work/ output that does not: each is one error naming the directory that is full, and nothing
half-written is left in either."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
from pathlib import Path

import pytest

from bertpipe.core.stage import Stage, run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _stage(build) -> Stage:
    return Stage("toy", "1", ("model",), lambda c: {"text": c.root / "in.txt"}, lambda c: c.work / "toy", build)


def _checkpoint(ctx):
    import torch

    from bertpipe.lib.training.checkpoint import atomic_save  # the training loop's checkpoint writer

    (ctx.out / "part.txt").write_text("begun")
    atomic_save({"model": torch.zeros(2_000_000)}, ctx.scratch / "last.pt")  # 8 MB into a 2 MB paths.state


def _sqlite_store(ctx):
    (ctx.out / "part.txt").write_text("begun")
    db = sqlite3.connect(ctx.cfg.state / "store.db")
    with contextlib.closing(db):
        db.execute("create table artifacts (data blob)")
        for _ in range(64):
            db.execute("insert into artifacts values (?)", (b"x" * 100_000,))
            db.commit()


def _work_output(ctx):
    (ctx.out / "model.bin").write_bytes(b"x" * 4_000_000)  # 4 MB into a 2 MB work/


def _project(tmp_path: Path) -> Path:
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    return tmp_path


def _half_written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and (".tmp" in p.name or p.name in ("part.txt", "model.bin", "last.pt")))


@pytest.mark.parametrize("build", [_checkpoint, _sqlite_store], ids=["checkpoint", "sqlite"])
def test_a_full_state_dir_is_named_not_work(tmp_path, build):
    root = _project(tmp_path)
    with tmpfs(root / "s", "2m"):
        cfg = load_config(root / "params.yaml")
        with pytest.raises(BertpipeError) as e:
            run_stage(_stage(build), cfg, tracker_factory=NO_TRACKING)
        line = str(e.value)
        assert line.startswith(f"{cfg.state}: no space left on device while building toy"), line
        assert "\n" not in line and str(cfg.work) not in line
        assert [p for p in _half_written(root) if not p.endswith("store.db")] == []


def test_a_full_work_dir_is_named_not_state(tmp_path):
    root = _project(tmp_path)
    with tmpfs(root / "w", "2m"):
        cfg = load_config(root / "params.yaml")
        with pytest.raises(BertpipeError) as e:
            run_stage(_stage(_work_output), cfg, tracker_factory=NO_TRACKING)
        assert str(e.value).startswith(f"{cfg.work}: no space left on device while building toy"), e.value
        assert _half_written(root) == []


def test_the_dir_named_is_the_one_holding_the_file_the_error_names(tmp_path):
    import errno

    from bertpipe.infra.diskfull import disk_full, full_dirs

    work, state = tmp_path / "w", tmp_path / "s"
    err = OSError(errno.ENOSPC, "No space left on device", str(state / "scratch" / "last.pt"))
    assert disk_full(err) and full_dirs([work, state], err) == [state]
    wrapped = RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 4096 vs 4020")
    assert disk_full(wrapped) and not disk_full(RuntimeError("boom"))


def test_artifacts_half_logged_when_the_state_dir_fills_are_removed(tmp_path):
    """The register case: MLflow's store in paths.state fills while a run logs its artifacts. One error line, and
    the run's partial artifacts are gone (they would keep the disk full)."""
    root = _project(tmp_path)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(4):
        (big / f"part{i}.bin").write_bytes(bytes(1_000_000))

    def build(ctx):
        (ctx.out / "part.txt").write_text("begun")
        ctx.tracker.defer_artifact(big, "files")  # logged when the run finishes, as register's files are
        return {}

    with tmpfs(root / "s", "3m"):
        cfg = load_config(root / "params.yaml")
        with pytest.raises(BertpipeError) as e:
            run_stage(_stage(build), cfg)  # the real MLflow run (sqlite and artifacts under paths.state)
        assert str(e.value).startswith(f"{cfg.state}: no space left on device while building toy"), e.value
        left = [p for p in (cfg.state / "mlartifacts").rglob("*") if p.is_file()]
        assert left == [], left
        assert _half_written(root) == []
