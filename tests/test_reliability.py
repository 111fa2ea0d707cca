"""Faults a user meets on a real project: the MLflow sqlite store held locked by another
process during register, a finetune killed half-way, the work dir filling up mid-stage. Real signals, real sqlite
locks, a real tmpfs. A `bertpipe` process of its own where the process boundary is the claim: the register that waits
on another process's lock, the finetune that is SIGKILLed. The splits, the uninterrupted reference, the rerun after
the kill and the finetune runs on the filling disk are commands whose output, exit status and files are the claim:
they run in this process (``e2e_project.invoke``). (The same finetune in two processes gives the same bits:
tests/test_finetune_determinism.py. Two `bertpipe run` at once in one project, each stage built by one of them:
tests/test_pipeline_e2e.py, on the whole chain.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e_project import env_for, invoke
from tests.test_credentials import project
from tests.test_kill_recovery import watch

pytestmark = pytest.mark.slow


def bertpipe(root: Path, *argv: str) -> subprocess.CompletedProcess:
    """`bertpipe *argv` in ``root``, in this process (``e2e_project.invoke``), with no Prefect server configured."""
    return invoke(list(argv), root, env_for(root, prefect="ephemeral"))


LOCK_HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()  # hold it until told
con.execute("COMMIT")
"""


def register_project(root: Path, tok: Path) -> None:
    from tests.test_kill_recovery import fake_finetune

    project(root, tok, None)
    fake_finetune(root, tok)
    (root / "work" / "pretrain").mkdir(parents=True, exist_ok=True)


def test_register_waits_for_an_mlflow_store_another_process_holds_locked(tmp_path, zh_tokenizer_dir):
    """Before: pysqlite gave up after 5 s and register died with an `OperationalError: database is locked`
    traceback. Now it says it is waiting, waits, and registers once the lock is gone."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client

    root = tmp_path / "proj"
    register_project(root, zh_tokenizer_dir)
    client(load_config(root / "params.yaml")).search_experiments()  # the store exists, with its tables
    db = root / ".bertpipe" / "mlflow.db"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    proc, lines, waiting, t = watch(["bertpipe", "register"], root, "is locked by another process; waiting")
    try:
        deadline = time.time() + 300
        while not waiting.wait(0.2) and proc.poll() is None and time.time() < deadline:
            pass
        time.sleep(8)  # longer than sqlite's own 5 s default: only a real wait survives this
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(30)
    rc = proc.wait(600)
    t.join(30)
    err = "".join(lines)
    assert waiting.is_set(), f"no 'waiting' message (rc {rc}):\n{err[-3000:]}"
    assert rc == 0 and "Traceback" not in err, err[-4000:]
    c = client(load_config(root / "params.yaml"))
    assert [str(v.version) for v in c.search_model_versions("name='bertpipe-sentiment'")] == ["1"]


# ---------------------------------------------------------------- a finetune: killed, run twice at once, disk full

FT = "finetune/long/base"


def finetune_project(root: Path, tok: Path, enc: Path) -> Path:
    from tests import synthetic as S
    from tests.test_finetune_determinism import _long_rows

    root.mkdir(parents=True, exist_ok=True)
    S.write_jsonl(root / "long.jsonl", _long_rows(160, seed=3))
    (root / "corpus.txt").write_text("第一条 为了保护公民的合法权益，制定本法。\n", encoding="utf-8")  # a source the graph can see
    (root / "params.yaml").write_text(f"""
paths: {{work: work, state: .bertpipe}}
model: {{base: {enc}, tokenizer: {tok}}}
prepare: {{general: {{enabled: false}}, domain: {{sources: [{{path: corpus.txt, format: txt, name: t}}]}}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 2, batch_size: 16, max_seq_len: 64, seeds: [1, 2], precision: fp32, num_threads: 1}}
  search: {{trials: 0}}
  tasks:
    long: {{type: classification, format: jsonl, train: long.jsonl}}
