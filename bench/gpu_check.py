"""The GPU check: one run on a CUDA machine that prints one table of what bertpipe gets from it.

    bench/gpu_check.sh [--json out.json]   # on the GPU machine (<= 9.5 minutes); needs torch, transformers, pydantic
    bench/gpu_check.sh --smoke             # tiny shapes, any device (the test suite runs it on the CPU)

Each row of the table: a rate, its MFU against the matmul peak measured in the same run, and its ratio to the row it
is compared with. Sections:

1. the precision policy's choice for the device and the matmul peaks (bf16, fp16, fp32/TF32);
2. the attention kernels alone (bertpipe/infra/attention.py), forward + backward at BERT-base's head shape on rows
   packing three documents, every other row with padding: SDPA without a mask (not confined: the floor), the 4D
   document mask (``attention: mask``), SDPA over nested jagged tensors (``varlen``), torch's
   ``torch.nn.attention.varlen.varlen_attn`` where this torch has it (CUDA only, no attention dropout: timed, not
   used), FlexAttention with a document BlockMask (``flex``; compiled on CUDA, forward only on the CPU);
3. pretraining a BERT-base-shaped MLM (12 x 768, vocab 21128) at seq 128 and 512 through bertpipe's loop
   (bertpipe.lib.mlm.train.train): full rows of one document against the HF run_mlm recipe (Trainer +
   DataCollatorForLanguageModeling on grouped full blocks), same model, batch, steps and precision; rows packing three
   documents under ``attention: mask`` and ``varlen``; at the longest seq the packed rows compiled (``compile: on``)
   against eager, with the compile time;
4. one finetune epoch (bertpipe.lib.training.loop.train, sequence classification, examples of a quarter to all of the
   finetune length) with ``attention: mask`` and ``varlen`` in bf16, and fp16 + GradScaler, against HF's Trainer with
   DataCollatorWithPadding (run_classification's defaults);
5. inference: batch 1 (latency) and a throughput batch of rows of mixed lengths under each kernel, and run_model
   (length-sorted, token-budgeted batches; the auto kernel) over the finetune examples; onnxruntime's CUDA provider
   when it is installed;
6. whole stages (bench/gpu_stages.py, ``--stages off`` skips them): ``python -m bertpipe splits|prepare|start|vocab|
   pretrain|finetune`` on a tiny project with tracking off, each stage's wall time, rate, precision and kernel.

A row that fails says so (the rest still run) and the check exits 1. Sections past the time budget are skipped with
a line saying so. Data are random token ids (no corpus or tokenizer download): speed, not quality, is measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 21128  # bert-base-chinese's vocabulary size
BUDGET_S = 540  # bench/gpu_check.sh stops the check at 570 s


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def shapes(smoke: bool) -> SimpleNamespace:
    if smoke:
        return SimpleNamespace(layers=2, hidden=64, heads=2, seqs={64: 4}, steps=3, mm=256, ft_seq=32, ft_batch=8,
                               ft_examples=16, inf_batch=8, inf_reps=2, kernel_batch=4, kernel_reps=2)
    # the same tokens a step at both lengths; BERT-base width and depth
    return SimpleNamespace(layers=12, hidden=768, heads=12, seqs={128: 128, 512: 32}, steps=40, mm=8192, ft_seq=128,
                           ft_batch=32, ft_examples=4096, inf_batch=256, inf_reps=20, kernel_batch=32, kernel_reps=20)


class Table:
    """The check's rows, printed as they come and once more together at the end."""

    def __init__(self):
        self.rows: list[dict] = []
        self.failed = False

    def add(self, section: str, what: str, rate: str, mfu: float | None = None, vs: str = "") -> None:
        row = {"section": section, "what": what, "rate": rate, "mfu": mfu, "vs": vs}
        self.rows.append(row)
        print(f"[{section}] {what}: {rate}" + (f", MFU {mfu:.1%}" if mfu is not None else "") + (f"; {vs}" if vs
              else ""), flush=True)

    def attempt(self, section: str, what: str, fn):
        """``fn()``, or None after a row saying how it failed."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 (a row of the report, not the end of the check)
            self.failed = True
            self.add(section, what, f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
            return None

    def print(self) -> None:
        w = max(len(r["what"]) for r in self.rows)
        print(f"\n{'section':14s} {'what':{w}s} {'rate':>24s} {'MFU':>6s}  vs")
        for r in self.rows:
            mfu = f"{r['mfu']:6.1%}" if r["mfu"] is not None else f"{'':6s}"
            print(f"{r['section']:14s} {r['what']:{w}s} {r['rate']:>24s} {mfu}  {r['vs']}")


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t)


def tokenizer():
    """A real BertTokenizerFast over a made-up vocabulary of bert-base-chinese's size (special ids as in BERT)."""
    from transformers import BertTokenizerFast

    special = ["[PAD]"] + [f"[unused{i}]" for i in range(1, 100)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = special + [f"t{i}" for i in range(VOCAB - len(special))]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)})


