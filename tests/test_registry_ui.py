"""The registry as a person sees it: a real `mlflow server` on 127.0.0.1, the model version page in headless
Chromium, the champion alias and the metric on screen. The screenshot is kept in test-artifacts/."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from tests.test_register import finetune_output, register_stage

pytestmark = pytest.mark.slow
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=30000", "--window-size=1400,1400"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (installed by .ci/run)")
def test_champion_and_metric_are_shown_in_the_mlflow_ui(tmp_path, zh_tokenizer_dir):
    (tmp_path / "params.yaml").write_text("paths: {work: work, state: state}\nregister: {register_encoder: false}\n")
    (tmp_path / "work" / "evaluate").mkdir(parents=True)
    (tmp_path / "work" / "pretrain").mkdir(parents=True)
    cfg = load_config(tmp_path / "params.yaml")
    run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.8123, 1)), cfg)

    port = free_port()
    env = {**__import__("os").environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("mlflow")), "server", "--backend-store-uri",
         f"sqlite:///{cfg.state / 'mlflow.db'}", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        end = time.time() + 120
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                    break
            except OSError:
                if time.time() > end:
                    raise AssertionError("mlflow server did not start") from None
                time.sleep(1)
        url = f"http://127.0.0.1:{port}/#/models/bertpipe-sentiment/versions/1"
        chrome = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'chrome'}"]
        dom = subprocess.run([*chrome, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "mlflow_model_version.png"
        subprocess.run([*chrome, f"--screenshot={shot}", url], capture_output=True, timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert "champion" in dom and "challenger" in dom
    assert "0.8123" in dom and "accuracy" in dom
    assert shot.exists() and shot.stat().st_size > 10_000
