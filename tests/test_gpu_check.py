"""bench/gpu_check.sh runs end to end in its tiny --smoke mode on whatever device there is (here the CPU), so the
check is known to work before it is carried to a GPU machine: its isolated loops, and whole stages run through the
CLI on a tiny project with tracking off (bench/gpu_stages.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_smoke(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([str(REPO / "bench" / "gpu_check.sh"), "--smoke", "--json", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["pretrain"]["bertpipe"]["tokens_per_s"] > 0 and res["pretrain"]["hf"]["tokens_per_s"] > 0
    assert {k: v["precision"].split()[0] for k, v in res["finetune"].items()} == {"bf16": "bf16", "fp16": "fp16"}
    assert res["inference"]["torch"]["examples_per_s"] > 0 and res["inference"]["torch_batch1"]["latency_ms"] > 0
    assert res["pretrain"]["packed_3_docs"]["tokens_per_s"] > 0  # document-confined attention on packed rows
    assert res["finetune"]["bf16"]["mfu"] > 0  # fp16 has no measured peak on a CPU
    assert "bertpipe / HF" in r.stdout and "precision policy" in r.stdout
    stages = res["stages"]
    assert [k for k in stages if k != "mlflow_db_created"] == ["splits", "prepare", "start", "vocab", "pretrain",
                                                                 "finetune"], stages
    assert all("failed" not in v and v["seconds"] > 0 for k, v in stages.items() if k != "mlflow_db_created"), stages
    assert stages["pretrain"]["tokens_per_s"] > 0 and stages["finetune"]["examples_per_s"] > 0
    assert all(stages[s]["device"].startswith("auto: CPU") for s in ("pretrain", "finetune")), stages  # what each said
    assert stages["mlflow_db_created"] is False  # tracking off: no MLflow store
    assert "stage finetune: " in r.stdout
