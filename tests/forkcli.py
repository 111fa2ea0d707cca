"""The `bertpipe` command run in forks of one warm interpreter, for tests that run it many times over.

A fresh `bertpipe` process spends most of a bad-input case importing: ~0.3 CPU-s for the CLI, ~3 more for a case
that reaches a stage (torch, transformers, MLflow), against a few milliseconds of the work the case is about
(measured: test_bad_inputs' 61 cases, 72 CPU-s). Here one server process imports all of that once and forks a child
per command; the child takes the command's cwd, environment and argv, writes its stdout and stderr to files, and
runs ``bertpipe.cli.main`` (the console script's entry point) as the script would: an uncaught exception prints its
traceback and exits 1, ``sys.exit`` codes pass through, atexit handlers run. What the child does from ``main`` on is
the command's own code, unchanged.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

SERVER = r"""
import atexit, json, os, sys, traceback
import bertpipe.cli
import bertpipe.stage, bertpipe.tracking, mlflow.tracking, torch, transformers  # what a stage's command imports
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.setsid()  # its own session, as subprocess.run gives it: signals to the group reach it alone
            os.chdir(req["cwd"])
            os.environ.clear()
            os.environ.update(req["env"])
            for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            sys.stdin = open(os.devnull)
            sys.argv = ["bertpipe", *req["argv"]]
            try:
                bertpipe.cli.main()
                rc = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    rc = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            os._exit(rc)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)
"""


class ForkCLI:
    """``run(argv, cwd, env)`` -> a CompletedProcess of `bertpipe *argv`, like ``subprocess.run(..., text=True,
    capture_output=True)``. One command at a time; ``close()`` ends the server."""

    def __init__(self, env: dict):
        self._server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True)
        self._dir = Path(tempfile.mkdtemp(prefix="bertpipe-forkcli-"))
        self._lock = threading.Lock()

    def run(self, argv: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        out, err = self._dir / "stdout", self._dir / "stderr"
        req = {"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env, "stdout": str(out), "stderr": str(err)}
        with self._lock:
            self._server.stdin.write(json.dumps(req) + "\n")
            self._server.stdin.flush()
            line = self._server.stdout.readline()
            if not line:
                raise RuntimeError(f"the fork server exited ({self._server.poll()})")
            rc = json.loads(line)["rc"]
            return subprocess.CompletedProcess(["bertpipe", *argv], rc, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait(timeout=60)
        for f in self._dir.iterdir():
            f.unlink()
        self._dir.rmdir()
