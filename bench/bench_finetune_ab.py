"""Interleaved A/Bs of finetune execution choices in one process: each variant runs over the same examples, in
alternating order, for several rounds; the medians are what to compare on a shared machine (the load drifts
between sequential runs, less between neighbouring ones).

    .venv/bin/python bench/bench_finetune_ab.py step [--rounds 2]        # AdamW per-parameter + host copy vs fused
    .venv/bin/python bench/bench_finetune_ab.py packing [--rounds 4]     # bucketed padded batches vs packed rows
    .venv/bin/python bench/bench_finetune_ab.py inference [--rounds 5]   # inference batch token budgets

``step``: the loop's optimizer step with ``torch.optim.AdamW``'s per-parameter loop and a host copy of the losses
each step, against ``device.adamw`` (fused) without it; same initial weights, the same length-bucketed batches.
``packing``: one epoch of the encoder's forward + backward over the same examples as length-bucketed padded batches
of 32 (the loop's) and as packed rows (first-fit decreasing into rows of 128 or 256 tokens, each example confined
to itself with ``attention.document_mask``, its own positions, its [CLS] read out). ``inference``: ``run_model``
over a dev split with inference batches grown to 8,192 .. 32,768 padded tokens, and to the batch size alone.
Data and model as bench_finetune.py (keyword classification, mean ~83 tokens; 2 layers, hidden 256), bf16, one
torch thread. docs/speed.md holds the figures.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics as st
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_finetune import LABELS, examples  # noqa: E402

from bertpipe.infra.device import Precision, adamw  # noqa: E402
from bertpipe.infra.attention import document_mask  # noqa: E402
from bertpipe.lib.training import batches as B  # noqa: E402
from bertpipe.lib.training import features as F  # noqa: E402
from bertpipe.lib.training import heads as H  # noqa: E402
from bertpipe.lib.training.loop import backward_step, param_groups  # noqa: E402
from bertpipe.lib.training.params import TaskParams, TrainParams  # noqa: E402
from bertpipe.lib.training.predict import run_model  # noqa: E402

BF16 = Precision("bf16", "bench")


def featurised(tok, n: int, seed: int, split: str) -> list[dict]:
    p = TaskParams(type="classification", format="jsonl", train="x")
    label2id = {lab: i for i, lab in enumerate(LABELS)}
    return F.featurize(tok, examples(n, seed), p, TrainParams(max_seq_len=256), label2id, Counter(), split).feats


def interleave(variants: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds of each variant per round, the order flipped every round."""
    out: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        for k in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            t = time.perf_counter()
            variants[k]()
            out[k].append(time.perf_counter() - t)
    return out


