"""A finetune's output is a function of its fingerprint: two processes that used the global RNGs differently before
the stage give identical metrics and weights. And an encoder with fewer positions than finetune.train.max_seq_len
trains with the length clamped (a notice), instead of failing with a tensor size error."""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys

import pytest

from tests import synthetic as S
from bertpipe.finetune.declare import finetune_stage
from bertpipe.pipeline import load_config
from bertpipe.splits.declare import splits_stage
from bertpipe.stage import run_stage
from tests.e2e_project import env_for

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731

RUN = r"""
import contextlib, hashlib, json, random, sys
import numpy as np, torch
torch.set_num_threads(1)
burn = int(sys.argv[1])  # use the global RNGs differently before the stage, as a flow's earlier tasks would
random.random(); [random.random() for _ in range(burn)]
np.random.rand(burn + 1); torch.rand(burn + 1)
from bertpipe.pipeline import load_config
from bertpipe.finetune.declare import finetune_stage
from bertpipe.stage import run_stage
cfg = load_config("params.yaml")
res = run_stage(finetune_stage(sys.argv[2], "base"), cfg, force=True, tracker_factory=lambda *a: contextlib.nullcontext())
m = json.loads((res.out / "metrics.json").read_text())
h = hashlib.sha256((res.out / "model" / "model.safetensors").read_bytes()).hexdigest()
print("RESULT=" + json.dumps({"per_seed": {s: {"dev": r["dev"], "test": r["test"], "steps": r["steps"]}
                                          for s, r in m["per_seed"].items()}, "weights": h}))
"""


def _long_rows(n: int, seed: int) -> list[dict]:
    """~150 characters each, far past the encoder's 64 positions; the label's keyword comes early."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lab = "pos" if i % 2 else "neg"
        rows.append({"id": i, "text": "".join(rng.choice(S.FILLER) for _ in range(5)) + S.KEYS[lab]
                     + "".join(rng.choice(S.FILLER) for _ in range(150)), "label": lab})
    return rows


def _project(root, zh_tokenizer_dir, seeds: str):
    enc = S.tiny_encoder(root / "enc", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    S.write_jsonl(root / "long.jsonl", _long_rows(160, seed=3))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 1, batch_size: 16, max_seq_len: 128, seeds: {seeds}, bf16: false}}
  tasks:
    long: {{type: classification, format: jsonl, train: long.jsonl}}
""",
        encoding="utf-8",
    )
    cfg = load_config(root / "params.yaml")
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)
    return cfg


def test_an_encoder_with_fewer_positions_than_max_seq_len_trains_clamped(tmp_path, zh_tokenizer_dir, capfd):
    cfg = _project(tmp_path, zh_tokenizer_dir, "[1]")
    res = run_stage(finetune_stage("long", "base"), cfg, tracker_factory=NO_TRACKING)
    assert 0.0 <= res.metrics["test_macro_f1"] <= 1.0 and (res.out / "model").is_dir()  # a score, not NaN
    assert "finetune.train.max_seq_len=128 exceeds the model's 64 positions; using 64" in capfd.readouterr().err


@pytest.mark.slow  # two processes
def test_same_finetune_in_two_processes_after_different_rng_use_is_identical(tmp_path, zh_tokenizer_dir):
    _project(tmp_path, zh_tokenizer_dir, "[3, 4]")
    results, logs = [], []
    for burn in (0, 977):
        proc = subprocess.run([sys.executable, "-c", RUN, str(burn), "long"], cwd=tmp_path, env=env_for(tmp_path),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")][-1]
        results.append(json.loads(line[len("RESULT="):]))
        logs.append(proc.stderr)
    assert results[0] == results[1]
    assert set(results[0]["per_seed"]) == {"3", "4"} and results[0]["per_seed"]["3"]["steps"] > 0
    assert "finetune.train.max_seq_len=128 exceeds the model's 64 positions; using 64" in logs[0]
