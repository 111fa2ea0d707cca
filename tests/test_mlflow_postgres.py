"""A shared MLflow server on a real PostgreSQL database (docs/distributed.md): a throwaway PostgreSQL cluster
(initdb in a temp dir, 127.0.0.1 only), `mlflow server --backend-store-uri postgresql://...`, and bertpipe's register
stage registering a real tiny model through it; the version is then read back from PostgreSQL's own tables.
Skipped where PostgreSQL's server binaries or psycopg2 are missing."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _pg_bin(name: str) -> str | None:
    return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"mlflow server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"mlflow server not up after {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture
def postgres():
    """(uri, connect) of a fresh database on a PostgreSQL server of our own, stopped and removed afterwards."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found")
    psycopg2 = pytest.importorskip("psycopg2")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="bertpipe-pg-"))  # not under pytest's 0700 root-owned tmp: postgres reads it
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run PostgreSQL as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-A", "trust", "-U", "bertpipe", "--no-sync", "-E", "UTF8"],
                       check=True, capture_output=True, timeout=300)
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "120", "-o",
                        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                       check=True, capture_output=True, timeout=180)
        con = psycopg2.connect(host="127.0.0.1", port=port, user="bertpipe", dbname="postgres")
        con.autocommit = True
        con.cursor().execute("CREATE DATABASE mlflow")
        con.close()
        # SQLAlchemy 2 reads a bare postgresql:// as psycopg 3; psycopg2-binary is the driver installed here
        uri = f"postgresql+psycopg2://bertpipe@127.0.0.1:{port}/mlflow"
        yield uri, lambda: psycopg2.connect(host="127.0.0.1", port=port, user="bertpipe", dbname="mlflow")
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def test_register_through_an_mlflow_server_on_postgresql(tmp_path, postgres, zh_tokenizer_dir):
    from tests.test_register import finetune_dir, make_project, record, register_stage, write_baselines

    from bertpipe.core.stage import run_stage
    from bertpipe.graph.pipeline import load_config

    uri, connect = postgres
    port = _free_port()
    log = tmp_path / "mlflow-server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--artifacts-destination",
         (tmp_path / "artifacts").as_uri(), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"})
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", server, log)
        make_project(tmp_path, register_yaml="register_encoder: false, floor: none")  # what is stored, not scores
        params = tmp_path / "params.yaml"
        params.write_text(params.read_text() + f"tracking: {{uri: 'http://127.0.0.1:{port}'}}\n")
        cfg = load_config(params)
        write_baselines(tmp_path)
        ft = finetune_dir(tmp_path, "good", zh_tokenizer_dir, seed=2, steps=0)
        rec = record(run_stage(register_stage(ft), cfg).out)
        assert rec["version"] == "1" and "champion" in rec["aliases"], rec
    finally:
        server.terminate()
        server.wait(timeout=60)
    # What the server stored is in PostgreSQL: the registered version, its alias and the stage's run.
    with connect() as con, con.cursor() as cur:
        cur.execute("SELECT name, version FROM model_versions")
        assert cur.fetchall() == [("bertpipe-sentiment", 1)]
        cur.execute("SELECT alias FROM registered_model_aliases WHERE name = 'bertpipe-sentiment'")
        assert {r[0] for r in cur.fetchall()} >= {"champion"}
        cur.execute("SELECT count(*) FROM runs WHERE name = 'register'")
        assert cur.fetchone()[0] == 1
