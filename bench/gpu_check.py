"""The GPU check: one run on a CUDA machine that prints what bertpipe gets from it.

    bench/gpu_check.sh            # on the GPU machine (<= 9.5 minutes); needs torch, transformers, pydantic
    bench/gpu_check.sh --smoke    # tiny shapes, any device (the CI runs this on the CPU)

1. the precision policy's choice for the device and the matmul peaks measured here (bf16, fp16, fp32/TF32);
2. a BERT-base-shaped MLM (12 layers, hidden 768, vocab 21128) at seq 512: bertpipe's pretrain loop
   (bertpipe.lib.mlm.train.train) vs the HF run_mlm recipe (Trainer + DataCollatorForLanguageModeling on
   grouped, full-length blocks), same model, batch, steps and precision: tokens/s and MFU against the measured matmul
   peak; the same loop on rows packing three documents each (document-confined attention, a 4D mask) against the same
   rows as one document (the padding mask), and compiled (``compile: on``, Inductor) against eager, with the compile
   time;
3. one finetune epoch (bertpipe.lib.training.loop.train, sequence classification) in bf16 and in fp16 + GradScaler, with
   its MFU;
4. inference: torch (eager, autocast) at batch 1 (latency) and at the throughput batch (256), and onnxruntime's CUDA
   provider when it is installed;
5. whole stages (bench/gpu_stages.py, ``--stages off`` skips them): the real ``python -m bertpipe splits``,
   ``prepare``, ``start``, ``vocab``, ``pretrain`` and ``finetune``, one process each, on a tiny project built in a
   temp dir (a synthetic corpus and keyword task, a WordPiece tokenizer over their characters, a random
   BERT-base-shaped encoder as ``model.base``) with tracking off (``tracking.uri: none``: no MLflow): each stage's
   wall time, pretrain's tokens/s and finetune's examples/s, and the device and precision each stage says it used.

Data are random token ids (no corpus or tokenizer download on the GPU machine): speed, not quality, is measured;
the losses are printed only to show that each run trained.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 21128  # bert-base-chinese's vocabulary size


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def run_bertpipe(a, tok, device, prec_name: str, docs: int = 1, compile_setting: str = "off") -> dict:
    from transformers import BertForMaskedLM

    from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
    from bertpipe.lib.mlm.model import PretrainModel
    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.lib.mlm.train import Dist, eval_batches, train

    p = PretrainParams(max_seq_len=a.seq, batch_size=a.batch, max_steps=a.steps, lr=1e-4, warmup_ratio=0.1,
                       eval_every=10**9, save_every=10**9, log_every=max(1, a.steps // 4), precision=prec_name,
                       whole_word=False, eval_examples=a.batch, seed=0, compile=compile_setting)
    ex = random_examples(a.batch * a.steps, a.seq, 0, docs)
    spec = MaskSpec.from_params(p)
    evals = eval_batches(random_examples(a.batch, a.seq, 1), p, spec, tok.mask_token_id, normal_token_ids(tok),
                         tok.pad_token_id)
    torch.manual_seed(0)
    pm = PretrainModel(BertForMaskedLM(bert_config(a)), pair=False)
    with tempfile.TemporaryDirectory() as tmp:
        res = train(pm, ex, evals, p, spec, tok, normal_token_ids(tok), Path(tmp), Dist(device=device))
    rates = [h["tokens_per_s"] for h in res.history if "tokens_per_s" in h]
    # the first window holds warm-up (allocator, kernels): the later ones are the steady state
    steady = rates[1:] or rates
    return {"tokens_per_s": sorted(steady)[len(steady) // 2], "loss": res.final_eval["eval_loss"],
            "precision": res.precision.words(), "compiled": res.compiled, "compile_s": res.compile_s}


def run_hf(a, tok, device, prec) -> dict:
    """run_mlm's recipe: full --seq blocks (grouped texts), DataCollatorForLanguageModeling, Trainer."""
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling, Trainer, TrainingArguments, TrainerCallback

    blocks = [{"input_ids": e.ids.tolist(), "attention_mask": [1] * a.seq, "token_type_ids": [0] * a.seq,
               "special_tokens_mask": [1] + [0] * (a.seq - 2) + [1]} for e in random_examples(a.batch * a.steps, a.seq, 0)]
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            sync(device)
            times.append(time.perf_counter())

    torch.manual_seed(0)
    model = BertForMaskedLM(bert_config(a))
    with tempfile.TemporaryDirectory() as tmp:
        targs = TrainingArguments(
            output_dir=tmp, max_steps=a.steps, per_device_train_batch_size=a.batch, learning_rate=1e-4,
            warmup_steps=max(1, a.steps // 10), logging_strategy="no", save_strategy="no", report_to=[],
            use_cpu=device.type == "cpu", dataloader_num_workers=0, seed=0, disable_tqdm=True,
            bf16=prec.dtype == "bf16", fp16=prec.dtype == "fp16", tf32=prec.tf32 or None)
        trainer = Trainer(model=model, args=targs, train_dataset=blocks, callbacks=[Clock()],
                          data_collator=DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.15))
        trainer.train()
    skip = max(1, len(times) // 4)  # the same warm-up allowance as bertpipe's first log window
    steady = (times[-1] - times[skip - 1]) / max(1, len(times) - skip)
    return {"tokens_per_s": a.batch * a.seq / steady}


def finetune_epoch(a, device, precision: str) -> dict:
    import itertools

    from transformers import BertForSequenceClassification

    from bertpipe.lib.training.loop import train
    from bertpipe.lib.training.params import TrainParams

    torch.manual_seed(0)
    model = BertForSequenceClassification(bert_config(a)).to(device)
    g = torch.Generator().manual_seed(0)
    feats = [{"input_ids": torch.randint(104, VOCAB, (a.ft_seq,), generator=g).tolist(), "labels": i % 2}
             for i in range(a.ft_examples)]
    tp = TrainParams(lr=3e-5, epochs=1, batch_size=a.ft_batch, precision=precision, warmup_ratio=0.1)
    better = itertools.count()
    t = time.perf_counter()
    res = train(model, feats, tp, lambda m: (next(better), {}), pad_id=0, seed=0)
    sync(device)
    secs = time.perf_counter() - t
    return {"precision": res.precision.words(), "examples_per_s": len(feats) / secs, "seconds": secs,
            "loss_first": res.losses[0][1], "loss_last": res.losses[-1][1],
            "flops_per_example": a.ft_seq * a.layers * (72 * a.hidden**2 + 12 * a.ft_seq * a.hidden)}


def inference(a, device, prec) -> dict:
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification(bert_config(a)).to(device).eval()
    out = {}
    dtype = prec.autocast
    for batch in (1, a.inf_batch):
        ids = torch.randint(104, VOCAB, (batch, a.ft_seq), device=device)
        mask = torch.ones_like(ids)
        reps = a.inf_reps * (4 if batch == 1 else 1)
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype or torch.float32,
                                                    enabled=dtype is not None):
            for _ in range(3):
                model(input_ids=ids, attention_mask=mask)
            sync(device)
            t = time.perf_counter()
            for _ in range(reps):
                model(input_ids=ids, attention_mask=mask)
            sync(device)
        secs = time.perf_counter() - t
        key = "torch" if batch == a.inf_batch else "torch_batch1"
        out[key] = {"batch": batch, "examples_per_s": batch * reps / secs, "latency_ms": 1000 * secs / reps,
                    "dtype": prec.dtype}
    try:
        import onnxruntime as ort
    except ImportError:
        out["onnxruntime"] = "skipped: onnxruntime is not installed"
        return out
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        out["onnxruntime"] = f"skipped: no CUDAExecutionProvider (have {providers})"
        return out
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "m.onnx"
            cpu_model = model.float().cpu()
            torch.onnx.export(cpu_model, (ids.cpu(), mask.cpu()), str(path), input_names=["input_ids", "attention_mask"],
                              output_names=["logits"], dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                                                     "attention_mask": {0: "b", 1: "s"}},
                              dynamo=False)
            sess = ort.InferenceSession(str(path), providers=["CUDAExecutionProvider"])
            feed = {"input_ids": ids.cpu().numpy(), "attention_mask": mask.cpu().numpy()}
            for _ in range(3):
                sess.run(None, feed)
            t = time.perf_counter()
            for _ in range(a.inf_reps):
                sess.run(None, feed)
            out["onnxruntime"] = {"examples_per_s": a.inf_batch * a.inf_reps / (time.perf_counter() - t),
                                  "provider": sess.get_providers()[0], "dtype": "fp32"}
    except Exception as e:  # noqa: BLE001 (a report line, not a failure of the whole check)
        out["onnxruntime"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes and steps (any device; what CI runs)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--stages", choices=("on", "off"), default="on",
                    help="also run whole stages through the CLI on a tiny project (bench/gpu_stages.py)")
    ap.add_argument("--compile", choices=("on", "off"), default=None,
                    help="also time the compiled pretrain loop (default: on, off under --smoke: compiling on a CPU "
                         "takes minutes)")
    a = ap.parse_args()
    a.compile = a.compile or ("off" if a.smoke else "on")
    if a.smoke:
        a.layers, a.hidden, a.heads, a.seq, a.batch, a.steps, a.mm = 2, 64, 2, 64, 4, 3, 256
        a.ft_seq, a.ft_batch, a.ft_examples, a.inf_batch, a.inf_reps = 32, 8, 16, 8, 2
    else:
        a.layers, a.hidden, a.heads, a.seq, a.batch, a.steps, a.mm = 12, 768, 12, 512, 32, 40, 8192
        a.ft_seq, a.ft_batch, a.ft_examples, a.inf_batch, a.inf_reps = 128, 32, 4096, 256, 20

    from bertpipe.infra.device import pick_device, precision_for

    device = pick_device(a.device)
    if device.type == "cuda":
        if device.index is None:  # torch 2.11's set_device refuses a bare "cuda" (seen on the H200)
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    prec = precision_for("auto", device)
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; precision policy: {prec.words()}", flush=True)
    reps = 20 if device.type == "cuda" else 3
    peaks = {"bf16": matmul_peak(device, torch.bfloat16, a.mm, reps),
             "fp16": matmul_peak(device, torch.float16, a.mm, reps) if device.type == "cuda" else float("nan"),
             "fp32": matmul_peak(device, torch.float32, a.mm, reps)}
    peak = peaks.get(prec.dtype, peaks["fp32"])
    print("matmul peak (GFLOP/s): " + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peaks.items()), flush=True)

    results: dict = {"device": name, "precision": prec.words(), "peaks": peaks}
    tok = tokenizer()
    fpt = flops_per_token(a, a.seq)
    bp = run_bertpipe(a, tok, device, prec.dtype)
    print(f"pretrain {a.layers}L/{a.hidden}H seq {a.seq} batch {a.batch}: bertpipe {bp['tokens_per_s']:.0f} "
          f"tokens/s, MFU {bp['tokens_per_s'] * fpt / peak:.1%} of the {prec.dtype} peak", flush=True)
    try:
        hf = run_hf(a, tok, device, prec)
        print(f"pretrain, HF run_mlm recipe (Trainer): {hf['tokens_per_s']:.0f} tokens/s, MFU "
              f"{hf['tokens_per_s'] * fpt / peak:.1%}; bertpipe / HF {bp['tokens_per_s'] / hf['tokens_per_s']:.2f}x",
              flush=True)
    except ImportError as e:  # Trainer needs accelerate
        hf = {"skipped": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"pretrain, HF recipe skipped ({hf['skipped']})", flush=True)
    results["pretrain"] = {"bertpipe": bp, "hf": hf, "flops_per_token": fpt}
    packed = run_bertpipe(a, tok, device, prec.dtype, docs=3)
    results["pretrain"]["packed_3_docs"] = packed
    print(f"pretrain, rows packing 3 documents (document-confined attention): {packed['tokens_per_s']:.0f} "
          f"tokens/s, x{packed['tokens_per_s'] / bp['tokens_per_s']:.2f} of one document per row", flush=True)
    if a.compile == "on":
        comp = run_bertpipe(a, tok, device, prec.dtype, compile_setting="on")
        results["pretrain"]["compiled"] = comp
        print(f"pretrain, compiled: {comp['tokens_per_s']:.0f} tokens/s "
              f"(x{comp['tokens_per_s'] / bp['tokens_per_s']:.2f} of eager), "
              f"MFU {comp['tokens_per_s'] * fpt / peak:.1%}; compiling took ~{comp['compile_s'] or 0:.0f} s",
              flush=True)
    results["finetune"] = {}
    for precision in ("bf16", "fp16"):
        r = finetune_epoch(a, device, precision)
        results["finetune"][precision] = r
        mfu = r["examples_per_s"] * r["flops_per_example"] / peaks.get(precision, peak)
        r["mfu"] = mfu
        print(f"finetune epoch ({a.ft_examples} examples, seq {a.ft_seq}) in {r['precision']}: "
              f"{r['examples_per_s']:.0f} examples/s, MFU {mfu:.1%}, loss {r['loss_first']:.3f} -> "
              f"{r['loss_last']:.3f}", flush=True)
    results["inference"] = inference(a, device, prec)
    print(f"inference (batch {a.inf_batch}, seq {a.ft_seq}): {json.dumps(results['inference'])}", flush=True)
    stages_ok = True
    if a.stages == "on":
        from gpu_stages import failed, section  # bench/, beside this script

        if device.type == "cuda":
            torch.cuda.empty_cache()  # the stages run in processes of their own, on the same GPU
        results["stages"] = section(a.smoke, str(device))
        stages_ok = not failed(results["stages"])
    results["seconds"] = time.perf_counter() - started
    print(f"gpu check done in {results['seconds']:.0f} s", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 0 if stages_ok else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