flow: {{max_parallel: 1}}
""", encoding="utf-8")
    return root


def result(root: Path) -> dict:
    import hashlib

    out = root / "work" / "finetune" / "long" / "base"
    m = json.loads((out / "metrics.json").read_text())
    return {"per_seed": {s: {k: r[k] for k in ("dev", "test", "steps")} for s, r in m["per_seed"].items()},
            "weights": hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest(),
            "fingerprint": json.loads((out / "manifest.json").read_text())["fingerprint"]}


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "work").rglob("*") if ".tmp-" in p.name)


def no_running_runs(root: Path) -> list[str]:
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client, experiment_id

    cfg = load_config(root / "params.yaml")
    c = client(cfg)
    return [r.info.run_name for r in c.search_runs([experiment_id(cfg, c)],
                                                   filter_string="attributes.status = 'RUNNING'")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, zh_tokenizer_dir):
    """An uninterrupted `bertpipe splits` + `bertpipe finetune`."""
    from tests.synthetic import tiny_encoder

    base = tmp_path_factory.mktemp("reliability")
    enc = tiny_encoder(base / "enc", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    root = finetune_project(base / "whole", zh_tokenizer_dir, enc)
    r = bertpipe(root, "splits")
    assert r.returncode == 0, r.stderr[-3000:]
    r = bertpipe(root, "finetune", "--task", "long")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"[{FT}] done in" in r.stderr, r.stderr[-3000:]
    return {"base": base, "enc": enc, "result": result(root)}


def test_finetune_killed_half_way_reruns_to_the_uninterrupted_result(reference, zh_tokenizer_dir):
    root = finetune_project(reference["base"] / "killed", zh_tokenizer_dir, reference["enc"])
    r = bertpipe(root, "splits")
    assert r.returncode == 0, r.stderr[-3000:]
    # Half-way, by progress rather than by the clock: the first of the two seeds is trained, scored and saved, the
    # second is training (a sleep of half the reference's build time missed when this run was faster than it).
    proc, lines, half_way, t = watch(["bertpipe", "finetune", "--task", "long"], root, "long/base seed 1: dev")
    assert half_way.wait(600), "".join(lines)[-3000:]
    assert proc.poll() is None, "finished before the kill: " + "".join(lines)[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)
    t.join(30)
    assert not (root / "work" / "finetune" / "long" / "base" / "metrics.json").exists()

    r = bertpipe(root, "finetune", "--task", "long")
    assert r.returncode == 0, r.stderr[-3000:]
    assert result(root) == reference["result"], "the rerun after a SIGKILL differs from the uninterrupted run"
    assert leftovers(root) == [] and no_running_runs(root) == []


def test_work_dir_filling_up_mid_finetune_is_one_line_then_a_rerun_completes(reference, zh_tokenizer_dir):
    """work/ on a tmpfs with room for the task splits and training, not for the saved model: ENOSPC mid-stage is
    one error line, the temp dir is gone, work/splits is untouched; with room again the rerun equals a clean run."""
    import hashlib

    root = finetune_project(reference["base"] / "full", zh_tokenizer_dir, reference["enc"])
    work = root / "work"
    work.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(work)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        r = bertpipe(root, "splits")
        assert r.returncode == 0, r.stderr[-3000:]
        tasks = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in (work / "splits").rglob("*")
                 if p.is_file()}
        r = bertpipe(root, "finetune", "--task", "long")
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-4000:]
        assert "no space left on device" in errors[0].lower(), errors
        assert leftovers(root) == [] and not (work / "finetune" / "long" / "base").exists()
        assert {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in (work / "splits").rglob("*")
                if p.is_file()} == tasks
        subprocess.run(["mount", "-o", "remount,size=64m", str(work)], check=True)
        r = bertpipe(root, "finetune", "--task", "long")
        assert r.returncode == 0, r.stderr[-3000:]
        assert result(root) == reference["result"] and no_running_runs(root) == []
    finally:
        subprocess.run(["umount", "-l", str(work)], check=False)
