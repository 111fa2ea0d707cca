"""Credentials in the tracking URI (``http://user:password@host``, in params.yaml or $MLFLOW_TRACKING_URI)
reach no output: not stdout/stderr of `bertpipe run` / `register` / `config`, not the one error line when the server
is down, not the files under the project (manifests, registry.json, reports, Prefect's database and logs), not the
MLflow server's own store and artifacts. A real `mlflow server` on 127.0.0.1 (it ignores the basic-auth header, so
the URI with credentials works), real stages, then a byte grep for the password everywhere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.corpus import tiny_sentiment_rows
from tests.e2e_project import env_for, free_port, invoke, run

pytestmark = pytest.mark.slow

SECRET = "S3cr3t-h8-pw"


@pytest.fixture
def mlflow_server(tmp_path):
    """(port, dir holding the server's sqlite store and artifacts) of a throwaway MLflow server."""
    port, home = free_port(), tmp_path / "server"
    home.mkdir()
    log = home / "server.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{home / 'mlflow.db'}",
         "--artifacts-destination", (home / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "mlflow server did not come up:\n" + log.read_text()[-3000:]
            time.sleep(1)
        yield port, home
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)


def project(root: Path, tok: Path, uri: str | None) -> None:
    params = {
        "paths": {"work": "work", "state": ".bertpipe"},
        "model": {"base": "scratch", "tokenizer": str(tok)},
        # the flow's graph reads every stage's inputs, so prepare needs a source that exists (it does not run)
        "prepare": {"general": {"enabled": False},
                    "domain": {"sources": [{"path": "corpus.txt", "format": "txt", "name": "t"}]}},
        "finetune": {"encoders": ["adapted"], "tasks": {"sentiment": {
            "type": "classification", "format": "jsonl", "train": "sentiment.jsonl"}}},
        "register": {"register_encoder": False, "floor": "none"},
        "distill": {"enabled": False}, "export": {"enabled": False},
        "flow": {"max_parallel": 1},
        **({"tracking": {"uri": uri}} if uri else {}),
    }
    root.mkdir(parents=True, exist_ok=True)
    (root / "corpus.txt").write_text("第一条 为了保护公民的合法权益，制定本法。\n", encoding="utf-8")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    rows = tiny_sentiment_rows()
    (root / "sentiment.jsonl").write_text("".join(json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n"
                                                  for t, lab in rows), encoding="utf-8")


def command_env(root: Path, env_uri: str | None = None, **extra_env) -> dict:
    env = env_for(root, prefect="ephemeral")  # the flow's Prefect database under the project, where it is searched
    env.pop("MLFLOW_TRACKING_URI", None)
    if env_uri:
        env["MLFLOW_TRACKING_URI"] = env_uri
    env.update(extra_env)
    return env


def bertpipe(root: Path, *argv: str, env_uri: str | None = None, **extra_env) -> subprocess.CompletedProcess:
    """A process of its own: everything it and the stages it starts print, Prefect's temporary server included."""
    return run(["bertpipe", *argv], root, check=False, env=command_env(root, env_uri, **extra_env))


def bertpipe_here(capfd, root: Path, *argv: str, env_uri: str | None = None,
                  **extra_env) -> subprocess.CompletedProcess:
    """A command that starts no process (`config`, one stage), run in this process: what it prints through the CLI
    plus whatever reached this process's file descriptors 1 and 2 meanwhile (MLflow's loggers, warnings)."""
    capfd.readouterr()
    res = invoke(list(argv), root, command_env(root, env_uri, **extra_env))
    fd = capfd.readouterr()
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout + fd.out, res.stderr + fd.err)


def files_holding(secret: bytes, *roots: Path, skip: tuple[Path, ...] = ()) -> list[str]:
    hits = []
    for r in roots:
        for p in r.rglob("*"):
            if p.is_file() and p not in skip and secret in p.read_bytes():
                hits.append(str(p))
    return hits


def test_credentials_in_the_tracking_uri_are_never_written(tmp_path, mlflow_server, zh_tokenizer_dir, capfd):
    from tests.test_kill_recovery import fake_finetune

    port, server_home = mlflow_server
    uri = f"http://alice:{SECRET}@127.0.0.1:{port}"
    root = tmp_path / "proj"
    project(root, zh_tokenizer_dir, None)
    fake_finetune(root, zh_tokenizer_dir)  # register's inputs (finetune/evaluate are not what is tested)
    (root / "work" / "pretrain").mkdir(parents=True, exist_ok=True)
    shown = []

    # $MLFLOW_TRACKING_URI: the flow (Prefect server, its logs, the run summary) and the register stage
    r = bertpipe(root, "run", "--until", "splits", env_uri=uri)
    assert r.returncode == 0, r.stderr[-3000:]
    browse = [ln for ln in r.stdout.splitlines() if ln.startswith("browse:")]
    assert browse and f"http://127.0.0.1:{port}" in browse[0], r.stdout[-2000:]
    shown.append(r)
    r = bertpipe_here(capfd, root, "register", env_uri=uri)
    assert r.returncode == 0, r.stderr[-3000:]
    shown.append(r)

    # tracking.uri in params.yaml: the resolved config and a forced register
    project(root, zh_tokenizer_dir, uri)
    for argv in (["config"], ["config", "tracking"], ["register", "--force"]):
        r = bertpipe_here(capfd, root, *argv)
        assert r.returncode == 0, r.stderr[-3000:]
        shown.append(r)
    assert f"127.0.0.1:{port}" in shown[-2].stdout

    # the server is down: one error line, masked, no traceback
    dead = f"http://alice:{SECRET}@127.0.0.1:{free_port()}"
    r = bertpipe_here(capfd, root, "register", "--force", "--set", f"tracking.uri={dead}",
                      MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "not reachable" in errors[0] and "127.0.0.1" in errors[0], errors
    shown.append(r)

    for proc in shown:
        assert SECRET not in proc.stdout + proc.stderr, (proc.args, (proc.stdout + proc.stderr)[-3000:])
    # everything written: the project (work/, .bertpipe/ with Prefect's db), the server's store and artifacts
    assert files_holding(SECRET.encode(), root, server_home, skip=(root / "params.yaml",)) == []
    # and the runs really went to that server
    reg = json.loads((root / "work" / "register" / "registry.json").read_text())
    assert reg["tracking_uri"] == f"http://127.0.0.1:{port}" and reg["models"][0]["version"] in ("1", "2")