def ab_step(enc, tok, rounds: int) -> None:
    feats = featurised(tok, 640, 0, "train")
    tp = TrainParams(batch_size=32)
    epoch = B.batches(feats, 32, random.Random(0))
    models = {k: H.load_model("classification", enc, LABELS) for k in ("per-parameter", "fused")}
    models["fused"].load_state_dict(models["per-parameter"].state_dict())
    opts = {"per-parameter": torch.optim.AdamW(param_groups(models["per-parameter"], tp), lr=1e-4),
            "fused": adamw(param_groups(models["fused"], tp), lr=1e-4)}
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(rounds):
        for j, idx in enumerate(epoch):
            for k in (list(models) if (r + j) % 2 else list(models)[::-1]):
                m, opt = models[k], opts[k]
                t = time.perf_counter()
                losses = backward_step(m, [B.collate([feats[i] for i in idx], 0)], torch.device("cpu"), BF16)
                if k == "per-parameter":
                    losses.tolist()  # a host copy every step
                torch.nn.utils.clip_grad_norm_(list(m.parameters()), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                times[k].append(time.perf_counter() - t)
    for k, v in times.items():
        print(f"{k:14s} median step {1e3 * st.median(v):7.1f} ms over {len(v)} steps")
    paired = st.median(a / b for a, b in zip(times["per-parameter"], times["fused"]))
    print(f"per-parameter / fused: {paired:.3f}x (median of the paired steps' ratios)")


def packed(feats: list[dict], row: int) -> list[tuple]:
    """Rows of ``row`` tokens packed first-fit decreasing, grouped into steps of as many examples as a batch of
    32: (input_ids, doc_ids, position_ids, [CLS] coordinates) per step."""
    rows: list[list] = []
    for i in sorted(range(len(feats)), key=lambda i: -len(feats[i]["input_ids"])):
        n = len(feats[i]["input_ids"])
        fit = next((r for r in rows if r[0] + n <= row), None)
        if fit is None:
            rows.append([n, [i]])
        else:
            fit[0] += n
            fit[1].append(i)
    random.Random(0).shuffle(rows)
    per = max(1, round(len(rows) * 32 / len(feats)))
    out = []
    for s in range(0, len(rows), per):
        grp = rows[s : s + per]
        width = max(r[0] for r in grp)
        ids, doc, pos = (np.zeros((len(grp), width), np.int64) for _ in range(3))
        cls = []
        for j, (_, members) in enumerate(grp):
            o = 0
            for d, i in enumerate(members, 1):
                x = feats[i]["input_ids"]
                ids[j, o : o + len(x)], doc[j, o : o + len(x)], pos[j, o : o + len(x)] = x, d, np.arange(len(x))
                cls.append((j, o))
                o += len(x)
        out.append((torch.from_numpy(ids), torch.from_numpy(doc), torch.from_numpy(pos), torch.tensor(cls)))
    return out


def ab_packing(enc, tok, rounds: int) -> None:
    feats = featurised(tok, 640, 0, "train")
    model = H.load_model("classification", enc, LABELS).base_model
    model.train()
    impl = model.config._attn_implementation
    padded = [B.collate([{"input_ids": feats[i]["input_ids"]} for i in idx], 0)
              for idx in B.batches(feats, 32, random.Random(0))]
    packs = {row: packed(feats, row) for row in (128, 256)}

    def run_padded():
        for b in padded:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).last_hidden_state
            h[:, 0].float().sum().backward()
        model.zero_grad(set_to_none=True)

    def run_packed(row):
        for ids, doc, pos, cls in packs[row]:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = model(input_ids=ids, attention_mask=document_mask(doc, impl), position_ids=pos).last_hidden_state
            h[cls[:, 0], cls[:, 1]].float().sum().backward()
        model.zero_grad(set_to_none=True)

    real = sum(len(f["input_ids"]) for f in feats)
    print(f"{len(feats)} examples, {real} real tokens; padded tokens: bucketed "
          f"{sum(b['input_ids'].numel() for b in padded)}, " +
          ", ".join(f"rows of {r} {sum(x[0].numel() for x in p)}" for r, p in packs.items()))
    times = interleave({"bucketed padded": run_padded, "packed rows of 128": lambda: run_packed(128),
                        "packed rows of 256": lambda: run_packed(256)}, rounds)
    for k, v in times.items():
        print(f"{k:20s} epoch forward+backward median {st.median(v):6.2f} s ({' '.join(f'{x:.2f}' for x in v)})")


def ab_inference(enc, tok, rounds: int) -> None:
    feats = featurised(tok, 512, 1, "dev")
    model = H.load_model("classification", enc, LABELS)

    def with_budget(tokens: int):
        def run():
            saved = B.CPU_INFERENCE_TOKENS
            B.CPU_INFERENCE_TOKENS = tokens
            try:
                run_model(model, feats, 0, 64, bf16=True)
            finally:
                B.CPU_INFERENCE_TOKENS = saved
        return run

    times = interleave({"batch 64 alone": with_budget(1), **{f"{t} tokens": with_budget(t)
                                                            for t in (8192, 16384, 32768)}}, rounds)
    for k, v in times.items():
        print(f"{k:16s} dev split median {st.median(v):6.2f} s ({' '.join(f'{x:.2f}' for x in v)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("step", "packing", "inference"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--raw", default=str(REPO / "data" / "raw"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from tests.synthetic import tiny_encoder

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        enc = tiny_encoder(Path(tmp) / "enc", Path(args.raw) / "bert-base-chinese", layers=2, hidden=256)
        tok = AutoTokenizer.from_pretrained(str(enc))
        {"step": ab_step, "packing": ab_packing, "inference": ab_inference}[args.what](enc, tok, args.rounds)
    print(f"load avg {load0:.2f} -> {os.getloadavg()[0]:.2f} (shared machine: compare within this run)")


if __name__ == "__main__":
    main()
