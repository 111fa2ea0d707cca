"""Serving speed and quality of one finetuned model as torch fp32 eager (the baseline), ONNX Runtime fp32, ONNX Runtime
int8 (dynamic quantization), and its distilled student (torch and int8), at batch 1 and batch 32 — one run, the same
test examples, calls interleaved so load changes hit every backend alike.

    .venv/bin/python bench/bench_export.py [--threads 1] [--layers 4] [--hidden 256] [--rounds 20]
    .venv/bin/python bench/bench_export.py --project . --task sentiment     # a real run's outputs (work/...)

With --project DIR holding a params.yaml it benchmarks that project's outputs (running what is missing); with an
empty or new DIR it builds the synthetic project there and keeps it for reruns; without --project it builds a
throwaway one (a random-init BERT teacher of --layers x --hidden finetuned on a
learnable synthetic classification task, then the distill and export stages, all through the real stage code).
Prints p50/p99 latency per batch, examples/s, size and test quality per backend, and ratios against torch fp32.
Threads: one by default. On a machine shared beyond its cores, torch's OpenMP pool collapses with 2+ threads (its
workers spin at barriers while preempted: a 4x256 forward went from 27 ms to 475 ms at 2 threads under load 16) and
onnxruntime's pool much less, so multi-thread figures there measure the contention, not the backends.
Targets: int8 >= 2x torch fp32 examples/s at batch 32 with <= 1 point quality loss; student >= 2x teacher
at >= 95% of its primary metric.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
from collections import Counter
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertpipe.graph.pipeline import load_config  # noqa: E402
from tests import synthetic as S  # noqa: E402
from bertpipe.core.stage import run_stage  # noqa: E402
from bertpipe.graph.pipeline import all_stages  # noqa: E402
from bertpipe.lib.inference.backends import INT8_FILE, ONNX_FILE, OrtModel, load_torch  # noqa: E402
from bertpipe.lib.inference.speed import batched, dir_size, time_calls  # noqa: E402

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def synthetic_project(root: Path, layers: int, hidden: int, n: int, epochs: float) -> Path:
    """Review-length texts (40-120 characters) whose class keyword sits anywhere: learnable, not trivially short."""
    tok = REPO / ".bertpipe" / "test-raw" / "bert-base-chinese"
    if not tok.is_dir():
        from bertpipe.lib.samples import DEFAULT_SAMPLES, fetch_samples

        fetch_samples(REPO / ".bertpipe" / "test-raw", REPO / ".bertpipe", DEFAULT_SAMPLES, log=lambda *_: None)
    S.tiny_encoder(root / "work" / "pretrain" / "model", tok, layers=layers, hidden=hidden)
    rng = random.Random(0)
    rows = []
    for i in range(n):
        lab = "pos" if i % 2 else "neg"
        body = "".join(rng.choice(S.FILLER) for _ in range(rng.randint(40, 120)))
        k = rng.randrange(len(body))
        rows.append({"id": i, "text": body[:k] + S.KEYS[lab] + body[k:], "label": lab})
    S.write_jsonl(root / "cls.jsonl", rows)
    (root / "work" / "evaluate").mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: work/pretrain/model}}
finetune:
  encoders: [adapted]
  train: {{lr: 5.0e-4, epochs: {epochs}, batch_size: 32, max_seq_len: 128, seeds: [1], warmup_ratio: 0.1,
          early_stopping: {{patience: 0}}, precision: fp32}}
  search: {{trials: 0}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
distill: {{ratio: 0.5, alpha: 0.7, temperature: 2.0}}
register: {{register_encoder: false}}
""",
        encoding="utf-8",
    )
    return root


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--examples", type=int, default=1200)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--project", default="", help="a project dir (its work/ outputs are reused), or where to keep one")
    ap.add_argument("--task", default="cls")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tmp = None
    if args.project and (Path(args.project) / "params.yaml").is_file():
        root = Path(args.project).resolve()  # a real project, or a synthetic one kept from an earlier run
    else:
        if not args.project:
            tmp = tempfile.TemporaryDirectory()
        root = Path(args.project or tmp.name).resolve()
        synthetic_project(root, args.layers, args.hidden, args.examples, args.epochs)
    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    task = args.task
    for name in (f"finetune/{task}/adapted", f"distill/{task}", f"export/{task}", f"export/{task}-student"):
        run_stage(stages[name], cfg, tracker_factory=NO_TRACKING)

    from transformers import AutoTokenizer

    from bertpipe.lib.labelled import model_labels, task_examples, task_settings
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.predict import run_model

    teacher_dir = root / "work" / "finetune" / task / "adapted" / "model"
    student_dir = root / "work" / "distill" / task / "model"
    exp_t, exp_s = root / "work" / "export" / task, root / "work" / "export" / f"{task}-student"
    p, tp = task_settings(cfg, task)
    tok = AutoTokenizer.from_pretrained(str(teacher_dir))
    exs = task_examples(cfg, task)["test"]
    labels = model_labels(teacher_dir)
    feats = featurize(tok, exs, p, tp, {lab: i for i, lab in enumerate(labels)}, Counter(), "test").feats
    pad = tok.pad_token_id or 0
    models = {
        "torch fp32": (load_torch(teacher_dir), dir_size(teacher_dir)),
        "ort fp32": (OrtModel(exp_t / ONNX_FILE), dir_size(exp_t / ONNX_FILE)),
        "ort int8": (OrtModel(exp_t / INT8_FILE), dir_size(exp_t / INT8_FILE)),
        "student torch": (load_torch(student_dir), dir_size(student_dir)),
        "student int8": (OrtModel(exp_s / INT8_FILE), dir_size(exp_s / INT8_FILE)),
    }
    ct = json.loads((exp_t / "checks.json").read_text())
    cs = json.loads((exp_s / "checks.json").read_text())
    primary = ct["primary"]
    quality = {"torch fp32": ct["quality"]["torch"], "ort fp32": ct["quality"]["onnx"],
               "ort int8": ct["quality"]["int8"], "student torch": cs["quality"]["torch"],
               "student int8": cs["quality"]["int8"]}
    load = os.getloadavg()[0]
    tc, sc = models["torch fp32"][0].config, models["student torch"][0].config
    print(f"teacher {tc.num_hidden_layers}x{tc.hidden_size}, student {sc.num_hidden_layers}x{sc.hidden_size}; "
          f"{len(exs)} test examples, {args.threads} threads, load average {load:.2f}")
    for bs in (1, 32):
        chunks = batched(feats, bs)[: args.rounds if bs == 1 else max(2, args.rounds // 4)]
        calls = {name: (lambda c, m=m: len(run_model(m, c, pad, bs, False))) for name, (m, _) in models.items()}
        res = time_calls(calls, chunks, rounds=3)
        base = res["torch fp32"]["examples_per_s"]
        print(f"\nbatch {bs}  ({len(chunks)} batches x 3 rounds, interleaved)")
        print(f"{'backend':14s} {'p50 ms':>8s} {'p99 ms':>8s} {'ex/s':>9s} {'x torch':>8s} {'size MB':>8s} "
              f"{'test ' + primary:>14s}")
        for name, r in res.items():
            print(f"{name:14s} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['examples_per_s']:9.1f} "
                  f"{r['examples_per_s'] / base:8.2f} {models[name][1] / 1e6:8.2f} "
                  f"{quality[name].get(primary, float('nan')):14.4f}")
    t, s = quality["torch fp32"][primary], quality["ort int8"][primary]
    print(f"\nint8 quality loss: {100 * (t - s):+.2f} points; student at "
          f"{quality['student torch'][primary] / t if t else float('nan'):.1%} of the teacher's {primary}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
