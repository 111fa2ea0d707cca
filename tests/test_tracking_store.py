"""The tracking store at its edges: a half-created sqlite store, a copied project, a registry that lost what the
register output names, a re-created model's download cache, a tracking server that does not answer. Real MLflow
sqlite stores, real migrations, real tiny models registered by the register stage (tests/test_register.py's)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bertpipe.core.stage import is_fresh, run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from tests.e2e_project import free_port
from tests.test_register import finetune_dir, make_project, record, register_stage, write_baselines

MODEL = "bertpipe-sentiment"


def half_created_store(db: Path, run_rows: int = 0) -> None:
    """What a process killed while MLflow created its store leaves: the initial tables and the migrations up to
    ``84291f40a231`` (run_link) applied, its version stamp never written (sqlite commits each DDL statement on its
    own). Opening it again re-runs that migration: ``duplicate column name: run_link``."""
    import sqlalchemy
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import InitialBase, _get_alembic_config

    engine = sqlalchemy.create_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)
    config = _get_alembic_config(str(engine.url))
    rev = ScriptDirectory.from_config(config).get_revision("84291f40a231")
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, rev.revision)
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text("UPDATE alembic_version SET version_num = :v"), {"v": rev.down_revision})
        for i in range(run_rows):
            conn.execute(sqlalchemy.text("INSERT INTO runs (run_uuid, experiment_id, lifecycle_stage) "
                                         "VALUES (:r, 0, 'active')"), {"r": f"run{i}"})
    engine.dispose()


def project(root: Path):
    (root / "params.yaml").parent.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text("paths: {work: work, state: state}\n")
    return load_config(root / "params.yaml")


def test_a_store_left_half_created_is_rebuilt_and_one_holding_runs_refused(tmp_path):
    from bertpipe.infra.tracking import client, experiment_id

    cfg = project(tmp_path / "empty")
    cfg.state.mkdir(parents=True)
    half_created_store(cfg.state / "mlflow.db")
    c = client(cfg)  # the next command works: the store held nothing, so it is created again
    assert c.get_experiment(experiment_id(cfg, c)).name == "bertpipe"
    c.search_registered_models()

    cfg = project(tmp_path / "with-runs")
    cfg.state.mkdir(parents=True)
    half_created_store(cfg.state / "mlflow.db", run_rows=1)
    digest = hashlib.sha256((cfg.state / "mlflow.db").read_bytes()).hexdigest()
    with pytest.raises(BertpipeError, match=r"mlflow\.db: the MLflow store is at schema .* holds 1 run/model"):
        client(cfg)
    assert hashlib.sha256((cfg.state / "mlflow.db").read_bytes()).hexdigest() == digest  # nothing touched


def test_the_schema_head_read_from_the_scripts_is_alembics(tmp_path):
    """The store's expected schema comes from the migration scripts' text; alembic's own answer (it imports every
    script) is the reference, and text that does not say one head plainly falls back to it."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    from bertpipe.infra import mlflow_store

    assert mlflow_store.scripts_head(mlflow_store._migrations_dir()) == _get_latest_schema_revision()
    versions = tmp_path / "versions"
    versions.mkdir()

    def script(name, text):
        (versions / f"{name}.py").write_text(f'"""{name}"""\n{text}\n')

    script("a", 'revision = "aaa"\ndown_revision = None')
    script("b", 'revision: str = "bbb"\ndown_revision: Union[str, None] = "aaa"')
    assert mlflow_store.scripts_head(versions) == "bbb"
    script("c", 'revision = "ccc"\ndown_revision = "aaa"')  # two heads: alembic decides
    assert mlflow_store.scripts_head(versions) is None
    script("d", 'revision = "ddd"\ndown_revision = ("bbb", "ccc")')  # a merge: one head again
    assert mlflow_store.scripts_head(versions) == "ddd"
    script("e", 'revision = make_id()\ndown_revision = "ddd"')  # not a literal
    assert mlflow_store.scripts_head(versions) is None
    assert mlflow_store.scripts_head(tmp_path / "absent") is None


