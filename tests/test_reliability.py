"""Faults a user meets on a real project (issue 23, "not yet tried"): the MLflow sqlite store held locked by another
process during register, two `bertpipe run` at once in one project, a finetune killed half-way, the work dir
filling up mid-stage. Real `bertpipe` processes, real signals, real sqlite locks, a real tmpfs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e_project import env_for
from tests.test_credentials import bertpipe, project

pytestmark = pytest.mark.slow

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
    from bertpipe.config import load_config
    from bertpipe.tracking import client

    root = tmp_path / "proj"
    register_project(root, zh_tokenizer_dir)
    client(load_config(root / "params.yaml")).search_experiments()  # the store exists, with its tables
    db = root / ".bertpipe" / "mlflow.db"
    holder = subprocess.Popen([sys.executable, "-c", LOCK_HOLDER, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    proc = subprocess.Popen(["bertpipe", "register"], cwd=root, env=env_for(root), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if "is locked by another process; waiting" in line:
                waiting.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
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
