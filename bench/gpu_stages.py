"""The GPU check's stage section: the real `bertpipe` stage commands, one process each, on a tiny project.

    python bench/gpu_stages.py [--smoke] [--device auto] [--json out.json]   # or as part of bench/gpu_check.sh

It builds a project in a temp dir from nothing the GPU machine lacks (no corpus or tokenizer download): a WordPiece
tokenizer over the characters of ``tests.synthetic``'s texts, a randomly initialised BERT saved with it
(``model.base``: that save_pretrained dir), a synthetic domain corpus and a keyword classification task; then runs
``python -m bertpipe splits|prepare|start|vocab|pretrain|finetune`` with ``tracking.uri: none`` (no MLflow) and
reports each stage's wall time, pretrain's tokens/s and finetune's examples/s (from their manifests) and the device,
precision and attention kernel each stage says it used. A stage that fails ends the section with its last output lines.

Beyond torch and transformers (and their numpy, pyyaml, filelock, ...) the stage commands import pydantic, typer,
jieba (vocab mining; pretraining's whole-word masking), pyarrow, pandas, matplotlib and scikit-learn (found with the
imports of each stage command logged and MLflow and Prefect made unimportable). bench/gpu_check.sh installs the
first three from bench/wheels when missing; the others are too big to carry. ``missing()`` lists what is not
importable, and the section is skipped, with one line naming it, when anything is.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STAGES = ("splits", "prepare", "start", "vocab", "pretrain", "finetune")
# What `python -m bertpipe <stage>` imports for these stages beyond torch and transformers (module names)
NEEDS = ("pydantic", "typer", "jieba", "yaml", "numpy", "filelock", "pyarrow", "pandas", "matplotlib", "sklearn")
SPECIAL = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 10)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCT = list("。，！？；：、") + list(".,!?;:")  # prepare's NFKC turns the full-width ones into these


def say(line: str) -> None:
    print(line, flush=True)


def missing() -> list[str]:
    return [m for m in NEEDS if importlib.util.find_spec(m) is None]


def shapes(smoke: bool) -> dict:
    if smoke:
        return {"layers": 1, "hidden": 32, "heads": 2, "docs": 240, "doc_chars": 60, "examples": 160, "steps": 4,
                "batch": 4, "seq": 64, "ft_batch": 16, "ft_seq": 32, "top_k": 20}
    # BERT-base width and depth; corpus and task sized so the six stages take a minute or two on one GPU
    return {"layers": 12, "hidden": 768, "heads": 12, "docs": 6000, "doc_chars": 300, "examples": 8000, "steps": 300,
            "batch": 64, "seq": 128, "ft_batch": 64, "ft_seq": 64, "top_k": 200}


def tokenizer(out: Path) -> Path:
    """A real BertTokenizerFast (WordPiece, BERT's special ids) over the characters the synthetic texts use."""
    from transformers import BertTokenizerFast

    from tests.synthetic import FILLER, KEYS

    chars = list(dict.fromkeys(FILLER + list(KEYS.values()) + PUNCT + list("0123456789abcdefghijklmnopqrstuvwxyz")))
    vocab = SPECIAL + chars + [f"##{c}" for c in chars]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}, tokenize_chinese_chars=True)
    tok.save_pretrained(out)
    return out


def corpus(n: int, chars: int, seed: int = 0) -> list[dict]:
    """Domain documents of recurring two- to four-character "words" (so vocab mining finds some) in sentences."""
    from tests.synthetic import FILLER

    rng = random.Random(seed)
    words = ["".join(rng.choice(FILLER) for _ in range(rng.randint(2, 4))) for _ in range(300)]
    docs = []
    for i in range(n):
        text = ""
        while len(text) < chars:
            text += "".join(rng.choice(words) for _ in range(rng.randint(3, 8))) + rng.choice(PUNCT[:2])
        docs.append({"id": f"d{i}", "text": text, "group": f"g{i // 4}"})
    return docs


