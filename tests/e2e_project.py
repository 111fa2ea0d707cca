"""Small real projects in temp dirs for the front-door tests: real laws.db rows, real tokenizer, tiny models."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from bertpipe.prepare.params import LAWS_QUERY

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


def write_project(root: Path, raw: Path, extra: dict | None = None, where: str = FEW_LAWS) -> Path:
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
    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    return root / "params.yaml"


def env_for(root: Path) -> dict:
    (root / ".bertpipe" / "prefect").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "BERTPIPE_ROOT": str(root),
                "PREFECT_HOME": str(root / ".bertpipe" / "prefect"), "PYTHONUNBUFFERED": "1",
                "DVC_SITE_CACHE_DIR": str(root / ".bertpipe" / "dvc-site-cache")})
    env.pop("PREFECT_API_URL", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run(cmd: list[str], root: Path, timeout: int = 900, check: bool = True) -> subprocess.CompletedProcess:
    """``cmd`` in its own session; on a timeout the whole session is killed, so what it started (e.g. the flow's
    temporary Prefect server) does not outlive the test."""
    with subprocess.Popen(cmd, cwd=root, env=env_for(root), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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


@contextlib.contextmanager
def prefect_server(root: Path, env: dict):
    """A real Prefect server on a free 127.0.0.1 port for the project at ``root``; sets ``env["PREFECT_API_URL"]``
    and stops the server on exit (stop any `bertpipe schedule` first: it would hang on its API calls)."""
    port = free_port()
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port)], cwd=root, env=env, stdout=open(root / "server.log", "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)

    def healthy():
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2).status == 200
        except OSError:
            return False

    try:
        try:
            wait_for(healthy, 180, "the Prefect server")
        except AssertionError:
            raise AssertionError((root / "server.log").read_text()[-3000:]) from None
        yield server
    finally:
        stop(server)
