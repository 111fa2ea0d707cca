"""Finetuning throughput: bertpipe's finetune loop vs HF's Trainer with run_classification's defaults and dynamic
padding, same model, examples, batch, steps and precision, in one run.

    .venv/bin/python bench/bench_finetune.py [--steps 30] [--batch 32] [--layers 4] [--hidden 256] [--rounds 1]
        [--raw DIR]
    .venv/bin/python bench/bench_finetune.py --compile [--dynamic auto|true] ...

``--compile``: bertpipe's loop with ``compile: off`` against ``compile: on`` instead of against HF (same examples,
batches and steps): the step rate after the compile (the median step), the compile time (the slow first steps over
that median), the whole runs' times and the steps from which compiling repays itself. ``--dynamic`` picks the
shape handling (``execution.BUCKETED_DYNAMIC``: auto = torch's automatic dynamic shapes, true = symbolic from the
start, the loop's setting).

Data: a keyword classification (the label's keyword once in a review-like text of varying length: mostly short, a
long tail), so the dev accuracy shows both sides learned the same task. bertpipe: ``bertpipe.lib.training.loop.train``
(length-bucketed batches, one host copy of the losses per step). HF: ``Trainer`` + ``DataCollatorWithPadding``
(shuffled batches padded to their longest row), as run_classification.py does by default. Prints examples/s, the
ratio, the dev accuracy of each, the matmul peak measured in this run (best of 1024²..4096²), MFU against it and the
load average. ``--rounds N`` runs both sides N times, alternating and flipping the order each round, and reports the
median of the rounds' ratios: on a shared machine the load drifts between two sequential runs.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections import Counter
from statistics import median
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_pretrain import SIZES, precision_peak  # noqa: E402

from tests.synthetic import FILLER, KEYS  # noqa: E402
from bertpipe.lib.labelled import Example  # noqa: E402
from bertpipe.lib.training import features as F  # noqa: E402
from bertpipe.lib.training import heads as H  # noqa: E402
from bertpipe.lib.training import loop as TR  # noqa: E402
from bertpipe.lib.training import predict as P  # noqa: E402
from bertpipe.lib.training.params import TaskParams, TrainParams  # noqa: E402

LABELS = ["neg", "pos"]


def examples(n: int, seed: int) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        lab = LABELS[i % 2]
        a, b = (int(rng.expovariate(1 / 40)) + 3 for _ in range(2))
        text = "".join(rng.choice(FILLER) for _ in range(min(a, 120))) + KEYS[lab] + \
            "".join(rng.choice(FILLER) for _ in range(min(b, 120)))
        out.append(Example(id=str(i), text=text, label=lab))
    return out


def dev_accuracy(model, feats, labels_of) -> float:
    outs = P.run_model(model, feats, 0, 64, bf16=False)
    return sum(int(o.argmax()) == labels_of[f["example"]] for o, f in zip(outs, feats)) / len(feats)


def run_bertpipe(enc, feats, args, precision: str, compile_setting: str = "off") -> dict:
    torch.manual_seed(0)
    model = H.load_model("classification", enc, LABELS)
    tp = TrainParams(lr=args.lr, epochs=args.steps * args.batch / len(feats), batch_size=args.batch,
                     precision=precision, warmup_ratio=0.1, evals_per_epoch=1, max_seq_len=args.seq,
                     compile=compile_setting)
    step_s: list[float] = []
    t = time.perf_counter()
    res = TR.train(model, feats, tp, lambda m: (0.0, {}), pad_id=0, seed=0,
                   log_metrics=lambda m, s: "train_loss" in m and step_s.append(time.perf_counter()))
    secs = time.perf_counter() - t
    # log_metrics is called at every step here (steps <= 50): the differences are the step times
    times = [b - a for a, b in zip([t] + step_s, step_s)]
    return {"model": model, "examples": res.steps * args.batch, "seconds": secs, "precision": res.precision.words(),
            "step_times": times, "compile_s": res.compile_s}


def run_hf(enc, feats, args, bf16: bool) -> dict:
    """run_classification.py's defaults: Trainer, DataCollatorWithPadding (pad to the batch's longest row), shuffled
    batches (no group_by_length), AdamW, linear schedule; the same lr, warm-up, batch and steps as bertpipe."""
    from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = H.load_model("classification", enc, LABELS)
    tok = AutoTokenizer.from_pretrained(str(enc))
    rows = [{"input_ids": f["input_ids"], "labels": f["labels"]} for f in feats]
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch,
                                  learning_rate=args.lr, warmup_steps=max(1, round(0.1 * args.steps)),
                                  logging_strategy="no", save_strategy="no",
                                  report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True,
                                  bf16=bf16)
        trainer = Trainer(model=model, args=targs, train_dataset=rows, data_collator=DataCollatorWithPadding(tok))
        t = time.perf_counter()
        trainer.train()
        secs = time.perf_counter() - t
    return {"model": model, "examples": args.steps * args.batch, "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"))
    ap.add_argument("--raw", default=str(REPO / "data" / "raw"))
    ap.add_argument("--rounds", type=int, default=1, help="HF and bertpipe runs, alternating (median ratio)")
    ap.add_argument("--compile", action="store_true", help="compile: off against on (instead of against HF)")
    ap.add_argument("--dynamic", default="true", choices=("auto", "true"))
    args = ap.parse_args()
    if args.compile and args.steps > 50:
        ap.error("--compile measures each step (the loop logs every step up to 50 steps): --steps <= 50")
    from bertpipe.infra import execution

    execution.BUCKETED_DYNAMIC = None if args.dynamic == "auto" else True
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from bertpipe.infra.device import precision_for
    from tests.synthetic import tiny_encoder

    prec = precision_for(args.precision, torch.device("cpu"))
    peak, _ = precision_peak(prec)
    with tempfile.TemporaryDirectory() as tmp:
        enc = tiny_encoder(Path(tmp) / "enc", Path(args.raw) / "bert-base-chinese", layers=args.layers,
                           hidden=args.hidden)
        tok = AutoTokenizer.from_pretrained(str(enc))
        p = TaskParams(type="classification", format="jsonl", train="x")
        tp = TrainParams(max_seq_len=args.seq)
        label2id = {lab: i for i, lab in enumerate(LABELS)}
        feats = F.featurize(tok, examples(args.steps * args.batch, 0), p, tp, label2id, Counter(), "train").feats
        dev_ex = examples(512, 1)
        dev = F.featurize(tok, dev_ex, p, tp, label2id, Counter(), "dev").feats
        dev_labels = [label2id[e.label] for e in dev_ex]
        mean_len = sum(len(f["input_ids"]) for f in feats) / len(feats)
        if args.compile:
            return compare_compile(enc, feats, args, prec, mean_len)
        hf_name, bp_name = "HF Trainer (dynamic padding)", "bertpipe finetune loop"
        sides = {hf_name: lambda: run_hf(enc, feats, args, prec.bf16),
                 bp_name: lambda: run_bertpipe(enc, feats, args, prec.dtype)}
        runs: dict[str, list[dict]] = {hf_name: [], bp_name: []}
        loads = [os.getloadavg()[0]]
        for r in range(args.rounds):  # alternating, the order flipped each round: both sides see the same load
            for name in (sides if r % 2 == 0 else list(sides)[::-1]):
                runs[name].append(sides[name]())
            loads.append(os.getloadavg()[0])
        # useful FLOPs per example: 6 x the encoder's weights per token (+ attention), over its real tokens
        h, L = args.hidden, args.layers
        fpe = mean_len * L * (6 * (4 * h * h + 2 * h * 2 * h) + 12 * mean_len * h)
        print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load avg "
              f"{' -> '.join(f'{x:.2f}' for x in loads)} (one per round; shared machine: compare the ratio, not the "
              "absolute rates)")
        print(f"model {L} layers, hidden {h}; {len(feats)} examples (mean {mean_len:.0f} tokens), batch {args.batch},"
              f" {args.steps} steps, {args.rounds} rounds; precision {prec.words()}; {prec.dtype} matmul peak (best "
              f"of {'/'.join(map(str, SIZES))}) {peak / 1e9:.1f} GFLOP/s")
        print(f"{'':30s} {'examples/s (median; each round)':>40s} {'dev acc':>8s} {'MFU':>6s}")
        for name, rs in runs.items():
            rates = [r["examples"] / r["seconds"] for r in rs]
            dev_acc = dev_accuracy(rs[-1]["model"], dev, dev_labels)
            each = " ".join(f"{x:.1f}" for x in rates)
            print(f"{name:30s} {median(rates):8.1f} ({each}) {dev_acc:8.3f} {median(rates) * fpe / peak:6.1%}")
        ratios = [b["examples"] / b["seconds"] / (a["examples"] / a["seconds"]) for a, b in zip(runs[hf_name],
                                                                                               runs[bp_name])]
        print(f"speed ratio bertpipe / HF Trainer: {median(ratios):.2f}x median of the rounds' ratios "
              f"({' '.join(f'{x:.2f}' for x in ratios)})")


def compare_compile(enc, feats, args, prec, mean_len: float) -> None:
    load0 = os.getloadavg()[0]
    lengths = {len(f["input_ids"]) for f in feats}
    runs = {"compile: off": run_bertpipe(enc, feats, args, prec.dtype, "off"),
            "compile: on": run_bertpipe(enc, feats, args, prec.dtype, "on")}
    print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load avg {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after (shared machine: compare the ratios, not the absolute rates)")
    print(f"model {args.layers} layers, hidden {args.hidden}; {len(feats)} examples (mean {mean_len:.0f} tokens, "
          f"{len(lengths)} lengths), batch {args.batch}, {args.steps} steps; precision {prec.words()}; "
          f"dynamic {args.dynamic}")
    print(f"{'':14s} {'median step s':>13s} {'first 2 steps s':>15s} {'run s':>7s} {'compile s':>9s}")
    for name, r in runs.items():
        r["median"] = sorted(r["step_times"])[len(r["step_times"]) // 2]
        cs = f"{r['compile_s']:9.1f}" if r["compile_s"] is not None else f"{'-':>9s}"
        print(f"{name:14s} {r['median']:13.3f} {sum(r['step_times'][:2]):15.1f} {r['seconds']:7.1f} {cs}")
    off, on = runs["compile: off"], runs["compile: on"]
    saved = off["median"] - on["median"]
    print(f"step speed-up compiled / eager (median steps): {off['median'] / on['median']:.2f}x")
    if saved > 0 and on["compile_s"] is not None:
        print(f"compiling repays itself after ~{on['compile_s'] / saved:.0f} steps "
              f"({on['compile_s']:.0f} s / {saved:.3f} s saved a step)")
    else:
        print("compiling never repays itself here: the compiled step is not faster")


if __name__ == "__main__":
    main()
