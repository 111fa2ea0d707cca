"""A SIGKILLed bertpipe command leaves no process behind: its pool workers (spawned, as the tokenizer pools are) and
multiprocessing's resource tracker go with it (``bertpipe.infra.lifeline``, started by the CLI's ``main``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bertpipe.infra import lifeline

PROGRAM = """
import multiprocessing as mp, os, sys, time
from concurrent.futures import ProcessPoolExecutor
from bertpipe.infra import lifeline

def pid(_):
    return os.getpid()

if __name__ == "__main__":
    lifeline.start()
    pool = ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
    sem = mp.get_context("spawn").Semaphore()  # starts the resource tracker, as a torch DataLoader or pool does
    print(" ".join(map(str, set(pool.map(pid, range(8))))), flush=True)
    time.sleep(600)
"""


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_sigkilled_command_takes_its_pool_workers_and_resource_tracker_with_it(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(Path(lifeline.__file__).parents[2])}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "prog.py")], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        workers = [int(p) for p in proc.stdout.readline().split()]
        assert workers, "the program printed no worker pids"
        me = psutil.Process(proc.pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the watcher's first walk has seen the whole tree
            tree = me.children(recursive=True)
            if len(tree) >= len(workers) + 2:
                break
            time.sleep(0.1)
        left = [p for p in tree if "lifeline" not in " ".join(p.cmdline())]
        assert {p.pid for p in left} >= set(workers) and len(left) >= len(workers) + 1, [p.cmdline() for p in tree]
        time.sleep(2 * lifeline.EVERY_S)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 30
        while _alive(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(tree), [p.cmdline() for p in _alive(tree)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for p in _alive(tree):  # what a failure left
            p.kill()


def test_watcher_ignores_the_group_signals_and_leaves_the_tree_of_a_live_command_alone(tmp_path):
    """Ctrl-C reaches the whole process group: the watcher stays (the command decides what its SIGINT means)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    watcher = subprocess.Popen([sys.executable, "-I", "-S", lifeline.__file__, str(os.getpid())])
    try:
        time.sleep(1.5)
        watcher.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert watcher.poll() is None and proc.poll() is None
    finally:
        watcher.kill()
        proc.kill()
        watcher.wait()
        proc.wait()
