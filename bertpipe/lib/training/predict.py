"""A model's outputs over features and what they score: raw outputs per feature in length-sorted batches (any
backend that quacks like a torch module: torch, ONNX, int8), and a split's metrics and prediction records."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from bertpipe.infra import attention
from bertpipe.lib.measures import metrics as M
from bertpipe.lib.training import qa as Q
from bertpipe.lib.training import tagging as T
from bertpipe.lib.training import windows as W
from bertpipe.lib.training.batches import collate, inference_batches, inference_tokens
from bertpipe.lib.training.features import Split
from bertpipe.lib.training.params import TaskParams


def run_model(model: torch.nn.Module, feats: Sequence[dict], pad_id: int, batch_size: int, bf16: bool
              ) -> list[Any]:
    """Raw outputs per feature: class logits, per-piece logits (trimmed), or (start, end) logits for QA.

    A transformers model runs the ``auto`` attention kernel of its device (``bertpipe.infra.attention``). On an
    accelerator each batch's outputs are copied to the host without waiting for them (pinned memory) and read after
    the last batch, so the device never idles while the host takes a batch apart."""
    device = next(model.parameters()).device
    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    out: list[Any] = [None] * len(feats)
    done: list[tuple[list[int], tuple[torch.Tensor, ...]]] = []  # (rows, host copies of their outputs)
    kind = attention.choose("auto", device, "attention")[0] if hasattr(model, "set_attn_implementation") else "mask"
    was_training = model.training
    model.eval()
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), \
            attention.kernel(model, kind, "attention"):
        lengths = [len(f["input_ids"]) for f in feats]
        for idx in inference_batches(order, lengths, batch_size, inference_tokens(device)):
            batch = attention.prepare(collate([{k: v for k, v in feats[i].items()
                                                if k in ("input_ids", "token_type_ids")} for i in idx], pad_id), kind)
            res = model(**attention.model_batch(model, {k: v.to(device, non_blocking=True) for k, v in batch.items()}))
            heads = (res.start_logits, res.end_logits) if hasattr(res, "start_logits") else (res.logits,)
            done.append((idx, tuple(h.float().to("cpu", non_blocking=device.type == "cuda") for h in heads)))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    model.train(was_training)
    for idx, heads in done:
        arrays = [h.numpy() for h in heads]
        for j, i in enumerate(idx):
            n = len(feats[i]["input_ids"])
            if len(arrays) == 2:
                out[i] = (arrays[0][j, :n], arrays[1][j, :n])
            else:
                out[i] = arrays[0][j, :n] if arrays[0].ndim == 3 else arrays[0][j]
    return out


def score(model, split: Split, p: TaskParams, labels: Sequence[str], pad_id: int, batch_size: int, bf16: bool,
          outs: list | None = None) -> tuple[dict, dict, list[dict]]:
    """(flat metrics, details, prediction records) of ``model`` on a split; ``outs``: its ``run_model`` outputs
    when the caller already has them (export compares them across backends, and need not run the split twice)."""
    if not split.examples:
        return {}, {}, []
    if outs is None:
        outs = run_model(model, split.feats, pad_id, batch_size, bf16)
    exs = split.examples
    if p.type == "qa":
        best = Q.best_spans(exs, split.feats, [o[0] for o in outs], [o[1] for o in outs], p.n_best, p.max_answer_len)
        flat, details = M.qa_metrics([b["text"] for b in best], [[a for a, _ in ex.answers] for ex in exs])
        recs = [{"id": ex.id, "question": ex.question, "prediction": b["text"], "start": b["start"],
                 "answers": [a for a, _ in ex.answers]} for ex, b in zip(exs, best)]
        return flat, details, recs
    per_ex: list[list[np.ndarray]] = [[] for _ in exs]
    for f, o in zip(split.feats, outs):
        per_ex[f["example"]].append(o)
    if p.type == "ner":
        gold_tags, pred_tags, recs = [], [], []
        for i, ex in enumerate(exs):
            pc = split.pieces[i]
            rows = [o[1:-1] for o in per_ex[i]]  # drop [CLS]/[SEP] rows
            lg = W.stitch(len(pc.ids), split.spans[i], rows) if pc.ids else np.zeros((0, len(labels)))
            first = T.word_first_mask(pc.word_ids)
            labs = [labels[int(k)] if (first[j] or p.label_all_pieces) else None for j, k in enumerate(lg.argmax(-1))]
            pred = T.decode_pieces(labs, pc.offsets, pc.word_ids)
            units = ex.units or T.word_units(pc.offsets, pc.word_ids)
            gold_tags.append(T.spans_to_unit_tags(units, ex.spans))
            pred_tags.append(T.spans_to_unit_tags(units, pred))
            recs.append({"id": ex.id, "text": ex.text, "gold": [[a, b, t, ex.text[a:b]] for a, b, t in ex.spans],
                         "pred": [[a, b, t, ex.text[a:b]] for a, b, t in pred]})
        flat, details = M.ner_metrics(gold_tags, pred_tags)
        return flat, details, recs
    scores = np.stack([W.aggregate(np.stack(rows), p.window_aggregate) for rows in per_ex])
    pred = [labels[int(k)] for k in scores.argmax(-1)]
    flat, details = M.classification_metrics([ex.label for ex in exs], pred, labels)
    recs = [{"id": ex.id, "label": ex.label, "pred": pr, "windows": len(per_ex[i]), "text": ex.text[:200]}
            for i, (ex, pr) in enumerate(zip(exs, pred))]
    return flat, details, recs
