"""The Prefect door agrees with the files on what is fresh: a real flow caches a fresh stage and rebuilds one whose
output was deleted, and records its runs nested in MLflow. (DVC and the CLI agreeing: tests/test_pipeline_e2e.py's
`dvc repro` test, on the finished chain.)"""

from __future__ import annotations

import json
import shutil

import pytest

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
