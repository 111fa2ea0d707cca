"""A Prefect server that dies while `bertpipe run` runs: the stages go on, and the run's outcome follows them. A
real `prefect server start`, SIGKILLed as the last stage of the run starts building; a real tiny project."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e_project import env_for, one_task, prefect_server, start, write_project

pytestmark = pytest.mark.slow


def test_a_run_whose_stages_all_finish_succeeds_when_the_prefect_server_dies(tmp_path, sample_raw):
    root = tmp_path / "p"
    write_project(root, sample_raw, {"finetune": one_task(), "flow": {"max_parallel": 1}})
    env = env_for(root)
    with prefect_server(root, env) as server:
        proc = start(["bertpipe", "run", "--until", "prepare"], root, env)
        try:
            for line in proc.stderr_lines():
                if "[prepare] building" in line:
                    os.killpg(server.pid, signal.SIGKILL)  # the server and what it started
                    break
            proc.wait(600)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait(60)
    out = proc.output()
    both = out.stdout + out.stderr
    assert out.returncode == 0, both[-4000:]
    assert "Traceback" not in both and not [ln for ln in out.stderr.splitlines() if ln.startswith("error:")], \
        both[-4000:]
    assert "warning: the Prefect server was lost during the run" in out.stderr, out.stderr[-3000:]
    lines = {ln.split()[0]: ln.split()[1] for ln in out.stdout.splitlines() if ln[:1].isalpha() and len(ln.split()) > 2}
    assert lines.get("splits") == "built" and lines.get("prepare") == "built", out.stdout
    assert (root / "work" / "prepare" / "manifest.json").is_file()