def test_a_killed_creation_leaves_no_store(tmp_path):
    """A SIGKILL while MLflow migrates a new store: the store is absent or whole, and the next open works."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys

    from mlflow.store.db.utils import _get_latest_schema_revision

    cfg = project(tmp_path / "p")
    code = ("from bertpipe.graph.pipeline import load_config; from bertpipe.infra.tracking import client; "
            f"client(load_config({str(tmp_path / 'p' / 'params.yaml')!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "Updating database tables" in line:  # MLflow starts its migrations (~1-2 s of them)
            time.sleep(0.4)
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(60)
    db = cfg.state / "mlflow.db"
    if db.exists():
        with sqlite3.connect(db) as con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            row = con.execute("SELECT version_num FROM alembic_version").fetchone() if "alembic_version" in tables \
                else None
        assert row is not None and row[0] == _get_latest_schema_revision(), f"a half-created store: {row}"
    from bertpipe.infra.tracking import client

    client(cfg).search_registered_models()
    assert not list(cfg.state.glob(".mlflow.db.creating-*"))


@pytest.fixture(scope="module")
def registered(tmp_path_factory, zh_tokenizer_dir):
    """A project whose register stage registered one trained tiny classifier (v1, champion)."""
    root = tmp_path_factory.mktemp("registered")
    cfg = make_project(root)
    write_baselines(root)
    ft = finetune_dir(root, "good", zh_tokenizer_dir, seed=2, steps=40)
    st = the_register_stage(ft)
    run_stage(st, cfg)
    return root, ft


def the_register_stage(ft: Path):
    """tests/test_register.py's register stage over ``ft``, with the pipeline's own rule for a lost registry."""
    from bertpipe.stages.register.declare import register_stage as pipeline_register

    return replace(register_stage(ft), lost=pipeline_register().lost)


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.endswith(".lock"):
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def test_a_copied_project_logs_into_its_own_artifacts(registered, tmp_path):
    from bertpipe.infra.tracking import client, experiment_id

    ref, ft = registered
    copy = tmp_path / "copy"
    shutil.copytree(ref, copy, symlinks=True)
    before = tree_digest(ref)
    cfg = load_config(copy / "params.yaml")
    ft_copy = copy / ft.relative_to(ref)
    r = run_stage(the_register_stage(ft_copy), cfg, force=True)  # logs the decision report and registry.json
    assert not r.skipped
    assert tree_digest(ref) == before  # the original's files, its mlartifacts included, are unchanged
    c = client(cfg)
    exp = c.get_experiment(experiment_id(cfg, c))
    assert exp.artifact_location == (cfg.state / "mlartifacts").resolve().as_uri()
    run = c.get_run(json.loads((r.out / "manifest.json").read_text())["mlflow_run_id"])
    assert run.info.artifact_uri.startswith(exp.artifact_location + "/")
    assert {a.path for a in c.list_artifacts(run.info.run_id)} >= {"registry.json", "decision.md"}


def test_register_is_stale_when_the_registry_lost_its_versions(registered, tmp_path):
    from bertpipe.infra.tracking import client

    ref, ft = registered
    root = tmp_path / "p"
    shutil.copytree(ref, root, symlinks=True)
    cfg = load_config(root / "params.yaml")
    st = the_register_stage(root / ft.relative_to(ref))
    assert is_fresh(st, cfg)[0] and run_stage(st, cfg).skipped

    # a new paths.state: a new, empty store; the output's fingerprint is the same
    cfg2 = cfg.with_overrides(["paths.state=state2"])
    assert not is_fresh(st, cfg2)[0]
    r = run_stage(st, cfg2)
    assert not r.skipped and record(r.out)["version"] == "1" and record(r.out)["promoted"]
    assert [m.name for m in client(cfg2).search_registered_models()] == [MODEL]
    assert run_stage(st, cfg2).skipped

    # the store deleted: stale, and asking does not create it again
    from bertpipe.stages.register.present import missing

    (cfg2.state / "mlflow.db").unlink()
    assert "does not exist" in missing(cfg2, r.out) and not (cfg2.state / "mlflow.db").exists()
    # the model deleted from the registry
    client(cfg).delete_registered_model(MODEL)
    assert f"{MODEL} v1 is not in the registry" in missing(cfg, r.out)


def test_a_re_created_model_is_not_answered_from_the_deleted_ones_files(registered, tmp_path, zh_tokenizer_dir):
    from bertpipe.infra.tracking import client
    from bertpipe.lib.registered.files import local_version

    ref, _ = registered
    root = tmp_path / "p"
    shutil.copytree(ref, root, symlinks=True)
    cfg = load_config(root / "params.yaml")
    first = local_version(cfg, f"{MODEL}/1")
    weights = (first.model_dir / "model.safetensors").read_bytes()

    client(cfg).delete_registered_model(MODEL)
    other = finetune_dir(root, "other", zh_tokenizer_dir, seed=7, steps=5)
    r = run_stage(the_register_stage(other), cfg)
    assert record(r.out)["version"] == "1"
    again = local_version(cfg, f"{MODEL}/1")
    got = (again.model_dir / "model.safetensors").read_bytes()
    assert got != weights
    from safetensors.torch import load_file

    want = load_file(str(other / "model" / "model.safetensors"))
    have = load_file(str(again.model_dir / "model.safetensors"))
    assert all((want[k] == have[k]).all() for k in want if k in have) and set(want) & set(have)
    assert not first.model_dir.exists()  # the deleted model's files are gone from the cache


def test_an_unanswering_tracking_server_is_retried_aloud_and_given_up_in_time(tmp_path, capfd, monkeypatch):
    from bertpipe.infra.tracking import client, unreachable_line

    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BERTPIPE_TRACKING_WAIT_S", "6")
    cfg = project(tmp_path).with_overrides([f"tracking.uri=http://127.0.0.1:{free_port()}"])
    t0 = time.monotonic()
    with pytest.raises(Exception) as e:
        client(cfg).search_experiments()
    took = time.monotonic() - t0
    assert unreachable_line(e.value) is not None
    assert took < 30, took  # 3 retries, pauses 0 + 2 + 4 s
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[tracking]")]
    assert len(lines) == 3 and "retry 3/3" in lines[-1] and "Connection refused" in lines[0], lines
    assert "experiments/search" in lines[0] and "127.0.0.1" in lines[0]


def test_a_store_holding_other_schema_data_is_one_error_line_not_created_over(tmp_path):
    cfg = project(tmp_path)
    cfg.state.mkdir(parents=True)
    (cfg.state / "mlflow.db").write_bytes(b"not a database, but someone's file" * 100)
    from bertpipe.infra.tracking import client

    with pytest.raises(BertpipeError, match=r"mlflow\.db: not a readable MLflow sqlite store"):
        client(cfg)


def one_error_line(proc) -> str:
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return errors[0]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_tracking_uris_mlflow_cannot_use_and_a_missing_store_are_one_error_line(tmp_path):
    """`ftp://`, `postgresql://` without its driver, a bare word: one line naming tracking.uri and what is expected,
    from a read-only command and from `run` (before Prefect starts). A read-only command on a sqlite store that does
    not exist creates nothing, there or in the project."""
    import importlib.util

    from tests.e2e_project import env_for, invoke

    root = tmp_path / "p"
    project(root)
    env = env_for(root, prefect="ephemeral")  # no Prefect server: every command here ends before one would start
    env.pop("MLFLOW_TRACKING_URI", None)
    before = files_under(root)
    uris = ["ftp://example.org/store", "notauri"]
    if importlib.util.find_spec("psycopg") is None:  # SQLAlchemy's driver for a plain postgresql:// URL
        uris.append("postgresql://127.0.0.1:5432/mlflow")
    for argv, uri in [(["run"], uris[0])] + [(["models", "list"], u) for u in uris]:
        line = one_error_line(invoke([*argv, "--set", f"tracking.uri={uri}"], root, env))
        assert line.startswith("error: tracking.uri: ") and ("expected sqlite:///PATH" in line
                                                             or "needs a database driver" in line), line
    nowhere = tmp_path / "nonexistent" / "dir" / "x.db"
    for argv in (["models", "list"], ["models", "promote", MODEL, "1"]):
        line = one_error_line(invoke([*argv, "--set", f"tracking.uri=sqlite:///{nowhere}"], root, env))
        assert f"no MLflow store at {nowhere}" in line, line
    line = one_error_line(invoke(["models", "list"], root, env))  # the project's own store, not made yet
    assert "no MLflow store at" in line and "mlflow.db" in line, line
    assert not (tmp_path / "nonexistent").exists()
    assert [f for f in files_under(root) if "mlflow.db" in f] == [], files_under(root)
    assert before == [f for f in files_under(root) if f in before]


def test_bertpipe_stages_asks_no_tracking_server(tmp_path, sample_raw):
    """`bertpipe stages` reports from files alone: with the tracking URI at a server, whether the registry still
    holds what register's output names (``Stage.lost``) is left to the run, and no connection is made (a listener
    counts them). A local sqlite store is still read: the test above."""
    import os
    import socket
    import threading

    from bertpipe.graph.freshness import plan
    from bertpipe.graph.pipeline import all_stages
    from tests.e2e_project import invoke, write_project

    cfg = load_config(write_project(tmp_path, sample_raw))
    fp = plan(cfg)["register"].fingerprint
    assert fp, "register's fingerprint is computable: its record is what `bertpipe stages` would ask about"
    out = all_stages(cfg)["register"].output(cfg)
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"fingerprint": fp}))
    (out / "registry.json").write_text(json.dumps({"models": [{"name": MODEL, "version": "1"}]}))
    server, accepted = socket.create_server(("127.0.0.1", 0)), []

    def count() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the command is done
                return
            accepted.append(conn)
            conn.close()

    threading.Thread(target=count, daemon=True).start()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{server.getsockname()[1]}",
           "BERTPIPE_TRACKING_WAIT_S": "2"}
    started = time.monotonic()
    r = invoke(["stages", "--json"], tmp_path, env)
    took = time.monotonic() - started
    server.close()
    assert r.returncode == 0, r.stderr[-2000:]
    assert {row["stage"]: row for row in json.loads(r.stdout)}["register"]["fingerprint"] == fp
    assert not accepted, f"`bertpipe stages` made {len(accepted)} connection(s) to the tracking server ({took:.0f} s)"
