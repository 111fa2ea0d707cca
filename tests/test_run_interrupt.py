"""SIGTERM to `bertpipe run` while stages run in their own processes: the run ends (non-zero) within seconds, every
stage process it started is stopped rather than left to run to the end, and no temp dir is left under work/. SIGKILL:
nothing it started outlives it (bertpipe.infra.lifeline)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import psutil
import pytest
import yaml

from bertpipe.infra.lifeline import EVERY_S
from tests.e2e_project import build_chain, env_for, shared_prefect_api, stop
from tests.test_kill_recovery import leftovers, make_project

pytestmark = pytest.mark.slow


def _stage_children(proc: psutil.Process) -> list[psutil.Process]:
    out = []
    for c in proc.children(recursive=True):
        try:
            if c.cmdline()[1:3] == ["-m", "bertpipe"]:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def _project(root: Path, sample_raw: Path, zh_tokenizer_dir: Path) -> Path:
    """A project whose long pretrain runs beside the base encoder's finetune, each stage in its own process."""
    from tests.synthetic import keyword_classification, tiny_encoder, write_jsonl

    enc = tiny_encoder(root.parent / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    make_project(root, sample_raw, enc, zh_tokenizer_dir)
    write_jsonl(root / "sentiment.jsonl", keyword_classification(3000, seed=1))
    params = root / "params.yaml"
    p = yaml.safe_load(params.read_text())
    p["pretrain"].update(max_steps=5000, eval_every=1000, save_every=1000, compile="off")  # killed long before
    p["finetune"].update(encoders=["base", "adapted"], train={"epochs": 50, "max_seq_len": 32, "seeds": [42]})
    p["flow"] = {"max_parallel": 2}
    params.write_text(yaml.safe_dump(p, allow_unicode=True))
    return root


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory, sample_raw, zh_tokenizer_dir) -> Path:
    """The project with the stages above those two built in this process (``build_chain``), once for the module:
    a run of a copy finds them fresh and starts with the two (a stage process costs ~5-7 CPU-s of imports before its
    work; those stages are no part of what is interrupted)."""
    root = _project(tmp_path_factory.mktemp("prebuilt") / "p", sample_raw, zh_tokenizer_dir)
    build_chain(root, "vocab")  # and what it reads: splits, prepare, base, start
    return root


def _start_run(root: Path, until: Callable[[psutil.Process], bool] | None = None, prefect: str = "ephemeral"):
    """`bertpipe run` of the project at ``root`` (a temporary Prefect server, or ``prefect="shared"``: the test
    run's), returned once ``until(run)`` holds (default: both stage processes exist)."""
    log = open(root / "run.log", "w")
    # on the shared server the run is told from other tests' runs by its params file's absolute path
    where = ["--params", str(root / "params.yaml")] if prefect == "shared" else []
    run = subprocess.Popen(["bertpipe", "run", *where], cwd=root, env=env_for(root, prefect), stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    me = psutil.Process(run.pid)
    until = until or (lambda proc: len(_stage_children(proc)) >= 2)
    end = time.time() + 600
    while time.time() < end and not until(me) and run.poll() is None:
        time.sleep(0.5)
    return run, me


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
    started by then, ends with it (bertpipe.infra.lifeline; the same watcher ends a stage process's pools)."""
    root = _project(tmp_path / "p", sample_raw, zh_tokenizer_dir)
    run, me = _start_run(root, until=_prefect_server)
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


def test_sigterm_to_run_stops_its_stage_processes(tmp_path, prebuilt):
    root = shutil.copytree(prebuilt, tmp_path / "p", symlinks=True)
    run, me = _start_run(root, prefect="shared")
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


def test_a_flow_run_cancelled_through_the_api_starts_nothing_and_ends_killed(tmp_path, prebuilt):
    """CANCELLING set on the flow run through the Prefect API (what the UI's Cancel does) while the base encoder's
    finetune trains beside another stage: their processes are stopped, no stage starts after it (the stages below
    wait on them), `bertpipe run` ends non-zero, the flow run ends Cancelled, and its MLflow runs (the flow's, the
    finetune's) end KILLED, not FAILED."""
    import httpx

    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client

    finetune_log = tmp_path / "p" / ".bertpipe" / "logs" / "finetune__sentiment__base.log"

    def training(proc: psutil.Process) -> bool:  # pretraining and the finetune in their processes, its run open
        # (pretraining, not prepare before it: prepare's per-document workers take longer to stop than the run waits
        # on a loaded machine, and what is claimed here is a training stage stopped)
        lines = " ".join(_cmdlines(_stage_children(proc)))
        return (" pretrain" in lines and " finetune" in lines and finetune_log.is_file()
                and "building" in finetune_log.read_text())

    root = shutil.copytree(prebuilt, tmp_path / "p", symlinks=True)
    run, me = _start_run(root, until=training, prefect="shared")
    api = shared_prefect_api()
    try:
        before = set(_cmdlines(_stage_children(me)))
        assert len(before) >= 2, (root / "run.log").read_text()[-3000:]
        runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}},
                          timeout=30).json()
        fr = next(r for r in runs if r["parameters"].get("params") == str(root / "params.yaml"))  # this run's only
        r = httpx.post(f"{api}/flow_runs/{fr['id']}/set_state", timeout=30,
                       json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True})
        assert r.json()["status"] == "ACCEPT", r.text
        started = set()
        end = time.time() + 120
        while run.poll() is None and time.time() < end:
            started |= set(_cmdlines(_stage_children(me))) - before
            time.sleep(0.2)
        assert run.poll() is not None, "the run went on after its cancellation"
        out = (root / "run.log").read_text()
        assert not started, (started, out[-3000:])
        assert run.returncode != 0, out[-3000:]
        assert httpx.get(f"{api}/flow_runs/{fr['id']}", timeout=30).json()["state"]["type"] == "CANCELLED"
        cfg = load_config(root / "params.yaml")
        status = {r.data.tags.get("mlflow.runName"): r.info.status
                  for r in client(cfg).search_runs([c.experiment_id for c in client(cfg).search_experiments()])}
        assert status.get("domain_adaptation") == status.get("finetune/sentiment/base") == "KILLED", status
        assert "FAILED" not in status.values() and "RUNNING" not in status.values(), status
        assert leftovers(root) == []
    finally:
        if run.poll() is None:
            stop(run)
