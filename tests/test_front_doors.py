"""The three front doors over one library agree on what is fresh: the CLI, a real Prefect flow, a real `dvc repro`."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.e2e_project import run, write_project

pytestmark = pytest.mark.slow

FLOW_TWICE = r"""
import json, sys
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from bertpipe_prefect.flows.domain_adaptation import domain_adaptation

def states(flow_run_id):
    import time
    # Task-run states reach the API as events, asynchronously: wait until the server has them all as final.
    with get_client(sync_client=True) as c:
        for _ in range(60):
            trs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if trs and all(tr.state is not None and tr.state.is_final() for tr in trs):
                break
            time.sleep(1)
        return {tr.name: tr.state.name for tr in trs}

out = []
for _ in range(2):
    state = domain_adaptation("params.yaml", None, [], "prepare", return_state=True)
    assert state.is_completed(), state
    out.append(states(state.state_details.flow_run_id))
print("STATES=" + json.dumps(out))
"""


def test_prefect_flow_caches_fresh_stages_and_rebuilds_a_deleted_output(tmp_path, sample_raw):
    import sys

    write_project(tmp_path, sample_raw)
    # One run, then (below) one after deleting prepare's output: the untouched tasks stage reads Cached there, so
    # a second identical run would prove nothing more (the whole chain's cached rerun: test_pipeline_e2e).
    proc = run([sys.executable, "-c", FLOW_TWICE.replace("range(2)", "range(1)")], tmp_path)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STATES=")][-1]
    (first,) = json.loads(line[len("STATES="):])
    # prepare needs the tasks stage's dev/test splits (to keep them out of pretraining), so it runs first
    assert first == {"tasks": "Completed", "prepare": "Completed"}, first
    manifest = json.loads((tmp_path / "work" / "prepare" / "manifest.json").read_text())
    # The flow's parent run and the stage run are in the embedded MLflow store, nested.
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=(uri := f"sqlite:///{tmp_path / '.bertpipe' / 'mlflow.db'}"), registry_uri=uri)
    stage_run = c.get_run(manifest["mlflow_run_id"])
    parent = c.get_run(stage_run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["bertpipe.flow"] == "domain_adaptation"
    assert stage_run.data.metrics and stage_run.data.tags["bertpipe.fingerprint"] == manifest["fingerprint"]
    # Deleting the output makes the stage stale for every door: the next flow run rebuilds instead of trusting
    # Prefect's cache record.
    shutil.rmtree(tmp_path / "work" / "prepare")
    proc = run([sys.executable, "-c", FLOW_TWICE.replace("range(2)", "range(1)")], tmp_path)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STATES=")][-1]
    assert json.loads(line[len("STATES="):]) == [{"tasks": "Cached", "prepare": "Completed"}]
    assert json.loads((tmp_path / "work" / "prepare" / "manifest.json").read_text())["fingerprint"] == manifest[
        "fingerprint"]


def test_dvc_repro_runs_once_then_is_a_noop(tmp_path, sample_raw):
    write_project(tmp_path, sample_raw)
    run(["git", "init", "-q"], tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    run(["bertpipe", "dvc-yaml"], tmp_path)
    first = run(["dvc", "repro", "prepare"], tmp_path)
    assert "Running stage 'prepare'" in first.stdout, first.stdout
    manifest = (tmp_path / "work" / "prepare" / "manifest.json").read_text()
    second = run(["dvc", "repro", "prepare"], tmp_path)
    assert "Running stage" not in second.stdout and "didn't change" in second.stdout, second.stdout
    assert (tmp_path / "work" / "prepare" / "manifest.json").read_text() == manifest
    status = {ln.split()[0]: ln.split()[1] for ln in run(["bertpipe", "stages"], tmp_path).stdout.splitlines()}
    assert status["tasks"] == status["prepare"] == "fresh", status
    # Changing a prepare param makes DVC run the stage again, and the CLI agrees it was stale.
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["prepare"]["dedup"] = {"threshold": 0.8}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True))
    status = {ln.split()[0]: ln.split()[1] for ln in run(["bertpipe", "stages"], tmp_path).stdout.splitlines()}
    assert status["prepare"] == "stale", status
    third = run(["dvc", "repro", "prepare"], tmp_path)
    assert "Running stage 'prepare'" in third.stdout
