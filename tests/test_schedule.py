"""`bertpipe serve` against a real local Prefect server: deployment with the cron from params, one triggered run
completes, and shutdown happens in the right order (serve first, then the server)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.e2e_project import env_for, prefect_server, stop, wait_for, write_project

pytestmark = pytest.mark.slow


TRIGGER = r"""
import json, sys, time
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as c:
    dep = c.read_deployment_by_name("domain_adaptation/bertpipe-domain-adaptation")
    sched = [s.schedule.cron for s in dep.schedules]
    fr = c.create_flow_run_from_deployment(dep.id)
    end = time.time() + 400
    while time.time() < end:
        fr = c.read_flow_run(fr.id)
        if fr.state and fr.state.is_final():
            break
        time.sleep(2)
    print("RESULT=" + json.dumps({"cron": sched, "state": fr.state.name if fr.state else None}))
"""


def test_serve_deployment_runs_on_a_real_prefect_server(tmp_path, sample_raw):
    write_project(tmp_path, sample_raw, {"flow": {"cron": "17 4 * * 2"}})
    env = env_for(tmp_path)
    serve = None
    with prefect_server(tmp_path, env) as server:
        try:
            serve_log = open(tmp_path / "serve.log", "w")
            serve = subprocess.Popen(["bertpipe", "serve", "--until", "prepare"], cwd=tmp_path, env=env,
                                     stdout=serve_log, stderr=subprocess.STDOUT, start_new_session=True)
            wait_for(lambda: "bertpipe-domain-adaptation" in (tmp_path / "serve.log").read_text(), 180,
                     "the deployment to be served")
            proc = subprocess.run([sys.executable, "-c", TRIGGER], cwd=tmp_path, env=env, capture_output=True,
                                  text=True, timeout=600)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
            assert line, proc.stdout + proc.stderr
            result = json.loads(line[-1][len("RESULT="):])
            assert result["cron"] == ["17 4 * * 2"]
            assert result["state"] == "Completed", (tmp_path / "serve.log").read_text()[-3000:]
            assert (tmp_path / "work" / "prepare" / "manifest.json").exists()
        finally:
            stop(serve)  # serve first, then the server: the other order leaves serve hanging on its API calls
    assert serve.returncode is not None and server.returncode is not None
