"""A finetune's output is a function of its fingerprint: two processes that used the global RNGs differently before
the stage give identical metrics and weights, and so do the three doors, each of which leaves torch at another thread
count (bertpipe.infra.cores: one count for all). And an encoder with fewer positions than finetune.train.max_seq_len
trains with the length clamped (a notice), instead of failing with a tensor size error."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import subprocess
import sys

import pytest

from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.doors.dvc.dvcfile import dvc_stage_name
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.cores import usable_cores
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.splits.declare import splits_stage
from bertpipe_prefect.tasks.parallel import child_env
from tests.e2e_project import env_for, invoke, run

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731

RUN = r"""
import contextlib, hashlib, json, random, sys
import numpy as np, torch
torch.set_num_threads(1)
burn = int(sys.argv[1])  # use the global RNGs differently before the stage, as a flow's earlier tasks would
random.random(); [random.random() for _ in range(burn)]
np.random.rand(burn + 1); torch.rand(burn + 1)
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.stages.finetune.declare import finetune_stage
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


def _project(root, zh_tokenizer_dir, seeds: str, extra: str = ""):
    """A one-task project over a tiny encoder, its splits built; ``extra``: more top-level YAML."""
    enc = S.tiny_encoder(root / "enc", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    S.write_jsonl(root / "long.jsonl", _long_rows(160, seed=3))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state, raw: {zh_tokenizer_dir.parent}}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 1, batch_size: 16, max_seq_len: 128, seeds: {seeds}, precision: fp32}}
  search: {{trials: 0}}
  tasks:
    long: {{type: classification, format: jsonl, train: long.jsonl}}
{extra}""",
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


def _result(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("RESULT=")][-1][len("RESULT="):])


@pytest.mark.slow  # a process of its own
def test_same_finetune_in_two_processes_after_different_rng_use_is_identical(tmp_path, zh_tokenizer_dir, monkeypatch,
                                                                             capfd):
    """``RUN`` in a new process, then in this one (whose RNGs the earlier tests and imports used besides)."""
    import torch

    _project(tmp_path, zh_tokenizer_dir, "[3, 4]")
    proc = subprocess.run([sys.executable, "-c", RUN, "0", "long"], cwd=tmp_path, env=env_for(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [_result(proc.stdout)]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["-c", "977", "long"])
    threads = torch.get_num_threads()
    capfd.readouterr()
    try:
        exec(RUN, {"__name__": "__main__"})
    finally:
        torch.set_num_threads(threads)
    results.append(_result(capfd.readouterr().out))
    assert results[0] == results[1]
    assert set(results[0]["per_seed"]) == {"3", "4"} and results[0]["per_seed"]["3"]["steps"] > 0
    assert "finetune.train.max_seq_len=128 exceeds the model's 64 positions; using 64" in proc.stderr


@pytest.mark.slow  # a child process and `dvc repro`
def test_the_cli_a_flow_child_and_dvc_repro_train_the_same_weights(tmp_path, zh_tokenizer_dir):
    """CPU kernels split reductions by torch's thread count, and each door leaves torch at its own: a `bertpipe`
    process at every core, the flow's child at its slot's share (OMP_NUM_THREADS, tasks.parallel.child_env), DVC's
    command as a process of its own. Every door trains with the one count bertpipe.infra.cores gives the stage."""
    import torch

    cfg = _project(tmp_path, zh_tokenizer_dir, "[1]", extra="tracking: {uri: none}")
    out = tmp_path / "work" / "finetune" / "long" / "base"
    argv = ["finetune", "--task", "long", "--encoder", "base"]

    def built() -> str:
        digest = hashlib.sha256((out / "model" / "model.safetensors").read_bytes()).hexdigest()
        shutil.rmtree(out)  # the next door builds it again
        return digest

    threads = torch.get_num_threads()
    torch.set_num_threads(usable_cores())  # where a `bertpipe` process starts
    try:
        res = invoke(argv, tmp_path, env=env_for(tmp_path))
    finally:
        torch.set_num_threads(threads)
    assert res.returncode == 0, res.stderr[-3000:]
    weights = {"cli": built()}
    child = {**env_for(tmp_path), **{k: v for k, v in child_env(1).items() if k.endswith("_NUM_THREADS")}}
    run([sys.executable, "-m", "bertpipe", *argv], tmp_path, env=child)
    weights["flow child"] = built()
    run(["dvc", "init", "-q", "--no-scm"], tmp_path)
    assert weights["cli"] == weights["flow child"], weights
    dvc_yaml = invoke(["dvc-yaml"], tmp_path, env=env_for(tmp_path))  # prepare's sources: the real samples
    assert dvc_yaml.returncode == 0, dvc_yaml.stderr
    # the stage alone (--single-item): its upstream, the splits, is built
    run(["dvc", "repro", "-q", "--single-item", dvc_stage_name(finetune_stage("long", "base").name)], tmp_path)
    weights["dvc repro"] = built()
    assert len(set(weights.values())) == 1, weights
    assert cfg.params.finetune.train.num_threads == 0  # the count is bertpipe.infra.cores's, not a setting
