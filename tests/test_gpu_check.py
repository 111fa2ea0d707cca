"""bench/gpu_check.sh runs end to end in its tiny --smoke mode on whatever device there is (here the CPU), so the
check is known to work before it is carried to a GPU machine: the attention kernels alone, its isolated loops under
each kernel, and whole stages run through the CLI on a tiny project with tracking off (bench/gpu_stages.py)."""

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
    kernels = {k: v for k, v in res["kernels"].items() if k != "shape"}
    assert {k.split()[0] for k in kernels} == {"SDPA,", "mask", "varlen", "flex"}  # CUDA adds torch's varlen_attn
    assert all(v["ms"] > 0 for v in kernels.values())
    (seq, pre), = res["pretrain"].items()
    assert all(pre[k]["tokens_per_s"] > 0 for k in ("bertpipe", "hf", "packed_mask", "packed_varlen"))
    assert pre["packed_varlen"]["attention"] == "attention: varlen"  # the run said which kernel it trained with
    ft = res["finetune"]
    assert ft["hf"]["examples_per_s"] > 0 and ft["bf16_mask"]["mfu"] > 0  # fp16 has no measured peak on a CPU
    assert {k: v["precision"].split()[0] for k, v in ft.items() if k not in ("hf", "mean_length")} == \
        {"bf16_mask": "bf16", "bf16_varlen": "bf16", "fp16_mask": "fp16"}
    inf = res["inference"]
    assert inf["batch1"]["latency_ms"] > 0 and inf["run_model"]["examples_per_s"] > 0
    assert all(inf[k]["examples_per_s"] > 0 for k in ("mask", "varlen", "flex"))
    # one table at the end: every section's rows, each compared with its baseline
    table = r.stdout[r.stdout.index("\nsection "):]
    assert all(s in table for s in ("kernels", f"pretrain {seq}", "finetune", "inference", "stages", "of HF"))
    assert "precision policy" in r.stdout and "FAILED" not in r.stdout
    stages = res["stages"]
    assert [k for k in stages if k != "mlflow_db_created"] == ["splits", "prepare", "start", "vocab", "pretrain",
                                                                 "finetune"], stages
    assert all("failed" not in v and v["seconds"] > 0 for k, v in stages.items() if k != "mlflow_db_created"), stages
    assert stages["pretrain"]["tokens_per_s"] > 0 and stages["finetune"]["examples_per_s"] > 0
    assert all(stages[s]["device"].startswith("auto: CPU") for s in ("pretrain", "finetune")), stages  # what each said
    assert all(stages[s]["attention"] == "attention: auto, mask on cpu" for s in ("pretrain", "finetune")), stages
    assert stages["mlflow_db_created"] is False  # tracking off: no MLflow store
    assert "stage finetune: " in r.stdout
