"""Finetuning throughput on a tiny BERT: length-bucketed batches vs plain shuffled batches (the baseline), and bf16
autocast vs fp32, measured in the same run on the same data.

    .venv/bin/python bench/bench_finetune.py [--threads 2] [--steps 30]

Prints examples/s for each variant and the ratio against the baseline.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bertpipe.finetune import heads as H  # noqa: E402
from bertpipe.finetune import train as TR  # noqa: E402
from bertpipe.finetune.data import Example  # noqa: E402
from bertpipe.finetune.params import TaskParams, TrainParams  # noqa: E402
from bertpipe.finetune.synthetic import FILLER, tiny_encoder  # noqa: E402


def _examples(n: int, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)  # review-like lengths: mostly short, a long tail
    return [Example(id=str(i), text="".join(rng.choice(FILLER) for _ in range(min(250, int(rng.expovariate(1 / 60)) + 5))),
                    label="ab"[i % 2]) for i in range(n)]


def _run(model, feats, order: list[list[int]], pad: int, bf16: bool, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()
    seen = 0
    start = time.perf_counter()
    for idx in order[:steps]:
        batch = TR.collate([feats[i] for i in idx], pad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**batch).loss
        loss.float().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += len(idx)
    return seen / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        enc = tiny_encoder(Path(tmp) / "enc", REPO / "data" / "raw" / "bert-base-chinese", layers=2, hidden=128)
        tok = AutoTokenizer.from_pretrained(str(enc))
        exs = _examples(args.batch * args.steps)
        p = TaskParams(type="classification", format="jsonl", train="x")
        feats = H.featurize(tok, exs, p, TrainParams(max_seq_len=256), {"a": 0, "b": 1}, Counter(), "train").feats
        rng = random.Random(0)
        plain = list(range(len(feats)))
        rng.shuffle(plain)
        plain_batches = [plain[i : i + args.batch] for i in range(0, len(plain), args.batch)]
        bucketed = TR.batches(feats, args.batch, random.Random(0))
        pad = tok.pad_token_id
        variants = [
            ("fp32, shuffled batches (baseline)", plain_batches, False),
            ("fp32, length-bucketed batches", bucketed, False),
            ("bf16 autocast, length-bucketed", bucketed, True),
        ]
        print(f"threads={args.threads} steps={args.steps} batch={args.batch} "
              f"cpu bf16 supported: {TR.bf16_ok(torch.device('cpu'))}")
        base = None
        for name, order, bf16 in variants:
            torch.manual_seed(0)
            model = H.load_model("classification", enc, ["a", "b"])
            _run(model, feats, order, pad, bf16, 2)  # warm-up
            rate = _run(model, feats, order, pad, bf16, args.steps)
            base = base or rate
            print(f"{name:38s} {rate:8.1f} examples/s   x{rate / base:.2f}")


if __name__ == "__main__":
    main()
