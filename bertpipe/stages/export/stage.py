"""The export stage: one model that register will log (a finetuned task, a student, the encoder) as ONNX and int8.

Output (``ctx.out``): ``model.onnx`` (fp32, dynamic batch and sequence), ``model.int8.onnx`` (dynamic
quantization), ``task.json`` (what inference needs: task type, labels, long-text handling) and ``checks.json``:
the largest |torch - onnxruntime| output difference, whether predictions on the test split are identical, and each
backend's test quality (torch, onnx, int8). A parity failure beyond ``export.atol`` fails the stage.

A task's export takes every encoder's finetune of the task (inputs ``finetune/<encoder>``) and exports the best
non-degenerate one by dev score (``bertpipe.lib.training.choice``); ``selection.json`` records which, for register.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from bertpipe.infra.cores import use_training_threads
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.inference.backends import INT8_FILE, ONNX_FILE, OrtModel, load_torch
from bertpipe.stages.export.onnx import export_onnx, quantize_int8

PRED_KEY = {"qa": "prediction", "ner": "pred"}


def _max_diff(a: list, b: list) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        for u, v in zip(x if isinstance(x, tuple) else (x,), y if isinstance(y, tuple) else (y,)):
            worst = max(worst, float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) if np.size(u) else 0.0)
    return worst


def _task_checks(ctx, task: str, model_dir: Path, backends: dict) -> dict:
    from transformers import AutoTokenizer

    from bertpipe.lib.labelled import model_labels, task_examples, task_settings
    from bertpipe.lib.measures.metrics import PRIMARY
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.predict import run_model, score
    from bertpipe.lib.training.taskfiles import cap

    ep = ctx.params
    p, tp = task_settings(ctx.cfg, task, model_dir, ctx.log)
    exs = task_examples(ctx.cfg, task)["test"]
    exs = cap(exs, ep.max_examples, p.split_seed) if ep.max_examples else exs
    if not exs:
        raise BertpipeError(f"export/{task}: the task has no test examples to check the export on")
    labels = model_labels(model_dir)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    split = featurize(tok, exs, p, tp, {lab: i for i, lab in enumerate(labels)}, Counter(), "test")
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    raw = {n: run_model(m, split.feats, pad, ep.batch_size, False) for n, m in backends.items()}
    primary = PRIMARY[p.type]
    quality, preds = {}, {}
    for n, m in backends.items():
        flat, _, recs = score(m, split, p, labels, pad, ep.batch_size, False, outs=raw[n])  # scored once
        quality[n] = flat
        key = PRED_KEY.get(p.type, "pred")
        preds[n] = [r[key] for r in recs]
    out = {"examples": len(exs), "features": len(split.feats), "primary": primary, "quality": quality,
           "max_abs_diff": {n: _max_diff(raw["torch"], raw[n]) for n in raw if n != "torch"},
           "agreement": {n: float(np.mean([a == b for a, b in zip(preds["torch"], preds[n])]))
                         for n in preds if n != "torch"}}
    if "int8" in quality:
        out["int8_loss_points"] = 100 * (quality["torch"].get(primary, 0) - quality["int8"].get(primary, 0))
    return out


def _encoder_checks(ctx, model_dir: Path, backends: dict) -> dict:
    """The encoder has no task: its masked-LM logits on valid-split texts are compared, top-1 token agreement."""
    from transformers import AutoTokenizer

    from bertpipe.lib.corpusio import read_texts
    from bertpipe.lib.training.predict import run_model

    texts = read_texts(ctx.inputs["corpus"], "valid", limit=ctx.params.max_examples or 64)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    enc = tok(texts, truncation=True, max_length=128)
    feats = [{k: enc[k][i] for k in enc if k in ("input_ids", "token_type_ids")} for i in range(len(texts))]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    raw = {n: run_model(m, feats, pad, ctx.params.batch_size, False) for n, m in backends.items()}
    top = {n: np.concatenate([o.argmax(-1) for o in outs]) for n, outs in raw.items()}
    return {"examples": len(texts), "primary": "top1_agreement",
            "max_abs_diff": {n: _max_diff(raw["torch"], raw[n]) for n in raw if n != "torch"},
            "agreement": {n: float(np.mean(top["torch"] == top[n])) for n in top if n != "torch"},
            "quality": {n: {"top1_agreement": float(np.mean(top["torch"] == top[n]))} for n in top}}


def describe(checks: dict) -> str:
    """The export checks as markdown lines (for the registered version's description)."""
    q = checks["quality"]
    primary = checks["primary"]
    lines = [f"- ONNX fp32 (opset {checks['opset']}, dynamic batch/sequence): max |torch - onnxruntime| = "
             f"{checks['max_abs_diff'].get('onnx', float('nan')):.2e} (atol {checks['atol']}), predictions identical "
             f"on {checks['agreement'].get('onnx', 0):.1%} of {checks['examples']} test examples",
             f"- size: torch {checks['sizes']['torch'] / 1e6:.2f} MB, onnx {checks['sizes']['onnx'] / 1e6:.2f} MB"
             + (f", int8 {checks['sizes']['int8'] / 1e6:.2f} MB" if "int8" in checks["sizes"] else "")]
    cols = ", ".join(f"{n} {v.get(primary, float('nan')):.4f}" for n, v in q.items())
    lines.append(f"- test {primary}: {cols}")
    if "int8" in checks["agreement"]:
        lines.append(f"- int8 predictions equal to torch on {checks['agreement']['int8']:.1%}")
    return "\n".join(lines)


def build(ctx, key: str, task: str | None) -> dict:
    from bertpipe.core.stage import write_json
    from bertpipe.lib.inference.predictor import task_meta
    from bertpipe.lib.inference.speed import dir_size
    from bertpipe.lib.training.choice import SELECTION_FILE, choose

    ep = ctx.params
    # the parity numbers checks.json records depend on the thread count: the same in every door (bertpipe.infra.cores);
    # export has no setting of its own, so it takes the share
    ctx.counts["torch_threads"] = use_training_threads(0)
    finetunes = {k.split("/", 1)[1]: Path(v) for k, v in ctx.inputs.items() if k.startswith("finetune/")}
    choice = choose(finetunes) if finetunes else None
    if choice is not None:
        write_json(ctx.out / SELECTION_FILE, choice.record())
        ctx.counts.update(encoder=choice.encoder, degenerate=int(choice.degenerate))
        ctx.log(f"{key}: exporting the {choice.words()}")
    model_dir = (Path(choice.source) if choice is not None else Path(ctx.inputs["model"])) / "model"
    if not (model_dir / "config.json").is_file():
        raise BertpipeError(f"export/{key}: no saved model at {model_dir}")
    meta = export_onnx(model_dir, ctx.out / ONNX_FILE, ep.opset)
    # onnxruntime's CUDA provider when it is installed (the sessions' default), else the CPU's; the providers used
    # are recorded in checks.json
    backends = {"torch": load_torch(model_dir), "onnx": OrtModel(ctx.out / ONNX_FILE)}
    if ep.quantize:
        quantize_int8(ctx.out / ONNX_FILE, ctx.out / INT8_FILE, ep.per_channel)
        backends["int8"] = OrtModel(ctx.out / INT8_FILE)
    checks = _task_checks(ctx, task, model_dir, backends) if task else _encoder_checks(ctx, model_dir, backends)
    sizes = {"torch": dir_size(model_dir), "onnx": dir_size(ctx.out / ONNX_FILE)}
    if ep.quantize:
        sizes["int8"] = dir_size(ctx.out / INT8_FILE)
    if choice is not None:
        checks.update(encoder=choice.encoder, degenerate=choice.degenerate)
    checks.update({"key": key, "task": task, "opset": ep.opset, "atol": ep.atol, "sizes": sizes, **meta,
                   "exporter": "torch.onnx.export(dynamo=False, dynamic_axes)",
                   "providers": {n: m.sess.get_providers() for n, m in backends.items() if hasattr(m, "sess")}})
    write_json(ctx.out / "checks.json", checks)
    write_json(ctx.out / "task.json", task_meta(ctx.cfg, task, model_dir))
    (ctx.out / "checks.md").write_text(describe(checks) + "\n", encoding="utf-8")
    diff = checks["max_abs_diff"]["onnx"]
    ctx.log(f"{key}: onnx max |diff| {diff:.2e}, agreement {checks['agreement']}, sizes {sizes}")
    if not diff <= ep.atol:
        raise BertpipeError(f"export/{key}: onnxruntime differs from torch by {diff:.3g} > export.atol {ep.atol}")
    ctx.log_artifact(ctx.out / "checks.json")
    flat = {f"max_abs_diff_{n}": v for n, v in checks["max_abs_diff"].items()}
    flat.update({f"agreement_{n}": v for n, v in checks["agreement"].items()})
    flat.update({f"{n}_{checks['primary']}": v.get(checks["primary"], 0.0) for n, v in checks["quality"].items()})
    flat.update({f"size_{n}": float(v) for n, v in sizes.items()})
    if choice is not None:
        flat["degenerate"] = float(choice.degenerate)
    ctx.log_metrics(flat)
    return flat
