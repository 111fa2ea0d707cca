"""The graph is pure: where pretraining starts is the start stage's file, and only that stage's run asks MLflow.

- `bertpipe stages` on a finished project, with tracking pointed at a port nobody listens on, answers from files
  alone and never imports mlflow;
- the start stage's run with that unreachable registry fails with one line (never "start from the base");
- with a real (sqlite) registry: no champion -> base, a rerun skips, a registry that moved without changing the
  answer rebuilds nothing (the manifest records the new registry digest), a newly registered champion rewrites
  start.json, which makes vocab stale (its inputs now name the champion's export) and nothing above it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from bertpipe.core.stage import read_manifest, run_stage
from bertpipe.graph.freshness import plan
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.layout import read_start, start_dir, start_file
from tests.test_fingerprint_scope import REPO, finish

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731
DEAD = "http://127.0.0.1:9"  # the discard port: connection refused at once


def project(tmp_path, sample_raw, uri: str | None = None):
    proj = tmp_path / "proj"
    proj.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["paths"]["raw"] = str(sample_raw)
    if uri:
        params["tracking"]["uri"] = uri
    (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    shutil.copy(REPO / "profiles.yaml", proj / "profiles.yaml")
    return proj, load_config(proj / "params.yaml")


def test_stages_reads_nothing_from_mlflow(tmp_path, sample_raw):
    proj, cfg = project(tmp_path, sample_raw, DEAD)
    finish(cfg, all_stages(cfg))
    probe = ("import sys\nfrom bertpipe.doors.cli.commands import app\n"
             "try:\n    app(['stages'], standalone_mode=False)\n"
             "finally:\n    print('MLFLOW_IMPORTED' if 'mlflow' in sys.modules else 'NO_MLFLOW')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=proj, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln.split() for ln in proc.stdout.splitlines() if ln.strip()]
    states = {ln[0]: ln[1] for ln in lines[:-1]}
    assert "start" in states and "vocab" in states and set(states.values()) == {"fresh"}, proc.stdout
    assert lines[-1] == ["NO_MLFLOW"], proc.stdout


def test_an_unreachable_registry_is_an_error_not_the_base(tmp_path, sample_raw, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    _, cfg = project(tmp_path, sample_raw, DEAD)
    stages = all_stages(cfg)
    finish(cfg, {n: stages[n] for n in ("splits", "prepare")})
    with pytest.raises(BertpipeError, match="registry cannot be read") as e:
        run_stage(stages["start"], cfg, tracker_factory=NO_TRACKING)
    assert "\n" not in str(e.value) and "127.0.0.1:9" in str(e.value)
    assert not start_file(cfg).exists()  # nothing half-decided is left
    # flow.retrain_from: base needs no registry at all
    based = cfg.with_overrides(["flow.retrain_from=base"])
    run_stage(all_stages(based)["start"], based, tracker_factory=NO_TRACKING)
    assert read_start(start_file(cfg))["kind"] == "base"


def test_a_new_champion_rewrites_start_and_stales_vocab(tmp_path, sample_raw):
    from bertpipe.lib.registered.versions import cache_dir
    from tests.test_retrain_lineage import NAME, _client, _register

    _, cfg = project(tmp_path, sample_raw)
    stages = all_stages(cfg)
    finish(cfg, {n: stages[n] for n in ("splits", "prepare", "base")})
    first = run_stage(stages["start"], cfg, tracker_factory=NO_TRACKING)
    rec = read_start(start_file(cfg))
    assert not first.skipped and rec["kind"] == "base" and rec["model"] is None
    assert rec["corpus"] == read_manifest(cfg.work / "prepare")["fingerprint"]
    assert stages["vocab"].inputs(cfg)["model"] == cfg.work / "base" / "model"
    assert not (cfg.state / "mlflow.db").exists()  # no registry yet: none was created just to find it empty
    before = start_file(cfg).read_bytes()
    assert run_stage(stages["start"], cfg, tracker_factory=NO_TRACKING).skipped
    # The registry moves without changing the answer (a task model's version, no encoder champion): start is not
    # rebuilt (same build, same bytes); its manifest records the new registry digest, so the next run needn't ask.
    built = read_manifest(start_dir(cfg))
    c = _client(cfg)
    c.create_registered_model("bertpipe-other")
    (cfg.state / "sources" / "other").mkdir(parents=True)
    c.create_model_version("bertpipe-other", source=(cfg.state / "sources" / "other").resolve().as_uri())
    assert run_stage(stages["start"], cfg, tracker_factory=NO_TRACKING).skipped
    moved = read_manifest(start_dir(cfg))
    assert moved["started"] == built["started"] and start_file(cfg).read_bytes() == before
    assert moved["external"]["registry"] != built["external"]["registry"]
    assert {k: v for k, v in moved["external"].items() if k != "registry"} == {
        k: v for k, v in built["external"].items() if k != "registry"}
    finish(cfg, stages)  # the rest of the chain built on this decision
    (cfg.work / "vocab" / "model").mkdir(parents=True, exist_ok=True)

    v = _register(cfg, None)  # a champion without lineage: continued from
    assert plan(cfg, stages)["vocab"].fresh  # the graph does not ask the registry ...
    again = run_stage(stages["start"], cfg, tracker_factory=NO_TRACKING)  # ... the start stage's run does
    rec = read_start(start_file(cfg))
    assert not again.skipped and again.fingerprint == first.fingerprint  # same inputs, other registry answer
    assert (rec["kind"], rec["version"]) == ("champion", v) and start_file(cfg).read_bytes() != before
    exported = cache_dir(cfg, _client(cfg).get_model_version(NAME, v))
    assert stages["vocab"].inputs(cfg)["model"] == exported and rec["model_digest"]
    states = plan(cfg, stages)
    stale = {n for n, f in states.items() if not f.fresh}
    assert "vocab" in stale and "pretrain" in stale
    assert {"splits", "prepare", "base", "start"}.isdisjoint(stale), stale
    assert json.loads(start_file(cfg).read_text())["start"] == {"kind": "champion", "name": NAME, "version": v}
