"""The task heads: which Auto class, how examples become features, and how outputs become predictions and metrics.

Classification honours the truncation strategy (head, tail, head_tail, or windows aggregated per document); NER
always runs on windows over the whole sentence, stitched back so every piece is predicted; QA uses doc-stride
windows over the context.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from bertpipe.finetune import qa as Q
from bertpipe.finetune import tagging as T
from bertpipe.finetune import windows as W
from bertpipe.finetune.data import Example
from bertpipe.finetune.params import TaskParams, TrainParams
from bertpipe.scoring import metrics as M


# The transformers pipeline task of a head class, by class-name suffix: the one map finetune records in metrics.json
# and register logs by (transformers 5 has no question-answering pipeline; register then logs a pyfunc).
PIPELINE_TASKS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
}


def pipeline_task_of(class_name: str) -> str | None:
    """``BertForTokenClassification`` -> ``token-classification``; a bare encoder -> ``feature-extraction``."""
    for suffix, task in PIPELINE_TASKS.items():
        if class_name.endswith(suffix):
            return task
    return "feature-extraction" if class_name.endswith("Model") else None


def auto_class(task_type: str):
    import transformers as tf

    return {
        "classification": tf.AutoModelForSequenceClassification,
        "pair_classification": tf.AutoModelForSequenceClassification,
        "ner": tf.AutoModelForTokenClassification,
        "qa": tf.AutoModelForQuestionAnswering,
    }[task_type]


def load_model(task_type: str, encoder: Any, labels: Sequence[str]) -> torch.nn.Module:
    """A fresh head on ``encoder`` (MLM checkpoint, headless encoder or hub id); the head's new weights are expected."""
    from transformers.utils import logging as hf_logging

    kw: dict = {}
    if task_type != "qa":
        kw = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
              "label2id": {lab: i for i, lab in enumerate(labels)}}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialised" is the point of finetuning
    try:
        return auto_class(task_type).from_pretrained(str(encoder), **kw)
    finally:
        hf_logging.set_verbosity(level)


@dataclass
class Split:
    """A split's examples and features; ``pieces`` keeps NER's whole-sentence tokenisation for stitching."""

    examples: list[Example]
    feats: list[dict]
    pieces: list[W.Pieces] = field(default_factory=list)
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # NER: windows per example


def featurize(tok, exs: list[Example], p: TaskParams, tp: TrainParams, label2id: dict, counts: Counter, split: str
              ) -> Split:
    budget = tp.max_seq_len - W.n_specials(tok)
    feats: list[dict] = []
    if not exs:
        return Split(exs, feats)
    if p.type == "qa":
        feats = Q.qa_features(tok, exs, tp.max_seq_len, p.doc_stride, p.max_query_len, train=split == "train")
        counts[f"{split}_features"] = len(feats)
        return Split(exs, feats)
    if p.type == "pair_classification":
        enc = tok([e.text for e in exs], [e.text_pair for e in exs], truncation="longest_first",
                  max_length=tp.max_seq_len)
        for i, ex in enumerate(exs):
            f = {"input_ids": enc["input_ids"][i], "example": i, "labels": label2id[ex.label]}
            if "token_type_ids" in enc:
                f["token_type_ids"] = enc["token_type_ids"][i]
            feats.append(f)
        counts[f"{split}_features"] = len(feats)
        return Split(exs, feats)
    pieces = W.encode_pieces(tok, [e.text for e in exs])
    out = Split(exs, feats, pieces)
    for i, (ex, pc) in enumerate(zip(exs, pieces)):
        n = len(pc.ids)
        counts[f"{split}_long"] += n > budget
        if p.type == "ner":
            labels, lost = T.align_labels(pc.offsets, pc.word_ids, ex.spans, label2id, p.model_scheme,
                                          p.label_all_pieces)
            counts[f"{split}_spans_unaligned"] += lost
            wins = W.windows(n, budget, p.stride)
            out.spans.append(wins)
            for a, b in wins:
                feats.append({"input_ids": W.with_specials(tok, pc.ids[a:b]), "example": i,
                              "labels": [T.IGNORE] + labels[a:b] + [T.IGNORE]})
        elif p.truncation == "window":
            for a, b in W.windows(n, budget, p.stride):
                feats.append({"input_ids": W.with_specials(tok, pc.ids[a:b]), "example": i,
                              "labels": label2id[ex.label]})
        else:
            keep = W.truncate(n, budget, p.truncation, p.head_tokens)
            feats.append({"input_ids": W.with_specials(tok, [pc.ids[k] for k in keep]), "example": i,
                          "labels": label2id[ex.label]})
    counts[f"{split}_features"] = len(feats)
    return out


# Tokens per inference batch: rows sorted by length are grouped up to this many (padded) tokens, and never fewer
# rows than the caller's batch size, so short texts run in large batches (the device stays busy) while long ones
# stay within memory. Rows do not interact (each attends to its own tokens), so the grouping changes no result.
INFERENCE_TOKENS = 32768


def inference_batches(order: Sequence[int], lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """``order`` (indices sorted by length) cut into batches of at least ``batch_size`` rows, more while the batch
    stays within ``INFERENCE_TOKENS`` padded tokens."""
    out, cur = [], []
    for i in order:
        if cur and len(cur) >= batch_size and (len(cur) + 1) * max(lengths[i], 1) > INFERENCE_TOKENS:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def run_model(model: torch.nn.Module, feats: Sequence[dict], pad_id: int, batch_size: int, bf16: bool
              ) -> list[Any]:
    """Raw outputs per feature: class logits, per-piece logits (trimmed), or (start, end) logits for QA."""
    from bertpipe.finetune.train import collate

    device = next(model.parameters()).device
    order = sorted(range(len(feats)), key=lambda i: len(feats[i]["input_ids"]))
    out: list[Any] = [None] * len(feats)
    was_training = model.training
    model.eval()
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for idx in inference_batches(order, [len(f["input_ids"]) for f in feats], batch_size):
            batch = collate([{k: v for k, v in feats[i].items() if k in ("input_ids", "token_type_ids")}
                             for i in idx], pad_id)
            res = model(**{k: v.to(device, non_blocking=True) for k, v in batch.items()})
            if hasattr(res, "start_logits"):
                s, e = res.start_logits.float().cpu().numpy(), res.end_logits.float().cpu().numpy()
                for j, i in enumerate(idx):
                    n = len(feats[i]["input_ids"])
                    out[i] = (s[j, :n], e[j, :n])
            else:
                lg = res.logits.float().cpu().numpy()
                for j, i in enumerate(idx):
                    out[i] = lg[j, : len(feats[i]["input_ids"])] if lg.ndim == 3 else lg[j]
    model.train(was_training)
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


def describe(counts: Counter) -> None:
    if counts.get("tags_repaired"):
        print(f"[finetune] repaired {counts['tags_repaired']} invalid tag sequences", file=sys.stderr)