def bert_config(a, num_labels: int = 2):
    from transformers import BertConfig

    return BertConfig(vocab_size=VOCAB, hidden_size=a.hidden, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, intermediate_size=4 * a.hidden, max_position_embeddings=512,
                      type_vocab_size=2, num_labels=num_labels)


def flops_per_token(a, seq: int) -> float:
    """Useful training FLOPs per token (forward + backward = 3x forward): per layer 6 x its 12 h^2 weights plus the
    attention scores and mix (4 x seq x h forward); the MLM head only at the 15% masked tokens."""
    h = a.hidden
    return a.layers * (72 * h * h + 12 * seq * h) + 6 * 0.15 * (h * h + h * VOCAB)


def encoder_flops(a, lengths, passes: int) -> float:
    """The encoder's FLOPs over rows of ``lengths`` real tokens: ``passes`` 1 forward, 3 forward + backward."""
    h = a.hidden
    return passes * sum(n * a.layers * (24 * h * h + 4 * n * h) for n in lengths)


# ---------------------------------------------------------------- 2. attention kernels alone


def kernel_section(a, device, dtype, peak, table: Table) -> dict:
    import torch.nn.functional as F

    from bertpipe.infra import attention as A

    b, n, h, d = a.kernel_batch, max(a.seqs), a.heads, a.hidden // a.heads
    docs = torch.zeros(b, n, dtype=torch.long)
    doc_lens = []
    for r in range(b):
        real = n - (n // 8 if r % 2 else 0)  # every other row ends with an eighth of padding
        cuts = [0, real // 3, 2 * real // 3, real]
        for i in range(3):
            docs[r, cuts[i] : cuts[i + 1]] = i + 1
            doc_lens.append(cuts[i + 1] - cuts[i])
    offsets, on_device = A.segment_offsets(docs).to(device), docs.to(device)
    mask = A.document_mask(on_device, "sdpa")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    variants = {
        "SDPA, no mask (not confined)": lambda: F.scaled_dot_product_attention(q, k, v),
        "mask (4D document mask)": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "varlen (SDPA, nested jagged)": lambda: A.varlen_attention(None, q, k, v, None, doc_offsets=offsets,
                                                                   doc_max_len=n)[0],
    }
    if device.type == "cuda":
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            table.add("kernels", "torch varlen_attn", f"not in torch {torch.__version__}")
        else:
            def flat(x):
                return x.transpose(1, 2).reshape(b * n, h, d)

            variants["torch varlen_attn (no dropout)"] = lambda: varlen_attn(flat(q), flat(k), flat(v), offsets,
                                                                             offsets, n, n)
    block = A.document_block_mask(on_device)
    backward_flex = device.type == "cuda"  # FlexAttention has no backward on the CPU
    fq, fk, fv = (x if backward_flex else x.detach() for x in (q, k, v))
    variants["flex (compiled)" if device.type == "cuda" else "flex (eager, forward only)"] = \
        lambda: A.flex_attention(None, fq, fk, fv, None, doc_block_mask=block)[0]
    # useful attention FLOPs: scores and mix over each document's tokens (4 x len^2 x d per head), x3 with backward
    useful = 4 * d * h * sum(k * k for k in doc_lens) * 3
    out, base = {}, None
    for name, fn in variants.items():
        backward = backward_flex or not name.startswith("flex")

        def timed(fn=fn, backward=backward):
            for _ in range(3):  # warm-up (flex compiles here)
                o = fn()
                if backward:
                    o.float().sum().backward()
            sync(device)
            t = time.perf_counter()
            for _ in range(a.kernel_reps):
                o = fn()
                if backward:
                    o.float().sum().backward()
            sync(device)
            return (time.perf_counter() - t) / a.kernel_reps

        secs = table.attempt("kernels", name, timed)
        if secs is None:
            continue
        out[name] = {"ms": 1000 * secs, "backward": backward}
        base = secs if name.startswith("mask") else base
        table.add("kernels", name, f"{1000 * secs:.3f} ms fwd{'+bwd' if backward else ''}",
                  useful / (3 if not backward else 1) / secs / peak,
                  f"x{base / secs:.2f} of mask" if base and not name.startswith("mask") else "")
    out["shape"] = {"batch": b, "seq": n, "heads": h, "head_dim": d, "real_tokens": sum(doc_lens), "docs_per_row": 3}
    return out


# ---------------------------------------------------------------- 3. pretraining


def random_examples(n: int, seq: int, seed: int, docs: int = 1):
    """``n`` full rows of random ids; ``docs`` > 1 packs that many documents per row ([SEP] between them)."""
    import numpy as np

    from bertpipe.lib.mlm.data import Example

    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = g.integers(104, VOCAB, seq).astype(np.int32)
        ids[0], ids[-1] = 101, 102
        words = np.arange(seq, dtype=np.int32)
        words[0] = words[-1] = -1
        for k in range(1, docs):  # document separators: special tokens inside the row
            cut = k * seq // docs
            ids[cut], words[cut] = 102, -1
        out.append(Example(ids, words, seq))
    return out


def run_bertpipe(a, tok, device, prec_name: str, seq: int, batch: int, docs: int = 1, compile_setting: str = "off",
                 attention: str = "auto") -> dict:
    from transformers import BertForMaskedLM

    from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.lib.mlm.train import Dist, eval_batches, train

    p = PretrainParams(max_seq_len=seq, batch_size=batch, max_steps=a.steps, lr=1e-4, warmup_ratio=0.1,
                       eval_every=10**9, save_every=10**9, log_every=max(1, a.steps // 4), precision=prec_name,
                       whole_word=False, eval_examples=batch, seed=0, compile=compile_setting, attention=attention)
    ex = random_examples(batch * a.steps, seq, 0, docs)
    spec = MaskSpec.from_params(p)
    evals = eval_batches(random_examples(batch, seq, 1, docs), p, spec, tok.mask_token_id, normal_token_ids(tok),
                         tok.pad_token_id)
    torch.manual_seed(0)
    pm = PretrainModel(BertForMaskedLM(bert_config(a)), pair=False)
    with tempfile.TemporaryDirectory() as tmp:
        res = train(pm, ex, evals, p, spec, tok, normal_token_ids(tok), Path(tmp), Dist(device=device))
    rates = [r["tokens_per_s"] for r in res.history if "tokens_per_s" in r]
    # the first window holds warm-up (allocator, kernels, a compile): the later ones are the steady state
    steady = rates[1:] or rates
    return {"tokens_per_s": sorted(steady)[len(steady) // 2], "loss": res.final_eval["eval_loss"],
            "precision": res.precision.words(), "attention": res.attention, "compiled": res.compiled,
            "compile_s": res.compile_s}


def run_hf(a, tok, device, prec, seq: int, batch: int) -> dict:
    """run_mlm's recipe: full ``seq`` blocks (grouped texts), DataCollatorForLanguageModeling, Trainer."""
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

    blocks = [{"input_ids": e.ids.tolist(), "attention_mask": [1] * seq, "token_type_ids": [0] * seq,
               "special_tokens_mask": [1] + [0] * (seq - 2) + [1]} for e in random_examples(batch * a.steps, seq, 0)]
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            sync(device)
            times.append(time.perf_counter())

    torch.manual_seed(0)
    model = BertForMaskedLM(bert_config(a))
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, max_steps=a.steps, per_device_train_batch_size=batch, learning_rate=1e-4,
            warmup_steps=max(1, a.steps // 10), logging_strategy="no", save_strategy="no", report_to=[],
            use_cpu=device.type == "cpu", dataloader_num_workers=0, seed=0, disable_tqdm=True,
            bf16=prec.dtype == "bf16", fp16=prec.dtype == "fp16", tf32=prec.tf32 or None)
        trainer = Trainer(model=model, args=targs, train_dataset=blocks, callbacks=[Clock()],
                          data_collator=DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15))
        trainer.train()
    skip = max(1, len(times) // 4)  # the same warm-up allowance as bertpipe's first log window
    steady = (times[-1] - times[skip - 1]) / max(1, len(times) - skip)
    return {"tokens_per_s": batch * seq / steady}


def pretrain_section(a, tok, device, prec, peak, table: Table, compile_on: bool, started: float) -> dict:
    out: dict = {}
    for seq, batch in a.seqs.items():
        sec = f"pretrain {seq}"
        fpt = flops_per_token(a, seq)
        r: dict = {"batch": batch, "flops_per_token": fpt}
        r["bertpipe"] = one = table.attempt(sec, "bertpipe, one document a row",
                                            lambda: run_bertpipe(a, tok, device, prec.dtype, seq, batch))
        r["hf"] = hf = table.attempt(sec, "HF run_mlm recipe (Trainer)", lambda: run_hf(a, tok, device, prec, seq, batch))
        if hf:
            table.add(sec, "HF run_mlm recipe (Trainer)", f"{hf['tokens_per_s']:,.0f} tok/s",
                      hf["tokens_per_s"] * fpt / peak)
        if one:
            table.add(sec, "bertpipe, one document a row", f"{one['tokens_per_s']:,.0f} tok/s",
                      one["tokens_per_s"] * fpt / peak,
                      f"x{one['tokens_per_s'] / hf['tokens_per_s']:.2f} of HF" if hf else "")
        for kind in ("mask", "varlen"):
            what = f"bertpipe, 3 documents a row, attention: {kind}"
            r[f"packed_{kind}"] = pk = table.attempt(
                sec, what, lambda kind=kind: run_bertpipe(a, tok, device, prec.dtype, seq, batch, 3, attention=kind))
            if pk:
                table.add(sec, what, f"{pk['tokens_per_s']:,.0f} tok/s", pk["tokens_per_s"] * fpt / peak,
                          f"x{pk['tokens_per_s'] / one['tokens_per_s']:.2f} of one document a row" if one else "")
        if compile_on and seq == max(a.seqs):
            left = BUDGET_S - (time.perf_counter() - started)
            what = "bertpipe, 3 documents a row, auto kernel, compiled"
            if left < 240:
                table.add(sec, what, f"skipped ({left:.0f} s of the budget left)")
                continue
            r["packed_compiled"] = c = table.attempt(
                sec, what, lambda: run_bertpipe(a, tok, device, prec.dtype, seq, batch, 3, compile_setting="on"))
            eager = r.get(f"packed_{'varlen' if device.type == 'cuda' else 'mask'}")
            if c:
                table.add(sec, what, f"{c['tokens_per_s']:,.0f} tok/s", c["tokens_per_s"] * fpt / peak,
                          (f"x{c['tokens_per_s'] / eager['tokens_per_s']:.2f} of eager; " if eager else "")
                          + f"compiling ~{c['compile_s'] or 0:.0f} s")
        out[str(seq)] = r
    return out


# ---------------------------------------------------------------- 4. finetuning


def finetune_examples(a, n: int, seed: int) -> list[dict]:
    """Rows of a quarter to all of ``a.ft_seq`` random ids, labels alternating."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(a.ft_seq // 4, a.ft_seq + 1, (n,), generator=g).tolist()
    return [{"input_ids": torch.randint(104, VOCAB, (k,), generator=g).tolist(), "labels": i % 2}
            for i, k in enumerate(lengths)]


def finetune_epoch(a, feats, device, precision: str, attention: str) -> dict:
    import itertools

    from transformers import BertForSequenceClassification

    from bertpipe.lib.training.loop import train
    from bertpipe.lib.training.params import TrainParams

    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(a)).to(device)
    tp = TrainParams(lr=3e-5, epochs=1, batch_size=a.ft_batch, precision=precision, warmup_ratio=0.1,
                     attention=attention, compile="off")
    better = itertools.count()
    t = time.perf_counter()
    res = train(model, feats, tp, lambda m: (next(better), {}), pad_id=0, seed=0)
    sync(device)
    secs = time.perf_counter() - t
    return {"precision": res.precision.words(), "attention": res.attention, "examples_per_s": len(feats) / secs,
            "seconds": secs, "loss_first": res.losses[0][1], "loss_last": res.losses[-1][1]}


def finetune_hf(a, feats, tok, device, prec) -> dict:
    """run_classification's defaults: Trainer, DataCollatorWithPadding (each batch padded to its longest row),
    shuffled batches; the same lr, warm-up, batch and epoch as bertpipe's."""
    from transformers import BertForSequenceClassification, DataCollatorWithPadding, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(a))
    with tempfile.TemporaryDirectory() as tmp:
        steps = -(-len(feats) // a.ft_batch)
        targs = TrainingArguments(output_dir=tmp, num_train_epochs=1, per_device_train_batch_size=a.ft_batch,
                                  learning_rate=3e-5, warmup_steps=round(0.1 * steps), logging_strategy="no",
                                  save_strategy="no",
                                  report_to=[], use_cpu=device.type == "cpu", dataloader_num_workers=0, seed=0,
                                  disable_tqdm=True, bf16=prec.dtype == "bf16", fp16=prec.dtype == "fp16",
                                  tf32=prec.tf32 or None)
        trainer = Trainer(model=model, args=targs, train_dataset=feats, data_collator=DataCollatorWithPadding(tok))
        t = time.perf_counter()
        trainer.train()
        sync(device)
        secs = time.perf_counter() - t
    return {"examples_per_s": len(feats) / secs, "seconds": secs}


def finetune_section(a, tok, device, prec, peaks, table: Table) -> dict:
    feats = finetune_examples(a, a.ft_examples, 0)
    per_example = encoder_flops(a, [len(f["input_ids"]) for f in feats], 3) / len(feats)
    sec, out = "finetune", {"mean_length": sum(len(f["input_ids"]) for f in feats) / len(feats)}
    out["hf"] = hf = table.attempt(sec, "HF Trainer (dynamic padding)", lambda: finetune_hf(a, feats, tok, device, prec))
    if hf:
        table.add(sec, f"HF Trainer (dynamic padding), {prec.dtype}", f"{hf['examples_per_s']:,.0f} ex/s",
                  hf["examples_per_s"] * per_example / peaks.get(prec.dtype, peaks["fp32"]))
    runs = [("bf16", "mask"), ("bf16", "varlen"), ("fp16", "auto")] if device.type == "cuda" else \
        [("bf16", "mask"), ("bf16", "varlen"), ("fp16", "mask")]
    for precision, kind in runs:
        what = f"bertpipe, {precision}, attention: {kind}"
        r = table.attempt(sec, what, lambda p=precision, k=kind: finetune_epoch(a, feats, device, p, k))
        out[f"{precision}_{kind}"] = r
        if r:
            r["mfu"] = r["examples_per_s"] * per_example / peaks.get(precision, peaks["fp32"])
            vs = f"x{r['examples_per_s'] / hf['examples_per_s']:.2f} of HF; " if hf else ""
            table.add(sec, what, f"{r['examples_per_s']:,.0f} ex/s", r["mfu"] if r["mfu"] == r["mfu"] else None,
                      f"{vs}loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}")
    return out


# ---------------------------------------------------------------- 5. inference


def inference_section(a, device, prec, peak, table: Table) -> dict:
    from transformers import BertForSequenceClassification

    from bertpipe.infra import attention as A
    from bertpipe.lib.training.batches import collate
    from bertpipe.lib.training.predict import run_model

    model = BertForSequenceClassification(bert_config(a)).to(device).eval()
    dtype = prec.autocast
    sec, out = "inference", {}
    feats = finetune_examples(a, a.inf_batch, 1)
    mixed = collate(feats, 0)
    one = {"input_ids": torch.randint(104, VOCAB, (1, a.ft_seq)), "attention_mask": torch.ones(1, a.ft_seq).long()}

    def rate(batch: dict, kind: str, reps: int) -> float:
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32,
                                                    enabled=dtype is not None), A.kernel(model, kind, "gpu_check"):
            inputs = A.model_batch(model, {k: v.to(device) for k, v in A.prepare(batch, kind).items()})
            for _ in range(3):
                model(**inputs)
            sync(device)
            t = time.perf_counter()
            for _ in range(reps):
                model(**inputs)
            sync(device)
        return (time.perf_counter() - t) / reps

    secs = table.attempt(sec, "batch 1", lambda: rate(one, "mask", 4 * a.inf_reps))
    if secs:
        out["batch1"] = {"latency_ms": 1000 * secs, "seq": a.ft_seq}
        table.add(sec, f"batch 1, seq {a.ft_seq} (no padding: plain SDPA)", f"{1000 * secs:.2f} ms latency")
    flops = encoder_flops(a, [len(f["input_ids"]) for f in feats], 1)
    base = None
    for kind in ("mask", "varlen", "flex"):
        what = f"batch {a.inf_batch}, mixed lengths, attention: {kind}"
        secs = table.attempt(sec, what, lambda k=kind: rate(mixed, k, a.inf_reps))
        if secs:
            out[kind] = {"examples_per_s": a.inf_batch / secs}
            base = secs if kind == "mask" else base
            table.add(sec, what, f"{a.inf_batch / secs:,.0f} ex/s", flops / secs / peak,
                      f"x{base / secs:.2f} of mask" if base and kind != "mask" else "")
    scored = finetune_examples(a, a.ft_examples, 2)

    def scoring() -> float:
        run_model(model, scored[: a.inf_batch], 0, 64, prec.bf16)  # warm-up
        sync(device)
        t = time.perf_counter()
        run_model(model, scored, 0, 64, prec.bf16)
        return time.perf_counter() - t

    secs = table.attempt(sec, "run_model", scoring)
    if secs:
        out["run_model"] = {"examples_per_s": len(scored) / secs}
        table.add(sec, f"run_model, {len(scored)} rows (sorted, token-budgeted, auto kernel)",
                  f"{len(scored) / secs:,.0f} ex/s", encoder_flops(a, [len(f["input_ids"]) for f in scored], 1)
                  / secs / peak)
    out["onnxruntime"] = onnx_rate(a, model, mixed)
    table.add(sec, "onnxruntime CUDA", out["onnxruntime"] if isinstance(out["onnxruntime"], str)
              else f"{out['onnxruntime']['examples_per_s']:,.0f} ex/s (fp32)")
    return out


def onnx_rate(a, model, batch: dict):
    try:
        import onnxruntime as ort
    except ImportError:
        return "skipped: onnxruntime is not installed"
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return f"skipped: no CUDAExecutionProvider (have {providers})"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            ids, mask = batch["input_ids"], batch["attention_mask"]
            torch.onnx.export(model.float().cpu(), (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                              output_names=["logits"], dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                                                     "attention_mask": {0: "b", 1: "s"}},
                              dynamo=False)
            sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
            feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            for _ in range(3):
                sess.run(None, feed)
            t = time.perf_counter()
            for _ in range(a.inf_reps):
                sess.run(None, feed)
            return {"examples_per_s": len(ids) * a.inf_reps / (time.perf_counter() - t),
                    "provider": sess.get_providers()[0], "dtype": "fp32"}
    except Exception as e:  # noqa: BLE001 (a report line, not a failure of the whole check)
        return f"failed: {type(e).__name__}: {str(e)[:200]}"


# ---------------------------------------------------------------- the run


def default_json(name: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia ")).strip("-")
    return REPO / "docs" / f"gpu-check-{slug}.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and steps (any device; what the tests run)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default="", help="where the results go (default: docs/gpu-check-<gpu>.json on a GPU; "
                                              "none under --smoke)")
    ap.add_argument("--stages", choices=("on", "off"), default="on",
                    help="also run whole stages through the CLI on a tiny project (bench/gpu_stages.py)")
    ap.add_argument("--compile", choices=("on", "off"), default=None,
                    help="also time the compiled pretrain loop (default: on, off under --smoke: compiling on a CPU "
                         "takes minutes)")
    args = ap.parse_args()
    a = shapes(args.smoke)
    compile_on = (args.compile or ("off" if args.smoke else "on")) == "on"

    from bertpipe.infra.device import pick_device, precision_for

    device = pick_device(args.device)
    if device.type == "cuda":
        if device.index is None:  # torch 2.11's set_device refuses a bare "cuda" (seen on the H200)
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    prec = precision_for("auto", device)
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import transformers

    print(f"device: {name}; torch {torch.__version__}; transformers {transformers.__version__}; precision policy: "
          f"{prec.words()}", flush=True)
    reps = 20 if device.type == "cuda" else 3
    peaks = {"bf16": matmul_peak(device, torch.bfloat16, a.mm, reps),
             "fp16": matmul_peak(device, torch.float16, a.mm, reps) if device.type == "cuda" else float("nan"),
             "fp32": matmul_peak(device, torch.float32, a.mm, reps)}
    peak = peaks.get(prec.dtype, peaks["fp32"])
    print("matmul peak (GFLOP/s): " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items()), flush=True)

    table = Table()
    tok = tokenizer()
    results: dict = {"device": name, "torch": torch.__version__, "transformers": transformers.__version__,
                     "precision": prec.words(), "peaks": peaks, "smoke": args.smoke}
    path = Path(args.json) if args.json else (None if args.smoke or device.type != "cuda" else default_json(name))

    def save() -> None:  # after every section: a check stopped at its time limit keeps what it measured
        if path is not None:
            results["seconds"], results["table"] = time.perf_counter() - started, table.rows
            path.write_text(json.dumps(results, indent=1, default=str) + "\n")

    results["kernels"] = kernel_section(a, device, prec.autocast or torch.float32, peak, table)
    save()
    results["pretrain"] = pretrain_section(a, tok, device, prec, peak, table, compile_on, started)
    save()
    results["finetune"] = finetune_section(a, tok, device, prec, peaks, table)
    save()
    results["inference"] = inference_section(a, device, prec, peak, table)
    save()
    stages_ok = True
    if args.stages == "on":
        left = BUDGET_S - (time.perf_counter() - started)
        if left < 150 and not args.smoke:
            print(f"stages skipped: {left:.0f} s of the budget left", flush=True)
            results["stages"] = {"skipped": f"{left:.0f} s of the budget left"}
        else:
            from gpu_stages import failed, section  # bench/, beside this script

            if device.type == "cuda":
                torch.cuda.empty_cache()  # the stages run in processes of their own, on the same GPU
            results["stages"] = section(args.smoke, str(device))
            stages_ok = not failed(results["stages"])
            for stage, rep in results["stages"].items():
                if isinstance(rep, dict) and "seconds" in rep:
                    rate = (f", {rep['tokens_per_s']:,.0f} tok/s" if rep.get("tokens_per_s") else "") + (
                        f", {rep['examples_per_s']:,.0f} ex/s" if rep.get("examples_per_s") else "")
                    table.rows.append({"section": "stages", "what": stage + (f" ({rep['attention']})"
                                                                             if rep.get("attention") else ""),
                                       "rate": f"{rep['seconds']:.1f} s{rate}" if "failed" not in rep else "FAILED",
                                       "mfu": None, "vs": ""})
    save()
    table.print()
    print(f"gpu check done in {time.perf_counter() - started:.0f} s", flush=True)
    if path is not None:
        print(f"results: {path}", flush=True)
    return 0 if stages_ok and not table.failed else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
