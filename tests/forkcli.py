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
import atexit, json, os, runpy, selectors, socket, sys, time, traceback
import bertpipe.cli
import bertpipe.stage, bertpipe.tracking, mlflow.tracking, torch, transformers  # what a stage's command imports
# What the stages load lazily, the first time in each process: the BERT classes (transformers' modeling import,
# ~4 CPU-s beyond torch) and an MLflow sqlite store (SQLAlchemy's mappers and MLflow's schema check, ~1.2 CPU-s the
# first time in a process, 0.06 after), warmed on a throwaway store. Measured: docs/testing.md.
import tempfile
from transformers import (BertForMaskedLM, BertForPreTraining, BertForQuestionAnswering,  # noqa: F401
                          BertForSequenceClassification, BertForTokenClassification, BertTokenizerFast)
import logging
import jieba, onnxruntime, sklearn.linear_model, sklearn.feature_extraction.text  # noqa: E401 (vocab, export, evaluate)
quiet = {name: logging.getLogger(name).level for name in ("mlflow", "jieba")}  # not their start-up lines here
for name in quiet:
    logging.getLogger(name).setLevel(logging.WARNING)
with tempfile.TemporaryDirectory() as d:
    uri = f"sqlite:///{d}/warm.db"
    mlflow.tracking.MlflowClient(uri, uri).search_registered_models()
    mlflow.tracking.MlflowClient(uri, uri).search_experiments()
jieba.initialize()
for name, level in quiet.items():  # the children log as a new process would
    logging.getLogger(name).setLevel(level)
# Not Prefect: it reads its settings (PREFECT_HOME, PREFECT_API_URL) from the environment when imported, and each
# command has its own.
assert "prefect" not in sys.modules
BIN = os.path.dirname(sys.executable)  # where the `bertpipe` console script lives: its sys.path[0]
sel = selectors.DefaultSelector()


