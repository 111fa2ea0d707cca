"""Inference on unlabelled input with any backend (torch, ONNX, int8): what the registered pyfunc models, the
service and `bertpipe models predict` call. Featurisation, windows and decoding are the training library's
(``bertpipe.lib.training``); this module adds scores (softmax probabilities) and the user-facing output per task:

- classification: {"label", "score"}   (long texts: the task's head/tail truncation or windows aggregated)
- ner: [{"text", "label", "start", "end", "score"}]   (entities aggregated from word pieces; end exclusive)
- qa: {"answer", "score", "start", "end"}   (character offsets into the context)
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from bertpipe.infra.errors import BertpipeError

META_KEYS = ("truncation", "head_tokens", "stride", "window_aggregate", "label_all_pieces", "model_scheme",
             "doc_stride", "max_query_len", "max_answer_len", "n_best")


def task_meta(cfg, task: str | None, model_dir: Path) -> dict:
    """What inference needs besides the weights: task type, labels and the task's long-text handling."""
    from bertpipe.lib.inference.backends import model_kind
    from bertpipe.lib.labelled import model_labels

    if task is None:
        return {"type": model_kind(model_dir), "labels": [], "max_seq_len": 128}
    from bertpipe.lib.labelled import task_settings

    p, tp = task_settings(cfg, task, model_dir)
    return {"task": task, "type": p.type, "labels": model_labels(model_dir), "max_seq_len": tp.max_seq_len,
            **{k: getattr(p, k) for k in META_KEYS}}


def meta_from_config(model_dir: Path) -> dict:
    """A task.json for a model exported without one: type and labels from its config, default long-text handling."""
    from bertpipe.lib.inference.backends import model_kind
    from bertpipe.lib.labelled import model_labels

    conf = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return {"type": model_kind(model_dir), "labels": model_labels(model_dir),
            "max_seq_len": min(int(conf.get("max_position_embeddings", 512)), 512)}


