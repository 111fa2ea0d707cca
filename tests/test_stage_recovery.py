"""The stage contract's safety rules: what bertpipe did not write is never replaced, leftovers of a killed build are
removed under the lock, SIGTERM unwinds cleanly, runs of dead processes are closed, credentials are never shown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from bertpipe.core.stage import Stage, read_manifest, run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError, Terminated

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


@pytest.fixture
def cfg(tmp_path: Path):
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    return load_config(tmp_path / "params.yaml")


def toy(build=None, version: str = "1") -> Stage:
    def default(ctx):
        (ctx.out / "copy.txt").write_text(Path(ctx.inputs["text"]).read_text().upper())
        return {"n": 1}

    return Stage("toy", version, ("model",), lambda c: {"text": c.root / "in.txt"}, lambda c: c.work / "toy",
                 build or default)


def test_a_directory_bertpipe_did_not_write_is_never_replaced(cfg):
    out = cfg.work / "toy"
    out.mkdir(parents=True)
    (out / "mine.csv").write_text("a,b\n")
    with pytest.raises(BertpipeError, match=r"w/toy: not written by bertpipe.*move it elsewhere"):
        run_stage(toy(), cfg, tracker_factory=NO_TRACKING)
    assert (out / "mine.csv").read_text() == "a,b\n" and not (out / "manifest.json").exists()


def test_a_file_added_to_an_output_is_kept_and_named(cfg):
    first = run_stage(toy(), cfg, tracker_factory=NO_TRACKING)
    assert read_manifest(first.out)["files"] == ["copy.txt"]
    (first.out / "NOTES.txt").write_text("my notes\n")
    with pytest.raises(BertpipeError, match=r"toy/NOTES\.txt: not written by bertpipe"):
        run_stage(toy(version="2"), cfg, tracker_factory=NO_TRACKING)  # a new version must rebuild
    assert (first.out / "NOTES.txt").read_text() == "my notes\n"
    assert read_manifest(first.out)["fingerprint"] == first.fingerprint
    (first.out / "NOTES.txt").unlink()
    assert not run_stage(toy(version="2"), cfg, tracker_factory=NO_TRACKING).skipped


def test_leftovers_of_a_killed_build_are_removed_under_the_lock(cfg):
    cfg.work.mkdir(parents=True)
    for name in (".toy.tmp-deadbeef", ".toy.old-deadbeef"):
        (cfg.work / name / "model").mkdir(parents=True)
        (cfg.work / name / "model" / "weights.bin").write_bytes(b"x" * 1000)
    (cfg.work / ".other.tmp-12345678").mkdir()  # another stage's: not this stage's to judge
    run_stage(toy(), cfg, tracker_factory=NO_TRACKING)
    assert sorted(p.name for p in cfg.work.iterdir()) == [".other.tmp-12345678", "toy"]


def test_an_output_moved_aside_by_a_killed_rename_comes_back(cfg):
    good = run_stage(toy(), cfg, tracker_factory=NO_TRACKING)
    os.replace(good.out, cfg.work / ".toy.old-deadbeef")  # where a kill between the two renames leaves it
    (cfg.work / ".toy.tmp-deadbeef").mkdir()
    again = run_stage(toy(), cfg, tracker_factory=NO_TRACKING)
    assert again.skipped and read_manifest(again.out)["fingerprint"] == good.fingerprint
    assert sorted(p.name for p in cfg.work.iterdir()) == ["toy"]


def test_a_sigterm_that_lands_in_a_weakref_callback_still_terminates():
    """A SIGTERM whose handler runs inside a finalizer or weakref callback (a garbage collection as it arrived) is
    swallowed there by Python ("Exception ignored in ..."); it is delivered again, so the process stops instead of
    running its stage to the end (a stage of a stopped flow run was seen to train on for 100 s)."""
    import sys

    code = """
import os, signal, time, weakref
from bertpipe.infra.errors import Terminated, raise_terminated

signal.signal(signal.SIGTERM, raise_terminated)


class Obj:
    pass


def callback(_ref):
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at this callback's next instruction
    sum(range(1000))


try:
    o = Obj()
    ref = weakref.ref(o, callback)
    del o  # the callback runs here
    for _ in range(300):
        time.sleep(0.01)
    print("ran to the end")
except Terminated:
    print("terminated")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "terminated", (out.stdout, out.stderr[-2000:])


def test_sigterm_mid_build_removes_the_temp_dir_and_keeps_the_old_output(cfg):
    good = run_stage(toy(), cfg, tracker_factory=NO_TRACKING)

    def killed(ctx):
        (ctx.out / "half.bin").write_bytes(b"x" * 100)
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not interrupt the build")

    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    with pytest.raises(Terminated):
        run_stage(toy(killed, version="2"), cfg, tracker_factory=NO_TRACKING)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler was only there while building
    assert sorted(p.name for p in cfg.work.iterdir()) == ["toy"]
    assert read_manifest(good.out)["fingerprint"] == good.fingerprint


def test_runs_of_dead_processes_are_closed_by_the_next_run(cfg):
    from bertpipe.infra.orphans import mark_open, owner_tags
    from bertpipe.infra.tracking import client, experiment_id, stage_run

    c = client(cfg)
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = c.create_run(experiment_id(cfg, c), run_name="killed").info.run_id
    marker = cfg.state / "open-runs" / f"{orphan}.json"
    mark_open(cfg, orphan)
    marker.write_text(json.dumps({**owner_tags(), "bertpipe.pid": str(dead.pid)}))
    alive = c.create_run(experiment_id(cfg, c), run_name="alive").info.run_id
    mark_open(cfg, alive)  # this process: alive, left alone

    res = run_stage(toy(), cfg, tracker_factory=stage_run)
    assert c.get_run(orphan).info.status == "KILLED"
    assert "orphaned" in c.get_run(orphan).data.tags["bertpipe.error"]
    assert c.get_run(alive).info.status == "RUNNING"
    assert c.get_run(res.run_id).info.status == "FINISHED"
    assert sorted(p.stem for p in marker.parent.glob("*.json")) == [alive]
    # A fresh stage closes orphans too (the kill may have come after the output was in place).
    orphan2 = c.create_run(experiment_id(cfg, c), run_name="k2").info.run_id
    marker2 = cfg.state / "open-runs" / f"{orphan2}.json"
    marker2.write_text(json.dumps({**owner_tags(), "bertpipe.pid": str(dead.pid)}))
    assert run_stage(toy(), cfg).skipped
    assert c.get_run(orphan2).info.status == "KILLED"


@pytest.mark.parametrize("uri, shown", [
    ("https://user:secret@mlflow.example.com:5000/x", "https://mlflow.example.com:5000/x"),
    ("postgresql://ml:pw@db/mlflow?password=pw&sslmode=require", "postgresql://db/mlflow?password=***&sslmode=require"),
    ("sqlite:////tmp/a #1/mlflow.db", "sqlite:////tmp/a #1/mlflow.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_tracking_uri_credentials_are_never_shown(uri, shown, cfg):
    from bertpipe.infra.tracking import display_uri

    assert display_uri(uri) == shown
    with_uri = cfg.with_overrides([f"tracking.uri={uri}"])
    assert "secret" not in json.dumps(with_uri.section_shown("tracking")) and "pw@" not in str(
        with_uri.section_shown("tracking"))
