"""A Prefect server that dies while `bertpipe run` runs: the stages go on, and the run's outcome follows them. A
real `prefect server start`, SIGKILLed as the last stage of the run starts building; a real tiny project."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e_project import env_for, free_port, one_task, prefect_server, start, write_project


def test_a_server_that_refuses_connections_is_told_from_one_that_answers():
    """``refused``: one request, no retries, tells "nothing listens there" from an answering (or absent) API."""
    import http.server
    import threading

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from bertpipe_prefect.flows.lost_api import refused

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{server.server_port}/api"}):
            assert refused() is None
    finally:
        server.shutdown()
        server.server_close()
    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        why = refused()
    assert why is not None and why.startswith("ConnectError"), why


@pytest.mark.slow
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
