"""`bertpipe ...` and `python -c ...` run in forks of one warm interpreter: the test process's commands
(``e2e_project.run``, the bad-input catalogue, the kill tests).

A fresh `bertpipe` process spends most of a bad-input case importing: ~0.3 CPU-s for the CLI, ~3 more for a case
that reaches a stage (torch, transformers, MLflow), against a few milliseconds of the work the case is about
(measured: test_bad_inputs' 61 cases, 72 CPU-s); every flow script and `bertpipe run` pays ~8 CPU-s of the same.
Here one server process per test process imports them once and forks a child per command; the child takes the
command's cwd, environment and argv, its own session, ``sys.path[0]`` as the interpreter would set it, writes its
stdout and stderr to files, and runs ``bertpipe.cli.main`` (the console script's entry point) or the ``-c`` code as
the interpreter would: an uncaught exception prints its traceback and exits 1, ``sys.exit`` codes pass through,
atexit handlers run. Prefect is not imported by the server (it reads its settings from the environment at import,
and each command has its own), nor is anything a command imports from its own directory. What the child runs is
the command's own code, unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SERVER = r"""
import atexit, json, os, sys, time, traceback
import bertpipe.cli
import bertpipe.stage, bertpipe.tracking, mlflow.tracking, torch, transformers  # what a stage's command imports
# Not Prefect: it reads its settings (PREFECT_HOME, PREFECT_API_URL) from the environment when imported, and each
# command has its own.
assert "prefect" not in sys.modules
BIN = os.path.dirname(sys.executable)  # where the `bertpipe` console script lives: its sys.path[0]


def child(req):
    rc = 1
    try:
        os.setsid()  # its own session and process group, as subprocess's start_new_session gives it
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        sys.stdin = open(os.devnull)
        # sys.path[0] as the interpreter sets it: the script's directory for `bertpipe`, the cwd for `python -c`
        if req.get("code") is None:
            sys.argv, sys.path[0] = ["bertpipe", *req["argv"]], BIN
        else:
            sys.argv, sys.path[0] = ["-c", *req["argv"]], ""
        try:
            if req.get("code") is None:
                bertpipe.cli.main()
            else:
                exec(compile(req["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
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


def reap(pid, timeout):
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, 0 if end is None else os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= end:
            return None
        time.sleep(0.02)


for line in sys.stdin:
    req = json.loads(line)
    if req["op"] == "start":
        pid = os.fork()
        if pid == 0:
            child(req)
        reply = {"pid": pid}
    else:  # "wait": up to timeout seconds (None: until it exits; 0: a poll)
        reply = {"rc": reap(req["pid"], req["timeout"])}
    print(json.dumps(reply), flush=True)
"""


class Forked:
    """A command started by ``ForkCLI.start``: the parts of ``subprocess.Popen`` the tests use. Its stdout and
    stderr are files (``stdout_path``, ``stderr_path``); ``stderr_lines()`` follows the latter as it grows."""

    def __init__(self, cli: "ForkCLI", pid: int, argv: list[str], stdout: Path, stderr: Path):
        self._cli, self.pid, self.args, self.stdout_path, self.stderr_path = cli, pid, argv, stdout, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._cli._ask({"op": "wait", "pid": self.pid, "timeout": 0})["rc"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._cli._ask({"op": "wait", "pid": self.pid, "timeout": timeout})["rc"]
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def stderr_lines(self):
        """The stderr lines as they are written, until the command has been waited for and all are read."""
        with open(self.stderr_path, "rb") as f:
            buf = b""
            while True:
                done = self.returncode is not None
                chunk = f.read()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for ln in lines:
                    yield ln.decode("utf-8", errors="replace") + "\n"
                if done and not chunk:
                    if buf:
                        yield buf.decode("utf-8", errors="replace")
                    return
                if not chunk:
                    time.sleep(0.05)

    def output(self) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(["bertpipe", *self.args], self.returncode,
                                           self.stdout_path.read_text(errors="replace"),
                                           self.stderr_path.read_text(errors="replace"))


class ForkCLI:
    """``run(argv, cwd, env)`` -> a CompletedProcess of `bertpipe *argv`, like ``subprocess.run(..., text=True,
    capture_output=True)``; ``start(...)`` -> a running ``Forked``. ``env``: the server's environment (what is read
    at import time: the offline and quiet settings); each command gets its own. ``close()`` ends the server."""

    def __init__(self, env: dict):
        self._server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, text=True)
        self._dir = Path(tempfile.mkdtemp(prefix="bertpipe-forkcli-"))
        self._lock = threading.Lock()
        self._n = 0

    def _ask(self, req: dict) -> dict:
        with self._lock:
            self._server.stdin.write(json.dumps(req) + "\n")
            self._server.stdin.flush()
            line = self._server.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server exited ({self._server.poll()})")
        return json.loads(line)

    def start(self, argv: list[str], cwd: Path, env: dict, code: str | None = None) -> Forked:
        """`bertpipe *argv`, or with ``code``: `python -c code *argv`."""
        self._n += 1
        out, err = self._dir / f"{self._n}.out", self._dir / f"{self._n}.err"
        argv = [str(a) for a in argv]
        out.touch()
        err.touch()  # there to be followed before the child opens it
        pid = self._ask({"op": "start", "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                         "stderr": str(err), "code": code})["pid"]
        return Forked(self, pid, argv, out, err)

    def run(self, argv: list[str], cwd: Path, env: dict, code: str | None = None,
            timeout: float | None = 900) -> subprocess.CompletedProcess:
        """Start, wait; past ``timeout`` seconds its whole session is killed (what it started included) and
        ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` would."""
        proc = self.start(argv, cwd, env, code=code)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return proc.output()

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait(timeout=60)
        shutil.rmtree(self._dir, ignore_errors=True)


_shared: list[ForkCLI] = []


def shared_cli() -> ForkCLI:
    """This test process's fork server, started on first use and ended when the process exits."""
    if not _shared:
        import atexit

        _shared.append(ForkCLI(dict(os.environ)))
        atexit.register(_shared[0].close)
    return _shared[0]
