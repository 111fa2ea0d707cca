"""The Prefect door agrees with the files on what is fresh: a real flow caches a fresh stage and rebuilds one whose
output was deleted, and records its runs nested in MLflow. (DVC and the CLI agreeing: tests/test_pipeline_e2e.py's
`dvc repro` test, on the finished chain.)"""

from __future__ import annotations

import json

import pytest

from tests.e2e_project import env_for, invoke, one_task, run, write_project

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

import shutil
from pathlib import Path
out, manifests = [], []
for i in range(2):
    state = domain_adaptation("params.yaml", None, [], "prepare", return_state=True)
    assert state.is_completed(), state
    out.append(states(state.state_details.flow_run_id))
    manifests.append(json.loads(Path("work/prepare/manifest.json").read_text()))
    if i == 0:  # between the runs, in this process: one interpreter and one temporary Prefect API for both
        shutil.rmtree("work/prepare")
print("STATES=" + json.dumps(out))
print("MANIFESTS=" + json.dumps(manifests))
"""


FLOW_ONCE = FLOW_TWICE.split("import shutil")[0] + """
state = domain_adaptation("params.yaml", None, [], "prepare", return_state=True)
assert state.is_completed(), state
print("STATES=" + json.dumps(states(state.state_details.flow_run_id)))
"""


def test_prefect_flow_caches_fresh_stages_and_rebuilds_a_deleted_output(tmp_path, sample_raw):
    import shutil
    import sys

    write_project(tmp_path, sample_raw, {"finetune": one_task()})
    # One run; then, after deleting prepare's output, a second (both in one process): the untouched splits stage
    # reads Cached there, so an identical run in between would prove nothing more (the whole chain's cached rerun:
    # test_pipeline_e2e).
    proc = run([sys.executable, "-c", FLOW_TWICE], tmp_path)
    said = {ln.split("=", 1)[0]: json.loads(ln.split("=", 1)[1]) for ln in proc.stdout.splitlines()
            if ln.startswith(("STATES=", "MANIFESTS="))}
    (first, second), (manifest, rebuilt) = said["STATES"], said["MANIFESTS"]
    # prepare needs the splits stage's dev/test splits (to keep them out of pretraining), so it runs first
    assert first == {"splits": "Completed", "prepare": "Completed"}, first
    # The flow's parent run and the stage run are in the embedded MLflow store, nested.
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=(uri := f"sqlite:///{tmp_path / '.bertpipe' / 'mlflow.db'}"), registry_uri=uri)
    stage_run = c.get_run(manifest["mlflow_run_id"])
    parent = c.get_run(stage_run.data.tags["mlflow.parentRunId"])
    assert parent.data.tags["bertpipe.flow"] == "domain_adaptation"
    assert stage_run.data.metrics and stage_run.data.tags["bertpipe.fingerprint"] == manifest["fingerprint"]
    # Deleting the output makes the stage stale for every door: the next flow run rebuilt it instead of trusting
    # Prefect's cache record, to the same fingerprint, in a run of its own.
    assert second == {"splits": "Cached", "prepare": "Completed"}, second
    assert rebuilt["fingerprint"] == manifest["fingerprint"] and rebuilt["mlflow_run_id"] != manifest["mlflow_run_id"]
    assert (tmp_path / "work" / "prepare" / "manifest.json").exists()
    # A one-stage command builds on fresh inputs only: with a --set that stales splits (its near-duplicate settings),
    # `bertpipe prepare` says to run splits first, as `bertpipe stages` calls splits stale, and keeps its output.
    over = ["--set", "prepare.dedup.threshold=0.8"]
    env = env_for(tmp_path, prefect="ephemeral")  # one-stage commands and `stages`: no flow
    states = {ln.split()[0]: ln.split()[1] for ln in invoke(["stages", *over], tmp_path, env).stdout.splitlines()}
    assert (states["splits"], states["prepare"]) == ("stale", "stale"), states
    refused = invoke(["prepare", *over], tmp_path, env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "error: prepare: stage splits is stale with these options (inputs or params changed); run `bertpipe splits` "
        "with the same --set/--profile first"), refused.stderr
    assert json.loads((tmp_path / "work" / "prepare" / "manifest.json").read_text()) == rebuilt
    # A Prefect home with no records of these outputs (its result storage removed: what a new PREFECT_HOME has): the
    # fresh stages read as Cached on the first flow run, not Completed
    shutil.rmtree(tmp_path / ".bertpipe" / "prefect" / "storage")
    proc = run([sys.executable, "-c", FLOW_ONCE], tmp_path)
    again = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("STATES=")][-1][len("STATES="):])
    assert again == {"splits": "Cached", "prepare": "Cached"}, again


def test_a_stage_s_user_error_ends_the_flow_with_its_one_line(tmp_path, sample_raw):
    """A stage that refuses its input inside a flow run (here splits, in the flow's own process): `bertpipe run`
    ends with that stage's one error line, the file expanded, and no traceback; Prefect persists the failed flow's
    result (the error, pickled) without 'Failed to serialize'."""
    import sys

    train = tmp_path / "data" / "t.jsonl"
    train.parent.mkdir(parents=True)
    train.write_text("".join(json.dumps({"text": f"第{i}条评论", "label": "pos"}) + "\n" for i in range(40)))
    write_project(tmp_path, sample_raw, {"paths": {"raw": str(train.parent)}, "finetune": {
        "encoders": ["base"], "tasks": {"t": {"type": "classification", "format": "jsonl", "train": "{raw}/t.jsonl"}}}})
    proc = run([sys.executable, "-m", "bertpipe", "run", "--until", "splits", "--set", "flow.max_parallel=1"],
               tmp_path, check=False)
    both = proc.stdout + proc.stderr
    assert proc.returncode == 2, both[-3000:]
    assert "Traceback" not in both and "Failed to serialize" not in both, both[-6000:]
    assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")] == [
        f"error: {train}: classification needs at least two labels in train, got ['pos']"], both[-3000:]