def write_project(root: Path, s: dict, device: str) -> Path:
    import yaml

    from tests.synthetic import keyword_classification, tiny_encoder, write_jsonl

    # a randomly initialised BERT with an MLM head of the section's shape, saved with its tokenizer
    enc = tiny_encoder(root / "base", tokenizer(root / "tokenizer"), layers=s["layers"], hidden=s["hidden"],
                       heads=s["heads"], intermediate=4 * s["hidden"])
    write_jsonl(root / "domain.jsonl", corpus(s["docs"], s["doc_chars"]))
    write_jsonl(root / "task.jsonl", keyword_classification(s["examples"], seed=1))
    params = {
        "paths": {"raw": "raw", "work": "work", "state": ".bertpipe"},
        "model": {"base": str(enc), "language": "zh"},
        "tracking": {"uri": "none"},
        "prepare": {"domain": {"sources": [{"path": "domain.jsonl", "format": "jsonl", "id_field": "id",
                                            "group_field": "group", "name": "domain"}]},
                    "general": {"enabled": False}, "split": {"valid": 0.1, "test": 0.0}},
        "vocab": {"top_k": s["top_k"], "min_freq": 2, "head_fit_steps": 0, "eval_texts": 16},
        "pretrain": {"max_steps": s["steps"], "batch_size": s["batch"], "max_seq_len": s["seq"],
                     "eval_every": s["steps"], "save_every": s["steps"], "log_every": max(1, s["steps"] // 6),
                     "eval_examples": 4 * s["batch"], "fill_mask_samples": 2, "compile": "off"},
        "finetune": {"encoders": ["adapted"],
                     "train": {"epochs": 1, "batch_size": s["ft_batch"], "max_seq_len": s["ft_seq"], "seeds": [1],
                               "device": device, "compile": "off"},
                     "search": {"trials": 0},
                     "tasks": {"keyword": {"type": "classification", "format": "jsonl", "train": "task.jsonl"}}},
        "register": {"register_encoder": False},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return root / "params.yaml"


def manifest(path: Path) -> dict:
    from bertpipe.core.outputs import read_manifest

    return read_manifest(path) or {}


def stage_report(stage: str, root: Path, seconds: float) -> dict:
    """What one stage says about its run: wall time, rate, and the device/precision from its manifest."""
    work = root / "work"
    out = {"seconds": round(seconds, 2)}
    if stage == "pretrain":
        m = manifest(work / "pretrain")
        out.update(tokens_per_s=m.get("metrics", {}).get("tokens_per_s"), steps=m.get("metrics", {}).get("steps"),
                   attention=m.get("counts", {}).get("attention"))
    elif stage == "finetune":
        m = manifest(work / "finetune" / "keyword" / "adapted")
        metrics = json.loads((work / "finetune" / "keyword" / "adapted" / "metrics.json").read_text())
        run = next(iter(metrics["per_seed"].values()))
        n = metrics["counts"].get("train_examples")  # one epoch
        out.update(train_seconds=run["train_seconds"], test_accuracy=run["test"].get("accuracy"), train_examples=n,
                   examples_per_s=(n / run["train_seconds"]) if n and run["train_seconds"] else None,
                   attention=run.get("attention"))
    else:
        m = manifest(work / stage)
    counts = m.get("counts", {})
    if "precision" in counts:
        out["precision"] = counts["precision"]
        out["device"] = counts.get("precision_reason")
    return out


def run_stages(root: Path, log=say) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "BERTPIPE_ROOT": str(root)}
    results: dict = {}
    for stage in STAGES:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "bertpipe", stage, "--params", "params.yaml"], cwd=root,
                           env=env, capture_output=True, text=True)
        secs = time.perf_counter() - t
        if r.returncode != 0:
            tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
            results[stage] = {"failed": r.returncode, "seconds": round(secs, 2), "output": tail}
            log(f"stage {stage}: FAILED (exit {r.returncode}) after {secs:.1f} s:\n    " + "\n    ".join(tail))
            break
        results[stage] = rep = stage_report(stage, root, secs)
        rate = (f", {rep['tokens_per_s']:.0f} tokens/s" if rep.get("tokens_per_s") else "") + (
            f", {rep['examples_per_s']:.0f} examples/s (train), test accuracy {rep['test_accuracy']:.3f}"
            if rep.get("examples_per_s") else "")
        where = f"; {rep['device']}" if rep.get("device") else ""
        log(f"stage {stage}: {secs:.1f} s{rate}{where}")
    return results


def section(smoke: bool, device: str, log=say) -> dict:
    """The stage section of the GPU check: {stage: report}, or {"skipped": why}."""
    lacking = missing()
    if lacking:
        why = f"{', '.join(lacking)} not importable (bench/gpu_check.sh installs them from bench/wheels)"
        log(f"stages skipped: {why}")
        return {"skipped": why}
    s = shapes(smoke)
    with tempfile.TemporaryDirectory(prefix="bertpipe-gpu-stages-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        write_project(root, s, device)
        log(f"stages: a tiny project ({s['layers']}L/{s['hidden']}H encoder, {s['docs']} domain documents, "
            f"{s['examples']} task examples) written in {time.perf_counter() - t:.1f} s; tracking off")
        res = run_stages(root, log=log)
        res["mlflow_db_created"] = (root / ".bertpipe" / "mlflow.db").exists()  # tracking off: False
    return res


def failed(res: dict) -> bool:
    """Whether a stage of the section failed (a skipped section is no failure: it says what is missing)."""
    return any(isinstance(v, dict) and "failed" in v for v in res.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (what CI runs, on the CPU)")
    ap.add_argument("--device", default="auto", help="finetune.train.device (pretrain takes the GPU when there is one)")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    res = section(a.smoke, a.device)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 1 if failed(res) or "skipped" in res else 0


if __name__ == "__main__":
    sys.exit(main())
