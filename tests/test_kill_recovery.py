"""Kill `bertpipe prepare`, `pretrain` and `register` with SIGKILL and SIGTERM at seeded-random points, then run them
normally: the outputs (fingerprints, data, eval loss) and the registry equal an uninterrupted run's, no temp dir is
left under work/, and no MLflow run of the project is left RUNNING."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from bertpipe.stage import write_json
from tests.e2e_project import env_for, run, write_project

SEED = 15


def make_project(root: Path, raw: Path, enc: Path, tok: Path) -> Path:
    write_project(root, raw, {
        "model": {"base": str(enc), "continue_from": str(enc), "tokenizer": str(tok)},
        "pretrain": {"arch": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 128},
                     "max_steps": 24, "save_every": 4, "eval_every": 12, "log_every": 4, "max_seq_len": 64,
                     "batch_size": 8, "eval_examples": 32, "output": "last", "fill_mask_samples": 2, "threads": 1},
        "finetune": {"encoders": ["adapted"], "tasks": {"sentiment": {
            "type": "classification", "format": "jsonl", "train": "sentiment.jsonl"}}},
        "register": {"register_encoder": False},
        "distill": {"enabled": False}, "export": {"enabled": False},  # register's own inputs only
    })
    (root / "sentiment.jsonl").write_text("".join(
        json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n"
        for t, lab in [("很好", "pos"), ("太差", "neg"), ("不错", "pos"), ("糟糕", "neg")]), encoding="utf-8")
    return root


def fake_finetune(root: Path, tok: Path) -> None:
    """What register reads from finetune/evaluate, made directly (those stages are not what is tested here)."""
    from tests.test_register import tiny_classifier

    ft = root / "work" / "finetune" / "sentiment" / "adapted"
    tiny_classifier(ft / "model", tok, seed=1)
    stat = {"mean": 0.75, "std": 0.0, "values": [0.75]}
    write_json(ft / "metrics.json", {"primary": "accuracy", "summary": {"test": {"accuracy": stat}},
                                     "per_seed": {"1": {"test": {"accuracy": 0.75}, "saved": True}}})
    files = sorted(str(p.relative_to(ft)) for p in ft.rglob("*") if p.is_file())
    write_json(ft / "manifest.json", {"fingerprint": "ft-fixed", "inputs": {"train": {"digest": "same"}},
                                      "params": {"finetune.tasks.sentiment": {
                                          "type": "classification", "format": "jsonl", "train": "sentiment.jsonl"}},
                                      "files": files})
    (root / "work" / "evaluate").mkdir(parents=True, exist_ok=True)


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def outcome(root: Path) -> dict:
    """What must match an uninterrupted run: fingerprints, the prepared data, pretrain's loss, the registry."""
    work = root / "work"
    m = {s: json.loads((work / s / "manifest.json").read_text()) for s in ("prepare", "pretrain", "register")}
    reg = json.loads((work / "register" / "registry.json").read_text())
    return {
        "fingerprints": {s: v["fingerprint"] for s, v in m.items()},
        "prepare": {str(p.relative_to(work)): digest(p) for p in sorted((work / "prepare").rglob("*.parquet"))},
        "eval_loss": round(m["pretrain"]["metrics"]["eval_loss"], 3),
        "registry": [{k: r.get(k) for k in ("name", "version", "promoted", "aliases", "metric", "value")}
                     for r in reg["models"]],
    }


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "work").rglob(".*") if ".tmp-" in p.name or
                  ".old-" in p.name)


def interrupt(root: Path, stage: str, sig: int, delay: float) -> str:
    """Start `bertpipe <stage>`, send ``sig`` ``delay`` s after it starts building; what happened, in words."""
    proc = subprocess.Popen(["bertpipe", stage], cwd=root, env=env_for(root), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    building = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)
            if f"[{stage}] building" in line:
                building.set()

    t = threading.Thread(target=read, daemon=True)
    t.start()
    deadline = time.time() + 600
    while not building.wait(0.05) and proc.poll() is None and time.time() < deadline:
        pass
    if not building.is_set() or proc.poll() is not None:
        proc.wait()
        t.join()
        return f"finished before the signal (rc {proc.returncode})"
    time.sleep(delay)
    if proc.poll() is not None:
        t.join()
        return f"finished before the signal (rc {proc.returncode})"
    proc.send_signal(sig)
    rc = proc.wait(600)
    t.join()
    err = "".join(lines)
    if sig == signal.SIGTERM and rc != 0:
        errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert rc == 143 and "Traceback" not in err and len(errors) == 1, (rc, err[-3000:])
        assert leftovers(root) == [], "SIGTERM left temp dirs behind"
    return f"{signal.Signals(sig).name} after {delay:.2f}s: rc {rc}"


@pytest.mark.slow
def test_killed_stages_recover_to_the_uninterrupted_result(tmp_path, sample_raw, zh_tokenizer_dir):
    from bertpipe.finetune.synthetic import tiny_encoder

    enc = tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    whole = make_project(tmp_path / "whole", sample_raw, enc, zh_tokenizer_dir)
    killed = make_project(tmp_path / "killed", sample_raw, enc, zh_tokenizer_dir)
    for root in (whole, killed):
        fake_finetune(root, zh_tokenizer_dir)

    # tasks (the splits prepare keeps out of the corpora) and vocab (where pretraining continues from) run plainly.
    for stage in ("tasks", "prepare", "start", "vocab", "pretrain", "register"):
        run(["bertpipe", stage], whole)
    run(["bertpipe", "tasks"], killed)

    rng = random.Random(SEED)
    log = []
    for stage, window in (("prepare", 4.0), ("pretrain", 6.0), ("register", 8.0)):
        for sig in rng.sample([signal.SIGKILL, signal.SIGTERM, signal.SIGKILL], 3):
            log.append(f"{stage}: {interrupt(killed, stage, sig, rng.uniform(0.0, window))}")
        run(["bertpipe", stage], killed)
        if stage == "prepare":
            run(["bertpipe", "start"], killed)  # where pretraining starts: vocab reads its start.json
            run(["bertpipe", "vocab"], killed)
    print("\n".join(log))

    assert outcome(killed) == outcome(whole), "\n".join(log)
    assert leftovers(killed) == [], log
    assert not list((killed / ".bertpipe" / "open-runs").glob("*.json"))

    from bertpipe.config import load_config
    from bertpipe.tracking import client, experiment_id

    cfg = load_config(killed / "params.yaml")
    c = client(cfg)
    running = c.search_runs([experiment_id(cfg, c)], filter_string="attributes.status = 'RUNNING'")
    assert running == [], [(r.info.run_name, r.data.tags.get("bertpipe.pid")) for r in running]
    versions = c.search_model_versions("name = 'bertpipe-sentiment'")
    assert len(versions) == 1, "a killed register left an extra version behind"
