"""SIGTERM to `bertpipe run` while stages run in their own processes: the run ends (non-zero) within seconds, every
stage process it started is stopped rather than left to run to the end, and no temp dir is left under work/. SIGKILL:
nothing it started outlives it (bertpipe.lifeline)."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable

import psutil
import pytest

from bertpipe.lifeline import EVERY_S
from tests.e2e_project import env_for, stop
from tests.test_kill_recovery import leftovers, make_project

pytestmark = pytest.mark.slow


def _stage_children(proc: psutil.Process) -> list[psutil.Process]:
    out = []
    for c in proc.children(recursive=True):
        try:
            if "bertpipe.cli" in " ".join(c.cmdline()):
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _start_run(tmp_path, sample_raw, zh_tokenizer_dir, until: Callable[[psutil.Process], bool] | None = None):
    """`bertpipe run` (a temporary Prefect server) of a project whose long pretrain runs beside the base encoder's
    finetune, each stage in its own process; returned once ``until(run)`` holds (default: both stage processes
    exist)."""
    from tests.synthetic import keyword_classification, tiny_encoder, write_jsonl

    enc = tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    root = make_project(tmp_path / "p", sample_raw, enc, zh_tokenizer_dir)
    write_jsonl(root / "sentiment.jsonl", keyword_classification(3000, seed=1))
    params = root / "params.yaml"
    import yaml

    p = yaml.safe_load(params.read_text())
    p["pretrain"].update(max_steps=5000, eval_every=1000, save_every=1000, compile="off")  # killed long before
    p["finetune"].update(encoders=["base", "adapted"], train={"epochs": 50, "max_seq_len": 32})
    p["flow"] = {"max_parallel": 2}
    params.write_text(yaml.safe_dump(p, allow_unicode=True))

    log = open(root / "run.log", "w")
    run = subprocess.Popen(["bertpipe", "run"], cwd=root, env=env_for(root, "ephemeral"), stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    me = psutil.Process(run.pid)
    until = until or (lambda proc: len(_stage_children(proc)) >= 2)
    end = time.time() + 600
    while time.time() < end and not until(me) and run.poll() is None:
        time.sleep(0.5)
    return root, run, me


def _cmdlines(procs: list[psutil.Process]) -> list[str]:
    out = []
    for c in procs:
        try:
            out.append(" ".join(c.cmdline()))
        except psutil.NoSuchProcess:
            pass
    return out


def _prefect_server(proc: psutil.Process) -> bool:
    return any("prefect" in c and "uvicorn" in c for c in _cmdlines(proc.children(recursive=True)))


def test_sigkill_of_run_leaves_no_process_behind(tmp_path, sample_raw, zh_tokenizer_dir):
    """SIGKILL (the OOM killer, kill -9) of `bertpipe run`: its temporary Prefect server, and whatever else it has
    started by then, ends with it (bertpipe.lifeline; the same watcher ends a stage process's pools)."""
    root, run, me = _start_run(tmp_path, sample_raw, zh_tokenizer_dir, until=_prefect_server)
    tree: list[psutil.Process] = []
    try:
        assert _prefect_server(me), (root / "run.log").read_text()[-3000:]
        time.sleep(2 * EVERY_S)  # the watcher has walked the tree since the server started
        tree = me.children(recursive=True)
        run.kill()
        run.wait(30)
        gone, alive = psutil.wait_procs(tree, timeout=90)
        assert not alive, _cmdlines(alive)
    finally:
        if run.poll() is None:
            stop(run)
        for c in tree:  # what a failure left
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass


def test_sigterm_to_run_stops_its_stage_processes(tmp_path, sample_raw, zh_tokenizer_dir):
    root, run, me = _start_run(tmp_path, sample_raw, zh_tokenizer_dir)
    try:
        children = _stage_children(me)
        assert len(children) >= 2, (root / "run.log").read_text()[-3000:]
        time.sleep(3)  # well inside their work
        run.send_signal(signal.SIGTERM)
        code = run.wait(timeout=120)
        assert code != 0
        gone, alive = psutil.wait_procs(children, timeout=60)
        assert not alive, [c.cmdline() for c in alive]
        out = (root / "run.log").read_text()
        assert "interrupted: stopped" in out, out[-3000:]
        assert leftovers(root) == []
        # The stopped stages say so in their logs (the CLI's SIGTERM handler ran: temp dir removed, run KILLED).
        logs = "".join(p.read_text(errors="replace") for p in (root / ".bertpipe" / "logs").glob("*.log"))
        assert "error: terminated (SIGTERM); nothing half-written was kept" in logs, logs[-3000:]
    finally:
        if run.poll() is None:
            stop(run)
