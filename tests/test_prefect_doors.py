"""What the Prefect door shows and does, against one real Prefect server: the stage table, report and progress
artifacts; a stage's child-process log lines in the task run's logs; retries with backoff for transient failures
(a timeout) but not for a user error; the deployment's cron in flow.timezone; and a run triggered by a new file in
flow.drop_dir (the watcher's event -> the deployment's trigger)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e_project import env_for, one_task, prefect_server, run, stop, wait_for, write_project

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SCRIPT = r"""
import json, sys
from pathlib import Path
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, \
    FlowRunFilterId, LogFilter, LogFilterFlowRunId
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe_prefect.flows import artifacts
from bertpipe_prefect.flows.domain_adaptation import domain_adaptation
from bertpipe_prefect.tasks.stages import task_for

out = {}
state = domain_adaptation("params.yaml", None, [], "splits", return_state=True)
run_id = state.state_details.flow_run_id

report = Path("fake-evaluate")
report.mkdir(exist_ok=True)
(report / "report.md").write_text("# Report\n\n| task | base |\n|---|---|\n| t | 0.5 |\n\n![bar](figures/x.png)\n")

@flow
def publish_only():
    artifacts.publish({"evaluate": {"status": "built", "out": str(report.resolve()), "fingerprint": "ab" * 32}},
                      load_config("params.yaml"))

pub = publish_only(return_state=True).state_details.flow_run_id

@flow
def child_and_retries(overrides):
    cfg = load_config("params.yaml", None, overrides)
    st = all_stages(cfg)
    futs = {n: task_for(st[n], cfg).submit(stage_name=n, params=str(Path("params.yaml").resolve()),
                                          overrides=overrides, threads=1) for n in ("prepare",)}
    return {n: f.wait() or f.state.name for n, f in futs.items()}

slow = child_and_retries(["flow.stage_timeout_s=2", "flow.stage_retries=1", "flow.retry_delay_s=1",
                          "prepare.dedup.num_perm=64"], return_state=True).state_details.flow_run_id
logged = child_and_retries(["prepare.dedup.num_perm=32"], return_state=True).state_details.flow_run_id
Path("bad.jsonl").write_text('{"body": "no text field"}\n')
bad = child_and_retries(["flow.stage_retries=3", "flow.retry_delay_s=0", "prepare.dedup.num_perm=16",
                         "prepare.domain.sources=[{path: bad.jsonl, format: jsonl}]"],
                        return_state=True).state_details.flow_run_id

with get_client(sync_client=True) as c:
    def arts(fr):
        return [{"key": a.key, "type": a.type, "data": a.data}
                for a in c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
                    any_=[fr])))]
    def tasks(fr):
        return [{"name": t.name, "state": t.state.name, "message": t.state.message or "", "runs": t.run_count}
                for t in c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr])))]
    out["flow"] = arts(run_id)
    out["publish"] = arts(pub)
    out["slow"] = tasks(slow)
    out["bad"] = tasks(bad)
    out["logs"] = [l.message for l in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
        any_=[logged])))]
print("OUT=" + json.dumps(out, default=str))
"""

# The deployment's schedules and its runs (not the ones the scheduler creates ahead for the cron); with a wait in
# seconds (argv[1]), polled in this one process until a run appears: a process per poll costs ~1.5 CPU-s each.
DEPLOYMENT = r"""
import json, sys, time
from prefect.client.orchestration import get_client
end = time.time() + float(sys.argv[1])
with get_client(sync_client=True) as c:
    dep = c.read_deployment_by_name("domain_adaptation/bertpipe-domain-adaptation")
    while True:
        runs = [r.name for r in c.read_flow_runs() if r.deployment_id == dep.id and not r.auto_scheduled]
        if runs or time.time() >= end:
            break
        time.sleep(1)
    print("OUT=" + json.dumps({"schedules": [[s.schedule.cron, s.schedule.timezone] for s in dep.schedules],
                               "runs": runs}))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, sample_raw):
    root = tmp_path_factory.mktemp("prefect")
    write_project(root, sample_raw, {"flow": {"max_parallel": 1, "timezone": "Asia/Shanghai", "cron": "5 4 * * *"},
                                    "finetune": one_task()})
    env = env_for(root)
    with prefect_server(root, env):
        yield root, env


def _out(proc: subprocess.CompletedProcess) -> dict:
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT=")]
    assert line, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(line[-1][len("OUT="):])


def test_artifacts_child_logs_retries(project):
    root, env = project
    out = _out(run([sys.executable, "-c", SCRIPT], root, timeout=1200, check=False, env=env))
    by_key = {a["key"]: a for a in out["flow"]}
    table = json.loads(by_key["stages"]["data"]) if isinstance(by_key["stages"]["data"], str) else \
        by_key["stages"]["data"]
    assert {r["stage"]: r["status"] for r in table}["splits"] == "built"
    assert {r["status"] for r in table} <= {"built", "skipped"} and len(table) > 3  # the rest are below --until
    assert by_key["stage-progress"]["type"] == "progress" and float(by_key["stage-progress"]["data"]) == 100.0
    md = [a for a in out["publish"] if a["key"] == "evaluation-report"]
    assert md and "| t | 0.5 |" in md[0]["data"] and "figures/x.png" not in md[0]["data"]
    # a timeout is transient: retried once (2 runs), then the task fails with the timeout
    (slow,) = out["slow"]
    assert slow["state"] in ("TimedOut", "Failed") and slow["runs"] == 2 and "timeout" in slow["message"].lower(), slow
    # a user error (a source without the text field) is not retried
    (bad,) = out["bad"]
    assert bad["state"] == "Failed" and bad["runs"] == 1 and "bad.jsonl" in bad["message"], bad
    # the child process's own lines reach the task run's logger, naming the stage once
    assert any(m.startswith("[prepare] building") for m in out["logs"]), out["logs"][-20:]
    assert not any(m.startswith("[prepare] [prepare]") for m in out["logs"]), out["logs"][-20:]


def test_deployment_timezone_and_drop_dir_trigger(project):
    root, env = project
    serve = subprocess.Popen(["bertpipe", "schedule", "--until", "splits"], cwd=root, env=env,
                             stdout=open(root / "serve.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: "bertpipe-domain-adaptation" in (root / "serve.log").read_text(), 180, "the deployment")
        dep = _out(subprocess.run([sys.executable, "-c", DEPLOYMENT, "0"], cwd=root, env=env, capture_output=True,
                                  text=True, timeout=120))
        assert dep["schedules"] == [["5 4 * * *", "Asia/Shanghai"]] and dep["runs"] == [], dep
        drop = root / "data" / "incoming"
        drop.mkdir(parents=True, exist_ok=True)
        (drop / "new.jsonl").write_text('{"id": "n1", "text": "新的法律条文。", "group": "g"}\n', encoding="utf-8")

        runs = _out(subprocess.run([sys.executable, "-c", DEPLOYMENT, "240"], cwd=root, env=env, capture_output=True,
                                   text=True, timeout=360))["runs"]
        assert runs, "no run triggered by the new file within 240 s:\n" + (root / "serve.log").read_text()[-3000:]
        assert len(runs) == 1, runs
        assert "new files in" in (root / "serve.log").read_text()
    finally:
        stop(serve)
