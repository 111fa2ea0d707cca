"""The processes a `bertpipe` command starts do not outlive it, however it ends (SIGKILL and the OOM killer included).

``start`` runs one small watcher process beside the command. The watcher walks the command's process tree every
``EVERY_S`` (the stage processes of a flow, Prefect's temporary server, LitServe's API server and inference worker,
tokenizer pools, multiprocessing's resource tracker: children, theirs, and so on) and, once the command is gone,
sends SIGTERM to every process it last saw (a stage process unwinds as on a user's SIGTERM: temp dir removed, MLflow
run closed), then SIGKILL to those still alive after ``GRACE_S``. A process is known by pid and start time, so a pid
reused meanwhile is never signalled.

Why a watcher rather than PR_SET_PDEATHSIG in each child: most of these children are started by libraries (Prefect,
LitServe, multiprocessing) that take no pre-exec hook, and PDEATHSIG fires when the creating *thread* ends (in a flow,
a task-runner thread), not the process. The watcher is a separate interpreter started with ``-I -S`` running this
file alone (standard library only), so it holds none of the command's memory, files or locks; it ignores SIGINT,
SIGTERM and SIGHUP (a Ctrl-C or a SIGTERM to the process group is the command's to handle, and the watcher must
still be there if the command dies of it) and exits within ``EVERY_S`` of the command.

Why /proc rather than psutil: ``psutil.Process.children`` reads the parent of every process on the machine at each
walk, where this walk reads the tree's own ``children`` files (an idle watcher over a tree of 10, for 30 s: 0.05 s of
CPU with 93 processes on the machine or 509; psutil's 0.20 s and 0.67 s), and psutil would need site-packages in the
watcher (+4 MiB resident).
"""

from __future__ import annotations

import os
import signal
import sys
import time

EVERY_S = 0.5
GRACE_S = 10.0
_watcher = None  # the Popen of this process's watcher (kept so it is not reported as an unwaited child)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None when it is gone (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def _children(pid: int) -> list[int]:
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return out


def descendants(pid: int, skip: int = -1) -> dict[int, str]:
    """{pid: start time} of every process below ``pid`` (not ``skip`` nor what is below it)."""
    seen: dict[int, str] = {}
    todo = [c for c in _children(pid) if c != skip]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        st = _start_time(p)
        if st is not None:
            seen[p] = st
            todo += _children(p)
    return seen


def _signal_all(procs: dict[int, str], sig: int) -> dict[int, str]:
    """Send ``sig`` to each process still the one that was seen; the ones that were, still alive."""
    alive = {}
    for pid, st in procs.items():
        if _start_time(pid) == st:
            try:
                os.kill(pid, sig)
                alive[pid] = st
            except OSError:
                pass
    return alive


def reap(procs: dict[int, str], grace_s: float = GRACE_S) -> None:
    """SIGTERM ``procs``; SIGKILL those still alive after ``grace_s``."""
    alive = _signal_all(procs, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while alive and time.monotonic() < end:
        time.sleep(0.1)
        alive = {p: st for p, st in alive.items() if _start_time(p) == st}
    _signal_all(alive, signal.SIGKILL)


def watch(parent: int, every_s: float = EVERY_S, grace_s: float = GRACE_S) -> None:
    """Run in the watcher: follow ``parent``'s tree until ``parent`` is gone, then end what it left."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    me, last = os.getpid(), {}
    while os.getppid() == parent:
        last = descendants(parent, skip=me)
        time.sleep(every_s)
    reap(last, grace_s)


def start() -> None:
    """Start this process's watcher (Linux; elsewhere nothing is done)."""
    global _watcher
    if _watcher is not None or not sys.platform.startswith("linux") or not os.path.isdir("/proc/self/task"):
        return
    import subprocess

    _watcher = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid())],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
