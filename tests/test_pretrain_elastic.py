"""Two torchrun agents on this machine as two "nodes" (gloo, a c10d rendezvous on 127.0.0.1, one process each) run
the documented multi-node command; one rank is SIGKILLed after a checkpoint, the elastic agents restart the group,
it resumes from the checkpoint, and the stage's output equals a one-process run with the same effective batch (that
reference calls the same launcher in the test process: tests/torchrun_door.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.test_pretrain_support import TINY_ARCH, law_texts, write_corpus, write_params
from tests.torchrun_door import launch_here

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "distributed.md"
MARK = "<!-- tests/test_pretrain_elastic.py runs this block -->"
STEPS = {"max_steps": 30, "save_every": 5, "eval_every": 30, "log_every": 5}
SETTINGS = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true", "BERTPIPE_DATA_WORKERS": "1"}
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
ENV.update(SETTINGS, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           # a collective waiting for a rank that is gone fails after this, not torch's 30 minutes
           BERTPIPE_DIST_TIMEOUT_S="120")


def documented_command() -> str:
    """The multi-node command of docs/distributed.md, the code block after ``MARK``."""
    after = DOC.read_text(encoding="utf-8").split(MARK, 1)[1]
    return after.split("```bash\n", 1)[1].split("```", 1)[0]


def _project(root: Path, raw: Path, tokenizer: Path, **pretrain) -> Path:
    """A project whose `pretrain` stage continues a tiny BERT (work/vocab/model) on real law texts."""
    from bertpipe.lib.mlm import model
    from bertpipe.lib.mlm.params import ArchParams

    texts = law_texts(raw, 300)
    write_corpus(root / "work" / "prepare" / "domain", texts[:260], texts[260:])
    tok = model.load_tokenizer(tokenizer)
    torch.manual_seed(0)
    mlm = model.from_scratch(tok, ArchParams(**TINY_ARCH), 64)
    mlm.save_pretrained(root / "work" / "vocab" / "model")
    tok.save_pretrained(root / "work" / "vocab" / "model")
    settings = {"max_seq_len": 64, "batch_size": 8, "lr": 2e-3, "eval_examples": 32, "output": "last", **STEPS,
                **pretrain}
    return write_params(root, {"base": "scratch", "tokenizer": str(tokenizer), "language": "zh"}, pretrain=settings)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(agents: list[subprocess.Popen], rank: int) -> psutil.Process | None:
    """The worker process a torchrun agent started with RANK=``rank`` (not a child of that worker, which inherits
    its environment), if it is up."""
    for a in agents:
        try:
            procs = psutil.Process(a.pid).children(recursive=True)
        except psutil.Error:
            continue
        for c in procs:
            try:
                env, parent = c.environ(), c.parent()
                if env.get("RANK") == str(rank) and parent is not None and "LOCAL_RANK" not in parent.environ():
                    return c
            except psutil.Error:
                continue
    return None


@pytest.mark.slow
def test_two_nodes_survive_a_killed_rank_and_match_one_process(tmp_path, sample_raw, zh_tokenizer_dir, capfd):
    one, two = tmp_path / "one", tmp_path / "two"
    _project(two, sample_raw, zh_tokenizer_dir)
    # The reference: one process, the same effective batch (8 x 2 accumulation x 1 = 8 x 1 x 2 processes)
    ref = launch_here(["--stage", "pretrain", "--no-tracking", "--params", _project(one, sample_raw, zh_tokenizer_dir,
                                                                                     grad_accum=2)], SETTINGS, capfd)
    assert ref.returncode == 0, ref.stderr[-3000:]
    command = documented_command()
    env = {**ENV, "MASTER": "127.0.0.1", "PORT": str(_free_port())}
    logs = [tmp_path / f"agent{i}.log" for i in (0, 1)]
    agents = [subprocess.Popen(["bash", "-c", command], cwd=two, env=env, stdout=open(log, "w"),
                               stderr=subprocess.STDOUT, start_new_session=True) for log in logs]
    try:
        scratch = two / "state" / "scratch"
        deadline = time.time() + 400
        victim = None
        while time.time() < deadline and not list(scratch.glob("pretrain-*/last.pt")):
            assert all(a.poll() is None for a in agents), "an agent ended before a checkpoint"
            victim = victim or _worker(agents, 0)
            time.sleep(0.02)
        victim = victim or _worker(agents, 0)
        assert victim is not None and victim.is_running(), "no rank-0 worker to kill"
        # rank 0: it holds the output lock, the temp output dir and the MLflow run
        victim.send_signal(signal.SIGKILL)
        for a in agents:
            a.wait(timeout=400)
    finally:
        for p in agents:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    text = "\n".join(log.read_text(errors="replace") for log in logs)
    assert [a.returncode for a in agents] == [0, 0], text[-4000:]

    manifest = json.loads((two / "work" / "pretrain" / "manifest.json").read_text())
    m = manifest["metrics"]
    assert manifest["counts"]["processes"] == 2
    assert m["restarts"] == manifest["counts"]["restarts"] == 1
    resumed = m["resumed_from_step"]
    assert 0 < resumed < STEPS["max_steps"] and resumed % STEPS["save_every"] == 0, resumed
    assert f"resuming from checkpoint at step {resumed}" in text
    assert "restarted 1 time(s)" in (two / "work" / "pretrain" / "report.md").read_text()

    # The restarted job ends where one process ends, within the resume test's tolerance; the weights too.
    a = json.loads((one / "work" / "pretrain" / "metrics.json").read_text())
    b = json.loads((two / "work" / "pretrain" / "metrics.json").read_text())
    assert a["restarts"] == 0 and a["resumed_from_step"] == 0
    assert abs(a["eval_loss"] - b["eval_loss"]) < 1e-3, (a["eval_loss"], b["eval_loss"])
    la = [h["loss"] for h in a["history"] if "loss" in h]
    lb = [h["loss"] for h in b["history"] if "loss" in h]
    assert len(la) == len(lb) == 6 and max(abs(x - y) for x, y in zip(la, lb)) < 1e-3, (la, lb)
    from safetensors.torch import load_file

    wa, wb = (load_file(p / "work" / "pretrain" / "model" / "model.safetensors") for p in (one, two))
    assert wa.keys() == wb.keys() and all(torch.allclose(wa[k], wb[k], atol=1e-4) for k in wa)

    # MLflow: the stage's run says it restarted and where it resumed; the killed attempt's run is closed as KILLED
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client

    c = client(load_config(str(two / "params.yaml")))
    run = c.get_run(manifest["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["restarts"] == 1 and run.data.metrics["resumed_from_step"] == resumed
    runs = c.search_runs([run.info.experiment_id], "tags.`bertpipe.stage` = 'pretrain'")
    assert sorted(r.info.status for r in runs) == ["FINISHED", "KILLED"]
    assert not list(two.glob("work/.pretrain.tmp-*")) and not list(scratch.glob("pretrain-*"))
