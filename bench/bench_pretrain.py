"""Benchmark: bertpipe's pretrain loop vs the plain transformers recipe, same corpus/model/sequence length/batch/steps.

    .venv/bin/python bench/bench_pretrain.py [--steps 30] [--batch 16] [--seq 128] [--layers 6] [--hidden 384] [--raw DIR] ...

The plain recipe is HF's run_mlm.py: texts tokenized and grouped into --seq blocks (no padding),
`DataCollatorForLanguageModeling` (token masking, 15%, 80/10/10), `Trainer` with full-vocabulary logits, in the same
precision as bertpipe (bf16 where the CPU has bf16 units, else fp32). bertpipe: packed segments, length buckets,
whole-word dynamic masking, MLM head at the chosen positions only.
Each side runs in its own process (so peak RSS is its own); both are scored on the same held-out segments with the
same fixed token-level masks. Prints non-padding tokens/s, the ratio, held-out loss after the same number of
tokens, peak memory and model-FLOPs utilisation against a matmul peak measured in this run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def law_texts(raw: Path, n: int, offset: int) -> list[str]:
    with sqlite3.connect(raw / "china_law" / "laws.db") as c:
        rows = c.execute("select article_text from articles where length(article_text) > 10 order by id limit ? offset ?",
                         (n, offset)).fetchall()
    return [r[0] for r in rows]


SIZES = (1024, 2048, 4096)


def matmul_peak(dtype, sizes=SIZES, seconds: float = 1.5) -> tuple[float, dict]:
    """The best matmul FLOP/s over square sizes (``sizes``), each timed for about ``seconds`` after a warm-up: one
    size understates the peak (a 1024² bf16 matmul reached ~55% of the 2048² rate on an AMX CPU)."""
    import torch

    per = {}
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        t = time.perf_counter()
        a @ b
        one = max(time.perf_counter() - t, 1e-6)
        reps = max(2, min(50, int(seconds / one)))
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        per[n] = 2 * n**3 * reps / (time.perf_counter() - t)
    return max(per.values()), per


def precision_peak(prec) -> tuple[float, dict]:
    """``matmul_peak`` in the dtype the run computes in (``prec``: bertpipe.infra.device's choice), the peak its MFU is
    measured against, and no other: a bf16 matmul on a CPU without bf16 units is emulated (10+ minutes at 4096²
    before the run's first step)."""
    import torch

    return matmul_peak(prec.autocast or torch.float32)


def model_config(args, vocab: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, intermediate_size=args.intermediate,
                      max_position_embeddings=max(args.seq, 128), type_vocab_size=2)


def heldout(args, tok):
    """Held-out segments with fixed token-level masks (the plain recipe's own objective, so the scoring is fair)."""
    from bertpipe.lib.mlm.data import build_examples
    from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.lib.mlm.train import eval_batches

    p = PretrainParams(max_seq_len=args.seq, batch_size=32, seed=123)
    ex = build_examples(law_texts(Path(args.raw), 400, args.docs), tok, "zh", p, 256)
    spec = MaskSpec(whole_word=False)
    return eval_batches(ex, p, spec, tok.mask_token_id, normal_token_ids(tok), tok.pad_token_id)


def score(mlm, batches) -> float:
    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.train import Dist, evaluate

    return evaluate(PretrainModel(mlm, pair=False), batches, Dist())["eval_loss"]


def group_texts(examples: dict, block: int) -> dict:
    """run_mlm.py's ``group_texts``: concatenate every tokenized text and cut it into blocks of ``block`` tokens
    (the remainder is dropped), so no batch cell is padding."""
    from itertools import chain

    joined = {k: list(chain(*examples[k])) for k in examples}
    total = (len(joined["input_ids"]) // block) * block
    return {k: [t[i : i + block] for i in range(0, total, block)] for k, t in joined.items()}


def run_plain(args, tok) -> dict:
    """The HF run_mlm recipe: tokenize with special tokens, group texts into --seq blocks,
    DataCollatorForLanguageModeling (15%, 80/10/10), Trainer (full-vocabulary logits), same precision as bertpipe."""
    import torch
    from datasets import Dataset
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments

    texts = law_texts(Path(args.raw), args.docs, 0)
    ds = Dataset.from_dict({"text": texts}).map(
        lambda b: tok(b["text"], return_special_tokens_mask=True), batched=True, remove_columns=["text"])
    ds = ds.map(lambda b: group_texts(b, args.seq), batched=True)
    base = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15)
    seen = {"tokens": 0}

    def collate(features):
        batch = base(features)
        seen["tokens"] += int(batch["attention_mask"].sum())
        return batch

    torch.manual_seed(0)
    model = BertForMaskedLM(model_config(args, len(tok)))
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=args.lr,
            warmup_steps=max(1, args.steps // 10), lr_scheduler_type="linear", weight_decay=0.01, logging_strategy="no",
            save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0, seed=0,
            disable_tqdm=True, bf16=args.bf16,
        )
        trainer = Trainer(model=model, args=targs, train_dataset=ds, data_collator=collate)
        t = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t
    # Grouped blocks have no padding: the steps trained x batch x seq (the collator also runs for batches the
    # dataloader fetched ahead, so counting there overstates the tokens)
    return {"tokens": args.steps * args.batch * args.seq, "collated_tokens": seen["tokens"], "seconds": seconds,
            "loss_at_end": score(model, heldout(args, tok)), "loss_same_tokens": None}


def rows_attend_across_documents() -> None:
    """The ``bertpipe-rows`` variant: batches without ``doc_ids``, so the documents packed into a row attend to each
    other (plain padding mask) - the reference for document-confined attention's speed and held-out loss."""
    from bertpipe.lib.mlm import train as T

    collate = T.collate
    T.collate = lambda examples, pad_id: {k: v for k, v in collate(examples, pad_id).items() if k != "doc_ids"}


def run_bertpipe(args, tok) -> dict:
    import torch

    from bertpipe.lib.mlm.data import build_examples
    from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.lib.mlm.train import Dist, train
    from transformers import BertForMaskedLM

    p = PretrainParams(max_seq_len=args.seq, batch_size=args.bertpipe_batch or args.batch, max_steps=args.bertpipe_steps or args.steps, lr=args.lr,
                       warmup_ratio=0.1, eval_every=10**9, save_every=10**9, log_every=1, precision=args.precision,
                       whole_word=not args.token_masking, seed=0,
                       compile="on" if args.which == "bertpipe-compiled" else "off")
    if args.which == "bertpipe-rows":
        rows_attend_across_documents()
    ex = build_examples(law_texts(Path(args.raw), args.docs, 0), tok, "zh", p)
    torch.manual_seed(0)
    mlm = BertForMaskedLM(model_config(args, len(tok)))
    ho = heldout(args, tok)
    same = {}

    def on_log(metrics, step):
        if step == args.match_step and "eval_loss" in metrics:
            same["loss"] = metrics["eval_loss"]

    with tempfile.TemporaryDirectory() as tmp:
        res = train(PretrainModel(mlm, pair=False), ex, ho, p, MaskSpec.from_params(p), tok, normal_token_ids(tok),
                    Path(tmp), Dist(), on_log, extra_eval_steps={args.match_step})
    tokens_at = {h["step"]: h["tokens"] for h in res.history if "loss" in h}
    rates = sorted(h["tokens_per_s"] for h in res.history if "tokens_per_s" in h)
    return {"tokens": res.tokens, "seconds": res.train_seconds, "loss_at_end": res.final_eval["eval_loss"],
            "loss_same_tokens": same.get("loss"), "tokens_at_match": tokens_at.get(args.match_step),
            "compile_s": res.compile_s, "median_step_tokens_per_s": rates[len(rates) // 2] if rates else None}


def profile_steps(args, tok) -> None:
    """``--profile N``: N of bertpipe's optimizer steps under torch.profiler (after 2 warm-up steps), the ops by self
    CPU time: where a step goes (attention's bmm/softmax, layer norms, the optimizer, the masked-token head)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertForMaskedLM

    from bertpipe.lib.mlm.data import build_examples, collate
    from bertpipe.lib.mlm.masking import MaskSpec, mask_batch, normal_token_ids, seeded
    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.lib.mlm.train import Batches, Dist, backward_step, make_optimizer

    p = PretrainParams(max_seq_len=args.seq, batch_size=args.batch, seed=0)
    ex = build_examples(law_texts(Path(args.raw), args.docs, 0), tok, "zh", p)
    torch.manual_seed(0)
    pm = PretrainModel(BertForMaskedLM(model_config(args, len(tok))), pair=False)
    opt, d, spec, replace = make_optimizer(pm, p), Dist(), MaskSpec.from_params(p), normal_token_ids(tok)
    batches = Batches(ex, p, d, tok.pad_token_id)

    def step(k: int) -> None:
        b = collate(batches.get(k), tok.pad_token_id)
        b["input_ids"], b["labels"] = mask_batch(b["input_ids"], b["word_ids"], spec, tok.mask_token_id, replace,
                                                 seeded(0, k, 0, 0))
        backward_step(pm, [b], d)
        torch.nn.utils.clip_grad_norm_(pm.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for k in range(2):
        step(k)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for k in range(2, 2 + args.profile):
            step(k)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    print(f"load avg (1 min) {os.getloadavg()[0]:.2f}")


def child(args) -> None:
    import torch
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.raw + "/bert-base-chinese")
    res = run_plain(args, tok) if args.which == "plain" else run_bertpipe(args, tok)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--docs", type=int, default=3000, help="law articles to train on")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                    help="both sides run in it; auto: bertpipe's policy for this CPU (bertpipe/infra/device.py)")
    ap.add_argument("--token-masking", action="store_true", help="bertpipe with token (not whole-word) masking")
    ap.add_argument("--bertpipe-steps", type=int, default=0,
                    help="bertpipe's schedule length (default --steps); e.g. the step where it matches plain's tokens")
    ap.add_argument("--bertpipe-batch", type=int, default=0,
                    help="bertpipe's batch (default --batch); packed segments are longer, so a smaller batch gives "
                         "the same tokens per step")
    ap.add_argument("--plain-result", default="", help="reuse the JSON of an earlier plain run (same settings)")
    ap.add_argument("--raw", default=str(REPO / "data" / "raw"))
    ap.add_argument("--profile", type=int, default=0, help="profile N of bertpipe's steps (torch.profiler) and exit")
    ap.add_argument("--variants", default="rows",
                    help="extra bertpipe variants, comma-separated: rows (packed documents attend to each other), "
                         "compiled (compile: on); '' for none")
    ap.add_argument("--which", choices=("plain", "bertpipe", "bertpipe-rows", "bertpipe-compiled"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--match-step", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.bf16 = args.precision == "bf16"
    if args.which:
        return child(args)
    if args.profile:
        import torch
        from transformers import AutoTokenizer

        if args.threads:
            torch.set_num_threads(args.threads)
        return profile_steps(args, AutoTokenizer.from_pretrained(args.raw + "/bert-base-chinese"))

    import torch
    from transformers import AutoTokenizer

    from bertpipe.lib.mlm.data import build_examples
    from bertpipe.lib.mlm.params import PretrainParams

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.raw + "/bert-base-chinese")
    texts = law_texts(Path(args.raw), args.docs, 0)
    plain_len = float(args.seq)  # grouped texts: every block is full
    packed = build_examples(texts, tok, "zh", PretrainParams(max_seq_len=args.seq))
    packed_len = sum(len(e) for e in packed) / len(packed)
    match = max(1, round(args.steps * plain_len / packed_len))
    from bertpipe.infra.device import precision_for

    prec = precision_for(args.precision, torch.device("cpu"))
    peak, per = precision_peak(prec)
    cfg = model_config(args, len(tok))
    h, v = cfg.hidden_size, cfg.vocab_size
    per_layer = 4 * h * h + 2 * h * cfg.intermediate_size
    # useful model FLOPs per non-padding token: 6 x non-embedding params, plus the MLM head at the 15% chosen tokens
    flops_per_token = 6 * (cfg.num_hidden_layers * per_layer) + 6 * 0.15 * (h * h + h * v)

    results = {}
    if args.plain_result:
        results["plain"] = json.loads(Path(args.plain_result).read_text())["plain"]
    extra = [f"bertpipe-{v}" for v in args.variants.split(",") if v]
    for which in [w for w in ("plain", "bertpipe", *extra) if w not in results]:
        # bertpipe trains until it has seen the plain run's tokens (its rows carry fewer real ones), so the
        # held-out loss is compared at equal tokens, each side's schedule spanning that budget
        steps = [] if which == "plain" or args.bertpipe_steps else ["--bertpipe-steps", str(max(match, args.steps))]
        cmd = [sys.executable, __file__, "--which", which, "--match-step", str(match)] + sys.argv[1:] + steps + [
            "--precision", prec.dtype]
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            sys.exit(f"{which} failed:\n{out.stderr[-3000:]}")
        results[which] = json.loads(line[0][7:])

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, load avg (1 min) {load:.2f}")
    print(f"model: {cfg.num_hidden_layers} layers, hidden {h}, vocab {v}; seq {args.seq}, batch {args.batch}, "
          f"{args.steps} steps; {prec.dtype} matmul peak (best of {'/'.join(map(str, SIZES))}) "
          f"{peak / 1e9:.1f} GFLOP/s")
    print(f"{prec.dtype} matmul GFLOP/s by size: " + ", ".join(f"{n}: {f / 1e9:.0f}" for n, f in per.items()))
    print(f"precision (both sides): {prec.words()}")
    print(f"mean non-padding tokens per example: plain {plain_len:.1f}, bertpipe (packed) {packed_len:.1f}")
    print(f"{'':18s} {'tokens':>9s} {'seconds':>8s} {'tok/s':>8s} {'loss@end':>9s} {'loss@same tokens':>17s} "
          f"{'peak MB':>8s} {'MFU':>6s}")
    for which, r in results.items():
        tps = r["tokens"] / r["seconds"]
        r["tokens_per_s"] = tps
        same = r["loss_at_end"] if which == "plain" else r["loss_same_tokens"]
        print(f"{which:18s} {r['tokens']:9.0f} {r['seconds']:8.1f} {tps:8.0f} {r['loss_at_end']:9.3f} "
              f"{same if same is not None else math.nan:17.3f} {r['peak_rss_mb']:8.0f} "
              f"{tps * flops_per_token / peak:6.1%}")
    ratio = results["bertpipe"]["tokens_per_s"] / results["plain"]["tokens_per_s"]
    print(f"speed ratio (non-padding tokens/s): {ratio:.2f}x; bertpipe's loss after the plain run's "
          f"{results['plain']['tokens']:.0f} tokens is taken at step {match} "
          f"({results['bertpipe'].get('tokens_at_match') or 0:.0f} tokens)")
    print(f"MFU against the {prec.dtype} matmul peak measured in this run: bertpipe "
          f"{results['bertpipe']['tokens_per_s'] * flops_per_token / peak:.1%}, HF "
          f"{results['plain']['tokens_per_s'] * flops_per_token / peak:.1%}; load avg after {os.getloadavg()[0]:.2f}")
    for which, r in results.items():
        if r.get("compile_s") is not None:
            print(f"{which}: ~{r['compile_s']:.0f} s of its first steps were compiling; median step rate "
                  f"{r['median_step_tokens_per_s']:.0f} tokens/s vs bertpipe (eager) "
                  f"{results['bertpipe']['median_step_tokens_per_s']:.0f}")
    print("JSON " + json.dumps({"ratio": ratio, "precision": prec.dtype, "load": load, **results}))


if __name__ == "__main__":
    main()