def resolve_device(name: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cuda`` without one is a user error (a model
    silently served from the CPU is slower than asked for, and nobody notices)."""
    import torch

    if name not in ("auto", "cpu") and not name.startswith("cuda"):
        raise BertpipeError(f"--device {name}: expected auto, cpu or cuda")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BertpipeError(f"--device {name}: no CUDA GPU is visible to torch (torch {torch.__version__}, "
                            "torch.cuda.is_available() is False); use --device cpu or auto")
    return name


def gpu_bf16(device: str) -> bool:
    """Whether a torch model on ``device`` predicts under bf16 autocast: on a CUDA GPU with native bf16 (the
    precision policy's ``auto``); the CPU predicts in fp32, whatever its bf16 units."""
    if not device.startswith("cuda"):
        return False
    import torch

    from bertpipe.infra.device import precision_for

    return precision_for("auto", torch.device(device)).bf16


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class Predictor:
    """Scores batches of records with one backend. ``meta`` is a task.json dict (see ``task_meta``)."""

    def __init__(self, model_dir: Path | str, meta: dict, backend: str = "torch", onnx_dir: Path | str | None = None,
                 batch_size: int = 32, device: str = "cpu"):
        from transformers import AutoTokenizer

        from bertpipe.lib.inference.backends import backend_model

        self.meta = meta
        self.type = meta["type"]
        if self.type not in ("classification", "pair_classification", "ner", "qa"):
            raise BertpipeError(f"{model_dir}: a {self.type} model has no task predictions (not a finetuned head)")
        self.labels = list(meta.get("labels") or [])
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.device = resolve_device(device)
        self.model = backend_model(model_dir, backend, onnx_dir, device=self.device)
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.batch_size = batch_size
        self.bf16 = backend == "torch" and gpu_bf16(self.device)
        defaults = {"truncation": "head", "head_tokens": 128, "stride": 128, "window_aggregate": "mean",
                    "label_all_pieces": False, "model_scheme": "BIO", "doc_stride": 128, "max_query_len": 64,
                    "max_answer_len": 30, "n_best": 20}
        self.p = SimpleNamespace(type=self.type, **{k: meta.get(k, v) for k, v in defaults.items()})
        self.tp = SimpleNamespace(max_seq_len=int(meta.get("max_seq_len", 128)))

    @classmethod
    def from_dir(cls, model_dir: Path | str, files_dir: Path | str, backend: str = "torch", batch_size: int = 32,
                 device: str = "cpu"):
        meta = json.loads((Path(files_dir) / "task.json").read_text(encoding="utf-8"))
        return cls(model_dir, meta, backend, files_dir, batch_size, device)

    def examples(self, records: Sequence[dict]):
        from bertpipe.lib.labelled import Example

        dummy = self.labels[0] if self.labels else None
        out = []
        for i, r in enumerate(records):
            if self.type == "qa":
                out.append(Example(id=str(i), text=r["context"], question=r["question"]))
            else:
                out.append(Example(id=str(i), text=r["text"], text_pair=r.get("text_pair"), label=dummy))
        return out

    def predict(self, records: Sequence[dict]) -> list:
        from bertpipe.lib.training.features import featurize
        from bertpipe.lib.training.predict import run_model

        if not records:
            return []
        exs = self.examples(records)
        split = featurize(self.tok, exs, self.p, self.tp, {lab: i for i, lab in enumerate(self.labels)}, Counter(),
                            "predict")
        outs = run_model(self.model, split.feats, self.pad, self.batch_size, self.bf16)
        if self.type == "qa":
            return self._qa(exs, split.feats, outs)
        per_ex: list[list] = [[] for _ in exs]
        for f, o in zip(split.feats, outs):
            per_ex[f["example"]].append(o)
        if self.type == "ner":
            return [self._entities(ex, split.pieces[i], split.spans[i], per_ex[i]) for i, ex in enumerate(exs)]
        from bertpipe.lib.training import windows as W

        res = []
        for rows in per_ex:
            stack = np.stack(rows)
            k = int(W.aggregate(stack, self.p.window_aggregate).argmax())
            probs = _softmax(stack.mean(0))
            res.append({"label": self.labels[k], "score": float(probs[k])})
        return res

    def _entities(self, ex, pieces, spans, rows) -> list[dict]:
        from bertpipe.lib.training import tagging as T
        from bertpipe.lib.training import windows as W

        if not pieces.ids:
            return []
        lg = W.stitch(len(pieces.ids), spans, [o[1:-1] for o in rows])
        probs = _softmax(lg)
        first = T.word_first_mask(pieces.word_ids)
        scored = [first[j] or self.p.label_all_pieces for j in range(len(pieces.ids))]
        labs = [self.labels[int(k)] if scored[j] else None for j, k in enumerate(lg.argmax(-1))]
        out = []
        for a, b, t in T.decode_pieces(labs, pieces.offsets, pieces.word_ids):
            inside = [j for j in range(len(pieces.ids)) if scored[j] and a <= pieces.offsets[j][0] < b]
            score = float(np.mean([probs[j].max() for j in inside])) if inside else 0.0
            out.append({"text": ex.text[a:b], "label": t, "start": a, "end": b, "score": score})
        return out

    def _qa(self, exs, feats, outs) -> list[dict]:
        from bertpipe.lib.training import qa as Q

        # Log-probabilities over each window's context positions: the best span's score is then P(start) * P(end).
        starts, ends = [], []
        for f, (s, e) in zip(feats, outs):
            ctx = np.array([o is not None for o in f["offsets"]])
            for src, dst in ((s, starts), (e, ends)):
                x = np.where(ctx, src, -1e9).astype(np.float64)
                dst.append(x - x.max() - np.log(np.exp(x - x.max()).sum()))
        best = Q.best_spans(exs, feats, starts, ends, self.p.n_best, self.p.max_answer_len)
        return [{"answer": b["text"], "score": float(np.exp(b["score"])) if b["start"] >= 0 else 0.0,
                 "start": b["start"], "end": b["start"] + len(b["text"]) if b["start"] >= 0 else -1} for b in best]