def child(req, fds=None):
    rc = 1
    try:
        os.setsid()  # its own session and process group, as subprocess's start_new_session gives it
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        if fds is None:  # a command of the test process: its output to files
            fds = [os.open(req[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for name in ("stdout", "stderr")]
        else:  # a shim's: its own stdout and stderr
            fds = fds[1:]
        for fd, src in zip((1, 2), fds):
            os.dup2(src, fd)
        for conn in [listener, *shims.values()]:  # the server's socket, other shims' connections
            if conn is not None:
                conn.close()
        sys.stdin = open(os.devnull)
        # sys.path[0] as the interpreter sets it: the script's directory for `bertpipe`, the cwd for `python -c` and
        # `python -m` (run_module then puts the module's file in sys.argv[0])
        if req.get("module"):
            sys.argv, sys.path[0] = ["-m", *req["argv"]], os.getcwd()
        elif req.get("code") is None:
            sys.argv, sys.path[0] = ["bertpipe", *req["argv"]], BIN
        else:
            sys.argv, sys.path[0] = ["-c", *req["argv"]], ""
        try:
            if req.get("module"):
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            elif req.get("code") is None:
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


def exited(pid):
    done, status = os.waitpid(pid, os.WNOHANG)
    return os.waitstatus_to_exitcode(status) if done else None


def reply(obj):
    print(json.dumps(obj), flush=True)


def accept(listener):
    # A shim's request: an 8-byte length, its JSON, and its stdin, stdout and stderr as passed descriptors.
    conn, _ = listener.accept()
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while len(data) < 8 or len(data) < 8 + int.from_bytes(data[:8], "big"):
        more = conn.recv(1 << 20)
        if not more:
            raise EOFError("a shim hung up mid-request")
        data += more
    pid = os.fork()
    if pid == 0:
        child(json.loads(data[8:]), fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    shims[pid] = conn
    sel.register(conn, selectors.EVENT_READ, ("shim", pid))


# One loop, never blocking on a child: the test process's requests on stdin (one at a time: it waits for each
# reply), the shims' connections, and the children they wait for.
listener, shims = None, {}  # shims: a shim's command's pid -> its connection
sel.register(0, selectors.EVENT_READ, ("stdin", None))
buf, waiting = b"", None  # waiting: (pid, deadline) of the test process's "wait"
while True:
    for key, _ in sel.select(0.02 if (waiting or shims) else None):
        kind, pid = key.data
        if kind == "stdin":
            data = os.read(0, 1 << 16)
            if not data:
                sys.exit(0)
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                req = json.loads(line)
                if req["op"] == "start":
                    pid = os.fork()
                    if pid == 0:
                        child(req)
                    reply({"pid": pid})
                elif req["op"] == "listen":  # the socket the shims connect to
                    listener = socket.socket(socket.AF_UNIX)
                    listener.bind(req["path"])
                    listener.listen(64)
                    sel.register(listener, selectors.EVENT_READ, ("listener", None))
                    reply({})
                else:  # "wait": up to timeout seconds (None: until it exits; 0: a poll)
                    t = req["timeout"]
                    waiting = (req["pid"], None if t is None else time.monotonic() + t)
        elif kind == "listener":
            try:
                accept(listener)
            except (OSError, EOFError, ValueError):  # a shim that died mid-request: it waits for nothing
                traceback.print_exc()
        else:  # a shim's connection turns readable only when the shim is gone (killed): its command goes too
            sel.unregister(key.fileobj)
            try:
                os.killpg(pid, 9)
            except OSError:
                pass
    for pid, conn in list(shims.items()):
        rc = exited(pid)
        if rc is not None:
            try:
                conn.sendall(f"{rc}\n".encode())
            except OSError:  # the shim is gone
                pass
            if conn.fileno() in sel.get_map():
                sel.unregister(conn)
            conn.close()
            del shims[pid]
    if waiting:
        rc = exited(waiting[0])
        if rc is not None or (waiting[1] is not None and time.monotonic() >= waiting[1]):
            reply({"rc": rc})
            waiting = None
"""

# `bertpipe` for commands that the tests do not start themselves (DVC's stage commands): it hands its argv, cwd,
# environment and standard streams to the fork server over a Unix socket, passes on the signals it gets, and exits
# as its command did (by the same signal, if one ended it). No site-packages (-S): it starts in milliseconds.
SHIM = r"""#!{python} -S
import json, os, signal, socket, sys

s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["BERTPIPE_TEST_FORK_SOCKET"])
body = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
fds = []
for fd in (0, 1, 2):
    try:
        os.fstat(fd)
        fds.append(fd)
    except OSError:  # not open in this process: the command gets /dev/null there
        fds.append(os.open(os.devnull, os.O_RDWR))
socket.send_fds(s, [len(body).to_bytes(8, "big") + body], fds)
f = s.makefile("r")
pid = int(f.readline())
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, lambda n, _frame: os.killpg(pid, n))
line = f.readline()
rc = int(line) if line.strip() else 1
if rc < 0:
    signal.signal(-rc, signal.SIG_DFL)
    os.kill(os.getpid(), -rc)
sys.exit(rc)
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
    capture_output=True)``; ``start(...)`` -> a running ``Forked``; ``shim_env(env)``: an environment whose
    `bertpipe` forks too. ``env``: the server's environment (what is read at import time: the offline and quiet
    settings); each command gets its own. ``close()`` ends the server."""

    def __init__(self, env: dict, cwd: Path | None = None):
        # (``cwd``: the server's, first on its sys.path as for any `python -c`: where its `import bertpipe` looks)
        self._server = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, cwd=cwd, text=True)
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

    def start(self, argv: list[str], cwd: Path, env: dict, code: str | None = None,
              module: str | None = None) -> Forked:
        """`bertpipe *argv`; with ``code``: `python -c code *argv`; with ``module``: `python -m module *argv`."""
        self._n += 1
        out, err = self._dir / f"{self._n}.out", self._dir / f"{self._n}.err"
        argv = [str(a) for a in argv]
        out.touch()
        err.touch()  # there to be followed before the child opens it
        pid = self._ask({"op": "start", "argv": argv, "cwd": str(cwd), "env": env, "stdout": str(out),
                         "stderr": str(err), "code": code, "module": module})["pid"]
        return Forked(self, pid, argv, out, err)

    def run(self, argv: list[str], cwd: Path, env: dict, code: str | None = None, module: str | None = None,
            timeout: float | None = 900) -> subprocess.CompletedProcess:
        """Start, wait; past ``timeout`` seconds its whole session is killed (what it started included) and
        ``subprocess.TimeoutExpired`` raised, as ``subprocess.run`` would."""
        proc = self.start(argv, cwd, env, code=code, module=module)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        return proc.output()

    def shim_env(self, env: dict) -> dict:
        """``env`` with a `bertpipe` first on PATH that runs each command in a fork of this server (``SHIM``): for
        commands another program starts, e.g. the stage commands of `dvc repro` and `dvc exp run`."""
        bindir, sock = self._dir / "shim", self._dir / "fork.sock"
        if not bindir.exists():
            self._ask({"op": "listen", "path": str(sock)})
            bindir.mkdir()
            (bindir / "bertpipe").write_text(SHIM.format(python=sys.executable))
            (bindir / "bertpipe").chmod(0o755)
        return {**env, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "BERTPIPE_TEST_FORK_SOCKET": str(sock)}

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
