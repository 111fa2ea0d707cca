"""Reliability: a run killed with SIGKILL resumes from its last complete checkpoint and ends where an uninterrupted
run ends; two gloo processes under torchrun train on different data and save what rank 0 holds.

The killed run and the ranks are processes of their own (a signal, torchrun); the other runs call the same launcher
in this process (tests/torchrun_door.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForMaskedLM

from bertpipe.lib.mlm.train import state_digest
from tests.e2e_project import start
from tests.torchrun_door import launch_here
from tests.test_pretrain_support import TINY_ARCH, law_texts, write_corpus, write_params

REPO = Path(__file__).resolve().parents[1]
MODULE, ARGS = "bertpipe.doors.cli.torchrun", ["--stage", "base", "--no-tracking", "--params"]
RUN = [sys.executable, "-m", MODULE, *ARGS]
SETTINGS = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true"}
ENV = {**os.environ, **SETTINGS}


def _setup(root: Path, raw: Path, tokenizer: Path, **base) -> Path:
    # 220 training documents: ~500 segments of 64, more than either test trains on (30 x 8; 6 x 2 x 2 x 8), so no
    # example is seen twice; 60 held-out ones fill the 32 eval examples
    texts = law_texts(raw, 280)
    write_corpus(root / "work" / "prepare" / "general", texts[:220], texts[220:])
    settings = {"arch": TINY_ARCH, "max_seq_len": 64, "batch_size": 8, "lr": 2e-3, "eval_examples": 32,
                "output": "last", **base}
    return write_params(root, {"base": "scratch", "tokenizer": str(tokenizer), "language": "zh"}, base=settings)


@pytest.fixture
def launch(capfd):
    """``launch(*args, **variables)``: ``RUN`` in this process (``launch_here``) with ``SETTINGS`` and ``variables``."""
    return lambda *args, **variables: launch_here([*ARGS, *args], {**SETTINGS, **variables}, capfd)


@pytest.mark.slow
def test_sigkill_then_rerun_resumes_and_matches(tmp_path, sample_raw, zh_tokenizer_dir, launch):
    steps = {"max_steps": 30, "save_every": 5, "eval_every": 20, "log_every": 5}
    whole = _setup(tmp_path / "whole", sample_raw, zh_tokenizer_dir, **steps)
    killed = _setup(tmp_path / "killed", sample_raw, zh_tokenizer_dir, **steps)
    assert launch(whole).returncode == 0

    proc = start(RUN + [str(killed)], REPO, ENV)
    scratch = tmp_path / "killed" / "state" / "scratch"
    deadline = time.time() + 300
    while time.time() < deadline and not list(scratch.glob("base-*/last.pt")):
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.02)
    time.sleep(0.3)  # let it get a few steps past the checkpoint, so those steps are lost and replayed
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    out = tmp_path / "killed" / "work" / "base"
    assert not (out / "manifest.json").exists()
    ck = torch.load(next(scratch.glob("base-*/last.pt")), weights_only=True)  # tensors and plain values only
    assert 0 < ck["state"]["step"] < 30

    r = launch(killed)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "resuming from checkpoint at step" in r.stderr
    a = json.loads((tmp_path / "whole" / "work" / "base" / "metrics.json").read_text())
    b = json.loads((out / "metrics.json").read_text())
    assert b["resumed_from_step"] == ck["state"]["step"] and a["resumed_from_step"] == 0
    assert abs(a["eval_loss"] - b["eval_loss"]) < 1e-3, (a["eval_loss"], b["eval_loss"])
    la = [h["loss"] for h in a["history"] if "loss" in h]
    lb = [h["loss"] for h in b["history"] if "loss" in h]
    assert len(la) == len(lb) and max(abs(x - y) for x, y in zip(la, lb)) < 1e-3
    assert not list(scratch.glob("base-*"))  # scratch is removed once the stage succeeds
    # the restart read the token store the killed run built, it did not tokenize again
    stores = json.loads((out / "manifest.json").read_text())["counts"]["token_store"]
    assert not stores["train"]["built"] and not stores["valid"]["built"], stores
    assert "token store train: reused" in r.stderr and "token store train: built" not in r.stderr
    built = sorted(p.name for p in (tmp_path / "killed" / "state" / "tokstore").iterdir() if p.is_dir())
    assert built == sorted([stores["train"]["key"], stores["valid"]["key"]])
    # a rerun with other training params (more steps) reuses it too
    r = launch(killed, "--set", "base.max_steps=2")
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((out / "manifest.json").read_text())
    assert again["metrics"]["steps"] == 2 and again["counts"]["token_store"] == stores


@pytest.mark.slow
def test_two_gloo_processes(tmp_path, sample_raw, zh_tokenizer_dir, launch):
    """`base.nproc: 2` through the stage launcher (no torchrun typed): it relaunches itself under torchrun, and the
    two gloo ranks train on different examples, stay identical, and save what rank 0 holds."""
    params = _setup(tmp_path, sample_raw, zh_tokenizer_dir, max_steps=6, eval_every=3, save_every=3, log_every=3,
                    grad_accum=2)
    trace = tmp_path / "trace"
    r = launch(params, "--set", "base.nproc=2", BERTPIPE_PRETRAIN_TRACE=str(trace))  # the ranks write the trace
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--nproc_per_node=2" in r.stderr and "base: built" in r.stdout
    ranks = [json.loads((trace / f"rank{i}.json").read_text()) for i in (0, 1)]
    assert [t["world"] for t in ranks] == [2, 2]
    seen = [{x for b in t["batches"] for x in b} for t in ranks]
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 12  # 6 steps x 2 micro-batches
    assert len(seen[0] & seen[1]) < 0.2 * len(seen[0]), "the two ranks trained on the same examples"
    assert ranks[0]["digest"] == ranks[1]["digest"]  # DDP kept the replicas identical
    out = tmp_path / "work" / "base"
    saved = AutoModelForMaskedLM.from_pretrained(out / "model")
    assert state_digest(saved) == ranks[0]["digest"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["processes"] == 2
    assert manifest["counts"]["precision"] in ("fp32", "bf16") and manifest["counts"]["precision_reason"]
    # both ranks read one token store per split: one rank built it while the other waited on its lock
    assert r.stderr.count("token store train: built") == 1 and r.stderr.count("token store train: reused") == 1
    assert len([p for p in (tmp_path / "state" / "tokstore").iterdir() if p.is_dir()]) == 2
    assert not list(tmp_path.glob("work/.base.tmp-*"))
